//! A claim that one thread takes without a locked instruction while no other thread wants it.
//!
//! Most QPs and CQs are used by one thread (a test, a benchmark, a connection's thread), and
//! a locked instruction (a compare-and-swap) costs ~5 ns on this machine's cores. A [`Bias`]
//! belongs to the first thread that enters it; that thread, the owner, enters by storing
//! `inside` and then checking that nobody revoked the bias: Dekker's protocol, with the
//! asymmetric fences of [`barrier`] (the owner's is a compiler fence). The first other thread
//! that wants what the bias guards revokes it for good (`revoked`: REVOKING, the process-wide
//! barrier, then REVOKED: ~10 us, once, and `owner` becomes nobody's), and from then on every
//! thread, the owner too, takes the shared way (a compare-and-swap), after waiting for an owner
//! that entered before the revocation to leave ([`Bias::owner_inside`]). The owner looks at
//! `revoked` only once it announced itself: before, at `owner` alone (a revocation it misses
//! there it sees after announcing itself, and backs off). The model test below checks every
//! interleaving of the protocol with this machine's store buffers.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use super::barrier;

/// `Bias::revoked`: the owner may enter.
pub(super) const BIASED: u8 = 0;
/// Another thread stored this, then issues the process-wide barrier.
const REVOKING: u8 = 1;
/// The barrier returned: an owner that entered unseen is seen `inside` now.
pub(super) const REVOKED: u8 = 2;

/// `Bias::owner` once revoked: no thread's identity (an address, never 1), so that the owner's
/// first look (at `owner`) sends it the shared way, without a look at `revoked` before it
/// announces itself.
const NOBODY: usize = 1;

/// The calling thread's identity: the address of its thread control block, or of a
/// thread-local (unique among running threads; a thread that ends gives it to a later one,
/// which cannot overlap it).
#[inline]
fn me() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        super::tls::thread_pointer()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        thread_local! {
            static ID: u8 = const { 0 };
        }
        ID.with(|id| id as *const u8 as usize)
    }
}

/// What [`Bias::enter`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// In: the caller excludes every thread on the shared way until [`Bias::leave`].
    In,
    /// Not the owner's, or the bias is revoked: take the shared way.
    Out,
    /// The owner found the bias revoked after announcing itself in `inside`, and cleared
    /// it again: a thread waiting for `inside` to clear may want waking.
    BackedOff,
    /// In, by a bias that nobody owned, taken for this entry alone ([`Bias::lend`]): leave
    /// with [`Bias::give_back`].
    Lent,
}

/// See the module's text.
#[derive(Debug)]
pub(crate) struct Bias {
    /// The thread the bias belongs to (0: none yet).
    owner: AtomicUsize,
    /// The owner is in (or is about to look at `revoked`).
    inside: AtomicBool,
    revoked: AtomicU8,
}

impl Default for Bias {
    fn default() -> Self {
        Self::new()
    }
}

impl Bias {
    pub(crate) const fn new() -> Bias {
        Bias {
            owner: AtomicUsize::new(0),
            inside: AtomicBool::new(false),
            revoked: AtomicU8::new(BIASED),
        }
    }

    /// Enters if the calling thread owns the bias (the first to try takes it) and it is not
    /// revoked. An owner already in stays [`Entry::Out`] (never two entries at once).
    #[inline]
    pub(crate) fn enter(&self) -> Entry {
        if !self.owned() {
            return Entry::Out;
        }
        self.enter_owned()
    }

    /// [`Bias::enter`] by a caller that never enters again before it leaves (its entries are
    /// not nested: it cannot find itself in), without the look at `inside` that tells.
    #[inline]
    pub(crate) fn enter_unnested(&self) -> Entry {
        if !self.owned() {
            return Entry::Out;
        }
        debug_assert!(!self.inside.load(Ordering::Relaxed), "an entry nested in another");
        self.announce()
    }

    /// Whether the calling thread owns the bias, taking it if nobody does (and it is not
    /// revoked).
    #[inline(always)]
    fn owned(&self) -> bool {
        let me = me();
        let owner = self.owner.load(Ordering::Relaxed);
        owner == me || owner == 0 && self.revoked.load(Ordering::Relaxed) == BIASED && self.take(me)
    }

    /// Makes `me` the owner of a bias nobody owns, if the owner's way may be taken at all: its
    /// entry's light barrier is a compiler fence (see [`barrier::asymmetric`]); where it may
    /// not, the bias is revoked before anyone owned it (no barrier needed).
    #[cold]
    fn take(&self, me: usize) -> bool {
        if !barrier::asymmetric() {
            self.revoked.store(REVOKED, Ordering::Release);
            return false;
        }
        self.owner.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// [`Bias::enter`] once the calling thread is the owner (as it was a moment ago: a
    /// revocation since is seen below, and backed off from).
    #[inline]
    fn enter_owned(&self) -> Entry {
        if self.inside.load(Ordering::Relaxed) {
            return Entry::Out;
        }
        self.announce()
    }

    /// The owner, not in, announces itself in `inside` and looks at `revoked`.
    #[inline(always)]
    fn announce(&self) -> Entry {
        self.inside.store(true, Ordering::Relaxed);
        // Against a revoker: either it sees `inside`, or this sees `revoked`.
        barrier::light();
        if self.revoked.load(Ordering::Relaxed) != BIASED {
            self.inside.store(false, Ordering::Release);
            return Entry::BackedOff;
        }
        Entry::In
    }

    /// [`Bias::enter`] for a thread that should not keep the bias (one that creates, sets up or
    /// tears down what the bias guards, which another thread then uses): a bias nobody owns
    /// is taken for this entry alone ([`Entry::Lent`]) and given back on leaving, so that the
    /// first thread to use the object by [`Bias::enter`] owns it, with no revocation. (While
    /// lent, the bias is the lender's to every other thread, exactly as an owner's.)
    pub(crate) fn lend(&self) -> Entry {
        let me = me();
        if self.owner.load(Ordering::Relaxed) == me {
            return self.enter_owned();
        }
        let free = self.revoked.load(Ordering::Relaxed) == BIASED && self.take(me);
        if !free {
            return Entry::Out;
        }
        match self.enter_owned() {
            Entry::In => Entry::Lent,
            other => {
                self.owner.store(0, Ordering::Release);
                other
            }
        }
    }

    /// Gives the bias back if the calling thread owns it, between its entries (it is out):
    /// the next thread to enter owns it. For the emulator's own threads, which serve objects
    /// the application's threads use (see `fabric::host::read_loop`): a thread that kept what
    /// it entered first had the application's thread revoke it, and take the shared way (a
    /// compare-and-swap) at every entry after. A revocation meanwhile is not undone: as for
    /// [`Bias::give_back`], a 0 stored over `NOBODY` leaves the bias revoked.
    pub(crate) fn disown(&self) {
        if self.owner.load(Ordering::Relaxed) == me() {
            debug_assert!(!self.inside.load(Ordering::Relaxed), "disowned from inside");
            self.owner.store(0, Ordering::Release);
        }
    }

    /// Leaves after [`Entry::Lent`], and gives the bias back: the next thread to enter it owns
    /// it, and sees (acquiring `owner`) what this one wrote inside.
    #[inline]
    pub(crate) fn give_back(&self) {
        self.inside.store(false, Ordering::Release);
        self.owner.store(0, Ordering::Release);
    }

    /// Leaves after [`Entry::In`]; what the owner wrote inside is seen by whoever next sees
    /// `inside` clear.
    #[inline]
    pub(crate) fn leave(&self) {
        self.inside.store(false, Ordering::Release);
    }

    /// Whether the calling thread owns the bias.
    #[inline]
    pub(crate) fn mine(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == me()
    }

    /// Whether another thread owns the bias.
    #[cfg(test)]
    pub(crate) fn others(&self) -> bool {
        let owner = self.owner.load(Ordering::Relaxed);
        owner != 0 && owner != NOBODY && owner != me()
    }

    /// Whether the bias is revoked for good (the barrier returned).
    #[inline]
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire) == REVOKED
    }

    /// Revokes the bias (the first caller issues the barrier, later ones wait for it).
    #[cold]
    #[inline(never)]
    pub(crate) fn revoke(&self) {
        if self.revoke_unentered() {
            return;
        }
        match self.revoked.compare_exchange(BIASED, REVOKING, Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => {
                barrier::heavy();
                self.revoked.store(REVOKED, Ordering::Release);
                // From now on the owner's first look sends it the shared way (until then it
                // announces itself, sees the revocation, and backs off). A lender's giving
                // back may store 0 over it: `enter` then sees the revocation.
                self.owner.store(NOBODY, Ordering::Relaxed);
            }
            Err(_) => {
                while self.revoked.load(Ordering::Acquire) != REVOKED {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// [`Bias::revoke`] of a bias nobody owns, or the caller's own (it is not in): nobody can
    /// be in by the bias, so no barrier is needed to see an owner in. The owner's word goes
    /// from one of those two to `NOBODY` before the revocation is stored, so that nobody takes
    /// the bias meanwhile (`take` wants 0), and a thread that sees the revocation (acquiring
    /// it) sees all that a former owner did inside. A CQ destroyed before any poll, or by the
    /// thread that polled it, has its ends revoked this way at no cost, where each barrier is
    /// ~7 us and an interruption of every other running thread of the process. (Not in the
    /// model below, which has the owner and the revoker as two threads.) Whether it was.
    fn revoke_unentered(&self) -> bool {
        let owner = self.owner.load(Ordering::Relaxed);
        // (The owner's own `inside` is its own last store: it can read it.)
        let unentered = owner == 0 || owner == me() && !self.inside.load(Ordering::Relaxed);
        if !unentered
            || self
                .owner
                .compare_exchange(owner, NOBODY, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        if self.revoked.compare_exchange(BIASED, REVOKED, Ordering::AcqRel, Ordering::Acquire)
            == Err(REVOKING)
        {
            // Another revoker's barrier: wait for it, as `revoke` does.
            while self.revoked.load(Ordering::Acquire) != REVOKED {
                std::thread::yield_now();
            }
        }
        true
    }

    /// After [`Bias::revoke`]: whether an owner that entered before it is still in (or is
    /// backing off). Once seen clear it stays clear but for an owner's brief backing off.
    #[inline]
    pub(crate) fn owner_inside(&self) -> bool {
        // Formally (the C++ model, where barriers are fences) the caller's own fence orders
        // the revocation's before this look; with the process-wide barrier it is a compiler
        // fence.
        barrier::light();
        self.inside.load(Ordering::Acquire)
    }

    /// Without a look at the revocation: `inside` as it is.
    #[inline]
    pub(crate) fn owner_in(&self) -> bool {
        self.inside.load(Ordering::Relaxed)
    }
}

/// The revocation state, for tests.
#[cfg(test)]
impl Bias {
    /// Whether no thread owns the bias (nor has it been revoked).
    pub(crate) fn nobodys(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == 0 && !self.is_revoked()
    }

    pub(super) fn revoked_state(&self) -> u8 {
        self.revoked.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod test {
    use std::collections::HashSet;

    use super::{BIASED, Entry, REVOKED, REVOKING};

    /// The protocol of [`super::Bias`], step by step, with the stores this machine (x86,
    /// total store order) may delay in a store buffer until drained (at any step, by a locked
    /// instruction, or for every thread by the revoker's process-wide barrier). Three threads:
    /// the owner enters once; a revoker revokes; a third thread, which sees REVOKED, takes
    /// the shared way (the word's compare-and-swap, then a look at `inside`). Every
    /// interleaving: the owner and the third thread must never be in at once.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    struct Model {
        /// `revoked` and `inside` as other threads see them.
        revoked: u8,
        inside: bool,
        /// The owner's stores to `inside` not yet seen (oldest first), the revoker's store of
        /// REVOKED not yet seen.
        owner_buffer: [Option<bool>; 2],
        revoker_buffer: Option<u8>,
        /// The revoker's store of `NOBODY` over the owner's identity, seen.
        disowned: bool,
        owner: u8,
        revoker: u8,
        third: u8,
        owner_in: bool,
        third_in: bool,
    }

    /// Which steps of the protocol the model keeps (a broken variant drops one).
    #[derive(Clone, Copy)]
    struct Protocol {
        owner_looks_again: bool,
        revoker_barrier: bool,
    }

    impl Model {
        fn buffer(&mut self, inside: bool) {
            let free = self.owner_buffer.iter_mut().find(|b| b.is_none()).expect("room");
            *free = Some(inside);
        }

        fn drain_owner_one(&mut self) {
            if let Some(v) = self.owner_buffer[0] {
                self.inside = v;
                self.owner_buffer = [self.owner_buffer[1], None];
            }
        }

        fn drain_owner(&mut self) {
            self.drain_owner_one();
            self.drain_owner_one();
        }
    }

    fn steps(m: Model, p: Protocol) -> Vec<Model> {
        let mut out = Vec::new();
        if m.owner_buffer[0].is_some() {
            let mut n = m;
            n.drain_owner_one();
            out.push(n);
        }
        if let Some(v) = m.revoker_buffer {
            let mut n = m;
            n.revoked = v;
            n.revoker_buffer = None;
            out.push(n);
        }
        // The owner: look at its identity in `owner` (not at `revoked`), announce itself,
        // look at `revoked`, be in, leave.
        let mut n = m;
        match m.owner {
            0 if m.disowned => n.owner = 9,
            0 => n.owner = 1,
            1 => {
                n.buffer(true);
                n.owner = if p.owner_looks_again { 2 } else { 3 };
            }
            2 if m.revoked != BIASED => {
                n.buffer(false); // backs off
                n.owner = 9;
            }
            2 => n.owner = 3,
            3 => {
                n.owner_in = true;
                n.owner = 4;
            }
            4 => {
                n.owner_in = false;
                n.buffer(false);
                n.owner = 9;
            }
            _ => {}
        }
        if n != m {
            out.push(n);
        }
        // The revoker: REVOKING (a locked CAS), the barrier, REVOKED (a plain store).
        let mut n = m;
        match m.revoker {
            0 => {
                n.revoked = REVOKING;
                n.revoker = 1;
            }
            1 => {
                if p.revoker_barrier {
                    n.drain_owner();
                }
                n.revoker = 2;
            }
            2 => {
                n.revoker_buffer = Some(REVOKED);
                n.revoker = 3;
            }
            // `NOBODY` over the owner (seen at once: a delay only keeps the owner longer on
            // the announce-and-look way).
            3 => {
                n.disowned = true;
                n.revoker = 9;
            }
            _ => {}
        }
        if n != m {
            out.push(n);
        }
        // The third thread: waits for REVOKED, takes the word (a locked CAS), looks at
        // `inside`, is in unless the owner is, leaves.
        let mut n = m;
        match m.third {
            0 if m.revoked == REVOKED => n.third = 1,
            1 => n.third = 2,
            2 if m.inside => n.third = 9, // gives way
            2 => {
                n.third_in = true;
                n.third = 3;
            }
            3 => {
                n.third_in = false;
                n.third = 9;
            }
            _ => {}
        }
        if n != m {
            out.push(n);
        }
        out
    }

    /// Explores every state reachable from `m`; the first in which both are in.
    fn explore(m: Model, p: Protocol, seen: &mut HashSet<Model>) -> Option<Model> {
        if !seen.insert(m) {
            return None;
        }
        if m.owner_in && m.third_in {
            return Some(m);
        }
        steps(m, p).into_iter().find_map(|n| explore(n, p, seen))
    }

    /// The owner enters by its bias, nested or not as it says; once another thread revoked
    /// the bias, the owner's first look (at `owner`, now nobody's) sends it the shared way
    /// without announcing itself (it does not back off: it never came in).
    #[test]
    fn test_a_revoked_bias_sends_its_owner_away_at_the_first_look() {
        let bias = std::sync::Arc::new(super::Bias::new());
        assert_eq!(bias.enter(), Entry::In);
        assert_eq!(bias.enter(), Entry::Out, "nested: already in");
        bias.leave();
        assert_eq!(bias.enter_unnested(), Entry::In);
        bias.leave();
        let other = bias.clone();
        std::thread::spawn(move || {
            assert_eq!(other.enter_unnested(), Entry::Out, "another thread's");
            other.revoke();
            assert!(!other.owner_inside());
        })
        .join()
        .unwrap();
        assert!(bias.is_revoked() && !bias.mine());
        assert_eq!(bias.enter(), Entry::Out);
        assert_eq!(bias.enter_unnested(), Entry::Out);
        assert!(!bias.owner_in(), "never announced");
    }

    /// A bias nobody owns, or the revoker's own, is revoked without the process-wide barrier
    /// (nobody can be in by it); one another thread owns, with it. Each way, the owner's
    /// first look after sends it the shared way, and nobody takes the bias again.
    #[test]
    fn test_only_a_bias_another_thread_owns_costs_a_barrier_to_revoke() {
        use crate::sync::barrier::test::heavy_in;
        let unowned = super::Bias::new();
        assert_eq!(heavy_in(|| unowned.revoke()), 0);
        assert!(unowned.is_revoked() && !unowned.mine());
        assert_eq!(unowned.enter(), Entry::Out, "nobody takes a revoked bias");
        assert_eq!(unowned.lend(), Entry::Out);

        let own = super::Bias::new();
        assert_eq!(own.enter(), Entry::In);
        own.leave();
        assert_eq!(heavy_in(|| own.revoke()), 0);
        assert!(own.is_revoked() && !own.mine() && !own.owner_inside());
        assert_eq!(own.enter_unnested(), Entry::Out);

        let others = std::sync::Arc::new(super::Bias::new());
        let theirs = others.clone();
        std::thread::spawn(move || {
            assert_eq!(theirs.enter(), Entry::In);
            theirs.leave();
        })
        .join()
        .unwrap();
        assert_eq!(heavy_in(|| others.revoke()), 1);
        assert!(others.is_revoked() && !others.owner_inside());
    }

    #[test]
    fn test_no_interleaving_lets_the_owner_and_another_thread_in_at_once() {
        let p = Protocol { owner_looks_again: true, revoker_barrier: true };
        let mut seen = HashSet::new();
        assert_eq!(explore(Model::default(), p, &mut seen), None);
        assert!(seen.len() > 50, "{} states", seen.len());
    }

    /// The model has teeth: without the owner's second look, or without the revoker's barrier,
    /// both are in at once in some interleaving.
    #[test]
    fn test_the_model_catches_a_protocol_without_either_fence_side() {
        for p in [
            Protocol { owner_looks_again: false, revoker_barrier: true },
            Protocol { owner_looks_again: true, revoker_barrier: false },
        ] {
            assert!(explore(Model::default(), p, &mut HashSet::new()).is_some());
        }
    }
}

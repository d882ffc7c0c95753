//! A CQ's ring of completions: producers (QPs completing work) and pollers meet on two
//! indices and one sequence word per slot, with no lock on either side.
//!
//! Each slot's word says which lap of the ring the slot is at and whether it holds a
//! completion: for position `p` (the `p`-th completion ever queued here, whose slot is
//! `p & mask`), the word is `lap(p)` while the slot waits for it, `lap(p) + 1` once it is
//! written, and `lap(p) + capacity` (the next lap) once it is polled. A producer claims a
//! position by advancing `tail` (a short CAS, so several QPs can complete into one CQ at
//! once), writes the completion and publishes it with a release store of the word; a poller
//! claims by advancing `head` after an acquire load saw the word published. A zeroed slot is
//! one that waits for lap 0, so a large ring is allocated zeroed and the memory of slots never
//! reached is never touched.
//!
//! The ring holds at most `cqe` completions (the CQ's size); the push that would exceed it
//! fails: the CQ overruns, exactly when as many completions as it holds are queued and
//! unpolled. A CQ's first ring holds at most 4,095 (positions advance on every completion, so
//! in time every slot is touched): one of millions of entries takes memory only as its
//! completions pile up, the ring doubling each time it is full short of the CQ's size.
//!
//! Most CQs are filled by one thread and polled by one (not always the same): each end has a
//! [`Bias`](crate::sync::bias::Bias). Its owner, while no other thread came to that end,
//! claims positions with plain stores instead of the CAS; the first other thread revokes the
//! bias for good (once, ~10 us), waits for the owner to be out, and from then on that end is
//! claimed by CAS.
//!
//! Rare operations that rewrite the ring (taking a QP's completions out, resizing, draining)
//! first close it (revoking both biases): a bit in both indices turns new producers and
//! pollers away (they wait),
//! and the closer waits for those that claimed a position before to finish with it. Then it
//! has the ring to itself, and reopens it when done. A ring outgrown is closed for good and
//! kept until the CQ is dropped (a thread may still be looking at it); a CQ's rings double
//! each time, so what is kept is bounded by the size of the newest.
#![allow(unsafe_code)]

use std::{
    cell::UnsafeCell,
    sync::atomic::{AtomicPtr, AtomicU64, Ordering},
};

use crate::sync::Mutex;
use crossbeam_utils::CachePadded;

use crate::{
    sync::bias::{Bias, Entry},
    types::{Wc, WcFlags, WcOpcode, WcStatus},
};

/// The most completions a CQ's first ring holds.
const FIRST_RING: u32 = 4095;

/// Set in `head` and `tail` while the ring is closed.
const CLOSED: u64 = 1 << 63;
/// `head` and `tail` of a ring closed for good.
const RETIRED: u64 = u64::MAX;

/// A slot: its lap word and a completion, in one cache line, so that a poller on another core
/// takes one line from the producer's (an 80-byte completion beside its word took two, most
/// of the time). The completion is packed in eight-byte words (see [`Packed`]), which the
/// poller reads one at a time (volatile): measured so, the polled ping-pong between two cores
/// (G4) takes 0.50 us a round trip, against 0.69 with the words read as the compiler chose
/// (and 0.70 before the packing).
#[repr(C, align(64))]
struct Slot {
    /// The lap word (see the module text), relative to the slot's index.
    seq: AtomicU64,
    words: UnsafeCell<Packed>,
}

/// A completion's common fields in seven words, each as the first seven words of [`Wc`] hold
/// them; the fields few completions have (a steering tag, tag matching's) go to the slot's
/// [`Rare`] entry beside the ring, with [`HAS_RARE`] set.
type Packed = [u64; 7];

/// In the word of `imm_data` and `qp_num` (the top bit of a QPN, which has 24): the slot's
/// [`Rare`] entry holds the rarer fields.
const HAS_RARE: u64 = 1 << 63;

/// The completion fields a slot's words leave out (see [`Packed`]).
#[derive(Clone, Copy)]
struct Rare {
    flow_tag: u32,
    tm_tag: u64,
    tm_priv: u32,
}

impl Slot {
    /// Writes `wc` into the slot (its rarer fields, if any, into the entry `rare` finds: asked
    /// for only then, as most completions have none).
    ///
    /// # Safety
    /// The caller has the slot and its `rare` entry to itself until it publishes them.
    #[inline(always)]
    unsafe fn put<'r>(&self, rare: impl FnOnce() -> &'r UnsafeCell<Rare>, wc: &Wc) {
        debug_assert!(wc.qp_num < 1 << 24, "a QPN has 24 bits");
        let has_rare = wc.flow_tag != 0 || wc.tm_tag != 0 || wc.tm_priv != 0;
        if has_rare {
            let r = Rare { flow_tag: wc.flow_tag, tm_tag: wc.tm_tag, tm_priv: wc.tm_priv };
            // SAFETY: the caller's promise.
            unsafe { rare().get().write(r) };
        }
        let pair = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
        let words: Packed = [
            wc.wr_id,
            pair(wc.status.0, wc.opcode.0),
            pair(wc.vendor_err, wc.byte_len),
            pair(wc.imm_data, wc.qp_num) | if has_rare { HAS_RARE } else { 0 },
            pair(wc.src_qp, wc.wc_flags.bits()),
            u64::from(wc.pkey_index)
                | u64::from(wc.slid) << 16
                | u64::from(wc.sl) << 32
                | u64::from(wc.dlid_path_bits) << 40
                | u64::from(wc.cvlan) << 48,
            wc.timestamp,
        ];
        // SAFETY: the caller's promise.
        unsafe { self.words.get().write(words) };
    }

    /// The completion in the slot.
    ///
    /// # Safety
    /// The slot holds a completion written by [`Slot::put`] with the entry `rare` finds,
    /// published, that nobody writes until the caller releases it.
    #[inline(always)]
    unsafe fn read<'r>(&self, rare: impl FnOnce() -> &'r UnsafeCell<Rare>) -> Wc {
        let from = self.words.get().cast::<u64>();
        // SAFETY: the caller's promise; each index is within the seven words.
        let w = |i: usize| unsafe { from.add(i).read_volatile() };
        let (w0, w1, w2, w3, w4, w5, w6) = (w(0), w(1), w(2), w(3), w(4), w(5), w(6));
        let (lo, hi) = (|w: u64| w as u32, |w: u64| (w >> 32) as u32);
        let r = if w3 & HAS_RARE != 0 {
            // SAFETY: the caller's promise: `put` wrote it with this completion.
            unsafe { rare().get().read() }
        } else {
            Rare { flow_tag: 0, tm_tag: 0, tm_priv: 0 }
        };
        Wc {
            wr_id: w0,
            status: WcStatus(lo(w1)),
            opcode: WcOpcode(hi(w1)),
            vendor_err: lo(w2),
            byte_len: hi(w2),
            imm_data: lo(w3),
            qp_num: hi(w3 & !HAS_RARE),
            src_qp: lo(w4),
            wc_flags: WcFlags::from_bits_retain(hi(w4)),
            pkey_index: w5 as u16,
            slid: (w5 >> 16) as u16,
            sl: (w5 >> 32) as u8,
            dlid_path_bits: (w5 >> 40) as u8,
            cvlan: (w5 >> 48) as u16,
            timestamp: w6,
            flow_tag: r.flow_tag,
            tm_tag: r.tm_tag,
            tm_priv: r.tm_priv,
        }
    }
}

/// `n` zeroed values, from zeroed memory (which the allocator takes fresh from the system for
/// a large ring, so pages no completion reaches stay untouched).
///
/// # Safety
/// All-zero bytes are a valid `T`; `n` and `T` are not zero-sized.
unsafe fn zeroed<T>(n: usize) -> Box<[T]> {
    let layout = std::alloc::Layout::array::<T>(n).expect("a CQ's ring fits in memory");
    // SAFETY: `layout` has a non-zero size (the caller's promise).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `p` is a fresh allocation of `n` values with the global allocator's layout for
    // them, as `Box<[T]>` frees it; zeroed, each is valid (the caller's promise).
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) }
}

/// One end of the ring: its index and the bias of the thread that uses it alone.
#[derive(Default)]
struct End {
    index: AtomicU64,
    bias: Bias,
    /// The tail's owner's last look at `head` (written and read by the owner alone, in its
    /// bias): the poller writes `head` at every poll, so reading it at every completion
    /// costs a cache line from the poller's core. `head` only grows until the ring is closed
    /// (which ends the bias), so this is never ahead of it: the ring is at least as full as it
    /// says, and `head` is read again only when it says full.
    seen: AtomicU64,
}

impl std::ops::Deref for End {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.index
    }
}

impl End {
    /// Whether the calling thread is in this end's bias (if not: the CAS way, after
    /// [`End::shared`]). Never nested: a push or a pop enters, claims and leaves.
    #[inline]
    fn enter(&self) -> bool {
        self.bias.enter_unnested() == Entry::In
    }

    /// Makes the end shared (the bias revoked, its owner out): claims by CAS are safe.
    #[inline]
    fn shared(&self) {
        if !self.bias.is_revoked() {
            self.bias.revoke();
        }
        let mut spins = 0u32;
        while self.bias.owner_inside() {
            // The owner is a few instructions from leaving, unless it was preempted there.
            if spins < 100 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// [`Ring::shape`].
#[derive(Clone, Copy)]
struct Shape<'r> {
    slots: &'r [Slot],
    rare: &'r [UnsafeCell<Rare>],
    mask: u64,
}

impl<'r> Shape<'r> {
    /// The lap base of position `p`: its word while its slot waits for it.
    #[inline(always)]
    fn lap(self, p: u64) -> u64 {
        p & !self.mask
    }

    #[inline(always)]
    fn slot(self, p: u64) -> &'r Slot {
        // SAFETY: `p & mask` < `mask + 1`, the number of slots (`Ring::new`).
        unsafe { self.slots.get_unchecked((p & self.mask) as usize) }
    }

    #[inline(always)]
    fn rare(self, p: u64) -> &'r UnsafeCell<Rare> {
        // SAFETY: as in `slot`: as many rare entries as slots.
        unsafe { self.rare.get_unchecked((p & self.mask) as usize) }
    }
}

pub(crate) struct Ring {
    head: CachePadded<End>,
    tail: CachePadded<End>,
    slots: Box<[Slot]>,
    /// By slot index, the rarer fields of its completion (see [`Packed`]).
    rare: Box<[UnsafeCell<Rare>]>,
    mask: u64,
}

// SAFETY: a slot's completion (its words and its rare entry) is written only by the producer
// that claimed its position and read only by the poller that claimed it after seeing it
// published (release/acquire on the slot's word), or by a closer that waited for both; both
// are plain data.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns its slots.
unsafe impl Send for Ring {}

/// A CQ's current ring, and every ring it had.
pub(crate) struct Rings {
    current: AtomicPtr<Ring>,
    /// Every ring, the current one last: an outgrown ring is kept until the CQ is dropped, as
    /// a thread may still be looking at it. Taken by whoever rewrites the ring, one at a time.
    #[allow(clippy::vec_box)] // boxed: `current` points into them while the Vec grows
    all: Mutex<Vec<Box<Ring>>>,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ring = self.current();
        f.debug_struct("Rings")
            .field("len", &ring.len())
            .field("capacity", &ring.capacity())
            .finish()
    }
}

impl Rings {
    /// The rings of a CQ of `cqe` entries: the first holds at most [`FIRST_RING`].
    pub(crate) fn new(cqe: u32) -> Rings {
        let ring = Box::new(Ring::new(cqe.min(FIRST_RING)));
        Rings {
            current: AtomicPtr::new(&*ring as *const Ring as *mut Ring),
            all: Mutex::new(vec![ring]),
        }
    }

    /// Gives the producers' bias of the current ring back if the calling thread owns it
    /// (see [`Bias::disown`](crate::sync::bias::Bias::disown)).
    pub(crate) fn disown_producer(&self) {
        self.current().tail.bias.disown();
    }

    /// Whether the producers' bias of the current ring is nobody's (and not revoked), and
    /// whether it is the calling thread's.
    #[cfg(test)]
    pub(crate) fn producer_bias(&self) -> (bool, bool) {
        let bias = &self.current().tail.bias;
        (bias.nobodys(), bias.mine())
    }

    #[inline]
    pub(crate) fn current(&self) -> &Ring {
        // SAFETY: `current` always points at a ring in `all`, which are dropped only with
        // `self` (and then nobody can borrow it).
        unsafe { &*self.current.load(Ordering::Acquire) }
    }

    /// Closes the current ring and rewrites it: `edit` gets its completions, oldest first,
    /// and the positions it had used, and returns the completions to keep, a size the ring
    /// must hold from now on (a larger ring replaces it if it cannot), and its result.
    pub(crate) fn rewrite<R>(
        &self,
        edit: impl FnOnce(Vec<Wc>, u64) -> (Vec<Wc>, Option<u32>, R),
    ) -> R {
        let mut all = self.all.lock();
        let ring = all.last().expect("a CQ has a ring");
        let wcs = ring.close();
        let (wcs, grow_to, res) = edit(wcs, ring.tail());
        match grow_to.filter(|n| u64::from(*n) >= ring.capacity()) {
            Some(n) => {
                let new = Box::new(Ring::new(n));
                new.reopen(&wcs);
                self.current.store(&*new as *const Ring as *mut Ring, Ordering::Release);
                ring.retire();
                all.push(new);
            }
            None => ring.reopen(&wcs),
        }
        res
    }
}

/// Why a completion was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The ring already holds `cqe` completions.
    Full,
    /// The ring was closed: try again (on the CQ's newer ring if it was outgrown).
    Again,
    /// The ring holds as many as it can, fewer than the CQ's size: grow it, and try again.
    Small,
}

impl Ring {
    /// A ring that can hold `cqe` completions.
    pub(crate) fn new(cqe: u32) -> Ring {
        let capacity = (u64::from(cqe) + 1).next_power_of_two();
        Ring {
            head: CachePadded::new(End::default()),
            tail: CachePadded::new(End::default()),
            // SAFETY: a slot (an atomic integer and integers) and a rare entry (integers) are
            // valid zeroed: slots awaiting lap 0; a ring has at least 2 slots.
            slots: unsafe { zeroed(capacity as usize) },
            // SAFETY: as above.
            rare: unsafe { zeroed(capacity as usize) },
            mask: capacity - 1,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// The slots and the mask, read once by a push or a pop that then works on copies in
    /// registers: read through `self` after a slot was written, each was loaded again (the
    /// compiler cannot tell the ring's fields from a slot's memory).
    #[inline(always)]
    fn shape(&self) -> Shape<'_> {
        Shape { slots: &self.slots, rare: &self.rare, mask: self.mask }
    }

    /// The lap base of position `p`: its word while its slot waits for it.
    fn lap(&self, p: u64) -> u64 {
        self.shape().lap(p)
    }

    fn slot(&self, p: u64) -> &Slot {
        self.shape().slot(p)
    }

    fn rare(&self, p: u64) -> &UnsafeCell<Rare> {
        self.shape().rare(p)
    }

    /// Positions claimed by producers so far (since the last refill).
    pub(crate) fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire) & !CLOSED
    }

    /// Positions claimed by pollers so far (since the last refill).
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire) & !CLOSED
    }

    /// Completions queued now (claimed by a producer and not yet by a poller).
    pub(crate) fn len(&self) -> u64 {
        let head = self.head.load(Ordering::Acquire) & !CLOSED;
        let tail = self.tail.load(Ordering::Acquire) & !CLOSED;
        tail.saturating_sub(head)
    }

    /// Queues `wc` unless `cqe` completions are queued; its position if queued, `Again` if it
    /// found the ring closed (it waited for it to open), `Small` if the ring must grow to
    /// take it. The store that publishes it is a release: the CQ's arming protocol orders it
    /// before the producer's next load (see `CqInner::push`).
    #[cfg(test)]
    pub(crate) fn push(&self, wc: &Wc, cqe: u64) -> Result<u64, Refused> {
        self.push_with(|| *wc, cqe)
    }

    /// [`Ring::push`] of the completion `make` returns, packed from the values it is made of
    /// straight into its slot: built on the stack field by field and then copied, it was
    /// loaded back in wide pieces before those stores reached the cache (a load spanning
    /// several stores is not forwarded from the store buffer: it waits for them).
    #[inline(always)]
    pub(crate) fn push_with(&self, make: impl Fn() -> Wc, cqe: u64) -> Result<u64, Refused> {
        if self.tail.enter() {
            let pushed = self.push_alone(make, cqe);
            self.tail.bias.leave();
            return pushed;
        }
        self.push_shared(&make(), cqe)
    }

    /// [`Ring::push_with`] by the only producer (in the tail's bias; closing revokes it first).
    #[inline(always)]
    fn push_alone(&self, make: impl Fn() -> Wc, cqe: u64) -> Result<u64, Refused> {
        let tail = self.tail.load(Ordering::Relaxed);
        debug_assert_eq!(tail & CLOSED, 0, "closing revokes the bias first");
        let mut queued = tail.wrapping_sub(self.tail.seen.load(Ordering::Relaxed));
        if queued >= cqe.min(self.mask) {
            let head = self.head.load(Ordering::Acquire) & !CLOSED;
            self.tail.seen.store(head, Ordering::Relaxed);
            queued = tail.wrapping_sub(head);
            if queued >= cqe.min(self.mask) {
                return Err(if queued >= cqe { Refused::Full } else { Refused::Small });
            }
        }
        let shape = self.shape();
        let slot = shape.slot(tail);
        while slot.seq.load(Ordering::Acquire) != shape.lap(tail) {
            // The previous lap's poller is copying its completion out.
            std::hint::spin_loop();
        }
        self.tail.store(tail + 1, Ordering::Relaxed);
        // SAFETY: this producer alone claims positions (it is in the bias), and the previous
        // lap's poller released the slot: nobody else touches it until the word publishes it.
        unsafe { slot.put(|| shape.rare(tail), &make()) };
        slot.seq.store(shape.lap(tail) + 1, Ordering::Release);
        // The next completion's slot, last written by the poller a lap ago: fetched now, while
        // the poller waits for this one, rather than when the next completion comes, on its
        // way to that poller.
        crate::sync::prefetch::for_write(shape.slot(tail + 1));
        Ok(tail)
    }

    #[cold]
    #[inline(never)]
    fn push_shared(&self, wc: &Wc, cqe: u64) -> Result<u64, Refused> {
        self.tail.shared();
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            if tail & CLOSED != 0 {
                self.wait_open(&self.tail);
                return Err(Refused::Again);
            }
            let head = self.head.load(Ordering::Acquire) & !CLOSED;
            let queued = tail.wrapping_sub(head);
            if queued >= cqe.min(self.mask) {
                // Full (or this ring is, short of the CQ's size), as of the moment `head` was
                // read while `tail` was this (the CAS below would fail had `tail` moved since).
                if self.tail.load(Ordering::Acquire) == tail {
                    return Err(if queued >= cqe { Refused::Full } else { Refused::Small });
                }
                tail = self.tail.load(Ordering::Relaxed);
                continue;
            }
            let slot = self.slot(tail);
            let word = slot.seq.load(Ordering::Acquire);
            if word != self.lap(tail) {
                // The poller of the previous lap's completion in this slot claimed it and is
                // still copying it out: it frees the slot in a moment.
                std::hint::spin_loop();
                tail = self.tail.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: a reopening's refill (and the CQ's rebasing) is seen with its `tail`.
            match self.tail.compare_exchange_weak(
                tail,
                tail + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // SAFETY: this producer claimed position `tail`, whose slot the previous
                    // lap's poller released (its word was this lap's): nobody else touches
                    // the slot until the word below publishes it.
                    unsafe { slot.put(|| self.rare(tail), wc) };
                    slot.seq.store(self.lap(tail) + 1, Ordering::Release);
                    return Ok(tail);
                }
                Err(now) => tail = now,
            }
        }
    }

    /// Takes the oldest completion, if any. `Err` if it found the ring closed.
    ///
    /// Both ways of claiming a position give only its number, and the completion is read
    /// from the slot in one place, into registers: a completion that either way returned
    /// whole met the other's at a merge in stack memory, written there in pieces (a 4-, a 2-
    /// and a 2-byte store for one 8-byte word) that the caller's copy then loaded whole, and
    /// loads that straddle earlier stores stall (a third of `poll_one`'s time).
    #[inline(always)]
    pub(crate) fn pop(&self) -> Result<Option<Wc>, Refused> {
        let shape = self.shape();
        let claimed = if self.head.enter() {
            let claimed = self.claim_alone(shape);
            self.head.bias.leave();
            claimed
        } else {
            self.claim_shared()?
        };
        let Some(head) = claimed else { return Ok(None) };
        let slot = shape.slot(head);
        // SAFETY: published (the claim's acquire load saw the producer's release store), and
        // claimed by this poller alone until the store below releases it.
        let wc = unsafe { slot.read(|| shape.rare(head)) };
        slot.seq.store(shape.lap(head) + shape.mask + 1, Ordering::Release);
        Ok(Some(wc))
    }

    /// Claims the oldest published position, if any, as the only poller (in the head's bias;
    /// closing revokes it first).
    #[inline(always)]
    fn claim_alone(&self, shape: Shape<'_>) -> Option<u64> {
        let head = self.head.load(Ordering::Relaxed);
        debug_assert_eq!(head & CLOSED, 0, "closing revokes the bias first");
        if shape.slot(head).seq.load(Ordering::Acquire) != shape.lap(head) + 1 {
            return None;
        }
        self.head.store(head + 1, Ordering::Relaxed);
        Some(head)
    }

    /// Claims the oldest published position, if any, against other pollers.
    #[cold]
    #[inline(never)]
    fn claim_shared(&self) -> Result<Option<u64>, Refused> {
        self.head.shared();
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            if head & CLOSED != 0 {
                self.wait_open(&self.head);
                return Err(Refused::Again);
            }
            let word = self.slot(head).seq.load(Ordering::Acquire);
            if word != self.lap(head) + 1 {
                // Not published yet: empty, unless a producer claimed it and is writing
                // (then the completion does not count as queued until published).
                return Ok(None);
            }
            match self.head.compare_exchange_weak(
                head,
                head + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Some(head)),
                Err(now) => head = now,
            }
        }
    }

    /// Waits while `index` is closed, unless the ring was outgrown.
    #[cold]
    fn wait_open(&self, index: &End) {
        loop {
            let v = index.load(Ordering::Acquire);
            if v == RETIRED || v & CLOSED == 0 {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Closes the ring and waits for every claimed position to be finished with; the
    /// completions queued, oldest first. The caller has the ring to itself until
    /// [`Ring::reopen`] or [`Ring::retire`], and must be the only closer (the CQ serialises
    /// them).
    pub(crate) fn close(&self) -> Vec<Wc> {
        self.tail.shared();
        self.head.shared();
        let tail = self.tail.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        let head = self.head.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        // Producers that claimed a position publish it; pollers that claimed one release it.
        for p in tail.saturating_sub(self.capacity())..tail {
            let want = if p < head { self.lap(p) + self.capacity() } else { self.lap(p) + 1 };
            while self.slot(p).seq.load(Ordering::Acquire) != want {
                std::thread::yield_now();
            }
        }
        (head..tail)
            // SAFETY: every position from `head` to `tail` is published and unclaimed, and
            // the closed ring is the closer's alone.
            .map(|p| unsafe { self.slot(p).read(|| self.rare(p)) })
            .collect()
    }

    /// Refills a ring closed by [`Ring::close`] (or a new one no other thread has seen) with
    /// `wcs` (fewer than its capacity) from position 0, and opens it.
    pub(crate) fn reopen(&self, wcs: &[Wc]) {
        // Since the last refill positions ran from 0 to `tail`: only their slots were touched
        // (the others are still zero, and their memory may never have been).
        let used = (self.tail.load(Ordering::Relaxed) & !CLOSED).min(self.capacity());
        for slot in &self.slots[..used as usize] {
            slot.seq.store(0, Ordering::Relaxed);
        }
        for (p, wc) in wcs.iter().enumerate() {
            let slot = self.slot(p as u64);
            // SAFETY: the ring is closed and its closer's alone.
            unsafe { slot.put(|| self.rare(p as u64), wc) };
            // Release, as a producer's publish: a poller that finds the ring open again may
            // read this word (acquire) without having read the reopened `head` (acquire).
            slot.seq.store(self.lap(p as u64) + 1, Ordering::Release);
        }
        self.head.store(0, Ordering::Release);
        self.tail.store(wcs.len() as u64, Ordering::Release);
    }

    /// Marks a closed ring as outgrown: threads waiting on it go to the CQ's newer ring.
    pub(crate) fn retire(&self) {
        self.tail.store(RETIRED, Ordering::Release);
        self.head.store(RETIRED, Ordering::Release);
    }
}

#[cfg(test)]
mod test {
    use std::sync::{
        Arc, Barrier,
        atomic::{AtomicBool, Ordering},
    };

    use super::{Refused, Ring};
    use crate::types::Wc;

    fn wc(id: u64) -> Wc {
        Wc { wr_id: id, ..Wc::default() }
    }

    /// Every field of a completion, at its widest values, comes out of its slot as it went
    /// in, the rarer ones too; and a slot that held them gives none of them to the plain
    /// completion after it (nor does a closing ring's copy).
    #[test]
    fn test_every_field_of_a_completion_survives_its_slot() {
        use crate::types::{WcFlags, WcOpcode, WcStatus};
        let full = Wc {
            wr_id: u64::MAX - 1,
            status: WcStatus(u32::MAX - 2),
            opcode: WcOpcode(0x8000_0081),
            vendor_err: 0xdead_beef,
            byte_len: u32::MAX,
            imm_data: 0x1234_5678,
            qp_num: 0xff_fffe,
            src_qp: 7,
            wc_flags: WcFlags::from_bits_retain(0x8000_0003),
            pkey_index: 0xffff,
            slid: 0xfffe,
            sl: 0xff,
            dlid_path_bits: 0x7f,
            timestamp: u64::MAX,
            cvlan: 0xabc,
            flow_tag: 0xff_ffff,
            tm_tag: 0x1122_3344_5566_7788,
            tm_priv: u32::MAX,
        };
        let plain = Wc { cvlan: 0, flow_tag: 0, tm_tag: 0, tm_priv: 0, ..full };
        let ring = Ring::new(1); // two slots: each is reused every other completion
        for (i, w) in
            [full, plain, plain, full, Wc::default(), full].into_iter().cycle().take(24).enumerate()
        {
            let w = Wc { wr_id: w.wr_id ^ i as u64, ..w };
            ring.push(&w, 1).unwrap();
            assert_eq!(ring.pop(), Ok(Some(w)), "completion {i}");
        }
        ring.push(&plain, 1).unwrap();
        assert_eq!(ring.close(), vec![plain]);
        ring.reopen(&[full]);
        assert_eq!(ring.pop(), Ok(Some(full)));
    }

    #[test]
    fn test_holds_exactly_cqe_in_order_across_laps() {
        let ring = Ring::new(3);
        assert_eq!(ring.capacity(), 4);
        let mut next = 0;
        for round in 0..10u64 {
            for _ in 0..3 {
                assert_eq!(ring.push(&wc(next), 3), Ok(next));
                next += 1;
            }
            assert_eq!(ring.push(&wc(99), 3), Err(Refused::Full), "round {round}");
            assert_eq!(ring.len(), 3);
            for k in 0..3 {
                assert_eq!(ring.pop().unwrap().unwrap().wr_id, next - 3 + k);
            }
            assert_eq!(ring.pop(), Ok(None));
        }
    }

    #[test]
    fn test_a_ring_smaller_than_the_cq_asks_to_grow_when_full() {
        let ring = Ring::new(3);
        for i in 0..3 {
            ring.push(&wc(i), 100).unwrap();
        }
        assert_eq!(ring.push(&wc(3), 100), Err(Refused::Small));
        ring.pop().unwrap();
        assert_eq!(ring.push(&wc(3), 100), Ok(3));
    }

    #[test]
    fn test_a_smaller_cqe_than_the_capacity_bounds_the_ring() {
        let ring = Ring::new(15);
        for i in 0..5 {
            ring.push(&wc(i), 5).unwrap();
        }
        assert_eq!(ring.push(&wc(5), 5), Err(Refused::Full));
        assert_eq!(ring.pop().unwrap().unwrap().wr_id, 0);
        assert_eq!(ring.push(&wc(5), 5), Ok(5));
    }

    #[test]
    fn test_close_gives_the_queue_and_reopen_refills_it() {
        let ring = Ring::new(7);
        for i in 0..6 {
            ring.push(&wc(i), 7).unwrap();
        }
        ring.pop().unwrap();
        let kept: Vec<Wc> = ring.close().into_iter().filter(|w| w.wr_id % 2 == 1).collect();
        assert_eq!(kept.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 3, 5]);
        ring.reopen(&kept);
        assert_eq!(ring.len(), 3);
        for i in [1, 3, 5] {
            assert_eq!(ring.pop().unwrap().unwrap().wr_id, i);
        }
        assert_eq!(ring.pop(), Ok(None));
        ring.push(&wc(8), 7).unwrap();
        assert_eq!(ring.pop().unwrap().unwrap().wr_id, 8);
    }

    /// One producer and one poller alone at first (each end in its thread's bias), then a
    /// second producer and a second poller arriving while they run (each end's bias revoked
    /// under way): every completion comes out exactly once, each producer's in its order.
    #[test]
    fn test_newcomers_at_both_ends_revoke_the_biases_and_lose_nothing() {
        for _ in 0..5 {
            newcomers_at_both_ends();
        }
    }

    /// A producer arriving while the owner of the tail's bias is in (between its claim and its
    /// publication) waits for it to leave before it claims a position.
    #[test]
    fn test_a_newcomer_waits_for_the_owner_to_leave() {
        let ring = Arc::new(Ring::new(7));
        ring.push(&wc(0), 7).unwrap(); // this thread owns the tail's bias now
        assert_eq!(ring.tail.bias.enter(), crate::sync::bias::Entry::In);
        let newcomer = {
            let ring = ring.clone();
            std::thread::spawn(move || ring.push(&wc(1), 7))
        };
        while !ring.tail.bias.is_revoked() {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!newcomer.is_finished(), "claimed while the owner was in");
        assert_eq!(ring.len(), 1);
        ring.tail.bias.leave();
        assert_eq!(newcomer.join().unwrap(), Ok(1));
        // The owner takes the CAS way now, as everyone.
        assert_eq!(ring.tail.bias.enter(), crate::sync::bias::Entry::Out);
        assert_eq!(ring.push(&wc(2), 7), Ok(2));
        for i in 0..3 {
            assert_eq!(ring.pop().unwrap().unwrap().wr_id, i);
        }
    }

    fn newcomers_at_both_ends() {
        use std::sync::atomic::AtomicU64;
        const PER: u64 = 10_000;
        let ring = Arc::new(Ring::new(63));
        let (pushed, popped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let producer = |t: u64, wait_for: u64| {
            let (ring, pushed) = (ring.clone(), pushed.clone());
            std::thread::spawn(move || {
                while pushed.load(Ordering::Relaxed) < wait_for {
                    std::hint::spin_loop();
                }
                for i in 0..PER {
                    while ring.push(&wc(t << 32 | i), 63).is_err() {
                        std::hint::spin_loop();
                    }
                    pushed.fetch_add(1, Ordering::Relaxed);
                }
                // Alive until the other is done: a thread that ended could hand its identity
                // (and so the bias) to the newcomer.
                while pushed.load(Ordering::Relaxed) < 2 * PER {
                    std::hint::spin_loop();
                }
            })
        };
        // The second poller counts itself in at its first look; the first goes on until then
        // (all may be polled before the second comes, on a busy machine).
        let second_looked = Arc::new(AtomicBool::new(false));
        let poller = |wait_for: u64| {
            let (ring, popped, second) = (ring.clone(), popped.clone(), second_looked.clone());
            std::thread::spawn(move || {
                while popped.load(Ordering::Relaxed) < wait_for {
                    std::hint::spin_loop();
                }
                let mut got = Vec::new();
                loop {
                    if let Some(w) = ring.pop().unwrap() {
                        got.push(w.wr_id);
                        popped.fetch_add(1, Ordering::Relaxed);
                    }
                    if wait_for > 0 {
                        second.store(true, Ordering::Relaxed);
                    }
                    if popped.load(Ordering::Relaxed) == 2 * PER && second.load(Ordering::Relaxed) {
                        return got;
                    }
                }
            })
        };
        let threads = [producer(0, 0), producer(1, 1_000)];
        let pollers = [poller(0), poller(1_000)];
        for t in threads {
            t.join().unwrap();
        }
        let mut all = Vec::new();
        for p in pollers {
            let got = p.join().unwrap();
            for t in 0..2u64 {
                let mine: Vec<u64> = got.iter().filter(|id| *id >> 32 == t).copied().collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "producer {t} reordered");
            }
            all.extend(got);
        }
        all.sort_unstable();
        let mut want: Vec<u64> =
            (0..2u64).flat_map(|t| (0..PER).map(move |i| t << 32 | i)).collect();
        want.sort_unstable();
        assert_eq!(all, want);
        assert!(ring.tail.bias.is_revoked() && ring.head.bias.is_revoked());
    }

    /// Producers and pollers on all threads at once, with closes and reopens in between:
    /// every completion comes out exactly once, and each producer's in its order.
    #[test]
    fn test_concurrent_producers_pollers_and_closes_lose_nothing() {
        const PER: u64 = 20_000;
        let ring = Arc::new(Ring::new(63));
        let start = Arc::new(Barrier::new(5));
        let produced = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..2u64)
            .map(|t| {
                let (ring, start) = (ring.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..PER {
                        while ring.push(&wc(t << 32 | i), 63).is_err() {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let (ring, start, produced) = (ring.clone(), start.clone(), produced.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut got = Vec::new();
                    loop {
                        let done = produced.load(Ordering::Acquire);
                        match ring.pop() {
                            Ok(Some(w)) => got.push(w.wr_id),
                            Ok(None) if done => return got,
                            Ok(None) => std::thread::yield_now(),
                            Err(_) => {} // closed meanwhile
                        }
                    }
                })
            })
            .collect();
        start.wait();
        let mut closes = 0;
        while producers.iter().any(|p| !p.is_finished()) {
            let q = ring.close();
            ring.reopen(&q);
            closes += 1;
            std::thread::yield_now();
        }
        assert!(closes > 0);
        for p in producers {
            p.join().unwrap();
        }
        produced.store(true, Ordering::Release);
        let mut all = Vec::new();
        for p in pollers {
            let got = p.join().unwrap();
            for t in 0..2u64 {
                let mine: Vec<u64> = got.iter().filter(|id| *id >> 32 == t).copied().collect();
                assert!(
                    mine.windows(2).all(|w| w[0] < w[1]),
                    "a poller saw producer {t} reordered"
                );
            }
            all.extend(got);
        }
        while let Some(w) = ring.pop().unwrap() {
            all.push(w.wr_id);
        }
        all.sort_unstable();
        let want: Vec<u64> =
            (0..2u64).flat_map(|t| (0..PER).map(move |i| t << 32 | i)).collect::<Vec<_>>();
        let mut want = want;
        want.sort_unstable();
        assert_eq!(all.len(), want.len());
        assert_eq!(all, want);
    }

    /// The push / pop protocol of [`Ring`], modelled step by step (each step one access to a
    /// shared word, as the code makes them), with every interleaving of two producers pushing
    /// two completions each and two pollers polling twice each explored (states already seen
    /// are not explored again; what is left at the end is drained). It must never read a slot
    /// before it is published or after it is reused, never lose or duplicate a completion,
    /// show each poller each producer's completions in order, report a full ring only when,
    /// at the moment it read `head`, `cqe` completions were queued, and never take more.
    /// (Dropping the producers' check of the slot's word, or checking fullness one too late,
    /// makes it fail.)
    mod model {
        use std::collections::HashSet;

        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        struct Producer {
            /// Completions pushed or refused so far (of 2), its step, and what it loaded.
            done: u8,
            pc: u8,
            tail: u8,
            head: u8,
        }

        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        struct Poller {
            polls: u8,
            pc: u8,
            head: u8,
        }

        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        struct State {
            head: u8,
            tail: u8,
            /// Slot words (relative to the slot's index, as the ring keeps them) and contents
            /// (0: none; else producer * 10 + item + 1).
            word: [u8; 4],
            wc: [u8; 4],
            p: [Producer; 2],
            c: [Poller; 2],
            /// What was polled, in order (up to 4), and how many pushes were refused.
            got: [u8; 4],
            ngot: u8,
            refused: u8,
        }

        /// Polls per poller.
        const POLLS: u8 = 2;

        struct Ring {
            cap: u8,
            cqe: u8,
        }

        impl Ring {
            fn lap(&self, p: u8) -> u8 {
                p & !(self.cap - 1)
            }
            fn slot(&self, p: u8) -> usize {
                (p & (self.cap - 1)) as usize
            }

            /// Every next state: one step of one thread.
            fn steps(&self, s: State) -> Vec<State> {
                let mut out = Vec::new();
                for i in 0..2 {
                    let pr = s.p[i];
                    if pr.done == 2 {
                        continue;
                    }
                    let mut n = s;
                    let q = &mut n.p[i];
                    match pr.pc {
                        0 => {
                            q.tail = s.tail; // tail.load
                            q.pc = 1;
                        }
                        1 => {
                            q.head = s.head; // head.load
                            let full = pr.tail.wrapping_sub(s.head) >= self.cqe;
                            // A full ring is reported only if `tail` still is what was loaded
                            // (checked next); then, right now, it really holds `cqe`.
                            if full && pr.tail == s.tail {
                                assert!(s.tail - s.head >= self.cqe);
                            }
                            q.pc = if full { 2 } else { 3 };
                        }
                        2 => {
                            // tail.load again: unchanged means full.
                            if s.tail == pr.tail {
                                n.refused += 1;
                                q.done += 1;
                            }
                            q.pc = 0;
                        }
                        3 => {
                            // The slot's word: free for this lap, else start over.
                            q.pc =
                                if s.word[self.slot(pr.tail)] == self.lap(pr.tail) { 4 } else { 0 };
                        }
                        4 => {
                            // CAS tail. Taken, it holds fewer than `cqe` now (`head` only grew
                            // since it was read).
                            q.pc = if s.tail == pr.tail {
                                assert!(s.tail - s.head < self.cqe, "overran: {s:?}");
                                n.tail += 1;
                                5
                            } else {
                                0
                            };
                        }
                        5 => {
                            let slot = self.slot(pr.tail);
                            assert_eq!(s.wc[slot], 0, "a producer overwrote an unpolled slot");
                            n.wc[slot] = i as u8 * 10 + pr.done + 1;
                            q.pc = 6;
                        }
                        _ => {
                            n.word[self.slot(pr.tail)] = self.lap(pr.tail) + 1; // publish
                            q.done += 1;
                            q.pc = 0;
                        }
                    }
                    out.push(n);
                }
                for i in 0..2 {
                    let c = s.c[i];
                    if c.polls == POLLS {
                        continue;
                    }
                    let mut n = s;
                    let d = &mut n.c[i];
                    match c.pc {
                        0 => {
                            d.head = s.head;
                            d.pc = 1;
                        }
                        1 => {
                            if s.word[self.slot(c.head)] == self.lap(c.head) + 1 {
                                d.pc = 2;
                            } else {
                                d.polls += 1; // empty
                                d.pc = 0;
                            }
                        }
                        2 => {
                            // CAS head.
                            d.pc = if s.head == c.head {
                                n.head += 1;
                                3
                            } else {
                                0
                            };
                        }
                        3 => {
                            let slot = self.slot(c.head);
                            assert_ne!(s.wc[slot], 0, "polled a slot not written: {s:?}");
                            d.pc = 4;
                            n.got[s.ngot as usize] = s.wc[slot] | (i as u8) << 6;
                            n.ngot += 1;
                            n.wc[slot] = 0;
                        }
                        _ => {
                            n.word[self.slot(c.head)] = self.lap(c.head) + self.cap; // release
                            d.polls += 1;
                            d.pc = 0;
                        }
                    }
                    out.push(n);
                }
                out
            }

            /// What is left once every thread is done, polled one by one.
            fn drain(&self, mut s: State) -> State {
                while s.word[self.slot(s.head)] == self.lap(s.head) + 1 {
                    let slot = self.slot(s.head);
                    s.got[s.ngot as usize] = s.wc[slot];
                    s.ngot += 1;
                    s.word[slot] = self.lap(s.head) + self.cap;
                    s.head += 1;
                }
                s
            }

            fn check_end(&self, s: State) {
                let s = self.drain(s);
                assert_eq!(s.tail, s.head);
                assert_eq!(s.ngot + s.refused, 4, "lost or duplicated: {s:?}");
                // Each poller sees each producer's completions in order (the drain polls last,
                // as poller 0).
                let got = &s.got[..s.ngot as usize];
                for poller in 0..2u8 {
                    for p in 0..2u8 {
                        let mine: Vec<u8> = got
                            .iter()
                            .filter(|g| *g >> 6 == poller && ((*g & 63) - 1) / 10 == p)
                            .map(|g| g & 63)
                            .collect();
                        assert!(mine.windows(2).all(|w| w[0] < w[1]), "reordered: {s:?}");
                    }
                }
                let mut sorted: Vec<u8> = got.iter().map(|g| g & 63).collect();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), got.len(), "duplicated: {s:?}");
            }
        }

        fn explore(ring: &Ring) -> usize {
            let mut seen = HashSet::new();
            let mut stack = vec![State::default()];
            let mut ends = 0;
            while let Some(s) = stack.pop() {
                if !seen.insert(s) {
                    continue;
                }
                let next = ring.steps(s);
                if next.is_empty() {
                    ring.check_end(s);
                    ends += 1;
                }
                stack.extend(next);
            }
            ends
        }

        #[test]
        fn test_no_interleaving_of_producers_and_pollers_loses_reorders_or_misjudges_fullness() {
            // Two slots holding one (every push laps the ring); four slots holding two.
            for (cap, cqe) in [(2, 1), (4, 2)] {
                let ends = explore(&Ring { cap, cqe });
                assert!(ends > 10, "{ends} end states for cap {cap}, cqe {cqe}");
            }
        }
    }
}

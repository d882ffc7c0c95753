//! A claim that one thread takes without a locked instruction while no other thread wants it.
//!
//! Most QPs and CQs are used by one thread (a test, a benchmark, a connection's thread), and
//! a locked instruction (a compare-and-swap) costs ~5 ns on this machine's cores. A [`Bias`]
//! belongs to the first thread that enters it; that thread, the owner, enters by storing
//! `inside` and then checking that nobody revoked the bias: Dekker's protocol, with the
//! asymmetric fences of [`barrier`] (the owner's is a compiler fence). The first other thread
//! that wants what the bias guards revokes it for good (`revoked`: REVOKING, the process-wide
//! barrier, then REVOKED: ~10 us, once), and from then on every thread, the owner too, takes
//! the shared way (a compare-and-swap), after waiting for an owner that entered before the
//! revocation to leave ([`Bias::owner_inside`]).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use super::barrier;

/// `Bias::revoked`: the owner may enter.
const BIASED: u8 = 0;
/// Another thread stored this, then issues the process-wide barrier.
const REVOKING: u8 = 1;
/// The barrier returned: an owner that entered unseen is seen `inside` now.
pub(super) const REVOKED: u8 = 2;

/// The calling thread's identity: the address of a thread-local (unique among running
/// threads; a thread that ends gives it to a later one, which cannot overlap it).
#[inline]
fn me() -> usize {
    thread_local! {
        static ID: u8 = const { 0 };
    }
    ID.with(|id| id as *const u8 as usize)
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
        let me = me();
        let owner = self.owner.load(Ordering::Relaxed);
        if owner != me
            && (owner != 0
                || self.revoked.load(Ordering::Relaxed) != BIASED
                || self
                    .owner
                    .compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err())
        {
            return Entry::Out;
        }
        if self.inside.load(Ordering::Relaxed) || self.revoked.load(Ordering::Relaxed) != BIASED {
            return Entry::Out;
        }
        self.inside.store(true, Ordering::Relaxed);
        // Against a revoker: either it sees `inside`, or this sees `revoked`.
        barrier::light();
        if self.revoked.load(Ordering::Relaxed) != BIASED {
            self.inside.store(false, Ordering::Release);
            return Entry::BackedOff;
        }
        Entry::In
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

    /// Whether the bias is revoked for good (the barrier returned).
    #[inline]
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire) == REVOKED
    }

    /// Revokes the bias (the first caller issues the barrier, later ones wait for it).
    #[cold]
    #[inline(never)]
    pub(crate) fn revoke(&self) {
        match self.revoked.compare_exchange(BIASED, REVOKING, Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => {
                barrier::heavy();
                self.revoked.store(REVOKED, Ordering::Release);
            }
            Err(_) => {
                while self.revoked.load(Ordering::Acquire) != REVOKED {
                    std::thread::yield_now();
                }
            }
        }
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
    pub(super) fn revoked_state(&self) -> u8 {
        self.revoked.load(Ordering::SeqCst)
    }
}

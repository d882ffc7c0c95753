//! A mutex that costs no locked instruction while one thread uses it alone, and whose release
//! is a plain store: for the locks every work request takes (a QP's).
//!
//! Two things make it cheap:
//!
//! - **Bias** ([`Bias`]): the first thread to take the lock takes it by its bias, with plain
//!   stores, until another thread wants it; from then on every thread takes the lock word with
//!   a compare-and-swap.
//! - **Plain releases.** A mutex that lets waiters sleep must, on release, learn whether one
//!   sleeps. parking_lot's keeps that in the lock word, so its release is a compare-and-swap
//!   (a locked instruction, ~5 ns on this machine's cores). Here sleepers count themselves on
//!   a word of their own: a release stores, then reads the count; a sleeper counts itself,
//!   then reads the lock: Dekker's protocol, whose two fences are asymmetric (see
//!   [`barrier`]): the sleeper, about to sleep anyway, pays the heavy one. A sleeper sleeps on
//!   a futex of the lock's own (a count of wake-ups), after spinning a little; not in
//!   parking_lot's process-wide table, which a child made by `fork` inherits with its parent's
//!   sleepers in it (see [`super::plain`]).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};

use crossbeam_utils::Backoff;

use super::{
    barrier,
    bias::{Bias, Entry},
};

/// A value behind a [`RawLock`].
pub(crate) type Lock<T> = lock_api::Mutex<RawLock, T>;
/// A held [`Lock`].
pub(crate) type LockGuard<'a, T> = lock_api::MutexGuard<'a, RawLock, T>;

/// `RawLock::door`: taken by the word (the bias revoked, or not the caller's).
const WORD: u8 = 0;
/// Taken by the owner's bias.
const BIAS: u8 = 1;
/// Taken by a bias lent for this holding alone.
const LENT: u8 = 2;

/// See the module's text.
pub(crate) struct RawLock {
    /// Taken by compare-and-swap once the bias is revoked.
    locked: AtomicBool,
    bias: Bias,
    /// How the holder took the lock, its release leaving by the same door: [`WORD`],
    /// [`BIAS`] or [`LENT`] (the bias lent, [`Entry::Lent`]). Written and read by the holder
    /// only; one byte, so that a release asks once.
    door: AtomicU8,
    /// The futex sleepers sleep on: below [`WAKE`], how many threads are past spinning, about
    /// to sleep or asleep; above, a count of wake-ups, so that a sleeper whose wake-up came
    /// between its look at the lock and its sleep does not sleep (the futex compares the word).
    sleepers: AtomicU32,
}

/// One wake-up in `RawLock::sleepers` (the sleepers counted below it).
const WAKE: u32 = 1 << 16;

impl RawLock {
    #[inline]
    fn enter_biased(&self) -> bool {
        self.entered(self.bias.enter())
    }

    /// Notes how the lock was entered; whether it was.
    #[inline]
    fn entered(&self, e: Entry) -> bool {
        match e {
            Entry::In => {
                self.door.store(BIAS, Ordering::Relaxed);
                true
            }
            Entry::Lent => {
                self.door.store(LENT, Ordering::Relaxed);
                true
            }
            Entry::Out => false,
            Entry::BackedOff => {
                self.wake_sleeper();
                false
            }
        }
    }

    /// Takes the lock without keeping its bias (see [`Bias::lend`]).
    fn lock_lent(&self) {
        if !self.entered(self.bias.lend()) {
            self.lock_word();
        }
    }

    /// Takes the lock word (the bias revoked), and checks that no owner is in by the bias.
    #[inline]
    fn try_word(&self) -> bool {
        if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
        {
            return false;
        }
        if self.bias.owner_inside() {
            // The owner entered before the revocation (or is backing off): give way.
            self.leave_word();
            return false;
        }
        self.door.store(WORD, Ordering::Relaxed);
        true
    }

    /// Whether the lock is free: no holder of the word, nobody in by the bias.
    fn free(&self) -> bool {
        !self.locked.load(Ordering::Relaxed) && !self.bias.owner_in()
    }

    /// Takes the lock by its word: once the bias is revoked, an uncontended take is one
    /// compare-and-swap (out of line, so that every caller's inlined `lock` stays small).
    #[inline(never)]
    fn lock_word(&self) {
        if !(self.bias.is_revoked() && self.try_word()) {
            self.lock_slow();
        }
    }

    /// Takes the lock once the bias is not the calling thread's.
    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        if !self.bias.is_revoked() {
            self.bias.revoke();
        }
        let spin = Backoff::new();
        while !spin.is_completed() {
            if self.free() && self.try_word() {
                return;
            }
            spin.snooze();
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Every release made before this point is seen below; a release after it sees the
        // count (see `wake_sleeper`), and adds a wake-up after its release: a `seen` that
        // includes it sees the release too, one that does not has the futex not sleep (or
        // wakes it).
        barrier::heavy();
        loop {
            let seen = self.sleepers.load(Ordering::Acquire);
            if self.try_word() {
                break;
            }
            if !self.free() {
                crate::sys::futex_wait_private(&self.sleepers, seen);
            }
        }
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    #[inline]
    fn leave_word(&self) {
        self.locked.store(false, Ordering::Release);
        // The word is taken on either way (see `barrier::asymmetric`).
        barrier::light_any();
        self.wake_if_sleeper();
    }

    /// `try_lock` for a thread that is not in by the bias (out of line: the bias's entry, the
    /// common case, stays small where it is inlined).
    #[inline(never)]
    fn try_lock_shared(&self) -> bool {
        if self.bias.mine() {
            // The owner is in already (or a revocation is under way): taken.
            if !self.bias.is_revoked() {
                return false;
            }
        } else if !self.bias.is_revoked() {
            self.bias.revoke();
        }
        self.free() && self.try_word()
    }

    /// Whether the calling thread owns the lock's bias.
    #[cfg(test)]
    pub(crate) fn by_its_bias(&self) -> bool {
        self.bias.mine()
    }

    /// Whether no thread owns the lock's bias, nor has it been revoked.
    #[cfg(test)]
    pub(crate) fn bias_nobodys(&self) -> bool {
        self.bias.nobodys()
    }

    /// After a release by the bias (only on the asymmetric way): wakes a sleeper if one
    /// counted itself.
    #[inline]
    fn wake_sleeper(&self) {
        barrier::light();
        self.wake_if_sleeper();
    }

    /// After a release and its barrier.
    #[inline]
    fn wake_if_sleeper(&self) {
        if !self.sleepers.load(Ordering::Relaxed).is_multiple_of(WAKE) {
            self.wake_one();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        // (The count wraps: only a change matters.)
        self.sleepers.fetch_add(WAKE, Ordering::Release);
        crate::sys::futex_wake_one_private(&self.sleepers);
    }
}

// SAFETY: one holder at a time. The owner holds the lock by its bias only while it is in it
// (see `Bias`); any other thread takes the lock word only after the bias is revoked (the
// owner's earlier entries are then seen by `owner_inside`, its later ones back off) and only
// while the owner is not in. Holders of the word exclude each other by its compare-and-swap.
// Each release (a release store of the bias's `inside` or of the word) is seen by the next
// holder's acquire load of it.
unsafe impl lock_api::RawMutex for RawLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawLock = RawLock {
        locked: AtomicBool::new(false),
        bias: Bias::new(),
        door: AtomicU8::new(WORD),
        sleepers: AtomicU32::new(0),
    };

    type GuardMarker = lock_api::GuardSend;

    #[inline]
    fn lock(&self) {
        if !self.enter_biased() {
            self.lock_word();
        }
    }

    #[inline(always)]
    fn try_lock(&self) -> bool {
        self.enter_biased() || self.try_lock_shared()
    }

    #[inline]
    unsafe fn unlock(&self) {
        match self.door.load(Ordering::Relaxed) {
            BIAS => self.bias.leave(),
            LENT => self.bias.give_back(),
            _ => return self.leave_word(),
        }
        self.wake_sleeper();
    }

    #[inline]
    fn is_locked(&self) -> bool {
        !self.free()
    }
}

/// Takes `lock` as a thread that creates, sets up, inspects or tears down what it guards
/// (another thread's to use, often): without keeping the lock's bias, so that the thread that
/// then uses the object owns it, with no revocation (a process-wide barrier, ~10 us, per
/// object) and the compare-and-swap of every later take that follows one.
pub(crate) fn lock_lent<T>(lock: &Lock<T>) -> LockGuard<'_, T> {
    // SAFETY: the raw lock is taken here, and released by the guard made for it.
    unsafe {
        lock.raw().lock_lent();
        lock.make_guard_unchecked()
    }
}

/// Gives `lock`'s bias back if the calling thread owns it and does not hold the lock (see
/// [`Bias::disown`]).
pub(crate) fn disown<T>(lock: &Lock<T>) {
    // SAFETY: only the bias's owner is looked at and cleared, by its owner, out of the lock;
    // the lock's state is not touched.
    unsafe { lock.raw() }.bias.disown();
}

/// Whether no thread owns `lock`'s bias, nor has it been revoked.
#[cfg(test)]
pub(crate) fn bias_nobodys<T>(lock: &Lock<T>) -> bool {
    // SAFETY: only the bias is looked at.
    unsafe { lock.raw() }.bias_nobodys()
}

/// Whether another thread owns `lock`'s bias (not the caller; never so once it is revoked).
#[cfg(test)]
pub(crate) fn bias_others<T>(lock: &Lock<T>) -> bool {
    // SAFETY: only the bias is looked at.
    unsafe { lock.raw() }.bias.others()
}

#[cfg(test)]
mod test {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    };

    use super::{
        super::bias::{BIASED, REVOKED},
        Lock,
    };

    /// The owner takes the lock by its bias; a second take on its own thread fails (never
    /// two guards); another thread's try while the owner is inside revokes the bias and fails,
    /// and succeeds once the owner left; then the owner takes the word like anyone.
    #[test]
    fn test_the_bias_is_the_first_thread_s_until_another_wants_the_lock() {
        let lock = Arc::new(Lock::new(0u32));
        // SAFETY: only reads the lock's fields.
        let raw = unsafe { lock.raw() };
        let mut g = lock.lock();
        *g += 1;
        assert!(raw.bias.owner_in() && !raw.locked.load(Ordering::SeqCst));
        assert!(lock.try_lock().is_none(), "the holder's second take");
        let other = {
            let lock = lock.clone();
            move || lock.try_lock().map(|mut g| *g += 10).is_some()
        };
        assert!(!std::thread::spawn(other.clone()).join().unwrap(), "the owner is inside");
        assert_eq!(raw.bias.revoked_state(), REVOKED);
        drop(g);
        assert!(std::thread::spawn(other).join().unwrap());
        let g = lock.lock();
        assert!(!raw.bias.owner_in() && raw.locked.load(Ordering::SeqCst));
        assert_eq!(*g, 11);
        assert!(lock.try_lock().is_none());
    }

    /// A lock taken lent (by the thread that set the object up) leaves its bias to the first
    /// thread that takes it plainly: that one takes it by the bias, nothing revoked; the
    /// setter's next take, the bias now another's, revokes it and goes by the word.
    #[test]
    fn test_a_lent_take_leaves_the_bias_to_the_thread_that_uses_the_lock() {
        let lock = Arc::new(Lock::new(0u32));
        // SAFETY: only reads the lock's fields.
        let raw = unsafe { lock.raw() };
        for _ in 0..3 {
            let mut g = super::lock_lent(&lock);
            *g += 1;
            assert!(raw.bias.owner_in() && !raw.locked.load(Ordering::SeqCst));
            assert!(lock.try_lock().is_none(), "the holder's second take");
        }
        let user = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                // SAFETY: only reads the lock's fields.
                let raw = unsafe { lock.raw() };
                for _ in 0..3 {
                    let mut g = lock.lock();
                    *g += 10;
                    assert!(raw.bias.mine() && raw.bias.owner_in());
                    assert!(!raw.locked.load(Ordering::SeqCst), "by the bias, not the word");
                }
            })
        };
        user.join().unwrap();
        assert_eq!(raw.bias.revoked_state(), BIASED);
        // The setter again, the bias now another's: revoked, and the word taken.
        let g = super::lock_lent(&lock);
        assert_eq!(raw.bias.revoked_state(), REVOKED);
        assert!(raw.locked.load(Ordering::SeqCst) && !raw.bias.owner_in());
        assert_eq!(*g, 33);
    }

    /// Threads that take the lock lent and threads that take it plainly, at once, on many
    /// fresh locks (the bias lent, given back, owned, revoked while lent): no holder may see
    /// another's update half done, and no update may be lost.
    #[test]
    fn test_lent_and_plain_takes_exclude_each_other() {
        fn add(lock: &Lock<(u64, u64)>, lent: bool) {
            let mut g = if lent { super::lock_lent(lock) } else { lock.lock() };
            assert_eq!(g.0, g.1);
            g.0 += 1;
            std::hint::spin_loop();
            g.1 += 1;
        }
        const ROUNDS: u64 = 300;
        for _ in 0..100 {
            let lock = Arc::new(Lock::new((0u64, 0u64)));
            let threads: Vec<_> = (0..3)
                .map(|t| {
                    let lock = lock.clone();
                    std::thread::spawn(move || {
                        for i in 0..ROUNDS {
                            add(&lock, t != 2 && (i % 3 != 0 || t == 0));
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(*lock.lock(), (3 * ROUNDS, 3 * ROUNDS));
        }
    }

    /// An owner taking the lock by its bias as fast as it can, and a newcomer arriving
    /// meanwhile (the revocation races the owner's entries): on many fresh locks, no holder
    /// may see another's update half done, and no update may be lost.
    #[test]
    fn test_the_owner_and_a_newcomer_exclude_each_other_across_the_revocation() {
        fn add(lock: &Lock<(u64, u64)>) {
            let mut g = lock.lock();
            assert_eq!(g.0, g.1);
            g.0 += 1;
            std::hint::spin_loop();
            g.1 += 1;
        }
        const ROUNDS: u64 = 1_000;
        for _ in 0..200 {
            let lock = Arc::new(Lock::new((0u64, 0u64)));
            let (rounds, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
            let owner = {
                let (lock, rounds, stop) = (lock.clone(), rounds.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        add(&lock);
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            while rounds.load(Ordering::Relaxed) < 100 {
                std::hint::spin_loop();
            }
            for _ in 0..ROUNDS {
                add(&lock);
            }
            stop.store(true, Ordering::Relaxed);
            owner.join().unwrap();
            // SAFETY: only reads the lock's fields.
            assert_eq!(unsafe { lock.raw() }.bias.revoked_state(), REVOKED);
            let n = rounds.load(Ordering::Relaxed) + ROUNDS;
            assert_eq!(*lock.lock(), (n, n));
        }
    }

    /// Threads (more than cores, so that holders are preempted and waiters sleep) add to two
    /// words under the lock, one with a pause between: no add may be lost, no holder may see
    /// the words differ.
    #[test]
    fn test_holders_exclude_each_other_and_sleepers_wake() {
        const THREADS: usize = 6;
        const ROUNDS: u64 = 20_000;
        let lock = Arc::new(Lock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for i in 0..ROUNDS {
                        let mut g = lock.lock();
                        assert_eq!(g.0, g.1);
                        g.0 += 1;
                        if (i + t as u64).is_multiple_of(64) {
                            // Held long enough for the others to stop spinning and sleep.
                            std::thread::yield_now();
                        }
                        g.1 += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let total = THREADS as u64 * ROUNDS;
        assert_eq!(*lock.lock(), (total, total));
    }

    /// A waiter that gave up spinning on a held lock (counted itself, about to sleep or asleep)
    /// is woken by its release (a lost wake-up would hang this test).
    #[test]
    fn test_a_release_wakes_a_sleeper() {
        for _ in 0..50 {
            let lock = Arc::new(Lock::new(0u32));
            let g = lock.lock();
            let started = Arc::new(AtomicBool::new(false));
            let waiter = {
                let (lock, started) = (lock.clone(), started.clone());
                std::thread::spawn(move || {
                    started.store(true, Ordering::SeqCst);
                    *lock.lock() += 1;
                })
            };
            while !started.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            // SAFETY: only reads the lock's counter.
            let raw = unsafe { lock.raw() };
            while raw.sleepers.load(Ordering::SeqCst).is_multiple_of(super::WAKE) {
                std::thread::yield_now();
            }
            drop(g);
            waiter.join().unwrap();
            assert_eq!(*lock.lock(), 1);
            assert!(lock.try_lock().is_some());
        }
    }
}

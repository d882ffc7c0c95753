//! A mutex whose release is a plain store: for the locks every work request takes (a QP's).
//!
//! A mutex that lets waiters sleep must, on release, learn whether one sleeps. parking_lot's
//! keeps that in the lock word, so its release is a compare-and-swap: a locked instruction
//! (~5 ns on this machine's cores), paid on every release though waiters are rare. Here the
//! word holds only "locked", and sleepers count themselves on a second word. A release stores
//! the first word, then reads the second: against a waiter that counts itself, then reads the
//! first, this is Dekker's protocol, and its two fences are asymmetric (see [`barrier`]): the
//! waiter, which is about to sleep anyway, pays the heavy one, and the release a compiler
//! fence. Sleeping and waking go through `parking_lot_core`'s parking lot, keyed by the lock's
//! address; a waiter spins a little first, as parking_lot's does.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use parking_lot_core::{DEFAULT_PARK_TOKEN, DEFAULT_UNPARK_TOKEN, SpinWait};

use super::barrier;

/// A value behind a [`RawLock`].
pub(crate) type Lock<T> = parking_lot::lock_api::Mutex<RawLock, T>;

/// See the module's text.
pub(crate) struct RawLock {
    locked: AtomicBool,
    /// Threads past spinning, about to sleep or asleep on this lock's address.
    sleepers: AtomicU32,
}

impl RawLock {
    fn key(&self) -> usize {
        self as *const RawLock as usize
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut spin = SpinWait::new();
        loop {
            if !self.locked.load(Ordering::Relaxed) && self.try_acquire() {
                return;
            }
            if !spin.spin() {
                break;
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Every release made before this point is seen below; a release after it sees the
        // count (see `unlock`).
        barrier::heavy();
        loop {
            if !self.locked.load(Ordering::SeqCst) && self.try_acquire() {
                break;
            }
            // SAFETY: the key is this lock's address, which no other parking use shares; the
            // closures neither park nor panic.
            unsafe {
                parking_lot_core::park(
                    self.key(),
                    || self.locked.load(Ordering::Relaxed),
                    || {},
                    |_, _| {},
                    DEFAULT_PARK_TOKEN,
                    None,
                );
            }
        }
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        // SAFETY: as in `lock_slow`; the callback does nothing.
        unsafe {
            parking_lot_core::unpark_one(self.key(), |_| DEFAULT_UNPARK_TOKEN);
        }
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
}

// SAFETY: `lock` and `try_lock` succeed only by swapping `locked` from false to true (acquire),
// and only `unlock` (release) stores false, so one holder at a time, and each holder sees what
// the previous one wrote.
unsafe impl parking_lot::lock_api::RawMutex for RawLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawLock = RawLock { locked: AtomicBool::new(false), sleepers: AtomicU32::new(0) };

    type GuardMarker = parking_lot::lock_api::GuardSend;

    #[inline]
    fn lock(&self) {
        if !self.try_acquire() {
            self.lock_slow();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.try_acquire()
    }

    #[inline]
    unsafe fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
        barrier::light();
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake_one();
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod test {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::Lock;

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
            while raw.sleepers.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            drop(g);
            waiter.join().unwrap();
            assert_eq!(*lock.lock(), 1);
            assert!(lock.try_lock().is_some());
        }
    }
}

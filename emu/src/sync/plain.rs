//! Mutexes, reader-writer locks and condition variables whose whole state lives in their own
//! words (std's, on futexes), never poisoned: for everything but the locks every work request
//! takes (see [`super::lock`]).
//!
//! Not parking_lot's: those park a waiting thread in one process-wide table, keyed by the
//! lock's address, that a child made by `fork` inherits with its parent's parked threads still
//! in it. The child has none of those threads, and glibc gives their stacks (their thread-local
//! data, which the table points into) to the child's next threads: a lock of the child's that
//! shared a bucket with one then crashed or hung (the fork test's child, a SIGSEGV in `park`,
//! 1 run in ~40 while the parent's timer thread slept). A lock that keeps its waiters in its own
//! word leaves the child only what the parent's threads held at the fork.
//!
//! A panic while a lock is held does not poison it (as with parking_lot): every caller is
//! behind the C boundary's `catch_unwind`, and each critical section leaves its data whole.

use std::{sync::PoisonError, time::Duration};

pub type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;
pub type RwLockReadGuard<'a, T> = std::sync::RwLockReadGuard<'a, T>;
pub type RwLockWriteGuard<'a, T> = std::sync::RwLockWriteGuard<'a, T>;

/// Where a thread keeps the guard of a `static` [`Mutex`] between two calls: the thread that
/// forks, from its prepare hook to its parent or child hook (see `sys::ForkHooks`).
pub(crate) type HeldGuard<T> = std::cell::RefCell<Option<MutexGuard<'static, T>>>;

/// A mutual-exclusion lock (see the module's text).
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if it is free.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_lock() {
            Some(v) => f.debug_tuple("Mutex").field(&&*v).finish(),
            None => f.write_str("Mutex(<locked>)"),
        }
    }
}

/// A reader-writer lock (see the module's text).
#[derive(Default)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> Self {
        RwLock(std::sync::RwLock::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shared access if no writer is in.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        match self.0.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_read() {
            Some(v) => f.debug_tuple("RwLock").field(&&*v).finish(),
            None => f.write_str("RwLock(<locked>)"),
        }
    }
}

/// A condition variable for a [`Mutex`]'s guard.
#[derive(Debug, Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    pub const fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    /// Sleeps until notified (or woken spuriously), the lock let go meanwhile.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Condvar::wait`] for at most `timeout`; the guard, and whether the time ran out.
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, bool) {
        let (g, r) = self.0.wait_timeout(guard, timeout).unwrap_or_else(PoisonError::into_inner);
        (g, r.timed_out())
    }

    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

#[cfg(test)]
mod test {
    #![allow(unsafe_code)]

    use std::{sync::Arc, time::Duration};

    use super::{Condvar, Mutex};

    /// A child made by `fork` while threads of its parent slept in a lock's wait locks and
    /// waits as much as it likes in threads of its own (which glibc gives the sleepers'
    /// stacks). With parking_lot's locks, every such child died of SIGSEGV in its table of
    /// parked threads (all 20 of 20 rounds of this program, measured).
    #[test]
    fn a_child_made_by_fork_while_threads_slept_in_a_lock_locks_in_threads_of_its_own() {
        for _ in 0..3 {
            let stop = Arc::new((Mutex::new(false), Condvar::new()));
            let sleepers: Vec<_> = (0..6)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let mut stopped = stop.0.lock();
                        while !*stopped {
                            stopped = stop.1.wait(stopped);
                        }
                    })
                })
                .collect();
            // (Asleep or not, the sleepers' threads are gone in the child all the same.)
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: the child runs plain Rust in threads of its own, and ends with _exit,
            // or by its alarm if it hangs.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: as above.
                unsafe { libc::alarm(10) };
                let locks: Arc<Vec<(Mutex<u64>, Condvar)>> =
                    Arc::new((0..256).map(|_| (Mutex::new(0), Condvar::new())).collect());
                let threads: Vec<_> = (0..6)
                    .map(|t| {
                        let locks = locks.clone();
                        std::thread::spawn(move || {
                            for i in 0..20_000usize {
                                let (m, cv) = &locks[(i * 7 + t) % locks.len()];
                                let mut g = m.lock();
                                *g += 1;
                                if i % 64 == 0 {
                                    g = cv.wait_timeout(g, Duration::from_micros(10)).0;
                                }
                                drop(g);
                                cv.notify_all();
                            }
                        })
                    })
                    .collect();
                let joined = threads.into_iter().all(|t| t.join().is_ok());
                let counted: u64 = locks.iter().map(|(m, _)| *m.lock()).sum();
                let ok = joined && counted == 6 * 20_000;
                // SAFETY: as above.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            assert!(pid > 0);
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            *stop.0.lock() = true;
            stop.1.notify_all();
            sleepers.into_iter().for_each(|s| s.join().unwrap());
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "the child ended with status {status:#x}"
            );
        }
    }
}

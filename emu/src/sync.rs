//! A reader-writer lock for tables that every work request reads and almost nothing writes
//! (a device's keys, a CQ's ring storage, the C shim's object registry).
//!
//! A reader announces itself on a counter of its own thread's shard and checks that no writer
//! is in: one locked add, one load, and a release decrement when done. A writer raises its
//! flag and waits for every shard to drain. Against each other this is Dekker's protocol
//! (each stores, then loads the other's word, all sequentially consistent), so either the
//! reader sees the flag and backs off, or the writer sees the reader and waits for it.
//! crossbeam-utils' `ShardedLock` has the same shape but puts a std `RwLock` in each shard
//! and finds its shard through a registered thread-local: about 40 instructions per read
//! against about 10 here, paid several times per work request.
//!
//! Writers are preferred (a reader that finds one waits for it), so as with any
//! writer-preferring lock a thread must not take a second read of a lock it already reads
//! with [`ReadMostly::read`] (a writer between the two would wait for it forever); it may
//! with [`ReadMostly::try_read`], which gives up instead of waiting.
#![allow(unsafe_code)]

use std::{
    cell::{Cell, UnsafeCell},
    ops::{Deref, DerefMut},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

/// Shards per lock: enough that the threads of a 2- to 8-core host rarely share one.
const SHARDS: usize = 8;

/// The shard of the calling thread: threads take shards in turn as they first read.
#[inline]
fn shard() -> usize {
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    SHARD.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            s.set(i);
        }
        i
    })
}

/// A value that many threads read at once and that is rarely written.
pub struct ReadMostly<T> {
    readers: [CachePadded<AtomicUsize>; SHARDS],
    /// A writer is in or waiting for the readers to drain.
    writing: AtomicBool,
    /// Writers one at a time; readers that found `writing` wait on it.
    writer: Mutex<()>,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through guards: shared references by readers (so `T` must
// be `Sync`) while no writer is in, and one exclusive reference by the only writer while no
// reader is in (so `T` must be `Send`), as for `std::sync::RwLock`.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}
// SAFETY: moving the lock moves the value; no guard can exist then.
unsafe impl<T: Send> Send for ReadMostly<T> {}

impl<T: Default> Default for ReadMostly<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ReadMostly<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_read() {
            Some(v) => f.debug_tuple("ReadMostly").field(&*v).finish(),
            None => f.write_str("ReadMostly(<being written>)"),
        }
    }
}

impl<T> ReadMostly<T> {
    pub fn new(value: T) -> Self {
        ReadMostly {
            readers: Default::default(),
            writing: AtomicBool::new(false),
            writer: Mutex::new(()),
            value: UnsafeCell::new(value),
        }
    }

    /// Shared access, waiting for a writer that is in or waiting.
    #[inline]
    pub fn read(&self) -> ReadGuard<'_, T> {
        match self.try_read() {
            Some(g) => g,
            None => self.read_after_writer(),
        }
    }

    #[cold]
    #[inline(never)]
    fn read_after_writer(&self) -> ReadGuard<'_, T> {
        loop {
            // The writer holds `writer` until it is done.
            drop(self.writer.lock());
            if let Some(g) = self.try_read() {
                return g;
            }
        }
    }

    /// Shared access unless a writer is in or waiting.
    #[inline]
    pub fn try_read(&self) -> Option<ReadGuard<'_, T>> {
        let shard = shard();
        let count = &self.readers[shard];
        count.fetch_add(1, Ordering::SeqCst);
        if self.writing.load(Ordering::SeqCst) {
            count.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(ReadGuard { lock: self, shard })
    }

    /// Exclusive access, once every reader has left.
    pub fn write(&self) -> WriteGuard<'_, T> {
        let serial = self.writer.lock();
        self.writing.store(true, Ordering::SeqCst);
        for count in &self.readers {
            while count.load(Ordering::SeqCst) != 0 {
                std::thread::yield_now();
            }
        }
        WriteGuard { lock: self, _serial: serial }
    }

    /// The value, through exclusive ownership of the lock.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Shared access to a [`ReadMostly`] value.
pub struct ReadGuard<'a, T> {
    lock: &'a ReadMostly<T>,
    shard: usize,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard's count keeps writers out (see `try_read`) until it drops.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ReadGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.readers[self.shard].fetch_sub(1, Ordering::Release);
    }
}

/// Exclusive access to a [`ReadMostly`] value.
pub struct WriteGuard<'a, T> {
    lock: &'a ReadMostly<T>,
    _serial: MutexGuard<'a, ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the writer is alone: `write` saw every reader count at 0 after raising
        // `writing`, and readers back off while it is raised.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and this guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for WriteGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.writing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod test {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };

    use super::ReadMostly;

    /// Writers keep two words equal; readers on other threads must never see them differ,
    /// and every write must land. The writer goes on until every reader has read a while
    /// (on a busy machine a reader may start late).
    #[test]
    fn test_readers_never_see_a_write_half_done() {
        const READERS: usize = 3;
        let lock = Arc::new(ReadMostly::new((0u64, 0u64)));
        let stop = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (lock, stop, busy) = (lock.clone(), stop.clone(), busy.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let g = lock.read();
                        assert_eq!(g.0, g.1);
                        reads += 1;
                        if reads == 1_000 {
                            busy.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads
                })
            })
            .collect();
        let mut writes = 0;
        while writes < 2_000 || busy.load(Ordering::Relaxed) < READERS {
            let mut g = lock.write();
            g.0 += 1;
            std::hint::spin_loop();
            g.1 += 1;
            writes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() >= 1_000);
        }
        assert_eq!(*lock.read(), (writes, writes));
    }

    #[test]
    fn test_try_read_gives_way_to_a_writer_and_write_waits_for_readers() {
        let lock = Arc::new(ReadMostly::new(0u32));
        let r = lock.read();
        let writer = {
            let lock = lock.clone();
            std::thread::spawn(move || *lock.write() = 7)
        };
        // The writer raises its flag, then waits for this read.
        while !lock.writing.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(lock.try_read().is_none(), "a waiting writer must turn try_read away");
        assert!(!writer.is_finished());
        drop(r);
        writer.join().unwrap();
        assert_eq!(*lock.read(), 7);
        assert_eq!(*lock.try_read().unwrap(), 7);
    }
}

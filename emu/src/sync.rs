//! A reader-writer lock for tables that every work request reads and almost nothing writes
//! (a device's keys, the C shim's object registry).
//!
//! A reader announces itself in a word of its own in the lock (its thread's slot) and checks
//! that no writer is in; a writer raises its flag and waits for every reader's word to clear.
//! Against each other this is Dekker's protocol: each stores, then loads the other's word, so
//! either the reader sees the flag and backs off, or the writer sees the reader and waits.
//! Dekker needs a full fence between each side's store and load. The writer, which is rare,
//! pays for both: it issues a process-wide barrier (`membarrier(2)`, see `barrier`), which
//! orders every running thread's earlier stores before its own later loads, so the reader
//! needs only a compiler fence. A read is then two plain stores and a load, where a
//! locked instruction costs ~5 ns on this machine's cores and a work request takes several
//! reads.
//!
//! Each lock has a slot for each of the first `SLOTS` threads (by index, handed back when a thread
//! ends); any further thread, and every thread in a ThreadSanitizer build (which cannot see a
//! process-wide barrier), counts itself on one of `SHARDS` shared counters with a locked add
//! instead, sequentially consistent on both sides. crossbeam-utils' `ShardedLock` has the
//! shape of the latter but puts a std `RwLock` in each shard: about 40 instructions per read
//! against about 10 here.
//!
//! Writers are preferred (a reader that finds one waits for it), so as with any
//! writer-preferring lock a thread must not take a second read of a lock it already reads
//! with [`ReadMostly::read`] (a writer between the two would wait for it forever); it may
//! with [`ReadMostly::try_read`], which gives up instead of waiting.
#![allow(unsafe_code)]

use std::{
    cell::UnsafeCell,
    ops::{Deref, DerefMut},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
};

use crossbeam_utils::CachePadded;

pub(crate) mod barrier;
pub(crate) mod bias;
pub(crate) mod lock;
pub(crate) mod plain;
pub(crate) mod prefetch;
pub(crate) mod tls;

pub use plain::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Threads per lock with a slot of their own (more than a 2- to 8-core host runs at once).
const SLOTS: usize = 32;
/// Shared counters per lock, for the threads beyond.
const SHARDS: usize = 8;

/// How a thread reads, as [`reader_word`] holds it: its slot (below [`SLOTS`]), or `SLOTS` + a
/// shared counter. One word, so that a guard (with its lock) fits in two registers.
#[derive(Clone, Copy)]
struct Reader(usize);

/// A [`Reader`] taken apart.
enum Way {
    Slot(usize),
    Shard(usize),
}

impl Reader {
    #[inline(always)]
    fn way(self) -> Way {
        match self.0 {
            r if r < SLOTS => Way::Slot(r),
            r => Way::Shard(r - SLOTS),
        }
    }
}

/// A thread's index while it lives: a free one, handed back when the thread ends.
struct ThreadIndex(usize);

thread_local! {
    static INDEX: ThreadIndex = ThreadIndex::take();
}

/// How the thread reads, once it has: its slot (below [`SLOTS`]), or `SLOTS` + its shard; a
/// thread-local word, one load away (see [`tls`]). Stored inverted, so that a thread's word,
/// zero at its start, reads as [`UNSET`].
mod reader_word {
    super::tls::tls_word! {
        mod word = "rdma_emu_sync_reader";
    }

    #[inline(always)]
    pub(super) fn get() -> usize {
        !(word::get() as usize)
    }

    pub(super) fn set(r: usize) {
        word::set(!r as u64);
    }
}

/// [`reader_word`] before the thread's first read.
const UNSET: usize = usize::MAX;

/// Indexes handed back, and the next never handed out.
static FREE: Mutex<(Vec<usize>, usize)> = Mutex::new((Vec::new(), 0));

impl ThreadIndex {
    fn take() -> ThreadIndex {
        // A thread that started or ended in the parent at a fork would leave the list held for
        // ever in the child, whose every new thread then waited at its first read.
        crate::sys::hold_across_fork!(
            crate::sys::ForkStage::ThreadIndexes,
            FREE,
            (Vec<usize>, usize)
        );
        let mut free = FREE.lock();
        let i = match free.0.pop() {
            Some(i) => i,
            None => {
                free.1 += 1;
                free.1 - 1
            }
        };
        ThreadIndex(i)
    }
}

impl Drop for ThreadIndex {
    fn drop(&mut self) {
        // The slot may be another thread's from now on: the thread's last reads (other
        // destructors') count on a shared counter.
        reader_word::set(SLOTS);
        FREE.lock().0.push(self.0);
    }
}

/// How the calling thread reads.
#[inline]
fn reader() -> Reader {
    match reader_word::get() {
        UNSET => first_read(),
        r => Reader(r),
    }
}

/// The thread's first read: a slot if its index has one, else a shard in turn.
#[cold]
fn first_read() -> Reader {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // While the thread ends (a destructor reading a table) its index may be gone already.
    // A slot's read relies on a bare light barrier (see `barrier::asymmetric`).
    let index = INDEX
        .try_with(|i| i.0)
        .ok()
        .filter(|&i| i < SLOTS && cfg!(not(feature = "tsan")) && barrier::asymmetric());
    let r = index.unwrap_or_else(|| SLOTS + NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
    reader_word::set(r);
    reader()
}

/// A value that many threads read at once and that is rarely written.
pub struct ReadMostly<T> {
    /// Per thread index: how many reads that thread holds (written by that thread only).
    slots: [CachePadded<AtomicUsize>; SLOTS],
    /// Reads held by threads without a slot.
    shared: [CachePadded<AtomicUsize>; SHARDS],
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
            slots: Default::default(),
            shared: Default::default(),
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
    ///
    /// A thread with a slot of its own reads inline; any other (and a thread's first read,
    /// `UNSET` being above every slot) out of line, with one compare for both.
    #[inline(always)]
    pub fn try_read(&self) -> Option<ReadGuard<'_, T>> {
        let r = reader_word::get();
        if r >= SLOTS {
            return self.try_read_shared();
        }
        // Only this thread writes its slot: a plain increment, then the light side of the
        // barrier `write` issues (the store is seen before `writing` is read).
        let slot = &self.slots[r];
        let held = slot.load(Ordering::Relaxed);
        slot.store(held + 1, Ordering::Relaxed);
        barrier::light();
        if self.writing.load(Ordering::Acquire) {
            slot.store(held, Ordering::Release);
            return None;
        }
        Some(ReadGuard { lock: self, reader: Reader(r) })
    }

    /// [`ReadMostly::try_read`] on a shared counter, or the thread's first read.
    #[inline(never)]
    fn try_read_shared(&self) -> Option<ReadGuard<'_, T>> {
        let reader = reader();
        let i = match reader.way() {
            Way::Slot(_) => return self.try_read(),
            Way::Shard(i) => i,
        };
        let count = &self.shared[i];
        count.fetch_add(1, Ordering::SeqCst);
        if self.writing.load(Ordering::SeqCst) {
            count.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(ReadGuard { lock: self, reader })
    }

    /// Exclusive access, once every reader has left.
    pub fn write(&self) -> WriteGuard<'_, T> {
        let serial = self.writer.lock();
        self.writing.store(true, Ordering::SeqCst);
        // Every reader's slot store made before this point is seen below; a reader that
        // stores after it sees `writing` (see `try_read`).
        barrier::heavy();
        for count in self.slots.iter().chain(&self.shared) {
            while count.load(Ordering::Acquire) != 0 {
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
    reader: Reader,
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

impl<T> ReadGuard<'_, T> {
    /// Whether the read is counted on the thread's own slot.
    #[cfg(test)]
    pub(crate) fn by_slot(&self) -> bool {
        matches!(self.reader.way(), Way::Slot(_))
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        match self.reader.way() {
            Way::Slot(i) => {
                let slot = &self.lock.slots[i];
                slot.store(slot.load(Ordering::Relaxed) - 1, Ordering::Release);
            }
            Way::Shard(i) => {
                self.lock.shared[i].fetch_sub(1, Ordering::Release);
            }
        }
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

/// A value behind a [`ReadMostly`] lock that other values share: a thread that reads two of
/// them at once (a work request between two devices reads both devices' keys) announces
/// itself once, and the second read can neither wait for a writer nor be refused.
pub(crate) struct Guarded<T> {
    lock: std::sync::Arc<ReadMostly<()>>,
    value: UnsafeCell<T>,
}

// SAFETY: as for `ReadMostly`: the value is reached only through a read guard of `lock`
// (shared references, so `T` must be `Sync`) or its write guard (one exclusive reference, so
// `T` must be `Send`).
unsafe impl<T: Send + Sync> Sync for Guarded<T> {}
// SAFETY: moving it moves the value; no guard can exist then.
unsafe impl<T: Send> Send for Guarded<T> {}

impl<T> Guarded<T> {
    pub(crate) fn new(lock: std::sync::Arc<ReadMostly<()>>, value: T) -> Self {
        Guarded { lock, value: UnsafeCell::new(value) }
    }

    /// Shared access, waiting for a writer that is in or waiting (see [`ReadMostly::read`]).
    #[inline(always)]
    pub(crate) fn read(&self) -> GuardedRead<'_, T> {
        let guard = self.lock.read();
        // SAFETY: the read guard keeps writers out until it drops, with the reference.
        GuardedRead { value: unsafe { &*self.value.get() }, guard }
    }

    /// Exclusive access, once every reader of the lock (of any value behind it) has left.
    pub(crate) fn write(&self) -> GuardedWrite<'_, T> {
        let guard = self.lock.write();
        // SAFETY: the write guard is the only one until it drops, with the reference: every
        // reader has left and none enters meanwhile.
        GuardedWrite { value: unsafe { &mut *self.value.get() }, _guard: guard }
    }

    /// The value, under `held`, a read of another value held now: if the two share a lock
    /// (else `None`: the caller reads this one for itself).
    #[inline]
    pub(crate) fn under<'g, U>(&'g self, held: &'g GuardedRead<'_, U>) -> Option<&'g T> {
        // SAFETY: `held` counts this thread as a reader of that lock, which is this value's,
        // for as long as the returned reference (it borrows `held`).
        std::ptr::eq(held.guard.lock, &*self.lock).then(|| unsafe { &*self.value.get() })
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Guarded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.lock.try_read() {
            // SAFETY: as in `read`.
            Some(_g) => f.debug_tuple("Guarded").field(unsafe { &*self.value.get() }).finish(),
            None => f.write_str("Guarded(<being written>)"),
        }
    }
}

/// Shared access to a [`Guarded`] value.
pub(crate) struct GuardedRead<'a, T> {
    value: &'a T,
    guard: ReadGuard<'a, ()>,
}

impl<T> Deref for GuardedRead<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.value
    }
}

/// Exclusive access to a [`Guarded`] value.
pub(crate) struct GuardedWrite<'a, T> {
    value: &'a mut T,
    _guard: WriteGuard<'a, ()>,
}

impl<T> Deref for GuardedWrite<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> DerefMut for GuardedWrite<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
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

    /// More threads at once than a lock has slots: those beyond read on shared counters, and a
    /// writer still waits for every one of them; the indexes of threads that ended are taken
    /// again by new ones.
    #[test]
    fn test_readers_with_and_without_slots_keep_writers_out() {
        let lock = Arc::new(ReadMostly::new((0u64, 0u64)));
        for _round in 0..2 {
            let stop = Arc::new(AtomicBool::new(false));
            let readers: Vec<_> = (0..super::SLOTS + 8)
                .map(|_| {
                    let (lock, stop) = (lock.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut reads = 0u64;
                        while !stop.load(Ordering::Relaxed) || reads < 100 {
                            let g = lock.read();
                            assert_eq!(g.0, g.1);
                            drop(g);
                            reads += 1;
                            // Many more threads than cores: let the writer's wait end.
                            std::thread::yield_now();
                        }
                    })
                })
                .collect();
            for _ in 0..20 {
                let mut g = lock.write();
                g.0 += 1;
                std::thread::yield_now();
                g.1 += 1;
            }
            stop.store(true, Ordering::Relaxed);
            for r in readers {
                r.join().unwrap();
            }
        }
        assert_eq!(*lock.read(), (40, 40));
        let in_use = super::FREE.lock().1;
        assert!(in_use < 3 * (super::SLOTS + 8), "thread indexes are handed back: {in_use}");
    }

    /// Each thread has a reader word of its own, `UNSET` until it stores one (the x86-64
    /// Linux word lives in the TLS block, whose zeros read as `UNSET`).
    #[test]
    fn test_the_reader_word_is_each_threads_own() {
        let word = |r| {
            std::thread::spawn(move || {
                let first = super::reader_word::get();
                super::reader_word::set(r);
                std::thread::yield_now();
                (first, super::reader_word::get())
            })
        };
        let (a, b) = (word(5), word(super::SLOTS + 1));
        assert_eq!(a.join().unwrap(), (super::UNSET, 5));
        assert_eq!(b.join().unwrap(), (super::UNSET, super::SLOTS + 1));
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

    /// Values behind one lock: a read of one reaches the other (and not a value behind
    /// another lock), and a writer of either waits for it.
    #[test]
    fn test_values_sharing_a_lock_are_read_under_one_read_and_written_alone() {
        use super::Guarded;
        let lock = Arc::new(ReadMostly::new(()));
        let a = Arc::new(Guarded::new(lock.clone(), 1u32));
        let b = Arc::new(Guarded::new(lock.clone(), 2u32));
        let apart = Guarded::new(Arc::new(ReadMostly::new(())), 3u32);
        let r = a.read();
        assert_eq!((*r, b.under(&r).copied()), (1, Some(2)));
        assert_eq!(apart.under(&r), None, "another lock's value is not under this read");
        let writer = {
            let b = b.clone();
            std::thread::spawn(move || *b.write() = 20)
        };
        while !lock.writing.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(!writer.is_finished(), "a writer of b waits for the read of a");
        assert_eq!(b.under(&r).copied(), Some(2));
        drop(r);
        writer.join().unwrap();
        let r = a.read();
        assert_eq!(b.under(&r).copied(), Some(20));
        assert_eq!(*apart.read(), 3);
    }
}

//! A one-way ring of records in shared memory: how a node of the host fabric sends to another
//! without a system call.
//!
//! The sender creates the ring (an anonymous shared-memory file) and passes its descriptor to
//! the receiver over the receiver's socket; from then on both map the same pages. One thread
//! at a time writes (the sender holds its peer's lock) and one reads (the receiver holds its
//! inbound lock), so the indices need no compare-and-swap: the writer publishes a record by
//! storing `tail` (release), the reader frees it by storing `head` (release).
//!
//! A receiver with nothing to do sleeps in poll(2) on its socket. Before it does, it sets
//! `bell` in each ring and looks once more; a writer that finds `bell` set after publishing
//! clears it and sends the receiver a datagram. Each side stores its flag before it loads the
//! other's (sequentially consistent), so one of them always sees the other: no record is left
//! unnoticed while the receiver sleeps, and a receiver that is awake costs the writer nothing.
//!
//! The ring's file comes from another process, so the reader trusts nothing in it: the file
//! must be sealed against shrinking and growing (else its writer could cut it under our
//! mapping, and the first read would fault with SIGBUS), and every index and record length is
//! checked before use. Each side keeps its own index privately and only publishes it, so a
//! peer that scribbles over the shared indices garbles its own stream, nothing else.
//!
//! The reader may keep a record after reading it ([`Record::lend`]): a large payload is then
//! placed straight from the ring. Records are freed in ring order, so `head` stops at the
//! oldest record still lent until its last borrower lets go.
//!
//! While the reader's process is stopped (SIGSTOP, a debugger), the writer may carry out a
//! record's request itself ([`Ring::claim`]): each record has a state word that the reader's
//! responder turns from fresh to taken as it begins the request ([`Ticket::carried_out`]),
//! and the writer from fresh to placing, then placed (or back to fresh); whoever moves it
//! first has the request. A request read but not begun when the process stopped can so still
//! be carried out. The writer also raises the ring's `gate` while it touches the reader's
//! memory, so that the reader can wait for it before it lets that memory go (see `exports`).
#![allow(unsafe_code)]

use std::{
    collections::VecDeque,
    io,
    ops::Range,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering, fence},
    },
};

use crate::mem::PeerProcess;

const MAGIC: u64 = u64::from_le_bytes(*b"REMURNG1");
/// The header page: fixed fields, then each index on its own cache line.
const HEADER: usize = 4096;
const MAGIC_AT: usize = 0;
const CAP_AT: usize = 8;
const WRITER_AT: usize = 16;
/// The address, in the writer's process, of a word holding `PROBE_VALUE_AT`'s value: a reader
/// that can read it there may read the writer's memory (`PULL_AT` says so to the writer).
const PROBE_ADDR_AT: usize = 24;
const PROBE_VALUE_AT: usize = 32;
const PULL_AT: usize = 40;
/// Set by the writer when it will write no more (its node left the fabric): the reader may
/// then take a ring from another node in the same slot.
const CLOSED_AT: usize = 48;
/// Set by the reader: it has looked for the writer's shared memory named up to this (see
/// `crate::shared_mem`), mapping what it was passed.
const VIEWS_AT: usize = 56;
pub(crate) const TAIL_AT: usize = 64;
pub(crate) const HEAD_AT: usize = 128;
const BELL_AT: usize = 192;
/// The bell word (at `BELL_AT`): the reader sleeps, and asks to be rung for every record.
const ARMED: u32 = 1;
/// The bell word: the reader naps while an application thread of its process looks at the
/// rings, and asks to be rung only for records whose effect no completion announces (see
/// [`Ring::take_bell`]).
pub(crate) const DELEGATED: u32 = 2;
/// Raised by the writer while it carries out a request in the reader's memory.
const GATE_AT: usize = 256;
/// Set by the writer: the highest name of its shared memory it has passed the reader (the
/// descriptor waits on the reader's socket until `VIEWS_AT` catches up).
const OFFERED_AT: usize = 320;
/// Set by the reader, on a line of its own: a message its node owes the writer's and holds
/// back for now (a deferred ACK: see the host fabric's `Rx::deferred`), its length in the
/// first word (0: none), its bytes after. The writer reads it only once the reader's process
/// is dead: what a NIC acknowledges as it lands stays acknowledged whatever its process does
/// next, so a process that exits (or dies) holding an ACK back must not undo it.
const OWED_AT: usize = 384;
/// The longest message `OWED_AT` holds.
pub(crate) const OWED_MAX: usize = 32;
/// A record is its length (u32) and state (u32), then its bytes, padded to 8 bytes.
const RECORD_HEADER: usize = 8;
/// A record's states: written, not read yet.
const FRESH: u32 = 0;
/// Read by the reader.
const TAKEN: u32 = 1;
/// Being carried out by the writer.
const PLACING: u32 = 2;
/// Carried out by the writer.
const PLACED: u32 = 3;
/// Being carried out by the writer, and the reader asleep on the state word until it is done
/// (a futex the writer wakes as it leaves the record).
const AWAITED: u32 = 4;
/// How long a reader waits for a writer to finish carrying out a record it claimed before
/// taking the record as it is (a writer that stopped midway, or a hostile one).
const PLACING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a reader spins on a record its writer is carrying out before it sleeps.
const PLACING_SPIN: std::time::Duration = std::time::Duration::from_micros(20);
/// The longest sleep on a record being carried out between looks at whether its writer is
/// gone (one that dies midway wakes nobody).
const PLACING_NAP: std::time::Duration = std::time::Duration::from_millis(10);
/// A small message's record (a SEND of a few bytes takes ~130 bytes with its packet header):
/// how far past where the next record goes its writer prefetches the ring's lines for writing,
/// and its reader, at each look while it waits for it, for reading; and the longest record
/// its writer puts together off the ring and copies in at once.
const PREFETCHED: usize = 256;
/// The length word of the filler that takes a ring's last bytes when a record does not fit.
const WRAP: u32 = u32::MAX;

/// What an attempt to write a record came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Written {
    Done,
    /// Not enough room now: the reader has yet to free it.
    Full,
    /// The filler refused (its source could not be read); nothing was published.
    Refused,
}

/// What a writer says of a record it writes (see [`Ring::write_marked`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Marks {
    /// One its writer might carry out for a lagging reader (see [`Ring::carriable_to`]).
    pub(crate) carriable: bool,
    /// Written claimed by its writer, who is about to carry it out: no reader begins it (a
    /// reader that comes to it waits) until the writer marks it placed or gives it back (see
    /// [`Ring::claim_written`], [`Ring::give_back`]).
    pub(crate) claimed: bool,
}

/// One ring, mapped in this process.
#[derive(Debug)]
pub(crate) struct Ring {
    base: NonNull<u8>,
    /// Bytes of records (a power of two); the mapping is `HEADER + cap`.
    cap: usize,
    fd: OwnedFd,
    /// Reader side: the process that passed us the ring, as the kernel named it (`None`
    /// where it could not be pinned down: then nothing is read from its memory).
    from: Option<Arc<PeerProcess>>,
    /// Writer side: where the next record goes (the shared `tail` is only published to).
    write_to: AtomicU64,
    /// Writer side: every record before this position was freed or placed by the writer, as
    /// far as the writer's last look went (the reader accounts for placed ones at leisure,
    /// and a run of them must not make every look longer).
    settled: AtomicU64,
    /// Writer side: the reader's `head` as last loaded. A write that finds room behind it
    /// needs no look at the shared `head`, whose cache line the reader dirties with each
    /// record it frees: in a ping-pong every write would wait for that line to come back
    /// from the reader's core. (Only ever behind the true `head`: it errs toward full.)
    head_seen: AtomicU64,
    /// Writer side: see [`Ring::carriable_to`].
    carriable_to: AtomicU64,
    /// Writer side: where the last record written claimed lies (see [`Ring::last_written`]).
    last_at: AtomicUsize,
    /// Reader side: what has been read and not yet freed. (The QP lock's kind: taken twice
    /// per record, by one thread at a time, mostly the same one.)
    reading: crate::sync::lock::Lock<Reading>,
    /// `reading.next`, for a look at whether records wait that takes no lock.
    read_to: AtomicU64,
    /// The ring's file, as ThreadSanitizer's sync object (see [`tsan`]).
    #[cfg_attr(not(feature = "tsan"), allow(dead_code))]
    ino: u64,
}

/// ThreadSanitizer cannot pair the release and acquire of a ring's indices when the writer
/// and the reader are two fabrics of one process (the tests): each maps the ring at its own
/// address. Both sides name the same sync object instead, found by the ring's file.
mod tsan {
    #[cfg(feature = "tsan")]
    unsafe extern "C" {
        fn __tsan_acquire(addr: *mut std::ffi::c_void);
        fn __tsan_release(addr: *mut std::ffi::c_void);
    }

    /// Sync objects, one per ring file (rings that share one only gain edges).
    #[cfg(feature = "tsan")]
    static OBJECTS: [u8; 1024] = [0; 1024];

    #[cfg(feature = "tsan")]
    fn object(ino: u64) -> *mut std::ffi::c_void {
        (&OBJECTS[(ino % 1024) as usize] as *const u8).cast_mut().cast()
    }

    /// After an acquire load of an index the other side published.
    #[inline(always)]
    pub(super) fn acquired(_ino: u64) {
        // SAFETY: the sanitizer's annotation only records an edge on a static address.
        #[cfg(feature = "tsan")]
        unsafe {
            __tsan_acquire(object(_ino))
        };
    }

    /// Before a release store of an index the other side reads.
    #[inline(always)]
    pub(super) fn releasing(_ino: u64) {
        // SAFETY: as in `acquired`.
        #[cfg(feature = "tsan")]
        unsafe {
            __tsan_release(object(_ino))
        };
    }
}

/// The records read from a ring and not freed yet, oldest first.
#[derive(Debug, Default)]
struct Reading {
    /// Ring position of the next record to read.
    next: u64,
    /// Sequence number of `held[0]`.
    first: u64,
    /// Each record's end position and whether it is free.
    held: VecDeque<(u64, bool)>,
}

// SAFETY: the mapping lives as long as the `Ring` and is never moved. Its shared fields are
// accessed only through atomics; its record bytes only by the one writer (past `tail`, not
// yet published) and the one reader (between `head` and `tail`, published), each serialized
// by its own process's lock as the module documentation says.
unsafe impl Send for Ring {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ring {}

impl Ring {
    /// A new ring with `cap` bytes of records (a power of two, at least a page), its pages
    /// faulted in now if `populate`.
    pub(crate) fn create(cap: usize, populate: bool) -> io::Result<Ring> {
        assert!(cap.is_power_of_two() && cap >= 4096);
        let fd = crate::sys::memfd(c"rdma-emu-ring", HEADER + cap)?;
        let ring = Ring::map(fd, cap, None, if populate { libc::MAP_POPULATE } else { 0 })?;
        ring.word(CAP_AT).store(cap as u64, Ordering::Relaxed);
        ring.word(WRITER_AT).store(u64::from(std::process::id()), Ordering::Relaxed);
        let probe = probe();
        ring.word(PROBE_ADDR_AT).store(probe as *const AtomicU64 as u64, Ordering::Relaxed);
        ring.word(PROBE_VALUE_AT).store(probe.load(Ordering::Relaxed), Ordering::Relaxed);
        ring.word(MAGIC_AT).store(MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// The ring whose descriptor the process `from` passed us (as the kernel named it). The
    /// file must be sealed so that its size cannot change, and its size must be one this
    /// module makes, so nothing in its header can send the reader outside the mapping.
    pub(crate) fn open(fd: OwnedFd, from: Option<Arc<PeerProcess>>) -> io::Result<Ring> {
        let invalid = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        let seals = crate::sys::seals(fd.as_raw_fd()).map_err(|_| invalid("not a sealed file"))?;
        if seals & crate::sys::RING_SEALS != crate::sys::RING_SEALS {
            return Err(invalid("not sealed against shrinking and growing"));
        }
        let len = std::fs::File::from(fd.try_clone()?).metadata()?.len() as usize;
        let cap = len.checked_sub(HEADER).filter(|c| c.is_power_of_two() && *c >= 4096);
        let cap = cap.ok_or_else(|| invalid("not the size of a ring"))?;
        let ring = Ring::map(fd, cap, from, 0)?;
        let magic = ring.word(MAGIC_AT).load(Ordering::Acquire);
        if magic != MAGIC || ring.word(CAP_AT).load(Ordering::Relaxed) != cap as u64 {
            return Err(invalid("not an rdma-emu ring"));
        }
        let addr = ring.word(PROBE_ADDR_AT).load(Ordering::Relaxed);
        let value = ring.word(PROBE_VALUE_AT).load(Ordering::Relaxed);
        if ring.from.as_ref().is_some_and(|p| p.may_read(addr, value)) {
            ring.word(PULL_AT).store(1, Ordering::Release);
        }
        Ok(ring)
    }

    /// Maps the ring's file; `populate`: `MAP_POPULATE` or 0.
    fn map(
        fd: OwnedFd,
        cap: usize,
        from: Option<Arc<PeerProcess>>,
        populate: libc::c_int,
    ) -> io::Result<Ring> {
        // SAFETY: a fresh shared mapping of the file's first HEADER + cap bytes (the file is
        // at least that long: we sized it, or measured it); the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                HEADER + cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | populate,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        let ino = crate::sys::fstat(fd.as_raw_fd()).map_or(0, |s| s.ino);
        Ok(Ring {
            ino,
            base,
            cap,
            fd,
            from,
            write_to: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            head_seen: AtomicU64::new(0),
            carriable_to: AtomicU64::new(0),
            last_at: AtomicUsize::new(0),
            reading: Default::default(),
            read_to: AtomicU64::new(0),
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reader: the process that passed us the ring, if it could be pinned down.
    pub(crate) fn sender(&self) -> Option<&Arc<PeerProcess>> {
        self.from.as_ref()
    }

    /// Reader: the message its node owes the writer's now (see `OWED_AT`), or none.
    pub(crate) fn owe(&self, msg: Option<&[u8]>) {
        let len = self.word(OWED_AT);
        len.store(0, Ordering::Relaxed);
        let Some(msg) = msg else { return };
        let mut bytes = [0u8; OWED_MAX];
        bytes[..msg.len()].copy_from_slice(msg);
        for (i, w) in bytes.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            self.word(OWED_AT + 8 * (i + 1)).store(w, Ordering::Relaxed);
        }
        len.store(msg.len() as u64, Ordering::Release);
    }

    /// Writer, once the reader's process is dead: what it owed us (see `OWED_AT`), its bytes
    /// as the reader left them (to be checked as any message from it is).
    pub(crate) fn owed(&self) -> Option<Vec<u8>> {
        let len = self.word(OWED_AT).load(Ordering::Acquire);
        let len = usize::try_from(len).ok().filter(|&l| l > 0 && l <= OWED_MAX)?;
        let words =
            (0..OWED_MAX / 8).map(|i| self.word(OWED_AT + 8 * (i + 1)).load(Ordering::Relaxed));
        let mut bytes: Vec<u8> = words.flat_map(u64::to_le_bytes).collect();
        bytes.truncate(len);
        Some(bytes)
    }

    /// Writer: says it will write no more (its node is leaving).
    pub(crate) fn close(&self) {
        self.word(CLOSED_AT).store(1, Ordering::Release);
    }

    /// Reader: whether the writer said it will write no more, or is gone.
    pub(crate) fn abandoned(&self) -> bool {
        self.word(CLOSED_AT).load(Ordering::Acquire) != 0
            || self.from.as_ref().is_none_or(|p| p.exited())
    }

    /// Reader: waits, at most `limit`, until the writer is seen gone (if it is not already):
    /// its process is exiting.
    pub(crate) fn wait_abandoned(&self, limit: std::time::Duration) {
        if self.word(CLOSED_AT).load(Ordering::Acquire) == 0
            && let Some(p) = &self.from
        {
            p.wait_exited(limit);
        }
    }

    /// Writer: whether the reader may read this process's memory (it proved it could).
    pub(crate) fn reader_may_pull(&self) -> bool {
        self.word(PULL_AT).load(Ordering::Acquire) != 0
    }

    /// Writer: the reader was passed our shared memory named `id` (after the datagram that
    /// passes it was sent).
    pub(crate) fn offer_view(&self, id: u32) {
        self.word(OFFERED_AT).fetch_max(u64::from(id), Ordering::Release);
    }

    /// Gives the bias of the reader's lock back if the calling thread owns it (see
    /// `sync::bias::Bias::disown`).
    pub(crate) fn disown_reading(&self) {
        crate::sync::lock::disown(&self.reading);
    }

    /// Whether another thread owns the bias of the reader's lock.
    #[cfg(test)]
    pub(crate) fn reading_bias_others(&self) -> bool {
        crate::sync::lock::bias_others(&self.reading)
    }

    /// Reader: whether nothing waits to be read (no record past `read_to`, no shared memory
    /// offered unseen): what a thread polling an empty CQ finds almost every time, asked
    /// before anything is set up to take records in.
    #[inline]
    pub(crate) fn nothing_to_read(&self) -> bool {
        let read_to = self.read_to.load(Ordering::Relaxed);
        // The next record's lines, asked for at each look (a hint: no wait, no fault): once
        // `tail` shows the record, its lines are on their way already, not asked for only
        // then, one transfer from the writer's core later (~90 ns a hop of `ib_send_lat`).
        let at = read_to as usize & (self.cap - 1);
        self.lines_from(at, crate::sync::prefetch::for_read);
        read_to == self.word(TAIL_AT).load(Ordering::Relaxed) && self.unseen_views().is_none()
    }

    /// Reader: the highest name of the writer's shared memory passed to us, if we have not
    /// looked for it yet (its descriptor waits on our socket).
    pub(crate) fn unseen_views(&self) -> Option<u64> {
        let offered = self.word(OFFERED_AT).load(Ordering::Acquire);
        (offered > self.word(VIEWS_AT).load(Ordering::Relaxed)).then_some(offered)
    }

    /// Reader: we looked for the writer's shared memory named up to `id`.
    pub(crate) fn saw_views(&self, id: u64) {
        self.word(VIEWS_AT).fetch_max(id, Ordering::Relaxed);
    }

    /// The largest record this ring takes: an eighth, so that records stream through a ring
    /// that stays in the caches.
    pub(crate) fn max_record(&self) -> usize {
        self.cap / 8
    }

    /// The largest message, in records of at most [`Ring::max_record`] bytes, that the reader
    /// may hold in the ring until it has it whole: the ring holds it with room to spare for a
    /// wrap and a record of the next, so the writer is never stuck behind a message the
    /// reader waits to complete.
    pub(crate) fn max_held_message(&self) -> usize {
        self.cap / 2 + self.cap / 8
    }

    /// Writer: whether records written are not yet taken in by the reader.
    pub(crate) fn unread(&self) -> bool {
        self.write_to.load(Ordering::Relaxed) != self.head()
    }

    /// Writer: where the records end that its writer might carry out for a lagging reader
    /// (a request; not an ACK, a response, or a SEND its QP's writer wrote knowing it for
    /// one): a word of this process only, no look at the reader's.
    pub(crate) fn carriable_to(&self) -> u64 {
        self.carriable_to.load(Ordering::Relaxed)
    }

    /// Writer: how far the reader has freed (moves as it takes records in).
    pub(crate) fn freed_to(&self) -> u64 {
        self.head()
    }

    /// Writer: whether the oldest record not yet freed nor placed by the writer (past a filler
    /// at the wrap) is one the reader's responder has not begun (a reader at work on it, a
    /// large WRITE being placed, is not behind).
    pub(crate) fn oldest_unbegun(&self) -> bool {
        let end = self.write_to.load(Ordering::Relaxed);
        let mut pos = self.unsettled();
        while pos != end {
            match self.record_at(pos, end) {
                Some((at, Some(_), used)) => match self.state(at).load(Ordering::Acquire) {
                    PLACED => pos += used as u64,
                    state => return state == FRESH,
                },
                Some((_, None, used)) => pos += used as u64,
                None => return false,
            }
            self.settled.store(pos, Ordering::Relaxed);
        }
        false
    }

    /// Writer: where the records neither freed nor placed may begin: `settled`, unless the
    /// reader has freed past it.
    fn unsettled(&self) -> u64 {
        let (end, head) = (self.write_to.load(Ordering::Relaxed), self.head());
        let settled = self.settled.load(Ordering::Relaxed);
        if end.wrapping_sub(settled) <= end.wrapping_sub(head) { settled } else { head }
    }

    /// Writer: hands the bytes of each record not yet freed that the reader's responder has
    /// not begun (nor the writer claimed) to `each`, oldest first, while `each` asks for more.
    /// The bytes are only looked at, as in [`Ring::claim`].
    pub(crate) fn unbegun(&self, mut each: impl FnMut(&[u8]) -> bool) {
        let end = self.write_to.load(Ordering::Relaxed);
        let mut pos = self.head();
        while pos != end {
            let Some((at, len, used)) = self.record_at(pos, end) else { return };
            if let Some(len) = len
                && self.state(at).load(Ordering::Acquire) == FRESH
            {
                // SAFETY: as in `claim`: the record lies in the ring, and only this writer
                // writes there, not while it holds `&self` for the scan.
                let bytes = unsafe {
                    std::slice::from_raw_parts(self.ptr(at + RECORD_HEADER, 0), len as usize)
                };
                if !each(bytes) {
                    return;
                }
            }
            pos += used as u64;
        }
    }

    /// Writer: finds the first record not yet freed, from position `from` on, for which
    /// `wanted` holds (given its bytes) and claims it, if the reader has not taken it; `from`
    /// then moves past it (so that a search for the next request resumes there). Records the
    /// writer wrote are only looked at, never changed, so a reader reading them at the same
    /// time is not disturbed; the lengths come from shared memory and are checked as the
    /// reader checks them.
    pub(crate) fn claim(
        &self,
        from: &mut u64,
        wanted: impl FnMut(&[u8]) -> bool,
    ) -> Option<Claim<'_>> {
        self.claim_from(from, false, wanted)
    }

    /// Writer: where the record just written claimed lies (read under the lock that
    /// serializes writers, before another is written): what [`Ring::claim_written`] and
    /// [`Ring::give_back`] are given for it.
    pub(crate) fn last_written(&self) -> usize {
        self.last_at.load(Ordering::Relaxed)
    }

    /// Writer: the claim of the record at `at`, which we wrote claimed ([`Marks::claimed`])
    /// and have not placed nor given back, if `wanted` holds for it. Dropped unmarked, the
    /// claim leaves the record claimed, for another try or [`Ring::give_back`].
    pub(crate) fn claim_written(
        &self,
        at: usize,
        mut wanted: impl FnMut(&[u8]) -> bool,
    ) -> Option<Claim<'_>> {
        if at >= self.cap || !at.is_multiple_of(8) {
            return None;
        }
        // SAFETY: `at` is 8-aligned and below `cap`: a record's header in the ring.
        let len = unsafe { self.ptr(at, RECORD_HEADER).cast::<u32>().read() } as usize;
        let claimed = matches!(self.state(at).load(Ordering::Acquire), PLACING | AWAITED);
        if !claimed || at + RECORD_HEADER + len > self.cap {
            return None;
        }
        // SAFETY: a record we wrote claimed and still hold so: never freed, its bytes stay;
        // the reader only reads them.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr(at + RECORD_HEADER, 0), len) };
        wanted(bytes).then_some(Claim { ring: self, at, done: false, written: true })
    }

    /// Writer: gives the record at `at`, which we wrote claimed and did not place, to the
    /// reader to take in.
    pub(crate) fn give_back(&self, at: usize) {
        if at < self.cap && at.is_multiple_of(8) {
            let state = self.state(at);
            let was = state.fetch_update(Ordering::Release, Ordering::Relaxed, |s| {
                matches!(s, PLACING | AWAITED).then_some(FRESH)
            });
            Ring::wake_if_awaited(state, was);
        }
    }

    /// Writer: [`Ring::claim`] of the oldest record not yet freed nor placed alone: `None` if
    /// `wanted` does not hold for it, or the reader has begun it.
    pub(crate) fn claim_oldest(&self, wanted: impl FnMut(&[u8]) -> bool) -> Option<Claim<'_>> {
        let mut from = self.unsettled();
        self.claim_from(&mut from, true, wanted)
    }

    /// Writer: whether every record written is freed or placed: no request of ours is still
    /// to be taken in from the ring.
    pub(crate) fn all_settled(&self) -> bool {
        let end = self.write_to.load(Ordering::Relaxed);
        let mut pos = self.unsettled();
        while pos != end {
            let Some((at, len, used)) = self.record_at(pos, end) else { return false };
            if len.is_some() && self.state(at).load(Ordering::Acquire) != PLACED {
                return false;
            }
            pos += used as u64;
        }
        true
    }

    fn claim_from(
        &self,
        from: &mut u64,
        oldest: bool,
        mut wanted: impl FnMut(&[u8]) -> bool,
    ) -> Option<Claim<'_>> {
        let end = self.write_to.load(Ordering::Relaxed);
        let start = self.unsettled();
        // Resume at `from` if it lies between the first record that may be claimed and the end.
        let mut pos =
            if end.wrapping_sub(*from) <= end.wrapping_sub(start) { *from } else { start };
        // Whether every record before `pos` is freed or placed.
        let mut settled = pos == start;
        while pos != end {
            let (at, len, used) = self.record_at(pos, end)?;
            let placed = len.is_none() || self.state(at).load(Ordering::Acquire) == PLACED;
            if let Some(len) = len
                && !(oldest && placed)
            {
                let start = at + RECORD_HEADER;
                // SAFETY: the record's bytes lie in the ring (checked above); only this writer
                // writes them, and not while it holds `&self` here for the scan (the sender's
                // lock serializes writers); the reader only reads them.
                let bytes = unsafe { std::slice::from_raw_parts(self.ptr(start, 0), len as usize) };
                if wanted(bytes) {
                    let state = self.state(at);
                    let won =
                        state.compare_exchange(FRESH, PLACING, Ordering::AcqRel, Ordering::Acquire);
                    // A claim is made only if won: dropping one gives the record back.
                    return match won {
                        Ok(_) => {
                            *from = pos + used as u64;
                            Some(Claim { ring: self, at, done: false, written: false })
                        }
                        Err(_) => None,
                    };
                }
                if oldest {
                    return None;
                }
            }
            pos += used as u64;
            settled &= placed;
            if settled {
                self.settled.store(pos, Ordering::Relaxed);
            }
        }
        None
    }

    /// The record at ring position `pos`, of those written up to position `end`: its offset,
    /// its length (`None` for the filler at the wrap) and the bytes it takes. `None` if it
    /// breaks the format (lengths come from shared memory: a peer may have written anything).
    fn record_at(&self, pos: u64, end: u64) -> Option<(usize, Option<u32>, usize)> {
        let avail = end.wrapping_sub(pos);
        if avail > self.cap as u64 || avail < RECORD_HEADER as u64 {
            return None;
        }
        let at = (pos as usize) & (self.cap - 1);
        // SAFETY: at..at + 8 lies in the ring and was written (avail >= 8, and records start
        // 8-aligned).
        let len = unsafe { self.ptr(at, RECORD_HEADER).cast::<u32>().read() };
        let (used, len) = match len {
            WRAP => (self.cap - at, None),
            n => (RECORD_HEADER + (n as usize).next_multiple_of(8), Some(n)),
        };
        (used as u64 <= avail && at + used <= self.cap).then_some((at, len, used))
    }

    /// Writer: raises the gate (we are about to touch the reader's memory) or lowers it.
    pub(crate) fn set_gate(&self, up: bool) {
        self.word(GATE_AT).store(u64::from(up), Ordering::SeqCst);
    }

    /// Reader: whether the writer is touching our memory now.
    pub(crate) fn gate_up(&self) -> bool {
        self.word(GATE_AT).load(Ordering::SeqCst) != 0
    }

    /// The state word of the record at ring offset `at`.
    fn state(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is a record's 8-aligned offset below `cap`; its header's second word
        // lies in the mapping, which outlives `&self`, and is only accessed atomically once
        // the record is published.
        unsafe { &*self.ptr(at + 4, 4).cast::<AtomicU32>() }
    }

    /// Writer: the bytes free for records now (the reader may free more meanwhile).
    pub(crate) fn room(&self) -> usize {
        let used = self.write_to.load(Ordering::Relaxed).wrapping_sub(self.head());
        self.cap.saturating_sub(usize::try_from(used).unwrap_or(usize::MAX))
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the 8-aligned header offsets, inside the page-aligned
        // mapping, which outlives `&self`; shared fields are only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    fn bell(&self) -> &AtomicU32 {
        // SAFETY: as in `word`.
        unsafe { &*self.base.as_ptr().add(BELL_AT).cast::<AtomicU32>() }
    }

    /// The record bytes `at..at + len` (ring offsets, within `cap`).
    fn ptr(&self, at: usize, len: usize) -> *mut u8 {
        debug_assert!(at + len <= self.cap);
        // SAFETY: HEADER + at + len <= HEADER + cap, the mapping's length.
        unsafe { self.base.as_ptr().add(HEADER + at) }
    }

    /// Writes one record of `len` bytes, which `fill` writes (returning `false` to give up).
    /// Whether the reader asked for a doorbell comes back with `Done`: see [`Ring::rings`].
    pub(crate) fn write(&self, len: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> Written {
        self.write_marked(len, Marks { carriable: true, claimed: false }, fill)
    }

    /// [`Ring::write`] of a record marked as `marks` says.
    #[inline(always)]
    pub(crate) fn write_marked(
        &self,
        len: usize,
        marks: Marks,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Written {
        assert!(len <= self.max_record(), "a record of {len} bytes");
        let need = RECORD_HEADER + len.next_multiple_of(8);
        let tail = self.write_to.load(Ordering::Relaxed);
        let at = (tail as usize) & (self.cap - 1);
        let filler = if at + need > self.cap { self.cap - at } else { 0 };
        // A reader whose `head` is not behind `tail` by at most `cap` breaks the format: to
        // it the ring stays full.
        let fits = |head: u64| {
            let used = tail.wrapping_sub(head);
            used <= self.cap as u64 && used as usize + filler + need <= self.cap
        };
        if !fits(self.head_seen.load(Ordering::Relaxed)) {
            let head = self.head();
            self.head_seen.store(head, Ordering::Relaxed);
            if !fits(head) {
                return Written::Full;
            }
        }
        let at = if filler > 0 {
            self.set_len(at, WRAP);
            0
        } else {
            at
        };
        // SAFETY: at..at + need lies past `tail` (and past the filler): free space the reader
        // does not look at until we publish it, and only this writer (serialized by the
        // sender's lock) touches it.
        let body =
            unsafe { std::slice::from_raw_parts_mut(self.ptr(at + RECORD_HEADER, len), len) };
        // A small record is put together off the ring and copied in at once: the reader,
        // which asks for its lines at each look, then takes them from us once, not between
        // the stores of an encoding that takes ~100 ns (seen as round trips of `ib_send_lat`
        // ~30% slower in some runs).
        if len <= PREFETCHED {
            let mut staged = [0u8; PREFETCHED];
            if !fill(&mut staged[..len]) {
                return Written::Refused;
            }
            body.copy_from_slice(&staged[..len]);
        } else if !fill(body) {
            return Written::Refused;
        }
        if marks.claimed {
            self.set_header(at, len as u32, PLACING);
            self.last_at.store(at, Ordering::Relaxed);
        } else {
            self.set_len(at, len as u32);
        }
        let tail = tail + (filler + need) as u64;
        self.write_to.store(tail, Ordering::Relaxed);
        if marks.carriable {
            self.carriable_to.store(tail, Ordering::Relaxed);
        }
        tsan::releasing(self.ino);
        self.word(TAIL_AT).store(tail, Ordering::Release);
        // Only into room the reader has freed: lines past it may hold records it is still
        // reading (a writer that streams fills the ring), which a prefetch for writing would
        // take from under it.
        if tail.wrapping_sub(self.head_seen.load(Ordering::Relaxed)) + (PREFETCHED as u64)
            <= self.cap as u64
        {
            self.prefetch_next(tail as usize & (self.cap - 1));
        }
        Written::Done
    }

    /// Writer: starts taking the lines the next record will fill (a few), which sit far
    /// from this core: the reader read them a lap ago, or asked for them since at its looks
    /// (see [`Ring::nothing_to_read`]). The record's stores would wait for them, and `tail`,
    /// stored after, show that much later (a hop of `ib_send_lat` between two processes here:
    /// ~60 ns without the reader's prefetch, ~15 ns beside it).
    #[inline]
    fn prefetch_next(&self, next_at: usize) {
        self.lines_from(next_at, crate::sync::prefetch::for_write);
    }

    /// Hands `each` the start of every cache line of the [`PREFETCHED`] bytes from ring offset
    /// `at` (short of the ring's end).
    #[inline(always)]
    fn lines_from(&self, at: usize, each: fn(*const u8)) {
        let mut line = at & !63;
        while line < (at + PREFETCHED).min(self.cap) {
            each(self.ptr(line, 0));
            line += 64;
        }
    }

    /// Writer: the reader's `head` (what it freed).
    fn head(&self) -> u64 {
        let head = self.word(HEAD_AT).load(Ordering::Acquire);
        tsan::acquired(self.ino);
        head
    }

    /// Writes a record's header: its length, and the state `FRESH`.
    fn set_len(&self, at: usize, len: u32) {
        self.set_header(at, len, FRESH);
    }
    /// Writes a record's header: its length and state.
    fn set_header(&self, at: usize, len: u32, state: u32) {
        let header = u64::from(len) | u64::from(state) << 32;
        // SAFETY: `at` is 8-aligned and at + 8 <= cap (records and fillers start 8-aligned,
        // and `cap` is a multiple of 8); unpublished space, as in `write`.
        unsafe { self.ptr(at, RECORD_HEADER).cast::<u64>().write(header) };
    }

    /// Whether the reader asked to be rung for every record (it sleeps, or is about to).
    #[cfg(test)]
    pub(crate) fn armed(&self) -> bool {
        self.bell().load(Ordering::SeqCst) == ARMED
    }

    /// Whether the reader asked to be rung only for records that land unannounced.
    #[cfg(test)]
    pub(crate) fn delegated(&self) -> bool {
        self.bell().load(Ordering::SeqCst) == DELEGATED
    }

    /// After publishing: whether the reader asked to be rung (and, if so, clears the request:
    /// the caller rings).
    pub(crate) fn rings(&self, lands: bool) -> bool {
        self.take_bell(lands) != 0
    }

    /// After publishing a record that `lands` (or not): the reader's request for the doorbell
    /// if it asked for one for this record, cleared (the caller rings, and may give it back
    /// with [`Ring::ask_bell_again`]); 0 if it did not. A record lands when its effect shows
    /// in the reader's memory with no completion there to poll for (an RDMA WRITE without
    /// immediate, an atomic): an application thread whose looks at the rings a napping
    /// reader counts on may be spinning on that memory instead, looking no more (qperf's
    /// `rc_rdma_write_poll_lat`, the eager RDMA of MPIs).
    pub(crate) fn take_bell(&self, lands: bool) -> u32 {
        fence(Ordering::SeqCst);
        match self.bell().load(Ordering::Relaxed) {
            0 => 0,
            DELEGATED if !lands => 0,
            _ => self.bell().swap(0, Ordering::AcqRel),
        }
    }

    /// Writer: whether the reader sleeps (it asked to be rung for every record).
    pub(crate) fn asleep(&self) -> bool {
        self.bell().load(Ordering::Relaxed) == ARMED
    }

    /// Writer: whether the reader naps on its application's looks (see [`Ring::delegate`]).
    pub(crate) fn napping(&self) -> bool {
        self.bell().load(Ordering::Relaxed) == DELEGATED
    }

    /// Reader: asks writers for a doorbell from now on; whether records are already waiting
    /// (then the caller should read them rather than sleep).
    pub(crate) fn arm(&self) -> bool {
        self.bell().store(ARMED, Ordering::SeqCst);
        self.pending()
    }

    /// Reader: asks writers for a doorbell for the records that land unannounced (see
    /// [`Ring::take_bell`]) while an application thread looks at the rings; whether records
    /// are already waiting (written before the writer could see the request).
    pub(crate) fn delegate(&self) -> bool {
        self.bell().store(DELEGATED, Ordering::SeqCst);
        self.pending()
    }

    /// Writer: gives back the request `bell` that [`Ring::take_bell`] took, after a write
    /// whose ringing the writer found unneeded, unless the reader has asked anew meanwhile.
    pub(crate) fn ask_bell_again(&self, bell: u32) {
        let _ = self.bell().compare_exchange(0, bell, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Reader: how far records were read (by any thread): unchanged while nobody takes them.
    pub(crate) fn read_to(&self) -> u64 {
        self.read_to.load(Ordering::Relaxed)
    }

    /// Reader: no doorbell needed (the reader is awake).
    #[cfg(test)]
    pub(crate) fn disarm(&self) {
        if self.bell().load(Ordering::Relaxed) != 0 {
            self.bell().store(0, Ordering::Relaxed);
        }
    }

    /// Whether published records wait to be read.
    pub(crate) fn pending(&self) -> bool {
        self.word(TAIL_AT).load(Ordering::SeqCst) != self.read_to.load(Ordering::Relaxed)
    }

    /// Reader: hands each published record to `each`, in order (a record not lent is freed
    /// when `each` drops it). A record that breaks the format (a writer that does not follow
    /// it) is an error: the ring is no longer usable.
    pub(crate) fn read(self: &Arc<Self>, mut each: impl FnMut(Read<'_>)) -> io::Result<()> {
        let broken = || io::Error::new(io::ErrorKind::InvalidData, "a malformed ring record");
        let tail = self.word(TAIL_AT).load(Ordering::Acquire);
        tsan::acquired(self.ino);
        // Nothing new (what a thread spinning on an empty CQ finds almost every time): no lock.
        // Only the reader, one thread at a time, moves `read_to`.
        if self.read_to.load(Ordering::Relaxed) == tail {
            return Ok(());
        }
        loop {
            let mut st = self.reading.lock();
            let pos = st.next;
            if pos == tail {
                return Ok(());
            }
            let Some((at, len, used)) = self.record_at(pos, tail) else { return Err(broken()) };
            let end = pos + used as u64;
            st.next = end;
            self.read_to.store(end, Ordering::Relaxed);
            st.held.push_back((end, len.is_none()));
            let seq = st.first + st.held.len() as u64 - 1;
            drop(st);
            if let Some(len) = len {
                let at = at + RECORD_HEADER;
                each(Read { ring: self, bytes: at..at + len as usize, seq });
            } else {
                self.free(seq);
            }
            // Read up to `tail` (by this thread or another): done, without the lock again.
            if self.read_to.load(Ordering::Relaxed) == tail {
                return Ok(());
            }
        }
    }

    /// Reader: the bytes `range` (ring offsets) of a record read and not yet freed.
    ///
    /// # Safety
    /// `range` is the bytes of a record the caller holds (a [`Read`] or [`Record`] not yet
    /// dropped): published, inside the ring (checked by `read`), and left alone by the writer
    /// until `head` passes them, which `free` does only once that record is dropped.
    unsafe fn record_bytes(&self, range: &Range<usize>) -> &[u8] {
        // SAFETY: as the caller promises, above.
        unsafe { std::slice::from_raw_parts(self.ptr(range.start, 0), range.len()) }
    }

    /// Reader: its responder begins the request of the record at `at`; whether the writer
    /// carried it out already. A record the writer is carrying out now is waited for: spinning
    /// through a copy of a few microseconds, asleep through a longer one (a READ of a MiB that
    /// its requester copies out takes hundreds, which a reader that yielded spent running).
    fn take(&self, at: usize) -> bool {
        let state = self.state(at);
        let mut since = None;
        loop {
            match state.compare_exchange(FRESH, TAKEN, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return false,
                Err(PLACED) => return true,
                Err(s @ (PLACING | AWAITED)) => {
                    let t0 = *since.get_or_insert_with(std::time::Instant::now);
                    let waited = t0.elapsed();
                    if waited > PLACING_PATIENCE || self.abandoned() {
                        return false;
                    }
                    if waited < PLACING_SPIN {
                        std::hint::spin_loop();
                    } else if s == AWAITED
                        || state
                            .compare_exchange(
                                PLACING,
                                AWAITED,
                                Ordering::Acquire,
                                Ordering::Acquire,
                            )
                            .is_ok()
                    {
                        let nap = (PLACING_PATIENCE - waited).min(PLACING_NAP);
                        crate::sys::futex_wait(state, AWAITED, nap);
                    }
                }
                // Taken, or garbage a writer left: the record is the reader's.
                Err(_) => return false,
            }
        }
    }

    /// Writer: leaves the record at `at`, which it claimed, in `state` (placed, or fresh for
    /// the reader to carry out), waking the reader if it sleeps on it.
    fn leave(&self, at: usize, state: u32) {
        let word = self.state(at);
        Ring::wake_if_awaited(word, Ok(word.swap(state, Ordering::Release)));
    }

    /// Wakes the reader asleep on a record's state `word` if the state the writer left
    /// (`was`) says one waits there.
    fn wake_if_awaited(word: &AtomicU32, was: Result<u32, u32>) {
        if was == Ok(AWAITED) {
            crate::sys::futex_wake(word);
        }
    }

    /// Frees record `seq` and moves `head` past every free record at the front.
    fn free(&self, seq: u64) {
        let mut st = self.reading.lock();
        let Some(i) = seq.checked_sub(st.first) else { return };
        // The only record held (one taken in and let go in turn, the commonest): no search.
        if i == 0
            && st.held.len() == 1
            && let Some((end, _)) = st.held.pop_front()
        {
            st.first += 1;
            tsan::releasing(self.ino);
            self.word(HEAD_AT).store(end, Ordering::Release);
            return;
        }
        if let Some(h) = st.held.get_mut(i as usize) {
            h.1 = true;
        }
        let mut head = None;
        while let Some(&(end, true)) = st.held.front() {
            st.held.pop_front();
            st.first += 1;
            head = Some(end);
        }
        if let Some(head) = head {
            tsan::releasing(self.ino);
            self.word(HEAD_AT).store(head, Ordering::Release);
        }
    }
}

/// A record as [`Ring::read`] hands it out, freed when dropped unless kept ([`Read::keep`]):
/// it borrows the ring, so a record taken in and let go within the read (most are) costs no
/// count of the ring's references (two locked instructions).
#[derive(Debug)]
pub(crate) struct Read<'r> {
    ring: &'r Arc<Ring>,
    /// Ring offsets of its bytes.
    bytes: Range<usize>,
    seq: u64,
}

impl Read<'_> {
    pub(crate) fn ring(&self) -> &Ring {
        self.ring
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `self.bytes` is the range of this record, held until `self` is dropped.
        unsafe { self.ring.record_bytes(&self.bytes) }
    }

    /// As [`Record::begin`].
    pub(crate) fn begin(&self) -> bool {
        self.ring.take(self.bytes.start - RECORD_HEADER)
    }

    /// Keeps the record past the read, until the returned one is dropped.
    pub(crate) fn keep(self) -> Record {
        let read = std::mem::ManuallyDrop::new(self);
        Record { ring: read.ring.clone(), bytes: read.bytes.clone(), seq: read.seq }
    }

    /// As [`Record::ticket`].
    pub(crate) fn ticket(self, range: Option<Range<usize>>) -> (Ticket, Option<Lent>) {
        self.keep().ticket(range)
    }

    /// As [`Record::lend`].
    pub(crate) fn lend(self, range: Range<usize>) -> Lent {
        self.keep().lend(range)
    }
}

impl Drop for Read<'_> {
    fn drop(&mut self) {
        self.ring.free(self.seq);
    }
}

/// A record read from a ring and kept, held until dropped: its bytes stay as they are until
/// then.
#[derive(Debug)]
pub(crate) struct Record {
    ring: Arc<Ring>,
    /// Ring offsets of its bytes.
    bytes: Range<usize>,
    seq: u64,
}

impl Record {
    /// Keeps the record as the ticket of its request, and lends `range` of its bytes if
    /// asked: the record stays in the ring until both are gone.
    pub(crate) fn ticket(self, range: Option<Range<usize>>) -> (Ticket, Option<Lent>) {
        let record = Arc::new(self);
        let lent = range.map(|range| {
            assert!(range.end <= record.bytes.len());
            Lent { record: record.clone(), range }
        });
        (Ticket(record), lent)
    }

    /// The responder begins the record's request in place: whether the writer carried it out
    /// already (else no writer will from now on), as [`Ticket::carried_out`].
    pub(crate) fn begin(&self) -> bool {
        self.ring.take(self.bytes.start - RECORD_HEADER)
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `self.bytes` is the range of this record, held until `self` is dropped.
        unsafe { self.ring.record_bytes(&self.bytes) }
    }

    /// Keeps the record for as long as the returned bytes (`range` of its bytes) live.
    pub(crate) fn lend(self, range: Range<usize>) -> Lent {
        assert!(range.end <= self.bytes.len());
        Lent { record: Arc::new(self), range }
    }
}

/// A record held for its request, until the request is begun (see [`Ring::claim`]).
#[derive(Debug, Clone)]
pub(crate) struct Ticket(Arc<Record>);

impl Ticket {
    /// The responder begins the request: whether the writer carried it out itself already
    /// (else no writer will from now on).
    pub(crate) fn carried_out(&self) -> bool {
        self.0.begin()
    }
}

/// A record the writer claimed: it is carried out by the writer, then either marked so
/// ([`Claim::placed`]) or, dropped unmarked, left for the reader to carry out as usual.
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    ring: &'a Ring,
    at: usize,
    done: bool,
    /// Of a record written claimed ([`Ring::claim_written`]): dropped unmarked, it stays
    /// claimed until given back.
    written: bool,
}

impl Claim<'_> {
    /// The request was carried out: the reader will only account for it.
    pub(crate) fn placed(mut self) {
        self.done = true;
        self.ring.leave(self.at, PLACED);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.done && !self.written {
            self.ring.leave(self.at, FRESH);
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.ring.free(self.seq);
    }
}

/// Bytes of a record, read in place (see [`Record::lend`]).
#[derive(Debug, Clone)]
pub(crate) struct Lent {
    record: Arc<Record>,
    range: Range<usize>,
}

impl std::ops::Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.record.bytes()[self.range.clone()]
    }
}

/// This process's probe word: a value no other process can guess, so that reading it proves
/// the reader reads our memory (not, say, a namesake process in another PID namespace).
fn probe() -> &'static AtomicU64 {
    static PROBE: AtomicU64 = AtomicU64::new(0);
    if PROBE.load(Ordering::Relaxed) == 0 {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let nanos = t.map_or(1, |d| d.as_nanos() as u64);
        let v = (nanos ^ u64::from(std::process::id()) << 32).max(1);
        let _ = PROBE.compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed);
    }
    &PROBE
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; nothing borrows it past `&self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), HEADER + self.cap) };
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// This process, as the sender of the rings the tests open.
    fn me() -> Option<Arc<PeerProcess>> {
        Some(Arc::new(PeerProcess::open(std::process::id()).unwrap()))
    }

    fn put(r: &Ring, bytes: &[u8]) -> Written {
        r.write(bytes.len(), |b| {
            b.copy_from_slice(bytes);
            true
        })
    }

    fn take(r: &Arc<Ring>) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        r.read(|rec| got.push(rec.bytes().to_vec())).unwrap();
        got
    }

    #[test]
    fn test_records_arrive_in_order_across_the_wrap_and_a_full_ring_refuses() {
        let w = Ring::create(16384, false).unwrap();
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        let mut sent = 0u32;
        for round in 0..20 {
            // Fill it: records of 1..=1000 bytes until it refuses.
            let mut expect = Vec::new();
            loop {
                let rec = vec![sent as u8; 1 + (sent as usize * 37 + round) % 1000];
                if put(&w, &rec) == Written::Full {
                    break;
                }
                expect.push(rec);
                sent += 1;
            }
            assert!(!expect.is_empty());
            assert_eq!(take(&r), expect);
        }
        assert!(take(&r).is_empty());
        assert_eq!(w.write(8, |_| false), Written::Refused);
        assert!(take(&r).is_empty());
    }

    #[test]
    fn test_a_lent_record_holds_the_ring_until_its_last_borrower_lets_go() {
        let w = Ring::create(8192, false).unwrap();
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        assert_eq!(put(&w, &[1; 1000]), Written::Done);
        assert_eq!(put(&w, &[2; 1000]), Written::Done);
        let mut lent = Vec::new();
        r.read(|rec| {
            if rec.bytes()[0] == 1 {
                lent.push(rec.lend(10..20));
            }
        })
        .unwrap();
        let copy = lent[0].clone();
        assert_eq!(&*copy, &[1; 10]);
        // The second record was freed, but the first holds the head: both still take room.
        let mut more = 0;
        while put(&w, &[3; 1000]) == Written::Done {
            more += 1;
        }
        assert_eq!(more, (8192 - 2 * 1008) / 1008);
        drop(lent);
        assert_eq!(put(&w, &[4; 1000]), Written::Full, "a clone still borrows it");
        drop(copy);
        assert_eq!(put(&w, &[4; 1000]), Written::Done);
        let got = take(&r);
        assert_eq!(got.len(), more + 1);
        assert_eq!(got.last().unwrap(), &vec![4; 1000]);
    }

    /// Shared memory the writer passes is to be looked for by the reader until it has looked
    /// for the latest (see `fabric::host::receive_marked`), once.
    #[test]
    fn test_the_reader_sees_that_shared_memory_was_passed_until_it_looked() {
        let w = Ring::create(4096, false).unwrap();
        let r = Ring::open(w.fd.try_clone().unwrap(), me()).unwrap();
        assert_eq!(r.unseen_views(), None);
        w.offer_view(2);
        w.offer_view(1);
        assert_eq!(r.unseen_views(), Some(2));
        r.saw_views(2);
        assert_eq!(r.unseen_views(), None);
        w.offer_view(3);
        assert_eq!(r.unseen_views(), Some(3));
    }

    /// Nothing waits for a ring's reader until a record is written (until it is read) or
    /// shared memory is offered (until looked for).
    #[test]
    fn test_a_ring_has_nothing_to_read_until_a_record_or_shared_memory_waits() {
        let w = Ring::create(4096, false).unwrap();
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        assert!(r.nothing_to_read(), "new");
        assert_eq!(put(&w, &[7; 100]), Written::Done);
        assert!(!r.nothing_to_read(), "a record waits");
        assert_eq!(take(&r), vec![vec![7; 100]]);
        assert!(r.nothing_to_read(), "read");
        w.offer_view(1);
        assert!(!r.nothing_to_read(), "shared memory offered");
        r.saw_views(1);
        assert!(r.nothing_to_read(), "looked for");
    }

    #[test]
    fn test_a_reader_that_can_read_the_writers_memory_says_so() {
        let w = Ring::create(4096, false).unwrap();
        assert!(!w.reader_may_pull());
        let _r = Ring::open(w.fd.try_clone().unwrap(), me()).unwrap();
        assert!(w.reader_may_pull(), "a process may read its own memory");
        // A probe that does not hold its value (another process's address space) fails.
        w.word(PROBE_VALUE_AT).fetch_add(1, Ordering::Relaxed);
        w.word(PULL_AT).store(0, Ordering::Relaxed);
        let _r = Ring::open(w.fd.try_clone().unwrap(), me()).unwrap();
        assert!(!w.reader_may_pull());
    }

    #[test]
    fn test_a_record_goes_to_whoever_takes_it_first_writer_or_reader() {
        let w = Ring::create(4096, false).unwrap();
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        for b in [b"one", b"two", b"six"] {
            put(&w, b);
        }
        // Read, all three; the responder begins the first: the writer cannot claim it. The
        // second, read but not begun, the writer claims and carries out. The writer sees
        // whether the oldest is begun, and which ones are not.
        let mut tickets = Vec::new();
        r.read(|rec| tickets.push(rec.ticket(None).0)).unwrap();
        assert!(w.oldest_unbegun());
        assert!(!tickets[0].carried_out());
        assert!(!w.oldest_unbegun());
        let mut unbegun = Vec::new();
        w.unbegun(|b| {
            unbegun.push(b.to_vec());
            true
        });
        assert_eq!(unbegun, [b"two".to_vec(), b"six".to_vec()]);
        assert!(w.claim(&mut 0, |b| b == b"one").is_none());
        w.claim(&mut 0, |b| b == b"two").unwrap().placed();
        assert!(tickets[1].carried_out());
        drop(tickets);
        put(&w, b"ten");
        put(&w, b"owt");
        // The writer claims "ten" and carries it out; "owt" it claims and gives back.
        w.claim(&mut 0, |b| b == b"ten").unwrap().placed();
        drop(w.claim(&mut 0, |b| b == b"owt").unwrap());
        assert!(w.claim(&mut 0, |b| b == b"ten").is_none(), "claimed once");
        let mut got = Vec::new();
        r.read(|rec| got.push((rec.bytes().to_vec(), rec.ticket(None).0.carried_out()))).unwrap();
        assert_eq!(got, [(b"ten".to_vec(), true), (b"owt".to_vec(), false)]);
        // A reader that meets a record being carried out waits for the writer to finish.
        put(&w, b"end");
        let w = Arc::new(w);
        let (w2, (tx, rx)) = (w.clone(), std::sync::mpsc::channel());
        let writer = std::thread::spawn(move || {
            let c = w2.claim(&mut 0, |b| b == b"end").unwrap();
            tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(30));
            c.placed();
        });
        rx.recv().unwrap();
        let mut placed = None;
        r.read(|rec| placed = Some(rec.ticket(None).0.carried_out())).unwrap();
        assert_eq!(placed, Some(true));
        writer.join().unwrap();
    }

    /// A reader that meets a record its writer is carrying out for long sleeps on it (not
    /// spinning nor yielding: its thread is asleep), and is woken as the writer leaves it:
    /// placed, the reader only accounts for it; given back, the reader carries it out.
    #[test]
    fn test_a_reader_sleeps_through_a_long_placing_and_wakes_as_the_writer_leaves_it() {
        let w = Arc::new(Ring::create(4096, false).unwrap());
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        // SAFETY: gettid takes no arguments and cannot fail.
        let reader_tid = unsafe { libc::gettid() };
        for placed in [true, false] {
            put(&w, b"long");
            let (w2, (tx, rx)) = (w.clone(), std::sync::mpsc::channel());
            let writer = std::thread::spawn(move || {
                let c = w2.claim(&mut 0, |b| b == b"long").unwrap();
                tx.send(()).unwrap();
                let stat = format!("/proc/self/task/{reader_tid}/stat");
                let asleep = || {
                    let s = std::fs::read_to_string(&stat).unwrap();
                    s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S'))
                };
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while w2.state(c.at).load(Ordering::Acquire) != AWAITED || !asleep() {
                    assert!(std::time::Instant::now() < deadline, "the reader never slept");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                if placed {
                    c.placed();
                } else {
                    drop(c);
                }
            });
            rx.recv().unwrap();
            let mut carried_out = None;
            r.read(|rec| carried_out = Some(rec.ticket(None).0.carried_out())).unwrap();
            assert_eq!(carried_out, Some(placed));
            writer.join().unwrap();
        }
    }

    #[test]
    fn test_the_writer_claims_the_oldest_record_alone_past_those_it_placed() {
        let w = Ring::create(4096, false).unwrap();
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        put(&w, b"one");
        put(&w, b"two");
        // "two" has "one" before it, neither placed nor begun.
        assert!(w.claim_oldest(|b| b == b"two").is_none());
        w.claim_oldest(|b| b == b"one").unwrap().placed();
        // The reader is behind on "two", not on "one", which it only has to account for.
        assert!(w.oldest_unbegun());
        assert!(w.claim_oldest(|b| b == b"one").is_none(), "claimed once");
        // Past a placed record, the next is the oldest.
        w.claim_oldest(|b| b == b"two").unwrap().placed();
        put(&w, b"six");
        put(&w, b"ten");
        // Begun by the reader's responder: not the writer's to claim, nor what follows it.
        let mut tickets = Vec::new();
        r.read(|rec| tickets.push((rec.bytes().to_vec(), rec.ticket(None).0))).unwrap();
        let carried: Vec<_> =
            tickets[..2].iter().map(|(b, t)| (b.clone(), t.carried_out())).collect();
        assert_eq!(carried, [(b"one".to_vec(), true), (b"two".to_vec(), true)]);
        assert!(!tickets[2].1.carried_out());
        assert!(w.claim_oldest(|b| b == b"six").is_none());
        assert!(w.claim_oldest(|b| b == b"ten").is_none());
        // Once every record before it is freed, the oldest is "ten".
        drop(tickets.drain(..3));
        w.claim_oldest(|b| b == b"ten").unwrap().placed();
        assert!(tickets[0].1.carried_out());
    }

    #[test]
    fn test_the_bell_is_rung_once_when_armed() {
        let w = Ring::create(4096, false).unwrap();
        assert!(!w.arm());
        put(&w, b"x");
        assert!(w.rings(false));
        put(&w, b"y");
        assert!(!w.rings(true));
        assert!(w.arm(), "records are waiting");
        w.disarm();
        assert!(!w.rings(true));
    }

    #[test]
    fn test_a_delegated_bell_is_rung_only_for_what_lands_and_given_back_as_taken() {
        let w = Ring::create(4096, false).unwrap();
        assert!(!w.delegate());
        put(&w, b"a send");
        assert!(!w.rings(false), "an application thread looks for what it announces");
        assert!(w.delegated());
        put(&w, b"a write");
        assert_eq!(w.take_bell(true), DELEGATED);
        assert!(!w.rings(true), "rung once");
        w.ask_bell_again(DELEGATED);
        assert!(w.delegated());
        // The reader asked anew meanwhile (to sleep): its request stands.
        assert_eq!(w.take_bell(true), DELEGATED);
        assert!(w.arm());
        w.ask_bell_again(DELEGATED);
        assert!(w.armed());
        assert!(w.delegate(), "records are waiting");
    }

    #[test]
    fn test_a_file_that_is_not_a_ring_is_refused_and_a_broken_record_is_an_error() {
        let fd = crate::sys::memfd(c"not-a-ring", HEADER + 4096).unwrap();
        assert_eq!(Ring::open(fd, me()).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let fd = crate::sys::memfd(c"odd", HEADER + 1000).unwrap();
        assert_eq!(Ring::open(fd, me()).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let w = Arc::new(Ring::create(4096, false).unwrap());
        put(&w, b"abc");
        w.set_len(0, 5000);
        assert!(w.read(|_| {}).is_err());
    }

    #[test]
    fn test_a_ring_that_could_shrink_is_refused_and_ours_cannot() {
        // A well-formed ring in a file its writer could still cut short under our mapping.
        let w = Ring::create(4096, false).unwrap();
        let copy = crate::sys::memfd_unsealed(c"unsealed", HEADER + 4096).unwrap();
        let bytes = std::fs::read(format!("/proc/self/fd/{}", w.fd())).unwrap();
        std::fs::write(format!("/proc/self/fd/{}", copy.as_raw_fd()), &bytes).unwrap();
        let e = Ring::open(copy, me()).unwrap_err();
        assert!(e.to_string().contains("sealed"), "{e}");
        // The rings we make cannot be cut or grown by anyone.
        // SAFETY: ftruncate on a descriptor we own.
        let r = unsafe { libc::ftruncate(w.fd(), 4096) };
        assert_eq!((r, io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EPERM)));
    }

    #[test]
    fn test_a_reader_that_scribbles_over_the_indices_only_stops_its_own_stream() {
        let w = Ring::create(4096, false).unwrap();
        let r = Arc::new(Ring::open(w.fd.try_clone().unwrap(), me()).unwrap());
        assert_eq!(put(&w, b"one"), Written::Done);
        // A hostile reader moves `head` past `tail`, and `tail` anywhere.
        r.word(HEAD_AT).store(1 << 40, Ordering::Relaxed);
        r.word(TAIL_AT).store(1 << 40, Ordering::Relaxed);
        // The writer goes on into the room it last saw freed, no further, then stops.
        let puts = (0..4096).take_while(|_| put(&w, b"two") == Written::Done).count();
        assert!(puts < 4096 / 16, "{puts} records written after the garbled head");
        assert_eq!(put(&w, b"two"), Written::Full);
        // And a hostile writer's `tail` makes the reader drop the ring, never read past it.
        r.word(TAIL_AT).store(1 << 40, Ordering::Relaxed);
        assert!(r.read(|_| {}).is_err());
    }
}

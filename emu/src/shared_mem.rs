//! Registered memory moved into shared memory, so that a peer process reads it with one
//! `memcpy` instead of `process_vm_readv` (which copies ~3.5x slower here: 13 against 47 GB/s
//! for 1 MiB).
//!
//! On a host fabric, the whole pages of application memory an MR spans (from one page if
//! peers may write it, [`MIN_BYTES`], else from 16 KiB) move into a memfd at the same
//! addresses when it is registered
//! ([`adopt`]): the bytes are copied into the file (its pages of zeros left holes), whose
//! shared mapping then replaces the private pages in one `mremap`. The application sees the
//! same addresses and the same bytes.
//! A message pulled from that memory names the file ([`SharedMem::id`]); the receiver, passed
//! the descriptor once, maps it ([`SharedView`]) and copies from there (where it has no view
//! yet, it pulls as before: both read the very same pages). A peer that carries out an RDMA
//! WRITE for us (see `ipc::exports`) writes through its view the same way, one `memcpy`
//! where `process_vm_writev` costs ~2.4 us here (and a look at whether we exited ~0.3): the
//! view is writable, which shows the peer no more than those calls would (it is passed only to
//! a peer that proved it may read our memory, and the kernel's check for reading another
//! process's memory is the one for writing it). A range that runs past the moved pages (the
//! partial pages at the ends of an MR not on page boundaries, as `malloc` hands them out) is
//! copied through the view for the part it holds and by system calls for the rest, in address
//! order. When the last MR over
//! the pages is deregistered they move back into private memory the same way, and a child
//! made by `fork` gets private copies of them at once: what the application sees after fork
//! is what private memory gives it (the kernel copies pinned pages to the child too).
//!
//! Only memory that is private, anonymous and writable is moved (not a file's mapping, a
//! stack, or pages moved already by an MR that does not cover the new one whole). Writes that
//! another thread of the application makes to those very pages while `ibv_reg_mr` or
//! `ibv_dereg_mr` runs may be lost: only whole pages inside the MR move, and a buffer being
//! registered is not one that is being filled. `RDMA_EMU_SHARE_MR=0`
//! ([`FabricConfig::share_mr`](crate::FabricConfig::share_mr)) leaves all memory where it is.
#![allow(unsafe_code)]

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc, Weak,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
};

use crate::sync::{Mutex, MutexGuard};

use crate::sys::{ForkHooks, ForkStage, mm};

/// MRs that peers may write whose whole pages span less are left where they are: nothing of
/// them can be mapped. (A page is worth moving: `ib_write_lat`'s buffers are two, and a peer
/// that writes into them through a view instead of `process_vm_writev` halves its round trip.)
pub(crate) const MIN_BYTES: usize = 4096;
/// MRs that peers may only read are moved from this size, the smallest message their peers
/// read from them (`fabric::host::PULL_MIN`; smaller ones go through the ring whole). Moving
/// 8 KiB costs ~30 us at registration (~65 on a kernel before 6.11: see `Maps`) and ~25 at
/// deregistration (~2 and ~1 left where they are), but a message of 16..64 KiB out of memory
/// left in place goes as packets: `ib_send_lat -s 16384` between two processes here took
/// 4.45 us from a 32 KiB MR left in place (from 64 KiB, as before), 2.41 moved; `-s 24576`
/// 5.76 against 2.78.
pub(crate) const MIN_READ_ONLY_BYTES: usize = 16 * 1024;
/// Pages moved at once at most, so that the descriptors they hold open stay few.
pub(crate) const MAX_LIVE: usize = 64;
/// Of the registrations that find [`MAX_LIVE`] ranges moved and none covering theirs, those
/// that look for ranges the application unmapped (see [`adopt`]).
const FULL_LOOKS: u32 = 64;
/// Registrations that found every range in use (see [`FULL_LOOKS`]).
static FULL: AtomicU32 = AtomicU32::new(0);
/// Memory moved into one file at most (the copy at registration is paid once per MR).
const MAX_BYTES: usize = 1 << 30;

/// Application memory in a memfd of ours, mapped where it was.
#[derive(Debug)]
pub(crate) struct SharedMem {
    /// Names the file in messages: unique in this process, never reused.
    id: u32,
    base: u64,
    len: usize,
    fd: OwnedFd,
    ino: u64,
    /// What the kernel's link for the file's mapping reads (see [`SharedMem::in_place`]).
    link: Box<str>,
    /// Those it was passed to, told when it moves back.
    told: Mutex<Vec<Weak<dyn Holder>>>,
}

impl SharedMem {
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The first address and the length of the memory moved.
    pub(crate) fn range(&self) -> (u64, usize) {
        (self.base, self.len)
    }

    /// Whether `addr..addr+len` lies in it.
    pub(crate) fn covers(&self, addr: u64, len: usize) -> bool {
        addr >= self.base
            && addr.checked_add(len as u64).is_some_and(|end| end <= self.base + self.len as u64)
    }

    /// Whether the file's mapping is, for sure, still whole where the memory was moved: one
    /// mapping of exactly its range, of this file. Asked of the kernel for that mapping alone
    /// (its link in `/proc/self/map_files`, which names the file: ours by this process's
    /// mark and the id, on any kernel), where listing every mapping (`Maps`, on a kernel
    /// that answers no query for one) cost ~35 us of a deregistration's ~60 here. `false`
    /// says only that this cannot tell (the range split into several mappings, say, or
    /// replaced by the application): `Maps` then says.
    fn in_place(&self) -> bool {
        let end = self.base + self.len as u64;
        let link = std::fs::read_link(format!("/proc/self/map_files/{:x}-{end:x}", self.base));
        link.is_ok_and(|l| l.as_os_str() == &*self.link)
    }

    /// Whether its pages are still its file's mapping (see [`SharedMem::in_place`]), where
    /// `maps`, if read, lists this process's mappings.
    fn still_ours(&self, maps: Option<&Maps>) -> bool {
        maps.is_some_and(|maps| maps.all(self.base, self.len, |v| v.is_ours(self.ino)))
    }

    /// `holder` was passed the file: it is told when the memory moves back.
    pub(crate) fn passed_to(&self, holder: Weak<dyn Holder>) {
        let mut told = self.told.lock();
        told.retain(|h| h.strong_count() > 0);
        told.push(holder);
    }
}

/// The lists below are held across fork (see `fork_prepare`), and released in the child by
/// the thread that forked, the child's only thread: [`Mutex`] is a futex lock, whose release
/// frees it whoever waited in the parent (parking_lot's, used before, handed itself to a
/// waiter now and then, a thread the child has not: the child hung).
type ForkLock<T> = Mutex<T>;

/// The memory moved, with how many MRs hold it.
static MOVED: ForkLock<Moved> = ForkLock::new(Vec::new());

/// The memory moved into the file named `id`, if it is still there.
pub(crate) fn find(id: u32) -> Option<Arc<SharedMem>> {
    MOVED.lock().iter().find(|(m, _)| m.id == id).map(|(m, _)| m.clone())
}
/// While a fork is under way, each moved range (address, length) and what the child gets
/// there (see `fork_prepare`).
static FORKING: ForkLock<Forking> = ForkLock::new(Vec::new());

type Moved = Vec<(Arc<SharedMem>, usize)>;
type Forking = Vec<(u64, usize, AtFork)>;

/// What a child made by fork gets at a moved range.
#[derive(Debug, Clone, Copy)]
enum AtFork {
    /// The private copy at this address, made before the fork, moved into place.
    Copy(usize),
    /// The shared pages themselves (there was no room for a copy), made private in the child.
    Shared,
    /// Whatever the application mapped there since it unmapped the range under a live MR
    /// (against the contract): inherited as the kernel forks it, untouched by us.
    Gone,
}
type HeldAcrossFork = (MutexGuard<'static, Moved>, MutexGuard<'static, Forking>);

std::thread_local! {
    /// Both lists, held by the forking thread from `fork_prepare` to `fork_parent` or
    /// `fork_child` (the same thread in either process).
    static HELD_ACROSS_FORK: std::cell::RefCell<Option<HeldAcrossFork>> =
        const { std::cell::RefCell::new(None) };
}

/// The lists `fork_prepare` holds (none if it did not run in this thread).
fn held_across_fork() -> Option<HeldAcrossFork> {
    HELD_ACROSS_FORK.with(|held| held.borrow_mut().take())
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// This process's mark, in the name of each file it moves memory into (with the file's id),
/// so that the name alone tells its files from any other (a peer's, mapped here as a view,
/// numbers its own): random, drawn at the first move (0: not yet), and drawn anew in a child
/// made by fork.
static MARK: AtomicU64 = AtomicU64::new(0);

/// See [`MARK`].
fn mark() -> u64 {
    match MARK.load(Ordering::Relaxed) {
        0 => {
            let mut b = [0u8; 8];
            // SAFETY: `b` is 8 writable bytes.
            let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
            let drawn = match got {
                8 => u64::from_ne_bytes(b),
                // (No getrandom: the process and the time tell it from its peers well enough.)
                _ => {
                    let since = std::time::UNIX_EPOCH.elapsed().unwrap_or_default();
                    u64::from(std::process::id()) << 32 ^ since.as_nanos() as u64
                }
            };
            // (Drawn under `MOVED`'s lock, by one thread at a time.)
            let m = drawn.max(1);
            MARK.store(m, Ordering::Relaxed);
            m
        }
        m => m,
    }
}

/// What an MR holds of moved memory; the pages move back to private memory when the last MR
/// over them lets go (at deregistration, while the application still has them mapped).
#[derive(Debug)]
pub(crate) struct Lease(Arc<SharedMem>);

impl Lease {
    pub(crate) fn shared(&self) -> &Arc<SharedMem> {
        &self.0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut moved = MOVED.lock();
        let Some(i) = moved.iter().position(|(m, _)| Arc::ptr_eq(m, &self.0)) else { return };
        moved[i].1 -= 1;
        if moved[i].1 > 0 {
            return;
        }
        let (m, _) = moved.swap_remove(i);
        // Pages the application unmapped (against the contract) are not written to.
        if m.in_place() || m.still_ours(Maps::read().ok().as_ref()) {
            privatize(m.base, m.len, Some(&m.fd));
        }
        drop(moved);
        m.retire();
    }
}

impl SharedMem {
    /// Tells those it was passed to that they may let their views go (its pages are freed
    /// once nobody maps the file).
    fn retire(&self) {
        let told = std::mem::take(&mut *self.told.lock());
        for peer in told.iter().filter_map(Weak::upgrade) {
            peer.retired(self.id);
        }
    }
}

/// The pieces of `src` (pieces of memory, in order, written to `addr` onwards) whose bytes
/// land in `part`: where each lands, where it is read from, how many bytes.
pub(crate) fn landing_in(
    src: &[(u64, usize)],
    addr: u64,
    part: std::ops::Range<u64>,
) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
    let mut at = addr;
    src.iter().filter_map(move |&(from, n)| {
        let (start, end) = (at, at.saturating_add(n as u64));
        at = end;
        let (lo, hi) = (start.max(part.start), end.min(part.end));
        (lo < hi).then(|| (lo, from + (lo - start), (hi - lo) as usize))
    })
}

/// Someone the file of a [`SharedMem`] was passed to, told when it is no longer used.
pub(crate) trait Holder: Send + Sync {
    /// The memory named `id` moved back: the view of it may go.
    fn retired(&self, id: u32);
}

/// Moves the whole pages of `addr..addr+len` into shared memory if they can be (see the
/// module's text), or finds them moved by an earlier MR that covers them; `None` leaves the
/// memory as it is.
pub(crate) fn adopt(addr: u64, len: usize) -> Option<Lease> {
    let page = crate::sys::page_size();
    let start = addr.checked_next_multiple_of(page)?;
    let end = addr.checked_add(len as u64)? / page * page;
    let n = usize::try_from(end.checked_sub(start)?).ok()?;
    if !(MIN_BYTES..=MAX_BYTES).contains(&n) {
        return None;
    }
    // A copy out of moved memory the application unmapped (see `fork_prepare`) fails
    // instead of faulting.
    crate::guarded::install();
    let mut moved = MOVED.lock();
    // Pages moved already, still in place: taken as they are, the mappings not read.
    if let Some((m, users)) = moved.iter_mut().find(|(m, _)| m.covers(start, n))
        && m.in_place()
    {
        *users += 1;
        return Some(Lease(m.clone()));
    }
    // With every range in use and none that holds these pages, nothing moves unless a range
    // the application unmapped is found and forgotten (below). Looked for only every
    // [`FULL_LOOKS`]th time: each look reads the process's mappings (tens of microseconds
    // with a hundred), where an MR left in place costs ~2 us.
    let covered = moved.iter().any(|(m, _)| m.covers(start, n));
    if !covered
        && moved.len() >= MAX_LIVE
        && !FULL.fetch_add(1, Ordering::Relaxed).is_multiple_of(FULL_LOOKS)
    {
        return None;
    }
    let maps = Maps::read().ok()?;
    // Forget what the application unmapped (after deregistering nothing: a leaked MR).
    let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut *moved)
        .into_iter()
        .partition(|(m, _)| maps.all(m.base, m.len, |v| v.is_ours(m.ino)));
    *moved = kept;
    gone.iter().for_each(|(m, _)| m.retire());
    if let Some((m, users)) = moved.iter_mut().find(|(m, _)| m.covers(start, n)) {
        *users += 1;
        return Some(Lease(m.clone()));
    }
    if moved.len() >= MAX_LIVE
        || moved.iter().any(|(m, _)| m.base < end && start < m.base + m.len as u64)
        || !maps.all(start, n, |v| v.is_private_memory())
    {
        return None;
    }
    // Ids are never reused, so one taken for a move that then fails is skipped.
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let name = format!("rdma-emu-mr.{:016x}.{id}", mark());
    let c_name = std::ffi::CString::new(name.as_str()).ok()?;
    let fd = crate::sys::memfd_unsealed(&c_name, n).ok()?;
    let ino = crate::sys::fstat(fd.as_raw_fd()).ok()?.ino;
    if !move_into(&fd, start, n) {
        return None;
    }
    // A child made by fork does not inherit the shared mapping, but a private copy of it
    // (see `fork_prepare`).
    // SAFETY: advice on our own mapping, just made.
    unsafe { mm::madvise(start as *mut libc::c_void, n, libc::MADV_DONTFORK) };
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    // SAFETY: F_ADD_SEALS on a descriptor we own takes an int. The file may no longer change
    // size: a peer's mapping never faults.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals | libc::F_SEAL_SEAL) } != 0 {
        privatize(start, n, Some(&fd));
        return None;
    }
    let hooks = ForkHooks { prepare: fork_prepare, parent: fork_parent, child: fork_child };
    crate::sys::on_fork(ForkStage::SharedMem, hooks);
    let told = Mutex::default();
    let link = format!("/memfd:{name} (deleted)").into_boxed_str();
    let m = Arc::new(SharedMem { id, base: start, len: n, fd, ino, link, told });
    moved.push((m.clone(), 1));
    Some(Lease(m))
}

/// Copies `start..start+n` into the file `fd` (`n` bytes long) and maps the file there in
/// place of the pages; whether it did (if not, nothing changed).
fn move_into(fd: &OwnedFd, start: u64, n: usize) -> bool {
    let (rw, shared) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED);
    // SAFETY: a new mapping the kernel places, aliasing nothing of ours.
    let tmp = unsafe { mm::mmap(std::ptr::null_mut(), n, rw, shared, fd.as_raw_fd(), 0) };
    if tmp == libc::MAP_FAILED {
        return false;
    }
    filled(tmp, start, n, None).is_ok_and(|tmp| put_in_place(tmp, start, n))
}

/// Moves the pages of `start..start+n` back into private memory with the same bytes (`file`:
/// the file mapped there, if known, whose holes are left alone).
fn privatize(start: u64, n: usize, file: Option<&OwnedFd>) -> bool {
    private_copy(start, n, file).is_ok_and(|copy| put_in_place(copy, start, n))
}

/// Why [`private_copy`] made none.
#[derive(Debug)]
enum NoCopy {
    /// No room for one.
    NoRoom,
    /// The bytes are no longer all mapped.
    Gone,
}

/// A fresh private mapping with a copy of the `n` bytes at `start` (of `file`, if known).
fn private_copy(start: u64, n: usize, file: Option<&OwnedFd>) -> Result<*mut libc::c_void, NoCopy> {
    let (rw, private) =
        (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: a new anonymous mapping the kernel places.
    let tmp = unsafe { mm::mmap(std::ptr::null_mut(), n, rw, private, -1, 0) };
    if tmp == libc::MAP_FAILED {
        return Err(NoCopy::NoRoom);
    }
    filled(tmp, start, n, file)
}

/// The fresh mapping `tmp` (`n` bytes) with a copy of the `n` bytes at `start` (of `file`, if
/// known); unmapped if `start..start+n` is no longer all mapped.
fn filled(
    tmp: *mut libc::c_void,
    start: u64,
    n: usize,
    file: Option<&OwnedFd>,
) -> Result<*mut libc::c_void, NoCopy> {
    if !copy_out(start, tmp, n, file) {
        // SAFETY: `tmp` is ours, just mapped.
        unsafe { mm::munmap(tmp, n) };
        return Err(NoCopy::Gone);
    }
    Ok(tmp)
}

/// Copies the `n` bytes at `start` into `tmp`, a mapping just made (all zeros), a page at a
/// time, leaving out the pages of zeros: the new mapping's page then stays unallocated until
/// it is written (16 MiB zeroed, registered and deregistered: 14 + 12 ms -> 3.7 + 0.2 here;
/// as it came from `mmap`, 18 + 12 -> 7.6 + 0.1; filled, unchanged).
/// Where the bytes are those of `file`, only its data is looked at (a hole reads as zeros,
/// and a look at it through the mapping would put a page there). False if
/// `start..start+n` is no longer all mapped (the application unmapped it under a live MR, or
/// is doing so on another thread). Under Valgrind every page is copied: Memcheck would report
/// the look at bytes the application never wrote as its error.
fn copy_out(start: u64, tmp: *mut libc::c_void, n: usize, file: Option<&OwnedFd>) -> bool {
    let page = crate::sys::page_size() as usize;
    let looked_at = !crate::sys::under_valgrind();
    let (at, to) = (std::ptr::with_exposed_provenance::<u8>(start as usize), tmp.cast::<u8>());
    let mut off = 0;
    while off < n {
        let (from, end) = match file {
            None => (off, n),
            Some(fd) => match data_from(fd, off, n, page) {
                Some(extent) => extent,
                None => break,
            },
        };
        for p in (from..end).step_by(page) {
            // `p + page <= n` (`start`, `n` and the extents are page-aligned): the page is
            // inside the range, which may be unmapped (the access then fails), and inside
            // `tmp`, a fresh writable mapping no memory Rust refers to, not overlapping it.
            let set = if looked_at {
                // SAFETY: as above, the range's page.
                unsafe { crate::guarded::any_set(at.add(p), page) }
            } else {
                Some(true)
            };
            let copied = match set {
                None => false,
                Some(false) => true,
                // SAFETY: as above, the range's page and `tmp`'s.
                Some(true) => unsafe { crate::guarded::copy(at.add(p), to.add(p), page) },
            };
            if !copied {
                return false;
            }
        }
        off = end;
    }
    true
}

/// The first extent of the file's data at or after `off` (widened to whole pages, ending by
/// `n`); `None` past its last. Where the file cannot say (`lseek` fails otherwise), the rest.
fn data_from(fd: &OwnedFd, off: usize, n: usize, page: usize) -> Option<(usize, usize)> {
    let seek = |from: usize, whence| {
        // SAFETY: lseek on a descriptor we own takes no pointers.
        let r = unsafe { libc::lseek(fd.as_raw_fd(), from as libc::off_t, whence) };
        usize::try_from(r).map_err(|_| io::Error::last_os_error().raw_os_error())
    };
    let from = match seek(off, libc::SEEK_DATA) {
        Ok(from) => from / page * page,
        Err(Some(libc::ENXIO)) => return None,
        Err(_) => return Some((off, n)),
    };
    if from >= n {
        return None;
    }
    let end = seek(from, libc::SEEK_HOLE).map_or(n, |end| end.next_multiple_of(page).min(n));
    Some((from.max(off), end.max(from + page).min(n)))
}

/// Moves the mapping `tmp` (`n` bytes) to `start`, in place of what is there.
fn put_in_place(tmp: *mut libc::c_void, start: u64, n: usize) -> bool {
    let at = std::ptr::with_exposed_provenance_mut::<u8>(start as usize);
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
    // SAFETY: moves our fresh mapping over the pages (which it unmaps) in one step; both
    // are page-aligned and `n` long.
    let r = unsafe { mm::mremap(tmp, n, n, flags, at.cast::<libc::c_void>()) };
    if r == libc::MAP_FAILED {
        // SAFETY: `tmp` is still ours and mapped.
        unsafe { mm::munmap(tmp, n) };
        return false;
    }
    true
}

/// Before fork: a private copy of each moved range, which the child inherits and moves into
/// place of the shared mapping it does not inherit. (The child cannot copy the shared pages
/// itself: the parent may write them meanwhile.) Both lists stay locked across the fork and
/// are released in both processes right after (see [`ForkLock`]), so the child finds them whole.
///
/// A range the application unmapped under a live MR is left alone: copying it faulted (the
/// process died in `fork`), and moving a copy there in the child replaced whatever the
/// application had mapped there since.
fn fork_prepare() {
    let moved = MOVED.lock();
    let mut forking = FORKING.lock();
    // Read only if the kernel's link for some range's mapping cannot say it is in place.
    let maps = match moved.iter().all(|(m, _)| m.in_place()) {
        true => None,
        false => Some(Maps::read().ok()),
    };
    for (m, _) in moved.iter() {
        // (Where the mappings could not be read, taken for ours, as before.)
        let ours = match &maps {
            None | Some(None) => true,
            Some(Some(maps)) => m.in_place() || m.still_ours(Some(maps)),
        };
        let at_fork = match ours.then(|| private_copy(m.base, m.len, Some(&m.fd))) {
            Some(Ok(copy)) => AtFork::Copy(copy as usize),
            // (Unmapped while we copied: the application's doing, as above.)
            None | Some(Err(NoCopy::Gone)) => AtFork::Gone,
            Some(Err(NoCopy::NoRoom)) => {
                // No room for a copy: the child shares the pages rather than lacking them.
                // SAFETY: advice on our own mapping.
                unsafe { mm::madvise(m.base as *mut libc::c_void, m.len, libc::MADV_DOFORK) };
                AtFork::Shared
            }
        };
        forking.push((m.base, m.len, at_fork));
    }
    HELD_ACROSS_FORK.with(|held| *held.borrow_mut() = Some((moved, forking)));
}

fn fork_parent() {
    let Some((_moved, mut forking)) = held_across_fork() else { return };
    for (base, len, at_fork) in forking.drain(..) {
        // SAFETY: the copy is ours, made in `fork_prepare`; a shared range is moved memory.
        unsafe {
            match at_fork {
                AtFork::Shared => mm::madvise(base as *mut libc::c_void, len, libc::MADV_DONTFORK),
                AtFork::Copy(copy) => mm::munmap(copy as *mut libc::c_void, len),
                AtFork::Gone => 0,
            };
        }
    }
}

fn fork_child() {
    // The child names its files apart from its parent's (see `MARK`).
    MARK.store(0, Ordering::Relaxed);
    let Some((mut moved, mut forking)) = held_across_fork() else { return };
    // The child's pages are its own, as private memory's are after fork. Its MRs are of no
    // use to it (as with a NIC), so nothing of them stays moved.
    for (base, len, at_fork) in forking.drain(..) {
        match at_fork {
            AtFork::Shared => {
                privatize(base, len, None);
            }
            // The copy (ours) where the shared mapping, not inherited, was.
            AtFork::Copy(copy) => {
                put_in_place(copy as *mut libc::c_void, base, len);
            }
            AtFork::Gone => {}
        }
    }
    moved.clear();
}

/// One mapping of this process, as the kernel lists or answers it: what a move needs to know
/// of it.
#[derive(Debug, Clone, Copy)]
struct Vma {
    start: u64,
    end: u64,
    /// Private, anonymous and writable: memory that may move.
    private_memory: bool,
    /// The inode of the file, for a shared mapping of one of ours (see [`adopt`]).
    ours: Option<u64>,
}

/// What decides a [`Vma`]'s kind: its permissions, its sharing, its file's inode and its name.
struct Traits<'a> {
    readable: bool,
    writable: bool,
    shared: bool,
    inode: u64,
    name: &'a str,
}

impl Vma {
    fn new(start: u64, end: u64, t: Traits<'_>) -> Vma {
        let Traits { readable, writable, shared, inode, name } = t;
        let private_memory = readable
            && writable
            && !shared
            && inode == 0
            && (name.is_empty() || name == "[heap]" || name.starts_with("[anon:"));
        let ours = (shared && name.starts_with("/memfd:rdma-emu-mr")).then_some(inode);
        Vma { start, end, private_memory, ours }
    }

    /// A line of /proc/self/maps.
    fn parse(line: &str) -> Option<Vma> {
        let mut f = line.splitn(6, ' ');
        let (range, perms, _off, _dev, inode) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (start, end) = range.split_once('-')?;
        let perms = perms.as_bytes();
        let traits = Traits {
            readable: perms.first() == Some(&b'r'),
            writable: perms.get(1) == Some(&b'w'),
            shared: perms.get(3) == Some(&b's'),
            inode: inode.parse().ok()?,
            name: f.next().unwrap_or("").trim(),
        };
        let hex = |h| u64::from_str_radix(h, 16).ok();
        Some(Vma::new(hex(start)?, hex(end)?, traits))
    }

    fn is_private_memory(&self) -> bool {
        self.private_memory
    }

    fn is_ours(&self, ino: u64) -> bool {
        self.ours == Some(ino)
    }
}

/// `struct procmap_query` (`linux/fs.h`, Linux 6.11 on): the kernel's answer for the one
/// mapping that holds an address, asked of an open /proc/self/maps.
#[repr(C)]
#[derive(Debug, Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);
/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = 0xC068_6611;
/// `vma_flags`: `PROCMAP_QUERY_VMA_READABLE`, `_WRITABLE`, `_SHARED`.
const VMA_READABLE: u64 = 0x1;
const VMA_WRITABLE: u64 = 0x2;
const VMA_SHARED: u64 = 0x8;

/// Whether the kernel answers [`PROCMAP_QUERY`]: [`UNASKED`], [`ANSWERS`] or [`LISTS_ONLY`].
static QUERIES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(UNASKED);
const UNASKED: u8 = 0;
const ANSWERS: u8 = 1;
const LISTS_ONLY: u8 = 2;

/// This process's mappings: asked of the kernel one at a time where it answers that
/// (`PROCMAP_QUERY`: a look at the few mappings a range spans, ~1.5 us each here, and ~7 us
/// to open and close the file they are asked of), else listed whole, in address order, and
/// parsed once per look (/proc/self/maps: ~35 us here for a small process, the kernel
/// writing out each mapping's line, and more with each mapping; parsed anew for each range
/// looked at, an MR registered while 64 moved ranges had split the heap into some hundred
/// mappings took ~1.2 ms).
enum Maps {
    Asked(std::fs::File),
    Listed(Vec<Vma>),
}

impl Maps {
    fn read() -> io::Result<Maps> {
        #[cfg(test)]
        test::MAPS_READ.with(|n| n.set(n.get() + 1));
        if QUERIES.load(Ordering::Relaxed) != LISTS_ONLY
            && let Some(asked) = Maps::asked()
        {
            return Ok(asked);
        }
        Maps::listed()
    }

    /// The mappings to be asked one at a time, if the kernel answers (asked once per process
    /// whether it does, with a look at a mapping that surely exists: this function's code).
    fn asked() -> Option<Maps> {
        let file = std::fs::File::open("/proc/self/maps").ok()?;
        if QUERIES.load(Ordering::Relaxed) == UNASKED {
            let here = Maps::asked as fn() -> Option<Maps> as usize as u64;
            let answers = match query(&file, here) {
                Ok(_) => ANSWERS,
                // No such query (ENOTTY), or none of this shape (EINVAL): an older kernel.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                    LISTS_ONLY
                }
                Err(_) => return None,
            };
            QUERIES.store(answers, Ordering::Relaxed);
            if answers == LISTS_ONLY {
                return None;
            }
        }
        Some(Maps::Asked(file))
    }

    /// The mappings listed whole.
    fn listed() -> io::Result<Maps> {
        let text = std::fs::read_to_string("/proc/self/maps")?;
        Ok(Maps::Listed(text.lines().filter_map(Vma::parse).collect()))
    }

    /// Whether `start..start+n` is mapped without a gap, every mapping there meeting `ok`.
    fn all(&self, start: u64, n: usize, ok: impl Fn(&Vma) -> bool) -> bool {
        let end = start + n as u64;
        match self {
            Maps::Listed(list) => {
                let mut at = start;
                let first = list.partition_point(|v| v.end <= start);
                for v in &list[first..] {
                    if v.start > at || !ok(v) {
                        return false;
                    }
                    at = v.end;
                    if at >= end {
                        return true;
                    }
                }
                false
            }
            Maps::Asked(file) => {
                let mut at = start;
                while at < end {
                    match query(file, at) {
                        Ok(Some(v)) if ok(&v) => at = v.end,
                        // A mapping that does not do, or a gap.
                        Ok(_) => return false,
                        // An answer the kernel could not give: the list says.
                        Err(_) => return Maps::listed().is_ok_and(|l| l.all(start, n, ok)),
                    }
                }
                true
            }
        }
    }
}

/// The mapping that holds `addr`, asked of `maps` (an open /proc/self/maps) with
/// `PROCMAP_QUERY`: `None` where nothing is mapped there.
fn query(maps: &std::fs::File, addr: u64) -> io::Result<Option<Vma>> {
    // The longest name the kernel gives (a path), and its NUL.
    let mut name = [0u8; libc::PATH_MAX as usize];
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr,
        vma_name_size: name.len() as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes `q`, a live `procmap_query` whose size it is
    // told, and writes at most `vma_name_size` bytes at `vma_name_addr`, `name`'s.
    let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut ProcmapQuery) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    // The name's length, its NUL counted (0 for a mapping without one).
    let len = (q.vma_name_size as usize).min(name.len()).saturating_sub(1);
    let traits = Traits {
        readable: q.vma_flags & VMA_READABLE != 0,
        writable: q.vma_flags & VMA_WRITABLE != 0,
        shared: q.vma_flags & VMA_SHARED != 0,
        inode: q.inode,
        name: std::str::from_utf8(&name[..len]).unwrap_or(""),
    };
    Ok(Some(Vma::new(q.vma_start, q.vma_end, traits)))
}

/// Another process's moved memory, mapped here: where a payload it sends from there is
/// copied from, and where a WRITE we carry out for it is copied to (see `ipc::exports`).
#[derive(Debug)]
pub(crate) struct SharedView {
    id: u32,
    /// Where the memory lies in its process.
    base: u64,
    len: usize,
    at: *mut u8,
    /// Mapped writable (a file of an older build, sealed against it, is mapped read-only).
    writable: bool,
    _map: crate::sys::FileMapping,
    /// Copies made from it (see `PeerProcess::view_copies`), and into it.
    #[cfg(test)]
    copies: std::sync::atomic::AtomicU64,
    #[cfg(test)]
    writes: std::sync::atomic::AtomicU64,
}

// SAFETY: a view of a file that cannot shrink; copies from it and into it are sound from any
// thread (the bytes may change under them, as memory a NIC reads and writes does).
unsafe impl Send for SharedView {}
// SAFETY: as above.
unsafe impl Sync for SharedView {}

impl SharedView {
    /// Maps the file `fd` that a peer says holds its memory `base..base+len`, named `id`. The
    /// file must be sealed against shrinking (a shrunk file would fault our reads) and be
    /// `len` bytes long.
    pub(crate) fn open(fd: &OwnedFd, id: u32, base: u64, len: usize) -> io::Result<SharedView> {
        let invalid = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        let seals = crate::sys::seals(fd.as_raw_fd()).map_err(|_| invalid("not a sealed file"))?;
        let needed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals & needed != needed {
            return Err(invalid("not sealed against shrinking and growing"));
        }
        let size = crate::sys::fstat(fd.as_raw_fd())?.size;
        if size != len as u64 || len == 0 || base.checked_add(len as u64).is_none() {
            return Err(invalid("not the size it is said to be"));
        }
        let mapped = |write| crate::sys::FileMapping::map(fd.as_raw_fd(), 0, len, write);
        let ((map, at), writable) = match mapped(true) {
            Ok(m) => (m, true),
            Err(_) => (mapped(false).map_err(io::Error::from_raw_os_error)?, false),
        };
        Ok(SharedView {
            id,
            base,
            len,
            at,
            writable,
            _map: map,
            #[cfg(test)]
            copies: Default::default(),
            #[cfg(test)]
            writes: Default::default(),
        })
    }

    #[cfg(test)]
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Copies `src`, pieces of our memory (address, length) in order, to `addr` onwards of its
    /// process; `false` (nothing written) if the view is read-only or does not hold them all.
    ///
    /// # Safety
    /// Each piece of `src` is readable memory of this process.
    #[cfg(test)]
    pub(crate) unsafe fn write(&self, addr: u64, src: &[(u64, usize)]) -> bool {
        let total = src.iter().map(|&(_, n)| n).sum::<usize>();
        // SAFETY: the caller's promise.
        unsafe { self.write_part(addr, src, addr..addr.saturating_add(total as u64)) }
    }

    /// As [`SharedView::write`], only the bytes that land in `part` of its process (their
    /// destination, `src` being written to `addr` onwards); `false` (nothing written) if the
    /// view is read-only or does not hold `part`.
    ///
    /// # Safety
    /// Each piece of `src` is readable memory of this process.
    pub(crate) unsafe fn write_part(
        &self,
        addr: u64,
        src: &[(u64, usize)],
        part: std::ops::Range<u64>,
    ) -> bool {
        if !self.writable || !self.covers(part.start, (part.end - part.start) as usize) {
            return false;
        }
        #[cfg(test)]
        self.writes.fetch_add(1, Ordering::Relaxed);
        for (to, from, n) in landing_in(src, addr, part) {
            let from = std::ptr::with_exposed_provenance::<u8>(from as usize);
            // SAFETY: `to..to+n` lies in `part`, in the writable mapping (checked above);
            // `from` is readable for `n` bytes (the caller's promise) and is our memory, not a
            // mapping of another process's file.
            unsafe {
                std::ptr::copy_nonoverlapping(from, self.at.add((to - self.base) as usize), n)
            };
        }
        true
    }

    /// The part of `addr..addr+len` of its process that it holds (empty if none).
    pub(crate) fn window(&self, addr: u64, len: usize) -> std::ops::Range<u64> {
        let lo = addr.max(self.base);
        let hi = addr.saturating_add(len as u64).min(self.base + self.len as u64);
        lo..hi.max(lo)
    }

    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    #[cfg(test)]
    pub(crate) fn copies(&self) -> u64 {
        self.copies.load(Ordering::Relaxed)
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// Whether the range `addr..addr+len` of its process lies in it.
    pub(crate) fn covers(&self, addr: u64, len: usize) -> bool {
        addr >= self.base
            && addr.checked_add(len as u64).is_some_and(|end| end <= self.base + self.len as u64)
    }

    /// Where the `len` bytes at `addr` of its process are mapped here, if they are in it:
    /// valid for reads as long as the view lives (the seals keep the file that long).
    pub(crate) fn at(&self, addr: u64, len: usize) -> Option<*const u8> {
        #[cfg(test)]
        self.copies.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `addr..addr+len` lies in the mapping (checked first).
        self.covers(addr, len)
            .then(|| unsafe { self.at.add((addr - self.base) as usize) }.cast_const())
    }

    /// Copies the bytes at `addr` of its process into `dst`; `false` if they are not in it.
    #[cfg(test)]
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        let Some(src) = self.at(addr, dst.len()) else { return false };
        // SAFETY: `src` is valid for reads of `dst.len()` bytes (see `at`); `dst` is ours and
        // does not overlap a mapping of another process's file.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }
}

#[cfg(test)]
mod test {
    use super::*;

    std::thread_local! {
        /// How many times this thread read the process's mappings (`Maps::read`).
        pub(super) static MAPS_READ: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    fn anon(n: usize) -> *mut u8 {
        let (rw, private) =
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), n, rw, private, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    /// The line of /proc/self/maps that lists the mapping at `addr`.
    fn mapping_of(addr: u64) -> String {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let holds = |line: &str| {
            let range = line.split(' ').next().unwrap();
            let (start, end) = range.split_once('-').unwrap();
            let hex = |h| u64::from_str_radix(h, 16).unwrap();
            (hex(start)..hex(end)).contains(&addr)
        };
        text.lines().find(|l| holds(l)).unwrap().to_string()
    }

    /// Registered memory moves into a file at the same addresses with the same bytes, a view
    /// of the file reads what the application writes, and the pages move back into private
    /// memory, bytes kept, when the last lease goes.
    #[test]
    fn test_memory_moves_into_a_file_and_back_with_its_bytes() {
        let n = 256 * 1024;
        let p = anon(n + 8192);
        // SAFETY: `p` is ours, `n + 8192` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, n + 8192) };
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        // An MR from a byte past the first page: its whole pages are the ones that move.
        let lease = adopt(p as u64 + 100, n + 4000).expect("private memory moves");
        let m = lease.shared().clone();
        assert_eq!(m.range(), (p as u64 + 4096, n));
        assert!(mapping_of(p as u64 + 4096).contains("/memfd:rdma-emu-mr"));
        assert!(!mapping_of(p as u64).contains("memfd"), "the partial page stays");
        assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "bytes kept");
        // A second MR inside the first shares its file; one over other pages too does not.
        let inner = adopt(p as u64 + 8192, 128 * 1024).unwrap();
        assert!(Arc::ptr_eq(inner.shared(), &m));
        assert!(adopt(p as u64, n + 8192).is_none(), "overlaps moved memory");

        let view = SharedView::open(m.fd(), m.id(), m.range().0, n).unwrap();
        buf[5000] = 0xee;
        let mut got = [0u8; 3];
        assert!(view.read(p as u64 + 4999, &mut got));
        assert_eq!(got, [buf[4999], 0xee, buf[5001]]);
        assert!(!view.read(p as u64 + 4095, &mut got), "outside the file");
        // A peer writes through its view into the application's memory, piece after piece,
        // and nowhere outside the file.
        let (a, b) = (*b"ab", *b"cde");
        let src = [(a.as_ptr() as u64, 2), (b.as_ptr() as u64, 3)];
        // SAFETY: both pieces are ours, readable.
        assert!(unsafe { view.write(p as u64 + 6000, &src) });
        assert_eq!(
            &buf[5999..6006],
            &[(5999 % 251) as u8, b'a', b'b', b'c', b'd', b'e', (6005 % 251) as u8]
        );
        // SAFETY: as above.
        assert!(!unsafe { view.write(p as u64 + 4094, &src) }, "outside the file");
        // SAFETY: as above.
        assert!(!unsafe { view.write(p as u64 + 4096 + n as u64 - 4, &src) }, "past its end");
        assert_eq!(view.writes(), 1);

        drop(lease);
        assert!(mapping_of(p as u64 + 4096).contains("memfd"), "one MR still holds it");
        drop(inner);
        assert!(!mapping_of(p as u64 + 4096).contains("memfd"));
        assert!(buf[..5000].iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert_eq!(buf[5000], 0xee);
        // The view still reads the file (a NIC still reads the pages it pinned).
        assert!(view.read(p as u64 + 5000, &mut got[..1]));
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n + 8192) };
    }

    /// Pages of zeros move without being copied: the file holds only the pages with bytes
    /// set (its blocks counted), its holes are not looked at on the way back (they stay
    /// holes), the private pages made then are only those (the rest stay unallocated:
    /// `mincore`), and the bytes read back the same.
    #[test]
    fn test_pages_of_zeros_are_left_out_of_the_moves() {
        let page = crate::sys::page_size() as usize;
        let n = 64 * page;
        let p = anon(n);
        // SAFETY: `p` is ours, `n` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
        // Page 0's last byte, page 9's first, page 10 written with zeros, page 40 whole;
        // the rest never touched.
        let set = [(page - 1, 7u8), (9 * page, 9), (40 * page + page / 2, 40)];
        buf[10 * page..11 * page].fill(0);
        buf[40 * page..41 * page].fill(0x40);
        for &(at, b) in &set {
            buf[at] = b;
        }
        let expected = buf.to_vec();
        let lease = adopt(p as u64, n).expect("private memory moves");
        let m = lease.shared().clone();
        assert!(mapping_of(p as u64).contains("/memfd:rdma-emu-mr"));
        let file_bytes = || {
            // SAFETY: an all-zero stat is valid, and fstat fills it from a descriptor we own.
            let blocks = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                assert_eq!(libc::fstat(m.fd().as_raw_fd(), &mut st), 0);
                st.st_blocks
            };
            blocks as usize * 512
        };
        assert_eq!(file_bytes(), 3 * page, "only the pages with bytes set");
        drop(lease);
        assert!(!mapping_of(p as u64).contains("memfd"));
        // Moved back from the file's data alone: a look at its holes would have filled them.
        assert_eq!(file_bytes(), 3 * page, "the holes stay holes");
        // (Looked at before the bytes are read: a read maps the zero page, which counts.)
        let mut resident = vec![0u8; 64];
        // SAFETY: `p` is ours, page-aligned, `n` bytes; one byte per page for the answer.
        assert_eq!(unsafe { libc::mincore(p.cast(), n, resident.as_mut_ptr()) }, 0);
        let made: Vec<usize> = (0..64).filter(|&i| resident[i] & 1 != 0).collect();
        assert_eq!(made, [0, 9, 40], "the pages of zeros stay unallocated");
        assert!(buf == &expected[..], "bytes kept on the way back");
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n) };
    }

    /// An MR whose ends are not on page boundaries has only its whole pages moved: a peer
    /// with a view of them writes and reads a range that runs past them through the view for
    /// the part it holds and by system calls for the partial pages, every byte where it
    /// belongs; only where the caller allows system calls for the ends.
    #[test]
    fn test_a_range_past_the_moved_pages_goes_through_the_view_and_system_calls() {
        let n = 16 * 1024;
        let p = anon(n + 8192);
        // SAFETY: `p` is ours, `n + 8192` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, n + 8192) };
        buf.fill(0);
        let lease = adopt(p as u64 + 100, n + 8000).expect("private memory moves");
        let m = lease.shared().clone();
        assert_eq!(m.range(), (p as u64 + 4096, n));
        let peer = crate::mem::PeerProcess::open(std::process::id()).unwrap();
        peer.add_view(Arc::new(SharedView::open(m.fd(), m.id(), m.range().0, n).unwrap()));
        // From the first MR byte's page to the last's, in three pieces.
        let (at, len) = (p as u64 + 200, n + 7000);
        let src: Vec<u8> = (0..len).map(|i| (i % 241) as u8 + 1).collect();
        let cut = [(0, 3000), (3000, 4000), (7000, len - 7000)];
        let pieces = cut.map(|(from, k)| (src.as_ptr() as u64 + from as u64, k));
        assert!(!peer.write_through_view(m.id(), at, &pieces, false), "not without the ends");
        assert!(buf.iter().all(|&b| b == 0), "nothing written");
        assert!(peer.write_through_view(m.id(), at, &pieces, true));
        assert_eq!(&buf[200..200 + len], &src[..]);
        assert!(buf[..200].iter().chain(&buf[200 + len..]).all(|&b| b == 0), "nothing else");
        assert_eq!(peer.view_writes(), 1);
        // A range of the peer's memory read back the same way.
        let range = crate::mem::PeerRange {
            from: Arc::new(peer),
            addr: at,
            len,
            shared: m.id(),
            view: None,
        };
        let mut got = vec![0u8; len - 10];
        range.read(10, &mut got).unwrap();
        assert_eq!(&got[..], &src[10..]);
        assert_eq!(range.from.view_copies(), 1, "the moved pages read through the view");
        drop(lease);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n + 8192) };
    }

    /// A child made by fork gets its own copy of moved memory, as of private memory: what it
    /// writes there the parent does not see, and the other way round.
    #[test]
    fn test_a_forked_child_gets_a_private_copy() {
        let n = 128 * 1024;
        let p = anon(n);
        // SAFETY: `p` is ours, `n` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
        buf.fill(7);
        let lease = adopt(p as u64, n).unwrap();
        // SAFETY: the child only writes and reads its memory and exits at once.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above; `_exit` runs no handler of the parent's.
            unsafe {
                let seen = *p.add(100) == 7;
                p.add(100).write_volatile(9);
                std::thread::sleep(std::time::Duration::from_millis(50));
                let kept = *p.add(200) == 7;
                libc::_exit(if seen && kept { 0 } else { 1 });
            }
        }
        assert!(child > 0);
        buf[200] = 8;
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child saw {status}"
        );
        assert_eq!((buf[100], buf[200]), (7, 8), "the child's write stays the child's");
        assert!(mapping_of(p as u64).contains("rdma-emu-mr"), "still moved in the parent");
        drop(lease);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n) };
    }

    /// A fork while other threads wait on the lists of moved memory: the child takes them at
    /// once. (A lock that hands itself to a waiter at its release, as parking_lot's does now and
    /// then, was handed in the child to a thread the child has not: the child hung.)
    #[test]
    fn test_a_fork_while_threads_wait_on_the_moved_list_leaves_it_free_in_the_child() {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Each takes the list now and then: one that tries while a fork holds it (for the
        // whole fork) waits, parked. (They sleep in between, leaving the cores to the tests
        // that run beside this one.)
        let contenders: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = find(u32::MAX);
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                })
            })
            .collect();
        let n = 64 * 1024;
        let p = anon(n);
        let lease = adopt(p as u64, n).unwrap();
        let hung = (0..100).find(|_| {
            // SAFETY: the child takes the lists, as the emulator would, and exits at once.
            let child = unsafe { libc::fork() };
            if child == 0 {
                let _ = find(u32::MAX);
                // SAFETY: runs no handler of the parent's.
                unsafe { libc::_exit(0) };
            }
            assert!(child > 0);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            let mut status = 0;
            // SAFETY: waits for our own child, without blocking.
            while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
                if std::time::Instant::now() > deadline {
                    // SAFETY: our own child.
                    unsafe { libc::kill(child, libc::SIGKILL) };
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            false
        });
        stop.store(true, Ordering::Relaxed);
        contenders.into_iter().for_each(|t| t.join().unwrap());
        drop(lease);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n) };
        assert_eq!(hung, None, "a child hung taking the list of moved memory");
    }

    /// Forks a child that runs `child` and exits with its answer; whether it answered true.
    fn in_a_child(child: impl FnOnce() -> bool) -> bool {
        // SAFETY: the child runs `child` alone and exits at once, running no handler of ours.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = child();
            // SAFETY: as above.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }

    /// Memory the application unmapped under a live MR (against the contract) is left alone
    /// at fork: the fork does not fault copying it (the test binary died of SIGSEGV so, when
    /// another test forked in that window), and the child keeps what the application mapped
    /// there since instead of a copy of the old bytes.
    #[test]
    fn test_a_fork_leaves_alone_memory_unmapped_under_a_live_mr() {
        let n = 64 * 1024;
        let p = anon(n);
        let leaked = adopt(p as u64, n).unwrap();
        // In place of the moved pages (not unmapped: the other tests' threads would map
        // their memory there), its MR (the lease) living on, against the contract: pages no
        // access reaches (faulting, as unmapped ones), then shared memory.
        let replace = |prot, flags| {
            let flags = flags | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
            // SAFETY: the range is ours.
            let q = unsafe { libc::mmap(p.cast(), n, prot, flags, -1, 0) };
            assert_eq!(q, p.cast());
        };
        replace(libc::PROT_NONE, libc::MAP_PRIVATE);
        assert!(in_a_child(|| true), "a fork with the range out of reach");
        replace(libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED);
        // SAFETY: the child writes its own mapping (shared with us) and exits.
        assert!(in_a_child(|| unsafe {
            p.add(10).write_volatile(9);
            true
        }));
        // SAFETY: our mapping.
        assert_eq!(unsafe { p.add(10).read_volatile() }, 9, "the child wrote a copy");
        drop(leaked);
        assert!(mapping_of(p as u64).contains("rw-s"), "left as the application mapped it");
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n) };
    }

    /// A registration over pages moved already, and the deregistration that moves them back,
    /// find them in place from the kernel's link for their one mapping, which names the file
    /// by this process's mark and the file's id, without reading every mapping of the process.
    #[test]
    fn test_moved_pages_are_found_in_place_without_reading_every_mapping() {
        let n = 64 * 1024;
        let p = anon(n);
        // SAFETY: `p` is ours, `n` bytes.
        unsafe { p.add(100).write(7) };
        let lease = adopt(p as u64, n).unwrap();
        let name = format!("/memfd:rdma-emu-mr.{:016x}.{}", mark(), lease.shared().id());
        assert!(mapping_of(p as u64).contains(&format!("{name} (deleted)")));
        assert!(lease.shared().in_place());
        let before = MAPS_READ.with(|n| n.get());
        // A second MR over those pages shares the file, as found in place.
        let inner = adopt(p as u64 + 4096, 8192).unwrap();
        assert!(Arc::ptr_eq(inner.shared(), lease.shared()));
        drop((lease, inner));
        assert_eq!(MAPS_READ.with(|n| n.get()), before, "the mappings were read");
        assert!(!mapping_of(p as u64).contains("memfd"), "moved back");
        // SAFETY: our mapping, private again.
        assert_eq!(unsafe { p.add(100).read() }, 7);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), n) };
    }

    /// Moved pages the application replaced (against the contract) with a mapping of a file
    /// named as ours are left alone: another process's mark (a view of a peer's memory is
    /// named so), or our own mark with another id, is not this file.
    #[test]
    fn test_a_file_named_as_another_of_ours_is_not_taken_for_the_moved_pages() {
        let n = 64 * 1024;
        for ours in [false, true] {
            let p = anon(n);
            let leaked = adopt(p as u64, n).unwrap();
            let id = leaked.shared().id();
            // Another process's mark with this id; our mark with another id.
            let name = match ours {
                false => format!("rdma-emu-mr.{:016x}.{id}", !mark()),
                true => format!("rdma-emu-mr.{:016x}.{}", mark(), id + 1_000_000),
            };
            let fd = crate::sys::memfd_unsealed(&std::ffi::CString::new(name).unwrap(), n).unwrap();
            let (rw, fixed) =
                (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED);
            // SAFETY: the range is ours; its MR (the lease) lives on, against the contract.
            let q = unsafe { libc::mmap(p.cast(), n, rw, fixed, fd.as_raw_fd(), 0) };
            assert_eq!(q, p.cast());
            // SAFETY: the application's new mapping, `n` bytes.
            unsafe { p.add(5).write(0x55) };
            assert!(!leaked.shared().in_place());
            let before = MAPS_READ.with(|n| n.get());
            drop(leaked);
            assert_eq!(MAPS_READ.with(|n| n.get()), before + 1, "asked the mappings");
            assert!(mapping_of(p as u64).contains("rw-s"), "left as the application mapped it");
            // SAFETY: still the application's mapping of its file.
            assert_eq!(unsafe { p.add(5).read() }, 0x55);
            // SAFETY: our mapping.
            unsafe { libc::munmap(p.cast(), n) };
        }
    }

    /// The kernel's answers for one mapping at a time (where it gives them) and its list of
    /// every mapping say the same of each kind of memory: private, anonymous and writable
    /// memory may move; read-only, shared or a file's memory, the main thread's stack and a
    /// gap may not; moved memory is its file's.
    #[test]
    fn test_the_kernels_answers_for_one_mapping_agree_with_its_list() {
        let n = 64 * 1024;
        let map = |prot, flags, fd| {
            // SAFETY: a fresh mapping the kernel places.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), n, prot, flags, fd, 0) };
            assert_ne!(p, libc::MAP_FAILED);
            p as u64
        };
        let (rw, private, shared) = (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
        );
        let file = crate::sys::memfd_unsealed(c"file", n).unwrap();
        // Below the lowest address a mapping may take (`vm.mmap_min_addr`): a gap for sure.
        let gap = 4096;
        let stack = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .find(|l| l.ends_with("[stack]"))
            .map(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap())
            .unwrap();
        let moved_at = map(rw, private, -1);
        let lease = adopt(moved_at, n).unwrap();
        let ino = lease.shared().ino;
        type Kind<'k> = &'k dyn Fn(&Vma) -> bool;
        let private_memory: Kind<'_> = &|v| v.is_private_memory();
        let ours: Kind<'_> = &|v| v.is_ours(ino);
        let cases: [(&str, u64, usize, Kind<'_>, bool); 8] = [
            ("private memory", map(rw, private, -1), n, private_memory, true),
            ("read-only", map(libc::PROT_READ, private, -1), n, private_memory, false),
            ("shared", map(rw, shared, -1), n, private_memory, false),
            ("a file's", map(rw, libc::MAP_PRIVATE, file.as_raw_fd()), n, private_memory, false),
            ("the stack", stack, 4096, private_memory, false),
            ("moved", moved_at, n, ours, true),
            ("moved, as private memory", moved_at, n, private_memory, false),
            ("a gap", gap, 4096, &|_: &Vma| true, false),
        ];
        let listed = Maps::listed().unwrap();
        for (what, at, len, ok, want) in cases {
            assert_eq!(listed.all(at, len, ok), want, "{what}, as listed");
            if let Some(asked) = Maps::asked() {
                assert!(matches!(asked, Maps::Asked(_)));
                assert_eq!(asked.all(at, len, ok), want, "{what}, as answered");
            }
        }
        drop(lease);
        for (what, at, ..) in cases.iter().filter(|c| !matches!(c.0, "the stack" | "a gap")) {
            if !what.starts_with("moved,") {
                // SAFETY: our mappings, made above.
                unsafe { libc::munmap(*at as *mut libc::c_void, n) };
            }
        }
    }

    struct Seen(Mutex<Vec<u32>>);

    impl Holder for Seen {
        fn retired(&self, id: u32) {
            self.0.lock().push(id);
        }
    }

    /// Those the file was passed to are told when the memory moves back, and when the
    /// application unmapped it without deregistering (found at the next registration).
    #[test]
    fn test_holders_are_told_when_the_memory_is_no_longer_shared() {
        let n = 64 * 1024;
        let seen = Arc::new(Seen(Mutex::default()));
        let holder: Arc<dyn Holder> = seen.clone();
        let (p, q) = (anon(n), anon(n));
        let lease = adopt(p as u64, n).unwrap();
        lease.shared().passed_to(Arc::downgrade(&holder));
        let id = lease.shared().id();
        drop(lease);
        assert_eq!(*seen.0.lock(), [id]);
        let leaked = adopt(p as u64, n).unwrap();
        leaked.shared().passed_to(Arc::downgrade(&holder));
        // SAFETY: our mapping; its MR (the lease) is leaked, against the contract.
        unsafe { libc::munmap(p.cast(), n) };
        let other = adopt(q as u64, n).unwrap();
        assert_eq!(*seen.0.lock(), [id, leaked.shared().id()]);
        drop((leaked, other));
        // SAFETY: our mapping.
        unsafe { libc::munmap(q.cast(), n) };
    }

    /// Memory that is not private and anonymous, or spans no whole page, stays where it is.
    #[test]
    fn test_only_private_anonymous_memory_of_whole_pages_moves() {
        assert!(adopt(anon(8192) as u64 + 100, 4096).is_none(), "no whole page");
        let fd = crate::sys::memfd_unsealed(c"file", 1 << 20).unwrap();
        let (_map, at) = crate::sys::FileMapping::map(fd.as_raw_fd(), 0, 1 << 20, true).unwrap();
        assert!(adopt(at as u64, 1 << 20).is_none(), "a file's mapping");
        let ro = anon(1 << 20);
        // SAFETY: our mapping.
        unsafe { libc::mprotect(ro.cast(), 1 << 20, libc::PROT_READ) };
        assert!(adopt(ro as u64, 1 << 20).is_none(), "read-only");
    }

    /// A view refuses a file that could shrink under it or is not the size said.
    #[test]
    fn test_a_view_refuses_a_file_that_could_fault_it() {
        let unsealed = crate::sys::memfd_unsealed(c"unsealed", 1 << 16).unwrap();
        assert!(SharedView::open(&unsealed, 1, 0x1000, 1 << 16).is_err());
        let sealed = crate::sys::memfd(c"sealed", 1 << 16).unwrap();
        assert!(SharedView::open(&sealed, 1, 0x1000, 1 << 15).is_err());
        assert!(SharedView::open(&sealed, 1, u64::MAX - 10, 1 << 16).is_err());
        assert!(SharedView::open(&sealed, 1, 0x1000, 1 << 16).is_ok());
    }
}

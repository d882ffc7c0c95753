//! The one place that reads and writes registered memory.
//!
//! A [`MemRegion`] is a range of host memory that an MR names. Every byte copied by the engine
//! (SEND payloads, RDMA WRITE/READ data, atomics) goes through the functions here, which check
//! bounds against the region before touching memory. Callers (the engine) have already checked
//! keys, protection domains and access flags; this module only guarantees that no access leaves
//! a registered range.
//!
//! Memory registered from C is memory the application promised to keep mapped until it
//! deregisters the MR (that is the contract of `ibv_reg_mr`), so the registration itself is the
//! `unsafe` step ([`MemRegion::from_raw`]); everything after it is safe. Memory registered
//! through the safe Rust API is owned by the region.
//!
//! Concurrent access by the application and the emulator to the same bytes is the same
//! situation as a NIC's DMA: the verbs contract says the application must not touch a buffer
//! while a work request uses it; the emulator does not add locking.
#![allow(unsafe_code)]

use std::{
    marker::PhantomData,
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::sync::Mutex;

use crate::shared_mem::{SharedMem, SharedView};

/// A range of host memory that may be read and written through the checked functions below.
pub(crate) struct MemRegion {
    /// Start of the range. Valid for reads and writes of `len` bytes while `self` lives
    /// (guaranteed by `from_raw`'s caller, or by `_owned`).
    base: *mut u8,
    len: usize,
    /// The shared memory the pages of `_owned` were moved into, held by the region itself
    /// (see [`MemRegion::keep_lease`]): declared before `_owned`, so that the pages move back
    /// into private memory before that storage is freed.
    lease: Option<crate::shared_mem::Lease>,
    /// Backing storage when the region owns its memory.
    _owned: Option<Storage>,
    /// The region this one is a part of ([`MemRegion::part`]), kept alive with it.
    _parent: Option<Arc<MemRegion>>,
    /// The file mapping the region lies in (a dma-buf MR), unmapped with it.
    _mapping: Option<crate::sys::FileMapping>,
    /// The shared memory its pages were moved into (see [`crate::shared_mem`]): payloads
    /// pulled from there name it, for the receiver to copy from its view.
    shared: Option<Arc<SharedMem>>,
    /// An on-demand paging MR's memory: nothing is promised mapped, so every access first
    /// faults its pages in (as the device's page-fault handling does) and fails cleanly
    /// where they cannot be. With a NULL `base` the region is the whole address space
    /// (implicit ODP): offsets are addresses.
    on_demand: bool,
    /// Memory the application or a file owns, which may go away under a live MR (unmapped,
    /// truncated): every access runs through [`crate::guarded`], and one that faults fails
    /// with `Unreadable` instead of ending the process.
    guarded: bool,
}

/// Zeroed memory a region owns: 8-byte aligned (for atomics), and from a page on whole pages,
/// so that all of it can move into shared memory (see `crate::shared_mem`: only whole pages
/// move, and a buffer of the emulator's own, an rsocket's send buffer, that began mid-page had
/// its first bytes copied to the peer by `process_vm_readv` every time its ring came round).
#[derive(Debug)]
struct Storage {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    /// See [`MemRegion::owned_for`].
    for_peers: bool,
}

impl Storage {
    fn zeroed(len: usize, for_peers: bool) -> Storage {
        let page = crate::sys::page_size() as usize;
        let (size, align) =
            if len >= page { (len.next_multiple_of(page), page) } else { (len.max(1), 8) };
        let layout = std::alloc::Layout::from_size_align(size, align).expect("a region's size");
        // SAFETY: the layout's size is nonzero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Storage { ptr, layout, for_peers }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the region is a plain address range; all access goes through the copy functions,
// which are sound from any thread (the verbs contract makes concurrent use the app's concern).
unsafe impl Send for MemRegion {}
// SAFETY: as above; `&MemRegion` exposes only checked copies and atomics.
unsafe impl Sync for MemRegion {}

impl std::fmt::Debug for MemRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemRegion({:p}, {})", self.base, self.len)
    }
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemFault {
    /// The access runs outside the region.
    OutOfBounds,
    /// An atomic on an address that is not 8-byte aligned.
    Misaligned,
    /// The memory of another process could not be read (it exited, or unmapped it).
    Unreadable,
}

/// A process on the host fabric whose memory payloads may be read from: the sender of a ring,
/// as the kernel named it when the ring was passed to us (never a number a message names).
#[derive(Debug)]
pub(crate) struct PeerProcess {
    pid: u32,
    /// Stands for that very process: once it exits, its number may name another process, so
    /// each read is checked against it.
    pidfd: OwnedFd,
    /// Its memory moved into shared memory that it passed us, mapped (see
    /// [`crate::shared_mem`]).
    views: Mutex<Vec<Arc<SharedView>>>,
}

/// Views of one process's shared memory kept at most (beyond them, its payloads are pulled).
const MAX_VIEWS: usize = 256;

impl PeerProcess {
    /// The process `pid` as it is now; fails if it is gone or this kernel has no pidfds.
    pub(crate) fn open(pid: u32) -> std::io::Result<PeerProcess> {
        let pidfd = crate::sys::pidfd_open(pid)?;
        Ok(PeerProcess { pid, pidfd, views: Mutex::default() })
    }

    /// Keeps `view` of its memory, in place of an older one of the same name (and of the
    /// oldest, when it has many).
    pub(crate) fn add_view(&self, view: Arc<SharedView>) {
        let mut views = self.views.lock();
        views.retain(|v| v.id() != view.id());
        if views.len() >= MAX_VIEWS {
            views.remove(0);
        }
        views.push(view);
    }

    /// Lets the view of its memory named `id` go: the memory moved back.
    pub(crate) fn drop_view(&self, id: u32) {
        self.views.lock().retain(|v| v.id() != id);
    }

    /// The view of its shared memory named `id`, if we have one.
    pub(crate) fn view(&self, id: u32) -> Option<Arc<SharedView>> {
        self.views.lock().iter().find(|v| v.id() == id).cloned()
    }

    /// How many views of its memory are kept (for tests).
    #[cfg(test)]
    pub(crate) fn view_count(&self) -> usize {
        self.views.lock().len()
    }

    /// How many copies were made from its views of its memory (for tests).
    #[cfg(test)]
    pub(crate) fn view_copies(&self) -> u64 {
        self.views.lock().iter().map(|v| v.copies()).sum()
    }

    /// How many writes were made through its views of its memory (for tests).
    #[cfg(test)]
    pub(crate) fn view_writes(&self) -> u64 {
        self.views.lock().iter().map(|v| v.writes()).sum()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it has exited (its number may now be another process's).
    pub(crate) fn exited(&self) -> bool {
        crate::sys::pidfd_exited(self.pidfd.as_raw_fd())
    }

    /// Waits, at most `limit`, until it has exited; whether it has. A process whose file
    /// locks the kernel has just released is exiting, but is seen exited a moment later.
    pub(crate) fn wait_exited(&self, limit: std::time::Duration) -> bool {
        matches!(crate::sys::wait_readable(self.pidfd.as_raw_fd(), Some(limit)), Ok(true) | Err(_))
    }

    /// Whether this process may read its memory (a word there holds `expect`).
    pub(crate) fn may_read(&self, addr: u64, expect: u64) -> bool {
        let mut word = [0u8; 8];
        self.pull(addr, word.as_mut_ptr(), 8).is_ok() && u64::from_ne_bytes(word) == expect
    }

    /// Copies the bytes at `addr` in the process into `dst`: through `view`, our view of its
    /// shared memory, for the part the view holds.
    pub(crate) fn read_into(
        &self,
        view: Option<&SharedView>,
        addr: u64,
        dst: &mut [u8],
    ) -> Result<(), MemFault> {
        self.copy_from(view, addr, dst.as_mut_ptr(), dst.len(), false)
    }

    /// Copies the `len` bytes at `addr` of the process to `dst`, valid for writes of `len`
    /// bytes (faults there failing the copy if `guarded`): what `view` (of its shared memory)
    /// holds of them with one copy, the rest (the partial pages at the ends of an MR, whose
    /// whole pages alone moved) by system calls.
    fn copy_from(
        &self,
        view: Option<&SharedView>,
        addr: u64,
        dst: *mut u8,
        len: usize,
        guarded: bool,
    ) -> Result<(), MemFault> {
        let w = view.map_or(0..0, |v| v.window(addr, len));
        let (at, mid) = (w.start, (w.end - w.start) as usize);
        let Some(s) = view.filter(|_| mid > 0).and_then(|v| v.at(at, mid)) else {
            return self.pull(addr, dst, len);
        };
        let head = (w.start - addr) as usize;
        let pull = |at, d, n| if n == 0 { Ok(()) } else { self.pull(at, d, n) };
        // Each piece lies in `dst` (`head + mid <= len`: the window lies in the range).
        pull(addr, dst, head)?;
        move_bytes(s, dst.wrapping_add(head), mid, guarded)?;
        pull(w.end, dst.wrapping_add(head + mid), len - head - mid)
    }

    /// Writes our memory `src` (ranges of `(address, length)`, in order) to `addr` onward in
    /// the process through our view of its shared memory named `shared`, if we have one we may
    /// write that holds them all, or, `with_edges`, that holds any: the bytes before and after
    /// it are then written by system calls, in address order (an application may watch the
    /// last byte). Whether it did. (`src` is registered memory of ours, or bytes we hold: it
    /// is read as the emulator reads its MRs anywhere.)
    pub(crate) fn write_through_view(
        &self,
        shared: u32,
        addr: u64,
        src: &[(u64, usize)],
        with_edges: bool,
    ) -> bool {
        let len = src.iter().map(|&(_, n)| n).sum::<usize>();
        let Some(view) = self.view(shared).filter(|v| v.writable()) else { return false };
        let end = addr.saturating_add(len as u64);
        let w = view.window(addr, len);
        let whole = w == (addr..end);
        if w.is_empty() || !(whole || with_edges) {
            return false;
        }
        let edge = |part| {
            crate::shared_mem::landing_in(src, addr, part)
                .all(|(to, from, n)| self.push(to, &[(from, n)]).is_ok())
        };
        // SAFETY: `src` is readable memory of ours (see above).
        edge(addr..w.start) && unsafe { view.write_part(addr, src, w.clone()) } && edge(w.end..end)
    }

    /// Writes our memory `src` (ranges of `(address, length)`, in order) to `addr` onward in
    /// the process (the NIC's DMA write for a process that is stopped: see `ipc::exports`),
    /// by system calls. Memory of ours that is not there fails the write (EFAULT) rather than
    /// faulting us, as does memory of the process that is not there; the process's number is
    /// checked against its pidfd first (a number taken over between that check and the write
    /// would need the process to exit and the number to come round again in between).
    pub(crate) fn push(&self, addr: u64, src: &[(u64, usize)]) -> Result<(), MemFault> {
        let mut at = addr;
        for &(from, len) in src {
            let mut done = 0;
            while done < len {
                if self.exited() {
                    return Err(MemFault::Unreadable);
                }
                let local = libc::iovec {
                    iov_base: (from as usize + done) as *mut libc::c_void,
                    iov_len: len - done,
                };
                let remote = libc::iovec { iov_base: at as *mut libc::c_void, iov_len: len - done };
                // SAFETY: the kernel reads `local` from our memory and writes the other
                // process's, failing (not faulting) where either is not mapped.
                let n = unsafe {
                    libc::process_vm_writev(self.pid as libc::pid_t, &local, 1, &remote, 1, 0)
                };
                if n <= 0 {
                    return Err(MemFault::Unreadable);
                }
                done += n as usize;
                at = at.wrapping_add(n as u64);
            }
        }
        Ok(())
    }

    /// Copies `len` bytes at `addr` in the process to `dst`, which must be valid for writes of
    /// `len` bytes. Should the process have exited meanwhile, what was copied may come from
    /// another process that took its number: it is wiped and the read fails.
    fn pull(&self, addr: u64, dst: *mut u8, len: usize) -> Result<(), MemFault> {
        let got = pull(self.pid, addr, dst, len);
        if self.exited() {
            // SAFETY: the caller guarantees `dst` valid for writes of `len` bytes.
            unsafe { std::ptr::write_bytes(dst, 0, len) };
            return Err(MemFault::Unreadable);
        }
        got
    }
}

/// Memory of another process on the host fabric, read with process_vm_readv: where a large
/// payload is taken from, straight into its destination (the NIC's DMA read of the
/// requester's buffer, done by the responder's process).
#[derive(Debug, Clone)]
pub(crate) struct PeerRange {
    pub(crate) from: Arc<PeerProcess>,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    /// The name of its process's shared memory that holds it (0: none; see
    /// [`crate::shared_mem`]).
    pub(crate) shared: u32,
    /// That shared memory, mapped here when the message was taken in: copied from there, not
    /// pulled.
    pub(crate) view: Option<Arc<SharedView>>,
}

impl PeerRange {
    /// Its shared memory mapped here, if it is: mapped when the message was taken in, or
    /// since (its descriptor may arrive after the message).
    fn view(&self) -> Option<std::borrow::Cow<'_, Arc<SharedView>>> {
        match &self.view {
            Some(v) => Some(std::borrow::Cow::Borrowed(v)),
            None if self.shared != 0 => self.from.view(self.shared).map(std::borrow::Cow::Owned),
            None => None,
        }
    }

    /// Copies its bytes from `off` into `dst`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), MemFault> {
        if off.checked_add(dst.len()).is_none_or(|end| end > self.len) {
            return Err(MemFault::OutOfBounds);
        }
        let addr = self.addr.wrapping_add(off as u64);
        self.copy_out(addr, dst.as_mut_ptr(), dst.len(), false)
    }

    /// [`PeerProcess::copy_from`] its process, through its shared memory mapped here if it is.
    fn copy_out(&self, addr: u64, dst: *mut u8, len: usize, guarded: bool) -> Result<(), MemFault> {
        self.from.copy_from(self.view().as_deref().map(|v| &**v), addr, dst, len, guarded)
    }
}

/// Copies `len` bytes at `addr` in process `pid` to `dst`, which must be valid for writes of
/// `len` bytes.
fn pull(pid: u32, addr: u64, dst: *mut u8, len: usize) -> Result<(), MemFault> {
    let mut done = 0;
    while done < len {
        let local = libc::iovec { iov_base: dst.wrapping_add(done).cast(), iov_len: len - done };
        let at = addr.wrapping_add(done as u64);
        let remote = libc::iovec { iov_base: at as *mut _, iov_len: len - done };
        // SAFETY: `local` lies in memory the caller guarantees writable for `len` bytes; the
        // kernel reads the other process's memory and fails (rather than faulting us) if it
        // is not there.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Err(MemFault::Unreadable);
        }
        done += n as usize;
    }
    Ok(())
}

impl MemRegion {
    /// A region over memory the caller owns.
    ///
    /// # Safety
    /// `base..base+len` must stay valid for reads and writes until the returned region (and
    /// every clone of the `Arc` that will hold it) is dropped.
    pub(crate) unsafe fn from_raw(base: *mut u8, len: usize) -> MemRegion {
        crate::guarded::install();
        MemRegion {
            base,
            len,
            lease: None,
            _owned: None,
            _parent: None,
            _mapping: None,
            shared: None,
            on_demand: false,
            guarded: true,
        }
    }

    /// A zeroed region of `len` bytes that owns its memory.
    pub(crate) fn owned(len: usize) -> MemRegion {
        MemRegion::owned_as(len, false)
    }

    /// [`MemRegion::owned`], for memory of the emulator's own that peers in other processes
    /// write into or read from (an rsocket's ring and send buffer): on a host fabric it moves
    /// into shared memory as an application's registered memory does (see `objects::mr`).
    pub(crate) fn owned_for(len: usize) -> MemRegion {
        MemRegion::owned_as(len, true)
    }

    fn owned_as(len: usize, for_peers: bool) -> MemRegion {
        let store = Storage::zeroed(len, for_peers);
        let base = store.ptr.as_ptr();
        MemRegion {
            base,
            len,
            lease: None,
            _owned: Some(store),
            _parent: None,
            _mapping: None,
            shared: None,
            on_demand: false,
            guarded: false,
        }
    }

    /// The `len` bytes of `parent` at `off`, as a region of their own (an MR over part of
    /// device memory); `None` if they do not lie inside `parent`.
    pub(crate) fn part(parent: &Arc<MemRegion>, off: usize, len: usize) -> Option<MemRegion> {
        let base = parent.check(off, len).ok()?;
        // `base..base+len` lies in `parent` (checked), whose memory lives as long as the
        // `Arc` held in `_parent`.
        Some(MemRegion {
            base,
            len,
            lease: None,
            _owned: None,
            _parent: Some(parent.clone()),
            _mapping: None,
            shared: None,
            on_demand: false,
            guarded: parent.guarded,
        })
    }

    /// Bytes `offset..offset+len` of the file `fd`, mapped shared (writable when `write`)
    /// for as long as the region lives; errors as [`FileMapping::map`](crate::sys::FileMapping).
    pub(crate) fn mapped(
        fd: std::os::fd::RawFd,
        offset: u64,
        len: usize,
        write: bool,
    ) -> Result<MemRegion, i32> {
        let (mapping, base) = crate::sys::FileMapping::map(fd, offset, len, write)?;
        crate::guarded::install();
        // `base..base+len` lies in the mapping, which lives as long as the region (the file
        // may shrink under it: guarded).
        Ok(MemRegion {
            base,
            len,
            lease: None,
            _owned: None,
            _parent: None,
            _mapping: Some(mapping),
            shared: None,
            on_demand: false,
            guarded: true,
        })
    }

    /// The same range as an on-demand paging MR's: nothing need be mapped, each access checks
    /// (a page unmapped between the check and the access is the application's fault, as
    /// with a device).
    pub(crate) fn into_on_demand(mut self) -> MemRegion {
        self.on_demand = true;
        self
    }

    /// Implicit on-demand paging: the whole address space, offsets being addresses.
    pub(crate) fn whole_address_space() -> MemRegion {
        // SAFETY: no byte of it is promised valid: an on-demand region checks every access.
        unsafe { MemRegion::from_raw(std::ptr::null_mut(), usize::MAX) }.into_on_demand()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes bytes `off..off+len` back to the file they are mapped from (a persistent
    /// FLUSH); false if the range is outside the region or not mapped. Anonymous memory has
    /// nowhere further to go and succeeds.
    pub(crate) fn write_back(&self, off: usize, len: usize) -> bool {
        match self.check(off, len) {
            Ok(p) => len == 0 || crate::sys::write_back(p as u64, len),
            Err(_) => false,
        }
    }

    /// Whether an access may fault (on-demand paging): only then can a checked access fail.
    pub(crate) fn on_demand(&self) -> bool {
        self.on_demand
    }

    /// The host address of the first byte.
    pub(crate) fn host_addr(&self) -> u64 {
        self.base as u64
    }

    /// Marks the region's memory as (partly) moved into `shared`.
    pub(crate) fn set_shared(&mut self, shared: Arc<SharedMem>) {
        self.shared = Some(shared);
    }

    /// Whether the region's memory is its own storage made for peers to reach (see
    /// [`MemRegion::owned_for`]).
    pub(crate) fn owned_for_peers(&self) -> bool {
        self._owned.as_ref().is_some_and(|s| s.for_peers)
    }

    /// The memory that may move into shared memory with the region: its own storage whole
    /// (whole pages from a page on), else its bytes.
    pub(crate) fn movable(&self) -> (u64, usize) {
        let len = self._owned.as_ref().map_or(self.len, |store| store.layout.size());
        (self.host_addr(), len)
    }

    /// Keeps `lease`, the shared memory the region's own pages moved into, for as long as the
    /// region lives: whoever holds the region last (an MR, a request in flight) frees its
    /// storage, and the pages must be private again by then.
    pub(crate) fn keep_lease(&mut self, lease: crate::shared_mem::Lease) {
        debug_assert!(self.owned_for_peers());
        self.lease = Some(lease);
    }

    /// The name of the shared memory its pages were (partly) moved into, 0 if none.
    pub(crate) fn shared_id(&self) -> u32 {
        self.shared.as_ref().map_or(0, |s| s.id())
    }

    /// The shared memory that holds bytes `off..off+len` of the region, if its pages were
    /// moved there.
    pub(crate) fn shared_for(&self, off: usize, len: usize) -> Option<&Arc<SharedMem>> {
        let s = self.shared.as_ref()?;
        s.covers(self.host_addr().checked_add(off as u64)?, len).then_some(s)
    }

    /// The shared memory that holds any of bytes `off..off+len` of the region (its whole
    /// pages, where the region's ends are not on page boundaries).
    pub(crate) fn shared_in(&self, off: usize, len: usize) -> Option<&Arc<SharedMem>> {
        let s = self.shared.as_ref()?;
        let (base, n) = s.range();
        let lo = self.host_addr().checked_add(off as u64)?;
        let hi = lo.checked_add(len as u64)?;
        (lo < base + n as u64 && base < hi).then_some(s)
    }

    fn check(&self, off: usize, len: usize) -> Result<*mut u8, MemFault> {
        match off.checked_add(len) {
            Some(end) if end <= self.len && self.base.is_null() => {
                // The whole address space (implicit ODP): the offset is the address.
                Ok(std::ptr::with_exposed_provenance_mut(off))
            }
            Some(end) if end <= self.len => {
                // SAFETY: off <= len of the region, so the result is within (or one past)
                // the allocation described by base..base+len.
                Ok(unsafe { self.base.add(off) })
            }
            _ => Err(MemFault::OutOfBounds),
        }
    }

    /// [`check`](Self::check), and for an on-demand region the page faults a device takes:
    /// the range's pages are brought in (for writing when `write`), or `Unreadable` where
    /// they cannot be (unmapped, or without the access).
    ///
    /// Always inlined: left to the compiler, a SEND's scatter called it twice, out of line
    /// (~45 instructions of a ping-pong hop's ~1,110).
    #[inline(always)]
    fn access(&self, off: usize, len: usize, write: bool) -> Result<*mut u8, MemFault> {
        let p = self.check(off, len)?;
        if self.on_demand && len > 0 && !crate::sys::fault_in(p as u64, len, write) {
            return Err(MemFault::Unreadable);
        }
        Ok(p)
    }

    /// Copies `dst.len()` bytes at `off` into `dst`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), MemFault> {
        let p = self.access(off, dst.len(), false)?;
        // `check` proved p..p+len lies in the region; `dst` is a distinct Rust buffer.
        move_bytes(p, dst.as_mut_ptr(), dst.len(), self.guarded)
    }

    /// Copies `src` into the region at `off`.
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> Result<(), MemFault> {
        let p = self.access(off, src.len(), true)?;
        // `check` proved p..p+len lies in the region.
        move_bytes(src.as_ptr(), p, src.len(), self.guarded)
    }

    /// Copies `len` bytes of another process's memory, `src` from `src_off`, into the region
    /// at `off`.
    pub(crate) fn pull(
        &self,
        off: usize,
        src: &PeerRange,
        src_off: usize,
        len: usize,
    ) -> Result<(), MemFault> {
        let d = self.access(off, len, true)?;
        if src_off.checked_add(len).is_none_or(|end| end > src.len) {
            return Err(MemFault::OutOfBounds);
        }
        let addr = src.addr.wrapping_add(src_off as u64);
        // A view's bytes are always there while it lives (see `SharedView`); `check` proved
        // d..d+len lies in the region, valid for writes.
        src.copy_out(addr, d, len, self.guarded)
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`. The two regions may
    /// overlap (two MRs over the same buffer, or loopback).
    #[inline(always)]
    pub(crate) fn copy(
        src: &MemRegion,
        src_off: usize,
        dst: &MemRegion,
        dst_off: usize,
        len: usize,
    ) -> Result<(), MemFault> {
        let s = src.access(src_off, len, false)?;
        let d = dst.access(dst_off, len, true)?;
        // Both ranges were checked against their regions; they may overlap (memmove).
        move_bytes(s, d, len, src.guarded || dst.guarded)
    }

    /// The 8-byte aligned word at `off`.
    fn word_at(&self, off: usize) -> Result<*mut u64, MemFault> {
        let p = self.access(off, 8, true)?;
        if !(p as usize).is_multiple_of(8) {
            return Err(MemFault::Misaligned);
        }
        Ok(p.cast())
    }

    /// The word at `off` as an atomic (memory that cannot go away).
    fn atomic(&self, p: *mut u64) -> &AtomicU64 {
        debug_assert!(!self.guarded);
        // SAFETY: p came from `word_at` (in bounds, aligned) and stays valid for the region's
        // lifetime, which bounds the returned reference's.
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// Stores the 8 bytes `word` at `off` as one (an ATOMIC WRITE).
    pub(crate) fn store(&self, off: usize, word: [u8; 8]) -> Result<(), MemFault> {
        let (p, word) = (self.word_at(off)?, u64::from_ne_bytes(word));
        if !self.guarded {
            self.atomic(p).store(word, Ordering::SeqCst);
            return Ok(());
        }
        // SAFETY: p is in the region and aligned; a fault fails the store.
        unsafe { crate::guarded::store(p, word) }.then_some(()).ok_or(MemFault::Unreadable)
    }

    /// Atomically adds `add` to the 64-bit word at `off`; returns the old value.
    #[inline]
    pub(crate) fn fetch_add(&self, off: usize, add: u64) -> Result<u64, MemFault> {
        let p = self.word_at(off)?;
        if !self.guarded {
            return Ok(self.atomic(p).fetch_add(add, Ordering::SeqCst));
        }
        // SAFETY: as `store`.
        unsafe { crate::guarded::fetch_add(p, add) }.ok_or(MemFault::Unreadable)
    }

    /// Atomically replaces the 64-bit word at `off` with `swap` if it equals `compare`;
    /// returns the old value either way.
    #[inline]
    pub(crate) fn compare_swap(
        &self,
        off: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemFault> {
        let p = self.word_at(off)?;
        if !self.guarded {
            let a = self.atomic(p);
            return Ok(
                match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                },
            );
        }
        // SAFETY: as `store`.
        unsafe { crate::guarded::compare_swap(p, compare, swap) }.ok_or(MemFault::Unreadable)
    }
}

/// Bytes of a region that a key's check proved within the region, over memory that is not on
/// demand (see `KeyTable::span`): copies to and from a span check nothing again. It borrows
/// the region, as long as the key table's read that proved it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span<'r> {
    ptr: *mut u8,
    len: usize,
    guarded: bool,
    region: PhantomData<&'r MemRegion>,
}

impl MemRegion {
    /// The `len` bytes at `off`, unchecked.
    ///
    /// # Safety
    /// `off + len` does not overflow and is at most [`MemRegion::len`], and the region is not
    /// on demand.
    #[inline(always)]
    pub(crate) unsafe fn span_unchecked(&self, off: usize, len: usize) -> Span<'_> {
        debug_assert!(!self.on_demand && off.checked_add(len).is_some_and(|end| end <= self.len));
        Span {
            // SAFETY: the caller's promise: `off..off + len` lies in `base..base + len` (a
            // region not on demand has a base: only the whole address space has none).
            ptr: unsafe { self.base.add(off) },
            len,
            guarded: self.guarded,
            region: PhantomData,
        }
    }

    /// Copies all of `src` into the region at `off`.
    pub(crate) fn put(&self, off: usize, src: Span<'_>) -> Result<(), MemFault> {
        let d = self.access(off, src.len, true)?;
        // `check` proved d..d+len lies in the region, the span's proof its own bytes.
        move_bytes(src.ptr, d, src.len, src.guarded || self.guarded)
    }

    /// Fills all of `dst` from the region at `off`.
    pub(crate) fn get(&self, off: usize, dst: Span<'_>) -> Result<(), MemFault> {
        let s = self.access(off, dst.len, false)?;
        // As in `put`.
        move_bytes(s, dst.ptr, dst.len, dst.guarded || self.guarded)
    }
}

impl<'r> Span<'r> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The `n` bytes from `at`, if the span holds them.
    #[inline]
    pub(crate) fn part(self, at: usize, n: usize) -> Option<Span<'r>> {
        let end = at.checked_add(n)?;
        // SAFETY: `at..end` lies within the span's bytes.
        (end <= self.len).then(|| Span { ptr: unsafe { self.ptr.add(at) }, len: n, ..self })
    }

    /// Copies `src`, as long as the span, into it.
    #[inline]
    pub(crate) fn write(self, src: &[u8]) -> Result<(), MemFault> {
        if src.len() != self.len {
            return Err(MemFault::OutOfBounds);
        }
        // The span's proof covers its bytes; `src` is a distinct Rust buffer.
        move_bytes(src.as_ptr(), self.ptr, self.len, self.guarded)
    }

    /// Copies the span into `dst`, as long as it.
    pub(crate) fn read(self, dst: &mut [u8]) -> Result<(), MemFault> {
        if dst.len() != self.len {
            return Err(MemFault::OutOfBounds);
        }
        // As in `write`.
        move_bytes(self.ptr, dst.as_mut_ptr(), self.len, self.guarded)
    }

    /// Copies `src`, as long as the span, into it (the two may overlap).
    #[inline]
    pub(crate) fn copy_from(self, src: Span<'_>) -> Result<(), MemFault> {
        if src.len != self.len {
            return Err(MemFault::OutOfBounds);
        }
        // Both spans' proofs cover their bytes.
        move_bytes(src.ptr, self.ptr, self.len, src.guarded || self.guarded)
    }
}

/// Copies `len` bytes from `src` to `dst` (memmove), both in checked ranges of regions (or a
/// Rust buffer); through [`crate::guarded`] when either region's memory may be gone, a fault
/// failing the copy with `Unreadable`. (Inlined: a function of its own, it was a call more,
/// its frame and its tests, per copy of application memory: ~10 instructions of a C
/// program's 8-byte WRITE.)
#[inline]
fn move_bytes(src: *const u8, dst: *mut u8, len: usize, guarded: bool) -> Result<(), MemFault> {
    if guarded {
        // SAFETY: the ranges are in bounds of their regions; memory that went away faults,
        // and the fault fails the copy.
        return if unsafe { crate::guarded::copy(src, dst, len) } {
            Ok(())
        } else {
            Err(MemFault::Unreadable)
        };
    }
    if len <= 16 {
        small_move(src, dst, len);
        return Ok(());
    }
    // SAFETY: the ranges lie in regions whose memory the emulator owns and keeps mapped
    // while they live (the regions' invariant); memmove semantics allow overlap.
    unsafe { std::ptr::copy(src, dst, len) };
    Ok(())
}

/// Appends `src` to `v`: bytes of a request's inline data, as a send queue keeps them. Up to
/// 16 bytes without a call to `memcpy` (`extend_from_slice` calls it whatever the length:
/// for the two bytes of `ib_send_lat`'s inline SEND, ~2% of a cross-process round trip).
#[inline]
pub(crate) fn append_bytes(v: &mut Vec<u8>, src: &[u8]) {
    let len = src.len();
    if len > 16 {
        v.extend_from_slice(src);
        return;
    }
    v.reserve(len);
    let at = v.len();
    // SAFETY: `reserve` made room for `len` more bytes after `at`, which `small_move` writes
    // (from `src`, a distinct live slice of `len` bytes) before `set_len` counts them.
    unsafe {
        small_move(src.as_ptr(), v.as_mut_ptr().add(at), len);
        v.set_len(at + len);
    }
}

/// [`move_bytes`] of at most 16 bytes, without a call to `memmove` (a third of the cost of an
/// 8-byte WRITE's copy was the call).
#[inline(always)]
fn small_move(src: *const u8, dst: *mut u8, len: usize) {
    match len {
        8.. => ends::<u64>(src, dst, len),
        4.. => ends::<u32>(src, dst, len),
        2.. => ends::<u16>(src, dst, len),
        1 => ends::<u8>(src, dst, len),
        _ => {}
    }
}

/// Copies the first and the last `size_of::<T>()` bytes of `len` (at least that many, at
/// most twice): two words that may overlap, both read before either is written (so the
/// ranges may overlap too).
#[inline(always)]
fn ends<T: Copy>(src: *const u8, dst: *mut u8, len: usize) {
    let w = std::mem::size_of::<T>();
    debug_assert!(w <= len && len <= 2 * w);
    // SAFETY: `src..src+len` and `dst..dst+len` lie in checked ranges of live regions (see
    // `move_bytes`), and each access is the first or the last `w <= len` bytes of one.
    unsafe {
        let (a, b) =
            (src.cast::<T>().read_unaligned(), src.add(len - w).cast::<T>().read_unaligned());
        dst.cast::<T>().write_unaligned(a);
        dst.add(len - w).cast::<T>().write_unaligned(b);
    }
}

/// Memory the application owns and lends to an MR: the one `unsafe` step of registering raw
/// memory (what `ibv_reg_mr` does in C). Pass it to [`crate::Pd::reg_mr_raw`].
#[derive(Debug)]
pub struct RawMemory(pub(crate) MemRegion);

impl RawMemory {
    /// # Safety
    /// `addr..addr+len` must stay valid for reads and writes until the MR it is registered as
    /// has been deregistered and every handle to that MR dropped (the `ibv_reg_mr` contract).
    pub unsafe fn new(addr: *mut u8, len: usize) -> RawMemory {
        // SAFETY: forwarded from the caller's contract.
        RawMemory(unsafe { MemRegion::from_raw(addr, len) })
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// Appending keeps what was there and adds exactly the bytes given, at every length the
    /// call-free way takes and past it, into a vector with room and into one without.
    #[test]
    fn test_appended_bytes_follow_what_was_there() {
        let src: Vec<u8> = (1..=40).collect();
        for len in 0..=40 {
            for (kept, room) in [(0, 0), (3, 0), (5, 64), (16, 16)] {
                let mut v = Vec::with_capacity(room);
                v.extend((0..kept).map(|i| 200 + i as u8));
                append_bytes(&mut v, &src[..len]);
                let mut want: Vec<u8> = (0..kept).map(|i| 200 + i as u8).collect();
                want.extend_from_slice(&src[..len]);
                assert_eq!(v, want, "len {len}, {kept} kept, room {room}");
            }
        }
    }

    #[test]
    fn test_small_copies_move_every_byte_even_overlapping() {
        // Every length the call-free copy takes (and the first it leaves to memmove), between
        // regions and within one, the ranges overlapping either way.
        let fresh = || {
            let r = MemRegion::owned(64);
            r.write(0, &(1..=64).collect::<Vec<u8>>()).unwrap();
            r
        };
        for len in 0..=17 {
            for (from, to) in [(0, 32), (3, 40), (5, 1), (1, 6), (9, 9), (0, 47)] {
                let (a, b) = (fresh(), MemRegion::owned(64));
                MemRegion::copy(&a, from, &b, to, len).unwrap();
                let mut got = [0u8; 64];
                b.read(0, &mut got).unwrap();
                let mut want = [0u8; 64];
                want[to..to + len]
                    .copy_from_slice(&(1..=64).collect::<Vec<u8>>()[from..from + len]);
                assert_eq!(got, want, "len {len} from {from} to {to}, two regions");
                MemRegion::copy(&a, from, &a, to, len).unwrap();
                a.read(0, &mut got).unwrap();
                let mut want: Vec<u8> = (1..=64).collect();
                want.copy_within(from..from + len, to);
                assert_eq!(got[..], want[..], "len {len} from {from} to {to}, one region");
            }
        }
    }

    #[test]
    fn test_spans_copy_their_bytes_and_hold_to_their_length() {
        let (a, b) = (MemRegion::owned(32), MemRegion::owned(32));
        a.write(0, &(1..=32).collect::<Vec<u8>>()).unwrap();
        // SAFETY: both ranges lie in the regions, which are not on demand.
        let (sa, sb) = unsafe { (a.span_unchecked(4, 16), b.span_unchecked(8, 16)) };
        assert!(sa.part(16, 1).is_none() && sa.part(usize::MAX, 2).is_none());
        let (head, tail) = (sa.part(0, 8).unwrap(), sa.part(8, 8).unwrap());
        assert_eq!(sb.copy_from(head), Err(MemFault::OutOfBounds), "lengths differ");
        assert_eq!(sb.write(&[9; 15]), Err(MemFault::OutOfBounds));
        sb.copy_from(sa).unwrap();
        let mut got = [0u8; 32];
        b.read(0, &mut got).unwrap();
        assert_eq!(got[8..24], (5..=20).collect::<Vec<u8>>()[..]);
        assert_eq!(got[..8], [0; 8]);
        assert_eq!(got[24..], [0; 8]);
        // Within one region, overlapping: both halves read before written.
        head.copy_from(sa.part(3, 8).unwrap()).unwrap();
        let mut out = [0u8; 8];
        head.read(&mut out).unwrap();
        assert_eq!(out, [8, 9, 10, 11, 12, 13, 14, 15]);
        tail.write(&[7; 8]).unwrap();
        b.put(0, tail).unwrap();
        a.get(28, sb.part(0, 4).unwrap()).unwrap();
        b.read(0, &mut got).unwrap();
        assert_eq!(got[..12], [7, 7, 7, 7, 7, 7, 7, 7, 29, 30, 31, 32]);
        assert_eq!(b.put(28, tail), Err(MemFault::OutOfBounds), "the region's bounds");
    }

    #[test]
    fn test_bounds_are_enforced() {
        let r = MemRegion::owned(16);
        assert_eq!(r.write(8, &[1; 8]), Ok(()));
        assert_eq!(r.write(9, &[1; 8]), Err(MemFault::OutOfBounds));
        assert_eq!(r.write(usize::MAX, &[1]), Err(MemFault::OutOfBounds));
        let mut b = [0u8; 8];
        assert_eq!(r.read(8, &mut b), Ok(()));
        assert_eq!(b, [1; 8]);
        assert_eq!(r.read(12, &mut b), Err(MemFault::OutOfBounds));
    }

    #[test]
    fn test_atomics_need_alignment() {
        let r = MemRegion::owned(24);
        assert_eq!(r.fetch_add(8, 5), Ok(0));
        assert_eq!(r.fetch_add(8, 5), Ok(5));
        assert_eq!(r.compare_swap(8, 10, 7), Ok(10));
        assert_eq!(r.compare_swap(8, 10, 9), Ok(7));
        assert_eq!(r.fetch_add(4, 1), Err(MemFault::Misaligned));
        assert_eq!(r.fetch_add(20, 1), Err(MemFault::OutOfBounds));
    }

    #[test]
    fn test_copy_between_regions_and_overlapping() {
        let a = MemRegion::owned(8);
        let b = MemRegion::owned(8);
        a.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        MemRegion::copy(&a, 2, &b, 0, 4).unwrap();
        let mut out = [0u8; 4];
        b.read(0, &mut out).unwrap();
        assert_eq!(out, [3, 4, 5, 6]);
        MemRegion::copy(&a, 0, &a, 1, 7).unwrap();
        let mut all = [0u8; 8];
        a.read(0, &mut all).unwrap();
        assert_eq!(all, [1, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(MemRegion::copy(&a, 4, &b, 0, 5), Err(MemFault::OutOfBounds));
    }
}

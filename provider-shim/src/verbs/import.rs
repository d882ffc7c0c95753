//! Sharing objects between contexts by handle, as the kernel's uverbs file does:
//! `ibv_import_device` on a dup of a context's `cmd_fd` opens a second context over the same
//! objects, and `ibv_import_pd` / `ibv_import_mr` / `ibv_import_dm` give it its own structs
//! for the objects of the first, named by their `handle`; `ibv_unimport_*` frees such a
//! struct without destroying the object.
//!
//! Each opened context gets a command fd of its own (a memfd: one inode per open, so a dup
//! passed around is recognised by `fstat`), and with it a [`Ufile`]: the emulator context
//! and the handle tables every context imported from that fd shares.

use core::ffi::c_int;
use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    ptr,
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicU32, Ordering},
    },
};

use rdma_emu::sync::Mutex;

use crate::{
    abi::*,
    boundary::{ffi, set_errno},
    objects::*,
};

/// An MR as its import needs it: the emulator MR and what `struct ibv_mr` reports.
#[derive(Clone, Debug)]
pub(crate) struct MrRecord {
    pub(crate) emu: rdma_emu::Mr,
    pub(crate) addr: usize,
    pub(crate) length: usize,
}

/// An object other contexts of the fd can import.
#[derive(Clone, Debug)]
pub(crate) enum Shared {
    Pd(rdma_emu::Pd),
    Mr(MrRecord),
    Dm(rdma_emu::Dm),
}

/// The objects behind one command fd (the kernel's `ib_uverbs_file`).
#[derive(Debug)]
pub(crate) struct Ufile {
    /// The device the fd was opened on (a `ShimDevice`, which lives as long as the library).
    pub(crate) dev: usize,
    pub(crate) emu: rdma_emu::Context,
    /// `st_dev` and `st_ino` of the fd's file.
    id: (u64, u64),
    next_handle: AtomicU32,
    /// By handle (one numbering for every kind, as the kernel's idr).
    objects: Mutex<HashMap<u32, Shared>>,
}

/// Every live ufile, to find the one a dup'd fd names.
fn ufiles() -> &'static Mutex<Vec<Weak<Ufile>>> {
    static UFILES: OnceLock<Mutex<Vec<Weak<Ufile>>>> = OnceLock::new();
    UFILES.get_or_init(Default::default)
}

fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid `stat`; fstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a writable stat; an invalid fd makes fstat fail with EBADF.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

impl Ufile {
    /// A new command fd and its ufile, for a context opened on `dev`.
    pub(crate) fn open(
        dev: usize,
        emu: rdma_emu::Context,
    ) -> std::io::Result<(Arc<Ufile>, OwnedFd)> {
        // SAFETY: a NUL-terminated name; memfd_create returns a new fd or -1.
        let raw = unsafe { libc::memfd_create(c"rdma-emu-cmd".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let id = file_id(fd.as_raw_fd()).ok_or_else(std::io::Error::last_os_error)?;
        let uf = Arc::new(Ufile {
            dev,
            emu,
            id,
            next_handle: AtomicU32::new(1),
            objects: Mutex::default(),
        });
        let mut all = ufiles().lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&uf));
        Ok((uf, fd))
    }

    /// The ufile of the file `fd` refers to, if it is one of ours.
    fn of_fd(fd: c_int) -> Option<Arc<Ufile>> {
        let id = file_id(fd)?;
        ufiles().lock().iter().filter_map(Weak::upgrade).find(|u| u.id == id)
    }

    /// Records a new object; its handle.
    pub(crate) fn add(&self, object: Shared) -> u32 {
        let h = self.new_handle();
        self.objects.lock().insert(h, object);
        h
    }

    /// A handle for a new object of this file that cannot be imported (a CQ, QP, ...).
    pub(crate) fn new_handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn get(&self, h: u32) -> Option<Shared> {
        self.objects.lock().get(&h).cloned()
    }
}

/// Forgets the destroyed object `handle` of context `c`'s ufile.
pub(crate) fn forget(c: *mut ibv_context, handle: u32) {
    // SAFETY: the context of a live object of ours is live.
    if let Some(s) = unsafe { ctx(c) } {
        s.ufile.objects.lock().remove(&handle);
    }
}

/// Records that MR `handle` of context `c` now lies at `addr` for `length` bytes (a rereg gave
/// it a new translation), for later imports.
pub(crate) fn mr_moved(c: *mut ibv_context, handle: u32, addr: usize, length: usize) {
    // SAFETY: the context of a live object of ours is live.
    if let Some(s) = unsafe { ctx(c) }
        && let Some(Shared::Mr(r)) = s.ufile.objects.lock().get_mut(&handle)
    {
        (r.addr, r.length) = (addr, length);
    }
}

/// Frees `p`, a struct of ours (else nothing), leaving the object it names alive.
fn unimport<C, S: 'static>(p: *mut C) {
    // SAFETY: NULL or a struct of ours (checked by `obj`), not used after this call (the
    // contract of `ibv_unimport_*`).
    if let Some(s) = unsafe { obj::<C, S>(p) } {
        // SAFETY: as above.
        unsafe { free(s as *const S) };
    }
}

/// Whether the verbs of sharing (the import family) are refused on the device of `uf` (then
/// with `EOPNOTSUPP` in errno): rxe's provider has no `import_context` nor `import_*`
/// operations, so libibverbs answers that there.
fn unshared(uf: Option<&Ufile>) -> bool {
    let refused = uf.is_some_and(|u| u.emu.device().profile() == rdma_emu::Profile::Rxe);
    if refused {
        set_errno(libc::EOPNOTSUPP);
    }
    refused
}

/// Whether `fd` is a character device (libibverbs' first test of a command fd).
fn char_device(fd: c_int) -> bool {
    // SAFETY: fstat writes into a zeroed stat of ours; a bad fd makes it fail.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFCHR }
}

/// `ibv_import_device(cmd_fd)`: a context over the objects of the context whose (dup'd)
/// command fd this is; it owns `cmd_fd` and closes it with the context. As libibverbs:
/// `EINVAL` for an fd that is no character device, `ENODEV` for one of no device;
/// `EOPNOTSUPP` in the rxe profile (the fd stays the caller's then).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_import_device(
    cmd_fd: c_int,
) -> *mut ibv_context {
    ffi!(ptr::null_mut(), {
        let Some(uf) = Ufile::of_fd(cmd_fd) else {
            set_errno(if char_device(cmd_fd) { libc::ENODEV } else { libc::EINVAL });
            return ptr::null_mut();
        };
        if unshared(Some(&uf)) {
            return ptr::null_mut();
        }
        // SAFETY: the caller hands over `cmd_fd` (a dup made for this call, as the man page
        // requires); the context closes it.
        let fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
        super::device::new_context(uf.dev as *mut ibv_device, uf, fd)
    })
}

/// `ibv_import_pd(context, pd_handle)`: `EINVAL` for a handle of no live PD of the
/// context's ufile; `EOPNOTSUPP` in the rxe profile.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_import_pd(
    c: *mut ibv_context,
    handle: u32,
) -> *mut ibv_pd {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context.
        let s = unsafe { ctx(c) };
        if unshared(s.map(|s| &*s.ufile)) {
            return ptr::null_mut();
        }
        let found = s.and_then(|s| s.ufile.get(handle));
        let Some(Shared::Pd(emu)) = found else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        leak(ShimPd::new(ibv_pd { context: c, handle }, emu)).cast()
    })
}

/// `ibv_unimport_pd(pd)`: frees the struct; the PD lives on.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_unimport_pd(pd: *mut ibv_pd) {
    ffi!((), { unimport::<_, ShimPd>(pd) })
}

/// `ibv_import_mr(pd, mr_handle)`: the MR as its owner registered it (address, length, keys),
/// in `pd`; `EINVAL` for a handle of no live MR; `EOPNOTSUPP` in the rxe profile.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_import_mr(
    pd: *mut ibv_pd,
    handle: u32,
) -> *mut ibv_mr {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live PD.
        let p = unsafe { obj::<_, ShimPd>(pd) };
        // SAFETY: a live PD's context is live.
        let c = p.and_then(|p| unsafe { ctx(p.pd.context) });
        if unshared(c.map(|s| &*s.ufile)) {
            return ptr::null_mut();
        }
        let found = c.and_then(|s| s.ufile.get(handle));
        let (Some(p), Some(Shared::Mr(r))) = (p, found) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let mr = ibv_mr {
            context: p.pd.context,
            pd,
            addr: r.addr as *mut _,
            length: r.length,
            handle,
            lkey: r.emu.lkey(),
            rkey: r.emu.rkey(),
        };
        leak(ShimMr { mr, emu: r.emu, kind: MrKind::Imported }).cast()
    })
}

/// `ibv_unimport_mr(mr)`: frees the struct; the MR stays registered.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_unimport_mr(mr: *mut ibv_mr) {
    ffi!((), { unimport::<_, ShimMr>(mr) })
}

/// `ibv_import_dm(context, dm_handle)`: `EINVAL` for a handle of no live device memory;
/// `EOPNOTSUPP` in the rxe profile.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_import_dm(
    c: *mut ibv_context,
    handle: u32,
) -> *mut ibv_dm {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context.
        let s = unsafe { ctx(c) };
        if unshared(s.map(|s| &*s.ufile)) {
            return ptr::null_mut();
        }
        let found = s.and_then(|s| s.ufile.get(handle));
        let Some(Shared::Dm(emu)) = found else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        super::dm::wrap(c, emu, handle).cast()
    })
}

/// `ibv_unimport_dm(dm)`: frees the struct; the memory stays allocated.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_unimport_dm(dm: *mut ibv_dm) {
    ffi!((), { unimport::<_, ShimDm>(dm) })
}

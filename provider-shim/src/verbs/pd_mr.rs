//! Protection domains and memory regions.

use core::ffi::{c_int, c_void};
use std::ptr;

use rdma_emu::{AccessFlags, RawMemory};

use super::import::{MrRecord, Shared};
use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

/// `ibv_alloc_pd(context)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        match s.emu().alloc_pd() {
            Ok(emu) => {
                let handle = s.ufile.add(Shared::Pd(emu.clone()));
                leak(ShimPd::new(ibv_pd { context: c, handle }, emu)).cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// `IBV_ADVISE_MR_FLAG_FLUSH`: the prefetch is done before the call returns.
const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// The `advise_mr` slot (devices with on-demand paging): `ibv_advise_mr(pd, advice, flags,
/// sg_list, num_sge)`; an errno as the kernel's command answers it (see the Rust API).
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live PD of ours.
        let s = match unsafe { lookup::<_, ShimPd>(pd) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        if flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0 || (sg_list.is_null() && num_sge > 0) {
            return libc::EINVAL;
        }
        let sges: Vec<rdma_emu::Sge> = if num_sge == 0 {
            Vec::new()
        } else {
            // SAFETY: `num_sge` readable SGEs at `sg_list` (the verb's contract).
            unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) }
                .iter()
                .map(|g| rdma_emu::Sge { addr: g.addr, length: g.length, lkey: g.lkey })
                .collect()
        };
        let flush = flags & IBV_ADVISE_MR_FLAG_FLUSH != 0;
        match s.emu.advise_mr(rdma_emu::Advice(advice), flush, &sges) {
            Ok(()) => 0,
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_dealloc_pd(pd)`: `EBUSY` while MRs, QPs or parent domains use it; a parent domain is
/// freed once no QP, CQ or SRQ made through it is left (its PD stays).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or an object of this library (checked by `destroy`); its context is
        // live while it is.
        unsafe {
            destroy(pd, |s: &ShimPd| {
                if s.users.load(std::sync::atomic::Ordering::Acquire) > 0 {
                    return Err(rdma_emu::Error::new(rdma_emu::Errno::EBUSY, "the PD is in use"));
                }
                if let Some(p) = &s.parent {
                    p.release();
                    return Ok(());
                }
                s.emu.dealloc()?;
                super::import::forget(s.pd.context, s.pd.handle);
                Ok(())
            })
        }
    })
}

/// The `struct ibv_mr` of `emu`, registered in `pd` at `addr` for `length` bytes, recorded
/// under a new handle so that other contexts of the command fd can import it.
///
/// # Safety
/// `pd` is a live PD of ours.
pub(crate) unsafe fn new_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    emu: rdma_emu::Mr,
    kind: MrKind,
) -> *mut ShimMr {
    // SAFETY: the caller's contract; a live PD's context is live.
    let c = unsafe { (*pd).context };
    let record = MrRecord { emu: emu.clone(), addr: addr as usize, length };
    // SAFETY: as above.
    let handle = unsafe { ctx(c) }.map_or(0, |s| s.ufile.add(Shared::Mr(record)));
    let mr = ibv_mr { context: c, pd, addr, length, handle, lkey: emu.lkey(), rkey: emu.rkey() };
    leak(ShimMr { mr, emu, kind })
}

/// Access bits that libibverbs drops when the device does not support them.
pub(crate) const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: NULL or a live PD.
    let s = match unsafe { lookup::<_, ShimPd>(pd) } {
        Ok(s) => s,
        Err(e) => {
            set_errno(e);
            return ptr::null_mut();
        }
    };
    let access = AccessFlags::from_bits_retain(access & !IBV_ACCESS_OPTIONAL_RANGE);
    if addr.is_null() && len == usize::MAX && iova == 0 {
        // Implicit on-demand paging: the whole address space.
        return match s.emu.reg_mr_implicit_odp(access) {
            // SAFETY: `pd` was checked live above.
            Ok(emu) => unsafe { new_mr(pd, addr, len, emu, MrKind::Registered) }.cast(),
            Err(e) => null_with(e),
        };
    }
    // libibverbs marks the range before the provider sees it (not an on-demand one).
    if !access.contains(AccessFlags::ON_DEMAND) {
        super::device::fork_range_marked();
    }
    // NULL is no exception: as any unmapped range, the pinning fails (`EFAULT`, as the
    // kernel's ib_umem_get fails on rxe and mlx5).
    // SAFETY: the ibv_reg_mr contract: the application keeps addr..addr+len mapped until it
    // deregisters the MR.
    let mem = unsafe { RawMemory::new(addr.cast(), len) };
    match s.emu.reg_mr_raw(mem, iova, access) {
        // SAFETY: `pd` was checked live above.
        Ok(emu) => unsafe { new_mr(pd, addr, len, emu, MrKind::Registered) }.cast(),
        Err(e) => null_with(e),
    }
}

/// `ibv_reg_mr(pd, addr, length, access)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    ffi!(ptr::null_mut(), { unsafe { reg(pd, addr, len, addr as u64, access as u32) } })
}

/// `ibv_reg_mr_iova(pd, addr, length, iova, access)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    ffi!(ptr::null_mut(), { unsafe { reg(pd, addr, len, iova, access as u32) } })
}

/// `ibv_reg_mr_iova2(pd, addr, length, iova, access)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    ffi!(ptr::null_mut(), { unsafe { reg(pd, addr, len, iova, access) } })
}

/// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`: an MR over bytes
/// `offset..offset+length` of a dma-buf or memfd, its `addr` the offset as libibverbs sets it.
/// `EOPNOTSUPP` in the rxe profile; `EBADF`, `EINVAL` as the kernel (see the Rust API).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live PD.
        let Some(s) = (unsafe { obj::<_, ShimPd>(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if fd < 0 {
            // rxe's refusal of the verb comes before any look at the descriptor.
            let rxe = s.emu.context().device().profile() == rdma_emu::Profile::Rxe;
            set_errno(if rxe { libc::EOPNOTSUPP } else { libc::EBADF });
            return ptr::null_mut();
        }
        // SAFETY: a non-negative descriptor number, used for the duration of this call only
        // (an fd that is not open makes the system calls fail with EBADF).
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let access = AccessFlags::from_bits_retain(access as u32 & !IBV_ACCESS_OPTIONAL_RANGE);
        match s.emu.reg_dmabuf_mr(fd, offset, length, iova, access) {
            Ok(emu) => {
                // SAFETY: `pd` was checked live above.
                unsafe { new_mr(pd, offset as *mut c_void, length, emu, MrKind::DmaBuf) }.cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_dereg_mr(mr)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or an object of this library (checked by `destroy`); an MR's context
        // is live while the MR is.
        unsafe {
            destroy(mr, |s: &ShimMr| {
                s.emu.dereg()?;
                super::import::forget(s.mr.context, s.mr.handle);
                Ok(())
            })
        }
    })
}

/// `enum ibv_rereg_mr_err_code`.
const IBV_REREG_MR_ERR_INPUT: c_int = -1;
const IBV_REREG_MR_ERR_CMD: c_int = -4;
const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
const IBV_REREG_MR_CHANGE_PD: c_int = 2;
const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;

/// `ibv_rereg_mr(mr, flags, pd, addr, length, access)`: changes the PD, the access flags and/or
/// the memory (keys unchanged). Returns 0 or an `IBV_REREG_MR_ERR_*` code with `errno` set:
/// `ERR_INPUT` for what libibverbs refuses before calling the provider (unknown flags, a device
/// memory or imported MR, a translation without address or length, access flags without
/// `CHANGE_ACCESS`), `ERR_CMD` for what the provider refuses (all of it in the rxe profile, with
/// `EOPNOTSUPP`, as rxe has no rereg; `flags == 0` with `EINVAL` as the kernel).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    ffi!(IBV_REREG_MR_ERR_CMD, {
        let all =
            IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
        let input = |errno| {
            set_errno(errno);
            IBV_REREG_MR_ERR_INPUT
        };
        // SAFETY: NULL or a live MR.
        let Some(s) = (unsafe { obj::<_, ShimMr>(mr) }) else { return input(libc::EINVAL) };
        let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        if s.kind != MrKind::Registered
            || flags & !all != 0
            || (translation && (addr.is_null() || length == 0))
            || (access != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0)
        {
            return input(libc::EINVAL);
        }
        let rxe = s.emu.pd().context().device().profile() == rdma_emu::Profile::Rxe;
        // The provider refuses: rxe has no rereg at all; the kernel finds no MR under a
        // changed handle, nor a PD under the new PD's (ENOENT both; EINVAL for no PD of ours).
        let cmd = |errno| {
            set_errno(if rxe { libc::EOPNOTSUPP } else { errno });
            IBV_REREG_MR_ERR_CMD
        };
        // SAFETY: `mr` is a live MR (above).
        if unsafe { checked::<_, ShimMr>(mr) }.is_none() {
            return cmd(libc::ENOENT);
        }
        let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            // SAFETY: NULL or a live PD.
            match unsafe { lookup::<_, ShimPd>(pd) } {
                Ok(p) => Some(p),
                Err(e) => return cmd(e),
            }
        } else {
            None
        };
        let what = rdma_emu::Rereg {
            pd: new_pd.map(|p| &p.emu),
            access: (flags & IBV_REREG_MR_CHANGE_ACCESS != 0)
                .then(|| AccessFlags::from_bits_retain(access as u32 & !IBV_ACCESS_OPTIONAL_RANGE)),
            // SAFETY: the ibv_rereg_mr contract: the new range stays mapped until the MR is
            // deregistered or given another translation.
            translation: translation
                .then(|| (unsafe { RawMemory::new(addr.cast(), length) }, addr as u64)),
        };
        match s.emu.rereg(what) {
            Ok(()) => {
                // SAFETY: `mr` is a live ShimMr; C reads these fields after the call.
                unsafe {
                    if new_pd.is_some() {
                        (*mr).pd = pd;
                    }
                    if translation {
                        ((*mr).addr, (*mr).length) = (addr, length);
                        super::import::mr_moved((*mr).context, (*mr).handle, addr as usize, length);
                    }
                    (*mr).rkey = s.emu.rkey();
                }
                0
            }
            Err(e) => {
                set_errno(e.errno().raw());
                IBV_REREG_MR_ERR_CMD
            }
        }
    })
}

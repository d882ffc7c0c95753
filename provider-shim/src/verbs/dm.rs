//! Device memory: the `alloc_dm` / `free_dm` / `reg_dm_mr` slots and the copy functions of
//! `struct ibv_dm` (filled for devices with device memory; libibverbs answers `EOPNOTSUPP`
//! for the others, as for rxe).

use core::ffi::{c_int, c_uint, c_void};
use std::ptr;

use rdma_emu::AccessFlags;

use super::{
    import::Shared,
    pd_mr::{IBV_ACCESS_OPTIONAL_RANGE, new_mr},
};
use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

/// The `alloc_dm` slot: `ibv_alloc_dm(context, attr)`; `EINVAL` for a `comp_mask` bit.
pub(crate) unsafe extern "C" fn alloc_dm(
    c: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context; `attr` NULL or readable.
        let (Some(s), Some(a)) = (unsafe { ctx(c) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if a.comp_mask != 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        match s.emu().alloc_dm(a.length as u64, a.log_align_req) {
            Ok(emu) => {
                let handle = s.ufile.add(Shared::Dm(emu.clone()));
                wrap(c, emu, handle)
            }
            Err(e) => null_with(e),
        }
    })
}

/// The `struct ibv_dm` of `emu` in context `c`.
pub(crate) fn wrap(c: *mut ibv_context, emu: rdma_emu::Dm, handle: u32) -> *mut ibv_dm {
    let dm = ibv_dm {
        context: c,
        memcpy_to_dm: Some(memcpy_to_dm),
        memcpy_from_dm: Some(memcpy_from_dm),
        comp_mask: 0,
        handle,
    };
    leak(ShimDm { dm, emu }).cast()
}

/// The `free_dm` slot: `ibv_free_dm(dm)`; `EBUSY` while MRs use it.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or an object of this library (checked by `destroy`); its context is
        // live while it is.
        unsafe {
            destroy(dm, |s: &ShimDm| {
                s.emu.free()?;
                super::import::forget(s.dm.context, s.dm.handle);
                Ok(())
            })
        }
    })
}

/// A copy of `length` bytes between the host at `host` and the device memory `dm`, done by
/// `go` once both are checked: 0 for nothing to copy, `EFAULT` for a NULL host address.
fn copy(
    dm: *mut ibv_dm,
    host: *mut u8,
    length: usize,
    go: impl FnOnce(&rdma_emu::Dm) -> rdma_emu::Result<()>,
) -> c_int {
    // SAFETY: NULL or a live device memory of ours (checked by `obj`).
    let Some(s) = (unsafe { obj::<_, ShimDm>(dm) }) else { return libc::EINVAL };
    if length == 0 {
        return 0;
    }
    if host.is_null() {
        return libc::EFAULT;
    }
    go(&s.emu).map_or_else(|e| e.errno().raw(), |()| 0)
}

/// `dm->memcpy_to_dm` (`ibv_memcpy_to_dm`): 0, `EFAULT` past the end, `EINVAL` unaligned.
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    dm_offset: u64,
    host_addr: *const c_void,
    length: usize,
) -> c_int {
    ffi!(libc::EIO, {
        copy(dm, host_addr as *mut u8, length, |d| {
            // SAFETY: the caller provides `length` readable bytes at `host_addr` (not NULL).
            let data = unsafe { std::slice::from_raw_parts(host_addr.cast::<u8>(), length) };
            d.copy_to(dm_offset, data)
        })
    })
}

/// `dm->memcpy_from_dm` (`ibv_memcpy_from_dm`): as `memcpy_to_dm`, the other way.
unsafe extern "C" fn memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int {
    ffi!(libc::EIO, {
        copy(dm, host_addr.cast(), length, |d| {
            // SAFETY: the caller provides `length` writable bytes at `host_addr` (not NULL),
            // not aliased by the device memory (the emulator's own allocation).
            let out = unsafe { std::slice::from_raw_parts_mut(host_addr.cast::<u8>(), length) };
            d.copy_from(dm_offset, out)
        })
    })
}

/// The `reg_dm_mr` slot: `ibv_reg_dm_mr(pd, dm, dm_offset, length, access)`, a zero-based MR
/// (`addr` NULL, as rdma-core reports it).
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or live objects of ours.
        let (Some(p), Some(d)) = (unsafe { obj::<_, ShimPd>(pd) }, unsafe { obj::<_, ShimDm>(dm) })
        else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let access = AccessFlags::from_bits_retain(access & !IBV_ACCESS_OPTIONAL_RANGE);
        match d.emu.reg_mr(&p.emu, dm_offset, length, access) {
            Ok(emu) => {
                // SAFETY: the PD's context is live.
                unsafe { new_mr(pd, ptr::null_mut(), length, emu, MrKind::DeviceMemory) }.cast()
            }
            Err(e) => null_with(e),
        }
    })
}

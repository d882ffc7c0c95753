//! Protection domains and memory regions.

use core::ffi::{c_int, c_void};
use std::ptr;

use rdma_emu::{AccessFlags, RawMemory};

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
        match s.emu.alloc_pd() {
            Ok(emu) => leak(ShimPd { pd: ibv_pd { context: c, handle: 0 }, emu }).cast(),
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_dealloc_pd(pd)`: `EBUSY` while MRs or QPs use it.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live PD.
        let Some(s) = (unsafe { obj::<_, ShimPd>(pd) }) else { return libc::EINVAL };
        match s.emu.dealloc() {
            Ok(()) => {
                // SAFETY: destroyed; C does not use the pointer again.
                unsafe { free(s as *const ShimPd) };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// Access bits that libibverbs drops when the device does not support them.
const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: NULL or a live PD.
    let Some(s) = (unsafe { obj::<_, ShimPd>(pd) }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    if addr.is_null() && len != 0 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let access = AccessFlags::from_bits_retain(access & !IBV_ACCESS_OPTIONAL_RANGE);
    // SAFETY: the ibv_reg_mr contract: the application keeps addr..addr+len mapped until it
    // deregisters the MR.
    let mem = unsafe { RawMemory::new(addr.cast(), len) };
    match s.emu.reg_mr_raw(mem, iova, access) {
        Ok(emu) => {
            let mr = ibv_mr {
                context: s.pd.context,
                pd,
                addr,
                length: len,
                handle: 0,
                lkey: emu.lkey(),
                rkey: emu.rkey(),
            };
            leak(ShimMr { mr, emu }).cast()
        }
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

/// `ibv_dereg_mr(mr)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live MR.
        let Some(s) = (unsafe { obj::<_, ShimMr>(mr) }) else { return libc::EINVAL };
        match s.emu.dereg() {
            Ok(()) => {
                // SAFETY: deregistered; C does not use the pointer again.
                unsafe { free(s as *const ShimMr) };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

//! Memory windows: the `alloc_mw` / `bind_mw` / `dealloc_mw` slots of `ibv_context_ops`, which
//! the inline `ibv_alloc_mw`, `ibv_bind_mw` and `ibv_dealloc_mw` call, and the C bind request.

use core::ffi::c_int;
use std::ptr;

use rdma_emu::{AccessFlags, MwBind, MwBindInfo, MwType, SendFlags};

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

/// The `alloc_mw` slot: `ibv_alloc_mw(pd, type)`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live PD.
        let p = match unsafe { lookup::<_, ShimPd>(pd) } {
            Ok(p) => p,
            Err(e) => {
                set_errno(e);
                return ptr::null_mut();
            }
        };
        match p.emu.alloc_mw(MwType(mw_type)) {
            Ok(emu) => {
                let mw = ibv_mw {
                    context: p.pd.context,
                    pd,
                    rkey: emu.rkey(),
                    handle: new_handle(p.pd.context),
                    type_: mw_type,
                };
                leak(ShimMw { mw, emu }).cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// The `dealloc_mw` slot: `ibv_dealloc_mw(mw)`.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(mw, |s: &ShimMw| s.emu.dealloc()) } })
}

/// The `bind_mw` slot: `ibv_bind_mw(qp, mw, mw_bind)` of a type 1 window, after the inline
/// wrapper's checks. Like rdma-core's providers, it posts a BIND_MW request and, once that is
/// posted, sets `mw->rkey` to the window's new rkey.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; `bind` NULL or readable.
        let (Some(q), Some(b)) = (unsafe { obj::<_, ShimQp>(qp) }, unsafe { bind.as_ref() }) else {
            return libc::EINVAL;
        };
        // SAFETY: the window and the MR are NULL or the application's objects; the new rkey
        // is chosen by `bind_mw` below, so the request's own is unused.
        let Some(req) = (unsafe { bind_request(mw, 0, &b.bind_info) }) else {
            return libc::EINVAL;
        };
        let flags = SendFlags::from_bits_retain(b.send_flags);
        match q.emu.bind_mw(req.mw, b.wr_id, flags, &req.info) {
            Ok(rkey) => {
                // SAFETY: a live window of this library (checked by `bind_request`); no
                // reference into it is used after this write.
                unsafe { (*mw).rkey = rkey };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// The emulator's view of `struct ibv_mw_bind_info`; `None` when `mr` is not NULL and not a
/// live MR of this library.
///
/// # Safety
/// `i.mr` is NULL or a pointer the application got from this library.
pub(crate) unsafe fn bind_info<'a>(i: &ibv_mw_bind_info) -> Option<MwBindInfo<'a>> {
    let mr = if i.mr.is_null() {
        None
    } else {
        // SAFETY: forwarded contract.
        let m = unsafe { obj::<_, ShimMr>(i.mr) }?;
        Some(&m.emu)
    };
    Some(MwBindInfo {
        mr,
        addr: i.addr,
        length: i.length,
        access: AccessFlags::from_bits_retain(i.mw_access_flags),
    })
}

/// A bind request of `ibv_post_send` / `ibv_wr_bind_mw`: the window `mw` takes `rkey`.
///
/// # Safety
/// `mw` and `info.mr` are NULL or pointers the application got from this library.
pub(crate) unsafe fn bind_request<'a>(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Option<MwBind<'a>> {
    // SAFETY: forwarded contract.
    let m = unsafe { obj::<_, ShimMw>(mw) }?;
    // SAFETY: forwarded contract.
    let info = unsafe { bind_info(info) }?;
    // SAFETY: a live window; the application's copy of its rkey is the one the bind names.
    m.emu.set_rkey(unsafe { (*mw).rkey });
    Some(MwBind { mw: &m.emu, rkey, info, mw_rkey: None })
}

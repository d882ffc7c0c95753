//! XRC: the `open_xrcd` / `close_xrcd` / `create_srq_ex` / `get_srq_num` / `open_qp` slots of
//! `verbs_context` (reached through the inline verbs of the same names), and target QPs.

use core::ffi::{c_int, c_void};
use std::ptr;

use rdma_emu::SrqAttr;

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

pub(crate) const IBV_XRCD_INIT_ATTR_FD: u32 = 1;
pub(crate) const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 2;
pub(crate) const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1;
pub(crate) const IBV_SRQ_INIT_ATTR_PD: u32 = 2;
pub(crate) const IBV_SRQ_INIT_ATTR_XRCD: u32 = 4;
pub(crate) const IBV_SRQ_INIT_ATTR_CQ: u32 = 8;
const IBV_SRQ_INIT_ATTR_TM: u32 = 16;
pub(crate) const IBV_SRQT_BASIC: u32 = 0;
pub(crate) const IBV_SRQT_XRC: u32 = 1;
const IBV_SRQT_TM: u32 = 2;
const IBV_QP_OPEN_ATTR_NUM: u32 = 1;
const IBV_QP_OPEN_ATTR_XRCD: u32 = 2;
const IBV_QP_OPEN_ATTR_CONTEXT: u32 = 4;
const IBV_QP_OPEN_ATTR_TYPE: u32 = 8;

fn fail<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    ptr::null_mut()
}

/// The `open_xrcd` slot: `ibv_open_xrcd(context, xrcd_init_attr)`. `fd` -1 makes a private
/// domain; another fd names its file, whose domain is shared (`oflags` `O_CREAT`/`O_EXCL`).
pub(crate) unsafe extern "C" fn open_xrcd(
    c: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context; `attr` NULL or readable.
        let (Some(s), Some(a)) = (unsafe { ctx(c) }, unsafe { attr.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        let both = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        if a.comp_mask & !both != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        if a.comp_mask & both != both {
            return fail(libc::EINVAL);
        }
        let file = if a.fd == -1 {
            None
        } else {
            // SAFETY: fstat writes a stat into the zeroed buffer; a bad fd is an error return.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
                return fail(libc::EBADF);
            }
            Some((st.st_dev, st.st_ino))
        };
        match s.emu().open_xrcd(file, a.oflags) {
            Ok(emu) => leak(ShimXrcd { xrcd: ibv_xrcd { context: c }, emu }).cast(),
            Err(e) => null_with(e),
        }
    })
}

/// The `close_xrcd` slot: `ibv_close_xrcd(xrcd)`; `EBUSY` while SRQs or target QPs use it.
pub(crate) unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(xrcd, |s: &ShimXrcd| s.emu.close()) } })
}

/// The `create_srq_ex` slot: `ibv_create_srq_ex(context, srq_init_attr_ex)`, basic, XRC
/// (an XRC SRQ needs `TYPE | PD | XRCD | CQ`) or tag matching (`TYPE | PD | CQ | TM`, full
/// profile).
pub(crate) unsafe extern "C" fn create_srq_ex(
    c: *mut ibv_context,
    init: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a valid attr.
        let Some(i) = (unsafe { init.as_mut() }) else { return fail(libc::EINVAL) };
        let known = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ
            | IBV_SRQ_INIT_ATTR_TM;
        if i.comp_mask & !known != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let srq_type =
            if i.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 { i.srq_type } else { IBV_SRQT_BASIC };
        // SAFETY: NULL or a live PD.
        let Some(p) =
            (unsafe { obj::<_, ShimPd>(i.pd) }).filter(|_| i.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0)
        else {
            return fail(libc::EINVAL);
        };
        // SAFETY: as above; the kernel's create finds no PD under a changed handle.
        if unsafe { checked::<_, ShimPd>(i.pd) }.is_none() {
            return fail(libc::ENOENT);
        }
        let a =
            SrqAttr { max_wr: i.attr.max_wr, max_sge: i.attr.max_sge, srq_limit: i.attr.srq_limit };
        let made = match srq_type {
            IBV_SRQT_BASIC => p.emu.create_srq(&a),
            IBV_SRQT_XRC => {
                let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
                // SAFETY: NULL or live objects of this library.
                let (Some(x), Some(cq)) =
                    (unsafe { obj::<_, ShimXrcd>(i.xrcd) }, unsafe { obj::<_, ShimCq>(i.cq) })
                else {
                    return fail(libc::EINVAL);
                };
                if i.comp_mask & need != need {
                    return fail(libc::EINVAL);
                }
                x.emu.create_srq(&p.emu, &cq.emu, &a)
            }
            IBV_SRQT_TM => {
                // As mlx5: a CQ for the list operations and the TM caps; `max_ops` within the
                // device's.
                let need = IBV_SRQ_INIT_ATTR_TM | IBV_SRQ_INIT_ATTR_CQ;
                // SAFETY: NULL or a live CQ of this library.
                let Some(cq) = (unsafe { obj::<_, ShimCq>(i.cq) }) else {
                    return fail(libc::EINVAL);
                };
                let [max_tags, max_ops] = i.tm_cap;
                let caps = p.emu.context().query_device().tm;
                if caps.max_num_tags > 0
                    && (i.comp_mask & need != need || max_ops == 0 || max_ops > caps.max_ops)
                {
                    return fail(libc::EINVAL);
                }
                p.emu.create_srq_tm(&a, max_tags, &cq.emu)
            }
            _ => return fail(libc::EINVAL),
        };
        match made {
            Ok(emu) => super::srq::wrap(c, i.srq_context, i.pd, emu, &mut i.attr),
            Err(e) => null_with(e),
        }
    })
}

/// The `get_srq_num` slot: `ibv_get_srq_num(srq, &srq_num)`.
pub(crate) unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, out: *mut u32) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live SRQ; `out` NULL or writable.
        let (Some(s), Some(out)) = (unsafe { obj::<_, ShimSrq>(srq) }, unsafe { out.as_mut() })
        else {
            return libc::EINVAL;
        };
        match s.emu.srq_num() {
            Ok(n) => {
                *out = n;
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_create_qp_ex` of an `IBV_QPT_XRC_RECV` QP: no PD, no CQs, no SRQ on the C side.
///
/// # Safety
/// `xrcd` is NULL or a pointer the application got from this library.
pub(crate) unsafe fn create_recv_qp(
    c: *mut ibv_context,
    xrcd: *mut ibv_xrcd,
    qp_context: *mut c_void,
    extended: bool,
) -> *mut ibv_qp {
    // SAFETY: forwarded contract.
    let Some(x) = (unsafe { obj::<_, ShimXrcd>(xrcd) }) else { return fail(libc::EINVAL) };
    match x.emu.create_recv_qp() {
        Ok(emu) => super::qp::wrap(target_parts(c, qp_context), emu, extended),
        Err(e) => null_with(e),
    }
}

fn target_parts(context: *mut ibv_context, qp_context: *mut c_void) -> super::qp::QpParts {
    super::qp::QpParts {
        context,
        qp_context,
        pd: ptr::null_mut(),
        send_cq: ptr::null_mut(),
        recv_cq: ptr::null_mut(),
        srq: ptr::null_mut(),
    }
}

/// The `open_qp` slot: `ibv_open_qp(context, qp_open_attr)`: another handle on a target QP of
/// the domain (it needs `NUM | XRCD | TYPE`, and the type must be `IBV_QPT_XRC_RECV`).
pub(crate) unsafe extern "C" fn open_qp(
    c: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a readable attr.
        let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
        let need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
        if a.comp_mask & !(need | IBV_QP_OPEN_ATTR_CONTEXT) != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        if a.comp_mask & need != need || a.qp_type != rdma_emu::QpType::XRC_RECV.0 {
            return fail(libc::EINVAL);
        }
        // SAFETY: NULL or an XRC domain of this library.
        let Some(x) = (unsafe { obj::<_, ShimXrcd>(a.xrcd) }) else { return fail(libc::EINVAL) };
        let qp_context = if a.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT != 0 {
            a.qp_context
        } else {
            ptr::null_mut()
        };
        match x.emu.open_qp(a.qp_num) {
            Ok(emu) => {
                let q = super::qp::wrap(target_parts(c, qp_context), emu, false);
                // SAFETY: the QP just made. An opened handle reports its state as unknown until
                // it is modified or queried (as the kernel's `ib_open_qp` handle).
                unsafe { (*q).state = rdma_emu::QpState::UNKNOWN.0 };
                q
            }
            Err(e) => null_with(e),
        }
    })
}

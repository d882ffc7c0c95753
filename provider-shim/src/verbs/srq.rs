//! Shared receive queues, including the `post_srq_recv` slot.

use core::ffi::c_int;
use std::ptr;

use rdma_emu::SrqAttr;

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

/// `ibv_create_srq(pd, srq_init_attr)`: writes the granted sizes back into the attr.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live PD; `init` NULL or a valid attr.
        let (Some(p), Some(i)) = (unsafe { obj::<_, ShimPd>(pd) }, unsafe { init.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: as above; the kernel's create finds no PD under a changed handle.
        if unsafe { checked::<_, ShimPd>(pd) }.is_none() {
            set_errno(libc::ENOENT);
            return ptr::null_mut();
        }
        let a =
            SrqAttr { max_wr: i.attr.max_wr, max_sge: i.attr.max_sge, srq_limit: i.attr.srq_limit };
        let emu = match p.emu.create_srq(&a) {
            Ok(s) => s,
            Err(e) => return null_with(e),
        };
        wrap(p.pd.context, i.srq_context, pd, emu, &mut i.attr)
    })
}

/// Hands a new emulator SRQ to C, writing the granted sizes back into `attr`; through a parent
/// domain with allocators, its ring (mlx5's: 16 bytes of header and 16 per SGE for each WQE) and
/// doorbell record come from the domain's allocator (NULL with `ENOMEM` when it fails).
pub(crate) fn wrap(
    context: *mut ibv_context,
    srq_context: *mut core::ffi::c_void,
    pd: *mut ibv_pd,
    emu: rdma_emu::Srq,
    attr: &mut ibv_srq_attr,
) -> *mut ibv_srq {
    if let Ok(got) = emu.query() {
        (attr.max_wr, attr.max_sge) = (got.max_wr, got.max_sge);
    }
    use super::parent::{DBR, PAGE, ParentUse, res_type, ring_bytes};
    let stride = (16 + 16 * attr.max_sge.max(1) as usize).next_power_of_two();
    let ring = ring_bytes(attr.max_wr + 1, stride);
    // SAFETY: `pd` is NULL or a live PD (the callers checked it).
    let parent_use = match unsafe { ParentUse::take(pd, &[(ring, PAGE, res_type::SRQ), DBR]) } {
        Ok(u) => u,
        Err(errno) => {
            let _ = emu.destroy();
            crate::boundary::set_errno(errno);
            return std::ptr::null_mut();
        }
    };
    // SAFETY: ibv_srq is plain data (pointers, integers, pthread objects initialised below).
    let mut srq: ibv_srq = unsafe { std::mem::zeroed() };
    srq.context = context;
    srq.handle = new_handle(context);
    srq.srq_context = srq_context;
    srq.pd = pd;
    let s = leak(ShimSrq { srq, emu, parent_use });
    // SAFETY: s is ours and not shared yet.
    unsafe {
        init_sync(&mut (*s).srq.mutex, &mut (*s).srq.cond);
        (*s).emu.set_user_data(s as usize);
    }
    s.cast()
}

const IBV_WR_TAG_ADD: u32 = 0;
const IBV_WR_TAG_DEL: u32 = 1;
const IBV_WR_TAG_SYNC: u32 = 2;
const IBV_OPS_SIGNALED: c_int = 1;
const IBV_OPS_TM_SYNC: c_int = 2;

/// The `post_srq_ops` slot (devices with tag matching): `ibv_post_srq_ops(srq, op, bad_op)`
/// runs the list operations in order, writing each added tag's handle into `op->tm.handle`;
/// the first refused sets `*bad_op` and its errno is returned (see the Rust API).
pub(crate) unsafe extern "C" fn post_srq_ops(
    srq: *mut ibv_srq,
    mut op: *mut ibv_ops_wr,
    bad_op: *mut *mut ibv_ops_wr,
) -> c_int {
    ffi!(libc::EIO, {
        let fail = |op: *mut ibv_ops_wr, errno| {
            // SAFETY: NULL or the caller's writable pointer.
            if let Some(b) = unsafe { bad_op.as_mut() } {
                *b = op;
            }
            errno
        };
        // SAFETY: NULL or a live SRQ.
        let Some(s) = (unsafe { obj::<_, ShimSrq>(srq) }) else { return fail(op, libc::EINVAL) };
        // SAFETY: each op is the caller's valid, readable and writable `ibv_ops_wr`.
        while let Some(o) = unsafe { op.as_mut() } {
            let t = &o.tm;
            let sges: Vec<rdma_emu::Sge> = if t.sg_list.is_null() || t.num_sge <= 0 {
                Vec::new()
            } else {
                // SAFETY: `num_sge` readable SGEs at `sg_list` (the verb's contract).
                unsafe { std::slice::from_raw_parts(t.sg_list, t.num_sge as usize) }
                    .iter()
                    .map(|g| rdma_emu::Sge { addr: g.addr, length: g.length, lkey: g.lkey })
                    .collect()
            };
            let kind = match o.opcode {
                IBV_WR_TAG_ADD => rdma_emu::SrqOpKind::AddTag {
                    tag: t.tag,
                    mask: t.mask,
                    recv_wr_id: t.recv_wr_id,
                    sg_list: &sges,
                },
                IBV_WR_TAG_DEL => rdma_emu::SrqOpKind::DelTag { handle: t.handle },
                IBV_WR_TAG_SYNC => rdma_emu::SrqOpKind::Sync,
                _ => return fail(op, libc::EINVAL),
            };
            let one = rdma_emu::SrqOp {
                wr_id: o.wr_id,
                kind,
                signaled: o.flags & IBV_OPS_SIGNALED != 0,
                sync: (o.flags & IBV_OPS_TM_SYNC != 0).then_some(t.unexpected_cnt),
            };
            match s.emu.post_ops(&[one]) {
                Ok(handles) => {
                    if let Some(Some(h)) = handles.first() {
                        o.tm.handle = *h;
                    }
                }
                Err((_, e)) => return fail(op, e.errno().raw()),
            }
            op = o.next;
        }
        0
    })
}

/// `ibv_modify_srq(srq, attr, mask)`: resize (`IBV_SRQ_MAX_WR`) and/or arm (`IBV_SRQ_LIMIT`).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live SRQ; `attr` NULL or valid.
        let s = match unsafe { lookup::<_, ShimSrq>(srq) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let Some(a) = (unsafe { attr.as_ref() }) else { return libc::EINVAL };
        let a = SrqAttr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit };
        s.emu.modify(&a, mask as u32).map_or_else(|e| e.errno().raw(), |()| 0)
    })
}

/// `ibv_query_srq(srq, attr)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live SRQ; `attr` NULL or writable.
        let s = match unsafe { lookup::<_, ShimSrq>(srq) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let Some(out) = (unsafe { attr.as_mut() }) else { return libc::EINVAL };
        match s.emu.query() {
            Ok(a) => {
                *out =
                    ibv_srq_attr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_destroy_srq(srq)`: `EBUSY` while QPs use it.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(srq, |s: &ShimSrq| s.emu.destroy()) } })
}

/// The `post_srq_recv` slot: `ibv_post_srq_recv(srq, wr, bad_wr)`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: a live SRQ.
        let Some(s) = (unsafe { obj::<_, ShimSrq>(srq) }) else { return libc::EINVAL };
        let (max_sge, max_wr) = s.emu.query().map_or((0, 0), |a| (a.max_sge as c_int, a.max_wr));
        // SAFETY: the application's list and bad_wr, as ibv_post_srq_recv requires.
        unsafe { super::qp::post_recv_list(wr, bad, (max_sge, max_wr), |r| s.emu.post_recv(r)) }
    })
}

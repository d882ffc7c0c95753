//! Completion channels and completion queues, including the `poll_cq` / `req_notify_cq` slots.

use core::ffi::{c_int, c_void};
use std::{os::fd::AsRawFd, ptr};

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

/// `ibv_create_comp_channel(context)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_create_comp_channel(
    c: *mut ibv_context,
) -> *mut ibv_comp_channel {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        match s.emu.create_comp_channel() {
            Ok(emu) => {
                let ch = ibv_comp_channel { context: c, fd: emu.as_raw_fd(), refcnt: 0 };
                leak(ShimChannel { ch, emu }).cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_destroy_comp_channel(channel)`: `EBUSY` while CQs use it.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_destroy_comp_channel(
    ch: *mut ibv_comp_channel,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live channel.
        let Some(s) = (unsafe { obj::<_, ShimChannel>(ch) }) else { return libc::EINVAL };
        match s.emu.destroy() {
            Ok(()) => {
                // SAFETY: destroyed; not used again.
                unsafe { free(s as *const ShimChannel) };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_create_cq(context, cqe, cq_context, channel, comp_vector)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context / channel.
        let Some(s) = (unsafe { ctx(c) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: as above.
        let channel = unsafe { obj::<_, ShimChannel>(ch) }.map(|c| &c.emu);
        if comp_vector < 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let emu = match s.emu.create_cq(cqe, channel, comp_vector as u32) {
            Ok(q) => q,
            Err(e) => return null_with(e),
        };
        // SAFETY: ibv_cq is plain data (pointers, integers, pthread objects initialised below).
        let mut cq: ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = c;
        cq.channel = ch;
        cq.cq_context = cq_context;
        cq.cqe = emu.cqe() as c_int;
        let p = leak(ShimCq { cq, emu });
        // SAFETY: p is ours and not shared yet.
        unsafe {
            init_sync(&mut (*p).cq.mutex, &mut (*p).cq.cond);
            (*p).emu.set_user_data(p as usize);
        }
        p.cast()
    })
}

/// `ibv_destroy_cq(cq)`: `EBUSY` while a QP uses it; waits for acknowledged events.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live CQ.
        let Some(s) = (unsafe { obj::<_, ShimCq>(cq) }) else { return libc::EINVAL };
        match s.emu.destroy() {
            Ok(()) => {
                // SAFETY: destroyed; not used again.
                unsafe { free(s as *const ShimCq) };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_resize_cq(cq, cqe)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live CQ; the cqe field is ours to update.
        let Some(s) = (unsafe { obj::<_, ShimCq>(cq) }) else { return libc::EINVAL };
        match s.emu.resize(cqe) {
            Ok(n) => {
                // SAFETY: `cq` is a live ShimCq; C reads `cqe` after this call returns.
                unsafe { (*cq).cqe = n as c_int };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

fn to_c(w: &rdma_emu::Wc) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status.0,
        opcode: w.opcode.0,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: w.imm_data,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// The `poll_cq` slot: `ibv_poll_cq(cq, num_entries, wc)`.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    ffi!(-1, {
        // SAFETY: a live CQ (the inline verb passes it unchecked, as every provider assumes).
        let Some(s) = (unsafe { obj::<_, ShimCq>(cq) }) else { return -1 };
        if n < 0 || (n > 0 && wc.is_null()) {
            return -1;
        }
        let mut got = 0;
        while got < n {
            let Some(w) = s.emu.poll_one() else { break };
            // SAFETY: the caller provides n writable ibv_wc entries; got < n.
            unsafe { ptr::write(wc.add(got as usize), to_c(&w)) };
            got += 1;
        }
        got
    })
}

/// The `req_notify_cq` slot: `ibv_req_notify_cq(cq, solicited_only)`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: a live CQ.
        let Some(s) = (unsafe { obj::<_, ShimCq>(cq) }) else { return libc::EINVAL };
        if s.emu.channel().is_none() {
            return libc::EINVAL;
        }
        match s.emu.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_get_cq_event(channel, cq, cq_context)`: 0, or -1 with `errno` (`EAGAIN` when the
/// channel's fd is non-blocking and nothing is pending).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live channel.
        let Some(s) = (unsafe { obj::<_, ShimChannel>(ch) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        match s.emu.get_cq_event() {
            Ok(emu_cq) => {
                let p = emu_cq.user_data() as *mut ShimCq;
                // SAFETY: user_data is the ShimCq this library made for that CQ, alive until
                // destroy, which waits for this event's ack; the out pointers were checked.
                unsafe {
                    *cq = p.cast();
                    *cq_context = (*p).cq.cq_context;
                }
                0
            }
            Err(e) => {
                set_errno(e.errno().raw());
                -1
            }
        }
    })
}

/// `ibv_ack_cq_events(cq, nevents)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    ffi!((), {
        // SAFETY: NULL or a live CQ.
        if let Some(s) = unsafe { obj::<_, ShimCq>(cq) } {
            s.emu.ack_events(n);
        }
    })
}

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
        match s.emu().create_comp_channel() {
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
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(ch, |s: &ShimChannel| s.emu.destroy()) } })
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
        let Ok(channel) = (unsafe { optional::<_, ShimChannel>(ch) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let channel = channel.map(|c| &c.emu);
        if comp_vector < 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let emu = match s.emu().create_cq(cqe, channel, comp_vector as u32) {
            Ok(q) => q,
            Err(e) => return null_with(e),
        };
        new_cq(c, ch, cq_context, emu).cast()
    })
}

/// Wraps an emulator CQ into the `ibv_cq_ex` C sees, with the extended polling functions.
fn new_cq(
    c: *mut ibv_context,
    ch: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    emu: rdma_emu::Cq,
) -> *mut ShimCq {
    if emu.context().device().profile() == rdma_emu::Profile::Full {
        super::device::fork_range_marked(); // as mlx5 marks the CQ's buffer
    }
    {
        // SAFETY: ibv_cq_ex is plain data (pointers, integers, function pointers, pthread
        // objects initialised below); all-zero is valid for each.
        let mut cq: ibv_cq_ex = unsafe { std::mem::zeroed() };
        cq.context = c;
        cq.handle = new_handle(c);
        cq.channel = ch;
        cq.cq_context = cq_context;
        cq.cqe = emu.cqe() as c_int;
        cq.start_poll = Some(start_poll);
        cq.next_poll = Some(next_poll);
        cq.end_poll = Some(end_poll);
        cq.read_opcode = Some(read_opcode);
        cq.read_vendor_err = Some(read_vendor_err);
        cq.read_byte_len = Some(read_byte_len);
        cq.read_imm_data = Some(read_imm_data);
        cq.read_qp_num = Some(read_qp_num);
        cq.read_src_qp = Some(read_src_qp);
        cq.read_wc_flags = Some(read_wc_flags);
        cq.read_slid = Some(read_slid);
        cq.read_sl = Some(read_sl);
        cq.read_dlid_path_bits = Some(read_dlid_path_bits);
        // 0 unless the CQ was created with timestamps (Wc::timestamp).
        cq.read_completion_ts = Some(read_completion_ts);
        cq.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
        cq.read_cvlan = Some(read_cvlan);
        cq.read_flow_tag = Some(read_flow_tag);
        // A field a CQ cannot be created with (create_cq_ex refuses that wc_flag); the slot
        // still answers, with 0, so that no call through it can crash.
        cq.read_tm_info = Some(read_tm_info);
        let p = leak(ShimCq { cq, emu, cur: Default::default(), parent_use: None });
        // SAFETY: p is ours and not shared yet.
        unsafe {
            init_sync(&mut (*p).cq.mutex, &mut (*p).cq.cond);
            (*p).emu.set_user_data(p as usize);
        }
        p
    }
}

/// `IBV_WC_EX_WITH_*` flags every CQ can report: byte_len, imm, qp_num, src_qp, slid, sl,
/// dlid_path_bits (no tag matching).
const STANDARD_WC_FLAGS: u64 = 0x7f;
/// `IBV_WC_EX_WITH_CVLAN` and `_FLOW_TAG`: on devices with raw packet QPs.
const RAW_WC_FLAGS: u64 = 1 << 8 | 1 << 9;
/// `IBV_WC_EX_WITH_TM_INFO`: on devices with tag matching.
const TM_WC_FLAGS: u64 = 1 << 10;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` and its `_WALLCLOCK` form: on devices with a clock.
const TIMESTAMP_WC_FLAGS: u64 = 1 << 7 | 1 << 11;
const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 2;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a hint (no locking needed) providers may ignore.
const SINGLE_THREADED: u32 = 1;
/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: the kernel's to grant; the emulator's CQs always
/// report an overrun.
const IGNORE_OVERRUN: u32 = 2;

/// The `create_cq_ex` slot: `ibv_create_cq_ex(context, cq_attr)`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context; `attr` NULL or a valid init attr.
        let (Some(s), Some(a)) = (unsafe { ctx(c) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let clock = s.emu().query_device().has_clock();
        let raw = s.emu().query_device().has_raw_packet();
        let supported = STANDARD_WC_FLAGS
            | if clock { TIMESTAMP_WC_FLAGS } else { 0 }
            | if raw { RAW_WC_FLAGS } else { 0 }
            | if s.emu().query_device().tm.max_num_tags > 0 { TM_WC_FLAGS } else { 0 };
        let rxe = s.emu().device().profile() == rdma_emu::Profile::Rxe;
        let masks = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
        let flags = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 { a.flags } else { 0 };
        // mlx5 refuses what it does not know (EINVAL) before the WC flags it lacks; rxe's
        // provider refuses those first and leaves the rest to libibverbs, which sends the
        // kernel only IGNORE_OVERRUN of the flags (refused by rxe and by the emulator, whose
        // CQs always report an overrun; SINGLE_THREADED and unknown bits go unread) and
        // reads no parent domain.
        let refused = if rxe {
            (a.wc_flags & !supported != 0
                || a.comp_mask & !masks != 0
                || flags & IGNORE_OVERRUN != 0)
                .then_some(libc::EOPNOTSUPP)
        } else if a.cqe == 0
            || a.comp_mask & !masks != 0
            || flags & !(SINGLE_THREADED | IGNORE_OVERRUN) != 0
        {
            Some(libc::EINVAL)
        } else {
            (a.wc_flags & !supported != 0 || flags & IGNORE_OVERRUN != 0)
                .then_some(libc::EOPNOTSUPP)
        };
        if let Some(errno) = refused {
            set_errno(errno);
            return ptr::null_mut();
        }
        // SAFETY: NULL or a live channel.
        let Ok(channel) = (unsafe { optional::<_, ShimChannel>(a.channel) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let channel = channel.map(|c| &c.emu);
        let options = rdma_emu::CqOptions { timestamps: a.wc_flags & TIMESTAMP_WC_FLAGS != 0 };
        // A CQ of a parent domain (as mlx5: it must be one, of this context's objects).
        let domain = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !rxe {
            // SAFETY: NULL or a live PD.
            let d = unsafe { checked::<_, ShimPd>(a.parent_domain) };
            if !d.is_some_and(|d| d.parent.is_some() && super::parent::same_file(d.pd.context, s)) {
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
            a.parent_domain
        } else {
            ptr::null_mut()
        };
        let cqe = a.cqe.min(i32::MAX as u32) as c_int;
        let emu = match s.emu().create_cq_ex(cqe, channel, a.comp_vector, options) {
            Ok(emu) => emu,
            Err(e) => return null_with(e),
        };
        // mlx5's CQ buffer: 64-byte CQEs, a power of two above the size asked for.
        use super::parent::{DBR, PAGE, ParentUse, res_type, ring_bytes};
        let ring = ring_bytes(emu.cqe() + 1, 64);
        // SAFETY: NULL or a live parent domain (checked above).
        let parent_use =
            match unsafe { ParentUse::take(domain, &[(ring, PAGE, res_type::CQ), DBR]) } {
                Ok(u) => u,
                Err(errno) => {
                    let _ = emu.destroy();
                    set_errno(errno);
                    return ptr::null_mut();
                }
            };
        let made = new_cq(c, a.channel, a.cq_context, emu);
        // SAFETY: the CQ just made, ours and not shared yet.
        unsafe { (*made).parent_use = parent_use };
        made.cast()
    })
}

/// Makes the next completion current: 0, or `ENOENT` when the CQ is empty.
fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ (start/next_poll are called on CQs this library created).
    let Some(s) = (unsafe { obj::<_, ShimCq>(cq) }) else { return libc::EINVAL };
    match s.emu.poll_one() {
        Some(w) => {
            s.cur.set(w);
            // SAFETY: `cq` is live; status and wr_id are the public fields C reads next.
            unsafe {
                (*cq).status = w.status.0;
                (*cq).wr_id = w.wr_id;
            }
            0
        }
        None => libc::ENOENT,
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, _attr: *mut c_void) -> c_int {
    ffi!(libc::EIO, { advance(cq) })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    ffi!(libc::EIO, { advance(cq) })
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// The current completion of a CQ inside a start/end poll pair.
fn cur(cq: *mut ibv_cq_ex) -> rdma_emu::Wc {
    // SAFETY: a live CQ of ours.
    unsafe { obj::<_, ShimCq>(cq) }.map(|s| s.cur.get()).unwrap_or_default()
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).opcode.0
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).imm_data
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> core::ffi::c_uint {
    cur(cq).wc_flags.bits()
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).slid as u32
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).dlid_path_bits
}
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    cur(cq).timestamp
}
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: a live CQ of ours.
    let Some(s) = (unsafe { obj::<_, ShimCq>(cq) }) else { return 0 };
    if s.emu.records_timestamps() {
        s.emu.context().clock_to_wallclock_ns(s.cur.get().timestamp)
    } else {
        0
    }
}
unsafe extern "C" fn read_flow_tag(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).flow_tag
}
unsafe extern "C" fn read_cvlan(cq: *mut ibv_cq_ex) -> u16 {
    cur(cq).cvlan
}
/// `struct ibv_wc_tm_info`: the message's tag and its TMH's `app_ctx`.
#[repr(C)]
struct WcTmInfo {
    tag: u64,
    priv_: u32,
}

unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, info: *mut c_void) {
    if !info.is_null() {
        let w = cur(cq);
        // SAFETY: the caller passes a writable struct ibv_wc_tm_info.
        unsafe { ptr::write(info as *mut WcTmInfo, WcTmInfo { tag: w.tm_tag, priv_: w.tm_priv }) };
    }
}

/// The `modify_cq` slot (`ibv_modify_cq`), filled for devices that moderate CQ events: `EINVAL`
/// for a mask of no attribute or of attributes past `IBV_CQ_ATTR_MODERATE` (as rdma-core and
/// the kernel check it) and for values past the device's `cq_mod_caps`.
pub(crate) unsafe extern "C" fn modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live CQ; `attr` NULL or readable.
        let s = match unsafe { lookup::<_, ShimCq>(cq) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let Some(a) = (unsafe { attr.as_ref() }) else { return libc::EINVAL };
        if a.attr_mask != IBV_CQ_ATTR_MODERATE {
            return libc::EINVAL;
        }
        match s.emu.moderate(a.moderate.cq_count, a.moderate.cq_period) {
            Ok(()) => 0,
            Err(e) => e.errno().raw(),
        }
    })
}

const IBV_CQ_ATTR_MODERATE: u32 = 1;

/// `ibv_destroy_cq(cq)`: `EBUSY` while a QP uses it; waits for acknowledged events.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(cq, |s: &ShimCq| s.emu.destroy()) } })
}

/// `ibv_resize_cq(cq, cqe)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live CQ; the cqe field is ours to update.
        let s = match unsafe { lookup::<_, ShimCq>(cq) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        match s.emu.resize(cqe) {
            Ok(n) => {
                // SAFETY: `cq` is a live ShimCq; C reads `cqe` after this call returns.
                unsafe { (*cq).cqe = n as c_int };
                0
            }
            Err(e) => {
                set_errno(e.errno().raw());
                e.errno().raw()
            }
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
        // rxe arms a CQ with a kernel command on its handle (mlx5 rings a doorbell).
        let rxe = s.emu.context().device().profile() == rdma_emu::Profile::Rxe;
        // SAFETY: as above.
        if rxe && unsafe { checked::<_, ShimCq>(cq) }.is_none() {
            return libc::ENOENT;
        }
        // A CQ without a channel is armed all the same on rxe and mlx5 (0): no event can come
        // of it, so nothing is armed here.
        if s.emu.channel().is_none() {
            return 0;
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

//! Queue pairs: create / modify / query / destroy, and the `post_send` / `post_recv` slots.

use core::ffi::c_int;
use std::ptr;

use rdma_emu::{
    AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpAttrMask, QpCap, QpCreateFlags, QpInitAttr, QpState,
    QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, WrOpcode,
};

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_create_qp(pd, qp_init_attr)`: writes the granted caps back into `qp_init_attr->cap`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a valid init attr.
        let Some(i) = (unsafe { init.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: forwarded pointers, checked inside.
        unsafe {
            create(
                pd,
                i.qp_context,
                i.send_cq,
                i.recv_cq,
                i.srq,
                &mut i.cap,
                i.qp_type,
                i.sq_sig_all,
                ExOptions::default(),
            )
        }
    })
}

/// `ibv_create_qp_ex` comp_mask bits and send ops the emulator takes.
const IBV_QP_INIT_ATTR_PD: u32 = 1;
const IBV_QP_INIT_ATTR_XRCD: u32 = 2;
const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 4;
const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 8;
const IBV_QP_INIT_ATTR_IND_TABLE: u32 = 16;
const IBV_QP_INIT_ATTR_RX_HASH: u32 = 32;
const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 64;
/// `IBV_QP_EX_WITH_FLUSH` (rdma-core 45 and later).
const IBV_QP_EX_WITH_FLUSH: u64 = 1 << 11;
/// The `IBV_QP_EX_WITH_*` send ops a QP type takes (rxe's provider's table; XRC_SEND as RC):
/// RC every op through SEND_WITH_INV (0x3ff); UC WRITE (with imm), SEND (with imm), BIND_MW,
/// SEND_WITH_INV; UD SEND (with imm). Others are `EOPNOTSUPP`.
fn supported_send_ops(qp_type: u32) -> u64 {
    match QpType(qp_type) {
        // Bits 0..9, and ATOMIC_WRITE (bit 12), which rxe's provider takes too; FLUSH
        // (bit 11) where the device has it (`create_qp_ex` checks).
        QpType::RC | QpType::XRC_SEND => 0x3ff | IBV_QP_EX_WITH_FLUSH | 1 << 12,
        QpType::UC => 0x30f,
        QpType::UD => 0x00c,
        // SEND and TSO.
        QpType::RAW_PACKET => 1 << 2 | 1 << 10,
        _ => 0,
    }
}

/// The `create_qp_ex` slot: `ibv_create_qp_ex(context, qp_init_attr_ex)`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    c: *mut ibv_context,
    init: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a valid init attr.
        let Some(i) = (unsafe { init.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: NULL or a live context.
        let raw = unsafe { ctx(c) }.is_some_and(|s| s.emu().query_device().has_raw_packet());
        let mut allowed = IBV_QP_INIT_ATTR_PD
            | IBV_QP_INIT_ATTR_XRCD
            | IBV_QP_INIT_ATTR_CREATE_FLAGS
            | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if raw {
            allowed |= IBV_QP_INIT_ATTR_MAX_TSO_HEADER
                | IBV_QP_INIT_ATTR_IND_TABLE
                | IBV_QP_INIT_ATTR_RX_HASH;
        }
        let needed = if i.qp_type == QpType::XRC_RECV.0 {
            IBV_QP_INIT_ATTR_XRCD
        } else {
            IBV_QP_INIT_ATTR_PD
        };
        if i.comp_mask & needed == 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let ops =
            if i.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 { i.send_ops_flags } else { 0 };
        let flags =
            if i.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 { i.create_flags } else { 0 };
        let create_flags = QpCreateFlags::from_bits(flags);
        // SAFETY: as above.
        let flush = unsafe { ctx(c) }.is_some_and(|s| s.emu().query_device().flush);
        let ops_known = if flush { !0 } else { !IBV_QP_EX_WITH_FLUSH };
        if i.comp_mask & !allowed != 0
            || ops & !ops_known != 0
            || create_flags.is_none()
            || ops & !supported_send_ops(i.qp_type) != 0
        {
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        let extended = i.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        let rss = IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
        if i.comp_mask & rss != 0 {
            if i.comp_mask & rss != rss || flags != 0 {
                // An RSS QP needs both the table and the hash, and takes no create flags.
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
            // SAFETY: forwarded pointers, checked inside.
            return unsafe { create_rss(i) };
        }
        let tso = if i.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 {
            u32::from(i.max_tso_header)
        } else {
            0
        };
        if i.qp_type == QpType::XRC_RECV.0 {
            if flags != 0 {
                set_errno(libc::EOPNOTSUPP); // receive offloads are for raw packet QPs
                return ptr::null_mut();
            }
            // SAFETY: NULL or an XRC domain of this library.
            return unsafe { super::xrc::create_recv_qp(c, i.xrcd, i.qp_context, extended) };
        }
        // SAFETY: forwarded pointers, checked inside.
        unsafe {
            create(
                i.pd,
                i.qp_context,
                i.send_cq,
                i.recv_cq,
                i.srq,
                &mut i.cap,
                i.qp_type,
                i.sq_sig_all,
                ExOptions {
                    max_tso_header: tso,
                    create_flags: create_flags.unwrap_or_default(),
                    extended,
                },
            )
        }
    })
}

/// An RSS QP (`ibv_create_qp_ex` with an indirection table and a hash): no CQs, no queues,
/// `qp_num` 0 as mlx5 reports it.
///
/// # Safety
/// `i.pd`, `i.rwq_ind_tbl` are NULL or objects of this library; `rx_hash_key` points at
/// `rx_hash_key_len` readable bytes.
unsafe fn create_rss(i: &ibv_qp_init_attr_ex) -> *mut ibv_qp {
    // SAFETY: NULL or live objects (checked against the registry).
    let (Some(p), Some(t)) = (unsafe { obj::<_, ShimPd>(i.pd) }, unsafe {
        obj::<_, super::wq::ShimIndTable>(i.rwq_ind_tbl)
    }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let h = &i.rx_hash_conf;
    let key: &[u8] = if h.rx_hash_key.is_null() {
        &[]
    } else {
        // SAFETY: the application's key of rx_hash_key_len bytes.
        unsafe { std::slice::from_raw_parts(h.rx_hash_key, h.rx_hash_key_len as usize) }
    };
    let caps = i.cap.max_send_wr | i.cap.max_recv_wr | i.cap.max_send_sge | i.cap.max_recv_sge;
    if i.qp_type != QpType::RAW_PACKET.0
        || caps | i.cap.max_inline_data != 0
        || !i.srq.is_null()
        || !i.recv_cq.is_null()
    {
        set_errno(libc::EINVAL); // mlx5: an RSS QP is a raw packet QP with nothing of its own
        return ptr::null_mut();
    }
    let conf = rdma_emu::RssConf {
        table: &t.emu,
        function: h.rx_hash_function,
        key,
        fields: h.rx_hash_fields_mask,
    };
    let emu = match p.emu.create_rss_qp(&conf) {
        Ok(q) => q,
        Err(e) => return null_with(e),
    };
    let parts = QpParts {
        context: p.pd.context,
        qp_context: i.qp_context,
        pd: i.pd,
        send_cq: ptr::null_mut(),
        recv_cq: ptr::null_mut(),
        srq: ptr::null_mut(),
    };
    let qp = wrap(parts, emu, false);
    // SAFETY: just made, not shared yet.
    unsafe { (*qp).qp_num = 0 };
    qp
}

/// What `ibv_create_qp_ex` adds to `ibv_create_qp`.
#[derive(Debug, Default, Clone, Copy)]
struct ExOptions {
    max_tso_header: u32,
    create_flags: QpCreateFlags,
    /// Made by `ibv_create_qp_ex` with send ops flags: the `ibv_qp_ex` slots are filled.
    extended: bool,
}

#[allow(clippy::too_many_arguments)]
unsafe fn create(
    pd: *mut ibv_pd,
    qp_context: *mut core::ffi::c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut core::ffi::c_void,
    cap: &mut ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: c_int,
    ex: ExOptions,
) -> *mut ibv_qp {
    // An XRC initiator has no receive side: its receive CQ and SRQ are ignored (the kernel
    // uses the send CQ), so they may be NULL.
    let xrc_send = QpType(qp_type) == QpType::XRC_SEND;
    let (recv_cq, srq) = if xrc_send { (send_cq, ptr::null_mut()) } else { (recv_cq, srq) };
    // SAFETY: NULL or a live PD and CQs (the verbs contract).
    let (Some(p), Some(scq), Some(rcq)) =
        (unsafe { obj::<_, ShimPd>(pd) }, unsafe { obj::<_, ShimCq>(send_cq) }, unsafe {
            obj::<_, ShimCq>(recv_cq)
        })
    else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    // SAFETY: as above; the kernel's create finds no object under a changed handle.
    let stale = unsafe {
        checked::<_, ShimPd>(pd).is_none()
            || checked::<_, ShimCq>(send_cq).is_none()
            || checked::<_, ShimCq>(recv_cq).is_none()
            || (!srq.is_null()
                && obj::<_, ShimSrq>(srq).is_some()
                && checked::<_, ShimSrq>(srq).is_none())
    };
    if stale {
        set_errno(libc::ENOENT);
        return ptr::null_mut();
    }
    if QpType(qp_type) == QpType::XRC_RECV {
        set_errno(libc::EINVAL); // made in an XRC domain (IBV_QP_INIT_ATTR_XRCD)
        return ptr::null_mut();
    }
    // SAFETY: NULL or a live SRQ.
    let Ok(srq_obj) = (unsafe { optional::<_, ShimSrq>(srq) }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let attr = QpInitAttr {
        qp_type: QpType(qp_type),
        send_cq: &scq.emu,
        recv_cq: &rcq.emu,
        cap: QpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        },
        sq_sig_all: sq_sig_all != 0,
        srq: srq_obj.map(|s| &s.emu),
        max_tso_header: ex.max_tso_header,
        create_flags: ex.create_flags,
    };
    let emu = match p.emu.create_qp(&attr) {
        Ok(q) => q,
        Err(e) => return null_with(e),
    };
    let granted = emu.cap();
    *cap = cap_to_c(&granted);
    // Through a parent domain with allocators: the buffer mlx5 would hold the QP's rings in
    // (64-byte send WQEs, 16 bytes per receive SGE; no receive ring on an SRQ) and its
    // doorbell record.
    use super::parent::{DBR, PAGE, ParentUse, res_type, ring_bytes};
    let rq = if srq_obj.is_none() {
        ring_bytes(granted.max_recv_wr, 16 * granted.max_recv_sge.max(1) as usize)
    } else {
        0
    };
    let ring = ring_bytes(granted.max_send_wr, 64) + rq;
    // SAFETY: `pd` is a live PD (above).
    let parent_use = match unsafe { ParentUse::take(pd, &[(ring, PAGE, res_type::QP), DBR]) } {
        Ok(u) => u,
        Err(errno) => {
            let _ = emu.destroy();
            set_errno(errno);
            return ptr::null_mut();
        }
    };
    let recv_cq = if xrc_send { ptr::null_mut() } else { recv_cq };
    let parts = QpParts { context: p.pd.context, qp_context, pd, send_cq, recv_cq, srq };
    let made = wrap(parts, emu, ex.extended);
    // SAFETY: the QP just made, ours and not shared yet.
    unsafe { (*made.cast::<ShimQp>()).parent_use = parent_use };
    made
}

/// The C-visible objects an `ibv_qp` names.
pub(crate) struct QpParts {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut core::ffi::c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut core::ffi::c_void,
}

/// Hands a new emulator QP to C as an `ibv_qp_ex` (with the `ibv_wr_*` table if `extended`).
pub(crate) fn wrap(c: QpParts, emu: rdma_emu::Qp, extended: bool) -> *mut ibv_qp {
    if emu.pd().context().device().profile() == rdma_emu::Profile::Full {
        super::device::fork_range_marked(); // as mlx5 marks the QP's buffer
    }
    // SAFETY: ibv_qp_ex is plain data (pointers, integers, function pointers, pthread objects
    // initialised below); all-zero is valid for each.
    let mut qp: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut qp.qp_base;
    b.context = c.context;
    b.handle = new_handle(c.context);
    b.qp_context = c.qp_context;
    b.pd = c.pd;
    b.send_cq = c.send_cq;
    b.recv_cq = c.recv_cq;
    b.srq = c.srq;
    b.qp_num = emu.qp_num();
    b.state = QpState::RESET.0;
    b.qp_type = emu.qp_type().0;
    if extended {
        super::wr::fill(&mut qp);
    }
    // SAFETY: NULL or a live context.
    let flush = unsafe { ctx(c.context) }.is_some_and(|s| s.emu().query_device().flush);
    let wr_flush = (extended && flush).then_some(super::wr::wr_flush as super::wr::WrFlush);
    let s =
        leak(ShimQp { qp, wr_flush, emu, extended, batch: Default::default(), parent_use: None });
    // SAFETY: s is ours and not shared yet.
    unsafe {
        init_sync(&mut (*s).qp.qp_base.mutex, &mut (*s).qp.qp_base.cond);
        // Events name the QP by its first handle (ibv_open_qp handles share the QP).
        if (*s).emu.user_data() == 0 {
            (*s).emu.set_user_data(s as usize);
        }
    }
    s.cast()
}

/// `ibv_qp_to_qp_ex(qp)`: the extended QP, or NULL unless it was created by
/// `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (as libibverbs).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: NULL or a live QP.
    match unsafe { obj::<_, ShimQp>(qp) } {
        Some(s) if s.extended => qp.cast(),
        _ => ptr::null_mut(),
    }
}

/// `ibv_destroy_qp(qp)`: waits for the QP's acknowledged async events.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(qp, |s: &ShimQp| s.emu.destroy()) } })
}

pub(crate) fn ah_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: Gid(a.grh.dgid.raw),
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

pub(crate) fn ah_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global as u8,
        port_num: a.port_num,
    }
}

/// Builds `$ty` from `$a` (a `QpAttr` or an `ibv_qp_attr`): the fields both spell alike are
/// copied, `$conv` gives the ones that need a conversion.
macro_rules! qp_attr_like {
    ($ty:ident, $a:ident, { $($conv:tt)* }) => {
        $ty {
            $($conv)*
            path_mig_state: $a.path_mig_state,
            qkey: $a.qkey,
            rq_psn: $a.rq_psn,
            sq_psn: $a.sq_psn,
            dest_qp_num: $a.dest_qp_num,
            pkey_index: $a.pkey_index,
            alt_pkey_index: $a.alt_pkey_index,
            en_sqd_async_notify: $a.en_sqd_async_notify,
            sq_draining: $a.sq_draining,
            max_rd_atomic: $a.max_rd_atomic,
            max_dest_rd_atomic: $a.max_dest_rd_atomic,
            min_rnr_timer: $a.min_rnr_timer,
            port_num: $a.port_num,
            timeout: $a.timeout,
            retry_cnt: $a.retry_cnt,
            rnr_retry: $a.rnr_retry,
            alt_port_num: $a.alt_port_num,
            alt_timeout: $a.alt_timeout,
            rate_limit: $a.rate_limit,
        }
    };
}

fn qp_attr_from_c(a: &ibv_qp_attr) -> QpAttr {
    qp_attr_like!(QpAttr, a, {
        qp_state: QpState(a.qp_state),
        cur_qp_state: QpState(a.cur_qp_state),
        path_mtu: Mtu(a.path_mtu),
        qp_access_flags: AccessFlags::from_bits_retain(a.qp_access_flags),
        cap: QpCap::default(),
        ah_attr: ah_from_c(&a.ah_attr),
        alt_ah_attr: ah_from_c(&a.alt_ah_attr),
    })
}

pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    qp_attr_like!(ibv_qp_attr, a, {
        qp_state: a.qp_state.0,
        cur_qp_state: a.cur_qp_state.0,
        path_mtu: a.path_mtu.0,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: cap_to_c(&a.cap),
        ah_attr: ah_to_c(&a.ah_attr),
        alt_ah_attr: ah_to_c(&a.alt_ah_attr),
    })
}

/// `ibv_modify_qp(qp, attr, attr_mask)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_modify_qp(
    qp: *mut ibv_qp,
    a: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; `a` NULL or a valid attr.
        let s = match unsafe { lookup::<_, ShimQp>(qp) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let Some(a) = (unsafe { a.as_ref() }) else { return libc::EINVAL };
        let attr = qp_attr_from_c(a);
        let mask = QpAttrMask::from_bits_retain(mask as u32);
        match s.emu.modify(&attr, mask) {
            Ok(()) => {
                if mask.contains(QpAttrMask::STATE) {
                    // SAFETY: `qp` is a live ShimQp; `state` is the cached state C reads.
                    unsafe { (*qp).state = a.qp_state };
                }
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_query_qp(qp, attr, attr_mask, init_attr)`: fills every attribute.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_qp(
    qp: *mut ibv_qp,
    out: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; out pointers NULL or writable.
        let s = match unsafe { lookup::<_, ShimQp>(qp) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let (Some(out), Some(init)) = (unsafe { out.as_mut() }, unsafe { init.as_mut() }) else {
            return libc::EINVAL;
        };
        let a = match s.emu.query() {
            Ok(a) => a,
            Err(e) => return e.errno().raw(),
        };
        *out = qp_attr_to_c(&a);
        let b = &s.qp.qp_base;
        init.qp_context = b.qp_context;
        init.send_cq = b.send_cq;
        init.recv_cq = b.recv_cq;
        init.srq = b.srq;
        init.cap = cap_to_c(&a.cap);
        init.qp_type = b.qp_type;
        init.sq_sig_all = s.emu.sq_sig_all() as c_int;
        0
    })
}

/// Reads a C SGE list.
///
/// # Safety
/// `sg` points to `n` readable SGEs (or `n` is 0).
pub(crate) unsafe fn sges<'a>(sg: *const ibv_sge, n: usize) -> &'a [Sge] {
    if n == 0 || sg.is_null() {
        return &[];
    }
    const _: () = assert!(size_of::<Sge>() == 16 && std::mem::offset_of!(Sge, lkey) == 12);
    // SAFETY: ibv_sge and Sge have the same layout (u64, u32, u32; checked by the layout test
    // for ibv_sge and by the assertion above for Sge); the caller guarantees n readable entries.
    unsafe { std::slice::from_raw_parts(sg as *const Sge, n) }
}

/// A UD destination: `None` when `ah` is not a live address handle of this library.
///
/// # Safety
/// `ah` is NULL or a pointer the application got from this library.
pub(crate) unsafe fn ud_dest<'a>(
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) -> Option<UdDest<'a>> {
    // SAFETY: forwarded contract.
    let a = unsafe { obj::<_, ShimAh>(ah) }?;
    Some(UdDest { ah: &a.emu, remote_qpn, remote_qkey })
}

/// The `post_send` slot: `ibv_post_send(qp, wr, bad_wr)`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: a live QP.
        let Some(s) = (unsafe { obj::<_, ShimQp>(qp) }) else { return libc::EINVAL };
        // SAFETY: NULL or the application's valid ibv_send_wr.
        if let Some(w) = unsafe { wr.as_ref() }
            && w.next.is_null()
            // SAFETY: as above.
            && let Some(ewr) = unsafe { plain_send(s, w) }
        {
            return match s.emu.post_send(&ewr) {
                Ok(()) => 0,
                // SAFETY: bad_wr is NULL or writable, as ibv_post_send requires.
                Err(e) => unsafe { refused(bad, wr, e.errno().raw()) },
            };
        }
        // SAFETY: forwarded contract.
        unsafe { post_send_list(s, wr, bad) }
    })
}

/// The request of a list of one that the commonest loops post (a SEND, WRITE or READ, with or
/// without immediate, of a gather list the QP takes, on an RC or UC QP), read without the
/// steps [`post_send_list`] takes for the other kinds; `None` for any other request, which
/// that function posts (and fails) as any list.
///
/// # Safety
/// `w` is the application's valid `ibv_send_wr`, its `sg_list` readable for `num_sge` entries.
#[inline(always)]
unsafe fn plain_send<'a>(s: &ShimQp, w: &'a ibv_send_wr) -> Option<SendWr<'a>> {
    let flags = SendFlags::from_bits_retain(w.send_flags);
    let cap = s.emu.cap();
    let plain = matches!(
        WrOpcode(w.opcode),
        WrOpcode::RDMA_WRITE
            | WrOpcode::RDMA_WRITE_WITH_IMM
            | WrOpcode::SEND
            | WrOpcode::SEND_WITH_IMM
            | WrOpcode::RDMA_READ
    );
    if !plain
        || flags.contains(SendFlags::INLINE)
        || !matches!(s.emu.qp_type(), QpType::RC | QpType::UC)
        || cap.max_send_wr == 0
        || !(0..=cap.max_send_sge as c_int).contains(&w.num_sge)
    {
        return None;
    }
    Some(SendWr {
        wr_id: w.wr_id,
        opcode: WrOpcode(w.opcode),
        send_flags: flags,
        // SAFETY: num_sge readable entries (the verbs contract), bounded above.
        sg_list: unsafe { sges(w.sg_list, w.num_sge as usize) },
        inline_data: &[],
        imm_data: w.imm_data,
        remote_addr: w.remote_addr(),
        rkey: w.rdma_rkey(),
        compare_add: 0,
        swap: 0,
        ud: None,
        bind: None,
        invalidate_rkey: w.invalidate_rkey(),
        xrc_remote_srqn: w.qp_type,
        tso: None,
        flush: None,
    })
}

/// Posts the application's list of send requests one by one: on the first failure `*bad`
/// (when non-NULL) names the failing request and its errno is returned; the requests before
/// it stay posted.
///
/// # Safety
/// `wr` is NULL or a valid `ibv_send_wr` list; `bad` is NULL or writable.
#[inline(never)]
unsafe fn post_send_list(
    s: &ShimQp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let max_sge = s.emu.cap().max_send_sge as c_int;
    // No completion can be polled while this call runs, so a list longer than the send
    // queue (or one whose `next` loops back) finds it full: ENOMEM, as on an HCA.
    let (max_wr, mut posted) = (s.emu.cap().max_send_wr, 0u32);
    let mut inline_buf = Vec::new();
    // SAFETY: `bad` is NULL or writable (the caller's promise).
    let fail = |w: *mut ibv_send_wr, e: c_int| unsafe { refused(bad, w, e) };
    while !wr.is_null() {
        // SAFETY: each element of the application's list is a valid ibv_send_wr.
        let w = unsafe { &*wr };
        posted += 1;
        if posted > max_wr {
            return fail(wr, libc::ENOMEM);
        }
        if w.num_sge < 0 || w.num_sge > max_sge {
            return fail(wr, libc::EINVAL);
        }
        // SAFETY: num_sge readable entries (the verbs contract), bounded above.
        let sg = unsafe { sges(w.sg_list, w.num_sge as usize) };
        let flags = SendFlags::from_bits_retain(w.send_flags);
        let opcode = WrOpcode(w.opcode);
        let atomic =
            matches!(opcode, WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD);
        inline_buf.clear();
        if flags.contains(SendFlags::INLINE) {
            let total: u64 = sg.iter().map(|e| e.length as u64).sum();
            if total > s.emu.cap().max_inline_data as u64 {
                return fail(wr, libc::EINVAL);
            }
            for e in sg {
                // SAFETY: with IBV_SEND_INLINE the application promises each SGE's
                // addr..addr+length is readable now; no lkey is involved.
                let bytes =
                    unsafe { std::slice::from_raw_parts(e.addr as *const u8, e.length as usize) };
                inline_buf.extend_from_slice(bytes);
            }
        }
        let ah = if s.emu.qp_type() == QpType::UD {
            // SAFETY: for UD the application sets wr.ud.ah to one of its address handles.
            match unsafe { ud_dest(w.ud_ah(), w.ud_remote_qpn(), w.ud_remote_qkey()) } {
                Some(d) => Some(d),
                None => return fail(wr, libc::EINVAL),
            }
        } else {
            None
        };
        let bind = if opcode == WrOpcode::BIND_MW {
            // SAFETY: for BIND_MW the application sets bind_mw.mw and bind_info.mr to its
            // own objects (checked against the registry).
            match unsafe {
                super::mw::bind_request(w.bind_mw_mw(), w.bind_mw_rkey(), &w.bind_mw_info())
            } {
                Some(b) => Some(b),
                None => return fail(wr, libc::EINVAL),
            }
        } else {
            None
        };
        let (hdr, hdr_sz, mss) = w.tso();
        let tso = if opcode == WrOpcode::TSO && (!hdr.is_null() || hdr_sz == 0) {
            // SAFETY: for TSO the application points wr.tso.hdr at hdr_sz readable bytes.
            let hdr = unsafe { std::slice::from_raw_parts(hdr, hdr_sz as usize) };
            Some(rdma_emu::Tso { hdr, mss })
        } else {
            None
        };
        let ewr = SendWr {
            wr_id: w.wr_id,
            opcode,
            send_flags: flags,
            sg_list: sg,
            inline_data: &inline_buf,
            imm_data: w.imm_data,
            remote_addr: w.remote_addr(),
            rkey: if atomic { w.atomic_rkey() } else { w.rdma_rkey() },
            compare_add: w.compare_add(),
            swap: w.swap(),
            ud: ah,
            bind,
            invalidate_rkey: w.invalidate_rkey(),
            xrc_remote_srqn: w.qp_type,
            tso,
            // `struct ibv_send_wr` has no FLUSH fields: only `ibv_wr_flush` makes one.
            flush: None,
        };
        if let Err(e) = s.emu.post_send(&ewr) {
            return fail(wr, e.errno().raw());
        }
        wr = w.next;
    }
    0
}

/// A post that failed at `wr`: names it in the application's `bad_wr` (when non-NULL, as
/// libibverbs' callers may pass NULL) and returns `errno`.
///
/// # Safety
/// `bad` is NULL or writable.
unsafe fn refused<W>(bad: *mut *mut W, wr: *mut W, errno: c_int) -> c_int {
    if !bad.is_null() {
        // SAFETY: writable when non-NULL (the caller's promise).
        unsafe { *bad = wr };
    }
    errno
}

/// The `post_recv` slot: `ibv_post_recv(qp, wr, bad_wr)`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: a live QP.
        let Some(s) = (unsafe { obj::<_, ShimQp>(qp) }) else { return libc::EINVAL };
        let (max_sge, max_wr) = (s.emu.cap().max_recv_sge as c_int, s.emu.cap().max_recv_wr);
        // SAFETY: NULL or the application's valid ibv_recv_wr.
        if let Some(w) = unsafe { wr.as_ref() }
            && w.next.is_null()
            && max_wr > 0
            && (0..=max_sge).contains(&w.num_sge)
        {
            // The commonest, a list of one, without the list's steps.
            // SAFETY: num_sge readable entries (the verbs contract), bounded above.
            let sg_list = unsafe { sges(w.sg_list, w.num_sge as usize) };
            let r = RecvWr { wr_id: w.wr_id, sg_list };
            return match s.emu.post_recv(&r) {
                Ok(()) => 0,
                // SAFETY: bad_wr is NULL or writable, as ibv_post_recv requires.
                Err(e) => unsafe { refused(bad, wr, e.errno().raw()) },
            };
        }
        // SAFETY: the application's list and bad_wr, as ibv_post_recv requires.
        unsafe { post_recv_list(wr, bad, (max_sge, max_wr), |r| s.emu.post_recv(r)) }
    })
}

/// Posts an application's list of receive requests one by one with `post` (the QP's or the
/// SRQ's): on the first failure `*bad` (when non-NULL) names the failing request and its
/// errno is returned; the requests before it stay posted. A list longer than the queue
/// (`max_wr`) cannot all be posted before its first is consumed: `ENOMEM` at the first that
/// finds no room, which also ends a list whose `next` loops back.
///
/// # Safety
/// `wr` is NULL or a valid `ibv_recv_wr` list; `bad` is NULL or writable.
pub(crate) unsafe fn post_recv_list(
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    (max_sge, max_wr): (c_int, u32),
    mut post: impl FnMut(&RecvWr<'_>) -> rdma_emu::Result<()>,
) -> c_int {
    let mut posted = 0u32;
    while !wr.is_null() {
        // SAFETY: each element of the application's list is a valid ibv_recv_wr.
        let w = unsafe { &*wr };
        posted += 1;
        let res = if posted > max_wr && max_wr > 0 {
            Err(libc::ENOMEM)
        } else if w.num_sge < 0 || w.num_sge > max_sge {
            Err(libc::EINVAL)
        } else {
            // SAFETY: num_sge readable entries, bounded above.
            let sg = unsafe { sges(w.sg_list, w.num_sge as usize) };
            post(&RecvWr { wr_id: w.wr_id, sg_list: sg }).map_err(|e| e.errno().raw())
        };
        if let Err(e) = res {
            // SAFETY: the caller's promise on `bad`.
            return unsafe { refused(bad, wr, e) };
        }
        wr = w.next;
    }
    0
}

/// `ibv_create_ah(pd, attr)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_create_ah(
    pd: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live PD; `attr` NULL or a valid attr.
        let (Some(p), Some(a)) = (unsafe { obj::<_, ShimPd>(pd) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // rxe makes every AH in the kernel (which looks the PD up by handle), mlx5 those on
        // RoCE ports; mlx5's AHs on InfiniBand live in user space alone, with handle 0.
        let ctx = p.emu.context();
        let roce = ctx
            .query_port(a.port_num)
            .is_ok_and(|pa| pa.link_layer == rdma_emu::LinkLayer::ETHERNET);
        let kernel = roce || ctx.device().profile() == rdma_emu::Profile::Rxe;
        // SAFETY: as above.
        if kernel && unsafe { checked::<_, ShimPd>(pd) }.is_none() {
            set_errno(libc::ENOENT);
            return ptr::null_mut();
        }
        match p.emu.create_ah(&ah_from_c(a)) {
            Ok(emu) => {
                let handle = if kernel { new_handle(p.pd.context) } else { 0 };
                leak(ShimAh { ah: ibv_ah { context: p.pd.context, pd, handle }, emu }).cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_init_ah_from_wc(context, port_num, wc, grh, ah_attr)`: the address that answers the
/// sender of a received UD completion. With `IBV_WC_GRH`, as libibverbs reads the 40 bytes:
/// an IPv6 header or IB GRH (version 6, unless a valid IPv4 header follows at byte 20) gives
/// its source GID as the destination and its destination GID, of the GID type its next header
/// says (UDP: RoCE v2, 0x1B: IB or RoCE v1), names our source GID index; an IPv4 header gives
/// the mapped addresses, RoCE v2. A multicast destination: `EINVAL` (no point looking it up);
/// no such GID in our table: `ENOENT`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_init_ah_from_wc(
    c: *mut ibv_context,
    port: u8,
    wc: *const ibv_wc,
    grh: *const u8,
    out: *mut ibv_ah_attr,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context; `wc` and `out` NULL or valid.
        let (Some(s), Some(wc), Some(out)) =
            (unsafe { ctx(c) }, unsafe { wc.as_ref() }, unsafe { out.as_mut() })
        else {
            set_errno(libc::EINVAL);
            return -1;
        };
        // SAFETY: ibv_ah_attr is plain data; all-zero is valid.
        *out = unsafe { std::mem::zeroed() };
        out.dlid = wc.slid;
        out.sl = wc.sl;
        out.src_path_bits = wc.dlid_path_bits;
        out.port_num = port;
        if wc.wc_flags & rdma_emu::WcFlags::GRH.bits() != 0 {
            if grh.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: with IBV_WC_GRH the application passes the 40 bytes the datagram began with.
            let g: &[u8; 40] = unsafe { &*grh.cast() };
            let Some(h) = ReceivedHeader::parse(g) else {
                set_errno(libc::EPROTONOSUPPORT);
                return -1;
            };
            if h.dgid[0] == 0xff || h.dgid[..12] == MAPPED_PREFIX && h.dgid[12] >> 4 == 0xe {
                set_errno(libc::EINVAL);
                return -1;
            }
            let dev = s.emu().device();
            let ours = |e: &rdma_emu::GidEntry| {
                e.gid.0 == h.dgid && (e.gid_type == rdma_emu::GidType::ROCE_V2) == h.roce_v2
            };
            let table = dev.gid_table(port).unwrap_or_default();
            let Some(index) = table.iter().find(|e| ours(e)).map(|e| e.index) else {
                set_errno(libc::ENOENT);
                return -1;
            };
            out.is_global = 1;
            out.grh.dgid = ibv_gid { raw: h.sgid };
            out.grh.sgid_index = index as u8;
            out.grh.flow_label = h.flow_label;
            out.grh.traffic_class = h.traffic_class;
            out.grh.hop_limit = h.hop_limit;
        }
        0
    })
}

/// `::ffff:0:0/96`, the IPv4-mapped GIDs.
const MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// What the 40 bytes before a UD datagram say about its path.
struct ReceivedHeader {
    sgid: [u8; 16],
    dgid: [u8; 16],
    /// The GIDs are RoCE v2 ones (else IB or RoCE v1).
    roce_v2: bool,
    flow_label: u32,
    traffic_class: u8,
    hop_limit: u8,
}

impl ReceivedHeader {
    /// An IPv4 header at byte 20 is believed when the first word is not IPv6's, or when its
    /// length is 5 words and its checksum holds; otherwise the bytes are an IPv6 header or IB
    /// GRH. `None` for neither.
    fn parse(g: &[u8; 40]) -> Option<ReceivedHeader> {
        let word0 = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        let ip4 = &g[20..];
        let ipv4 = if word0 >> 28 != 6 {
            if ip4[0] >> 4 != 4 {
                return None;
            }
            true
        } else {
            ip4[0] & 0xf == 5 && ipv4_checksum_holds(ip4)
        };
        let mapped = |a: &[u8]| {
            let mut gid = [0; 16];
            gid[..12].copy_from_slice(&MAPPED_PREFIX);
            gid[12..].copy_from_slice(a);
            gid
        };
        if ipv4 {
            return Some(ReceivedHeader {
                sgid: mapped(&ip4[12..16]),
                dgid: mapped(&ip4[16..20]),
                roce_v2: true,
                flow_label: word0 & 0xf_ffff,
                traffic_class: ip4[1],
                hop_limit: ip4[8],
            });
        }
        let roce_v2 = match g[6] {
            n if n == libc::IPPROTO_UDP as u8 => true,
            0x1b => false,
            _ => return None,
        };
        Some(ReceivedHeader {
            sgid: g[8..24].try_into().expect("16 bytes"),
            dgid: g[24..40].try_into().expect("16 bytes"),
            roce_v2,
            flow_label: word0 & 0xf_ffff,
            traffic_class: (word0 >> 20) as u8,
            hop_limit: g[7],
        })
    }
}

/// Whether the 20-byte IPv4 header `h` carries its own checksum.
fn ipv4_checksum_holds(h: &[u8]) -> bool {
    let mut sum: u32 = h[..20]
        .chunks(2)
        .enumerate()
        .filter(|&(i, _)| i != 5)
        .map(|(_, w)| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum();
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16) == u16::from_be_bytes([h[10], h[11]])
}

/// `ibv_create_ah_from_wc(pd, wc, grh, port_num)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *const ibv_wc,
    grh: *const u8,
    port: u8,
) -> *mut ibv_ah {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live PD.
        let Some(p) = (unsafe { obj::<_, ShimPd>(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: ibv_ah_attr is plain data; the other pointers are forwarded.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: forwarded pointers, checked inside.
        if unsafe { rdma_emu_shim__ibv_init_ah_from_wc(p.pd.context, port, wc, grh, &mut attr) }
            != 0
        {
            return ptr::null_mut();
        }
        // SAFETY: forwarded.
        unsafe { rdma_emu_shim__ibv_create_ah(pd, &mut attr) }
    })
}

/// `ibv_destroy_ah(ah)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(ah, |s: &ShimAh| s.emu.destroy()) } })
}

/// `ibv_query_qp_data_in_order(qp, op, flags)`: 0, no in-order placement promise (what rxe
/// reports; the flag is an optimisation hint, so 0 is always correct).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: u32,
    _flags: u32,
) -> c_int {
    0
}

/// `ibv_set_ece(qp, ece)`: 0, or the errno (also left in `errno`, as rdma-core does).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_set_ece(
    qp: *mut ibv_qp,
    ece: *mut ibv_ece,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; `ece` NULL or readable.
        let (Some(s), Some(e)) = (unsafe { obj::<_, ShimQp>(qp) }, unsafe { ece.as_ref() }) else {
            set_errno(libc::EINVAL);
            return libc::EINVAL;
        };
        let ece =
            rdma_emu::Ece { vendor_id: e.vendor_id, options: e.options, comp_mask: e.comp_mask };
        match s.emu.set_ece(&ece) {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e.errno().raw());
                e.errno().raw()
            }
        }
    })
}

/// `ibv_query_ece(qp, ece)`: 0 with the options in force, or the errno.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_ece(
    qp: *mut ibv_qp,
    ece: *mut ibv_ece,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; `ece` NULL or writable.
        let (Some(s), Some(out)) = (unsafe { obj::<_, ShimQp>(qp) }, unsafe { ece.as_mut() })
        else {
            return libc::EINVAL;
        };
        match s.emu.query_ece() {
            Ok(e) => {
                *out =
                    ibv_ece { vendor_id: e.vendor_id, options: e.options, comp_mask: e.comp_mask };
                0
            }
            Err(e) => e.errno().raw(),
        }
    })
}

/// `ibv_attach_mcast(qp, gid, lid)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; `gid` NULL or readable.
        let s = match unsafe { lookup::<_, ShimQp>(qp) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let Some(g) = (unsafe { gid.as_ref() }) else { return libc::EINVAL };
        s.emu.attach_mcast(&Gid(g.raw), lid).map_or_else(|e| e.errno().raw(), |()| 0)
    })
}

/// `ibv_detach_mcast(qp, gid, lid)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live QP; `gid` NULL or readable.
        let s = match unsafe { lookup::<_, ShimQp>(qp) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: NULL or valid for the verb (its contract).
        let Some(g) = (unsafe { gid.as_ref() }) else { return libc::EINVAL };
        s.emu.detach_mcast(&Gid(g.raw), lid).map_or_else(|e| e.errno().raw(), |()| 0)
    })
}

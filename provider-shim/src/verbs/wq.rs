//! Receive work queues, RSS indirection tables and flow steering: the `create_wq`,
//! `modify_wq`, `destroy_wq`, `create_rwq_ind_table`, `destroy_rwq_ind_table`,
//! `ibv_create_flow` and `ibv_destroy_flow` slots of `verbs_context`, and `ibv_wq.post_recv`.
//! The slots are filled only on devices with raw packet support (the full profile).

use core::ffi::c_int;
use std::ptr;

use rdma_emu::{
    EthFilter, FlowAttr, FlowSpec, FlowType, Ipv4ExtFilter, Ipv6Filter, PortFilter, WqFlags,
    WqInitAttr, WqState,
};

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
};

#[repr(C)]
pub(crate) struct ShimWq {
    pub(crate) wq: ibv_wq,
    pub(crate) emu: rdma_emu::Wq,
}

#[repr(C)]
pub(crate) struct ShimIndTable {
    pub(crate) t: ibv_rwq_ind_table,
    pub(crate) emu: rdma_emu::RwqIndTable,
}

#[repr(C)]
pub(crate) struct ShimFlow {
    pub(crate) f: ibv_flow,
    pub(crate) emu: rdma_emu::Flow,
}

owned!(ShimFlow, 0, |s| s.f.context, destroy);
owned!(ShimIndTable, 2, |s| s.t.context, destroy);
owned!(ShimWq, 3, |s| s.wq.context, destroy);

const IBV_WQT_RQ: u32 = 0;
const IBV_WQ_INIT_ATTR_FLAGS: u32 = 1;
const IBV_WQ_ATTR_STATE: u32 = 1;
const IBV_WQ_ATTR_CURR_STATE: u32 = 2;
const IBV_WQ_ATTR_FLAGS: u32 = 4;

/// The `create_wq` slot: `ibv_create_wq(context, wq_init_attr)`. A receive WQ in RESET;
/// `max_wr` and `max_sge` are left as asked (mlx5 writes nothing back). `EINVAL` for another
/// WQ type, unknown `comp_mask` bits, or a PD or CQ of another context; `EOPNOTSUPP` for an
/// unknown creation flag (see `rdma_emu::WqFlags` for the offloads).
pub(crate) unsafe extern "C" fn create_wq(
    c: *mut ibv_context,
    init: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a valid attr; NULL or live PD and CQ.
        let Some(i) = (unsafe { init.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if i.wq_type != IBV_WQT_RQ || i.comp_mask & !IBV_WQ_INIT_ATTR_FLAGS != 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let flags = if i.comp_mask & IBV_WQ_INIT_ATTR_FLAGS != 0 { i.create_flags } else { 0 };
        let Some(flags) = WqFlags::from_bits(flags) else {
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        };
        // SAFETY: NULL or live objects (checked against the registry).
        let (Some(p), Some(cq)) =
            (unsafe { obj::<_, ShimPd>(i.pd) }, unsafe { obj::<_, ShimCq>(i.cq) })
        else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if p.pd.context != c {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let attr = WqInitAttr { flags, ..WqInitAttr::new(i.max_wr, i.max_sge, &cq.emu) };
        let emu = match p.emu.create_wq(&attr) {
            Ok(w) => w,
            Err(e) => return null_with(e),
        };
        // SAFETY: ibv_wq is plain data (pointers, integers, pthread objects initialised below).
        let mut wq: ibv_wq = unsafe { std::mem::zeroed() };
        wq.context = c;
        wq.wq_context = i.wq_context;
        wq.pd = i.pd;
        wq.cq = i.cq;
        wq.wq_num = emu.wq_num();
        wq.handle = emu.wq_num();
        wq.state = WqState::RESET.0;
        wq.wq_type = IBV_WQT_RQ;
        wq.post_recv = Some(wq_post_recv);
        let w = leak(ShimWq { wq, emu });
        // SAFETY: w is ours and not shared yet.
        unsafe {
            init_sync(&mut (*w).wq.mutex, &mut (*w).wq.cond);
            (*w).emu.set_user_data(w as usize);
        }
        w.cast()
    })
}

/// The `modify_wq` slot: `ibv_modify_wq(wq, attr)`. `IBV_WQ_ATTR_STATE` moves the WQ (see
/// `rdma_emu::Wq::modify`), `IBV_WQ_ATTR_CURR_STATE` must name its state, `IBV_WQ_ATTR_FLAGS`
/// turns C-VLAN stripping on or off (`EOPNOTSUPP` for another flag in `flags_mask`, as
/// mlx5 for end padding); `EINVAL` for unknown bits.
pub(crate) unsafe extern "C" fn modify_wq(wq: *mut ibv_wq, attr: *mut ibv_wq_attr) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live WQ; `attr` NULL or valid.
        let (Some(s), Some(a)) = (unsafe { obj::<_, ShimWq>(wq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        if a.attr_mask & !(IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS) != 0 {
            return libc::EINVAL;
        }
        let flags = (a.attr_mask & IBV_WQ_ATTR_FLAGS != 0)
            .then(|| (WqFlags::from_bits_retain(a.flags), WqFlags::from_bits_retain(a.flags_mask)));
        // Checked before anything changes: only C-VLAN stripping changes on a live WQ.
        if flags.is_some_and(|(_, mask)| !WqFlags::MODIFIABLE.contains(mask)) {
            return libc::EOPNOTSUPP;
        }
        let cur = (a.attr_mask & IBV_WQ_ATTR_CURR_STATE != 0).then_some(WqState(a.curr_wq_state));
        if a.attr_mask & IBV_WQ_ATTR_STATE != 0 {
            let next = WqState(a.wq_state);
            if let Err(e) = s.emu.modify(next, cur) {
                return e.errno().raw();
            }
            // SAFETY: the WQ is live; C reads `state` (libibverbs keeps it current).
            unsafe { (*wq).state = next.0 };
        } else if cur.is_some_and(|c| c != s.emu.state()) {
            return libc::EINVAL;
        }
        match flags.map(|(f, mask)| s.emu.modify_flags(f, mask)) {
            Some(Err(e)) => e.errno().raw(),
            _ => 0,
        }
    })
}

/// The `destroy_wq` slot: `EBUSY` while an indirection table holds the WQ.
pub(crate) unsafe extern "C" fn destroy_wq(wq: *mut ibv_wq) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(wq, |s: &ShimWq| s.emu.destroy()) } })
}

/// `ibv_wq.post_recv`: `ibv_post_wq_recv(wq, wr, bad_wr)`.
unsafe extern "C" fn wq_post_recv(
    wq: *mut ibv_wq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: a live WQ.
        let Some(s) = (unsafe { obj::<_, ShimWq>(wq) }) else { return libc::EINVAL };
        let limits = (s.emu.max_sge() as c_int, s.emu.max_wr());
        // SAFETY: the application's list and bad_wr, as the verb requires.
        unsafe { super::qp::post_recv_list(wr, bad, limits, |r| s.emu.post_recv(r)) }
    })
}

/// The `create_rwq_ind_table` slot: reads the `2^log_ind_tbl_size` WQ pointers of
/// `ind_tbl`. `EINVAL` for a `comp_mask`, a size above the device's, or an entry that is not
/// a live WQ of ours.
pub(crate) unsafe extern "C" fn create_rwq_ind_table(
    c: *mut ibv_context,
    init: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context; `init` NULL or valid.
        let (Some(s), Some(i)) = (unsafe { ctx(c) }, unsafe { init.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let max = s.emu().query_device().max_rwq_indirection_table_size;
        if i.comp_mask != 0 || i.ind_tbl.is_null() || i.log_ind_tbl_size >= 32 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let n = 1usize << i.log_ind_tbl_size;
        if n > max as usize {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        // SAFETY: the application's array of 2^log_ind_tbl_size WQ pointers.
        let ptrs = unsafe { std::slice::from_raw_parts(i.ind_tbl, n) };
        let mut wqs = Vec::with_capacity(n);
        for &p in ptrs {
            // SAFETY: NULL or an object of ours (checked against the registry).
            match unsafe { obj::<_, ShimWq>(p) } {
                Some(w) => wqs.push(&w.emu),
                None => {
                    set_errno(libc::EINVAL);
                    return ptr::null_mut();
                }
            }
        }
        let emu = match s.emu().create_rwq_ind_table(i.log_ind_tbl_size, &wqs) {
            Ok(t) => t,
            Err(e) => return null_with(e),
        };
        let num = emu.num() as c_int;
        let t =
            ibv_rwq_ind_table { context: c, ind_tbl_handle: num, ind_tbl_num: num, comp_mask: 0 };
        leak(ShimIndTable { t, emu }).cast()
    })
}

/// The `destroy_rwq_ind_table` slot: `EBUSY` while an RSS QP uses the table.
pub(crate) unsafe extern "C" fn destroy_rwq_ind_table(t: *mut ibv_rwq_ind_table) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(t, |s: &ShimIndTable| s.emu.destroy()) } })
}

const SPEC_ETH: u32 = 0x20;
const SPEC_IPV4: u32 = 0x30;
const SPEC_IPV6: u32 = 0x31;
const SPEC_IPV4_EXT: u32 = 0x32;
const SPEC_TCP: u32 = 0x40;
const SPEC_UDP: u32 = 0x41;
const SPEC_INNER: u32 = 0x100;
const SPEC_ACTION_TAG: u32 = 0x1000;
const SPEC_ACTION_DROP: u32 = 0x1001;
/// Specification types libibverbs knows and the emulator does not match on (ESP, VXLAN,
/// GRE, MPLS, handles, counters): `EOPNOTSUPP` from `rdma_emu::Flow`.
const SPECS_NOT_EMULATED: [u32; 6] = [0x34, 0x50, 0x51, 0x60, 0x1002, 0x1003];

/// Reads a specification of type `T` at `p` if its size is `T`'s.
///
/// # Safety
/// `p` points at `size` readable bytes.
unsafe fn spec<T>(p: *const u8, size: u16) -> Result<T, c_int> {
    if size as usize != size_of::<T>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `size` readable bytes, which are a T (the application's specification).
    Ok(unsafe { ptr::read_unaligned(p as *const T) })
}

fn eth(f: &ibv_flow_eth_filter) -> EthFilter {
    EthFilter {
        dst_mac: f.dst_mac,
        src_mac: f.src_mac,
        ether_type: u16::from_be(f.ether_type),
        vlan_tag: u16::from_be(f.vlan_tag),
    }
}

fn ipv4(f: &ibv_flow_ipv4_ext_filter) -> Ipv4ExtFilter {
    Ipv4ExtFilter {
        src_ip: u32::from_be(f.src_ip),
        dst_ip: u32::from_be(f.dst_ip),
        proto: f.proto,
        tos: f.tos,
        ttl: f.ttl,
        flags: f.flags,
    }
}

/// `IBV_FLOW_SPEC_IPV4`: the addresses only; the other fields stay unmatched.
fn ipv4_addrs(f: &ibv_flow_ipv4_filter) -> Ipv4ExtFilter {
    Ipv4ExtFilter {
        src_ip: u32::from_be(f.src_ip),
        dst_ip: u32::from_be(f.dst_ip),
        ..Default::default()
    }
}

fn ipv6(f: &ibv_flow_ipv6_filter) -> Ipv6Filter {
    Ipv6Filter {
        src_ip: f.src_ip,
        dst_ip: f.dst_ip,
        flow_label: u32::from_be(f.flow_label),
        next_hdr: f.next_hdr,
        traffic_class: f.traffic_class,
        hop_limit: f.hop_limit,
    }
}

fn ports(f: &ibv_flow_tcp_udp_filter) -> PortFilter {
    PortFilter { dst_port: u16::from_be(f.dst_port), src_port: u16::from_be(f.src_port) }
}

/// Parses the rule and the specifications that follow it in memory.
///
/// # Safety
/// `a` is followed by `num_of_specs` specifications, each of its header's size.
unsafe fn flow_attr(a: &ibv_flow_attr) -> Result<FlowAttr, c_int> {
    if a.comp_mask != 0 {
        return Err(libc::EINVAL);
    }
    let mut specs = Vec::with_capacity(a.num_of_specs as usize);
    let mut p = (a as *const ibv_flow_attr).wrapping_add(1) as *const u8;
    for _ in 0..a.num_of_specs {
        // SAFETY: each specification starts with its header (the caller's contract).
        let h = unsafe { ptr::read_unaligned(p as *const ibv_flow_spec_hdr) };
        // SAFETY: `h.size` readable bytes at `p`, checked against each type's size.
        let s = unsafe {
            match h.type_ {
                // Known to libibverbs, which passes them to the kernel: the emulator refuses
                // them where the kernel's device would, after its checks.
                ty if ty & SPEC_INNER != 0 || SPECS_NOT_EMULATED.contains(&ty) => {
                    Ok(FlowSpec::NotEmulated(ty))
                }
                SPEC_ETH => spec::<ibv_flow_spec_eth>(p, h.size)
                    .map(|s| FlowSpec::Eth { val: eth(&s.val), mask: eth(&s.mask) }),
                SPEC_IPV4 => spec::<ibv_flow_spec_ipv4>(p, h.size)
                    .map(|s| FlowSpec::Ipv4 { val: ipv4_addrs(&s.val), mask: ipv4_addrs(&s.mask) }),
                SPEC_IPV4_EXT => spec::<ibv_flow_spec_ipv4_ext>(p, h.size)
                    .map(|s| FlowSpec::Ipv4 { val: ipv4(&s.val), mask: ipv4(&s.mask) }),
                SPEC_IPV6 => spec::<ibv_flow_spec_ipv6>(p, h.size)
                    .map(|s| FlowSpec::Ipv6 { val: ipv6(&s.val), mask: ipv6(&s.mask) }),
                SPEC_TCP => spec::<ibv_flow_spec_tcp_udp>(p, h.size)
                    .map(|s| FlowSpec::Tcp { val: ports(&s.val), mask: ports(&s.mask) }),
                SPEC_UDP => spec::<ibv_flow_spec_tcp_udp>(p, h.size)
                    .map(|s| FlowSpec::Udp { val: ports(&s.val), mask: ports(&s.mask) }),
                SPEC_ACTION_TAG => {
                    spec::<ibv_flow_spec_action_tag>(p, h.size).map(|s| FlowSpec::Tag(s.tag_id))
                }
                // `struct ibv_flow_spec_action_drop` is the header alone.
                SPEC_ACTION_DROP => spec::<ibv_flow_spec_hdr>(p, h.size).map(|_| FlowSpec::Drop),
                _ => Err(libc::EINVAL),
            }
        }?;
        specs.push(s);
        p = p.wrapping_add(h.size as usize);
    }
    Ok(FlowAttr {
        flow_type: FlowType(a.type_),
        priority: a.priority,
        port: a.port,
        flags: a.flags,
        specs,
    })
}

/// The `ibv_create_flow` slot: see `rdma_emu::Flow` for the rules and errnos; `EINVAL`
/// also for a malformed specification (libibverbs' own check, before the kernel's).
pub(crate) unsafe extern "C" fn create_flow(
    qp: *mut ibv_qp,
    attr: *mut ibv_flow_attr,
) -> *mut ibv_flow {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live QP; `attr` NULL or the application's rule.
        let (Some(q), Some(a)) = (unsafe { obj::<_, ShimQp>(qp) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: the specifications follow the rule (the verb's contract).
        let rule = match unsafe { flow_attr(a) } {
            Ok(r) => r,
            Err(e) => {
                set_errno(e);
                return ptr::null_mut();
            }
        };
        let emu = match q.emu.create_flow(&rule) {
            Ok(f) => f,
            Err(e) => return null_with(e),
        };
        let f = ibv_flow { comp_mask: 0, context: q.qp.qp_base.context, handle: 0 };
        leak(ShimFlow { f, emu }).cast()
    })
}

/// The `ibv_destroy_flow` slot.
pub(crate) unsafe extern "C" fn destroy_flow(flow: *mut ibv_flow) -> c_int {
    // SAFETY: NULL or an object of this library (checked by `destroy`).
    ffi!(libc::EIO, { unsafe { destroy(flow, |s: &ShimFlow| s.emu.destroy()) } })
}

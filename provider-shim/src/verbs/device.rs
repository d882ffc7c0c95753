//! Devices and contexts: the device list, open/close, every query, the string helpers.

use core::ffi::{c_char, c_int, c_void};
use std::{
    os::fd::{AsRawFd, OwnedFd},
    ptr,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicPtr, Ordering},
    },
};

use super::import::Ufile;

use rdma_emu::{Fabric, FabricConfig};

use crate::{
    abi::*,
    boundary::{ffi, null_with, set_errno},
    objects::*,
    verbs::ops,
};

/// This process's emulator: its fabric and its devices, made on first use from the
/// environment (see `FabricConfig::from_vars`). A child made by `fork` makes its own at its
/// first use (it joins the host fabric as a node of its own, as a child opens the device
/// anew in rdma-core): the parent's, which it holds a copy of, is the parent's (see
/// `rdma_emu::fork_generation`). Each lives as long as the process: its devices' addresses
/// are handed to C (and a child may still hold its parent's, see [`current`]).
struct Instance {
    generation: u64,
    fabric: Option<Fabric>,
    /// Never resized after creation, so the addresses handed to C stay valid.
    devices: Vec<ShimDevice>,
}

/// The instance of this process's generation (a leaked `Box`), or NULL before the first.
static INSTANCE: AtomicPtr<Instance> = AtomicPtr::new(ptr::null_mut());

/// This process's emulator (made now if this process has none of its own yet).
fn instance() -> &'static Instance {
    let p = INSTANCE.load(Ordering::Acquire);
    // SAFETY: a non-null `INSTANCE` is a leaked `Box<Instance>`, never freed.
    match unsafe { p.as_ref() } {
        Some(i) if i.generation == rdma_emu::fork_generation() => i,
        _ => make_instance(),
    }
}

#[cold]
fn make_instance() -> &'static Instance {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // (Poisoned only by a panic while making one, which left none: made again. A fork while
    // another thread makes the parent's would leave the child waiting here, as for any lock
    // a library holds across fork; it is held once per process, at its first verb.)
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let generation = rdma_emu::fork_generation();
    // SAFETY: as in `instance`.
    if let Some(i) = unsafe { INSTANCE.load(Ordering::Acquire).as_ref() }
        && i.generation == generation
    {
        return i;
    }
    let first = INSTANCE.load(Ordering::Acquire).is_null();
    let fabric = fabric_from_env();
    let emus = fabric.as_ref().map(Fabric::devices).unwrap_or_default();
    if first {
        crate::sysfs::publish(&emus);
        if fabric.is_some() {
            // SAFETY: registers a plain function with no captured state; it may run at exit.
            unsafe { libc::atexit(flush_at_exit) };
        }
    }
    let devices = emus.into_iter().map(shim_device).collect();
    let made: &'static Instance = Box::leak(Box::new(Instance { generation, fabric, devices }));
    made.devices.iter().for_each(|d| register(d as *const ShimDevice));
    INSTANCE.store(made as *const Instance as *mut Instance, Ordering::Release);
    made
}

/// The C face of the emulated device `emu`.
fn shim_device(emu: rdma_emu::Device) -> ShimDevice {
    let mut dev = ibv_device {
        _ops: [ptr::null_mut(); 2],
        node_type: 1,      // IBV_NODE_CA
        transport_type: 0, // IBV_TRANSPORT_IB
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    let i = emu.index();
    copy_str(&mut dev.name, emu.name());
    copy_str(&mut dev.dev_name, &format!("uverbs{i}"));
    copy_str(&mut dev.dev_path, &format!("/sys/class/infiniband_verbs/uverbs{i}"));
    copy_str(&mut dev.ibdev_path, &format!("/sys/class/infiniband/{}", emu.name()));
    ShimDevice { dev, emu }
}

/// The emulated devices of this process.
pub(crate) fn devices() -> &'static [ShimDevice] {
    &instance().devices
}

/// This process's fabric (the one the devices are on), if the environment makes one.
pub(crate) fn fabric() -> Option<Fabric> {
    instance().fabric.clone()
}

/// This process's device for `d`: `d` itself, or, for a device of its parent's emulator (a
/// child of `fork` opening a device it listed before the fork, as rdma-core lets it), its own
/// device of the same index.
fn current(d: &ShimDevice) -> Option<&'static ShimDevice> {
    devices().get(d.emu.index() as usize)
}

/// The fabric the environment describes. A configuration that cannot be used (a malformed
/// `RDMA_EMU_FAULTS`, say) is reported on stderr and leaves the process with no devices,
/// rather than running without the faults the user asked for. A run with a seed or faults
/// reports its seed, so that it can be replayed.
fn fabric_from_env() -> Option<Fabric> {
    let var = |k: &str| std::env::var(k).ok();
    let cfg = match FabricConfig::try_from_vars(var) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("rdma-emu: {e}; no devices");
            return None;
        }
    };
    let noisy = cfg.seed.is_some() || !cfg.faults.is_empty();
    let fabric = match Fabric::try_new(cfg) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("rdma-emu: {e}; no devices");
            return None;
        }
    };
    if noisy {
        let seed = fabric.seed();
        let mode = if fabric.simulated() { "simulation" } else { "real time" };
        eprintln!("rdma-emu: seed {seed} ({mode}); replay with RDMA_EMU_SEED={seed}");
    }
    Some(fabric)
}

/// At exit, tells the peers of its connected QPs that they closed (as the kernel destroys an
/// exiting process's QPs), lets the packets still queued for other processes (a final ACK,
/// say) leave before the process and its queues are gone, within a bound, then takes the
/// node's socket out of the fabric's directory.
extern "C" fn flush_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: as in `instance`. (Not made now, at exit, if there is none of this
        // generation: a child's copy of its parent's has nothing of the child's to flush.)
        let Some(i) = (unsafe { INSTANCE.load(Ordering::Acquire).as_ref() }) else { return };
        if let Some(f) = i.fabric.as_ref().filter(|_| i.generation == rdma_emu::fork_generation()) {
            f.part_at_exit();
            f.flush(std::time::Duration::from_secs(2));
            f.leave_at_exit();
        }
    });
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// `ibv_get_device_list(num_devices)`: a NULL-terminated array freed by
/// `ibv_free_device_list`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_device_list(
    num: *mut c_int,
) -> *mut *mut ibv_device {
    ffi!(ptr::null_mut(), {
        static FORK_SAFE: std::sync::Once = std::sync::Once::new();
        // As libibverbs' first device list: fork-safety asked for by the environment.
        FORK_SAFE.call_once(|| {
            let asked =
                ["RDMAV_FORK_SAFE", "IBV_FORK_SAFE"].iter().any(|v| std::env::var_os(v).is_some());
            // SAFETY: no arguments; only this module's flags.
            if asked && unsafe { rdma_emu_shim__ibv_fork_init() } != 0 {
                eprintln!("libibverbs: Warning: fork()-safety requested but init failed");
            }
        });
        let devs = devices();
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: i < n+1 slots; the devices live for the whole process.
            unsafe { *list.add(i) = &d.dev as *const ibv_device as *mut ibv_device };
        }
        if !num.is_null() {
            // SAFETY: the caller passed a writable int (or NULL, checked).
            unsafe { *num = devs.len() as c_int };
        }
        list
    })
}

/// `ibv_free_device_list(list)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the list came from calloc in ibv_get_device_list (or is NULL).
    unsafe { libc::free(list.cast()) };
}

/// `ibv_get_device_name(device)`: the struct's `name`, as libibverbs returns it without
/// looking further (programs and bindings pass structs of their own making); `EINVAL` and
/// NULL for NULL.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_device_name(
    dev: *mut ibv_device,
) -> *const c_char {
    if dev.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null();
    }
    // SAFETY: a non-NULL `struct ibv_device` of the caller's (the verbs contract); only the
    // address of its field is taken, nothing is read.
    unsafe { ptr::addr_of!((*dev).name).cast() }
}

/// `ibv_get_device_guid(device)`: the node GUID in network byte order.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    // SAFETY: as above.
    unsafe { obj::<_, ShimDevice>(dev) }.map_or(0, |d| d.emu.guid().to_be())
}

/// `ibv_get_device_index(device)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    // SAFETY: as above.
    unsafe { obj::<_, ShimDevice>(dev) }.map_or(-1, |d| d.emu.index() as c_int)
}

/// `ibv_open_device(device)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_open_device(
    dev: *mut ibv_device,
) -> *mut ibv_context {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or one of our devices.
        let Some(d) = (unsafe { obj::<_, ShimDevice>(dev) }).and_then(current) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let dev = &d.dev as *const ibv_device as *mut ibv_device;
        let emu = match d.emu.open() {
            Ok(c) => c,
            Err(e) => return null_with(e),
        };
        match Ufile::open(dev as usize, emu) {
            Ok((uf, fd)) => new_context(dev, uf, fd),
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
                ptr::null_mut()
            }
        }
    })
}

/// A context on `dev` over the objects of `uf`, with command fd `cmd_fd`.
pub(crate) fn new_context(
    dev: *mut ibv_device,
    uf: Arc<Ufile>,
    cmd_fd: OwnedFd,
) -> *mut ibv_context {
    let attr = uf.emu.query_device();
    // SAFETY: all-zero is a valid value for every field of verbs_context (NULL pointers,
    // zero integers, an all-zero pthread mutex is overwritten by init below).
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    ops::fill(&mut vctx, &attr);
    let c = &mut vctx.context;
    c.device = dev;
    c.cmd_fd = cmd_fd.as_raw_fd();
    c.async_fd = uf.emu.as_raw_fd();
    c.num_comp_vectors = attr.num_comp_vectors as c_int;
    c.abi_compat = usize::MAX as *mut c_void;
    vctx.sz = size_of::<verbs_context>();
    let p = leak_unowned(ShimContext { vctx, ufile: uf, _cmd_fd: cmd_fd });
    // SAFETY: p was just allocated and is not shared yet.
    unsafe { init_sync(&mut (*p).vctx.context.mutex, ptr::null_mut()) };
    // SAFETY: as above.
    unsafe { &mut (*p).vctx.context }
}

/// `ibv_close_device(context)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_close_device(c: *mut ibv_context) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        let (objects, emu) = (Arc::downgrade(&s.ufile), s.emu().clone());
        let owner = Arc::as_ptr(&s.ufile) as usize;
        // SAFETY: the context is not used after close (the verbs contract).
        unsafe { free(s as *const ShimContext) };
        // The last context over its objects is gone: so are they, as when the kernel's
        // uverbs file closes (a dup imported elsewhere keeps them).
        if objects.strong_count() == 0 {
            emu.close();
            close_owned(owner);
        }
        0
    })
}

fn fill_device_attr(a: &rdma_emu::DeviceAttr, out: &mut ibv_device_attr) {
    // SAFETY: ibv_device_attr is plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    copy_str(&mut out.fw_ver, a.fw_ver);
    out.node_guid = a.node_guid.to_be();
    out.sys_image_guid = a.sys_image_guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = a.page_size_cap;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    out.max_qp = i(a.max_qp);
    out.max_qp_wr = i(a.max_qp_wr);
    out.device_cap_flags = a.device_cap_flags;
    out.max_sge = i(a.max_sge);
    out.max_sge_rd = i(a.max_sge_rd);
    out.max_cq = i(a.max_cq);
    out.max_cqe = i(a.max_cqe);
    out.max_mr = i(a.max_mr);
    out.max_pd = i(a.max_pd);
    out.max_qp_rd_atom = i(a.max_qp_rd_atom);
    out.max_ee_rd_atom = i(a.max_ee_rd_atom);
    out.max_res_rd_atom = i(a.max_res_rd_atom);
    out.max_qp_init_rd_atom = i(a.max_qp_init_rd_atom);
    out.max_ee_init_rd_atom = i(a.max_ee_init_rd_atom);
    out.atomic_cap = a.atomic_cap.0;
    out.max_ee = i(a.max_ee);
    out.max_rdd = i(a.max_rdd);
    out.max_mw = i(a.max_mw);
    out.max_raw_ipv6_qp = i(a.max_raw_ipv6_qp);
    out.max_raw_ethy_qp = i(a.max_raw_ethy_qp);
    out.max_mcast_grp = i(a.max_mcast_grp);
    out.max_mcast_qp_attach = i(a.max_mcast_qp_attach);
    out.max_total_mcast_qp_attach = i(a.max_total_mcast_qp_attach);
    out.max_ah = i(a.max_ah);
    out.max_fmr = i(a.max_fmr);
    out.max_map_per_fmr = i(a.max_map_per_fmr);
    out.max_srq = i(a.max_srq);
    out.max_srq_wr = i(a.max_srq_wr);
    out.max_srq_sge = i(a.max_srq_sge);
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = a.local_ca_ack_delay;
    out.phys_port_cnt = a.phys_port_cnt;
}

/// `ibv_query_device(context, device_attr)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_device(
    c: *mut ibv_context,
    out: *mut ibv_device_attr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context; `out` NULL or writable.
        let (Some(s), Some(out)) = (unsafe { ctx(c) }, unsafe { out.as_mut() }) else {
            return libc::EINVAL;
        };
        fill_device_attr(&s.emu().query_device(), out);
        0
    })
}

/// The `query_device_ex` slot of `verbs_context`: fills `attr_size` bytes (older callers pass
/// a shorter struct, and get its prefix, as from rdma-core): the base attributes, the 64-bit
/// capability flags, the port count, and the clock, CQ moderation and device memory
/// capabilities of the profile; every other extended capability is reported absent.
pub(crate) unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    _input: *const c_void,
    out: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: as in ibv_query_device.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        if out.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let a = s.emu().query_device();
        // SAFETY: ibv_device_attr_ex is plain data; all-zero is valid.
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        fill_device_attr(&a, &mut ex.orig_attr);
        ex.device_cap_flags_ex = u64::from(ex.orig_attr.device_cap_flags) | a.cap_flags_ex;
        ex.phys_port_cnt_ex = u32::from(ex.orig_attr.phys_port_cnt);
        ex.completion_timestamp_mask = a.completion_timestamp_mask;
        ex.hca_core_clock = a.hca_core_clock;
        ex.cq_mod_caps.max_cq_count = a.max_cq_count;
        ex.cq_mod_caps.max_cq_period = a.max_cq_period;
        ex.max_dm_size = a.max_dm_size;
        // `struct ibv_odp_caps`: general_caps, then the RC, UC and UD words.
        let o = a.odp;
        ex.odp_caps = [o.general, u64::from(o.rc) | u64::from(o.uc) << 32, u64::from(o.ud)];
        ex.xrc_odp_caps = o.xrc;
        let t = a.tm;
        ex.tm_caps = [t.max_rndv_hdr_size, t.max_num_tags, t.flags, t.max_ops, t.max_sge];
        if a.has_raw_packet() {
            let raw_qpts = 1 << rdma_emu::QpType::RAW_PACKET.0;
            ex.tso_caps = ibv_tso_caps { max_tso: a.max_tso, supported_qpts: raw_qpts };
            ex.rss_caps = ibv_rss_caps {
                supported_qpts: raw_qpts,
                max_rwq_indirection_tables: a.max_rwq_indirection_tables,
                max_rwq_indirection_table_size: a.max_rwq_indirection_table_size,
                rx_hash_fields_mask: a.rx_hash_fields_mask,
                rx_hash_function: rdma_emu::qp::RX_HASH_FUNC_TOEPLITZ,
            };
            ex.max_wq_type_rq = a.max_wq_type_rq;
            ex.raw_packet_caps = a.raw_packet_caps;
        }
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller provides attr_size >= n writable bytes; `ex` is a local of at
        // least n bytes.
        unsafe { ptr::copy_nonoverlapping(&ex as *const _ as *const u8, out as *mut u8, n) };
        0
    })
}

/// The `query_rt_values` slot (`ibv_query_rt_values_ex`), filled for devices with a clock: the
/// raw clock in cycles in `raw_clock.tv_nsec` (`tv_sec` 0), as mlx5 reports it.
pub(crate) unsafe extern "C" fn query_rt_values(
    c: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context; `values` NULL or writable.
        let (Some(s), Some(v)) = (unsafe { ctx(c) }, unsafe { values.as_mut() }) else {
            return libc::EINVAL;
        };
        if v.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
            return libc::EINVAL;
        }
        let mut done = 0;
        if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
            match s.emu().read_clock() {
                Ok(cycles) => {
                    v.raw_clock = libc::timespec { tv_sec: 0, tv_nsec: cycles as libc::c_long };
                    done |= IBV_VALUES_MASK_RAW_CLOCK;
                }
                Err(e) => return e.errno().raw(),
            }
        }
        v.comp_mask = done;
        0
    })
}

const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1;

/// Fills `len` bytes of a port attribute struct (48 for the compat export, 52 for the slot).
fn fill_port(s: &ShimContext, port: u8, out: *mut ibv_port_attr, len: usize) -> c_int {
    let a = match s.emu().query_port(port) {
        Ok(a) => a,
        Err(e) => return e.errno().raw(),
    };
    let p = ibv_port_attr {
        state: a.state.0,
        max_mtu: a.max_mtu.0,
        active_mtu: a.active_mtu.0,
        gid_tbl_len: a.gid_tbl_len as c_int,
        port_cap_flags: a.port_cap_flags,
        max_msg_sz: a.max_msg_sz,
        bad_pkey_cntr: a.bad_pkey_cntr,
        qkey_viol_cntr: a.qkey_viol_cntr,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        sm_lid: a.sm_lid,
        lmc: a.lmc,
        max_vl_num: a.max_vl_num,
        sm_sl: a.sm_sl,
        subnet_timeout: a.subnet_timeout,
        init_type_reply: a.init_type_reply,
        active_width: a.active_width,
        active_speed: a.active_speed,
        phys_state: a.phys_state,
        link_layer: a.link_layer.0,
        flags: a.flags,
        port_cap_flags2: a.port_cap_flags2,
    };
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: `out` has `len` writable bytes (the caller's contract); `p` is a local.
    unsafe { ptr::copy_nonoverlapping(&p as *const ibv_port_attr as *const u8, out as *mut u8, n) };
    0
}

/// `ibv_query_port(context, port_num, port_attr)` as exported: the 48-byte compat layout.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        if out.is_null() {
            return libc::EINVAL;
        }
        with_errno(fill_port(s, port, out, 48))
    })
}

/// The `query_port` slot of `verbs_context` (what the inline `ibv_query_port` calls).
pub(crate) unsafe extern "C" fn query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        if out.is_null() {
            return libc::EINVAL;
        }
        with_errno(fill_port(s, port, out, len))
    })
}

/// `ibv_query_gid(context, port_num, index, gid)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context; `gid` NULL or writable.
        let (Some(s), Some(gid)) = (unsafe { ctx(c) }, unsafe { gid.as_mut() }) else { return -1 };
        match s.emu().device().query_gid(port, index as u32) {
            Ok(g) => {
                gid.raw = g.0;
                0
            }
            Err(e) => {
                set_errno(e.errno().raw());
                -1
            }
        }
    })
}

/// `ibv_resolve_eth_l2_from_gid(context, attr, eth_mac, vid)`: the MAC address of the port
/// that owns `attr`'s destination GID on the fabric (libibverbs asks the kernel's neighbour
/// table), and VLAN 0xffff (none). As libibverbs: -1 when `attr`'s source GID cannot be
/// queried, otherwise a negative errno (`-EINVAL`: InfiniBand port, GIDs of different
/// families; `-EHOSTUNREACH`: nobody has the GID).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_resolve_eth_l2_from_gid(
    c: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut [u8; 6],
    vid: *mut u16,
) -> c_int {
    ffi!(-libc::EIO, {
        // SAFETY: NULL or a live context; `attr` NULL or readable, `eth_mac` NULL or six
        // writable bytes (the verb's contract).
        let (Some(s), Some(attr), Some(mac)) =
            (unsafe { ctx(c) }, unsafe { attr.as_ref() }, unsafe { eth_mac.as_mut() })
        else {
            return -libc::EINVAL;
        };
        let attr = super::qp::ah_from_c(attr);
        if s.emu().device().query_gid(attr.port_num, attr.sgid_index as u32).is_err() {
            return -1;
        }
        match s.emu().resolve_eth_l2(attr.port_num, &attr) {
            Ok(m) => {
                *mac = m;
                // SAFETY: NULL or a writable u16.
                if let Some(vid) = unsafe { vid.as_mut() } {
                    *vid = 0xffff;
                }
                0
            }
            Err(e) => -e.errno().raw(),
        }
    })
}

/// `_ibv_query_gid_ex(context, port_num, gid_index, entry, flags, entry_size)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim___ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context; `entry` NULL or writable.
        let (Some(s), Some(entry)) = (unsafe { ctx(c) }, unsafe { entry.as_mut() }) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() || port > u8::MAX as u32 {
            return libc::EINVAL;
        }
        let dev = s.emu().device();
        match dev.query_gid_entry(port as u8, index) {
            Ok(Some(e)) => {
                *entry = ibv_gid_entry {
                    gid: ibv_gid { raw: e.gid.0 },
                    gid_index: index,
                    port_num: port,
                    gid_type: e.gid_type.0,
                    ndev_ifindex: crate::sysfs::gid_ifindex(&dev, port as u8, &e),
                };
                0
            }
            Ok(None) => with_errno(libc::ENODATA),
            Err(e) => with_errno(e.errno().raw()),
        }
    })
}

/// `_ibv_query_gid_table(context, entries, max_entries, flags, entry_size)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim___ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi!(-(libc::EIO as isize), {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return -(libc::EINVAL as isize) };
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() || entries.is_null() {
            return -(libc::EINVAL as isize);
        }
        let dev = s.emu().device();
        let mut n = 0usize;
        for port in 1..=dev.attr().phys_port_cnt {
            for e in dev.gid_table(port).unwrap_or_default() {
                if n == max {
                    return -(with_errno(libc::EINVAL) as isize);
                }
                let out = ibv_gid_entry {
                    gid: ibv_gid { raw: e.gid.0 },
                    gid_index: e.index,
                    port_num: port as u32,
                    gid_type: e.gid_type.0,
                    ndev_ifindex: crate::sysfs::gid_ifindex(&dev, port, &e),
                };
                // SAFETY: n < max entries of entry_size bytes each were provided.
                unsafe {
                    ptr::write((entries as *mut u8).add(n * entry_size) as *mut ibv_gid_entry, out)
                };
                n += 1;
            }
        }
        n as isize
    })
}

/// `ibv_query_gid_type(context, port_num, index, type)` (IBVERBS_PRIVATE_34): the type in the
/// sysfs encoding rdma-core uses here (`IBV_GID_TYPE_SYSFS_IB_ROCE_V1` 0,
/// `IBV_GID_TYPE_SYSFS_ROCE_V2` 1). An empty entry reports the port's kind, as the kernel's
/// per-index sysfs attribute does.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context; `ty` NULL or writable.
        let (Some(s), Some(ty)) = (unsafe { ctx(c) }, unsafe { ty.as_mut() }) else { return -1 };
        let dev = s.emu().device();
        let roce_v2 = match dev.query_gid_entry(port, index) {
            Ok(Some(e)) => e.gid_type == rdma_emu::GidType::ROCE_V2,
            Ok(None) => dev
                .query_port(port)
                .map(|p| p.link_layer == rdma_emu::LinkLayer::ETHERNET)
                .unwrap_or(false),
            Err(_) => return -1,
        };
        *ty = roce_v2 as u32;
        0
    })
}

/// `ibv_query_pkey(context, port_num, index, pkey)`: the P_Key in network order.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context; `pkey` NULL or writable.
        let (Some(s), Some(pkey)) = (unsafe { ctx(c) }, unsafe { pkey.as_mut() }) else {
            return -1;
        };
        match s.emu().device().query_pkey(port, index as u16) {
            Ok(k) => {
                *pkey = k.to_be();
                0
            }
            // libibverbs reads the entry from sysfs, where there is no such file.
            Err(_) => {
                set_errno(libc::ENOENT);
                -1
            }
        }
    })
}

/// `ibv_get_sysfs_path()`: the directory whose `class/infiniband` describes the emulated
/// devices (see `sysfs`): `/sys` under `rdma-emu run`, else this process's tree; NULL with
/// `ENOENT` when there is no fabric to describe or the tree could not be written.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_sysfs_path() -> *const c_char {
    ffi!(ptr::null(), {
        static PATH: OnceLock<Option<std::ffi::CString>> = OnceLock::new();
        let path = PATH.get_or_init(|| {
            devices();
            let p = crate::sysfs::sysfs_path()?;
            std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).ok()
        });
        match path {
            Some(p) => p.as_ptr(),
            None => {
                set_errno(libc::ENOENT);
                ptr::null()
            }
        }
    })
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: the file `dir/file` (the emulated devices'
/// tree, or any other), at most `size - 1` bytes, NUL-terminated, a final newline dropped;
/// its length, or -1 with errno.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    use std::os::unix::ffi::OsStrExt;
    ffi!(-1, {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (std::ffi::CStr::from_ptr(dir), std::ffi::CStr::from_ptr(file)) };
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(d.to_bytes()))
            .join(std::ffi::OsStr::from_bytes(f.to_bytes()));
        let mut text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return -1;
            }
        };
        text.truncate(size - 1);
        if text.last() == Some(&b'\n') {
            text.pop();
        }
        // SAFETY: `size` writable bytes at `buf` (the caller's promise); text.len() < size.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            *buf.add(text.len()) = 0;
        }
        text.len() as c_int
    })
}

/// See `ibv_read_sysfs_file` (the varargs form, not read here).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// Whether `ibv_fork_init` ran (libibverbs' `mm_root`).
static FORK_INIT: AtomicBool = AtomicBool::new(false);
/// Whether memory was marked for fork before `ibv_fork_init` ran (libibverbs' `too_late`): a
/// registration, a marked range or (full profile, as mlx5's buffers) a CQ or QP.
static FORK_TOO_LATE: AtomicBool = AtomicBool::new(false);

/// Marks memory as libibverbs' `ibv_dontfork_range` / `ibv_dofork_range` do: once any is
/// marked before `ibv_fork_init`, that call is too late.
pub(crate) fn fork_range_marked() {
    if !FORK_INIT.load(Ordering::Relaxed) {
        FORK_TOO_LATE.store(true, Ordering::Relaxed);
    }
}

/// `ibv_fork_init()`: nothing is pinned, so fork needs no preparation; but as libibverbs, it
/// fails `EINVAL` once memory was registered (or marked) before it, and later calls succeed.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_fork_init() -> c_int {
    if FORK_INIT.load(Ordering::Relaxed) {
        return 0;
    }
    if FORK_TOO_LATE.load(Ordering::Relaxed) {
        return libc::EINVAL;
    }
    FORK_INIT.store(true, Ordering::Relaxed);
    0
}

/// `ibv_is_fork_initialized()`: `IBV_FORK_UNNEEDED`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range` / `ibv_dofork_range`: nothing to do (see [`fork_range_marked`]).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_dontfork_range() -> c_int {
    fork_range_marked();
    0
}

/// See `ibv_dontfork_range`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_dofork_range() -> c_int {
    fork_range_marked();
    0
}

/// `ibv_get_pkey_index(context, port_num, pkey)`: the index of `pkey` (network order) in the
/// port's P_Key table, or -1.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_pkey_index(
    c: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return -1 };
        let dev = s.emu().device();
        let len = dev.query_port(port).map(|p| p.pkey_tbl_len).unwrap_or(0);
        match (0..len).find(|&i| dev.query_pkey(port, i).ok() == Some(u16::from_be(pkey))) {
            Some(i) => i as c_int,
            // Not found: the errno of the sysfs read past the table that ends libibverbs' loop.
            None => {
                set_errno(libc::ENOENT);
                -1
            }
        }
    })
}

/// `errno` as a verb that returns it also leaves it (the kernel command that failed set it).
fn with_errno(errno: c_int) -> c_int {
    if errno != 0 {
        set_errno(errno);
    }
    errno
}

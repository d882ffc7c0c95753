//! `#[repr(C)]` mirrors of `<infiniband/verbs.h>` (rdma-core 44, x86_64).
//!
//! Every field keeps its C name. Enumerations are plain integers (`u32`/`c_int`): a value from C
//! is checked before it becomes an emulator type, never transmuted. The layouts are checked
//! against the real header by `tests/layout.rs`, which compiles C with `offsetof`/`sizeof`.

use core::ffi::{c_char, c_int, c_uint, c_void};

use libc::{pthread_cond_t, pthread_mutex_t};

/// Declares `#[repr(C)]` structs and a `LAYOUTS` table (C name, field, offset, size) that the
/// layout test compares with the C compiler's view.
macro_rules! mirrors {
    ($( $(#[$m:meta])* $name:ident = $cname:literal { $( $(#[$fm:meta])* $f:ident : $t:ty ),* $(,)? } )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[allow(non_camel_case_types, missing_debug_implementations)]
            pub struct $name { $( $(#[$fm])* pub $f: $t ),* }
        )*
        /// (C struct, field, offset, size) of every mirrored field, plus ("", size, align) rows.
        #[cfg(test)]
        pub const LAYOUTS: &[(&str, &str, usize, usize)] = &[
            $(
                ($cname, "", core::mem::size_of::<$name>(), core::mem::align_of::<$name>()),
                $( ($cname, stringify!($f), core::mem::offset_of!($name, $f), size_of_field::<$name, $t>(|s: &$name| &s.$f)), )*
            )*
        ];
    };
}

/// The header every flow specification starts with (`hdr` of `union ibv_flow_spec`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ibv_flow_spec_hdr {
    pub type_: u32,
    pub size: u16,
}

/// The anonymous `tm` member of `struct ibv_ops_wr` (its offset and the whole struct's size
/// are checked through `ibv_ops_wr`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ibv_ops_wr_tm {
    pub unexpected_cnt: u32,
    pub handle: u32,
    pub recv_wr_id: u64,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub tag: u64,
    pub mask: u64,
}

/// `union ibv_gid`: 16 bytes in network order, 8-aligned (it also holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[cfg(test)]
const fn size_of_field<S, T>(_: fn(&S) -> &T) -> usize {
    core::mem::size_of::<T>()
}

mirrors! {
    ibv_device = "struct ibv_device" {
        _ops: [*mut c_void; 2],
        node_type: c_int,
        transport_type: c_int,
        name: [c_char; 64],
        dev_name: [c_char; 64],
        dev_path: [c_char; 256],
        ibdev_path: [c_char; 256],
    }
    ibv_context_ops = "struct ibv_context_ops" {
        _compat_query_device: *mut c_void,
        _compat_query_port: *mut c_void,
        _compat_alloc_pd: *mut c_void,
        _compat_dealloc_pd: *mut c_void,
        _compat_reg_mr: *mut c_void,
        _compat_rereg_mr: *mut c_void,
        _compat_dereg_mr: *mut c_void,
        alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw>,
        bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
        dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
        _compat_create_cq: *mut c_void,
        poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
        req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
        _compat_cq_event: *mut c_void,
        _compat_resize_cq: *mut c_void,
        _compat_destroy_cq: *mut c_void,
        _compat_create_srq: *mut c_void,
        _compat_modify_srq: *mut c_void,
        _compat_query_srq: *mut c_void,
        _compat_destroy_srq: *mut c_void,
        post_srq_recv: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
        _compat_create_qp: *mut c_void,
        _compat_query_qp: *mut c_void,
        _compat_modify_qp: *mut c_void,
        _compat_destroy_qp: *mut c_void,
        post_send: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
        post_recv: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
        _compat_create_ah: *mut c_void,
        _compat_destroy_ah: *mut c_void,
        _compat_attach_mcast: *mut c_void,
        _compat_detach_mcast: *mut c_void,
        _compat_async_event: *mut c_void,
    }
    ibv_context = "struct ibv_context" {
        device: *mut ibv_device,
        ops: ibv_context_ops,
        cmd_fd: c_int,
        async_fd: c_int,
        num_comp_vectors: c_int,
        mutex: pthread_mutex_t,
        abi_compat: *mut c_void,
    }
    verbs_context = "struct verbs_context" {
        query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
        advise_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int>,
        alloc_null_mr: *mut c_void,
        read_counters: *mut c_void,
        attach_counters_point_flow: *mut c_void,
        create_counters: *mut c_void,
        destroy_counters: *mut c_void,
        reg_dm_mr: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr>,
        alloc_dm: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm>,
        free_dm: Option<unsafe extern "C" fn(*mut ibv_dm) -> c_int>,
        modify_flow_action_esp: *mut c_void,
        destroy_flow_action: *mut c_void,
        create_flow_action_esp: *mut c_void,
        modify_qp_rate_limit: *mut c_void,
        alloc_parent_domain: Option<
            unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd,
        >,
        dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
        alloc_td: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
        modify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, *mut ibv_modify_cq_attr) -> c_int>,
        post_srq_ops: Option<
            unsafe extern "C" fn(*mut ibv_srq, *mut ibv_ops_wr, *mut *mut ibv_ops_wr) -> c_int,
        >,
        destroy_rwq_ind_table: Option<unsafe extern "C" fn(*mut ibv_rwq_ind_table) -> c_int>,
        create_rwq_ind_table: Option<
            unsafe extern "C" fn(*mut ibv_context, *mut ibv_rwq_ind_table_init_attr) -> *mut ibv_rwq_ind_table,
        >,
        destroy_wq: Option<unsafe extern "C" fn(*mut ibv_wq) -> c_int>,
        modify_wq: Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_wq_attr) -> c_int>,
        create_wq: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_wq_init_attr) -> *mut ibv_wq>,
        query_rt_values: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int>,
        create_cq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
        priv_: *mut c_void,
        query_device_ex: Option<
            unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut ibv_device_attr_ex, usize) -> c_int,
        >,
        ibv_destroy_flow: Option<unsafe extern "C" fn(*mut ibv_flow) -> c_int>,
        ABI_placeholder2: *mut c_void,
        ibv_create_flow: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_flow_attr) -> *mut ibv_flow>,
        ABI_placeholder1: *mut c_void,
        open_qp: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp>,
        create_qp_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
        get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
        create_srq_ex:
            Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
        open_xrcd:
            Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd>,
        close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
        _ABI_placeholder3: u64,
        sz: usize,
        context: ibv_context,
    }
    ibv_device_attr = "struct ibv_device_attr" {
        fw_ver: [c_char; 64],
        node_guid: u64,
        sys_image_guid: u64,
        max_mr_size: u64,
        page_size_cap: u64,
        vendor_id: u32,
        vendor_part_id: u32,
        hw_ver: u32,
        max_qp: c_int,
        max_qp_wr: c_int,
        device_cap_flags: c_uint,
        max_sge: c_int,
        max_sge_rd: c_int,
        max_cq: c_int,
        max_cqe: c_int,
        max_mr: c_int,
        max_pd: c_int,
        max_qp_rd_atom: c_int,
        max_ee_rd_atom: c_int,
        max_res_rd_atom: c_int,
        max_qp_init_rd_atom: c_int,
        max_ee_init_rd_atom: c_int,
        atomic_cap: u32,
        max_ee: c_int,
        max_rdd: c_int,
        max_mw: c_int,
        max_raw_ipv6_qp: c_int,
        max_raw_ethy_qp: c_int,
        max_mcast_grp: c_int,
        max_mcast_qp_attach: c_int,
        max_total_mcast_qp_attach: c_int,
        max_ah: c_int,
        max_fmr: c_int,
        max_map_per_fmr: c_int,
        max_srq: c_int,
        max_srq_wr: c_int,
        max_srq_sge: c_int,
        max_pkeys: u16,
        local_ca_ack_delay: u8,
        phys_port_cnt: u8,
    }
    /// The capability structs the emulator never offers (ODP, packet pacing, tag matching, PCI
    /// atomics) stay opaque bytes, reported all-zero (absent).
    ibv_device_attr_ex = "struct ibv_device_attr_ex" {
        orig_attr: ibv_device_attr,
        comp_mask: u32,
        odp_caps: [u64; 3],
        completion_timestamp_mask: u64,
        hca_core_clock: u64,
        device_cap_flags_ex: u64,
        tso_caps: ibv_tso_caps,
        rss_caps: ibv_rss_caps,
        max_wq_type_rq: u32,
        packet_pacing_caps: [u32; 3],
        raw_packet_caps: u32,
        tm_caps: [u32; 5],
        cq_mod_caps: ibv_cq_moderation_caps,
        max_dm_size: u64,
        pci_atomic_caps: [u16; 3],
        xrc_odp_caps: u32,
        phys_port_cnt_ex: u32,
    }
    ibv_tso_caps = "struct ibv_tso_caps" {
        max_tso: u32,
        supported_qpts: u32,
    }
    ibv_rss_caps = "struct ibv_rss_caps" {
        supported_qpts: u32,
        max_rwq_indirection_tables: u32,
        max_rwq_indirection_table_size: u32,
        rx_hash_fields_mask: u64,
        rx_hash_function: u8,
    }
    ibv_rx_hash_conf = "struct ibv_rx_hash_conf" {
        rx_hash_function: u8,
        rx_hash_key_len: u8,
        rx_hash_key: *mut u8,
        rx_hash_fields_mask: u64,
    }
    ibv_wq = "struct ibv_wq" {
        context: *mut ibv_context,
        wq_context: *mut c_void,
        pd: *mut ibv_pd,
        cq: *mut ibv_cq,
        wq_num: u32,
        handle: u32,
        state: u32,
        wq_type: u32,
        post_recv: Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
        mutex: pthread_mutex_t,
        cond: pthread_cond_t,
        events_completed: u32,
        comp_mask: u32,
    }
    ibv_wq_init_attr = "struct ibv_wq_init_attr" {
        wq_context: *mut c_void,
        wq_type: u32,
        max_wr: u32,
        max_sge: u32,
        pd: *mut ibv_pd,
        cq: *mut ibv_cq,
        comp_mask: u32,
        create_flags: u32,
    }
    ibv_wq_attr = "struct ibv_wq_attr" {
        attr_mask: u32,
        wq_state: u32,
        curr_wq_state: u32,
        flags: u32,
        flags_mask: u32,
    }
    ibv_rwq_ind_table = "struct ibv_rwq_ind_table" {
        context: *mut ibv_context,
        ind_tbl_handle: c_int,
        ind_tbl_num: c_int,
        comp_mask: u32,
    }
    ibv_rwq_ind_table_init_attr = "struct ibv_rwq_ind_table_init_attr" {
        log_ind_tbl_size: u32,
        ind_tbl: *mut *mut ibv_wq,
        comp_mask: u32,
    }
    ibv_flow = "struct ibv_flow" {
        comp_mask: u32,
        context: *mut ibv_context,
        handle: u32,
    }
    /// The specifications follow it in memory, each starting with `ibv_flow_spec_hdr`.
    ibv_flow_attr = "struct ibv_flow_attr" {
        comp_mask: u32,
        type_: u32,
        size: u16,
        priority: u16,
        num_of_specs: u8,
        port: u8,
        flags: u32,
    }
    ibv_flow_eth_filter = "struct ibv_flow_eth_filter" {
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        ether_type: u16,
        vlan_tag: u16,
    }
    ibv_flow_spec_eth = "struct ibv_flow_spec_eth" {
        type_: u32,
        size: u16,
        val: ibv_flow_eth_filter,
        mask: ibv_flow_eth_filter,
    }
    ibv_flow_ipv4_filter = "struct ibv_flow_ipv4_filter" {
        src_ip: u32,
        dst_ip: u32,
    }
    ibv_flow_spec_ipv4 = "struct ibv_flow_spec_ipv4" {
        type_: u32,
        size: u16,
        val: ibv_flow_ipv4_filter,
        mask: ibv_flow_ipv4_filter,
    }
    ibv_flow_ipv4_ext_filter = "struct ibv_flow_ipv4_ext_filter" {
        src_ip: u32,
        dst_ip: u32,
        proto: u8,
        tos: u8,
        ttl: u8,
        flags: u8,
    }
    ibv_flow_spec_ipv4_ext = "struct ibv_flow_spec_ipv4_ext" {
        type_: u32,
        size: u16,
        val: ibv_flow_ipv4_ext_filter,
        mask: ibv_flow_ipv4_ext_filter,
    }
    ibv_flow_ipv6_filter = "struct ibv_flow_ipv6_filter" {
        src_ip: [u8; 16],
        dst_ip: [u8; 16],
        flow_label: u32,
        next_hdr: u8,
        traffic_class: u8,
        hop_limit: u8,
    }
    ibv_flow_spec_ipv6 = "struct ibv_flow_spec_ipv6" {
        type_: u32,
        size: u16,
        val: ibv_flow_ipv6_filter,
        mask: ibv_flow_ipv6_filter,
    }
    ibv_flow_tcp_udp_filter = "struct ibv_flow_tcp_udp_filter" {
        dst_port: u16,
        src_port: u16,
    }
    ibv_flow_spec_tcp_udp = "struct ibv_flow_spec_tcp_udp" {
        type_: u32,
        size: u16,
        val: ibv_flow_tcp_udp_filter,
        mask: ibv_flow_tcp_udp_filter,
    }
    ibv_flow_spec_action_tag = "struct ibv_flow_spec_action_tag" {
        type_: u32,
        size: u16,
        tag_id: u32,
    }
    ibv_cq_moderation_caps = "struct ibv_cq_moderation_caps" {
        max_cq_count: u16,
        max_cq_period: u16,
    }
    ibv_moderate_cq = "struct ibv_moderate_cq" {
        cq_count: u16,
        cq_period: u16,
    }
    ibv_modify_cq_attr = "struct ibv_modify_cq_attr" {
        attr_mask: u32,
        moderate: ibv_moderate_cq,
    }
    ibv_values_ex = "struct ibv_values_ex" {
        comp_mask: u32,
        raw_clock: libc::timespec,
    }
    ibv_port_attr = "struct ibv_port_attr" {
        state: u32,
        max_mtu: u32,
        active_mtu: u32,
        gid_tbl_len: c_int,
        port_cap_flags: u32,
        max_msg_sz: u32,
        bad_pkey_cntr: u32,
        qkey_viol_cntr: u32,
        pkey_tbl_len: u16,
        lid: u16,
        sm_lid: u16,
        lmc: u8,
        max_vl_num: u8,
        sm_sl: u8,
        subnet_timeout: u8,
        init_type_reply: u8,
        active_width: u8,
        active_speed: u8,
        phys_state: u8,
        link_layer: u8,
        flags: u8,
        port_cap_flags2: u16,
    }
    ibv_gid_entry = "struct ibv_gid_entry" {
        gid: ibv_gid,
        gid_index: u32,
        port_num: u32,
        gid_type: u32,
        ndev_ifindex: u32,
    }
    ibv_pd = "struct ibv_pd" {
        context: *mut ibv_context,
        handle: u32,
    }
    ibv_td = "struct ibv_td" {
        context: *mut ibv_context,
    }
    ibv_td_init_attr = "struct ibv_td_init_attr" {
        comp_mask: u32,
    }
    ibv_parent_domain_init_attr = "struct ibv_parent_domain_init_attr" {
        pd: *mut ibv_pd,
        td: *mut ibv_td,
        comp_mask: u32,
        alloc: Option<crate::verbs::parent::AllocFn>,
        free: Option<crate::verbs::parent::FreeFn>,
        pd_context: *mut c_void,
    }
    ibv_dm = "struct ibv_dm" {
        context: *mut ibv_context,
        memcpy_to_dm: Option<unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int>,
        memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int>,
        comp_mask: u32,
        handle: u32,
    }
    ibv_ece = "struct ibv_ece" {
        vendor_id: u32,
        options: u32,
        comp_mask: u32,
    }
    ibv_alloc_dm_attr = "struct ibv_alloc_dm_attr" {
        length: usize,
        log_align_req: u32,
        comp_mask: u32,
    }
    ibv_mr = "struct ibv_mr" {
        context: *mut ibv_context,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        handle: u32,
        lkey: u32,
        rkey: u32,
    }
    ibv_comp_channel = "struct ibv_comp_channel" {
        context: *mut ibv_context,
        fd: c_int,
        refcnt: c_int,
    }
    ibv_cq = "struct ibv_cq" {
        context: *mut ibv_context,
        channel: *mut ibv_comp_channel,
        cq_context: *mut c_void,
        handle: u32,
        cqe: c_int,
        mutex: pthread_mutex_t,
        cond: pthread_cond_t,
        comp_events_completed: u32,
        async_events_completed: u32,
    }
    ibv_cq_ex = "struct ibv_cq_ex" {
        context: *mut ibv_context,
        channel: *mut ibv_comp_channel,
        cq_context: *mut c_void,
        handle: u32,
        cqe: c_int,
        mutex: pthread_mutex_t,
        cond: pthread_cond_t,
        comp_events_completed: u32,
        async_events_completed: u32,
        comp_mask: u32,
        status: u32,
        wr_id: u64,
        start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void) -> c_int>,
        next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
        end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
        read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
        read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
        read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
        read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
        read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
        read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
        read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    }
    ibv_cq_init_attr_ex = "struct ibv_cq_init_attr_ex" {
        cqe: u32,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: u32,
        wc_flags: u64,
        comp_mask: u32,
        flags: u32,
        parent_domain: *mut ibv_pd,
    }
    ibv_wc = "struct ibv_wc" {
        wr_id: u64,
        status: u32,
        opcode: u32,
        vendor_err: u32,
        byte_len: u32,
        imm_data: u32,
        qp_num: u32,
        src_qp: u32,
        wc_flags: c_uint,
        pkey_index: u16,
        slid: u16,
        sl: u8,
        dlid_path_bits: u8,
    }
    ibv_sge = "struct ibv_sge" {
        addr: u64,
        length: u32,
        lkey: u32,
    }
    /// `wr` is the union of rdma / atomic / ud; read it through the accessors below.
    ibv_send_wr = "struct ibv_send_wr" {
        wr_id: u64,
        next: *mut ibv_send_wr,
        sg_list: *mut ibv_sge,
        num_sge: c_int,
        opcode: u32,
        send_flags: c_uint,
        imm_data: u32,
        wr: [u64; 4],
        qp_type: u32,
        bind_mw: [u64; 6],
    }
    ibv_recv_wr = "struct ibv_recv_wr" {
        wr_id: u64,
        next: *mut ibv_recv_wr,
        sg_list: *mut ibv_sge,
        num_sge: c_int,
    }
    ibv_qp = "struct ibv_qp" {
        context: *mut ibv_context,
        qp_context: *mut c_void,
        pd: *mut ibv_pd,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut c_void,
        handle: u32,
        qp_num: u32,
        state: u32,
        qp_type: u32,
        mutex: pthread_mutex_t,
        cond: pthread_cond_t,
        events_completed: u32,
    }
    ibv_qp_ex = "struct ibv_qp_ex" {
        qp_base: ibv_qp,
        comp_mask: u64,
        wr_id: u64,
        wr_flags: c_uint,
        wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
        wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
        wr_bind_mw:
            Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
        wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
        wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
        wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
        wr_set_inline_data_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
        wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
        wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
        wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    }
    ibv_data_buf = "struct ibv_data_buf" {
        addr: *mut c_void,
        length: usize,
    }
    ibv_qp_init_attr_ex = "struct ibv_qp_init_attr_ex" {
        qp_context: *mut c_void,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut c_void,
        cap: ibv_qp_cap,
        qp_type: u32,
        sq_sig_all: c_int,
        comp_mask: u32,
        pd: *mut ibv_pd,
        xrcd: *mut ibv_xrcd,
        create_flags: u32,
        max_tso_header: u16,
        rwq_ind_tbl: *mut ibv_rwq_ind_table,
        rx_hash_conf: ibv_rx_hash_conf,
        source_qpn: u32,
        send_ops_flags: u64,
    }
    ibv_qp_cap = "struct ibv_qp_cap" {
        max_send_wr: u32,
        max_recv_wr: u32,
        max_send_sge: u32,
        max_recv_sge: u32,
        max_inline_data: u32,
    }
    ibv_qp_init_attr = "struct ibv_qp_init_attr" {
        qp_context: *mut c_void,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut c_void,
        cap: ibv_qp_cap,
        qp_type: u32,
        sq_sig_all: c_int,
    }
    ibv_global_route = "struct ibv_global_route" {
        dgid: ibv_gid,
        flow_label: u32,
        sgid_index: u8,
        hop_limit: u8,
        traffic_class: u8,
    }
    rdma_event_channel = "struct rdma_event_channel" {
        fd: c_int,
    }
    rdma_ib_addr = "struct rdma_ib_addr" {
        sgid: ibv_gid,
        dgid: ibv_gid,
        pkey: u16,
    }
    rdma_addr = "struct rdma_addr" {
        /// `struct sockaddr_storage` (also `src_addr`, `src_sin`, `src_sin6`).
        src_storage: [u64; 16],
        dst_storage: [u64; 16],
        /// `union { struct rdma_ib_addr ibaddr; } addr`.
        addr: rdma_ib_addr,
    }
    rdma_route = "struct rdma_route" {
        addr: rdma_addr,
        path_rec: *mut c_void,
        num_paths: c_int,
    }
    rdma_cm_id = "struct rdma_cm_id" {
        verbs: *mut ibv_context,
        channel: *mut rdma_event_channel,
        context: *mut c_void,
        qp: *mut ibv_qp,
        route: rdma_route,
        ps: u32,
        port_num: u8,
        event: *mut rdma_cm_event,
        send_cq_channel: *mut ibv_comp_channel,
        send_cq: *mut ibv_cq,
        recv_cq_channel: *mut ibv_comp_channel,
        recv_cq: *mut ibv_cq,
        srq: *mut ibv_srq,
        pd: *mut ibv_pd,
        qp_type: u32,
    }
    rdma_conn_param = "struct rdma_conn_param" {
        private_data: *const c_void,
        private_data_len: u8,
        responder_resources: u8,
        initiator_depth: u8,
        flow_control: u8,
        retry_count: u8,
        rnr_retry_count: u8,
        srq: u8,
        qp_num: u32,
    }
    rdma_cm_join_mc_attr_ex = "struct rdma_cm_join_mc_attr_ex" {
        comp_mask: u32,
        join_flags: u32,
        addr: *mut libc::sockaddr,
    }
    rdma_ud_param = "struct rdma_ud_param" {
        private_data: *const c_void,
        private_data_len: u8,
        ah_attr: ibv_ah_attr,
        qp_num: u32,
        qkey: u32,
    }
    rdma_cm_event = "struct rdma_cm_event" {
        id: *mut rdma_cm_id,
        listen_id: *mut rdma_cm_id,
        event: u32,
        status: c_int,
        /// `union { struct rdma_conn_param conn; struct rdma_ud_param ud; }`.
        param: rdma_ud_param,
    }
    rdma_addrinfo = "struct rdma_addrinfo" {
        ai_flags: c_int,
        ai_family: c_int,
        ai_qp_type: c_int,
        ai_port_space: c_int,
        ai_src_len: u32,
        ai_dst_len: u32,
        ai_src_addr: *mut libc::sockaddr,
        ai_dst_addr: *mut libc::sockaddr,
        ai_src_canonname: *mut c_char,
        ai_dst_canonname: *mut c_char,
        ai_route_len: usize,
        ai_route: *mut c_void,
        ai_connect_len: usize,
        ai_connect: *mut c_void,
        ai_next: *mut rdma_addrinfo,
    }
    ibv_ah_attr = "struct ibv_ah_attr" {
        grh: ibv_global_route,
        dlid: u16,
        sl: u8,
        src_path_bits: u8,
        static_rate: u8,
        is_global: u8,
        port_num: u8,
    }
    ibv_qp_attr = "struct ibv_qp_attr" {
        qp_state: u32,
        cur_qp_state: u32,
        path_mtu: u32,
        path_mig_state: u32,
        qkey: u32,
        rq_psn: u32,
        sq_psn: u32,
        dest_qp_num: u32,
        qp_access_flags: c_uint,
        cap: ibv_qp_cap,
        ah_attr: ibv_ah_attr,
        alt_ah_attr: ibv_ah_attr,
        pkey_index: u16,
        alt_pkey_index: u16,
        en_sqd_async_notify: u8,
        sq_draining: u8,
        max_rd_atomic: u8,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
        port_num: u8,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        alt_port_num: u8,
        alt_timeout: u8,
        rate_limit: u32,
    }
    ib_uverbs_global_route = "struct ib_uverbs_global_route" {
        dgid: [u8; 16],
        flow_label: u32,
        sgid_index: u8,
        hop_limit: u8,
        traffic_class: u8,
        reserved: u8,
    }
    ib_uverbs_ah_attr = "struct ib_uverbs_ah_attr" {
        grh: ib_uverbs_global_route,
        dlid: u16,
        sl: u8,
        src_path_bits: u8,
        static_rate: u8,
        is_global: u8,
        port_num: u8,
        reserved: u8,
    }
    /// The kernel's QP attributes (`<rdma/ib_user_verbs.h>`), as `ibv_copy_qp_attr_from_kern`
    /// reads them.
    ib_uverbs_qp_attr = "struct ib_uverbs_qp_attr" {
        qp_attr_mask: u32,
        qp_state: u32,
        cur_qp_state: u32,
        path_mtu: u32,
        path_mig_state: u32,
        qkey: u32,
        rq_psn: u32,
        sq_psn: u32,
        dest_qp_num: u32,
        qp_access_flags: u32,
        ah_attr: ib_uverbs_ah_attr,
        alt_ah_attr: ib_uverbs_ah_attr,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_send_sge: u32,
        max_recv_sge: u32,
        max_inline_data: u32,
        pkey_index: u16,
        alt_pkey_index: u16,
        en_sqd_async_notify: u8,
        sq_draining: u8,
        max_rd_atomic: u8,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
        port_num: u8,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        alt_port_num: u8,
        alt_timeout: u8,
        reserved: [u8; 5],
    }
    /// The kernel's path record (`<rdma/ib_user_sa.h>`).
    ib_user_path_rec = "struct ib_user_path_rec" {
        dgid: [u8; 16],
        sgid: [u8; 16],
        dlid: u16,
        slid: u16,
        raw_traffic: u32,
        flow_label: u32,
        reversible: u32,
        mtu: u32,
        pkey: u16,
        hop_limit: u8,
        traffic_class: u8,
        numb_path: u8,
        sl: u8,
        mtu_selector: u8,
        rate_selector: u8,
        rate: u8,
        packet_life_time_selector: u8,
        packet_life_time: u8,
        preference: u8,
    }
    /// libibverbs' path record (`<infiniband/sa.h>`).
    ibv_sa_path_rec = "struct ibv_sa_path_rec" {
        dgid: ibv_gid,
        sgid: ibv_gid,
        dlid: u16,
        slid: u16,
        raw_traffic: c_int,
        flow_label: u32,
        hop_limit: u8,
        traffic_class: u8,
        reversible: c_int,
        numb_path: u8,
        pkey: u16,
        sl: u8,
        mtu_selector: u8,
        mtu: u8,
        rate_selector: u8,
        rate: u8,
        packet_life_time_selector: u8,
        packet_life_time: u8,
        preference: u8,
    }
    ibv_srq = "struct ibv_srq" {
        context: *mut ibv_context,
        srq_context: *mut c_void,
        pd: *mut ibv_pd,
        handle: u32,
        mutex: pthread_mutex_t,
        cond: pthread_cond_t,
        events_completed: u32,
    }
    ibv_srq_attr = "struct ibv_srq_attr" {
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    }
    ibv_srq_init_attr = "struct ibv_srq_init_attr" {
        srq_context: *mut c_void,
        attr: ibv_srq_attr,
    }
    ibv_ops_wr = "struct ibv_ops_wr" {
        wr_id: u64,
        next: *mut ibv_ops_wr,
        opcode: u32,
        flags: c_int,
        /// The anonymous `tm` struct.
        tm: ibv_ops_wr_tm,
    }
    ibv_srq_init_attr_ex = "struct ibv_srq_init_attr_ex" {
        srq_context: *mut c_void,
        attr: ibv_srq_attr,
        comp_mask: u32,
        srq_type: u32,
        pd: *mut ibv_pd,
        xrcd: *mut ibv_xrcd,
        cq: *mut ibv_cq,
        tm_cap: [u32; 2],
    }
    ibv_xrcd = "struct ibv_xrcd" {
        context: *mut ibv_context,
    }
    ibv_xrcd_init_attr = "struct ibv_xrcd_init_attr" {
        comp_mask: u32,
        fd: c_int,
        oflags: c_int,
    }
    ibv_qp_open_attr = "struct ibv_qp_open_attr" {
        comp_mask: u32,
        qp_num: u32,
        xrcd: *mut ibv_xrcd,
        qp_context: *mut c_void,
        qp_type: u32,
    }
    ibv_mw = "struct ibv_mw" {
        context: *mut ibv_context,
        pd: *mut ibv_pd,
        rkey: u32,
        handle: u32,
        type_: u32,
    }
    ibv_mw_bind_info = "struct ibv_mw_bind_info" {
        mr: *mut ibv_mr,
        addr: u64,
        length: u64,
        mw_access_flags: c_uint,
    }
    ibv_mw_bind = "struct ibv_mw_bind" {
        wr_id: u64,
        send_flags: c_uint,
        bind_info: ibv_mw_bind_info,
    }
    ibv_ah = "struct ibv_ah" {
        context: *mut ibv_context,
        pd: *mut ibv_pd,
        handle: u32,
    }
    /// `element` is the union of cq / qp / srq / wq pointers and `port_num`.
    ibv_async_event = "struct ibv_async_event" {
        element: *mut c_void,
        event_type: u32,
    }
}

impl ibv_send_wr {
    /// `wr.rdma.remote_addr` / `wr.atomic.remote_addr`.
    pub fn remote_addr(&self) -> u64 {
        self.wr[0]
    }
    /// `wr.rdma.rkey` (the low half of the second word).
    pub fn rdma_rkey(&self) -> u32 {
        self.wr[1] as u32
    }
    /// `wr.atomic.compare_add`.
    pub fn compare_add(&self) -> u64 {
        self.wr[1]
    }
    /// `wr.atomic.swap`.
    pub fn swap(&self) -> u64 {
        self.wr[2]
    }
    /// `wr.atomic.rkey`.
    pub fn atomic_rkey(&self) -> u32 {
        self.wr[3] as u32
    }
    /// `wr.ud.ah`.
    pub fn ud_ah(&self) -> *mut ibv_ah {
        self.wr[0] as usize as *mut ibv_ah
    }
    /// `wr.ud.remote_qpn`.
    pub fn ud_remote_qpn(&self) -> u32 {
        self.wr[1] as u32
    }
    /// `wr.ud.remote_qkey`.
    pub fn ud_remote_qkey(&self) -> u32 {
        (self.wr[1] >> 32) as u32
    }
    /// `invalidate_rkey` (shares its union with `imm_data`).
    pub fn invalidate_rkey(&self) -> u32 {
        self.imm_data
    }
    /// `bind_mw.mw`.
    pub fn bind_mw_mw(&self) -> *mut ibv_mw {
        self.bind_mw[0] as usize as *mut ibv_mw
    }
    /// `bind_mw.rkey`.
    pub fn bind_mw_rkey(&self) -> u32 {
        self.bind_mw[1] as u32
    }
    /// `tso.hdr`, `tso.hdr_sz`, `tso.mss` (sharing their union with `bind_mw`).
    pub fn tso(&self) -> (*const u8, u16, u16) {
        let w = self.bind_mw[1];
        (self.bind_mw[0] as usize as *const u8, w as u16, (w >> 16) as u16)
    }
    /// `bind_mw.bind_info`.
    pub fn bind_mw_info(&self) -> ibv_mw_bind_info {
        ibv_mw_bind_info {
            mr: self.bind_mw[2] as usize as *mut ibv_mr,
            addr: self.bind_mw[3],
            length: self.bind_mw[4],
            mw_access_flags: self.bind_mw[5] as u32,
        }
    }
}

#[cfg(test)]
mod layout_test {
    //! Compiles C against the system's `<infiniband/verbs.h>` and compares size, alignment and
    //! every mirrored field's offset and size with the Rust mirrors.

    use std::{fmt::Write as _, process::Command};

    fn c_field(f: &str) -> &str {
        match f {
            "priv_" => "priv",
            "type_" => "type",
            _ => f,
        }
    }

    #[test]
    fn every_mirror_matches_the_c_compiler() {
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n#include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\n#include <infiniband/sa.h>\nint main(void) {\n",
        );
        let rows: Vec<_> = super::LAYOUTS.iter().collect();
        for (s, f, _, _) in &rows {
            if f.is_empty() {
                writeln!(c, "printf(\"%zu %zu\\n\", sizeof({s}), _Alignof({s}));").unwrap();
            } else {
                let f = c_field(f);
                writeln!(c, "printf(\"%zu %zu\\n\", offsetof({s}, {f}), sizeof((({s} *)0)->{f}));")
                    .unwrap();
            }
        }
        c.push_str("return 0; }\n");
        let dir = std::env::temp_dir().join(format!("rdma-emu-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("layout.c"), c).unwrap();
        let exe = dir.join("layout");
        let cc = Command::new("cc")
            .arg(dir.join("layout.c"))
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("run cc");
        assert!(
            cc.status.success(),
            "cc failed (is libibverbs-dev installed?): {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut bad = Vec::new();
        for ((s, f, a, b), line) in rows.iter().zip(text.lines()) {
            let mut it = line.split(' ').map(|x| x.parse::<usize>().unwrap());
            let (ca, cb) = (it.next().unwrap(), it.next().unwrap());
            if (ca, cb) != (*a, *b) {
                bad.push(format!("{s}.{f}: C ({ca}, {cb}) vs Rust ({a}, {b})"));
            }
        }
        assert_eq!(text.lines().count(), rows.len());
        assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
        let _ = std::fs::remove_dir_all(dir);
    }
}

//! Value types of the verbs interface, with the numeric values of `<infiniband/verbs.h>`.
//!
//! Enumerations that a C caller can hand us are open newtypes (`WcStatus(u32)` with named
//! constants), never Rust enums: an out-of-range value from C must be representable so that it
//! can be rejected with `EINVAL` instead of being undefined behaviour.

use bitflags::bitflags;

/// Declares an open enumeration: a transparent newtype with named constants and a `Debug` that
/// prints the constant's name.
macro_rules! open_enum {
    ($(#[$m:meta])* $name:ident($repr:ty) { $($(#[$vm:meta])* $v:ident = $val:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[repr(transparent)]
        pub struct $name(pub $repr);
        impl $name {
            $($(#[$vm])* pub const $v: $name = $name($val);)*
            /// The constant's name, if the value is a known one.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $(x if x == $val => Some(stringify!($v)),)* _ => None }
            }
        }
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }
    };
}

open_enum! {
    /// `enum ibv_wc_status`.
    WcStatus(u32) {
        SUCCESS = 0, LOC_LEN_ERR = 1, LOC_QP_OP_ERR = 2, LOC_EEC_OP_ERR = 3, LOC_PROT_ERR = 4,
        WR_FLUSH_ERR = 5, MW_BIND_ERR = 6, BAD_RESP_ERR = 7, LOC_ACCESS_ERR = 8,
        REM_INV_REQ_ERR = 9, REM_ACCESS_ERR = 10, REM_OP_ERR = 11, RETRY_EXC_ERR = 12,
        RNR_RETRY_EXC_ERR = 13, LOC_RDD_VIOL_ERR = 14, REM_INV_RD_REQ_ERR = 15,
        REM_ABORT_ERR = 16, INV_EECN_ERR = 17, INV_EEC_STATE_ERR = 18, FATAL_ERR = 19,
        RESP_TIMEOUT_ERR = 20, GENERAL_ERR = 21, TM_ERR = 22, TM_RNDV_INCOMPLETE = 23,
    }
}

open_enum! {
    /// `enum ibv_wc_opcode`.
    WcOpcode(u32) {
        SEND = 0, RDMA_WRITE = 1, RDMA_READ = 2, COMP_SWAP = 3, FETCH_ADD = 4, BIND_MW = 5,
        LOCAL_INV = 6, TSO = 7, FLUSH = 8, ATOMIC_WRITE = 9, RECV = 128, RECV_RDMA_WITH_IMM = 129,
        TM_ADD = 130, TM_DEL = 131, TM_SYNC = 132, TM_RECV = 133, TM_NO_TAG = 134,
    }
}

open_enum! {
    /// `enum ibv_wr_opcode`.
    WrOpcode(u32) {
        RDMA_WRITE = 0, RDMA_WRITE_WITH_IMM = 1, SEND = 2, SEND_WITH_IMM = 3, RDMA_READ = 4,
        ATOMIC_CMP_AND_SWP = 5, ATOMIC_FETCH_AND_ADD = 6, LOCAL_INV = 7, BIND_MW = 8,
        SEND_WITH_INV = 9, TSO = 10, DRIVER1 = 11, FLUSH = 14, ATOMIC_WRITE = 15,
    }
}

bitflags! {
    /// `enum ibv_placement_type`: where an RDMA FLUSH makes the data land.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct FlushType: u8 {
        /// Visible to every later reader (the responder's memory hierarchy).
        const GLOBAL = 1;
        /// Written back to the memory's persistence domain.
        const PERSISTENT = 1 << 1;
    }
}

open_enum! {
    /// `enum ibv_selectivity_level`: what an RDMA FLUSH covers.
    FlushLevel(u8) {
        /// The range the request names.
        RANGE = 0,
        /// The whole memory region its rkey names.
        MR = 1,
    }
}

open_enum! {
    /// `enum ibv_advise_mr_advice`: what `ibv_advise_mr` asks of an on-demand MR's pages.
    Advice(u32) {
        /// Bring the pages in for reading.
        PREFETCH = 0,
        /// Bring them in for writing (the MR needs local write).
        PREFETCH_WRITE = 1,
        /// Map only what is present, faulting nothing in: never fails on missing pages.
        PREFETCH_NO_FAULT = 2,
    }
}

open_enum! {
    /// `enum ibv_mw_type`.
    MwType(u32) { TYPE_1 = 1, TYPE_2 = 2, }
}

open_enum! {
    /// `enum ibv_qp_type`.
    QpType(u32) {
        RC = 2, UC = 3, UD = 4, RAW_PACKET = 8, XRC_SEND = 9, XRC_RECV = 10, DRIVER = 0xff,
    }
}

impl QpType {
    /// Reliable transports: ACKs, retransmission, RDMA READ and atomics.
    pub fn is_reliable(self) -> bool {
        matches!(self, QpType::RC | QpType::XRC_SEND | QpType::XRC_RECV)
    }
}

open_enum! {
    /// `enum ibv_qp_state`.
    QpState(u32) {
        RESET = 0, INIT = 1, RTR = 2, RTS = 3, SQD = 4, SQE = 5, ERR = 6, UNKNOWN = 7,
    }
}

open_enum! {
    /// `enum ibv_mtu`.
    Mtu(u32) { MTU_256 = 1, MTU_512 = 2, MTU_1024 = 3, MTU_2048 = 4, MTU_4096 = 5, }
}

impl Mtu {
    /// The MTU in bytes, or `None` for a value outside `ibv_mtu`.
    pub fn bytes(self) -> Option<u32> {
        match self.0 {
            1..=5 => Some(128 << self.0),
            _ => None,
        }
    }
}

open_enum! {
    /// `enum ibv_port_state`.
    PortState(u32) { NOP = 0, DOWN = 1, INIT = 2, ARMED = 3, ACTIVE = 4, ACTIVE_DEFER = 5, }
}

open_enum! {
    /// `enum ibv_wq_state`.
    WqState(u32) { RESET = 0, RDY = 1, ERR = 2, UNKNOWN = 3, }
}

open_enum! {
    /// `enum ibv_flow_attr_type`: which frames a steering rule takes.
    FlowType(u32) {
        /// Frames its specs match.
        NORMAL = 0,
        /// Frames no normal rule took.
        ALL_DEFAULT = 1,
        /// Multicast frames no normal rule took.
        MC_DEFAULT = 2,
        /// A copy of every frame.
        SNIFFER = 3,
    }
}

open_enum! {
    /// `IBV_LINK_LAYER_*`.
    LinkLayer(u8) { UNSPECIFIED = 0, INFINIBAND = 1, ETHERNET = 2, }
}

open_enum! {
    /// `enum ibv_event_type`.
    EventType(u32) {
        CQ_ERR = 0, QP_FATAL = 1, QP_REQ_ERR = 2, QP_ACCESS_ERR = 3, COMM_EST = 4,
        SQ_DRAINED = 5, PATH_MIG = 6, PATH_MIG_ERR = 7, DEVICE_FATAL = 8, PORT_ACTIVE = 9,
        PORT_ERR = 10, LID_CHANGE = 11, PKEY_CHANGE = 12, SM_CHANGE = 13, SRQ_ERR = 14,
        SRQ_LIMIT_REACHED = 15, QP_LAST_WQE_REACHED = 16, CLIENT_REREGISTER = 17,
        GID_CHANGE = 18, WQ_FATAL = 19,
    }
}

open_enum! {
    /// `enum ibv_atomic_cap`.
    AtomicCap(u32) { NONE = 0, HCA = 1, GLOB = 2, }
}

open_enum! {
    /// `enum ibv_gid_type` as reported by `ibv_query_gid_ex`.
    GidType(u32) { IB = 0, ROCE_V1 = 1, ROCE_V2 = 2, }
}

bitflags! {
    /// `enum ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 1 << 1;
        const REMOTE_READ = 1 << 2;
        const REMOTE_ATOMIC = 1 << 3;
        const MW_BIND = 1 << 4;
        const ZERO_BASED = 1 << 5;
        const ON_DEMAND = 1 << 6;
        const HUGETLB = 1 << 7;
        const FLUSH_GLOBAL = 1 << 8;
        const FLUSH_PERSISTENT = 1 << 9;
        const RELAXED_ORDERING = 1 << 20;
    }
}

bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        const FENCE = 1;
        const SIGNALED = 1 << 1;
        const SOLICITED = 1 << 2;
        const INLINE = 1 << 3;
        const IP_CSUM = 1 << 4;
    }
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        const GRH = 1;
        const WITH_IMM = 1 << 1;
        const IP_CSUM_OK = 1 << 2;
        const WITH_INV = 1 << 3;
        /// Tag matching: the application must sync (`IBV_OPS_TM_SYNC`) before the device
        /// matches again.
        const TM_SYNC_REQ = 1 << 4;
        /// Tag matching: the message matched a posted tag.
        const TM_MATCH = 1 << 5;
        /// Tag matching: the tag's buffer holds the message's data.
        const TM_DATA_VALID = 1 << 6;
    }
}

bitflags! {
    /// `enum ibv_wq_flags`: receive offloads of a WQ (`ibv_create_wq`, `ibv_modify_wq`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WqFlags: u32 {
        /// The 802.1Q tag of a received frame is removed; its TCI goes to the completion
        /// (`ibv_wc_read_cvlan`).
        const CVLAN_STRIPPING = 1;
        /// The frame's 4-byte FCS is written after it and counted in `byte_len`.
        const SCATTER_FCS = 1 << 1;
        /// A frame that finds no receive posted waits for one (for a while) instead of being
        /// dropped at once.
        const DELAY_DROP = 1 << 2;
        /// The write of a frame is padded with zeros to the end of its 64-byte cache line.
        const PCI_WRITE_END_PADDING = 1 << 3;
    }
}

impl WqFlags {
    /// What `ibv_modify_wq` may change on a live WQ (as on a ConnectX): C-VLAN stripping.
    pub const MODIFIABLE: WqFlags = WqFlags::CVLAN_STRIPPING;
}

bitflags! {
    /// The `enum ibv_qp_create_flags` the emulator offers: the receive offloads of a raw
    /// packet QP (see [`WqFlags`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpCreateFlags: u32 {
        const SCATTER_FCS = 1 << 8;
        const CVLAN_STRIPPING = 1 << 9;
        const PCI_WRITE_END_PADDING = 1 << 11;
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        const STATE = 1;
        const CUR_STATE = 1 << 1;
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        const ACCESS_FLAGS = 1 << 3;
        const PKEY_INDEX = 1 << 4;
        const PORT = 1 << 5;
        const QKEY = 1 << 6;
        const AV = 1 << 7;
        const PATH_MTU = 1 << 8;
        const TIMEOUT = 1 << 9;
        const RETRY_CNT = 1 << 10;
        const RNR_RETRY = 1 << 11;
        const RQ_PSN = 1 << 12;
        const MAX_QP_RD_ATOMIC = 1 << 13;
        const ALT_PATH = 1 << 14;
        const MIN_RNR_TIMER = 1 << 15;
        const SQ_PSN = 1 << 16;
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        const PATH_MIG_STATE = 1 << 18;
        const CAP = 1 << 19;
        const DEST_QPN = 1 << 20;
        const RATE_LIMIT = 1 << 25;
    }
}

/// A 128-bit GID, in network byte order as in `union ibv_gid`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an unused table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The MAC address behind the GID: the EUI-64 interface identifier of a link-local GID,
    /// or a locally administered address from its last bytes.
    pub(crate) fn mac(&self) -> [u8; 6] {
        let b = &self.0;
        if b[11] == 0xff && b[12] == 0xfe {
            [b[8] ^ 0x02, b[9], b[10], b[13], b[14], b[15]]
        } else {
            [0x02, 0, b[12], b[13], b[14], b[15]]
        }
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub(crate) fn ipv4(&self) -> Option<[u8; 4]> {
        let g = &self.0;
        (g[..10] == [0; 10] && g[10..12] == [0xff, 0xff]).then(|| [g[12], g[13], g[14], g[15]])
    }

    /// Whether it names a multicast group: an IPv4-mapped 224.0.0.0/4 address, or `ff00::/8`.
    pub(crate) fn is_multicast(&self) -> bool {
        self.ipv4().map_or(self.0[0] == 0xff, |ip| ip[0] & 0xf0 == 0xe0)
    }

    /// `fe80::` followed by the 64-bit interface identifier `guid`.
    pub fn link_local(guid: u64) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&guid.to_be_bytes());
        Gid(g)
    }

    /// The IPv4-mapped IPv6 address `::ffff:a.b.c.d` (a RoCE v2 IPv4 GID).
    pub fn ipv4_mapped(ip: [u8; 4]) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        Gid(g)
    }

    /// The RoCE v2 GID of an IP address: an IPv6 address as it is, an IPv4 one mapped.
    pub fn of_ip(ip: std::net::IpAddr) -> Gid {
        match ip {
            std::net::IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            std::net::IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The 64-bit interface identifier (the low half).
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }
}

impl std::fmt::Debug for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&std::net::Ipv6Addr::from(self.0), f)
    }
}

/// A scatter/gather element: `struct ibv_sge` (same layout, so C lists can be read in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Sge {
    /// Start address, in the address space of the MR named by `lkey` (its iova).
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_ece`: Enhanced Connection Establishment options of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    pub vendor_id: u32,
    /// Vendor-defined option bits.
    pub options: u32,
    pub comp_mask: u32,
}

/// A work completion: the fields of `struct ibv_wc`.
///
/// Laid out (`repr(C)`, in this order) so that each 8-byte word holds fields a CQ slot keeps
/// in one of its words: a completion read from its slot is then written in whole words, and
/// a copy of it (which loads whole words) never straddles two smaller stores, which stalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    /// Valid only when `status` is `SUCCESS` (as in verbs.h), but always filled.
    pub opcode: WcOpcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (or the invalidated rkey), exactly as the sender passed it.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: WcFlags,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    /// The 802.1Q TCI a receive offload stripped from the frame (`ibv_wc_read_cvlan`); 0 when
    /// none was stripped.
    pub cvlan: u16,
    /// When the completion was generated, on the device clock (`ibv_wc_read_completion_ts`;
    /// nanoseconds of the fabric's clock); 0 unless the CQ records timestamps.
    pub timestamp: u64,
    /// The tag of the steering rule that delivered the frame (`ibv_wc_read_flow_tag`); 0 for
    /// none.
    pub flow_tag: u32,
    /// Tag matching (`ibv_wc_read_tm_info`): the message's tag and its TMH's `app_ctx`.
    pub tm_priv: u32,
    pub tm_tag: u64,
}

/// Address vector: `struct ibv_ah_attr` with its `ibv_global_route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    pub dgid: Gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    /// Whether the GRH fields (`dgid`, ...) are valid.
    pub is_global: bool,
    pub port_num: u8,
}

/// A global route header as it travels (RoCE v2: the IP header's fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grh {
    pub(crate) sgid: Gid,
    pub(crate) dgid: Gid,
    /// Traffic class (IPv4: the TOS byte).
    pub(crate) traffic_class: u8,
    /// 20-bit flow label (none in IPv4).
    pub(crate) flow_label: u32,
    /// Hop limit (IPv4: the TTL).
    pub(crate) hop_limit: u8,
}

/// The device index of destinations over a wire port: packets routed there leave through the
/// port whose address is their source GID.
pub(crate) const WIRE_DEV: u32 = u32::MAX - 1;

/// `IBV_RX_HASH_*` bits.
pub(crate) mod hash_fields {
    pub(crate) const SRC_IPV4: u64 = 1 << 0;
    pub(crate) const DST_IPV4: u64 = 1 << 1;
    pub(crate) const SRC_IPV6: u64 = 1 << 2;
    pub(crate) const DST_IPV6: u64 = 1 << 3;
    pub(crate) const SRC_PORT_TCP: u64 = 1 << 4;
    pub(crate) const DST_PORT_TCP: u64 = 1 << 5;
    pub(crate) const SRC_PORT_UDP: u64 = 1 << 6;
    pub(crate) const DST_PORT_UDP: u64 = 1 << 7;
    pub(crate) const IPV4: u64 = SRC_IPV4 | DST_IPV4;
    pub(crate) const IPV6: u64 = SRC_IPV6 | DST_IPV6;
    pub(crate) const TCP: u64 = SRC_PORT_TCP | DST_PORT_TCP;
    pub(crate) const UDP: u64 = SRC_PORT_UDP | DST_PORT_UDP;
    /// Every field the emulator hashes on.
    pub(crate) const ALL: u64 = IPV4 | IPV6 | TCP | UDP;
}

//! Device profiles: every device and port attribute as one table per profile.
//!
//! * [`Profile::Rxe`] reports exactly what the kernel's Soft-RoCE (`rxe`, Linux 6.1, rdma-core 44)
//!   reports: RoCE v2 on an Ethernet link layer, LID 0, a 1024-entry GID table.
//! * [`Profile::Full`] (the default) is everything the emulator implements; its ports use the
//!   InfiniBand link layer with LIDs, so programs that address peers by LID (the rdma-core
//!   examples without `-g`) work unchanged, and GIDs route as well.
//!
//! Every limit the emulator enforces comes from here, never from a literal elsewhere.

use crate::types::{AtomicCap, Gid, GidType, LinkLayer, Mtu, PortState};

/// Which device the emulator pretends to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// Exactly the kernel's rxe.
    Rxe,
    /// Everything the emulator implements (default).
    #[default]
    Full,
}

impl Profile {
    /// Parses `rxe` or `full`.
    pub fn from_name(s: &str) -> Option<Profile> {
        match s {
            "rxe" => Some(Profile::Rxe),
            "full" => Some(Profile::Full),
            _ => None,
        }
    }

    /// The profile's name as [`Profile::from_name`] accepts it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Rxe => "rxe",
            Profile::Full => "full",
        }
    }
}

/// `ibv_device_cap_flags` bits used in the tables.
pub mod cap_flags {
    pub const BAD_PKEY_CNTR: u32 = 1 << 1;
    pub const BAD_QKEY_CNTR: u32 = 1 << 2;
    pub const AUTO_PATH_MIG: u32 = 1 << 4;
    pub const CHANGE_PHY_PORT: u32 = 1 << 5;
    pub const UD_AV_PORT_ENFORCE: u32 = 1 << 6;
    pub const CURR_QP_STATE_MOD: u32 = 1 << 7;
    pub const SHUTDOWN_PORT: u32 = 1 << 8;
    pub const PORT_ACTIVE_EVENT: u32 = 1 << 10;
    pub const SYS_IMAGE_GUID: u32 = 1 << 11;
    pub const RC_RNR_NAK_GEN: u32 = 1 << 12;
    pub const SRQ_RESIZE: u32 = 1 << 13;
    pub const N_NOTIFY_CQ: u32 = 1 << 14;
    pub const MEM_WINDOW: u32 = 1 << 17;
    pub const UD_IP_CSUM: u32 = 1 << 18;
    pub const XRC: u32 = 1 << 20;
    pub const MEM_MGT_EXTENSIONS: u32 = 1 << 21;
    pub const MEM_WINDOW_TYPE_2B: u32 = 1 << 24;
    pub const RAW_IP_CSUM: u32 = 1 << 26;
}

/// `ibv_raw_packet_caps` bits.
pub mod raw_packet_caps {
    pub const CVLAN_STRIPPING: u32 = 1;
    pub const SCATTER_FCS: u32 = 1 << 1;
    pub const IP_CSUM: u32 = 1 << 2;
    pub const DELAY_DROP: u32 = 1 << 3;
}

/// `device_cap_flags_ex` bits above the 32 of `ibv_device_cap_flags`.
pub mod cap_flags_ex {
    pub const RAW_SCATTER_FCS: u64 = 1 << 34;
    pub const PCI_WRITE_END_PADDING: u64 = 1 << 36;
    pub const FLUSH_GLOBAL: u64 = 1 << 38;
    pub const FLUSH_PERSISTENT: u64 = 1 << 39;
    pub const ATOMIC_WRITE: u64 = 1 << 40;
}

/// `struct ibv_odp_caps` and `xrc_odp_caps`: `general` of [`odp`]'s `SUPPORT*` bits, the
/// rest of its per-operation bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OdpCaps {
    pub general: u64,
    pub rc: u32,
    pub uc: u32,
    pub ud: u32,
    pub xrc: u32,
}

/// `struct ibv_tm_caps`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TmCaps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    /// `enum ibv_tm_cap_flags` (`IBV_TM_CAP_RC` = 1).
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `enum ibv_odp_general_caps` and `enum ibv_odp_transport_cap_bits`.
pub mod odp {
    pub const SUPPORT: u64 = 1;
    pub const SUPPORT_IMPLICIT: u64 = 1 << 1;
    pub const SEND: u32 = 1;
    pub const RECV: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const READ: u32 = 1 << 3;
    pub const ATOMIC: u32 = 1 << 4;
    pub const SRQ_RECV: u32 = 1 << 5;
}

/// `struct ibv_device_attr`, field for field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: &'static str,
    /// In host byte order; the C mirror stores it big-endian.
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_ee_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_ee_init_rd_atom: u32,
    pub atomic_cap: AtomicCap,
    pub max_ee: u32,
    pub max_rdd: u32,
    pub max_mw: u32,
    pub max_raw_ipv6_qp: u32,
    pub max_raw_ethy_qp: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
    pub max_ah: u32,
    pub max_fmr: u32,
    pub max_map_per_fmr: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    /// Largest `max_inline_data` a QP may ask for (rxe: the SGE area of a maximal WQE).
    pub max_inline_data: u32,
    /// Number of completion vectors (`ibv_context.num_comp_vectors`).
    pub num_comp_vectors: u32,
    // Capabilities of `struct ibv_device_attr_ex` (0: the device has none).
    /// Valid bits of a completion timestamp; 0: CQs cannot record timestamps.
    pub completion_timestamp_mask: u64,
    /// Device clock frequency in kHz (`hca_core_clock`); 0: no readable clock.
    pub hca_core_clock: u64,
    /// Largest `cq_count` of `ibv_modify_cq` (`cq_mod_caps`); 0: no CQ moderation.
    pub max_cq_count: u16,
    /// Largest `cq_period` of `ibv_modify_cq`, in microseconds.
    pub max_cq_period: u16,
    /// Largest device memory allocation (`max_dm_size`); 0: no device memory.
    pub max_dm_size: u64,
    /// The Enhanced Connection Establishment options the device offers (what `ibv_query_ece`
    /// reports for a new QP); 0: no ECE (`ibv_set_ece` / `ibv_query_ece` unsupported).
    pub ece_options: u32,
    /// Whether RC QPs carry `IBV_WR_ATOMIC_WRITE` (rxe in Linux 6.1 takes it at the post and
    /// fails it with `LOC_QP_OP_ERR`).
    pub atomic_write: bool,
    /// Whether RC QPs carry `IBV_WR_FLUSH` (RDMA FLUSH, IBA 1.5; Linux 6.1's rxe has none).
    pub flush: bool,
    /// Whether the C library offers thread and parent domains (mlx5 does, rxe does not).
    pub parent_domains: bool,
    /// On-demand paging (`odp_caps`, `xrc_odp_caps`); all zero: none.
    pub odp: OdpCaps,
    /// Tag matching (`tm_caps`); all zero: none.
    pub tm: TmCaps,
    /// Largest number of receive WQs (`max_wq_type_rq`); 0: no WQs, RSS, raw packet QPs or
    /// flow steering.
    pub max_wq_type_rq: u32,
    /// RSS (`rss_caps`): indirection tables, their largest size, the hashable fields
    /// (`IBV_RX_HASH_*`).
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    /// Largest TCP segmentation offload (`tso_caps.max_tso`), raw packet QPs only; 0: none.
    pub max_tso: u32,
    /// `IBV_RAW_PACKET_CAP_*` bits.
    pub raw_packet_caps: u32,
    /// The `device_cap_flags_ex` bits above `device_cap_flags` (see [`cap_flags_ex`]).
    pub cap_flags_ex: u64,
}

impl DeviceAttr {
    /// Whether the device offers XRC (`IBV_DEVICE_XRC`).
    pub fn has_xrc(&self) -> bool {
        self.device_cap_flags & cap_flags::XRC != 0
    }

    /// Whether memory windows can be allocated (`max_mw` > 0).
    pub fn has_memory_windows(&self) -> bool {
        self.max_mw > 0
    }

    /// Whether CQs can record completion timestamps and the device clock can be read.
    pub fn has_clock(&self) -> bool {
        self.hca_core_clock > 0
    }

    /// Whether `ibv_modify_cq` can moderate completion events.
    pub fn has_cq_moderation(&self) -> bool {
        self.max_cq_count > 0
    }

    /// Whether the device has receive WQs, RSS, raw packet QPs and flow steering.
    pub fn has_raw_packet(&self) -> bool {
        self.max_wq_type_rq > 0
    }

    /// The receive offloads a WQ (or, as create flags, a raw packet QP) may ask for.
    pub fn wq_flags(&self) -> crate::WqFlags {
        use crate::WqFlags as F;
        let caps = self.raw_packet_caps;
        let mut f = F::empty();
        f.set(F::CVLAN_STRIPPING, caps & raw_packet_caps::CVLAN_STRIPPING != 0);
        f.set(F::SCATTER_FCS, caps & raw_packet_caps::SCATTER_FCS != 0);
        f.set(F::DELAY_DROP, caps & raw_packet_caps::DELAY_DROP != 0);
        let padding = self.cap_flags_ex & cap_flags_ex::PCI_WRITE_END_PADDING != 0;
        f.set(F::PCI_WRITE_END_PADDING, padding);
        f
    }
}

/// `struct ibv_port_attr`, field for field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: LinkLayer,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub active_speed_ex: u32,
}

/// One GID table entry as `ibv_query_gid_ex` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    pub gid: Gid,
    pub index: u32,
    pub gid_type: GidType,
}

/// Values shared by both profiles (the rxe ones, from `rxe_param.h` and `ibv_devinfo -v`).
const RXE_MAX_SGE: u32 = 32;
/// rxe's inline limit: the SGE area of a WQE with `RXE_MAX_SGE` entries of 16 bytes.
const RXE_MAX_INLINE: u32 = RXE_MAX_SGE * 16;

/// The device's identity on the fabric, derived from its index so that runs are reproducible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceIdentity {
    pub index: u32,
    /// Locally administered MAC 02:00:00:00:hi:lo.
    pub mac: [u8; 6],
    /// EUI-64 of the MAC (the U/L bit flipped), as rxe derives its node GUID.
    pub guid: u64,
    /// IPv4 address on the emulated link (TEST-NET-1, never routed).
    pub ipv4: [u8; 4],
}

impl DeviceIdentity {
    pub fn new(index: u32) -> DeviceIdentity {
        let n = index + 1;
        let mac = [0x02, 0, 0, 0, (n >> 8) as u8, n as u8];
        let eui = [mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]];
        DeviceIdentity {
            index,
            mac,
            guid: u64::from_be_bytes(eui),
            ipv4: [192, 0, 2, (n % 254) as u8 + 1],
        }
    }
}

impl Profile {
    /// Whether arming a CQ raises its event at once when the CQ already holds a completion
    /// that meets the armed condition and that no event announced yet. An HCA arms against
    /// its consumer index, so nothing that arrived between a program's last poll and its
    /// re-arm goes unannounced (Open MPI's UD connection manager polls, then re-arms, and
    /// relies on it); rxe raises events only for completions that arrive after the arming.
    pub fn arm_announces_waiting(self) -> bool {
        match self {
            Profile::Rxe => false,
            Profile::Full => true,
        }
    }

    /// Whether moving a QP to RESET takes its completions out of its CQs, as mlx5 and mlx4
    /// clean a CQ of a QP's CQEs then (rxe leaves them).
    pub fn reset_cleans_cqs(self) -> bool {
        match self {
            Profile::Rxe => false,
            Profile::Full => true,
        }
    }

    /// Ports a device of this profile has when `wanted` are asked for (rxe has exactly one).
    pub fn port_count(self, wanted: u8) -> u8 {
        match self {
            Profile::Rxe => 1,
            Profile::Full => wanted.clamp(1, 4),
        }
    }

    /// The device attribute table for a device with identity `id` and `ports` ports.
    pub fn device_attr(self, id: &DeviceIdentity, ports: u8) -> DeviceAttr {
        let rxe = DeviceAttr {
            fw_ver: "0.0.0",
            node_guid: id.guid,
            sys_image_guid: id.guid,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 1_048_560,
            max_qp_wr: 1_048_576,
            // rxe reports 0x0122_3c76; the memory-window bits stay off until memory windows
            // are implemented, so that no program is told to use a verb that is refused.
            device_cap_flags: 0x0122_3c76,
            max_sge: RXE_MAX_SGE,
            max_sge_rd: RXE_MAX_SGE,
            max_cq: 1_048_576,
            max_cqe: 32_767,
            max_mr: 524_287,
            max_pd: 1_048_576,
            max_qp_rd_atom: 128,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 258_048,
            max_qp_init_rd_atom: 128,
            max_ee_init_rd_atom: 0,
            atomic_cap: AtomicCap::HCA,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 524_287,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 458_752,
            max_ah: 32_767,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 917_503,
            max_srq_wr: 1_048_576,
            max_srq_sge: 27,
            max_pkeys: 64,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
            max_inline_data: RXE_MAX_INLINE,
            num_comp_vectors: 2,
            completion_timestamp_mask: 0,
            hca_core_clock: 0,
            max_cq_count: 0,
            max_cq_period: 0,
            max_dm_size: 0,
            ece_options: 0,
            atomic_write: false,
            flush: false,
            parent_domains: false,
            odp: OdpCaps::default(),
            tm: TmCaps::default(),
            max_wq_type_rq: 0,
            max_rwq_indirection_tables: 0,
            max_rwq_indirection_table_size: 0,
            rx_hash_fields_mask: 0,
            max_tso: 0,
            raw_packet_caps: 0,
            cap_flags_ex: 0,
        };
        let rxe = DeviceAttr { phys_port_cnt: self.port_count(ports), ..rxe };
        match self {
            Profile::Rxe => rxe,
            Profile::Full => DeviceAttr {
                fw_ver: "1.0.0",
                vendor_id: 0x00ff_ffff,
                vendor_part_id: 0x454d, // "EM"
                device_cap_flags: rxe.device_cap_flags | cap_flags::XRC | cap_flags::RAW_IP_CSUM,
                // The fabric's clock counts nanoseconds: a 1 GHz device clock, 64 bits wide.
                completion_timestamp_mask: u64::MAX,
                hca_core_clock: 1_000_000,
                // A ConnectX CQ's size (libfabric's rxm asks for a million entries), and the
                // limits of its context (16-bit count, 12-bit period).
                max_cqe: 4_194_303,
                max_cq_count: u16::MAX,
                max_cq_period: 4095,
                // A ConnectX-5's MEMIC.
                max_dm_size: 256 * 1024,
                // Two options; their meaning is vendor-defined and changes nothing here.
                ece_options: 0x3,
                atomic_write: true,
                flush: true,
                parent_domains: true,
                // Every operation of each transport may touch on-demand memory, and an MR may
                // cover the whole address space (implicit ODP).
                odp: OdpCaps {
                    general: odp::SUPPORT | odp::SUPPORT_IMPLICIT,
                    rc: odp::SEND
                        | odp::RECV
                        | odp::WRITE
                        | odp::READ
                        | odp::ATOMIC
                        | odp::SRQ_RECV,
                    uc: odp::SEND | odp::RECV | odp::WRITE,
                    ud: odp::SEND | odp::RECV,
                    xrc: odp::SEND
                        | odp::RECV
                        | odp::WRITE
                        | odp::READ
                        | odp::ATOMIC
                        | odp::SRQ_RECV,
                },
                // A ConnectX-5's tag matching: 255 tags, eager and rendezvous on RC.
                tm: TmCaps {
                    max_rndv_hdr_size: 64,
                    max_num_tags: 255,
                    flags: 1, // IBV_TM_CAP_RC
                    max_ops: 32_768,
                    max_sge: 1,
                },
                // A ConnectX-5's RSS and TSO limits.
                max_wq_type_rq: 65_536,
                max_rwq_indirection_tables: 65_536,
                max_rwq_indirection_table_size: 1 << 13,
                rx_hash_fields_mask: crate::types::hash_fields::ALL,
                max_tso: 256 * 1024,
                raw_packet_caps: raw_packet_caps::IP_CSUM
                    | raw_packet_caps::CVLAN_STRIPPING
                    | raw_packet_caps::SCATTER_FCS
                    | raw_packet_caps::DELAY_DROP,
                cap_flags_ex: cap_flags_ex::RAW_SCATTER_FCS
                    | cap_flags_ex::PCI_WRITE_END_PADDING
                    | cap_flags_ex::FLUSH_GLOBAL
                    | cap_flags_ex::FLUSH_PERSISTENT
                    | cap_flags_ex::ATOMIC_WRITE,
                ..rxe
            },
        }
    }

    /// The active MTU of a RoCE port over a netdev of `netdev_mtu` bytes: the largest IB MTU
    /// that fits once the headers are taken off (rxe reserves 80 bytes, mlx5 96: GRH, UDP, BTH
    /// and the largest extended headers, ICRC), at least 256 and at most 4096.
    pub fn roce_active_mtu(self, netdev_mtu: u32) -> Mtu {
        let headers = match self {
            Profile::Rxe => 80,
            Profile::Full => 96,
        };
        let room = netdev_mtu.saturating_sub(headers);
        [Mtu::MTU_4096, Mtu::MTU_2048, Mtu::MTU_1024, Mtu::MTU_512]
            .into_iter()
            .find(|m| m.bytes().is_some_and(|b| b <= room))
            .unwrap_or(Mtu::MTU_256)
    }

    /// The attributes of port `port` (1-based) of the device with identity `id` and `ports`
    /// ports. LIDs are unique on the fabric: device-major, port-minor, from 1.
    /// On the full profile `link` picks InfiniBand (LIDs) or Ethernet (RoCE: LID 0).
    pub fn port_attr(self, id: &DeviceIdentity, port: u8, ports: u8, link: LinkLayer) -> PortAttr {
        let rxe = PortAttr {
            state: PortState::ACTIVE,
            max_mtu: Mtu::MTU_4096,
            active_mtu: Mtu::MTU_1024,
            gid_tbl_len: 1024,
            port_cap_flags: 0x0001_0000, // IB_PORT_CM_SUP
            max_msg_sz: 0x80_0000,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 1,
            active_speed: 1,
            phys_state: 5, // LinkUp
            link_layer: LinkLayer::ETHERNET,
            flags: 0,
            port_cap_flags2: 0,
            active_speed_ex: 0,
        };
        match self {
            Profile::Rxe => rxe,
            Profile::Full if link == LinkLayer::ETHERNET => PortAttr {
                active_mtu: Mtu::MTU_4096,
                max_msg_sz: 0x4000_0000,
                active_width: 2,  // 4X
                active_speed: 32, // EDR
                ..rxe
            },
            Profile::Full => PortAttr {
                active_mtu: Mtu::MTU_4096,
                gid_tbl_len: 16,
                port_cap_flags: 0x0001_0000 | 0x0000_0002 | 0x0400_0000, // CM, SM, CAP_MASK2
                max_msg_sz: 0x4000_0000,
                lid: (id.index * self.port_count(ports) as u32 + port as u32) as u16,
                sm_lid: 1,
                link_layer: LinkLayer::INFINIBAND,
                active_width: 2,  // 4X
                active_speed: 32, // EDR
                ..rxe
            },
        }
    }

    /// The populated GID table entries of port `port`, whose IP addresses are `addrs`: GID 0
    /// is the link-local GID of the port GUID (the node GUID plus the port index). A RoCE
    /// port then has the IPv4-mapped GID of its own identity address and, as rxe has its
    /// netdev's, a GID for each of `addrs` (IPv4 mapped, IPv6 as is), up to the table's length.
    pub fn gid_table(
        self,
        id: &DeviceIdentity,
        port: u8,
        link: LinkLayer,
        addrs: &[std::net::IpAddr],
    ) -> Vec<GidEntry> {
        let port_guid = id.guid + (port as u64 - 1);
        match (self, link) {
            (Profile::Rxe, _) | (Profile::Full, LinkLayer::ETHERNET) => {
                let own = [Gid::link_local(port_guid), Gid::ipv4_mapped(id.ipv4)];
                let len = self.port_attr(id, port, port, link).gid_tbl_len;
                let mut gids: Vec<Gid> = own.to_vec();
                for gid in addrs.iter().map(|&ip| Gid::of_ip(ip)) {
                    if !gids.contains(&gid) && gids.len() < len as usize {
                        gids.push(gid);
                    }
                }
                let entry =
                    |(i, gid)| GidEntry { gid, index: i as u32, gid_type: GidType::ROCE_V2 };
                gids.into_iter().enumerate().map(entry).collect()
            }
            (Profile::Full, _) => {
                vec![GidEntry { gid: Gid::link_local(port_guid), index: 0, gid_type: GidType::IB }]
            }
        }
    }

    /// The P_Key table of port 1: the default full-membership key only.
    pub fn pkey_table(self) -> Vec<u16> {
        vec![0xffff]
    }
}

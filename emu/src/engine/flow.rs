//! Flow steering rules (`ibv_create_flow`): which Ethernet frames reaching a port go to which
//! raw packet QP.
//!
//! Every port of the fabric sees every frame a raw packet QP sends (one Ethernet segment),
//! except the sending QP itself. On each port the rules decide, as a ConnectX's steering
//! tables do: the matching `NORMAL` rules of the best (lowest) priority each get a copy, and
//! unless all of them are `DONT_TRAP` the lower priorities see nothing; a frame no normal rule
//! took goes to the `MC_DEFAULT` rules (multicast) or the `ALL_DEFAULT` rules; `SNIFFER` rules
//! get a copy of everything. A frame no rule takes is dropped.

use std::sync::{Arc, Weak};

use crate::frame::{Headers, PROTO_TCP, PROTO_UDP};
use crate::{
    error::{Errno, Error, Result, einval},
    fabric::FabricInner,
    objects::Lifecycle,
    qp::{Qp, QpShared},
    types::{FlowType, QpType},
};

/// The Ethernet header fields of `struct ibv_flow_eth_filter`, in host byte order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EthFilter {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub ether_type: u16,
    /// 802.1Q tag control: priority 3 bits, CFI 1, VLAN id 12.
    pub vlan_tag: u16,
}

/// The IPv4 fields of `struct ibv_flow_ipv4_ext_filter` (`IBV_FLOW_SPEC_IPV4` sets only the
/// addresses), addresses in host byte order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ipv4ExtFilter {
    pub src_ip: u32,
    pub dst_ip: u32,
    pub proto: u8,
    pub tos: u8,
    pub ttl: u8,
    pub flags: u8,
}

/// `struct ibv_flow_ipv6_filter`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ipv6Filter {
    pub src_ip: [u8; 16],
    pub dst_ip: [u8; 16],
    pub flow_label: u32,
    pub next_hdr: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
}

/// `struct ibv_flow_tcp_udp_filter`, in host byte order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortFilter {
    pub dst_port: u16,
    pub src_port: u16,
}

/// One specification of a rule: a frame matches when every field, masked, equals the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowSpec {
    Eth {
        val: EthFilter,
        mask: EthFilter,
    },
    /// IPv4 (the frame must be IPv4).
    Ipv4 {
        val: Ipv4ExtFilter,
        mask: Ipv4ExtFilter,
    },
    /// IPv6 (the frame must be IPv6).
    Ipv6 {
        val: Ipv6Filter,
        mask: Ipv6Filter,
    },
    /// TCP (the frame must carry TCP).
    Tcp {
        val: PortFilter,
        mask: PortFilter,
    },
    /// UDP (the frame must carry UDP).
    Udp {
        val: PortFilter,
        mask: PortFilter,
    },
    /// `IBV_FLOW_SPEC_ACTION_DROP`: the frames the rule takes are dropped.
    Drop,
    /// `IBV_FLOW_SPEC_ACTION_TAG`: the receive completions of the frames the rule delivers
    /// carry this tag (`ibv_wc_read_flow_tag`); below 2^24.
    Tag(u32),
    /// A specification of a type verbs defines that the emulator does not match on (ESP,
    /// VXLAN, GRE, MPLS, an inner header, a flow action or counter handle), by its
    /// `ibv_flow_spec_type`: a rule with one is refused with `EOPNOTSUPP`, as a device without
    /// it refuses it, after the checks the kernel makes before the device sees the rule.
    NotEmulated(u32),
}

/// `IBV_FLOW_ATTR_FLAGS_*`.
pub mod flow_flags {
    /// The frames also go on to rules of lower priority.
    pub const DONT_TRAP: u32 = 1 << 1;
    /// A rule on sent frames (not supported).
    pub const EGRESS: u32 = 1 << 2;
}

/// `struct ibv_flow_attr` with its specifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowAttr {
    pub flow_type: FlowType,
    /// 0 is the highest; at most 15.
    pub priority: u16,
    pub port: u8,
    /// `flow_flags` bits.
    pub flags: u32,
    pub specs: Vec<FlowSpec>,
}

fn masked_eq<const N: usize>(field: &[u8; N], val: &[u8; N], mask: &[u8; N]) -> bool {
    (0..N).all(|i| field[i] & mask[i] == val[i])
}

fn outside<const N: usize>(val: &[u8; N], mask: &[u8; N]) -> bool {
    (0..N).any(|i| val[i] & !mask[i] != 0)
}

impl FlowSpec {
    /// The tag of an `ACTION_TAG` specification.
    fn tag(&self) -> Option<u32> {
        if let FlowSpec::Tag(t) = self { Some(*t) } else { None }
    }

    /// Whether the value sets a bit its mask does not (mlx5 refuses such a rule).
    fn value_outside_mask(&self) -> bool {
        match self {
            FlowSpec::Eth { val: v, mask: m } => {
                outside(&v.dst_mac, &m.dst_mac)
                    || outside(&v.src_mac, &m.src_mac)
                    || v.ether_type & !m.ether_type != 0
                    || v.vlan_tag & !m.vlan_tag != 0
            }
            FlowSpec::Ipv4 { val: v, mask: m } => {
                v.src_ip & !m.src_ip != 0
                    || v.dst_ip & !m.dst_ip != 0
                    || v.proto & !m.proto != 0
                    || v.tos & !m.tos != 0
                    || v.ttl & !m.ttl != 0
                    || v.flags & !m.flags != 0
            }
            FlowSpec::Ipv6 { val: v, mask: m } => {
                outside(&v.src_ip, &m.src_ip)
                    || outside(&v.dst_ip, &m.dst_ip)
                    || v.flow_label & !m.flow_label != 0
                    || v.next_hdr & !m.next_hdr != 0
                    || v.traffic_class & !m.traffic_class != 0
                    || v.hop_limit & !m.hop_limit != 0
            }
            FlowSpec::Tcp { val: v, mask: m } | FlowSpec::Udp { val: v, mask: m } => {
                v.dst_port & !m.dst_port != 0 || v.src_port & !m.src_port != 0
            }
            FlowSpec::Drop | FlowSpec::Tag(_) | FlowSpec::NotEmulated(_) => false,
        }
    }

    fn matches(&self, h: &Headers) -> bool {
        match self {
            FlowSpec::Eth { val: v, mask: m } => {
                masked_eq(&h.dst_mac, &v.dst_mac, &m.dst_mac)
                    && masked_eq(&h.src_mac, &v.src_mac, &m.src_mac)
                    && h.ether_type & m.ether_type == v.ether_type
                    && (m.vlan_tag == 0 || h.vlan.is_some_and(|t| t & m.vlan_tag == v.vlan_tag))
            }
            FlowSpec::Ipv4 { val: v, mask: m } => h.ipv4.is_some_and(|ip| {
                ip.src & m.src_ip == v.src_ip
                    && ip.dst & m.dst_ip == v.dst_ip
                    && ip.proto & m.proto == v.proto
                    && ip.tos & m.tos == v.tos
                    && ip.ttl & m.ttl == v.ttl
                    && ip.flags & m.flags == v.flags
            }),
            FlowSpec::Ipv6 { val: v, mask: m } => h.ipv6.is_some_and(|ip| {
                masked_eq(&ip.src, &v.src_ip, &m.src_ip)
                    && masked_eq(&ip.dst, &v.dst_ip, &m.dst_ip)
                    && ip.flow_label & m.flow_label == v.flow_label
                    && ip.next_hdr & m.next_hdr == v.next_hdr
                    && ip.traffic_class & m.traffic_class == v.traffic_class
                    && ip.hop_limit & m.hop_limit == v.hop_limit
            }),
            FlowSpec::Tcp { val: v, mask: m } | FlowSpec::Udp { val: v, mask: m } => {
                let proto =
                    if matches!(self, FlowSpec::Tcp { .. }) { PROTO_TCP } else { PROTO_UDP };
                h.l4.is_some_and(|(p, sport, dport, _)| {
                    p == proto
                        && sport & m.src_port == v.src_port
                        && dport & m.dst_port == v.dst_port
                })
            }
            FlowSpec::Drop | FlowSpec::Tag(_) => true,
            // Refused at creation: no rule holds one.
            FlowSpec::NotEmulated(_) => false,
        }
    }
}

/// A rule as the fabric keeps it.
#[derive(Debug)]
pub(crate) struct FlowRule {
    pub(crate) dev: u32,
    pub(crate) attr: FlowAttr,
    pub(crate) qp: Weak<QpShared>,
    pub(crate) life: Lifecycle,
}

impl FlowRule {
    pub(crate) fn matches(&self, h: &Headers) -> bool {
        self.attr.specs.iter().all(|s| s.matches(h))
    }

    pub(crate) fn drops(&self) -> bool {
        self.attr.specs.contains(&FlowSpec::Drop)
    }

    pub(crate) fn traps(&self) -> bool {
        self.attr.flags & flow_flags::DONT_TRAP == 0
    }

    /// The flow tag its frames' completions carry (0: none).
    pub(crate) fn tag(&self) -> u32 {
        self.attr.specs.iter().find_map(FlowSpec::tag).unwrap_or(0)
    }
}

/// Flow tags are 24 bits (a ConnectX's flow context).
const TAG_LIMIT: u32 = 1 << 24;

/// Where steering sends a copy of a frame.
#[derive(Debug)]
pub(crate) struct Steered {
    pub(crate) dev: u32,
    pub(crate) port: u8,
    pub(crate) qp: Arc<QpShared>,
    /// The flow tag of the rule that took it (0: none).
    pub(crate) tag: u32,
}

/// The last priority a rule may have (a ConnectX's user steering priorities).
const LAST_PRIORITY: u16 = 15;

/// A steering rule attached to a QP (`struct ibv_flow`).
#[derive(Debug)]
pub struct Flow {
    rule: Arc<FlowRule>,
    qp: Qp,
}

impl Qp {
    /// `ibv_create_flow`: steers the frames `attr` matches to this raw packet QP until the
    /// flow is destroyed (or dropped); see [`Flow`].
    pub fn create_flow(&self, attr: &FlowAttr) -> Result<Flow> {
        Flow::create(self, attr)
    }
}

impl Flow {
    /// `ibv_create_flow` on `qp` (a raw packet QP, plain or RSS). `EOPNOTSUPP` on a device
    /// without steering (rxe); then `EPERM` without `CAP_NET_RAW` (see
    /// [`FabricConfig::raw_needs_cap`](crate::FabricConfig::raw_needs_cap)); `EOPNOTSUPP` for a
    /// UD QP (steering to UD needs an InfiniBand port and is not emulated), a specification
    /// the emulator does not match on, or an egress rule; `EINVAL` for another QP type, an
    /// unknown flag, a port the device lacks, or a value with bits outside its mask; `ENOMEM`
    /// for a priority above 15 (as mlx5).
    pub(crate) fn create(qp: &Qp, attr: &FlowAttr) -> Result<Flow> {
        let q = &qp.0;
        q.life.check()?;
        let dev = &q.ctx.device;
        if !dev.attr.has_raw_packet() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no flow steering"));
        }
        q.ctx.fabric.may_use_raw()?;
        match q.qp_type {
            QpType::RAW_PACKET => {}
            QpType::UD => {
                return Err(Error::new(Errno::EOPNOTSUPP, "no flow steering to UD QPs"));
            }
            _ => return Err(einval("flows steer to raw packet QPs")),
        }
        if attr.specs.iter().any(|s| matches!(s, FlowSpec::NotEmulated(_))) {
            return Err(Error::new(Errno::EOPNOTSUPP, "a flow specification type not emulated"));
        }
        if attr.flags & flow_flags::EGRESS != 0 {
            return Err(Error::new(Errno::EOPNOTSUPP, "egress rules are not supported"));
        }
        if attr.flags & !flow_flags::DONT_TRAP != 0 {
            return Err(einval("unknown flow flags"));
        }
        if attr.flow_type.0 > FlowType::SNIFFER.0 {
            return Err(einval("unknown flow type"));
        }
        dev.port(attr.port)?;
        if attr.priority > LAST_PRIORITY {
            return Err(Error::new(Errno::ENOMEM, "flow priority above 15"));
        }
        if attr.specs.iter().any(FlowSpec::value_outside_mask) {
            return Err(einval("a flow value sets bits outside its mask"));
        }
        let tags: Vec<u32> = attr.specs.iter().filter_map(FlowSpec::tag).collect();
        if tags.len() > 1 || tags.iter().any(|&t| t >= TAG_LIMIT) {
            return Err(einval("one flow tag per rule, below 2^24"));
        }
        q.life.get()?;
        let rule = Arc::new(FlowRule {
            dev: dev.id.index,
            attr: attr.clone(),
            qp: Arc::downgrade(q),
            life: Lifecycle::default(),
        });
        q.ctx.fabric.add_flow(rule.clone());
        Ok(Flow { rule, qp: qp.clone() })
    }

    /// The rule.
    pub fn attr(&self) -> &FlowAttr {
        &self.rule.attr
    }

    /// `ibv_destroy_flow`: frames stop reaching the QP; `EINVAL` if already destroyed.
    pub fn destroy(&self) -> Result<()> {
        self.rule.life.destroy()?;
        self.qp.0.ctx.fabric.remove_flow(&self.rule);
        self.qp.0.life.put();
        Ok(())
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

impl FabricInner {
    /// The QPs a frame with headers `h` reaches on each port of the fabric, by the rules
    /// described in this module; never `from` itself, each QP once per port (the first rule
    /// to take it gives the flow tag).
    pub(crate) fn steer(&self, h: &Headers, from: u32) -> Vec<Steered> {
        let rules = self.flows.read();
        let mut out: Vec<Steered> = Vec::new();
        let take = |r: &FlowRule, out: &mut Vec<Steered>| {
            if r.drops() {
                return;
            }
            let Some(qp) = r.qp.upgrade() else { return };
            if qp.qpn == from
                || out
                    .iter()
                    .any(|s| s.dev == r.dev && s.port == r.attr.port && Arc::ptr_eq(&s.qp, &qp))
            {
                return;
            }
            out.push(Steered { dev: r.dev, port: r.attr.port, qp, tag: r.tag() });
        };
        for (dev, d) in self.devices.iter().enumerate() {
            for port in 1..=d.ports.len() as u8 {
                let here = |r: &&Arc<FlowRule>| r.dev == dev as u32 && r.attr.port == port;
                let on_port: Vec<&Arc<FlowRule>> = rules.iter().filter(here).collect();
                if on_port.is_empty() {
                    continue;
                }
                for r in on_port.iter().filter(|r| r.attr.flow_type == FlowType::SNIFFER) {
                    take(r, &mut out);
                }
                let mut normal: Vec<&Arc<FlowRule>> = on_port
                    .iter()
                    .copied()
                    .filter(|r| r.attr.flow_type == FlowType::NORMAL && r.matches(h))
                    .collect();
                normal.sort_by_key(|r| r.attr.priority);
                let mut trapped = false;
                for group in normal.chunk_by(|a, b| a.attr.priority == b.attr.priority) {
                    group.iter().for_each(|r| take(r, &mut out));
                    if group.iter().any(|r| r.traps()) {
                        trapped = true;
                        break;
                    }
                }
                if trapped {
                    continue;
                }
                let mc: Vec<_> =
                    on_port.iter().filter(|r| r.attr.flow_type == FlowType::MC_DEFAULT).collect();
                let fallback = if h.is_multicast() && !mc.is_empty() {
                    mc
                } else {
                    on_port.iter().filter(|r| r.attr.flow_type == FlowType::ALL_DEFAULT).collect()
                };
                fallback.into_iter().for_each(|r| take(r, &mut out));
            }
        }
        out
    }

    pub(crate) fn add_flow(&self, rule: Arc<FlowRule>) {
        self.flows.write().push(rule);
    }

    pub(crate) fn remove_flow(&self, rule: &Arc<FlowRule>) {
        self.flows.write().retain(|r| !Arc::ptr_eq(r, rule));
    }
}

//! The fabric: devices that can reach each other, routing by GID or LID plus QPN.
//!
//! The in-process fabric is a pure router: it never buffers, reorders or drops on its own. A
//! packet is handed to the destination QP's inbox, and the driver (see `engine`) services that
//! QP. Lookups are by key only; nothing depends on map iteration order.
//!
//! A fabric configured with a host fabric name also joins the fabrics of other processes
//! (see `host`): packets for their QPs leave through a socket, the rest stays in-process.
//!
//! The fabric names no layer above it: the connection manager, which sends its messages
//! through the fabric, is handed the ones that arrive for it through [`CmAgent`], given to
//! the fabric as it is made (`Fabric::new`, in the crate's root, puts the two together).

pub mod addr;
pub(crate) mod faults;
pub(crate) mod host;
mod host_wide;
#[cfg(test)]
mod hostile_tests;
pub(crate) mod pcap;
pub(crate) mod roce;
pub(crate) mod timer;
pub(crate) mod trust;
pub(crate) mod wire_port;

use std::{
    path::PathBuf,
    sync::{Arc, OnceLock, Weak},
};

use crate::sync::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use crate::{
    ipc::exports,
    objects::device::{Device, DeviceInner},
    profile::Profile,
    qp::QpShared,
    types::AhAttr,
};

/// How to build a fabric.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Number of devices (each with one port).
    pub devices: u32,
    /// What the devices report.
    pub profile: Profile,
    /// Ports per device (1 to 4; the rxe profile always has 1, as rxe).
    pub ports: u8,
    /// The host-wide fabric to join (a name, or an absolute directory; see
    /// [`fabric_dir`](crate::fabric_dir)), so that fabrics of other processes with the same name, the
    /// same devices and the same profile reach this one. `None`: this process only.
    pub host: Option<String>,
    /// Simulation: virtual time (see `timer`) and this seed for every random choice, so the
    /// same program replays byte for byte. `None`: real time, and a seed drawn from the clock
    /// (see [`Fabric::seed`]).
    pub seed: Option<u64>,
    /// Fault rules set from the start (see [`FaultRule::parse`](crate::FaultRule::parse)).
    pub faults: Vec<crate::FaultRule>,
    /// Writes every packet this fabric sends to this file as RoCE v2 frames (pcap format).
    pub pcap: Option<PathBuf>,
    /// The full profile's link layer: InfiniBand (the default, with LIDs) or Ethernet
    /// (RoCE v2 GIDs as rxe's, and raw packet QPs). The rxe profile is always Ethernet.
    pub link_layer: crate::LinkLayer,
    /// The MTU in bytes of the network device under each Ethernet port (`ip link set mtu`):
    /// the ports' active MTU follows it as rxe's and mlx5's follow their netdev's (1500 gives
    /// 1024, 9000 gives 4096). `None`: 1500 for the rxe profile, jumbo frames (4096) for the
    /// full profile. Set the same value in every process of a host fabric.
    pub netdev_mtu: Option<u32>,
    /// IP addresses of the ports beyond the default ones (`127.0.0.1` and `::1` name port 1
    /// of the first device), for the connection manager: see [`crate::cm::addr`].
    pub addresses: Vec<addr::PortAddress>,
    /// Runs work requests between QPs of this process on the express path (see
    /// `engine::express`) whenever no fault rule, simulation or packet trace needs packets.
    /// On by default; `RDMA_EMU_EXPRESS=0` turns it off (every WR then takes the packet path,
    /// which behaves identically, only slower).
    pub express: bool,
    /// On the host fabric, a message of a reliable QP from this many bytes on is read by the
    /// receiving process straight from the sender's memory (one copy) where that memory is
    /// shared (see `share_mr`: a `memcpy`), and from 64 KiB on (or this, if larger) wherever
    /// it lies (`process_vm_readv`), where the kernel lets it read there; smaller ones, and
    /// all where it may not, stream through the ring the two processes share (two copies).
    /// 16 KiB by default, where pulling was measured faster; `usize::MAX` pulls only what the
    /// ring cannot hold whole.
    /// `RDMA_EMU_PULL_MIN` (bytes) sets it.
    pub host_pull_min: usize,
    /// Charges registrations of application memory to the process's `RLIMIT_MEMLOCK` as the
    /// kernel does (`ENOMEM` past it without `CAP_IPC_LOCK`; see `objects::pinned`). On by
    /// default; `RDMA_EMU_MEMLOCK=off` turns it off.
    pub memlock: bool,
    /// Creating a raw packet QP or a flow steering rule takes `CAP_NET_RAW`, as the kernel's
    /// verbs require (`EPERM` without it). On by default; `RDMA_EMU_NET_RAW=anyone` lets any
    /// process make them.
    pub raw_needs_cap: bool,
    /// On the host fabric, the whole pages of application memory an MR spans (of 64 KiB or
    /// more, or any with remote write access) move into shared memory at the same addresses
    /// when it is registered (back at deregistration, and
    /// in a child after `fork`), so that a process pulling a payload from there, or carrying
    /// out a WRITE there, copies it with `memcpy` rather than `process_vm_readv` or
    /// `process_vm_writev` (see `crate::shared_mem`). On by default; `RDMA_EMU_SHARE_MR=0`
    /// leaves memory where it is.
    pub share_mr: bool,
    /// Wire ports: each binds its device's port to a local IP address (which joins the port's
    /// GID table) and sends and takes RoCE v2 on that address's UDP port 4791 for whatever the
    /// fabric does not reach itself (see docs/wire.md). Needs Ethernet ports. Empty by
    /// default; `RDMA_EMU_WIRE` (comma-separated `IP[=emuN[:PORT]]`) sets it.
    pub wire: Vec<addr::PortAddress>,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            devices: 2,
            profile: Profile::Full,
            ports: 1,
            host: None,
            seed: None,
            faults: Vec::new(),
            pcap: None,
            link_layer: crate::LinkLayer::INFINIBAND,
            netdev_mtu: None,
            addresses: Vec::new(),
            express: true,
            host_pull_min: host::PULL_MIN,
            memlock: true,
            raw_needs_cap: true,
            share_mr: true,
            wire: Vec::new(),
        }
    }
}

impl FabricConfig {
    /// The configuration the C library reads from its environment, looked up through `var`:
    /// `RDMA_EMU_DEVICES` (default 2), `RDMA_EMU_PROFILE` (`full` or `rxe`, default `full`),
    /// `RDMA_EMU_PORTS` (default 1), `RDMA_EMU_LINK_LAYER` (`ethernet` or `infiniband`, the
    /// full profile's ports) and `RDMA_EMU_FABRIC`: the host fabric to join, `default`
    /// when unset or empty, `none` for this process only; `RDMA_EMU_SEED` (simulation with
    /// that seed), `RDMA_EMU_FAULTS` (fault rules), `RDMA_EMU_PCAP` (a packet trace file) and
    /// `RDMA_EMU_MTU` (the netdev MTU, [`FabricConfig::netdev_mtu`]). A malformed
    /// `RDMA_EMU_SEED`, `RDMA_EMU_FAULTS` or `RDMA_EMU_MTU` is an error, never silently ignored.
    pub fn try_from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<FabricConfig, crate::ConfigError> {
        let mut cfg = FabricConfig::from_vars(&var);
        if let Some(s) = var("RDMA_EMU_SEED").filter(|s| !s.is_empty()) {
            let seed = s
                .parse()
                .map_err(|_| crate::ConfigError(format!("RDMA_EMU_SEED={s:?} is not a number")))?;
            cfg.seed = Some(seed);
        }
        if let Some(f) = var("RDMA_EMU_FAULTS") {
            cfg.faults = crate::FaultRule::parse(&f)?;
        }
        cfg.pcap = var("RDMA_EMU_PCAP").filter(|p| !p.is_empty()).map(PathBuf::from);
        if let Some(m) = var("RDMA_EMU_MTU").filter(|m| !m.is_empty()) {
            FabricConfig::parse_netdev_mtu(&m)?;
        }
        if let Some(a) = var("RDMA_EMU_ADDRS") {
            cfg.addresses = addr::PortAddress::parse_list(&a)?;
        }
        if let Some(w) = var("RDMA_EMU_WIRE") {
            cfg.wire = addr::PortAddress::parse_wire_list(&w)?;
        }
        Ok(cfg)
    }

    /// A netdev MTU in bytes, as `ip link` takes it (68, IPv4's minimum, to 65535).
    pub fn parse_netdev_mtu(s: &str) -> Result<u32, crate::ConfigError> {
        match s.parse::<u32>() {
            Ok(m) if (68..=65_535).contains(&m) => Ok(m),
            _ => Err(crate::ConfigError(format!(
                "RDMA_EMU_MTU={s:?} is not a network MTU in bytes (68 to 65535, e.g. 1500 or 9000)"
            ))),
        }
    }

    /// [`try_from_vars`](Self::try_from_vars) without the seed, faults and packet trace, and
    /// without the errors (a malformed `RDMA_EMU_MTU` is left out).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> FabricConfig {
        let host = match var("RDMA_EMU_FABRIC").unwrap_or_default().as_str() {
            "none" => None,
            "" => Some("default".to_owned()),
            name => Some(name.to_owned()),
        };
        FabricConfig {
            devices: var("RDMA_EMU_DEVICES").and_then(|v| v.parse().ok()).unwrap_or(2),
            profile: var("RDMA_EMU_PROFILE")
                .and_then(|v| Profile::from_name(&v))
                .unwrap_or_default(),
            ports: var("RDMA_EMU_PORTS").and_then(|v| v.parse().ok()).unwrap_or(1),
            link_layer: match var("RDMA_EMU_LINK_LAYER").as_deref() {
                Some("ethernet" | "eth") => crate::LinkLayer::ETHERNET,
                _ => crate::LinkLayer::INFINIBAND,
            },
            netdev_mtu: var("RDMA_EMU_MTU").and_then(|m| FabricConfig::parse_netdev_mtu(&m).ok()),
            express: var("RDMA_EMU_EXPRESS").is_none_or(|v| v != "0"),
            host_pull_min: var("RDMA_EMU_PULL_MIN")
                .and_then(|v| v.parse().ok())
                .unwrap_or(host::PULL_MIN),
            memlock: var("RDMA_EMU_MEMLOCK").is_none_or(|v| v != "off" && v != "0"),
            raw_needs_cap: var("RDMA_EMU_NET_RAW").is_none_or(|v| v != "anyone"),
            share_mr: var("RDMA_EMU_SHARE_MR").is_none_or(|v| v != "off" && v != "0"),
            host,
            ..Default::default()
        }
    }
}

/// First QPN handed out (0 and 1 are the special QPs; rxe starts at 0x11).
const FIRST_QPN: u32 = 0x11;
const MAX_QPN: u32 = 0x00ff_ffff;

/// A QP attached to a multicast group, and its port.
type Member = (Weak<QpShared>, u8);

#[derive(Debug)]
pub(crate) struct FabricInner {
    pub(crate) devices: Vec<Arc<DeviceInner>>,
    /// By QPN, which every packet from another process is looked up by: hashed with
    /// rustc-hash's Fx, not std's SipHash (~80 instructions a lookup), since the keys are our
    /// own numbers (a peer cannot choose them to collide).
    qps: RwLock<FxHashMap<u32, Weak<QpShared>>>,
    next_qpn: Mutex<u32>,
    /// Multicast groups: MGID -> attached (QP, its port), in attach order (a BTreeMap: no
    /// hash order).
    mcast: Mutex<std::collections::BTreeMap<[u8; 16], Vec<Member>>>,
    /// Flow steering rules of every device, in creation order.
    pub(crate) flows: RwLock<Vec<Arc<crate::engine::flow::FlowRule>>>,
    pub(crate) timer: timer::Timer,
    pub(crate) faults: faults::Faults,
    pub(crate) pcap: Option<pcap::Pcap>,
    /// The host fabric's directory, when configured; joined at the first QP.
    host: Option<trust::Location>,
    host_pull_min: usize,
    pub(crate) node: OnceLock<host::Node>,
    /// Which port each IP address names: what the connection manager resolves by, and what
    /// a RoCE port's GIDs follow.
    pub(crate) addrs: addr::AddressMap,
    /// The connection manager above the fabric, told of what arrives for it.
    pub(crate) cm: Box<dyn CmAgent>,
    /// Told of every change of a port's state (see [`Fabric::on_port_change`]).
    pub(crate) port_watch: OnceLock<Watcher>,
    /// Completion events put on channels so far: what wakes application threads that sleep.
    pub(crate) cq_events: std::sync::atomic::AtomicU64,
    /// What sends work the long way, in one word that a work request loads once (see
    /// [`Detours`]): the express path switched off, fault rules, a packet trace or simulated
    /// time ([`Detours::PATH`]), and how many ports of the fabric's devices are down (while
    /// none is, the data path need not look at each port it crosses).
    pub(crate) detours: Detours,
    /// See [`FabricConfig::memlock`].
    pub(crate) memlock: bool,
    /// See [`FabricConfig::raw_needs_cap`].
    pub(crate) raw_needs_cap: bool,
    /// Whether registered memory moves into shared memory ([`FabricConfig::share_mr`] on a
    /// host fabric).
    pub(crate) share_mr: bool,
    /// The wire ports (see [`FabricConfig::wire`]), set once they are bound.
    pub(crate) wire: OnceLock<wire_port::WirePorts>,
    this: Weak<FabricInner>,
}

/// What [`Fabric::on_port_change`] calls: the device and the port that changed.
pub type PortWatch = Box<dyn Fn(&crate::Device, u8) + Send + Sync>;

pub(crate) struct Watcher(pub(crate) PortWatch);

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortWatch")
    }
}

/// What the fabric hands up to the connection manager, as the kernel's MAD layer hands CM
/// MADs to the agent registered for them: the messages that arrive for it, and the events that
/// end its connections. (The manager is reached through it only; the CM finds its own state
/// again through [`CmAgent::as_any`].)
pub(crate) trait CmAgent: Send + Sync + std::fmt::Debug {
    /// A CM message from the node of another process on the host fabric (`slot`).
    fn arrived(&self, fabric: &FabricInner, slot: u8, bytes: &[u8]);
    /// A CM MAD that came in on the wire port at `local`, from `peer`.
    fn wire_arrived(
        &self,
        fabric: &FabricInner,
        local: std::net::IpAddr,
        peer: std::net::IpAddr,
        bytes: &[u8],
    );
    /// Device `dev` was removed.
    fn device_removed(&self, fabric: &FabricInner, dev: u32);
    /// The process in `slot` is gone (with `incarnation`, only that node of it); the numbers
    /// of the QPs whose connections ended with it.
    fn peer_died(&self, fabric: &FabricInner, slot: u8, incarnation: Option<u128>) -> Vec<u32>;
    fn as_any(&self) -> &dyn std::any::Any;
}

impl FabricInner {
    /// `EPERM` unless this process may make raw packet QPs and flow rules (see
    /// [`FabricConfig::raw_needs_cap`]).
    pub(crate) fn may_use_raw(&self) -> crate::Result<()> {
        if self.raw_needs_cap && !crate::sys::has_capability(crate::sys::CAP_NET_RAW) {
            return Err(crate::Error::NET_RAW);
        }
        Ok(())
    }

    /// Registers a QP and returns its fabric-wide unique number (next-fit, as rxe's index
    /// allocator: numbers are not reused until the space wraps). On a host fabric the
    /// numbers carry this node's slot, and the first QP joins it.
    pub(crate) fn register_qp(
        &self,
        make: impl FnOnce(u32) -> Arc<QpShared>,
    ) -> crate::Result<Arc<QpShared>> {
        let node = self.joined()?;
        let mut qps = self.qps.write();
        let (first, last) = match node {
            Some(node) => {
                let base = u32::from(node.slot) << 16;
                (base | 1, base | host::NODE_QPS)
            }
            None => (FIRST_QPN, MAX_QPN),
        };
        let mut next = self.next_qpn.lock();
        if !(first..=last).contains(&*next) {
            *next = first;
        }
        for _ in 0..=(last - first) {
            let qpn = *next;
            *next = if qpn >= last { first } else { qpn + 1 };
            if let std::collections::hash_map::Entry::Vacant(slot) = qps.entry(qpn) {
                let qp = make(qpn);
                slot.insert(Arc::downgrade(&qp));
                return Ok(qp);
            }
        }
        Err(crate::Error::new(crate::Errno::ENOMEM, "QP numbers exhausted"))
    }

    /// The SRQ number for the `n`th SRQ of a device: on a host fabric it carries this node's
    /// slot, as QPNs do, so an XRC request naming another process's SRQ finds no SRQ here.
    pub(crate) fn srq_number(&self, n: u32) -> u32 {
        match self.joined() {
            Ok(Some(node)) => u32::from(node.slot) << 16 | (n & 0xffff),
            _ => n & 0x00ff_ffff,
        }
    }

    /// This fabric's node on the host fabric, joining it on first use; `None` when the
    /// fabric is in-process only.
    pub(crate) fn joined(&self) -> crate::Result<Option<&host::Node>> {
        let Some(dir) = &self.host else { return Ok(None) };
        if self.node.get().is_some_and(host::Node::inherited) {
            return Err(crate::Error::new(
                crate::Errno::EPERM,
                "this fabric's node is the parent process's: a child of fork makes a fabric of its own",
            ));
        }
        if self.node.get().is_none() {
            let qps = self.qps.write();
            // One thread joins at a time (the QP table's lock); a loser finds the node set.
            if self.node.get().is_none() {
                let node = host::Node::join(dir, self.this.clone(), self.host_pull_min)?;
                let _ = self.node.set(node);
                drop(qps);
                if let Some(node) = self.node.get() {
                    host::take_recorded_ports(self, node);
                }
            }
        }
        Ok(self.node.get())
    }

    /// Whether a work request may take the express path now: switched on, and no fault rule,
    /// simulated time or packet trace that needs to see its packets.
    #[inline]
    pub(crate) fn express(&self) -> bool {
        self.detours.now() & Detours::PATH == 0
    }

    /// Whether fault rules are set (a packet meets them).
    #[inline]
    pub(crate) fn faulted(&self) -> bool {
        self.detours.now() & Detours::FAULTS != 0
    }

    /// Whether a work request may take the express path now and no port anywhere is down
    /// (so that none it crosses is): one load, where the two questions apart take five.
    #[inline]
    pub(crate) fn express_all_up(&self) -> bool {
        self.detours.now() == 0
    }

    /// Whether the ports at both ends, `(device, port)` each, are up (valid ports: a QP's own and
    /// the one its address vector resolved to).
    pub(crate) fn ports_up(&self, a: (u32, u8), b: (u32, u8)) -> bool {
        self.detours.now() & Detours::PORTS_DOWN == 0
            || self.port_up(a.0, a.1) && self.port_up(b.0, b.1)
    }

    /// Whether port `port` of device `dev` exists here and is up (packets pass). Inline: a
    /// message between processes asks it of both ends as it leaves and as it arrives.
    #[inline]
    pub(crate) fn port_up(&self, dev: u32, port: u8) -> bool {
        // With no port down anywhere, a port that exists is up (no look at its own state).
        if self.detours.now() & Detours::PORTS_DOWN == 0
            && let Some(d) = self.devices.get(dev as usize)
        {
            return port >= 1 && usize::from(port) <= d.ports.len();
        }
        self.port_up_looked_at(dev, port)
    }

    /// [`FabricInner::port_up`] where a port is down, or `dev` is no device here: the port's
    /// own state.
    #[inline(never)]
    fn port_up_looked_at(&self, dev: u32, port: u8) -> bool {
        // Beyond a wire port the network is assumed up; the wire port itself is checked as
        // the packet's other end.
        dev == crate::types::WIRE_DEV
            || self.devices.get(dev as usize).is_some_and(|d| Device::port_up(d, port))
    }

    /// Called by a thread that found nothing to do (an empty CQ): moves inbound host-fabric
    /// packets itself, and in simulation lets virtual time run to the next deadline;
    /// whether anything happened.
    #[inline]
    pub(crate) fn progress(&self) -> bool {
        self.node.get().is_some_and(|n| n.progress(self))
            || self.wire.get().is_some_and(|w| w.progress(self))
            || self.timer.advance(self)
    }

    /// Called when an application thread arms a CQ to sleep on its event (see `Node::attend`).
    pub(crate) fn attend(&self) {
        if let Some(n) = self.node.get() {
            n.attend();
        }
    }

    /// The QPs alive now, taken out of the table so that each can be locked without it.
    pub(crate) fn live_qps(&self) -> Vec<Arc<QpShared>> {
        self.qps.read().values().filter_map(Weak::upgrade).collect()
    }

    /// Device fatal: every QP of device `dev` enters the error state, its work flushed.
    pub(crate) fn fail_device_qps(&self, dev: u32) {
        for qp in self.live_qps().iter().filter(|q| q.device_index() == dev) {
            let mut g = crate::sync::lock::lock_lent(&qp.inner);
            if g.state != crate::QpState::RESET {
                crate::engine::enter_error(qp, &mut g);
            }
        }
    }

    /// Makes sure the death of the process owning `qpn` (if another's) is noticed, and gets
    /// ready to talk to it: the timer thread runs (the first message arms a retransmission
    /// timer) and our ring to it is passed (see `host::Node::watch`), now, as a QP connects,
    /// rather than in the first `ibv_post_send`. A thread starts only once it runs (see
    /// `sys::spawn`), which on cores busy with spinning threads took 3-4 ms. Which node that
    /// process is (its incarnation; 0 for none).
    pub(crate) fn watch_peer_of(&self, qpn: u32) -> u128 {
        let Some(node) = self.remote_node(qpn) else { return 0 };
        let incarnation = node.watch(host::slot_of(qpn));
        self.timer.start();
        incarnation
    }

    /// Whether `qpn` is a QP of another process that has not taken in all this process sent
    /// it, or is stopped (SIGSTOP, a debugger): see `host::Node::behind`.
    pub(crate) fn peer_behind(&self, qpn: u32) -> bool {
        self.remote_node(qpn).is_some_and(|n| n.behind(host::slot_of(qpn)))
    }

    /// The node owning `qpn`, when it is another process's (or another fabric's) on the host
    /// fabric.
    pub(crate) fn remote_node(&self, qpn: u32) -> Option<&host::Node> {
        self.node.get().filter(|n| host::slot_of(qpn) != n.slot)
    }

    /// Whether `qpn` is numbered by another process that is on the host fabric.
    pub(crate) fn numbered_by_another_process(&self, qpn: u32) -> bool {
        self.remote_node(qpn).is_some_and(|n| n.slot_taken(host::slot_of(qpn)))
    }

    /// Before a QP connected to another process closes, with no lock held: the ACKs owed for
    /// what the application took in go first (see `host::Node::settle_deferred`), waiting
    /// for the thread taking messages in as long as it takes. (`part`, under the QP's lock,
    /// which that thread may need, waits for it only briefly.)
    pub(crate) fn settle_acks(&self) {
        if let Some(node) = self.node.get() {
            node.settle_deferred(host::SETTLE_WAIT);
        }
    }

    /// Our QP `qpn`, connected to `dest_qpn`, is being destroyed: a peer in another process
    /// hears of it (see `host::Node::part`).
    pub(crate) fn part(&self, qpn: u32, dest_qpn: u32) {
        if let Some(node) = self.remote_node(dest_qpn) {
            node.part(qpn, dest_qpn);
        }
    }

    pub(crate) fn unregister_qp(&self, qpn: u32) {
        self.qps.write().remove(&qpn);
        if let Some(e) = self.exports() {
            e.clear_qp(qpn);
        }
    }

    /// This process's exports on the host fabric (see [`exports`]), if it has them.
    fn exports(&self) -> Option<&exports::Exports> {
        self.node.get()?.exports.as_ref()
    }

    /// Offers the RC or UC QP as it now is to our peers on the host fabric, for what they may
    /// carry out for us while this process is stopped or not taking in (see [`exports`]).
    /// (Its peers also carry out WRITEs to it as they send them, when its reader looks
    /// absent: `engine::absent_peer::send_placing`.)
    pub(crate) fn export_qp(&self, qp: &QpShared, g: &crate::qp::QpInner) {
        let connected = matches!(qp.qp_type, crate::QpType::RC | crate::QpType::UC);
        let Some(e) = self.exports().filter(|_| connected) else {
            return;
        };
        e.set_qp(&exports::QpExport {
            qpn: qp.qpn,
            dest_qpn: g.attr.dest_qp_num,
            dev: qp.device_index(),
            state: g.state,
            qp_type: qp.qp_type,
            access: g.attr.qp_access_flags,
            pd: Arc::as_ptr(&qp.pd) as u64,
        });
    }

    /// Offers the MR of device `dev` to our peers (see [`exports`]) if it allows remote writes
    /// or reads of memory that is there to be touched (not on-demand paging).
    pub(crate) fn export_mr(&self, dev: u32, mr: &crate::objects::mr::MrInner) {
        let remote = crate::AccessFlags::REMOTE_WRITE | crate::AccessFlags::REMOTE_READ;
        let Some(e) = self.exports() else { return };
        if !mr.access.intersects(remote) || mr.region.on_demand() {
            return;
        }
        e.set_mr(&exports::MrExport {
            dev,
            rkey: mr.rkey,
            access: mr.access,
            pd: Arc::as_ptr(&mr.pd) as u64,
            iova: mr.iova,
            len: mr.region.len() as u64,
            host: mr.region.host_addr(),
            shared: mr.region.shared_id(),
        });
    }

    /// Withdraws the MR `(dev, rkey)` from our peers; returns once none can still be acting
    /// on its memory for us.
    pub(crate) fn withdraw_mr(&self, dev: u32, rkey: u32) {
        if let Some(n) = self.node.get() {
            n.withdraw_mr(dev, rkey);
        }
    }

    /// The live QP numbered `qpn` on device `dev`.
    pub(crate) fn lookup_qp(&self, dev: u32, qpn: u32) -> Option<Arc<QpShared>> {
        let qp = self.qps.read().get(&qpn)?.upgrade()?;
        (qp.device_index() == dev).then_some(qp)
    }

    /// The live QP numbered `qpn`, on whichever device.
    pub(crate) fn lookup_qp_any(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps.read().get(&qpn)?.upgrade()
    }

    /// The device and port an address vector leads to: on RoCE by its GID; on InfiniBand by
    /// its DLID, as a subnet's switches forward (a GRH only matters between subnets).
    /// On RoCE, a unicast GID that no port has leads out of a wire port of its IP family,
    /// if there is one ([`crate::types::WIRE_DEV`]).
    pub(crate) fn route(&self, ah: &AhAttr) -> Option<(u32, u8)> {
        let mut roce_seen = false;
        let here = self.devices.iter().find_map(|d| {
            let roce =
                d.port(1).is_ok_and(|p| p.attr.lock().link_layer == crate::LinkLayer::ETHERNET);
            roce_seen |= roce;
            let port = if roce { d.has_gid(&ah.dgid) } else { d.has_lid(ah.dlid) };
            port.map(|p| (d.id.index, p))
        });
        here.or_else(|| {
            let unicast = !ah.dgid.is_multicast();
            let wire = self.wire.get().filter(|_| roce_seen && ah.is_global && unicast)?;
            wire.reaches(&ah.dgid).then_some((crate::types::WIRE_DEV, ah.port_num))
        })
    }

    /// Adds `qp` to the group `mgid`; `EINVAL` if it is already a member, `ENOMEM` past the
    /// device's limits.
    pub(crate) fn mcast_attach(
        &self,
        mgid: [u8; 16],
        qp: &Arc<QpShared>,
        port: u8,
        max_qps: u32,
        max_groups: u32,
    ) -> crate::Result<()> {
        let mut m = self.mcast.lock();
        if !m.contains_key(&mgid) && m.len() as u32 >= max_groups {
            return Err(crate::Error::new(crate::Errno::ENOMEM, "too many multicast groups"));
        }
        let members = m.entry(mgid).or_default();
        members.retain(|(w, _)| w.strong_count() > 0);
        if members.iter().any(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(qp))) {
            return Err(crate::error::einval("the QP is already attached to this group"));
        }
        if members.len() as u32 >= max_qps {
            return Err(crate::Error::new(crate::Errno::ENOMEM, "too many QPs on this group"));
        }
        members.push((Arc::downgrade(qp), port));
        Ok(())
    }

    /// Removes `qp` from `mgid`; `EINVAL` if it was not attached.
    pub(crate) fn mcast_detach(&self, mgid: [u8; 16], qp: &Arc<QpShared>) -> crate::Result<()> {
        let mut m = self.mcast.lock();
        let members = m.get_mut(&mgid).ok_or(crate::error::einval("no such multicast group"))?;
        let before = members.len();
        members.retain(|(w, _)| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(qp)));
        if members.len() == before {
            return Err(crate::error::einval("the QP is not attached to this group"));
        }
        if members.is_empty() {
            m.remove(&mgid);
        }
        Ok(())
    }

    /// Sends a multicast datagram or an Ethernet frame to the other processes of the host
    /// fabric, if joined.
    pub(crate) fn multicast_to_other_nodes(&self, pkt: &crate::packet::Packet) {
        if let Some(node) = self.node.get() {
            node.multicast(pkt);
        }
    }

    /// The live members of `mgid` and their ports, in attach order.
    pub(crate) fn mcast_members(&self, mgid: &[u8; 16]) -> Vec<(Arc<QpShared>, u8)> {
        let m = self.mcast.lock();
        let members = m.get(mgid).map(Vec::as_slice).unwrap_or_default();
        members.iter().filter_map(|(w, p)| w.upgrade().map(|q| (q, *p))).collect()
    }

    /// Nanoseconds since the fabric started (the real-time drivers' clock).
    pub(crate) fn now(&self) -> u64 {
        self.timer.now()
    }
}

/// A set of emulated devices that can talk to each other, in this process.
///
/// Every device, context and object created from it shares one network; two fabrics never
/// see each other.
///
/// A child made by `fork` makes a fabric of its own, as the C ABI does for it: the one it
/// inherited is its parent's as it stood at the fork, with locks that other threads of the
/// parent's may have held then (the child would wait on them for ever) and descriptors that
/// the parent still reads (a host fabric's refuses the child with `EPERM`).
#[derive(Clone, Debug)]
pub struct Fabric(pub(crate) Arc<FabricInner>);

impl Fabric {
    /// Calls `watch` after each change of a port's state (a cable pulled or plugged, here or
    /// from another process), so that a view of the ports can follow; the first call wins,
    /// later ones are `EBUSY`.
    pub fn on_port_change(&self, watch: PortWatch) -> crate::Result<()> {
        self.0
            .port_watch
            .set(Watcher(watch))
            .map_err(|_| crate::Error::new(crate::Errno::EBUSY, "a port watcher is set already"))
    }

    /// The fabric [`Fabric::try_new`] makes, with `cm` the connection manager it hands what
    /// arrives for one.
    pub(crate) fn with_cm(cfg: FabricConfig, cm: Box<dyn CmAgent>) -> crate::Result<Fabric> {
        crate::sys::watch_forks();
        let ethernet = cfg.profile == Profile::Rxe || cfg.link_layer == crate::LinkLayer::ETHERNET;
        if !cfg.wire.is_empty() && !ethernet {
            return Err(crate::Error::new(
                crate::Errno::EINVAL,
                "a wire port needs Ethernet ports: the rxe profile, or the full profile with RDMA_EMU_LINK_LAYER=ethernet",
            ));
        }
        // A wire port's address is its port's, in its GID table and for the connection manager.
        let mut configured = cfg.addresses.clone();
        configured.extend(cfg.wire.iter().filter(|w| !cfg.addresses.contains(w)));
        let addrs = addr::AddressMap::new(&configured);
        // One lock for every device's keys (see `objects::keys::Keys`).
        let keys_lock = Arc::new(crate::sync::ReadMostly::new(()));
        let device = |i| {
            let (profile, link) = (cfg.profile, cfg.link_layer);
            let ports = (cfg.ports, link, cfg.netdev_mtu);
            let addrs = |p| addrs.addresses_of(i, p);
            let mut d = DeviceInner::new(i, profile, ports, addrs, keys_lock.clone());
            if cfg.host.is_some() {
                // A process numbers its QPs within its node's slot on a host fabric: report
                // what can be created, not the profile's (larger) figure.
                d.attr.max_qp = d.attr.max_qp.min(host::NODE_QPS);
            }
            d
        };
        let devices = (0..cfg.devices).map(|i| Arc::new(device(i))).collect();
        let pcap = cfg.pcap.as_deref().map(pcap::Pcap::create).transpose()?;
        let seed = cfg.seed.unwrap_or_else(faults::clock_seed);
        let fabric = Fabric(Arc::new_cyclic(|this| FabricInner {
            devices,
            qps: RwLock::new(FxHashMap::default()),
            next_qpn: Mutex::new(FIRST_QPN),
            mcast: Mutex::new(Default::default()),
            flows: RwLock::new(Vec::new()),
            timer: timer::Timer::new(cfg.seed.is_some(), this.clone()),
            faults: faults::Faults::new(seed),
            pcap,
            host: cfg.host.as_deref().map(trust::Location::of),
            host_pull_min: cfg.host_pull_min,
            node: OnceLock::new(),
            addrs,
            cm,
            port_watch: OnceLock::new(),
            cq_events: Default::default(),
            detours: Detours::new(!cfg.express, cfg.pcap.is_some(), cfg.seed.is_some()),
            memlock: cfg.memlock,
            raw_needs_cap: cfg.raw_needs_cap,
            share_mr: cfg.share_mr && cfg.host.is_some(),
            wire: OnceLock::new(),
            this: this.clone(),
        }));
        if !cfg.wire.is_empty() {
            let wires = wire_port::WirePorts::bind(&Arc::downgrade(&fabric.0), &cfg.wire)?;
            let _ = fabric.0.wire.set(wires);
        }
        if !cfg.faults.is_empty() {
            fabric.set_faults(cfg.faults);
        }
        Ok(fabric)
    }

    /// What this fabric's node refused to take from other processes on the host fabric (from
    /// another user, malformed, or naming memory it may not read); `None` until it joined one.
    pub fn host_drops(&self) -> Option<host::HostDrops> {
        self.0.node.get().map(host::Node::drops)
    }

    /// What the wire ports refused to take (malformed, damaged, for no QP of theirs, out of
    /// sequence); `None` without wire ports.
    pub fn wire_drops(&self) -> Option<wire_port::WireDrops> {
        self.0.wire.get().map(wire_port::WirePorts::drops)
    }

    /// Replaces the fault rules (an empty list clears them); `after=` counts from now.
    pub fn set_faults(&self, rules: Vec<crate::FaultRule>) {
        self.0.faults.set(&self.0, rules);
    }

    /// How many times each fault rule has hit so far, in the order they were given.
    pub fn fault_hits(&self) -> Vec<u64> {
        self.0.faults.hits()
    }

    /// The seed of every random choice (fault probabilities): the configured one, or one
    /// drawn from the clock. Give it as [`FabricConfig::seed`] (`RDMA_EMU_SEED`) to replay a
    /// run in simulation.
    pub fn seed(&self) -> u64 {
        self.0.faults.seed()
    }

    /// Turns the express path on or off from now on (see [`FabricConfig::express`]); work
    /// already in flight finishes on the path it took.
    pub fn set_express(&self, on: bool) {
        self.0.detours.set(Detours::SWITCHED_OFF, !on);
    }

    /// Whether time is virtual (a seeded simulation).
    pub fn simulated(&self) -> bool {
        self.0.timer.simulated()
    }

    /// The fabric's clock, in nanoseconds since it started (virtual in simulation).
    pub fn now_ns(&self) -> u64 {
        self.0.now()
    }

    /// `ibv_get_device_list`.
    pub fn devices(&self) -> Vec<Device> {
        self.0.devices.iter().map(|d| Device { inner: d.clone(), fabric: self.0.clone() }).collect()
    }

    /// Waits, at most `limit`, until every packet this fabric queued for other processes on
    /// the host fabric has left the process. A process about to exit calls this so its last
    /// messages (an ACK, say) are not lost with it; it does not wait for a peer that has
    /// taken nothing for a quarter of a second (stopped, or dying), so an exit never lingers.
    pub fn flush(&self, limit: std::time::Duration) -> host::Flushed {
        self.0.node.get().map_or(host::Flushed::All, |n| n.flush(limit))
    }

    /// At the process's exit, before [`Fabric::flush`]: every QP connected to a QP of another
    /// process tells it that it closed, as the kernel destroys a process's QPs when it exits.
    /// The peer is then left as hardware leaves it (spare receives posted, an unanswered send
    /// out of retries in time), where the QPs of a process that dies without exiting (killed)
    /// fail at once (see `host::peer_died`). A QP whose lock another thread holds throughout
    /// a short wait is left to that.
    pub fn part_at_exit(&self) {
        if self.0.node.get().is_none() {
            return;
        }
        self.0.settle_acks();
        for qp in self.0.live_qps() {
            for _ in 0..100 {
                if let Some(g) = qp.inner.try_lock() {
                    qp.part(&g);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }

    /// At the process's exit, after [`Fabric::flush`]: leaves the host fabric's directory as
    /// it found it (the node's socket goes; its lock file stays for the next owner of the
    /// slot, and the kernel releases the lock itself).
    pub fn leave_at_exit(&self) {
        if let Some(n) = self.0.node.get() {
            n.leave();
        }
    }

    /// The device called `name`.
    pub fn device(&self, name: &str) -> Option<Device> {
        self.devices().into_iter().find(|d| d.name() == name)
    }
}

/// The reasons work leaves the express path, and the count of ports down, in one word (see
/// [`FabricInner::detours`]).
#[derive(Debug)]
pub(crate) struct Detours(std::sync::atomic::AtomicU32);

impl Detours {
    /// Switched off ([`Fabric::set_express`], [`FabricConfig::express`]).
    const SWITCHED_OFF: u32 = 1 << 0;
    /// Fault rules are set: they must see the packets.
    const FAULTS: u32 = 1 << 1;
    /// A packet trace is written: it must see the packets.
    const TRACED: u32 = 1 << 2;
    /// Time is simulated: work moves as the seeded schedule says.
    const SIMULATED: u32 = 1 << 3;
    /// Any reason to leave the express path.
    const PATH: u32 = (1 << 8) - 1;
    /// One port down (the count of ports down, above the reasons).
    const PORT_DOWN: u32 = 1 << 8;
    const PORTS_DOWN: u32 = !Self::PATH;

    fn new(switched_off: bool, traced: bool, simulated: bool) -> Detours {
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        let word = bit(switched_off, Self::SWITCHED_OFF)
            | bit(traced, Self::TRACED)
            | bit(simulated, Self::SIMULATED);
        Detours(word.into())
    }

    /// The word. (Acquire: what was set up before a reason was cleared or a port came up is
    /// seen by work that then takes the express path.)
    #[inline(always)]
    fn now(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets or clears `reason`.
    pub(crate) fn set(&self, reason: u32, on: bool) {
        use std::sync::atomic::Ordering::AcqRel;
        debug_assert!(reason & Self::PATH == reason);
        match on {
            true => self.0.fetch_or(reason, AcqRel),
            false => self.0.fetch_and(!reason, AcqRel),
        };
    }

    /// A port went down (`down`), or came back up.
    pub(crate) fn port_went(&self, down: bool) {
        use std::sync::atomic::Ordering::AcqRel;
        match down {
            true => self.0.fetch_add(Self::PORT_DOWN, AcqRel),
            false => self.0.fetch_sub(Self::PORT_DOWN, AcqRel),
        };
    }
}

#[cfg(test)]
mod test {
    use crate::*;

    /// Each reason to leave the express path, and each port down, keeps work off it until it
    /// is gone, whichever order they come and go in.
    #[test]
    fn the_express_path_opens_only_when_every_detour_is_gone() {
        let f = Fabric::new(FabricConfig { devices: 2, ..Default::default() });
        let inner = &f.0;
        let open = || (inner.express(), inner.express_all_up());
        assert_eq!(open(), (true, true));

        let d = &f.devices()[1];
        d.set_port_state(1, PortState::DOWN).unwrap();
        assert_eq!(open(), (true, false), "a port down: the express path, but each port looked at");
        assert!(!inner.ports_up((0, 1), (1, 1)));
        assert!(inner.ports_up((0, 1), (0, 1)));
        f.set_express(false);
        f.set_faults(FaultRule::parse("drop:op=ack,nth=1").unwrap());
        assert_eq!(open(), (false, false));
        d.set_port_state(1, PortState::ACTIVE).unwrap();
        f.set_express(true);
        assert_eq!(open(), (false, false), "the fault rules still hold it");
        f.set_faults(vec![]);
        assert_eq!(open(), (true, true));

        let traced = std::env::temp_dir().join(format!("detours-{}.pcap", std::process::id()));
        let f = Fabric::new(FabricConfig { pcap: Some(traced.clone()), ..Default::default() });
        assert_eq!((f.0.express(), f.0.express_all_up()), (false, false), "a trace sees packets");
        let _ = std::fs::remove_file(traced);
        let f = Fabric::new(FabricConfig { seed: Some(7), ..Default::default() });
        assert!(!f.0.express(), "simulated time");
    }
}

//! Queue pairs: the QP object, its attributes, and `modify`'s checks through the state tables.
//!
//! The data path lives in `engine`, above this module: so do the verbs that set it going
//! (`post_send`, `post_recv`, and what entering a state does for `modify`: `engine::verbs`).
//! This module owns creation, validation of attributes and their application, queries and
//! destruction, and the state the engine keeps per QP (`transport`).

mod connect;
pub(crate) mod inbox;
pub(crate) mod queue;
pub(crate) mod recv_ring;
pub mod state;
pub(crate) mod transport;
mod wr;

use std::{collections::VecDeque, sync::Arc};

pub use self::{
    connect::{Endpoint, RcParams},
    wr::{Flush, SendWr, Tso, UdDest},
};
use self::{
    queue::SendQueue,
    transport::{Hint, Lane, Requester, Responder, Route},
};
use crate::{
    error::{Errno, Error, Result, einval},
    objects::{
        Lifecycle,
        context::{About, ContextInner},
        cq::{Cq, CqInner},
        device::ResourceCounts,
        event::EventCount,
        pd::{Pd, PdInner},
        wq::IndTableInner,
    },
    packet::{PSN_MASK, Packet},
    sync::lock::{Lock, lock_lent},
    types::{
        AccessFlags, AhAttr, Ece, EventType, LinkLayer, Mtu, QpAttrMask, QpCreateFlags, QpState,
        QpType, WqFlags,
    },
};

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// What `ibv_create_qp` takes.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    pub qp_type: QpType,
    pub send_cq: &'a Cq,
    pub recv_cq: &'a Cq,
    pub cap: QpCap,
    /// `sq_sig_all`: every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Receives come from this shared receive queue instead of the QP's own.
    pub srq: Option<&'a crate::Srq>,
    /// Raw packet QPs: the largest TSO header a send may carry (0: no `IBV_WR_TSO`).
    pub max_tso_header: u32,
    /// Raw packet QPs: receive offloads (`IBV_QP_CREATE_*`).
    pub create_flags: QpCreateFlags,
}

/// `IBV_RX_HASH_FUNC_TOEPLITZ`, the one RSS hash function.
pub const RX_HASH_FUNC_TOEPLITZ: u8 = 1;

/// What makes a raw packet QP an RSS QP (`rwq_ind_tbl` and `rx_hash_conf` of
/// `struct ibv_qp_init_attr_ex`).
#[derive(Debug, Clone, Copy)]
pub struct RssConf<'a> {
    /// The WQs frames are spread over.
    pub table: &'a crate::RwqIndTable,
    /// [`RX_HASH_FUNC_TOEPLITZ`].
    pub function: u8,
    /// The Toeplitz key: exactly 40 bytes.
    pub key: &'a [u8],
    /// `IBV_RX_HASH_*` bits: the fields hashed.
    pub fields: u64,
}

impl<'a> QpInitAttr<'a> {
    /// A QP of `qp_type` with `cap` whose send and receive completions both go to `cq`, with
    /// its own receive queue and completions only for signaled send WRs (the common case;
    /// set the other fields for the rest).
    pub fn new(qp_type: QpType, cq: &'a Cq, cap: QpCap) -> Self {
        QpInitAttr {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            cap,
            sq_sig_all: false,
            srq: None,
            max_tso_header: 0,
            create_flags: QpCreateFlags::empty(),
        }
    }
}

/// `struct ibv_qp_attr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: AccessFlags,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// Per-QP state, guarded by `QpShared::inner`.
///
/// What makes a raw packet QP an RSS QP.
#[derive(Debug)]
pub(crate) struct Rss {
    pub(crate) table: Arc<IndTableInner>,
    pub(crate) key: Vec<u8>,
    pub(crate) fields: u64,
}

/// Laid out in declaration order (`repr(C)`): what a peer's thread reads and writes when it
/// delivers a message into this QP on the express path (the state, the responder's sequence
/// numbers) comes first, on the lock's cache lines (see [`QpShared`]), so that a delivery
/// from another core misses on as few lines as it can. (The receive queue is not here: the
/// application posts to it without the lock, see [`recv_ring`].)
#[derive(Debug)]
#[repr(C)]
pub(crate) struct QpInner {
    pub(crate) state: QpState,
    /// Path MTU in bytes (from `path_mtu`).
    pub(crate) mtu: u32,
    pub(crate) resp: Responder,
    /// Attributes as last set by `modify` (what `query` reports, with live PSNs).
    pub(crate) attr: QpAttr,
    // What the QP's own thread reads and writes as it posts on the express path, together
    // after the attributes (whose `retry_cnt`, `rnr_retry` and `port_num` it reads too):
    // Requester and SendQueue put those fields of theirs first.
    /// Attributes of the QP's own port (`port_num`).
    pub(crate) port: PortInfo,
    /// The connection as the express path proved it (dropped by any modify).
    pub(crate) lane: Option<Lane>,
    /// The peer is in another process or beyond a wire port: no lane can be proven until a
    /// modify (which clears it), so no request looks for one.
    pub(crate) lane_across: bool,
    pub(crate) req: Requester,
    pub(crate) sq: SendQueue,
    /// The device and port the address vector leads to, resolved when the AV is set.
    pub(crate) dest: Option<(u32, u8)>,
    /// When the address vector leads out of a wire port: the addresses its packets carry.
    pub(crate) wire_grh: Option<crate::types::Grh>,
    /// Cached route to the peer QP.
    pub(crate) route: Route,
    /// An XRC initiator's connection to its target QP as the express path proved it (kept
    /// apart from `lane`, whose post at the head of `post_send` runs RC and UC only).
    pub(crate) xrc_lane: Option<Lane>,
    /// A UD QP's last destination on the express path (`engine::datagram`), held as a lane
    /// holds its peer (its memory, not its life; dropped with the lane).
    pub(crate) ud_peer: Option<Arc<QpShared>>,
    /// Packets taken from the inbox and being processed (kept to reuse its allocation).
    pub(crate) batch: VecDeque<Packet>,
    /// The peer QP, in another process, told us it was destroyed (`Control::QpClosed`): the
    /// death of its process later breaks nothing more (see `fabric::host::peer_died`).
    pub(crate) peer_closed: bool,
    /// Which node of the host fabric the peer QP's process is (see `fabric::host::Node::watch`;
    /// 0: none, or not known): its death fails the QP, a newcomer's in its slot does not.
    /// (Two words, low first: a `u128`'s 16-byte alignment moved the fields the express lane
    /// reads, 5 more instructions per WRITE.)
    pub(crate) peer_incarnation: [u64; 2],
    /// ECE options the application asked for (`ibv_set_ece`), 0 if none.
    pub(crate) ece_wanted: u32,
    /// ECE options in force (`ibv_query_ece`): the device's at creation, then what was
    /// negotiated by the last connecting transition.
    pub(crate) ece: u32,
    /// The QP reached RTS since it was last in RESET: the full profile takes sends only
    /// then (see `engine::requester::post`).
    pub(crate) sq_open: bool,
}

/// Port attributes the data path needs, read when the QP is bound to its port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortInfo {
    pub(crate) lid: u16,
    pub(crate) max_msg_sz: u32,
    /// RoCE: every packet carries a GRH, so receive completions have `IBV_WC_GRH` (as rxe).
    pub(crate) roce: bool,
    /// Active MTU in bytes (the limit of a UD message).
    pub(crate) mtu: u32,
}

/// Laid out in declaration order (`repr(C)`), on cache lines of its own (`align(64)`): the
/// lock first, so that it shares its cache line with the state [`QpInner`] puts first; after
/// `inner`, what a WR on the express path reads of its QP and of the peer's (set at creation,
/// or seldom written), on two lines; the rest after them.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct QpShared {
    /// Taken by every work request (see `sync::lock` for why not parking_lot's).
    pub(crate) inner: Lock<QpInner>,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) pd: Arc<PdInner>,
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    pub(crate) srq: Option<Arc<crate::objects::srq::SrqInner>>,
    /// The receive queue: posted to without `inner`, consumed under it. (Shared: a peer's
    /// [`Hint`] keeps it.)
    pub(crate) rq: Arc<recv_ring::RecvRing>,
    pub(crate) life: Lifecycle,
    /// Handles on the QP (`ibv_open_qp` adds one to a target QP); destroyed with the last.
    pub(crate) handles: std::sync::atomic::AtomicU32,
    /// The lines a post will meet at the lane's peer, looked at before `inner` is taken.
    pub(crate) lane_hint: Hint,
    /// Packets delivered by the fabric, drained in order by whoever services the QP (its
    /// length first: the express path asks whether it is empty).
    pub(crate) inbox: inbox::Inbox,
    /// XRC target QPs: the domain whose SRQs requests name.
    pub(crate) xrcd: Option<Arc<crate::objects::xrcd::XrcdInner>>,
    /// RSS QPs: the indirection table and hash.
    pub(crate) rss: Option<Rss>,
    /// Raw packet QPs: the largest TSO header (0: no TSO).
    pub(crate) max_tso_header: u32,
    /// Raw packet QPs: what receives do to a frame.
    pub(crate) rx_offloads: WqFlags,
    /// [`Qp`] handles in existence (the QP is abandoned when the last goes; see `Drop for
    /// Qp`): a peer's express lane holds the QP's memory but must not keep it alive.
    handles_out: std::sync::atomic::AtomicUsize,
    /// Datagrams and records that arrived for this QP from other processes, part of a message
    /// or a whole one, counted: while the count moves, the wire is making progress toward it
    /// (see `requester::on_timer`).
    pub(crate) heard: std::sync::atomic::AtomicU64,
    pub(crate) async_events: EventCount,
    /// An opaque word for the embedding layer (the C shim keeps its `ibv_qp` pointer here).
    user_data: std::sync::atomic::AtomicUsize,
    /// The (group, LID) pairs attached, in attach order, as the kernel's uverbs lists them
    /// for the QP: what `ibv_attach_mcast` finds already there it takes as done, what
    /// `ibv_detach_mcast` does not find it refuses. (Last: off the lines a post reads.)
    mcast: crate::sync::Mutex<Vec<([u8; 16], u16)>>,
}

impl QpShared {
    pub(crate) fn device_index(&self) -> u32 {
        self.ctx.device.id.index
    }

    /// Raises an affiliated async event on this QP.
    pub(crate) fn raise(self: &Arc<QpShared>, event_type: EventType) {
        // As any object: the context's queue is a layer below the QP (see `crate::events`).
        self.ctx.raise(event_type, About::Qp(Arc::downgrade(self) as _));
    }

    fn release(&self) {
        self.ctx.fabric.unregister_qp(self.qpn);
        self.send_cq.life.put();
        self.recv_cq.life.put();
        if let Some(s) = &self.srq {
            s.life.put();
        }
        if let Some(x) = &self.xrcd {
            x.life.put();
        }
        if let Some(r) = &self.rss {
            r.table.life.put();
        }
        self.pd.life.put();
        ResourceCounts::give(&self.ctx.device.counts.qp);
    }
}

impl QpShared {
    /// Before the QP goes: tells a connected peer in another process that this end closed.
    pub(crate) fn part(&self, g: &QpInner) {
        let connected = matches!(
            g.state,
            QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE | QpState::ERR
        );
        let transport = self.qp_type.is_reliable() || self.qp_type == QpType::UC;
        if connected && transport && g.attr.dest_qp_num != 0 && g.wire_grh.is_none() {
            self.ctx.fabric.part(self.qpn, g.attr.dest_qp_num);
        }
    }
}

impl QpShared {
    /// Nothing can reach the QP any more but the emulator: it goes as a destroyed one does.
    fn abandoned(&self) {
        if self.life.destroy().is_ok() {
            self.ctx.discard_events(self as *const Self);
            self.stop();
            self.release();
        }
    }

    /// A destroyed QP does nothing more: its peer (in another process) is told, its queues
    /// and inbox are emptied without completions, its timers find it in RESET, and it lets
    /// go of the peer its lane holds (two peers must not keep each other). Where the device
    /// cleans CQs at RESET it does here too, as mlx5's `ibv_destroy_qp` takes the QP's
    /// completions out of its CQs: a program may read its CQ to the end after destroying a
    /// QP and take what it finds for the work of a live one (libfabric's rxm reposts the
    /// receive of such a completion on the QP it closed).
    fn stop(&self) {
        let mut g = lock_lent(&self.inner);
        self.part(&g);
        set_state(self, &mut g, QpState::RESET);
        (g.lane, g.xrc_lane, g.lane_across, g.ud_peer) = (None, None, false, None);
        g.sq.clear();
        self.rq.clear();
        self.inbox.clear();
        if self.ctx.device.profile.reset_cleans_cqs() {
            self.send_cq.remove_qp(self.qpn);
            self.recv_cq.remove_qp(self.qpn);
        }
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        self.abandoned();
    }
}

/// The largest send WQE, in bytes: a ConnectX's (16 basic blocks of 64 bytes).
const MAX_SEND_WQE: u32 = 1024;

/// Whether a raw packet QP's send WQE holds a TSO header of `max_tso_header` bytes beside
/// `max_send_sge` SGEs: a ConnectX inlines the header after the control and Ethernet segments
/// (48 bytes), rounded up to 16 bytes, and each SGE takes 16 (mlx5's `mlx5_calc_send_wqe`).
fn tso_header_fits(max_tso_header: u32, max_send_sge: u32) -> bool {
    48 + max_tso_header.next_multiple_of(16) + 16 * max_send_sge <= MAX_SEND_WQE
}

/// Rendezvous a QP on a tag-matching SRQ carries out at once (each a READ and a FIN that the
/// HCA queues itself, beside the application's WQEs: `SendQueue::reserve`). rdma-core's
/// tag-matching test makes such QPs with no send queue of their own at all.
const RNDV_AT_ONCE: u32 = 8;

/// The send queue room a QP on `srq` keeps for the HCA's own WQEs (see [`RNDV_AT_ONCE`]).
fn rndv_reserve(srq: Option<&crate::Srq>) -> u32 {
    if srq.is_some_and(|s| s.0.tm.is_some()) { 2 * RNDV_AT_ONCE } else { 0 }
}

/// The receive offloads a raw packet QP's create flags ask for.
fn rx_offloads(f: QpCreateFlags) -> WqFlags {
    let mut rx = WqFlags::empty();
    rx.set(WqFlags::SCATTER_FCS, f.contains(QpCreateFlags::SCATTER_FCS));
    rx.set(WqFlags::CVLAN_STRIPPING, f.contains(QpCreateFlags::CVLAN_STRIPPING));
    rx.set(WqFlags::PCI_WRITE_END_PADDING, f.contains(QpCreateFlags::PCI_WRITE_END_PADDING));
    rx
}

/// Raw packet and RSS QPs need an Ethernet port (mlx5 refuses them on InfiniBand).
fn raw_port(ctx: &ContextInner) -> Result<()> {
    if ctx.device.port(1)?.attr.lock().link_layer != LinkLayer::ETHERNET {
        return Err(Error::new(
            Errno::EOPNOTSUPP,
            "raw packet QPs need an Ethernet port (RDMA_EMU_LINK_LAYER=ethernet)",
        ));
    }
    Ok(())
}

/// rxe sizes each queue to a power of two with one slot kept empty; the usable depth is the
/// smallest `2^n - 1 >= requested` (at least 1).
fn granted_depth(n: u32) -> u32 {
    (n.max(1) + 1).next_power_of_two() - 1
}

/// The caps rxe grants: the send WQE is sized for `max(sge * 16, inline)` bytes, and both
/// `max_send_sge` and `max_inline_data` are reported as what that size holds.
fn granted_cap(req: &QpCap) -> QpCap {
    let wqe = (req.max_send_sge * 16).max(req.max_inline_data);
    QpCap {
        max_send_wr: granted_depth(req.max_send_wr),
        max_recv_wr: granted_depth(req.max_recv_wr),
        max_send_sge: wqe / 16,
        max_recv_sge: req.max_recv_sge,
        max_inline_data: wqe,
    }
}

impl PortInfo {
    pub(crate) fn of(dev: &crate::objects::device::DeviceInner, port: u8) -> Result<PortInfo> {
        let a = dev.port(port)?.attr.lock().clone();
        Ok(PortInfo {
            lid: a.lid,
            max_msg_sz: a.max_msg_sz,
            roce: a.link_layer == LinkLayer::ETHERNET,
            mtu: a.active_mtu.bytes().unwrap_or(256),
        })
    }
}

/// A queue pair (`struct ibv_qp`). Cheap to clone; all clones are the same QP.
#[derive(Debug)]
pub struct Qp(pub(crate) Arc<QpShared>);

impl Clone for Qp {
    fn clone(&self) -> Qp {
        Qp::new(self.0.clone())
    }
}

/// When the last handle goes, the QP goes (as if destroyed, without waiting for its events'
/// acknowledgements), though a peer's express lane may hold its memory a while longer.
impl Drop for Qp {
    fn drop(&mut self) {
        if self.0.handles_out.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            self.0.abandoned();
        }
    }
}

/// QPs are made on a PD: the object layer below names no QP.
impl crate::Pd {
    /// `ibv_create_qp_ex` with an indirection table and a hash: an RSS QP; see
    /// [`RssConf`](crate::RssConf).
    pub fn create_rss_qp(&self, conf: &crate::RssConf<'_>) -> Result<Qp> {
        Qp::create_rss(self, conf)
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        Qp::create(self, init)
    }
}

/// Target QPs are made and opened in an XRC domain.
impl crate::Xrcd {
    /// `ibv_create_qp_ex` of an `IBV_QPT_XRC_RECV` QP: a target QP in this domain (no PD, no
    /// CQs, no queues of its own).
    pub fn create_recv_qp(&self) -> Result<Qp> {
        Qp::create_target(self)
    }

    /// `ibv_open_qp`: another handle on the target QP `qp_num` of this domain; the QP is
    /// destroyed when its last handle is. A target QP another process created (a domain
    /// shared by file) cannot be opened: `EOPNOTSUPP` (on an HCA it would outlive that
    /// process, which the QP's state here cannot).
    pub fn open_qp(&self, qp_num: u32) -> Result<Qp> {
        self.0.life.check()?;
        if self.0.file.is_some() && self.0.ctx.fabric.numbered_by_another_process(qp_num) {
            return Err(crate::Error::new(
                crate::Errno::EOPNOTSUPP,
                "opening a target QP another process created is not emulated",
            ));
        }
        let qp = self.0.ctx.fabric.lookup_qp_any(qp_num).filter(|q| {
            q.xrcd.as_ref().is_some_and(|x| Arc::ptr_eq(x, &self.0)) && q.life.is_alive()
        });
        let qp = qp.ok_or_else(|| einval("no target QP with that number in the XRC domain"))?;
        qp.handles.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(Qp::new(qp))
    }
}

impl Qp {
    /// A handle on `qp`.
    pub(crate) fn new(qp: Arc<QpShared>) -> Qp {
        qp.handles_out.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Qp(qp)
    }

    pub(crate) fn create(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        Qp::create_in(pd, init, None, None)
    }

    /// An RSS QP: a raw packet QP with no queues of its own, whose frames go to the WQs of
    /// `conf.table` by the Toeplitz hash of the fields `conf.fields` selects (the rules of
    /// rdma-core's mlx5 provider: `EOPNOTSUPP` for another hash function or a field the
    /// device cannot hash; `EINVAL` for a key not 40 bytes long, both IPv4 and IPv6 fields,
    /// both TCP and UDP ports, no field with a table of more than one entry, or a table of
    /// another context).
    pub(crate) fn create_rss(pd: &Pd, conf: &RssConf<'_>) -> Result<Qp> {
        use crate::types::hash_fields as hf;
        let ctx = &pd.0.ctx;
        let a = &ctx.device.attr;
        if !a.has_raw_packet() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no RSS"));
        }
        raw_port(ctx)?;
        if conf.function != RX_HASH_FUNC_TOEPLITZ {
            return Err(Error::new(Errno::EOPNOTSUPP, "RSS hashes with Toeplitz only"));
        }
        if conf.fields & !a.rx_hash_fields_mask != 0 {
            return Err(Error::new(Errno::EOPNOTSUPP, "an RSS field the device cannot hash"));
        }
        let f = conf.fields;
        if conf.key.len() != 40
            || (f & hf::IPV4 != 0 && f & hf::IPV6 != 0)
            || (f & hf::TCP != 0 && f & hf::UDP != 0)
            || (f == 0 && conf.table.len() > 1)
        {
            return Err(einval("RSS key, fields or table out of rule"));
        }
        let t = &conf.table.0;
        if !Arc::ptr_eq(&t.ctx, ctx) {
            return Err(einval("the indirection table belongs to another context"));
        }
        t.life.get()?;
        let rss = Rss { table: t.clone(), key: conf.key.to_vec(), fields: f };
        // The QP has no CQs; it holds a placeholder, as an XRC target does.
        let cq = match crate::Context(ctx.clone()).create_cq(1, None, 0) {
            Ok(cq) => cq,
            Err(e) => {
                t.life.put();
                return Err(e);
            }
        };
        let init = QpInitAttr::new(QpType::RAW_PACKET, &cq, QpCap::default());
        let made = Qp::create_in(pd, &init, None, Some(rss));
        if made.is_err() {
            t.life.put();
        }
        made
    }

    /// An XRC target QP of `xrcd` (it has no PD, CQs or queues; it holds the domain's
    /// placeholders).
    pub(crate) fn create_target(xrcd: &crate::Xrcd) -> Result<Qp> {
        let x = &xrcd.0;
        let init = QpInitAttr {
            qp_type: QpType::XRC_RECV,
            send_cq: &x.holder_cq,
            recv_cq: &x.holder_cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
            max_tso_header: 0,
            create_flags: QpCreateFlags::empty(),
        };
        Qp::create_in(&x.holder_pd, &init, Some(x), None)
    }

    fn create_in(
        pd: &Pd,
        init: &QpInitAttr<'_>,
        xrcd: Option<&Arc<crate::objects::xrcd::XrcdInner>>,
        rss: Option<Rss>,
    ) -> Result<Qp> {
        let ctx = &pd.0.ctx;
        let dev = &ctx.device;
        let mut init = *init;
        // The kernel asks for the capability before the device sees the request.
        if init.qp_type == QpType::RAW_PACKET {
            ctx.fabric.may_use_raw()?;
        }
        match init.qp_type {
            QpType::RC | QpType::UC | QpType::UD => {}
            QpType::XRC_SEND | QpType::XRC_RECV if !dev.attr.has_xrc() => {
                return Err(Error::new(Errno::EOPNOTSUPP, "the device has no XRC"));
            }
            QpType::XRC_SEND => {
                // An initiator has no receive side: no RQ, no SRQ, receive CQ = send CQ.
                (init.recv_cq, init.srq) = (init.send_cq, None);
                (init.cap.max_recv_wr, init.cap.max_recv_sge) = (0, 0);
            }
            QpType::XRC_RECV if xrcd.is_some() => {}
            QpType::XRC_RECV => return Err(einval("an XRC target QP is created in an XRC domain")),
            QpType::RAW_PACKET if !dev.attr.has_raw_packet() => {
                return Err(Error::new(Errno::EOPNOTSUPP, "the device has no raw packet QPs"));
            }
            QpType::RAW_PACKET => raw_port(ctx)?,
            // The kernel lets a driver QP through to the device: rxe knows none.
            QpType::DRIVER if dev.profile == crate::Profile::Rxe => {
                return Err(Error::new(Errno::EOPNOTSUPP, "rxe has no driver QPs"));
            }
            _ => return Err(einval("unknown QP type")),
        }
        if init.max_tso_header > 0
            && (init.qp_type != QpType::RAW_PACKET
                || !tso_header_fits(init.max_tso_header, init.cap.max_send_sge))
        {
            return Err(einval("max_tso_header: raw packet QPs only, within the send WQE"));
        }
        let rx = rx_offloads(init.create_flags);
        if !init.create_flags.is_empty()
            && (init.qp_type != QpType::RAW_PACKET || !dev.attr.wq_flags().contains(rx))
        {
            return Err(Error::new(Errno::EOPNOTSUPP, "create flags: raw packet QPs only"));
        }
        let init = &init;
        for cq in [init.send_cq, init.recv_cq] {
            if !Arc::ptr_eq(&cq.0.ctx, ctx) {
                return Err(einval("CQ belongs to another context"));
            }
        }
        let a = &dev.attr;
        let c = &init.cap;
        if c.max_send_wr > a.max_qp_wr || c.max_recv_wr > a.max_qp_wr {
            return Err(einval("max_send_wr / max_recv_wr above max_qp_wr"));
        }
        if c.max_send_sge > a.max_sge || c.max_recv_sge > a.max_sge {
            return Err(einval("max_send_sge / max_recv_sge above max_sge"));
        }
        if c.max_inline_data > a.max_inline_data {
            return Err(einval("max_inline_data above the device limit"));
        }
        let mut cap = granted_cap(c);
        match init.qp_type {
            // No receive side; a target has no send side either.
            QpType::XRC_SEND => (cap.max_recv_wr, cap.max_recv_sge) = (0, 0),
            QpType::XRC_RECV => cap = QpCap::default(),
            _ => {}
        }
        let port = PortInfo::of(dev, 1)?;
        ResourceCounts::take(&dev.counts.qp, a.max_qp, "too many queue pairs")?;
        // Take the dependents' references in order, undoing on failure.
        if let Some(s) = init.srq
            && !Arc::ptr_eq(&s.0.pd.ctx, ctx)
        {
            return Err(einval("SRQ belongs to another context"));
        }
        let srq_life = init.srq.map(|s| &s.0.life);
        let xrcd_life = xrcd.map(|x| &x.life);
        let mut taken: Vec<&Lifecycle> = Vec::with_capacity(5);
        for life in [
            Some(&pd.0.life),
            Some(&init.send_cq.0.life),
            Some(&init.recv_cq.0.life),
            srq_life,
            xrcd_life,
        ]
        .into_iter()
        .flatten()
        {
            if let Err(e) = life.get() {
                taken.iter().for_each(|l| l.put());
                ResourceCounts::give(&dev.counts.qp);
                return Err(e);
            }
            taken.push(life);
        }
        let made = ctx.fabric.register_qp(|qpn| {
            Arc::new(QpShared {
                qpn,
                qp_type: init.qp_type,
                ctx: ctx.clone(),
                pd: pd.0.clone(),
                send_cq: init.send_cq.0.clone(),
                recv_cq: init.recv_cq.0.clone(),
                srq: init.srq.map(|s| s.0.clone()),
                xrcd: xrcd.cloned(),
                rss,
                max_tso_header: init.max_tso_header,
                rx_offloads: rx,
                handles: std::sync::atomic::AtomicU32::new(1),
                handles_out: Default::default(),
                sq_sig_all: init.sq_sig_all,
                cap,
                inner: Lock::new(QpInner {
                    state: QpState::RESET,
                    attr: QpAttr { cap, port_num: 1, ..Default::default() },
                    sq: SendQueue::new(cap.max_send_wr, rndv_reserve(init.srq)),
                    req: Requester::default(),
                    resp: Responder::default(),
                    mtu: 256,
                    dest: None,
                    wire_grh: None,
                    port,
                    route: Route::default(),
                    lane: None,
                    xrc_lane: None,
                    lane_across: false,
                    ud_peer: None,
                    batch: VecDeque::new(),
                    peer_closed: false,
                    peer_incarnation: [0; 2],
                    ece_wanted: 0,
                    ece: ctx.device.attr.ece_options,
                    sq_open: false,
                }),
                inbox: inbox::Inbox::default(),
                life: Lifecycle::default(),
                async_events: EventCount::default(),
                heard: Default::default(),
                user_data: Default::default(),
                mcast: Default::default(),
                rq: Arc::new(recv_ring::RecvRing::new(cap.max_recv_wr)),
                lane_hint: Default::default(),
            })
        });
        match made {
            Ok(qp) => Ok(Qp::new(qp)),
            Err(e) => {
                taken.iter().for_each(|l| l.put());
                ResourceCounts::give(&dev.counts.qp);
                Err(e)
            }
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    pub fn qp_type(&self) -> QpType {
        self.0.qp_type
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        lock_lent(&self.0.inner).state
    }

    /// The caps granted at creation.
    pub fn cap(&self) -> QpCap {
        self.0.cap
    }

    pub fn send_cq(&self) -> Cq {
        Cq(self.0.send_cq.clone())
    }

    pub fn recv_cq(&self) -> Cq {
        Cq(self.0.recv_cq.clone())
    }

    pub fn pd(&self) -> Pd {
        Pd(self.0.pd.clone())
    }

    /// Whether every send WR generates a completion.
    pub fn sq_sig_all(&self) -> bool {
        self.0.sq_sig_all
    }

    /// The opaque word set by [`Qp::set_user_data`] (0 until set).
    pub fn user_data(&self) -> usize {
        self.0.user_data.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stores an opaque word with the QP (for layers that wrap it, such as the C shim).
    pub fn set_user_data(&self, v: usize) {
        self.0.user_data.store(v, std::sync::atomic::Ordering::Release);
    }

    /// Whether two handles name the same QP.
    pub fn same(&self, other: &Qp) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// `ibv_attach_mcast`: the UD QP receives datagrams sent to the multicast group `gid`
    /// (`ff..`). While attached, the QP cannot be destroyed (`EBUSY`).
    ///
    /// As the kernel's uverbs: a (group, LID) pair already attached is taken as done; a group
    /// the QP is a member of under another LID is listed again without a second membership
    /// (rxe's driver takes it as done too).
    pub fn attach_mcast(&self, gid: &crate::Gid, lid: u16) -> Result<()> {
        self.0.life.check()?;
        let mut listed = self.0.mcast.lock();
        if listed.contains(&(gid.0, lid)) {
            return Ok(());
        }
        // An IPv6 multicast address, or an IPv4-mapped one (RoCE v2 groups; the kernel's
        // rdma_is_multicast_addr takes both).
        if self.0.qp_type != QpType::UD || !gid.is_multicast() {
            return Err(einval("multicast needs a UD QP and a multicast GID"));
        }
        self.0.life.get()?; // an attachment keeps the QP from being destroyed
        if !listed.iter().any(|(m, _)| *m == gid.0) {
            let a = &self.0.ctx.device.attr;
            let (most_qps, most_groups) = (a.max_mcast_qp_attach, a.max_mcast_grp);
            let port = lock_lent(&self.0.inner).attr.port_num;
            if let Err(e) =
                self.0.ctx.fabric.mcast_attach(gid.0, &self.0, port, most_qps, most_groups)
            {
                self.0.life.put();
                return Err(e);
            }
        }
        listed.push((gid.0, lid));
        Ok(())
    }

    /// `ibv_detach_mcast`: `EINVAL` for a (group, LID) pair not attached. Detaching one of
    /// two LIDs a group was attached under leaves the QP out of the group, as on rxe; the
    /// other's detach then fails `EINVAL`, unlisted all the same (uverbs unlists before the
    /// driver detaches), and its hold on the QP stays: it can no longer be destroyed (`EBUSY`,
    /// the kernel's use count of the QP never dropping back).
    pub fn detach_mcast(&self, gid: &crate::Gid, lid: u16) -> Result<()> {
        let mut listed = self.0.mcast.lock();
        let Some(at) = listed.iter().position(|m| *m == (gid.0, lid)) else {
            return Err(einval("the QP is not attached to this group with this LID"));
        };
        listed.remove(at);
        self.0.ctx.fabric.mcast_detach(gid.0, &self.0)?;
        self.0.life.put();
        Ok(())
    }

    /// `ibv_set_ece`: the Enhanced Connection Establishment options to ask for at the next
    /// connecting transition (INIT, RTR, RTS), which takes up those the device offers; until
    /// then `query_ece` reports none. `EOPNOTSUPP` on a device without ECE (rxe) or for
    /// vendor 0 (as libibverbs); `EINVAL` for a `comp_mask` bit or another vendor's options
    /// (as mlx5).
    pub fn set_ece(&self, ece: &Ece) -> Result<()> {
        self.0.life.check()?;
        let attr = &self.0.ctx.device.attr;
        if attr.ece_options == 0 || ece.vendor_id == 0 {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no ECE"));
        }
        if ece.comp_mask != 0 || ece.vendor_id != attr.vendor_id {
            return Err(einval("ECE of another vendor, or with comp_mask bits"));
        }
        let mut g = lock_lent(&self.0.inner);
        g.ece_wanted = ece.options;
        g.ece = 0;
        Ok(())
    }

    /// `ibv_query_ece`: the options in force (see [`Qp::set_ece`]); `EOPNOTSUPP` without ECE.
    pub fn query_ece(&self) -> Result<Ece> {
        self.0.life.check()?;
        let attr = &self.0.ctx.device.attr;
        if attr.ece_options == 0 {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no ECE"));
        }
        let options = lock_lent(&self.0.inner).ece;
        Ok(Ece { vendor_id: attr.vendor_id, options, comp_mask: 0 })
    }

    /// Whether this is an RSS QP (no queues or states of its own).
    pub fn is_rss(&self) -> bool {
        self.0.rss.is_some()
    }

    pub(crate) fn not_rss(&self) -> Result<()> {
        if self.is_rss() {
            return Err(Error::new(Errno::EOPNOTSUPP, "an RSS QP has no attributes to change"));
        }
        Ok(())
    }

    /// `ibv_query_qp`: the attributes, with the current state and PSNs (`EOPNOTSUPP` on an
    /// RSS QP, as mlx5).
    pub fn query(&self) -> Result<QpAttr> {
        self.0.life.check()?;
        self.not_rss()?;
        let g = lock_lent(&self.0.inner);
        let mut a = g.attr;
        a.qp_state = g.state;
        a.cur_qp_state = g.state;
        a.cap = self.0.cap;
        a.sq_psn = g.req.psn;
        a.rq_psn = g.resp.epsn;
        a.sq_draining = (g.state == QpState::SQD && g.sq.in_flight() > 0) as u8;
        if self.0.ctx.device.profile == crate::Profile::Rxe {
            // rxe's address vector keeps no SL or static rate (RoCE carries neither) and is
            // read back as global (a GRH, RoCE's, even before one is set), and a QP's path MTU
            // starts at 256 bytes.
            (a.ah_attr.sl, a.ah_attr.static_rate) = (0, 0);
            a.ah_attr.is_global = true;
            if a.path_mtu == Mtu(0) {
                a.path_mtu = Mtu::MTU_256;
            }
        }
        Ok(a)
    }

    /// `ibv_modify_qp`'s checks of `attr` and `mask` against the QP (`g`: its state, under its
    /// lock), and the attributes applied: the state it was in and the one it enters. What
    /// entering a state sets going is the engine's (see `engine::verbs`).
    pub(crate) fn modify_attrs(
        &self,
        g: &mut QpInner,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(QpState, QpState)> {
        let qp = &self.0;
        let cur = g.state;
        // The kernel's IB_QP_ATTR_STANDARD_BITS: attributes 0..20.
        if mask.bits() & !((1 << 21) - 1) != 0 {
            return Err(Error::new(
                Errno::EOPNOTSUPP,
                "attribute mask bit beyond the standard set",
            ));
        }
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != cur {
            return Err(einval("cur_qp_state is not the QP's state"));
        }
        let next = if mask.contains(QpAttrMask::STATE) { attr.qp_state } else { cur };
        if next.0 > QpState::ERR.0 {
            return Err(einval("qp_state out of range"));
        }
        let mask = mask - state::ignored_attrs(qp.qp_type);
        state::check(qp.qp_type, cur, next, mask)
            .map_err(|_| einval("invalid state transition or attribute mask"))?;
        let ah_attr = self.check_values(attr, mask, g.attr.port_num)?;
        apply(qp, g, &QpAttr { ah_attr, ..*attr }, mask);
        Ok((cur, next))
    }

    /// Checks attribute values; `cur_port` is the QP's port before this modify. The address
    /// vector as resolved (RoCE: the route's hop limit).
    fn check_values(&self, attr: &QpAttr, mask: QpAttrMask, cur_port: u8) -> Result<AhAttr> {
        let dev = &self.0.ctx.device;
        let port_num = if mask.contains(QpAttrMask::PORT) { attr.port_num } else { cur_port };
        let port = dev.port(port_num)?;
        let pattr = port.attr.lock().clone();
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index >= pattr.pkey_tbl_len {
            return Err(einval("pkey_index beyond the P_Key table"));
        }
        if mask.contains(QpAttrMask::PATH_MTU)
            && (attr.path_mtu.bytes().is_none() || attr.path_mtu > pattr.max_mtu)
        {
            return Err(einval("path_mtu invalid or above the port's max_mtu"));
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
            && attr.max_rd_atomic as u32 > dev.attr.max_qp_init_rd_atom
        {
            return Err(einval("max_rd_atomic above max_qp_init_rd_atom"));
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && attr.max_dest_rd_atomic as u32 > dev.attr.max_qp_rd_atom
        {
            return Err(einval("max_dest_rd_atomic above max_qp_rd_atom"));
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return Err(einval("timeout above 31"));
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(einval("retry_cnt above 7"));
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(einval("rnr_retry above 7"));
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(einval("min_rnr_timer above 31"));
        }
        if mask.contains(QpAttrMask::ALT_PATH) && pattr.link_layer == LinkLayer::ETHERNET {
            return Err(einval("no alternate path on RoCE"));
        }
        if mask.contains(QpAttrMask::AV) {
            let ah = &attr.ah_attr;
            // The kernel checks the port before the device sees it (0 among the invalid).
            if ah.port_num != port_num {
                return Err(einval("the address vector's port is not the QP's port"));
            }
            if pattr.link_layer == LinkLayer::ETHERNET && !ah.is_global {
                return Err(einval("RoCE address vectors need a GRH"));
            }
            if ah.is_global && ah.sgid_index as u32 >= pattr.gid_tbl_len {
                return Err(einval("sgid_index beyond the GID table"));
            }
            if ah.is_global && !port.gids.iter().any(|e| e.index == ah.sgid_index as u32) {
                return Err(Error::new(Errno::ENODATA, "sgid_index names an empty GID entry"));
            }
            if pattr.link_layer == LinkLayer::ETHERNET {
                let mut resolved = *ah;
                crate::objects::ah::resolve_roce(&self.0.ctx.fabric, port, &mut resolved)?;
                return Ok(resolved);
            }
        }
        Ok(attr.ah_attr)
    }

    /// `ibv_bind_mw`: binds the type 1 window `mw` as a posted BIND_MW request (completing
    /// with `IBV_WC_BIND_MW`, or `IBV_WC_MW_BIND_ERR` when the bind is refused), and returns
    /// the window's new rkey, which [`Mw::rkey`](crate::Mw::rkey) reports from now on. As in
    /// rdma-core: a type 2 window, an address or length without an MR, or `ZERO_BASED` access
    /// is `EINVAL`; an MR of another PD is `EPERM`.
    pub fn bind_mw(
        &self,
        mw: &crate::Mw,
        wr_id: u64,
        send_flags: crate::SendFlags,
        info: &crate::MwBindInfo<'_>,
    ) -> Result<u32> {
        if mw.mw_type() != crate::MwType::TYPE_1 {
            return Err(einval("ibv_bind_mw binds type 1 windows only"));
        }
        if info.mr.is_none() && (info.addr != 0 || info.length != 0) {
            return Err(einval("an address range needs an MR"));
        }
        if info.mr.is_some_and(|mr| !mr.pd().same(&mw.pd())) {
            return Err(Error::new(Errno::EPERM, "the MR belongs to another PD than the window"));
        }
        if info.access.contains(AccessFlags::ZERO_BASED) {
            return Err(einval("a type 1 window is never zero based"));
        }
        let old = mw.rkey();
        // ibv_inc_rkey: the same index with the next 8-bit tag.
        let rkey = (old & !0xff) | (old.wrapping_add(1) & 0xff);
        let wr = SendWr {
            send_flags,
            ..SendWr::bind_mw(wr_id, crate::MwBind { mw, rkey, info: *info, mw_rkey: None })
        };
        self.post_send(&wr)?;
        Ok(rkey)
    }

    /// `ibv_destroy_qp`: the QP leaves the fabric at once (packets to it are dropped, its
    /// queued WRs are discarded without completions), then the call waits until every async
    /// event reported on the QP has been acknowledged.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.check()?;
        // Another handle (ibv_open_qp) keeps a target QP alive.
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        if self.0.handles.fetch_update(AcqRel, Acquire, |n| (n > 1).then(|| n - 1)).is_ok() {
            return Ok(());
        }
        self.0.life.destroy()?;
        self.0.ctx.fabric.unregister_qp(self.0.qpn);
        self.0.ctx.fabric.settle_acks();
        self.0.stop();
        self.0.ctx.discard_events(Arc::as_ptr(&self.0));
        self.0.ctx.wait_acked(&self.0.async_events);
        self.0.release();
        Ok(())
    }
}

/// Sets the QP's state (under its lock), and the receive queue's mirror of it.
pub(crate) fn set_state(qp: &QpShared, g: &mut QpInner, state: QpState) {
    g.state = state;
    match state {
        QpState::RESET => g.sq_open = false,
        QpState::RTS => g.sq_open = true,
        _ => {}
    }
    qp.rq.set_state(state);
}

/// Stores the attributes named by `mask`.
fn apply(qp: &QpShared, g: &mut QpInner, attr: &QpAttr, mask: QpAttrMask) {
    (g.lane, g.xrc_lane, g.lane_across, g.ud_peer) = (None, None, false, None);
    let a = &mut g.attr;
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        a.qp_access_flags = attr.qp_access_flags;
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) {
        a.pkey_index = attr.pkey_index;
    }
    if mask.contains(QpAttrMask::PORT) {
        a.port_num = attr.port_num;
        g.port = PortInfo::of(&qp.ctx.device, attr.port_num).expect("checked");
    }
    if mask.contains(QpAttrMask::QKEY) {
        a.qkey = attr.qkey;
    }
    if mask.contains(QpAttrMask::AV) {
        a.ah_attr = attr.ah_attr;
        g.dest = qp.ctx.fabric.route(&attr.ah_attr);
        g.wire_grh = None;
        if g.dest.is_some_and(|(dev, _)| dev == crate::types::WIRE_DEV) {
            let ah = &attr.ah_attr;
            let port = qp.ctx.device.port(a.port_num).ok();
            let sgid = port.and_then(|p| p.gids.iter().find(|e| e.index == ah.sgid_index as u32));
            g.wire_grh = Some(crate::types::Grh {
                sgid: sgid.map(|e| e.gid).unwrap_or_default(),
                dgid: ah.dgid,
                traffic_class: ah.traffic_class,
                flow_label: ah.flow_label & 0xf_ffff,
                hop_limit: ah.hop_limit,
            });
        }
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        a.alt_ah_attr = attr.alt_ah_attr;
        a.alt_pkey_index = attr.alt_pkey_index;
        a.alt_port_num = attr.alt_port_num;
        a.alt_timeout = attr.alt_timeout;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        a.path_mtu = attr.path_mtu;
        g.mtu = attr.path_mtu.bytes().expect("checked");
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        a.path_mig_state = attr.path_mig_state;
    }
    if mask.contains(QpAttrMask::TIMEOUT) {
        a.timeout = attr.timeout;
    }
    if mask.contains(QpAttrMask::RETRY_CNT) {
        a.retry_cnt = attr.retry_cnt;
        g.req.retry_left = attr.retry_cnt;
    }
    if mask.contains(QpAttrMask::RNR_RETRY) {
        a.rnr_retry = attr.rnr_retry;
        g.req.rnr_retry_left = attr.rnr_retry;
    }
    if mask.contains(QpAttrMask::RQ_PSN) {
        a.rq_psn = attr.rq_psn & PSN_MASK;
        g.resp.epsn = a.rq_psn;
    }
    if mask.contains(QpAttrMask::SQ_PSN) {
        a.sq_psn = attr.sq_psn & PSN_MASK;
        g.req.psn = a.sq_psn;
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
        a.max_rd_atomic = attr.max_rd_atomic;
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
        a.min_rnr_timer = attr.min_rnr_timer;
    }
    if mask.contains(QpAttrMask::DEST_QPN) {
        a.dest_qp_num = attr.dest_qp_num & PSN_MASK;
        g.peer_closed = false;
        // A peer in another process: learn at once if that process dies (a peer beyond a
        // wire port is numbered by another host, not by a slot of this one).
        let incarnation = match g.wire_grh {
            None => qp.ctx.fabric.watch_peer_of(a.dest_qp_num),
            Some(_) => 0,
        };
        g.peer_incarnation = [incarnation as u64, (incarnation >> 64) as u64];
    }
    if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
        a.en_sqd_async_notify = attr.en_sqd_async_notify;
    }
    if mask.contains(QpAttrMask::RATE_LIMIT) {
        a.rate_limit = attr.rate_limit;
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// With many QPs, a WR on the express path meets its QP and its peer cold: it misses on
    /// each cache line of theirs it reads. Those fields lie on these lines of a `QpShared`
    /// (callgrind's cache simulation of `wr_cost --pairs 256`: 18 misses per WRITE + poll
    /// before they were gathered, 12 after).
    #[test]
    fn a_post_on_the_express_path_reads_few_lines_of_each_qp() {
        use std::collections::BTreeSet;
        let (_f, a, _b) = crate::engine::testkit::pair();
        let qp: &QpShared = &a.qp.0;
        assert_eq!(std::mem::align_of::<QpShared>(), 64);
        assert_eq!(qp as *const QpShared as usize % 64, 0, "the QP is on lines of its own");
        let g = qp.inner.lock();
        let line = |field: *const u8| (field as usize - qp as *const QpShared as usize) / 64;
        macro_rules! at {
            ($($e:tt)*) => { line(std::ptr::addr_of!($($e)*).cast()) };
        }
        // What the poster reads and writes of its own QP (`engine::lane::post_plain`,
        // `completer::progressed`, the hint looked at before the lock).
        let own: BTreeSet<usize> = [
            at!(qp.inner),
            at!(g.state),
            at!(g.mtu),
            at!(g.attr.retry_cnt),
            at!(g.attr.rnr_retry),
            at!(g.attr.port_num),
            at!(g.port),
            at!(g.lane),
            at!(g.lane_across),
            at!(g.req.psn),
            at!(g.req.retry_left),
            at!(g.req.retry_started),
            at!(g.req.rnr_retry_left),
            at!(g.req.progressed_since),
            at!(g.req.rnr_until),
            at!(g.req.retrans_at),
            at!(g.sq.head),
            at!(g.sq.tail),
            at!(qp.qp_type),
            at!(qp.cap),
            at!(qp.sq_sig_all),
            at!(qp.ctx),
            at!(qp.pd),
            at!(qp.send_cq),
            at!(qp.lane_hint),
        ]
        .into();
        // What it reads and writes of the peer (`express::takes`, `responder::refuses`, the
        // receive taken and completed).
        let peer: BTreeSet<usize> = [
            at!(qp.inner),
            at!(g.state),
            at!(g.resp.epsn),
            at!(g.resp.msn),
            at!(g.resp.nak_seq_sent),
            at!(g.resp.comm_est),
            at!(g.resp.forwarded),
            at!(g.attr.qp_access_flags),
            at!(g.attr.port_num),
            at!(g.attr.max_dest_rd_atomic),
            at!(qp.qp_type),
            at!(qp.ctx),
            at!(qp.pd),
            at!(qp.recv_cq),
            at!(qp.srq),
            at!(qp.rq),
            at!(qp.life),
            at!(qp.inbox),
        ]
        .into();
        assert!(own.len() <= 6, "the poster's QP on lines {own:?}");
        assert!(peer.len() <= 5, "the peer on lines {peer:?}");
    }

    #[test]
    fn test_granted_caps_follow_rxe_sizing() {
        let c = granted_cap(&QpCap {
            max_send_wr: 10,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 3,
            max_inline_data: 100,
        });
        assert_eq!(c.max_send_wr, 15);
        assert_eq!(c.max_recv_wr, 31);
        assert_eq!(c.max_inline_data, 100);
        assert_eq!(c.max_send_sge, 6);
        assert_eq!(c.max_recv_sge, 3);
        assert_eq!(granted_depth(0), 1);
    }
}

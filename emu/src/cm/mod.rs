//! The RDMA connection manager (librdmacm's `rdma_cm`): connections named by IP address and
//! port instead of QPNs exchanged by hand.
//!
//! A [`CmId`] resolves an address to an emulated port ([`addr`]), then either listens on a
//! port or connects to a listener; the two sides' QPs are taken through INIT, RTR and RTS with
//! what the connection messages carry (QPN, first PSN, RDMA read resources, retry counts),
//! as the kernel's IB CM does with REQ, REP and RTU, and each step is reported as a
//! [`CmEvent`] on the id's [`CmChannel`], whose descriptor polls like librdmacm's.
//!
//! Within one fabric the messages go straight to the other side's manager; to another process
//! on the host fabric they travel as control messages (module `msg`), and a port bound in one
//! process is taken in all of them (a file per port in the fabric's directory names the node
//! that holds it). A peer process that dies ends its connections: the survivor sees
//! `Disconnected` (or `Unreachable` while connecting). Beyond a wire port they are the IB
//! CM's own MADs on QP1 (modules `wire` and `mad`), so the other side may be the kernel's CM.

pub use crate::fabric::addr;
#[cfg(test)]
mod confused_peer_tests;
mod mad;
mod msg;
mod wire;

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, RawFd},
    sync::{
        Arc, Weak,
        atomic::{AtomicU32, AtomicUsize, Ordering, fence},
    },
};

use crate::sync::Mutex;

use crate::{
    Context, Device, Fabric, Qp, QpAttr,
    error::{Errno, Error, Result},
    fabric::FabricInner,
    objects::{cq::CqInner, device::DeviceInner, event::EventQueue},
    types::{AccessFlags, AhAttr, Ece, Gid, LinkLayer, Mtu, QpAttrMask as M, QpState, QpType},
};

/// A port space: which transport and which kind of port numbers (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC).
    Tcp,
    /// `RDMA_PS_UDP`: datagrams (UD).
    Udp,
    /// `RDMA_PS_IB`: any QP type.
    Ib,
    /// `RDMA_PS_IPOIB`.
    Ipoib,
}

impl PortSpace {
    /// The value of `enum rdma_port_space`.
    pub fn code(self) -> u32 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Ib => 0x013f,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
        }
    }

    pub fn from_code(code: u32) -> Option<PortSpace> {
        [PortSpace::Ipoib, PortSpace::Ib, PortSpace::Tcp, PortSpace::Udp]
            .into_iter()
            .find(|p| p.code() == code)
    }
}

/// What happened (`enum rdma_cm_event_type`; [`CmEventType::code`] is its value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEventType {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
}

impl CmEventType {
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// IB CM reject reason "invalid service ID": nobody listens on that port.
pub const REJ_INVALID_SERVICE_ID: i32 = 8;
/// IB CM reject reason "consumer defined": the listener's application said no.
pub const REJ_CONSUMER_DEFINED: i32 = 28;
/// IB CM reject reason "vendor option not supported" (`rdma_reject_ece`): the listener's
/// application refuses the ECE options offered.
pub const REJ_VENDOR_OPTION_NOT_SUPPORTED: i32 = 35;

/// Private data a REQ carries (RC), as the kernel's rdma_cm leaves it after its own header.
pub const REQ_PRIVATE_DATA: usize = 56;
/// Private data a REP carries.
pub const REP_PRIVATE_DATA: usize = 196;
/// Private data a REJ carries.
pub const REJ_PRIVATE_DATA: usize = 148;
/// Private data a DREQ carries.
pub const DREQ_PRIVATE_DATA: usize = 220;

/// Connection parameters (`struct rdma_conn_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics this side accepts at once (its QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs and atomics this side issues at once (its QP's `max_rd_atomic`).
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// The QPN, for an id without a QP of its own.
    pub qp_num: u32,
}

/// `responder_resources` / `initiator_depth` meaning "as many as the device allows"
/// (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`): on accepting, as many as the requester asked
/// for, up to that.
pub const RD_ATOMIC_MAX: u8 = 0xff;

impl ConnParam {
    /// The read depths this side asks for on device `device`, its limits applied as
    /// librdmacm applies them: [`RD_ATOMIC_MAX`] becomes the device's limit (no more than
    /// `asked`, what the other side's request offers, when accepting); another value above
    /// the limit is `EINVAL`.
    fn rd_atomic(&self, device: &DeviceInner, asked: Option<(u8, u8)>) -> Result<(u8, u8)> {
        let cap = |v: u32| u8::try_from(v).unwrap_or(u8::MAX - 1);
        let (max_resp, max_init) =
            (cap(device.attr.max_qp_rd_atom), cap(device.attr.max_qp_init_rd_atom));
        let (asked_resp, asked_init) = asked.unwrap_or((max_resp, max_init));
        let one = |v: u8, max: u8, asked: u8| match v {
            RD_ATOMIC_MAX => Ok(max.min(asked)),
            v if v > max => Err(einval("read depth beyond the device's limit")),
            v => Ok(v),
        };
        Ok((
            one(self.responder_resources, max_resp, asked_resp)?,
            one(self.initiator_depth, max_init, asked_init)?,
        ))
    }
}

/// The Q_Key of QPs the CM connects in `RDMA_PS_UDP` (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// SIDR REP status "unsupported": no listener for the service (the requester hears
/// `Unreachable` with this status).
pub const SIDR_UNSUPPORTED: i32 = 1;
/// SIDR REP status "reject": the listener's application said no (`rdma_reject` of a UD
/// request).
pub const SIDR_REJECT: i32 = 2;

/// Private data a SIDR REQ carries (a UD "connection" request).
pub const SIDR_REQ_PRIVATE_DATA: usize = 180;
/// Private data a SIDR REP carries.
pub const SIDR_REP_PRIVATE_DATA: usize = 136;

/// What a UD peer needs to send to the other side (`struct rdma_ud_param` less the private
/// data, which is in [`CmEvent::param`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdParam {
    /// The address of the other side's port, from this side's port.
    pub ah_attr: AhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The path a route runs along, as the kernel's CM reports it (`struct ibv_sa_path_rec`, the
/// one of `id->route.path_rec`): on RoCE made up from the two IP addresses (the GIDs they
/// map to, the flow label of the two ports, hop limit 64, the packet lifetime 18, the port's
/// current rate); on InfiniBand the two ports' GIDs and LIDs, as the subnet manager answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRecord {
    pub sgid: Gid,
    pub dgid: Gid,
    pub slid: u16,
    pub dlid: u16,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu: Mtu,
    /// `enum ibv_rate`: 0, the port's current rate.
    pub rate: u8,
    pub packet_life_time: u8,
}

/// The packet lifetime of a path the kernel's CM makes up for RoCE (`CMA_IBOE_PACKET_LIFETIME`)
/// and the one a subnet manager gives by default: a connected QP's ACK timeout is one more.
pub const PACKET_LIFE_TIME: u8 = 18;

/// A connection manager event (`struct rdma_cm_event`).
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// The id the event is about: for `ConnectRequest`, the new id of the connection.
    pub id: CmId,
    /// For `ConnectRequest`: the listening id.
    pub listen_id: Option<CmId>,
    pub event: CmEventType,
    /// 0, a negative errno, or (for `Rejected`) the IB CM reject reason.
    pub status: i32,
    pub param: ConnParam,
    /// For ids in `PortSpace::Udp`: the peer's address, QPN and Q_Key (librdmacm's
    /// `param.ud`), on `ConnectRequest` and `Established`.
    pub ud: Option<UdParam>,
    /// For `MulticastJoin` and `MulticastError`: the group's address.
    pub group: Option<SocketAddr>,
}

/// A channel that connection manager events arrive on (`struct rdma_event_channel`); its
/// descriptor is readable while an event waits.
///
/// Its ids hold the channel, and its unread events their ids; when the application has let
/// go of every handle of the channel, nobody can read those events any more, so they are
/// dropped, and with them that cycle (which kept the ids, the channel and the fabric alive).
#[derive(Debug)]
pub struct CmChannel(Arc<ChannelInner>);

#[derive(Debug)]
struct ChannelInner {
    fabric: Arc<FabricInner>,
    queue: EventQueue<CmEvent>,
    /// The application's handles ([`CmChannel`]s); ids hold the channel without one.
    handles: AtomicUsize,
    /// Ids whose `Disconnected` is held (see [`Held`]): a read of the channel lets those go
    /// whose hold is over, before the fabric's timer notices.
    held: Mutex<Vec<Weak<IdInner>>>,
    /// Threads blocked reading the channel (which shortens a hold: see [`HOLD_NS`]).
    waiters: AtomicUsize,
}

impl ChannelInner {
    /// Queues `ev`, unless the application has let go of every handle of the channel: then
    /// nobody can read it, and kept it would hold its id, which holds the channel (the cycle
    /// [`CmChannel`] speaks of, made again by an event raised after the last handle went).
    /// What was discarded is the caller's to drop (after its locks: an event holds its id).
    #[must_use]
    fn post(&self, ev: CmEvent) -> Vec<CmEvent> {
        self.queue.push(ev);
        // Against a last handle going meanwhile: it counts itself out, then empties the queue;
        // this pushes, then looks at the count. One of the two sees the other's step.
        fence(Ordering::SeqCst);
        if self.handles.load(Ordering::SeqCst) == 0 {
            return self.queue.remove_if(|_| true);
        }
        Vec::new()
    }

    /// Drops every unread event (and the ids they hold): nobody can read them any more.
    fn discard_events(&self) {
        drop(self.queue.remove_if(|_| true));
    }

    /// Raises the held events whose hold is over.
    fn release_held(&self) {
        let mut held = self.held.lock();
        if held.is_empty() {
            return;
        }
        let now = self.fabric.now();
        held.retain(|id| id.upgrade().is_some_and(|id| !CmId(id).release_held(now)));
    }
}

impl Clone for CmChannel {
    fn clone(&self) -> CmChannel {
        CmChannel::handle(&self.0)
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        if self.0.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.discard_events();
        }
    }
}

impl CmChannel {
    /// `rdma_create_event_channel`.
    pub fn new(fabric: &Fabric) -> Result<CmChannel> {
        let inner = ChannelInner {
            fabric: fabric.0.clone(),
            queue: EventQueue::new()?,
            handles: AtomicUsize::new(0),
            held: Mutex::new(Vec::new()),
            waiters: AtomicUsize::new(0),
        };
        Ok(CmChannel::handle(&Arc::new(inner)))
    }

    /// A handle for the application on `inner`.
    fn handle(inner: &Arc<ChannelInner>) -> CmChannel {
        inner.handles.fetch_add(1, Ordering::AcqRel);
        CmChannel(inner.clone())
    }

    /// `rdma_get_cm_event`: the next event; blocks unless the descriptor is non-blocking
    /// (then `EAGAIN`); `EINTR` when a signal interrupts the wait (unless its handler has
    /// `SA_RESTART`).
    pub fn get_event(&self) -> Result<CmEvent> {
        self.0.release_held();
        if self.0.queue.is_nonblocking() || self.0.queue.ready() {
            return self.0.queue.pop();
        }
        self.0.waiters.fetch_add(1, Ordering::AcqRel);
        let ev = self.0.queue.pop();
        self.0.waiters.fetch_sub(1, Ordering::AcqRel);
        ev
    }

    /// Whether an event is queued (a look without a system call).
    pub(crate) fn ready(&self) -> bool {
        self.0.queue.ready()
    }

    /// The next event if one is queued, without blocking, and without a system call if none
    /// is: for the library's own channels, which it made non-blocking (see
    /// [`CmChannel::set_nonblocking`]).
    pub(crate) fn queued_event(&self) -> Option<CmEvent> {
        self.0.release_held();
        self.0.queue.try_pop()
    }

    /// Sets or clears `O_NONBLOCK` on the descriptor (as fcntl on `channel->fd`).
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.0.queue.set_nonblocking(on)
    }

    /// A second descriptor of the channel's (readable as it is).
    pub(crate) fn duplicate_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.0.queue.duplicate_fd()
    }
}

impl AsRawFd for CmChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.0.queue.as_raw_fd()
    }
}

/// Where an id stands (after the kernel's `enum rdma_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active side: the REQ is out.
    Connecting,
    /// Passive side: a REQ arrived, the application has yet to accept or reject it.
    Request,
    /// Rejected by this side: the passive side's request it refused, or the active side's own
    /// request it withdrew before an answer (which it then ignores). Nothing is left but
    /// destroying the id (the kernel's stays in its connect state, whose calls but
    /// `rdma_accept` then fail, and that one fails in its IB CM) and disconnecting it, which
    /// has nothing to end.
    Rejected,
    /// Active side: the request was rejected or went unanswered (a UD lookup too). As the
    /// kernel's, the id stays in its connect state: connecting, resolving or listening again
    /// fails, and a disconnection has nothing to end (measured on rxe); only destroying it is
    /// left.
    Refused,
    /// Passive side: accepted, waiting for the RTU.
    Accepting,
    Connected,
    /// This side ended the connection (DREQ sent) and waits for the other's answer (DREP).
    DreqSent,
    /// The other side ended it (DREQ came): `Disconnected` was raised, and the DREP goes back
    /// when this side disconnects too (or destroys the id).
    DreqRcvd,
    /// Over on both sides: in time-wait until `TimewaitExit`, and after.
    Disconnected,
    /// Its device went away (`DeviceRemoval` was raised): only destroying it is left.
    DeviceRemoved,
    Destroyed,
}

impl State {
    /// Whether the kernel's IB CM id of an id in this state is past its connection (or
    /// listens), so that `rdma_init_qp_attr` fails for a connected QP (its IB CM's answer
    /// outside REQ..ESTABLISHED; measured on rxe).
    fn connection_over(self) -> bool {
        matches!(
            self,
            State::Listen
                | State::Rejected
                | State::Refused
                | State::DreqSent
                | State::DreqRcvd
                | State::Disconnected
        )
    }
}

/// How long a connection's ids stay in time-wait after the DREQ/DREP exchange before
/// `TimewaitExit` (the kernel's IB CM on rxe, measured: 2.07 to 2.3 s).
const TIMEWAIT_NS: u64 = 2_000_000_000;

/// How long a server that accepted waits for the RTU: the kernel's IB CM sends its REP 16
/// times (15 retries), each after the CM response timeout librdmacm asks for (4.096 us x
/// 2^20), and then reports `Unreachable` (measured on rxe: 68.3 s).
const RTU_WAIT_NS: u64 = 16 * 4_096 * (1 << 20);

/// How long a `Disconnected` event waits for the application to read what its QP's CQs held
/// as the DREQ came (see [`Held`]) while a thread of it is blocked reading the event channel
/// (it waits for the event rather than reading its CQs): on a NIC the DREQ follows the peer's
/// last ACK by at least the peer's reaction to the completion and a trip through its kernel,
/// tens of microseconds; here they may arrive together.
const HOLD_NS: u64 = 1_000_000;

/// At most how long a `Disconnected` event waits for the application to read what its QP's
/// CQs held as the DREQ came, when no thread is blocked on its channel: a program that reads
/// its CQ and its channel in turn (libfabric's rxm) may have been kept off its core for more
/// than [`HOLD_NS`] between the two, on a loaded host (two busy loops beside `fi_pingpong`
/// over rxm kept its server off the CPU for that long: it then read the channel before its
/// CQ, closed the connection on `Disconnected`, and the `fin` whose completion its CQ held was
/// lost with the QP).
const HOLD_MAX_NS: u64 = 200_000_000;

/// How long a connection request that finds nobody listening on its port looks for a
/// listener before it is rejected as nobody's. On the kernel a request is judged where it
/// arrives, after its trip through both kernels, and the client's setup before it (address
/// and route resolution, memory pinned) is slow beside a listener's: a server that listens
/// again for its next connection right after a handshake (perftest's `-R`) is there first.
/// Here a client could otherwise win that race: 2 to 6 runs of `ib_write_bw -R` in 30 lost
/// it, none in 30 with this look, none in 30 with two busy loops beside (2 with a 5 ms look).
const REQ_TRANSIT_NS: u64 = 20_000_000;

/// How often a request that found nobody listening looks again (see [`REQ_TRANSIT_NS`]).
const REQ_LOOK_NS: u64 = 250_000;

/// How often the fabric's timer looks whether a held `Disconnected` may go (every
/// [`HOLD_LOOK_NS`] for its first [`HOLD_NS`], then every [`HOLD_LATE_LOOK_NS`]).
const HOLD_LOOK_NS: u64 = 20_000;
const HOLD_LATE_LOOK_NS: u64 = 500_000;

/// A `Disconnected` event held back until the application has read its QP's CQs up to the
/// completions they held as the DREQ came (or for at most [`HOLD_NS`] while a thread waits
/// on its channel, [`HOLD_MAX_NS`] otherwise): a program that reads its CQ and then its
/// events (libfabric's rxm, at every progress call) and closes the QP on `Disconnected` must
/// find the completions of what the peer acknowledged before it disconnected. Destroying a QP
/// takes its completions out of its CQs (the full profile, as mlx5's), so one missed there is
/// lost: rxm then failed its last SEND, acknowledged, as flushed (`fi_pingpong`'s `fin`, now
/// and then), or waited for a receive forever.
#[derive(Debug)]
struct Held {
    /// Each of the QP's CQs that held unread completions, and the newest of them.
    marks: Vec<(Arc<CqInner>, u64)>,
    /// The fabric's clock past which the event goes if a thread waits on its channel.
    soon: u64,
    /// The fabric's clock past which the event goes regardless.
    until: u64,
}

impl Held {
    /// The hold for a DREQ arriving now at `qp`'s id, if its CQs hold completions unread.
    fn of(qp: &Qp, now: u64) -> Option<Held> {
        let (send, recv) = (&qp.0.send_cq, &qp.0.recv_cq);
        let cqs = if Arc::ptr_eq(send, recv) { vec![send] } else { vec![send, recv] };
        let marks: Vec<_> = cqs
            .into_iter()
            .map(|cq| (cq.clone(), cq.pushed()))
            .filter(|(cq, mark)| cq.taken() < *mark)
            .collect();
        (!marks.is_empty()).then_some(Held { marks, soon: now + HOLD_NS, until: now + HOLD_MAX_NS })
    }

    /// Whether the hold is over at `now`, a thread blocked on the channel or not (`waited`).
    fn over(&self, now: u64, waited: bool) -> bool {
        now >= self.until
            || waited && now >= self.soon
            || self.marks.iter().all(|(cq, mark)| cq.taken() >= *mark)
    }
}

use msg::{Msg, Remote, WirePeer};

/// A connection manager id (`struct rdma_cm_id`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct CmId(Arc<IdInner>);

#[derive(Debug)]
struct IdInner {
    num: u32,
    ps: PortSpace,
    fabric: Arc<FabricInner>,
    /// Where its events go ([`CmId::migrate`] moves it).
    channel: Mutex<Arc<ChannelInner>>,
    st: Mutex<IdState>,
    /// An opaque word for the layer that wraps the id (the C library's `rdma_cm_id`).
    user_data: AtomicUsize,
}

#[derive(Debug)]
struct IdState {
    state: State,
    local: Option<SocketAddr>,
    /// The ports of its port space this id took (`Manager::bound`): those its destroy gives
    /// back, without a look at every other port bound.
    taken_ports: Vec<u16>,
    peer: Option<SocketAddr>,
    /// The device and port the local address names.
    port: Option<(u32, u8)>,
    ctx: Option<Context>,
    qp: Option<Qp>,
    /// The first PSN this side sends.
    psn: u32,
    remote: Option<Remote>,
    /// Which node of the host fabric the remote side's process is (0: none, or not known):
    /// its death ends the connection, a newcomer's in its slot does not.
    remote_incarnation: u128,
    /// Active side: the slot of the CM its request was delivered to (0: this process's; read
    /// only while the request is unanswered); `None` before, and for a request beyond a wire
    /// port. With `remote_incarnation` set, another process's, watched for its death.
    delivered_to: Option<u8>,
    /// Listener: at most this many requests not yet accepted or rejected.
    backlog: usize,
    /// Connection of a listener: the listener.
    listener: Option<Weak<IdInner>>,
    /// Listener: the ids of the requests it was handed (those answered since are let go as
    /// the next request comes: see [`unanswered`]).
    requests: Vec<Weak<IdInner>>,
    /// Our own connection parameters, for the QP transitions.
    mine: ConnParam,
    /// `rdma_set_option`s: what the id's options say.
    options: Options,
    /// The multicast groups it joined.
    groups: Vec<SocketAddr>,
    /// ECE: this side's vendor and options (offered in the REQ, taken in the REP), and the
    /// other side's as its REQ or REP carried them (vendor 0: none).
    local_ece: Ece,
    remote_ece: Ece,
    /// Over a wire port: the transaction ID of the request out (its retries are for it).
    wire_tid: u64,
    /// Over a wire port, passive side: the REP sent, sent again if the request comes again
    /// before the RTU (the REP was lost).
    wire_rep: Option<Box<[u8; mad::MAD_LEN]>>,
    /// The `Disconnected` event held back, if any.
    held: Option<Held>,
    /// A datagram listener's answer to lookups (SIDR requests), given by the CM at once,
    /// without an event (see [`CmId::answer_lookups`]).
    answers: Option<Answer>,
}

/// How a datagram listener answers lookups: with its QP, to every requester or only to those
/// whose private data begin with `only` (a socket connected to one peer, as a connected UDP
/// socket takes that peer's datagrams and no other's).
#[derive(Debug, Clone)]
struct Answer {
    qp_num: u32,
    only: Option<Vec<u8>>,
}

impl IdState {
    /// The access INIT gives the id's connected QP: none before the other side is known
    /// (the kernel's CM has no connection yet), else the connection's (see
    /// [`remote_access`]).
    fn init_access(&self) -> AccessFlags {
        self.remote.map_or(AccessFlags::empty(), |r| remote_access(r.initiator_depth))
    }
}

/// The ids bound to each port of each port space.
type Bound = HashMap<(PortSpace, u16), Vec<Weak<IdInner>>>;

/// The connection manager of one fabric.
#[derive(Debug)]
pub(crate) struct Manager {
    next_id: AtomicU32,
    ids: Mutex<HashMap<u32, Weak<IdInner>>>,
    /// Bound ports, by port space and number: the ids that hold them.
    bound: Mutex<Bound>,
    /// Ports taken since `bound` was last swept of ids dropped without a destroy.
    takes_unswept: AtomicUsize,
    next_port: AtomicU32,
    /// The ids that took a request from beyond a wire port, by the requester's id and address
    /// (canonical): a REQ sent again finds its id at once (`wire::taken`).
    wire_requests: Mutex<WireRequests>,
}

/// [`Manager::wire_requests`]: entries of ids gone are dropped as they are found, and all at
/// once when the map has doubled since it was last swept.
#[derive(Debug, Default)]
struct WireRequests {
    by_requester: HashMap<(u32, IpAddr), Weak<IdInner>>,
    swept_at: usize,
}

/// The largest listen backlog (the kernel's `net.rdma_ucm.max_backlog` default).
pub const MAX_BACKLOG: i32 = 1024;

/// First port picked for a bind to port 0 (the kernel's ephemeral range starts at 32768).
const EPHEMERAL: u32 = 32768;

/// Whether the addresses `a` and `b` of two ids (each with its `AFONLY` option) take the same
/// port: the same address, or a wildcard that covers the other (an IPv6 wildcard covers IPv4
/// addresses too unless its id is IPv6-only).
fn overlap(a: IpAddr, a_only: bool, b: IpAddr, b_only: bool) -> bool {
    let covers = |w: IpAddr, only: bool, x: IpAddr| {
        w.is_unspecified() && (w.is_ipv4() == x.is_ipv4() || (w.is_ipv6() && !only))
    };
    a == b || covers(a, a_only, b) || covers(b, b_only, a)
}

/// The options `rdma_set_option` sets on an id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Options {
    /// `RDMA_OPTION_ID_TOS`: the traffic class of the connection's GRH (RoCE).
    tos: u8,
    /// `RDMA_OPTION_ID_REUSEADDR`: a port bound by ids that all say so may be shared until
    /// one of them listens.
    reuse_addr: bool,
    /// `RDMA_OPTION_ID_AFONLY`: an IPv6 wildcard bind covers IPv6 addresses only.
    af_only: bool,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout (else [`ACK_TIMEOUT`]).
    ack_timeout: Option<u8>,
}

/// The file of the host fabric's directory that names the node holding `port` in `ps`.
fn port_name(ps: PortSpace, port: u16) -> String {
    format!("cm-{:x}-{port}", ps.code())
}

impl Manager {
    pub(crate) fn new() -> Manager {
        Manager {
            next_id: AtomicU32::new(1),
            ids: Mutex::default(),
            bound: Mutex::default(),
            takes_unswept: AtomicUsize::new(0),
            next_port: AtomicU32::new(EPHEMERAL),
            wire_requests: Mutex::default(),
        }
    }

    /// Notes that `conn` took the request of id `id` from the address `peer`.
    fn took_wire_request(&self, (id, peer): (u32, IpAddr), conn: &CmId) {
        let mut w = self.wire_requests.lock();
        if w.by_requester.len() >= 2 * w.swept_at.max(32) {
            w.by_requester.retain(|_, c| c.strong_count() > 0);
            w.swept_at = w.by_requester.len();
        }
        w.by_requester.insert((id, peer.to_canonical()), Arc::downgrade(&conn.0));
    }

    /// The id that took the request of id `id` from `peer`, if it is still here.
    pub(super) fn wire_request(&self, id: u32, peer: IpAddr) -> Option<CmId> {
        let key = (id, peer.to_canonical());
        let mut w = self.wire_requests.lock();
        let found = w.by_requester.get(&key)?.upgrade();
        if found.is_none() {
            w.by_requester.remove(&key);
        }
        found.map(CmId)
    }

    fn id(&self, num: u32) -> Option<CmId> {
        self.ids.lock().get(&num).and_then(Weak::upgrade).map(CmId)
    }

    /// Every id alive, out of the table (each may then be locked, which the table's lock is
    /// not taken under).
    fn live_ids(&self) -> Vec<CmId> {
        self.ids.lock().values().filter_map(Weak::upgrade).map(CmId).collect()
    }
}

impl Default for Manager {
    fn default() -> Manager {
        Manager::new()
    }
}

/// The fabric hands what arrives for the CM to its manager.
impl crate::fabric::CmAgent for Manager {
    fn arrived(&self, fabric: &FabricInner, slot: u8, bytes: &[u8]) {
        arrived(fabric, slot, bytes);
    }

    fn wire_arrived(&self, fabric: &FabricInner, local: IpAddr, peer: IpAddr, bytes: &[u8]) {
        wire::arrived(fabric, local, peer, bytes);
    }

    fn device_removed(&self, fabric: &FabricInner, dev: u32) {
        device_removed(fabric, dev);
    }

    fn peer_died(&self, fabric: &FabricInner, slot: u8, incarnation: Option<u128>) -> Vec<u32> {
        peer_died(fabric, slot, incarnation)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The connection manager of `fabric`: the agent the fabric was made with (see
/// `Fabric::try_new`), which is always one.
fn manager(fabric: &FabricInner) -> &Manager {
    match fabric.cm.as_any().downcast_ref::<Manager>() {
        Some(m) => m,
        None => unreachable!("a fabric's CM agent is the connection manager"),
    }
}

/// This fabric's node slot on the host fabric (0: none).
/// Device `dev` of `fabric` (an id's port names it); `EINVAL` if there is none.
fn device_at(fabric: &FabricInner, dev: u32) -> Result<&Arc<DeviceInner>> {
    fabric.devices.get(dev as usize).ok_or_else(|| einval("no such device"))
}

fn my_slot(fabric: &FabricInner) -> u8 {
    fabric.node.get().map_or(0, |n| n.slot)
}

/// Watches the process in `slot` (another's on the host fabric) for its death; which node it
/// is (0: none).
fn watched(fabric: &FabricInner, slot: u8) -> u128 {
    match fabric.node.get() {
        Some(node) if slot != 0 && slot != node.slot => node.watch(slot),
        _ => 0,
    }
}

/// Sends `m` to the CM of `slot`: this fabric's own (0 or our slot), or another process's.
fn deliver(fabric: &FabricInner, slot: u8, m: Msg) {
    match fabric.node.get() {
        Some(node) if slot != 0 && slot != node.slot => node.send_cm(slot, &m.encode()),
        _ => handle(fabric, m),
    }
}

/// Sends `m` to the CM of `to`: over the wire if it is beyond a wire port, else through
/// its slot.
fn send(fabric: &FabricInner, to: &Remote, m: Msg) {
    match &to.wire {
        Some(w) => wire::send(fabric, w, to.qpn, m),
        None => deliver(fabric, to.slot, m),
    }
}

/// A message from another process's CM (`slot`: its node).
fn arrived(fabric: &FabricInner, slot: u8, bytes: &[u8]) {
    match Msg::decode(bytes) {
        // Who it is from is the node that sent it, whatever it says.
        Some(Msg::Req { ps, src, dst, mut from, private }) => {
            from.slot = slot;
            handle(fabric, Msg::Req { ps, src, dst, from, private })
        }
        Some(Msg::Rep { to, mut from, private }) => {
            from.slot = slot;
            handle(fabric, Msg::Rep { to, from, private })
        }
        Some(Msg::Withdrawn { from, .. }) => handle(fabric, Msg::Withdrawn { slot, from }),
        Some(m) => handle(fabric, m),
        None => {}
    }
}

fn handle(fabric: &FabricInner, m: Msg) {
    let cm = manager(fabric);
    match m {
        Msg::Req { ps, src, dst, from, private } => request(fabric, ps, src, dst, from, private),
        Msg::Rep { to, from, private } => {
            cm.id(to).inspect(|a| a.replied(from, &private));
        }
        Msg::Rtu { to } => {
            cm.id(to).inspect(CmId::ready_to_use);
        }
        Msg::Rej { to, reason, private } => {
            cm.id(to).inspect(|a| a.rejected(reason, &private));
        }
        Msg::Dreq { to, from } => match cm.id(to) {
            Some(id) if id.0.st.lock().remote.is_some_and(|r| r.id == from) => {
                id.disconnected_by_peer(true)
            }
            _ => {}
        },
        Msg::Drep { to } => {
            cm.id(to).inspect(CmId::disconnect_replied);
        }
        Msg::Withdrawn { slot, from } => {
            let ids = cm.live_ids();
            let asker = |id: &CmId| {
                let st = id.0.st.lock();
                st.state == State::Request
                    && st.remote.is_some_and(|r| r.wire.is_none() && r.slot == slot && r.id == from)
            };
            ids.iter().filter(|id| asker(id)).for_each(CmId::requester_gone);
        }
    }
}

/// Device `dev` was removed: each id on it (not a wildcard listener, which is on every
/// device) hears `DeviceRemoval` and can only be destroyed; a connection it had is ended, the
/// peer hearing `Disconnected`, as the kernel's CM destroys its IB CM id then.
fn device_removed(fabric: &FabricInner, dev: u32) {
    let ids = manager(fabric).live_ids();
    for id in ids {
        let mut st = id.0.st.lock();
        if st.port.is_none_or(|(d, _)| d != dev) || st.state == State::Destroyed {
            continue;
        }
        let state = std::mem::replace(&mut st.state, State::DeviceRemoved);
        let (remote, delivered_to) = (st.remote, st.delivered_to);
        drop(st);
        // A `Disconnected` held back goes first, as its DREQ came first.
        id.release_held(u64::MAX);
        id.send_last_word(state, remote, delivered_to);
        id.raise(CmEventType::DeviceRemoval, 0, ConnParam::default(), None);
    }
}

/// The process in `slot` is gone: its connections are over.
///
/// Returns the numbers of the QPs of those ids: their connection ends as the kernel's CM ends
/// a dead process's (a DREQ for it, see `fabric::host::peer_died`).
/// With `incarnation`, only the connections to that node (another took its slot since).
fn peer_died(fabric: &FabricInner, slot: u8, incarnation: Option<u128>) -> Vec<u32> {
    let ids = manager(fabric).live_ids();
    let mut qps = Vec::new();
    for id in ids {
        let st = id.0.st.lock();
        let known = st.remote_incarnation;
        let other = incarnation.is_some_and(|i| known != 0 && known != i);
        // A request it never answered.
        let asked = st.state == State::Connecting
            && st.remote.is_none()
            && known != 0
            && st.delivered_to == Some(slot);
        if !(asked || st.remote.is_some_and(|r| r.slot == slot)) || other {
            continue;
        }
        let state = st.state;
        qps.extend(st.qp.as_ref().map(|qp| qp.qp_num()));
        drop(st);
        match state {
            // Refused, as the kernel's CM refuses a request whose id goes with its process.
            State::Connecting if asked => id.rejected(REJ_CONSUMER_DEFINED, &[]),
            // Our DREQ will never be answered: the disconnection is complete.
            State::DreqSent => id.disconnect_replied(),
            State::Connecting => {
                id.0.st.lock().state = State::Refused;
                id.raise(CmEventType::Unreachable, -libc::ETIMEDOUT, ConnParam::default(), None);
            }
            // Nobody is left to answer.
            State::DreqRcvd => id.enter_timewait(),
            _ => id.disconnected_by_peer(false),
        }
    }
    qps
}

fn einval(why: &'static str) -> Error {
    Error::new(Errno::EINVAL, why)
}

/// A pseudo-random 24-bit first PSN for id `num` (the kernel draws one at random).
fn first_psn(num: u32) -> u32 {
    num.wrapping_mul(0x9e37_79b1).rotate_left(7) & 0x00ff_ffff
}

/// `data` padded with zeros to the length the message carries.
fn padded(data: &[u8], len: usize) -> Vec<u8> {
    let mut v = data.to_vec();
    v.resize(len.max(data.len()), 0);
    v
}

impl CmId {
    /// `rdma_create_id` on `channel`, in port space `ps`.
    pub fn create(channel: &CmChannel, ps: PortSpace) -> Result<CmId> {
        Ok(CmId::create_on(&channel.0, ps))
    }

    fn create_on(channel: &Arc<ChannelInner>, ps: PortSpace) -> CmId {
        let cm = manager(&channel.fabric);
        let num = cm.next_id.fetch_add(1, Ordering::Relaxed);
        let st = IdState {
            state: State::Idle,
            local: None,
            taken_ports: Vec::new(),
            peer: None,
            port: None,
            ctx: None,
            qp: None,
            psn: first_psn(num),
            remote: None,
            remote_incarnation: 0,
            delivered_to: None,
            backlog: 0,
            listener: None,
            requests: Vec::new(),
            mine: ConnParam::default(),
            options: Options::default(),
            groups: Vec::new(),
            local_ece: Ece::default(),
            remote_ece: Ece::default(),
            wire_tid: 0,
            wire_rep: None,
            held: None,
            answers: None,
        };
        let (fabric, channel) = (channel.fabric.clone(), Mutex::new(channel.clone()));
        let (st, user_data) = (Mutex::new(st), AtomicUsize::new(0));
        let id = CmId(Arc::new(IdInner { num, ps, fabric, channel, st, user_data }));
        cm.ids.lock().insert(num, Arc::downgrade(&id.0));
        id
    }

    fn fabric(&self) -> &Arc<FabricInner> {
        &self.0.fabric
    }

    fn cm(&self) -> &Manager {
        manager(self.fabric())
    }

    fn raise(&self, event: CmEventType, status: i32, param: ConnParam, listen_id: Option<CmId>) {
        self.raise_ud(event, status, param, listen_id, None);
    }

    fn raise_ud(
        &self,
        event: CmEventType,
        status: i32,
        param: ConnParam,
        listen_id: Option<CmId>,
        ud: Option<UdParam>,
    ) {
        let ev = CmEvent { id: self.clone(), listen_id, event, status, param, ud, group: None };
        self.post(ev);
    }

    /// Queues `ev` on the id's channel, under the lock that names the channel: a migration
    /// meanwhile either finds it queued (and moves it) or has named the new channel first.
    /// (Events discarded as it is posted may hold ids: dropped after that lock.)
    fn post(&self, ev: CmEvent) {
        let discarded = self.0.channel.lock().post(ev);
        drop(discarded);
    }

    /// Whether the id's connections are UD ones (SIDR: no RTU, no disconnection).
    fn datagram(&self) -> bool {
        self.0.ps == PortSpace::Udp
    }

    /// The port space it was created in.
    pub fn port_space(&self) -> PortSpace {
        self.0.ps
    }

    /// The verbs context of the device its address names, once bound or resolved.
    pub fn context(&self) -> Option<Context> {
        self.0.st.lock().ctx.clone()
    }

    /// The port its address names (0 before).
    pub fn port_num(&self) -> u8 {
        self.0.st.lock().port.map_or(0, |p| p.1)
    }

    /// Its local address (after a bind or resolve).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.0.st.lock().local
    }

    /// The address it resolved or that connected to it.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.0.st.lock().peer
    }

    /// The path of its route, once resolved (active side) or once a request brought it
    /// (passive side); `None` before, and for a listener.
    pub fn path(&self) -> Option<PathRecord> {
        let st = self.0.st.lock();
        let routed = matches!(
            st.state,
            State::RouteResolved
                | State::Connecting
                | State::Refused
                | State::Request
                | State::Rejected
                | State::Accepting
                | State::Connected
                | State::DreqSent
                | State::DreqRcvd
                | State::Disconnected
        );
        let (local, peer, (dev, port)) = (st.local?, st.peer?, st.port?);
        // (A UD request, SIDR's, carries no path.)
        if !routed || st.listener.is_some() && self.datagram() {
            return None;
        }
        let fabric = self.fabric();
        let lport = fabric.devices.get(dev as usize)?.port(port).ok()?;
        let lattr = lport.attr.lock().clone();
        // The other end's port, where this fabric knows it.
        let rport = match st.remote {
            Some(r) if r.wire.is_none() => Some((r.device, r.port)),
            Some(_) => None,
            None => fabric.addrs.port_of(peer.ip()),
        };
        let rattr = rport.and_then(|(d, p)| {
            let port = fabric.devices.get(d as usize)?.port(p).ok()?;
            Some((port.attr.lock().clone(), port.gids.first().map(|e| e.gid)))
        });
        let mtu = match (&rattr, st.listener.is_some()) {
            // A request's path has the MTU the requester named, its port's and ours the
            // smaller (as the QP takes it).
            (Some((r, _)), true) => Mtu(lattr.active_mtu.0.min(r.active_mtu.0)),
            _ => lattr.active_mtu,
        };
        // RoCE's path is made up of the two addresses; InfiniBand's is the ports'.
        let (sgid, dgid, slid, dlid, flow_label, hop_limit) =
            if lattr.link_layer == LinkLayer::ETHERNET {
                // The kernel's RoCE v2 flow label: the two UDP ports, the requester's first.
                let (sport, dport) = match st.listener {
                    Some(_) => (peer.port(), local.port()),
                    None => (local.port(), peer.port()),
                };
                let flow = (u32::from(sport) * 31 + u32::from(dport)) & 0xf_ffff;
                (Gid::of_ip(local.ip()), Gid::of_ip(peer.ip()), 0, 0, flow, 64)
            } else {
                let (rlid, rgid) = rattr.map_or((0, None), |(a, g)| (a.lid, g));
                let sgid = lport.gids.first().map(|e| e.gid).unwrap_or_default();
                (sgid, rgid.unwrap_or_default(), lattr.lid, rlid, 0, 0)
            };
        Some(PathRecord {
            sgid,
            dgid,
            slid,
            dlid,
            flow_label,
            hop_limit,
            traffic_class: st.options.tos,
            pkey: 0xffff,
            sl: 0,
            mtu,
            rate: 0,
            packet_life_time: PACKET_LIFE_TIME,
        })
    }

    /// The QP it connects ([`CmId::set_qp`]).
    pub fn qp(&self) -> Option<Qp> {
        self.0.st.lock().qp.clone()
    }

    /// The context of device `dev` for this id.
    fn open_device(&self, dev: u32) -> Result<Context> {
        let inner = self.fabric().devices.get(dev as usize).ok_or_else(|| {
            Error::new(Errno::ENODEV, "the address names a device this fabric lacks")
        })?;
        Device { inner: inner.clone(), fabric: self.fabric().clone() }.open()
    }

    /// Takes `port` (0: a free one) in the id's port space for `addr`'s address.
    fn take_port(&self, ip: IpAddr, port: u16) -> Result<u16> {
        let cm = self.cm();
        let mut bound = cm.bound.lock();
        // A port is taken in every process of the host fabric: join it now if not yet.
        let node = self.fabric().joined().ok().flatten();
        let mine = self.0.st.lock().options;
        // The kernel's answer to a conflict (`cma_check_port`): EADDRNOTAVAIL when either
        // address is a wildcard (or loopback, as Linux 6.1 answers it), EADDRINUSE for the same
        // address twice. Another process's binding is known by its port alone.
        let wide = |a: IpAddr| a.is_unspecified() || a.is_loopback();
        let conflict = |other: Option<IpAddr>| {
            if wide(ip) || other.is_none_or(wide) {
                Errno::EADDRNOTAVAIL
            } else {
                Errno::EADDRINUSE
            }
        };
        let taken = |p: u16, bound: &Bound| -> Option<Errno> {
            if node.is_some_and(|n| n.holder(&port_name(self.0.ps, p)).is_some()) {
                return Some(if wide(ip) { Errno::EADDRNOTAVAIL } else { Errno::EADDRINUSE });
            }
            let v = bound.get(&(self.0.ps, p))?;
            v.iter().filter_map(Weak::upgrade).find_map(|o| {
                let st = o.st.lock();
                // (A datagram socket's port is shared as UDP shares one: its id listens only
                // to answer lookups.)
                let listens = st.state == State::Listen && st.answers.is_none();
                let reused = mine.reuse_addr && st.options.reuse_addr && !listens;
                let other = st.local.map(|a| a.ip());
                let clash = other.is_none_or(|o| overlap(o, st.options.af_only, ip, mine.af_only));
                (!reused && clash).then(|| conflict(other))
            })
        };
        // Taken in every process of the host fabric by creating its file: of two processes
        // after the same free port, one gets it and the other looks further.
        let claim = |p: u16| node.is_none_or(|n| n.claim(&port_name(self.0.ps, p)));
        let port = if port == 0 {
            let free = (0..(65536 - EPHEMERAL)).find_map(|_| {
                let p = cm.next_port.fetch_add(1, Ordering::Relaxed);
                let p = (EPHEMERAL + p % (65536 - EPHEMERAL)) as u16;
                (taken(p, &bound).is_none() && claim(p)).then_some(p)
            });
            free.ok_or_else(|| Error::new(Errno::EADDRNOTAVAIL, "no free port"))?
        } else if let Some(errno) = taken(port, &bound) {
            return Err(Error::new(errno, "the address is in use"));
        } else if !claim(port) {
            let errno = if wide(ip) { Errno::EADDRNOTAVAIL } else { Errno::EADDRINUSE };
            return Err(Error::new(errno, "another process holds the port"));
        } else {
            port
        };
        let v = bound.entry((self.0.ps, port)).or_default();
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(&self.0));
        self.0.st.lock().taken_ports.push(port);
        // A destroy gives back its own ports; those of ids dropped without one are swept
        // once as many ports were taken as are bound (at least 64): a take costs O(1) on
        // average whatever the number bound.
        let unswept = cm.takes_unswept.fetch_add(1, Ordering::Relaxed) + 1;
        if unswept >= bound.len().max(64) {
            cm.takes_unswept.store(0, Ordering::Relaxed);
            bound.retain(|&(ps, p), v| {
                v.retain(|w| w.strong_count() > 0);
                if v.is_empty()
                    && let Some(node) = node
                {
                    node.release(&port_name(ps, p));
                }
                !v.is_empty()
            });
        }
        Ok(port)
    }

    /// `rdma_bind_addr`: binds to a local address (`0.0.0.0` or `::`: every port) and port
    /// (0: a free one). `EADDRNOTAVAIL` for an address of no emulated port, `EADDRINUSE` for
    /// a port bound already.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state != State::Idle {
            return Err(einval("the id is bound already"));
        }
        let port = if addr.ip().is_unspecified() {
            None
        } else {
            let p = self.fabric().addrs.port_of(addr.ip());
            Some(p.ok_or_else(|| Error::new(Errno::EADDRNOTAVAIL, "no port has that address"))?)
        };
        // (An id idle again after a failed connection still has its addresses: a failed bind
        // leaves them as they were.)
        let before = (st.local, st.ctx.clone());
        if let Some((dev, _)) = port {
            st.ctx = Some(self.open_device(dev)?);
        }
        // The local address is set before the port is taken so that others see it.
        st.local = Some(addr);
        drop(st);
        let n = match self.take_port(addr.ip(), addr.port()) {
            Ok(n) => n,
            Err(e) => {
                let mut st = self.0.st.lock();
                (st.local, st.ctx) = before;
                return Err(e);
            }
        };
        let mut st = self.0.st.lock();
        st.local = Some(SocketAddr::new(addr.ip(), n));
        st.port = port;
        st.state = State::AddrBound;
        Ok(())
    }

    /// `rdma_resolve_addr`: finds the emulated port `dst` names and the local address to
    /// reach it from (`src`, or the destination port's own address family's loopback), then
    /// reports `AddrResolved`, or `AddrError` (status `-EHOSTUNREACH`) for an address of no
    /// emulated port.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout_ms: u32,
    ) -> Result<()> {
        if let Some(src) = src.filter(|_| self.0.st.lock().state == State::Idle) {
            self.bind_addr(src)?;
        }
        let mut st = self.0.st.lock();
        if !matches!(st.state, State::Idle | State::AddrBound) {
            return Err(einval("the id cannot resolve an address now"));
        }
        let addrs = &self.fabric().addrs;
        // A multicast group is reached from the bound port, else from loopback's.
        let loopback = if dst.is_ipv4() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        };
        let toward = if dst.ip().is_multicast() { loopback } else { dst.ip() };
        let dest = st.port.filter(|_| dst.ip().is_multicast()).or_else(|| addrs.port_of(toward));
        // Beyond the emulated ports: through a wire port, from its address.
        let (dest, via) = match dest {
            Some(d) => (Some(d), None),
            None => wire::route(self.fabric(), toward)
                .map_or((None, None), |(d, ip)| (Some(d), Some(ip))),
        };
        let Some(dest) = dest else {
            drop(st);
            self.raise(CmEventType::AddrError, -libc::EHOSTUNREACH, ConnParam::default(), None);
            return Ok(());
        };
        st.peer = Some(dst);
        if st.port.is_none() {
            // Reached from the port the destination names: every emulated port reaches
            // every other, and loopback stays on its own port, as on a host.
            st.port = Some(dest);
            st.ctx = Some(self.open_device(dest.0)?);
            let ip = via.or_else(|| addrs.address_of(dest.0, dest.1, dst.ip())).unwrap_or(toward);
            let local = st.local.map_or(0, |a| a.port());
            st.local = Some(SocketAddr::new(ip, local));
        }
        if st.local.is_some_and(|a| a.port() == 0) {
            let ip = st.local.expect("set").ip();
            drop(st);
            let n = self.take_port(ip, 0)?;
            st = self.0.st.lock();
            st.local = Some(SocketAddr::new(ip, n));
        }
        st.state = State::AddrResolved;
        drop(st);
        self.raise(CmEventType::AddrResolved, 0, ConnParam::default(), None);
        Ok(())
    }

    /// `rdma_resolve_route`: reports `RouteResolved` (every emulated port reaches every other).
    pub fn resolve_route(&self, _timeout_ms: u32) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state != State::AddrResolved {
            return Err(einval("the address is not resolved"));
        }
        st.state = State::RouteResolved;
        drop(st);
        self.raise(CmEventType::RouteResolved, 0, ConnParam::default(), None);
        Ok(())
    }

    /// `rdma_listen`: takes connection requests to its bound address; at most `backlog` wait
    /// for an answer at once, further ones are rejected (a backlog of 0 or less, or above
    /// [`MAX_BACKLOG`], is the kernel's maximum, as in its rdma_ucm).
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // An id never bound listens on the IPv4 wildcard and a port of the system's choosing,
        // as the kernel's rdma_listen binds it.
        if self.0.st.lock().state == State::Idle {
            let any = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0));
            self.bind_addr(any)?;
        }
        let mut st = self.0.st.lock();
        if st.state != State::AddrBound {
            return Err(einval("listen needs a bound id that is not listening"));
        }
        st.state = State::Listen;
        if let (Some(node), Some(port)) = (self.fabric().node.get(), st.local.map(|a| a.port())) {
            node.mark_listening(&port_name(self.0.ps, port));
        }
        st.backlog =
            if backlog > 0 && backlog < MAX_BACKLOG { backlog } else { MAX_BACKLOG } as usize;
        Ok(())
    }

    /// A datagram (`PortSpace::Udp`) listener's answer to every lookup (SIDR request) from
    /// now on: the QP `qp_num`, sent by the CM as each request arrives, with no
    /// `ConnectRequest` event (the emulator's datagram rsockets, whose owner may be busy
    /// elsewhere when a first datagram's lookup comes; librdmacm's service thread answers
    /// its peers' lookups the same way). `EINVAL` for another id.
    pub(crate) fn answer_lookups(&self, qp_num: u32) -> Result<()> {
        let mut st = self.0.st.lock();
        if !self.datagram() || st.state != State::Listen {
            return Err(einval("only a datagram listener answers lookups"));
        }
        st.answers = Some(Answer { qp_num, only: None });
        Ok(())
    }

    /// Keeps the lookups [`CmId::answer_lookups`] answers to requesters whose private data
    /// begin with `key` (`None`: anybody again). Of the datagram listeners sharing a port, one
    /// kept for a requester answers it before one that answers anybody, and none answers a
    /// requester it is not kept for.
    pub(crate) fn answer_lookups_from(&self, key: Option<Vec<u8>>) {
        if let Some(a) = &mut self.0.st.lock().answers {
            a.only = key;
        }
    }

    /// The QP the application put in the id itself, or none: librdmacm reads `id->qp` at each
    /// call, and programs move a QP to another id by writing it there (DAPL accepts a request
    /// with the QP it made on its endpoint's own id). Nothing of the QP changes.
    pub fn use_qp(&self, qp: Option<&Qp>) {
        self.0.st.lock().qp = qp.cloned();
    }

    /// `rdma_create_qp`'s part: the id connects `qp`, which it moves to INIT on its port with
    /// the access a connection needs (local write, remote read and write, atomics).
    pub fn set_qp(&self, qp: &Qp) -> Result<()> {
        let mut st = self.0.st.lock();
        let Some((_, port)) = st.port else { return Err(einval("the id has no address yet")) };
        if st.qp.is_some() {
            return Err(einval("the id has a QP already"));
        }
        let connected =
            matches!(qp.qp_type(), QpType::RC | QpType::UC | QpType::XRC_SEND | QpType::XRC_RECV);
        // librdmacm sets a connected QP up with `rdma_init_qp_attr`, which fails there.
        if connected && st.state.connection_over() {
            return Err(einval("the id's connection is over, or it listens"));
        }
        // ECE, as librdmacm's rdma_create_qp: the QP's options become the id's; a QP made for
        // a request asks for those the requester offered (none from another vendor), and the
        // INIT transition takes up what the device has of them.
        st.local_ece = ece_or_none(qp.query_ece())?;
        let asked = st.remote_ece;
        if asked.vendor_id != 0 {
            let want = if asked.vendor_id == st.local_ece.vendor_id {
                asked
            } else {
                no_options(st.local_ece)
            };
            ece_or_none(qp.set_ece(&want).map(|()| want))?;
        }
        if connected {
            let (init, mask) = init_attr(port, false, st.init_access());
            qp.modify(&init, mask)?;
            if asked.vendor_id != 0 {
                st.local_ece.options = ece_or_none(qp.query_ece())?.options;
            }
        } else if qp.qp_type() == QpType::UD {
            // A datagram QP is ready at once, as librdmacm makes it (RTS, the CM's Q_Key).
            for (attr, mask) in
                [init_attr(port, true, AccessFlags::empty()), ud_rtr(), ud_rts(st.psn)]
            {
                qp.modify(&attr, mask)?;
            }
        }
        st.qp = Some(qp.clone());
        Ok(())
    }

    /// `rdma_join_multicast`: joins the multicast group `group` (an IPv4 or IPv6 multicast
    /// address) on the id's port; `MulticastJoin` carries the address to send to the group
    /// (a GRH to its multicast GID, QPN 0xffffff, the CM's Q_Key). The caller attaches its QP
    /// to that GID (librdmacm does, unless the join is send-only). `EINVAL` for an id that is
    /// not a datagram one or has no port, or an address that is not multicast.
    pub fn join_multicast(&self, group: SocketAddr) -> Result<()> {
        let mut st = self.0.st.lock();
        let Some((_, port)) = st.port else { return Err(einval("the id has no address yet")) };
        if !matches!(self.0.ps, PortSpace::Udp | PortSpace::Ipoib) || !group.ip().is_multicast() {
            return Err(einval("multicast needs a datagram id and a multicast address"));
        }
        st.groups.push(group);
        let roce = st.ctx.as_ref().is_some_and(|c| {
            c.0.device.port(port).is_ok_and(|p| p.attr.lock().link_layer == LinkLayer::ETHERNET)
        });
        drop(st);
        let ah_attr = AhAttr {
            is_global: true,
            dgid: multicast_gid(group.ip(), roce),
            hop_limit: 64,
            // IB multicast traffic goes to a multicast LID.
            dlid: if roce { 0 } else { MULTICAST_LID },
            port_num: port,
            ..Default::default()
        };
        let ud = UdParam { ah_attr, qp_num: MULTICAST_QPN, qkey: UDP_QKEY };
        let ev = CmEvent {
            id: self.clone(),
            listen_id: None,
            event: CmEventType::MulticastJoin,
            status: 0,
            param: ConnParam::default(),
            ud: Some(ud),
            group: Some(group),
        };
        self.post(ev);
        Ok(())
    }

    /// `rdma_leave_multicast`: leaves `group`; its multicast GID, for the caller to detach
    /// its QP. `EADDRNOTAVAIL` for a group the id did not join.
    pub fn leave_multicast(&self, group: SocketAddr) -> Result<Gid> {
        let mut st = self.0.st.lock();
        let i = st.groups.iter().position(|g| *g == group);
        let i = i.ok_or(Error::new(Errno::EADDRNOTAVAIL, "the id did not join that group"))?;
        st.groups.remove(i);
        let roce = match (st.port, st.ctx.as_ref()) {
            (Some((_, port)), Some(c)) => {
                c.0.device.port(port).is_ok_and(|p| p.attr.lock().link_layer == LinkLayer::ETHERNET)
            }
            _ => false,
        };
        Ok(multicast_gid(group.ip(), roce))
    }

    /// `rdma_init_qp_attr`: the attributes, and their mask, that take the id's QP to `state`
    /// (INIT, RTR or RTS) as the connection does: INIT on the id's port (with the access
    /// [`CmId::set_qp`] gives, or the CM's Q_Key for a datagram QP), RTR and RTS toward the
    /// peer once its request (passive side) or reply (active side) is known, with what the
    /// two sides negotiated. `EINVAL` for another state, an id without a port, or RTR/RTS of
    /// a connected QP before the peer is known.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, M)> {
        let st = self.0.st.lock();
        let Some((dev, port)) = st.port else { return Err(einval("the id has no address yet")) };
        let ud = st.qp.as_ref().map_or(self.datagram(), |q| q.qp_type() == QpType::UD);
        if !ud && st.state.connection_over() {
            return Err(einval("the id's connection is over, or it listens"));
        }
        match state {
            QpState::INIT => return Ok(init_attr(port, ud, st.init_access())),
            QpState::RTR if ud => return Ok(ud_rtr()),
            QpState::RTS if ud => return Ok(ud_rts(st.psn)),
            QpState::RTR | QpState::RTS => {}
            _ => return Err(einval("the CM sets up INIT, RTR and RTS only")),
        }
        let remote = st.remote.ok_or_else(|| einval("the peer is not known yet"))?;
        let q = if st.listener.is_none() {
            QpSetup::active(&st, remote)
        } else if st.state == State::Request {
            // Not accepted yet: what the request offers.
            let p = ConnParam {
                responder_resources: remote.initiator_depth,
                initiator_depth: remote.responder_resources,
                rnr_retry_count: remote.rnr_retry_count,
                ..Default::default()
            };
            QpSetup::passive(&st, remote, &p)
        } else {
            QpSetup::passive(&st, remote, &st.mine)
        };
        let ty = st.qp.as_ref().map_or(QpType::RC, |q| q.qp_type());
        if state == QpState::RTS {
            return Ok(q.rts(ty));
        }
        q.rtr(self.fabric(), device_at(self.fabric(), dev)?, ty)
    }

    /// `rdma_connect`: sends the connection request to the listener of the resolved address.
    /// `EINVAL` before the route is resolved or with more than [`REQ_PRIVATE_DATA`] bytes of
    /// private data.
    pub fn connect(&self, p: &ConnParam) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state != State::RouteResolved {
            return Err(einval("connect needs a resolved route"));
        }
        let limit = if self.datagram() { SIDR_REQ_PRIVATE_DATA } else { REQ_PRIVATE_DATA };
        if p.private_data.len() > limit {
            return Err(einval("too much private data for a connection request"));
        }
        let qpn = st.qp.as_ref().map_or(p.qp_num, Qp::qp_num);
        let (dev, port) = st.port.expect("resolved");
        let (responder_resources, initiator_depth) =
            p.rd_atomic(device_at(self.fabric(), dev)?, None)?;
        let p = &ConnParam { responder_resources, initiator_depth, ..p.clone() };
        let (dst, src) = (st.peer.expect("resolved"), st.local.expect("resolved"));
        st.state = State::Connecting;
        st.mine = p.clone();
        let from = Remote {
            slot: my_slot(self.fabric()),
            id: self.0.num,
            qpn,
            psn: st.psn,
            device: dev,
            port,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            flow_control: p.flow_control.min(1),
            ece_vendor: st.local_ece.vendor_id,
            ece_options: st.local_ece.options,
            wire: None,
        };
        let tos = st.options.tos;
        drop(st);
        let private = p.private_data.clone();
        let fabric = self.fabric();
        if wire::beyond(fabric, dst.ip()) {
            return wire::connect(self, (src, dst), &from, p, tos);
        }
        let ps = self.0.ps;
        let req = Msg::Req { ps, src, dst, from, private };
        if let Some(slot) = listening_slot(fabric, ps, dst) {
            self.request_to(fabric, slot, req);
            return Ok(());
        }
        // Nobody listens yet: the request looks for its listener for a while.
        let deadline = fabric.now() + REQ_TRANSIT_NS;
        self.look_for_listener(fabric, (ps, dst), req, deadline);
        Ok(())
    }

    /// Has the fabric's timer look, every [`REQ_LOOK_NS`] (in simulated time, at `deadline`
    /// alone), whether someone listens on `to` now, and send `req` there; at `deadline` it
    /// goes to our own CM, which rejects it as nobody's. Ends when the id is destroyed or
    /// leaves `Connecting`.
    fn look_for_listener(
        &self,
        fabric: &FabricInner,
        to: (PortSpace, SocketAddr),
        req: Msg,
        deadline: u64,
    ) {
        // In simulated time one look, at the deadline: a program waiting for its answer moves
        // the virtual clock only once its wait has seemed idle for a while (`fabric::timer`).
        let next = if fabric.timer.simulated() { deadline } else { fabric.now() + REQ_LOOK_NS };
        self.at(next.min(deadline), move |id, f| {
            if id.0.st.lock().state != State::Connecting {
                return;
            }
            match listening_slot(f, to.0, to.1) {
                Some(slot) => id.request_to(f, slot, req),
                None if f.now() >= deadline => id.request_to(f, my_slot(f), req),
                None => id.look_for_listener(f, to, req, deadline),
            }
        });
    }

    /// Sends the connection request `req` to the CM of `slot`, watching that process: its
    /// death before it answers must end the request here.
    fn request_to(&self, fabric: &FabricInner, slot: u8, req: Msg) {
        let incarnation = watched(fabric, slot);
        let mut st = self.0.st.lock();
        (st.delivered_to, st.remote_incarnation) = (Some(slot), incarnation);
        drop(st);
        deliver(fabric, slot, req);
    }

    /// `rdma_accept`: accepts a connection request (on the id `ConnectRequest` carried): its
    /// QP goes to RTR and RTS and the reply goes back.
    pub fn accept(&self, p: &ConnParam) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state != State::Request {
            // librdmacm hands a UD accept to the kernel at once, and moves the QP to the
            // error state when the kernel refuses it (measured on rxe).
            if let Some(qp) = st.qp.clone().filter(|_| self.datagram()) {
                drop(st);
                to_error(&qp);
            }
            return Err(einval("accept needs an id with a connection request"));
        }
        let remote = st.remote.expect("a request has a remote");
        let (dev, _) = st.port.expect("a request has a port");
        let asked = (remote.initiator_depth, remote.responder_resources);
        let (responder_resources, initiator_depth) =
            p.rd_atomic(device_at(self.fabric(), dev)?, Some(asked))?;
        let p = &ConnParam { responder_resources, initiator_depth, ..p.clone() };
        if let Some(qp) = st.qp.as_ref().filter(|_| !self.datagram()) {
            QpSetup::passive(&st, remote, p).rtr_rts(self.fabric(), qp)?;
        }
        // What the kernel's CM refuses, after librdmacm readied the QP: the accept fails and
        // the connection is rejected with it (the QP to ERR, a consumer-defined REJ without
        // private data), as the kernel's rdma_accept rejects on any failure of its own.
        let limit = if self.datagram() { SIDR_REP_PRIVATE_DATA } else { REP_PRIVATE_DATA };
        if p.private_data.len() > limit {
            if let Some(qp) = st.qp.as_ref().filter(|_| !self.datagram()) {
                to_error(qp);
            }
            drop(st);
            // (Another thread's answer meanwhile leaves nothing to reject.)
            let _ = self.reject_for(REJ_CONSUMER_DEFINED, &[]);
            return Err(einval("too much private data for a reply"));
        }
        st.mine = p.clone();
        // A UD reply (SIDR REP) ends the exchange: no RTU follows.
        st.state = if self.datagram() { State::Connected } else { State::Accepting };
        let qpn = st.qp.as_ref().map_or(p.qp_num, Qp::qp_num);
        let (psn, (device, port)) = (st.psn, st.port.expect("set"));
        // The REP answers with the requester's vendor and the options this side took.
        let (ece_vendor, ece_options) = (st.remote_ece.vendor_id, st.local_ece.options);
        drop(st);
        let mine = Remote {
            slot: my_slot(self.fabric()),
            id: self.0.num,
            qpn,
            psn,
            device,
            port,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            flow_control: p.flow_control.min(1),
            ece_vendor,
            ece_options,
            wire: None,
        };
        let private = p.private_data.clone();
        send(self.fabric(), &remote, Msg::Rep { to: remote.id, from: mine, private });
        if !self.datagram() {
            self.await_rtu();
        }
        Ok(())
    }

    /// A reply that no RTU answers within [`RTU_WAIT_NS`] (its requester withdrew, or
    /// ignores it) ends the connection's setup: `Unreachable`, `ETIMEDOUT`, the QP left as it
    /// is (measured on rxe), the id as a refused one.
    fn await_rtu(&self) {
        self.at(self.fabric().now() + RTU_WAIT_NS, |id, _| {
            let mut st = id.0.st.lock();
            if st.state != State::Accepting {
                return;
            }
            st.state = State::Refused;
            drop(st);
            id.raise(CmEventType::Unreachable, -libc::ETIMEDOUT, ConnParam::default(), None);
        });
    }

    /// Has the fabric's timer run `f` on this id at `at` (the fabric's clock), unless the id
    /// is gone by then.
    fn at(&self, at: u64, f: impl FnOnce(CmId, &FabricInner) + Send + 'static) {
        let id = Arc::downgrade(&self.0);
        let run = move |fabric: &FabricInner| {
            if let Some(id) = id.upgrade().map(CmId) {
                f(id, fabric);
            }
        };
        let job = crate::fabric::timer::Job::Later(crate::fabric::timer::Later(Box::new(run)));
        self.fabric().timer.schedule(at, job);
    }

    /// `rdma_reject`: refuses a connection request; the active side sees `Rejected` with
    /// reason [`REJ_CONSUMER_DEFINED`] and `private_data`. On the active side, before an
    /// answer, it withdraws the id's own RC request: nothing is heard either side, and the
    /// answer, when it comes, is ignored (as the kernel's CM does).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.reject_for(REJ_CONSUMER_DEFINED, private_data)
    }

    /// `rdma_reject_ece`: refuses a connection request for its ECE options; the active side
    /// sees `Rejected` with reason [`REJ_VENDOR_OPTION_NOT_SUPPORTED`].
    pub fn reject_ece(&self, private_data: &[u8]) -> Result<()> {
        self.reject_for(REJ_VENDOR_OPTION_NOT_SUPPORTED, private_data)
    }

    fn reject_for(&self, reason: i32, private_data: &[u8]) -> Result<()> {
        let mut st = self.0.st.lock();
        let withdrawn = match st.state {
            State::Request => false,
            // The active side withdrawing its own RC request, not yet answered: the kernel's IB
            // CM sends a REJ that the passive side cannot match to the request (it names no
            // id of the passive side's yet) and goes idle, so the other side hears nothing and
            // this one ignores its answer (measured on rxe: 0, no event either side, the QP as
            // it was). A SIDR request cannot be withdrawn (EINVAL, as there).
            State::Connecting if !self.datagram() => st.remote.is_none(),
            _ => return Err(einval("reject needs an id with a connection request")),
        };
        if private_data.len() > REJ_PRIVATE_DATA {
            return Err(einval("too much private data for a reject"));
        }
        if withdrawn {
            st.state = State::Rejected;
            return Ok(());
        }
        // A request heard of, or (active side) a reply heard of, with no QP of its own
        // (`ConnectResponse`): the other side hears `Rejected` (measured on rxe).
        let remote = st.remote.expect("a request or a reply has a remote");
        // (Idle, it could be bound again while still naming the requester's port: a connect
        // from it then found no local address.)
        st.state = State::Rejected;
        drop(st);
        let private = private_data.to_vec();
        send(self.fabric(), &remote, Msg::Rej { to: remote.id, reason, private });
        Ok(())
    }

    /// `rdma_disconnect`: ends the connection or answers the other side's end of it. This
    /// side's QP goes to the error state (flushing its work requests). Ending it sends a DREQ:
    /// the other side sees `Disconnected` at once, this side once the other answers by
    /// disconnecting too (or destroying its id), as with the kernel's IB CM. Answering sends
    /// that DREP. Both ids then stay in time-wait for a while and see `TimewaitExit`.
    /// Once the connection is over, again 0 and nothing more but the QP's move to error;
    /// `EINVAL` for an id that never asked for or heard of a connection. The id's QP goes to
    /// the error state whatever the answer (librdmacm moves it before it asks the kernel).
    pub fn disconnect(&self) -> Result<()> {
        let mut st = self.0.st.lock();
        let state = st.state;
        // What the call answers, and whether it ends something (a DREQ or DREP to send).
        let (answer, ends) = match state {
            // (A UD exchange has nothing to end: its IB CM id is SIDR's.)
            State::Connected | State::Accepting if !self.datagram() => {
                st.state = State::DreqSent;
                (Ok(()), true)
            }
            State::DreqRcvd => {
                st.state = State::Disconnected;
                (Ok(()), true)
            }
            // The kernel's CM id is there, with nothing to end (measured on rxe): a
            // connection over, refused either way, not yet answered (either side: nothing is
            // sent, the request stands), or a listener on a device (one on every device, a
            // wildcard, has none: librdmacm refuses it for want of a device).
            State::DreqSent
            | State::Disconnected
            | State::Rejected
            | State::Refused
            | State::Connecting
            | State::Request
            | State::Connected
            | State::Accepting => (Ok(()), false),
            State::Listen if st.port.is_some() => (Ok(()), false),
            _ => (Err(einval("the id is not connected")), false),
        };
        let (qp, remote) = (st.qp.clone(), st.remote);
        drop(st);
        if let Some(qp) = qp {
            to_error(&qp);
        }
        if !ends {
            return answer;
        }
        let num = self.0.num;
        match (state, remote) {
            (State::DreqRcvd, Some(r)) => {
                send(self.fabric(), &r, Msg::Drep { to: r.id });
                self.enter_timewait();
            }
            (_, Some(r)) => send(self.fabric(), &r, Msg::Dreq { to: r.id, from: num }),
            (_, None) => self.disconnect_replied(),
        }
        Ok(())
    }

    /// The other side answered our DREQ (or can no longer).
    fn disconnect_replied(&self) {
        let mut st = self.0.st.lock();
        let state = st.state;
        if matches!(state, State::DreqSent | State::DreqRcvd) {
            st.state = State::Disconnected;
            drop(st);
            // DreqRcvd: the DREQs crossed, and `Disconnected` was raised for the other's.
            if state == State::DreqSent {
                self.raise(CmEventType::Disconnected, 0, ConnParam::default(), None);
            }
            self.enter_timewait();
        }
    }

    /// What an id going away in `state` owes the other side: a connection still up is ended
    /// (a DREQ), the other side's DREQ answered (a DREP), a request it heard and never
    /// answered refused (a REJ, "consumer defined"), a request it made and never had answered
    /// withdrawn (an RC one; a SIDR request's id goes without a word): as the kernel's CM
    /// does when its IB CM id goes.
    fn send_last_word(&self, state: State, remote: Option<Remote>, delivered_to: Option<u8>) {
        let fabric = self.fabric();
        let Some(r) = remote else {
            if let (State::Connecting, Some(slot)) = (state, delivered_to)
                && !self.datagram()
            {
                deliver(fabric, slot, Msg::Withdrawn { slot: my_slot(fabric), from: self.0.num });
            }
            return;
        };
        let m = match state {
            // (Connecting with a remote: the reply came to an id without a QP.)
            State::Request | State::Connecting => {
                Msg::Rej { to: r.id, reason: REJ_CONSUMER_DEFINED, private: Vec::new() }
            }
            // (A datagram exchange ends with its reply: nothing to disconnect.)
            State::Connected | State::Accepting if !self.datagram() => {
                Msg::Dreq { to: r.id, from: self.0.num }
            }
            State::DreqRcvd => Msg::Drep { to: r.id },
            _ => return,
        };
        send(fabric, &r, m);
    }

    /// Time-wait: `TimewaitExit` comes after [`TIMEWAIT_NS`], unless the id is destroyed.
    fn enter_timewait(&self) {
        self.at(self.fabric().now() + TIMEWAIT_NS, |id, _| {
            if id.0.st.lock().state == State::Disconnected {
                id.raise(CmEventType::TimewaitExit, 0, ConnParam::default(), None);
            }
        });
    }

    /// `rdma_destroy_id`: a connection still up is ended first (the peer sees
    /// `Disconnected`), a bound port is released.
    pub fn destroy(&self) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state == State::Destroyed {
            return Err(einval("the id was destroyed"));
        }
        let state = std::mem::replace(&mut st.state, State::Destroyed);
        let (remote, delivered_to) = (st.remote, st.delivered_to);
        (st.qp, st.ctx) = (None, None);
        drop(st);
        self.send_last_word(state, remote, delivered_to);
        // Its unread events go, as the kernel's ucma drops them; a connection request to a
        // listener takes its new id with it.
        let me = |id: &CmId| Arc::ptr_eq(&id.0, &self.0);
        let unread = self
            .0
            .channel
            .lock()
            .queue
            .remove_if(|e| me(&e.id) || e.listen_id.as_ref().is_some_and(me));
        for e in unread {
            if e.listen_id.as_ref().is_some_and(me) {
                let _ = e.id.destroy();
            }
        }
        let cm = self.cm();
        cm.ids.lock().remove(&self.0.num);
        // Its own ports alone (each destroy looked at every port bound: 372 us a connection
        // with 6,000 up). A port left to nobody is given back in every process, under the
        // lock a take holds, so that no take of it comes between.
        let ports = std::mem::take(&mut self.0.st.lock().taken_ports);
        let node = self.fabric().node.get();
        let mut bound = cm.bound.lock();
        for port in ports {
            let key = (self.0.ps, port);
            let Some(v) = bound.get_mut(&key) else { continue };
            v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.0)));
            if v.is_empty() {
                bound.remove(&key);
                if let Some(node) = node {
                    node.release(&port_name(key.0, key.1));
                }
            }
        }
        Ok(())
    }

    /// Active side: the listener accepted.
    fn replied(&self, remote: Remote, private_data: &[u8]) {
        // (Not under the id's lock: the death of that node takes it.)
        let incarnation = watched(self.fabric(), remote.slot);
        let mut st = self.0.st.lock();
        if st.state != State::Connecting {
            return;
        }
        (st.remote, st.remote_incarnation) = (Some(remote), incarnation);
        if self.datagram() {
            st.state = State::Connected;
            let path = Path::of(&st, &remote);
            drop(st);
            let private_data = padded(private_data, SIDR_REP_PRIVATE_DATA);
            let param = ConnParam { private_data, qp_num: remote.qpn, ..Default::default() };
            let ud = path.and_then(|path| ah_toward(self.fabric(), path)).map(|ah_attr| UdParam {
                ah_attr,
                qp_num: remote.qpn,
                qkey: UDP_QKEY,
            });
            return self.raise_ud(CmEventType::Established, 0, param, None, ud);
        }
        let param = ConnParam {
            private_data: padded(private_data, REP_PRIVATE_DATA),
            responder_resources: remote.initiator_depth,
            initiator_depth: remote.responder_resources,
            // (A REP carries no retry count: the kernel's event says 0.)
            rnr_retry_count: remote.rnr_retry_count,
            flow_control: remote.flow_control,
            qp_num: remote.qpn,
            ..Default::default()
        };
        let taken = Ece { vendor_id: remote.ece_vendor, options: remote.ece_options, comp_mask: 0 };
        let Some(qp) = st.qp.clone() else {
            // The application connects its own QP: it hears of the reply and establishes.
            st.remote_ece = taken;
            drop(st);
            return self.raise(CmEventType::ConnectResponse, 0, param, None);
        };
        if let Err(e) = take_ece(&mut st, &qp, taken).and_then(|()| {
            QpSetup::active(&st, remote).rtr_rts(self.fabric(), &qp)?;
            st.local_ece.options = ece_or_none(qp.query_ece())?.options;
            Ok(())
        }) {
            to_error(&qp);
            st.state = State::Idle;
            drop(st);
            return self.raise(CmEventType::ConnectError, -e.errno().raw(), param, None);
        }
        st.state = State::Connected;
        drop(st);
        // The RTU before this side hears of the connection: nothing this side does once it
        // knows may reach the other side before it (its data, a DREQ), as on a wire, where
        // the RTU leaves first. (On one channel the kernel's order is this side's event
        // first, which this gives up.)
        send(self.fabric(), &remote, Msg::Rtu { to: remote.id });
        self.raise(CmEventType::Established, 0, param, None);
    }

    /// `rdma_set_local_ece`: the ECE to offer in the REQ (or answer with in the REP) for an id
    /// whose QP the application connects itself. `EINVAL` for an id with a QP (its options are
    /// the QP's), vendor 0 or `comp_mask` bits.
    pub fn set_local_ece(&self, ece: Ece) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.qp.is_some() || ece.vendor_id == 0 || ece.comp_mask != 0 {
            return Err(einval("local ECE: an id without a QP, a vendor, no comp_mask"));
        }
        st.local_ece = ece;
        Ok(())
    }

    /// `rdma_get_remote_ece`: the ECE the other side's REQ or REP carried (vendor 0: none), for
    /// an id whose QP the application connects itself (`EINVAL` for an id with a QP).
    pub fn remote_ece(&self) -> Result<Ece> {
        let st = self.0.st.lock();
        if st.qp.is_some() {
            return Err(einval("remote ECE is for ids without a QP"));
        }
        Ok(st.remote_ece)
    }

    /// `rdma_establish`: for an active id without a QP of its own, after `ConnectResponse`.
    pub fn establish(&self) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state == State::Request && st.qp.is_none() {
            // librdmacm asks the kernel to accept it as an RTU: a UD request's accept is a
            // SIDR reply, sent; an RC one's IB CM cannot send an RTU for a request, and the
            // kernel's accept then rejects it (both measured on rxe).
            drop(st);
            if self.datagram() {
                return self.accept(&ConnParam::default());
            }
            let _ = self.reject_for(REJ_CONSUMER_DEFINED, &[]);
            return Err(einval("establish needs a connection response"));
        }
        if st.state != State::Connecting || st.remote.is_none() {
            return Err(einval("establish needs a connection response"));
        }
        st.state = State::Connected;
        let remote = st.remote.expect("checked");
        drop(st);
        send(self.fabric(), &remote, Msg::Rtu { to: remote.id });
        Ok(())
    }

    /// `rdma_notify(id, IBV_EVENT_COMM_EST)`: the passive side's QP took a message before the
    /// RTU came, so the connection is established now (`Established` is raised; the RTU, when
    /// it comes, changes nothing). `EISCONN` when it is already, `EINVAL` in other states.
    pub fn notify_established(&self) -> Result<()> {
        match self.0.st.lock().state {
            // A UD exchange has no connection to establish (its IB CM id is SIDR's).
            _ if self.datagram() => return Err(einval("nothing to establish")),
            State::Accepting => {}
            State::Connected => {
                return Err(Error::new(Errno(libc::EISCONN), "established already"));
            }
            _ => return Err(einval("nothing to establish")),
        }
        self.ready_to_use();
        Ok(())
    }

    /// Passive side: the requester's id went before the request was answered (its CM's REJ,
    /// reason "timeout", as the kernel's IB CM sends it as it destroys such an id). As on rxe
    /// (measured): no event, the QP as it was, and the request can no longer be answered
    /// (`rdma_accept` is `EINVAL`, the kernel's IB CM id having gone idle); the id is left to
    /// destroy, a disconnection of it having nothing to end.
    fn requester_gone(&self) {
        let mut st = self.0.st.lock();
        if st.state == State::Request {
            st.state = State::Rejected;
        }
    }

    /// Passive side: the RTU came.
    fn ready_to_use(&self) {
        let mut st = self.0.st.lock();
        if st.state != State::Accepting {
            return;
        }
        st.state = State::Connected;
        drop(st);
        self.raise(CmEventType::Established, 0, ConnParam::default(), None);
    }

    /// Active side: the request was refused (`reason`: the IB CM reject reason). A UD
    /// request (SIDR) is answered by a SIDR REP with a status instead, which the kernel's CM
    /// reports as `Unreachable`: [`SIDR_UNSUPPORTED`] when nobody listens, [`SIDR_REJECT`]
    /// when the listener's application refused (as measured on rxe).
    ///
    /// Passive side: the reply it accepted with was refused (the requester's id, without a QP
    /// of its own, rejected it or went): `Rejected`, its QP to the error state (measured on
    /// rxe), the id as a refused one.
    fn rejected(&self, reason: i32, private_data: &[u8]) {
        let mut st = self.0.st.lock();
        if !matches!(st.state, State::Connecting | State::Accepting) {
            return;
        }
        st.state = State::Refused;
        // librdmacm moves the QP of a rejected connection to the error state as it reads the
        // event (here as the event is raised, as the other QP moves of the CM are made).
        let qp = st.qp.clone().filter(|_| !self.datagram());
        drop(st);
        if let Some(qp) = qp {
            to_error(&qp);
        }
        if self.datagram() {
            let status =
                if reason == REJ_INVALID_SERVICE_ID { SIDR_UNSUPPORTED } else { SIDR_REJECT };
            let param = ConnParam {
                private_data: padded(private_data, SIDR_REP_PRIVATE_DATA),
                ..Default::default()
            };
            return self.raise(CmEventType::Unreachable, status, param, None);
        }
        let param = ConnParam {
            private_data: padded(private_data, REJ_PRIVATE_DATA),
            ..Default::default()
        };
        self.raise(CmEventType::Rejected, reason, param, None);
    }

    /// The peer disconnected (its DREQ came, or its process is gone: `answer` is whether a
    /// DREP is owed). Our QP is left as it is, as the kernel's CM leaves it: the application's
    /// own `rdma_disconnect` moves it to the error state (its receives complete normally until
    /// then, whatever the peer sent before its DREQ included). `Disconnected` waits for the
    /// application to read what the QP's CQs hold now (see [`Held`]), but in simulation,
    /// whose clock moves only as the program waits on the emulator.
    fn disconnected_by_peer(&self, answer: bool) {
        let mut st = self.0.st.lock();
        let crossed = st.state == State::DreqSent;
        if !matches!(st.state, State::Connected | State::Accepting) && !crossed {
            return;
        }
        st.state = if answer { State::DreqRcvd } else { State::Disconnected };
        let timer = &self.fabric().timer;
        st.held =
            st.qp.as_ref().filter(|_| !timer.simulated()).and_then(|qp| Held::of(qp, timer.now()));
        let held = st.held.is_some();
        drop(st);
        if held {
            let channel = self.0.channel.lock().clone();
            channel.held.lock().push(Arc::downgrade(&self.0));
            self.watch_held();
        } else {
            self.raise(CmEventType::Disconnected, 0, ConnParam::default(), None);
        }
        if !answer {
            self.enter_timewait();
        }
    }

    /// Raises the held `Disconnected` if its hold is over (not for an id destroyed since):
    /// whether nothing is held any more.
    fn release_held(&self, now: u64) -> bool {
        let mut st = self.0.st.lock();
        let Some(held) = &st.held else { return true };
        let destroyed = st.state == State::Destroyed;
        let waited = self.0.channel.lock().waiters.load(Ordering::Acquire) != 0;
        if !destroyed && !held.over(now, waited) {
            return false;
        }
        st.held = None;
        // Raised under the id's lock: a reader of the channel that finds the hold gone (the
        // fabric's timer released it meanwhile) then finds the event queued, not on its way.
        if !destroyed {
            self.raise(CmEventType::Disconnected, 0, ConnParam::default(), None);
        }
        drop(st);
        true
    }

    /// Has the fabric's timer look now and then whether the held event may go.
    fn watch_held(&self) {
        let now = self.fabric().now();
        let late = self.0.st.lock().held.as_ref().is_some_and(|h| now >= h.soon);
        self.at(now + if late { HOLD_LATE_LOOK_NS } else { HOLD_LOOK_NS }, |id, f| {
            if !id.release_held(f.now()) {
                id.watch_held();
            }
        });
    }

    /// The opaque word set by [`CmId::set_user_data`] (0 until set).
    pub fn user_data(&self) -> usize {
        self.0.user_data.load(Ordering::Acquire)
    }

    /// Stores an opaque word with the id (for layers that wrap it, such as the C library).
    pub fn set_user_data(&self, v: usize) {
        self.0.user_data.store(v, Ordering::Release);
    }

    /// The channel its events arrive on. (Its events wait only while the application holds a
    /// handle of the channel: see [`CmChannel`].)
    pub fn channel(&self) -> CmChannel {
        CmChannel::handle(&self.0.channel.lock())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class of the connection's GRH.
    pub fn set_tos(&self, tos: u8) {
        self.0.st.lock().options.tos = tos;
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the local ACK timeout its QP gets (the
    /// IB encoding, 4.096 us * 2^timeout; at most 31).
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        if timeout > 31 {
            return Err(einval("an ACK timeout is at most 31"));
        }
        self.0.st.lock().options.ack_timeout = Some(timeout);
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_REUSEADDR)`: whether ids that all say so may bind the
    /// same port (until one listens). `EINVAL` once the id is bound, as the kernel.
    pub fn set_reuse_addr(&self, on: bool) -> Result<()> {
        let mut st = self.0.st.lock();
        if on && st.state != State::Idle {
            return Err(einval("reuse must be chosen before the bind"));
        }
        st.options.reuse_addr = on;
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_AFONLY)`: whether an IPv6 wildcard bind leaves IPv4
    /// alone. `EINVAL` once the id is bound.
    pub fn set_af_only(&self, on: bool) -> Result<()> {
        let mut st = self.0.st.lock();
        if st.state != State::Idle {
            return Err(einval("the address family must be chosen before the bind"));
        }
        st.options.af_only = on;
        Ok(())
    }

    /// `rdma_migrate_id`: its events go to `channel` from now on, those queued unread on its
    /// old channel with them, in their order (as the kernel's ucma moves them): an event that
    /// came between `rdma_accept` and the move (librpma moves a new connection to a channel
    /// of its own after accepting) is read where the application now looks for it. A
    /// connection request queued for a listener moves with the listener. `EINVAL` for a
    /// channel of another fabric.
    pub fn migrate(&self, channel: &CmChannel) -> Result<()> {
        if !Arc::ptr_eq(&channel.0.fabric, &self.0.fabric) {
            return Err(einval("the channel belongs to another fabric"));
        }
        let mut discarded = Vec::new();
        {
            let mut now = self.0.channel.lock();
            if Arc::ptr_eq(&now, &channel.0) {
                return Ok(());
            }
            let me = |id: &CmId| Arc::ptr_eq(&id.0, &self.0);
            let moving = now.queue.remove_if(|e| e.listen_id.as_ref().map_or(me(&e.id), me));
            for ev in moving {
                discarded.extend(channel.0.post(ev));
            }
            *now = channel.0.clone();
        }
        // A `Disconnected` held back: a read of its new channel lets it go too.
        if self.0.st.lock().held.is_some() {
            channel.0.held.lock().push(Arc::downgrade(&self.0));
        }
        drop(discarded);
        Ok(())
    }

    /// Whether two handles name the same id.
    pub fn same(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Where a request to `dst` in `ps` finds its listener: in this process (our slot), in the
/// process holding the port on the host fabric, or nowhere.
fn listening_slot(fabric: &FabricInner, ps: PortSpace, dst: SocketAddr) -> Option<u8> {
    if listener(fabric, ps, dst, None).is_some() {
        return Some(my_slot(fabric));
    }
    fabric.joined().ok().flatten()?.holder(&port_name(ps, dst.port()))
}

/// The id listening in this fabric for requests to `dst` in `ps`; for the request whose
/// private data are `private`, among datagram listeners sharing the port, the one reserved
/// for that requester before one that answers anybody (`None`: any listener).
fn listener(
    fabric: &FabricInner,
    ps: PortSpace,
    dst: SocketAddr,
    private: Option<&[u8]>,
) -> Option<CmId> {
    let cm = manager(fabric);
    let bound = cm.bound.lock();
    let ids = bound.get(&(ps, dst.port()))?.iter().filter_map(Weak::upgrade).map(CmId);
    // 2: reserved for this requester, 1: answers anybody, none: not for it.
    let rank = |l: &CmId| {
        let st = l.0.st.lock();
        let ip = st.local.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
        let names = |ip| fabric.addrs.port_of(ip);
        if st.state != State::Listen || !(ip.is_unspecified() || names(ip) == names(dst.ip())) {
            return None;
        }
        match (st.answers.as_ref().and_then(|a| a.only.as_deref()), private) {
            (Some(key), Some(p)) => p.starts_with(key).then_some(2),
            _ => Some(1),
        }
    };
    let mut best: Option<(u8, CmId)> = None;
    for l in ids {
        if let Some(r) = rank(&l)
            && best.as_ref().is_none_or(|(b, _)| r > *b)
        {
            best = Some((r, l));
        }
    }
    best.map(|(_, l)| l)
}

/// How many of `listener`'s requests are neither accepted nor rejected yet: its backlog's
/// count (as many as are waiting, not as many as the process has ids).
fn unanswered(listener: &CmId) -> usize {
    // Each id is looked at outside the listener's lock, and what is kept is added back (a
    // request that came meanwhile was added to an empty list).
    let asked = std::mem::take(&mut listener.0.st.lock().requests);
    let asking: Vec<_> = asked
        .into_iter()
        .filter(|w| w.upgrade().is_some_and(|c| c.st.lock().state == State::Request))
        .collect();
    let n = asking.len();
    listener.0.st.lock().requests.extend(asking);
    n
}

/// Hands a connection request to the listener of its destination here, or rejects it.
fn request(
    fabric: &FabricInner,
    ps: PortSpace,
    src: SocketAddr,
    dst: SocketAddr,
    from: Remote,
    private: Vec<u8>,
) {
    let reject = |reason| {
        let msg = Msg::Rej { to: from.id, reason, private: Vec::new() };
        send(fabric, &from, msg);
    };
    let Some(listener) = listener(fabric, ps, dst, Some(&private)) else {
        return reject(REJ_INVALID_SERVICE_ID);
    };
    let answers = listener.0.st.lock().answers.as_ref().map(|a| a.qp_num);
    // (A listener that answers every request itself has none waiting.)
    if answers.is_none() && unanswered(&listener) >= listener.0.st.lock().backlog {
        return reject(REJ_CONSUMER_DEFINED);
    }
    let conn = CmId::create_on(&listener.0.channel.lock(), listener.0.ps);
    let mut from = from;
    if let Some(w) = &mut from.wire {
        // What this id sends from now on comes from it.
        w.mine = conn.0.num;
    }
    let dest = fabric.addrs.port_of(dst.ip());
    let ctx = dest.and_then(|(dev, _)| conn.open_device(dev).ok());
    // Its death must end the connection here.
    let incarnation = watched(fabric, from.slot);
    {
        let mut st = conn.0.st.lock();
        (st.state, st.local, st.peer) = (State::Request, Some(dst), Some(src));
        (st.port, st.ctx, st.remote) = (dest, ctx, Some(from));
        st.listener = Some(Arc::downgrade(&listener.0));
        st.remote_ece = Ece { vendor_id: from.ece_vendor, options: from.ece_options, comp_mask: 0 };
        st.remote_incarnation = incarnation;
    }
    if let Some(w) = from.wire {
        manager(fabric).took_wire_request((from.id, w.peer), &conn);
    }
    if let Some(qp_num) = answers {
        // Answered here, in whichever thread brought the request: the listener's owner may
        // not call in for a while (a datagram rsocket's first datagram waits on this).
        let _ = conn.accept(&ConnParam { qp_num, ..Default::default() });
        let _ = conn.destroy();
        return;
    }
    listener.0.st.lock().requests.push(Arc::downgrade(&conn.0));
    if ps == PortSpace::Udp {
        // A SIDR REQ names neither the requester's QP nor its address (the reply goes back
        // to the port it came from): the event's `param.ud` has nothing but the private data,
        // as the kernel's CM fills it.
        let private_data = padded(&private, SIDR_REQ_PRIVATE_DATA);
        let param = ConnParam { private_data, ..Default::default() };
        let ud = UdParam { ah_attr: AhAttr::default(), qp_num: 0, qkey: 0 };
        return conn.raise_ud(CmEventType::ConnectRequest, 0, param, Some(listener), Some(ud));
    }
    let param = ConnParam {
        private_data: padded(&private, REQ_PRIVATE_DATA),
        responder_resources: from.initiator_depth,
        initiator_depth: from.responder_resources,
        retry_count: from.retry_count,
        rnr_retry_count: from.rnr_retry_count,
        flow_control: from.flow_control,
        qp_num: from.qpn,
        ..Default::default()
    };
    conn.raise(CmEventType::ConnectRequest, 0, param, Some(listener));
}

/// The ends of a connection: our device and port, the other's, and the IP address each end
/// goes by.
#[derive(Debug, Clone, Copy)]
struct Path {
    dev: u32,
    port: u8,
    ip: Option<IpAddr>,
    rdev: u32,
    rport: u8,
    rip: Option<IpAddr>,
    /// The other end is beyond a wire port: `rdev` and `rport` name none of ours, `rip` is
    /// the address its messages came from.
    wire: bool,
}

impl Path {
    /// The path of an id whose peer is `remote`, from the id's state.
    fn of(st: &IdState, remote: &Remote) -> Option<Path> {
        let ip = st.local.map(|a| a.ip());
        let rip = remote.wire.map(|w| w.peer).or(st.peer.map(|a| a.ip()));
        let (rdev, rport, wire) = (remote.device, remote.port, remote.wire.is_some());
        let (dev, port) = st.port?;
        Some(Path { dev, port, ip, rdev, rport, rip, wire })
    }
}

/// The address vector along `path` (a GRH on RoCE). On RoCE, as with the kernel's CM, the
/// GIDs are those of the two ends' IP addresses (found in their ports' GID tables), the
/// link-local GID 0 where an address has none.
fn ah_toward(fabric: &FabricInner, path: Path) -> Option<AhAttr> {
    let index_of = |gids: &[crate::profile::GidEntry], ip: Option<IpAddr>| {
        let gid = ip.map(Gid::of_ip);
        gids.iter().find(|e| Some(e.gid) == gid).map_or(0, |e| e.index)
    };
    // Beyond a wire port the other end's GID is its address (a wire port is on RoCE).
    let (roce, dgid, dlid) = if path.wire {
        (true, Gid::of_ip(path.rip?), 0)
    } else {
        let remote = fabric.devices.get(path.rdev as usize)?.port(path.rport).ok()?;
        let attr = remote.attr.lock().clone();
        let dgid = remote.gids.get(index_of(&remote.gids, path.rip) as usize).map(|e| e.gid);
        (attr.link_layer == LinkLayer::ETHERNET, dgid.unwrap_or_default(), attr.lid)
    };
    let local = fabric.devices.get(path.dev as usize)?.port(path.port).ok()?;
    let sgid_index = if roce { index_of(&local.gids, path.ip) as u8 } else { 0 };
    Some(AhAttr {
        is_global: roce,
        dgid,
        sgid_index,
        hop_limit: 64,
        dlid,
        port_num: path.port,
        ..Default::default()
    })
}

/// What a side's QP is set up with when the connection is made.
struct QpSetup {
    path: Path,
    options: Options,
    remote: Remote,
    psn: u32,
    max_dest_rd_atomic: u8,
    max_rd_atomic: u8,
    retry_count: u8,
    rnr_retry_count: u8,
}

impl QpSetup {
    /// The passive side's, accepting `remote`'s request with `p`.
    fn passive(st: &IdState, remote: Remote, p: &ConnParam) -> QpSetup {
        QpSetup {
            path: Path::of(st, &remote).expect("the port is set"),
            options: st.options,
            remote,
            psn: st.psn,
            max_dest_rd_atomic: p.responder_resources,
            max_rd_atomic: p.initiator_depth,
            retry_count: remote.retry_count,
            // The RNR retries the other side asked for (the REQ's), as the kernel's CM sets
            // them (measured on rxe).
            rnr_retry_count: remote.rnr_retry_count,
        }
    }

    /// The active side's, once `remote` replied: the read depths the reply gives (the
    /// other side's initiator depth is what this side must answer, and its responder
    /// resources what this side may ask), and the RNR retries it asks for; the retries this
    /// side asked for. So the kernel's CM sets them (measured on rxe).
    fn active(st: &IdState, remote: Remote) -> QpSetup {
        QpSetup {
            path: Path::of(st, &remote).expect("the port is set"),
            options: st.options,
            remote,
            psn: st.psn,
            max_dest_rd_atomic: remote.initiator_depth,
            max_rd_atomic: remote.responder_resources,
            retry_count: st.mine.retry_count,
            rnr_retry_count: remote.rnr_retry_count,
        }
    }

    /// The access the connection gives the QP (at INIT, before RTR): remote writes, and
    /// remote reads and atomics if the other side may send any (its initiator depth is not
    /// 0), as the kernel's CM gives it (no local write: that is the MRs').
    fn access(&self) -> AccessFlags {
        remote_access(self.remote.initiator_depth)
    }

    /// The first PSN this side sends, and the first it takes. Between our CMs a message names
    /// the first PSN its sender sends; the IB CM's (beyond a wire port) the first its sender
    /// takes: as the kernel's CM reads them, each side sends from what the other's names.
    fn psns(&self) -> (u32, u32) {
        match self.remote.wire {
            Some(_) => (self.remote.psn, self.psn),
            None => (self.psn, self.remote.psn),
        }
    }

    /// INIT again with the connection's access, RTR toward the remote QP, then RTS, as
    /// librdmacm does with the kernel's attributes.
    fn rtr_rts(&self, fabric: &FabricInner, qp: &Qp) -> Result<()> {
        let ty = qp.qp_type();
        if ty != QpType::XRC_SEND {
            let (init, mask) = init_attr(self.path.port, false, self.access());
            qp.modify(&init, mask)?;
        }
        let (rtr, mask) = self.rtr(fabric, &qp.0.ctx.device, ty)?;
        qp.modify(&rtr, mask)?;
        let (rts, mask) = self.rts(ty);
        qp.modify(&rts, mask)
    }

    /// The RTR attributes (and their mask, the kernel CM's for a QP of type `ty`: a
    /// receiving reliable QP, RC or XRC target, takes the read depth and RNR timer too) of a
    /// QP on `device`.
    fn rtr(&self, fabric: &FabricInner, device: &DeviceInner, ty: QpType) -> Result<(QpAttr, M)> {
        let local = device.port(self.path.port)?.attr.lock().clone();
        let theirs = match &self.remote.wire {
            Some(w) => w.mtu,
            None => {
                let rdev = fabric
                    .devices
                    .get(self.remote.device as usize)
                    .ok_or_else(|| einval("no such device"))?;
                rdev.port(self.remote.port)?.attr.lock().active_mtu
            }
        };
        let mtu = Mtu(local.active_mtu.0.min(theirs.0));
        let mut ah_attr = ah_toward(fabric, self.path).ok_or_else(|| einval("no such port"))?;
        ah_attr.traffic_class = self.options.tos;
        let rtr = QpAttr {
            qp_state: QpState::RTR,
            path_mtu: mtu,
            dest_qp_num: self.remote.qpn,
            rq_psn: self.psns().1,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: 0,
            ah_attr,
            ..Default::default()
        };
        let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        let receives_reliably = matches!(ty, QpType::RC | QpType::XRC_RECV);
        Ok((
            rtr,
            if receives_reliably { mask | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER } else { mask },
        ))
    }

    /// The RTS attributes and their mask, the kernel CM's for a QP of type `ty`: a sending
    /// reliable QP (RC, XRC initiator) takes its retries and read depth, it and an XRC target
    /// the ACK timeout.
    fn rts(&self, ty: QpType) -> (QpAttr, M) {
        let rts = QpAttr {
            qp_state: QpState::RTS,
            sq_psn: self.psns().0,
            timeout: self.options.ack_timeout.unwrap_or(ACK_TIMEOUT),
            retry_cnt: self.retry_count.min(7),
            rnr_retry: self.rnr_retry_count.min(7),
            max_rd_atomic: self.max_rd_atomic,
            ..Default::default()
        };
        let mask = M::STATE | M::SQ_PSN;
        let mask = match ty {
            QpType::RC | QpType::XRC_SEND => {
                mask | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
            }
            QpType::XRC_RECV => mask | M::TIMEOUT,
            _ => mask,
        };
        (rts, mask)
    }
}

/// The QPN datagrams to a multicast group go to.
pub const MULTICAST_QPN: u32 = crate::engine::requester::MULTICAST_QPN;
/// The LID of the multicast groups on an InfiniBand port (the first multicast LID).
const MULTICAST_LID: u16 = 0xc000;

/// The multicast GID of the group at `ip`, as the kernel's CM makes it: an IPv6 group's own
/// address; an IPv4 group's IPv4-mapped address on RoCE (v2), `ff0e::ffff:a.b.c.d` on
/// InfiniBand.
fn multicast_gid(ip: IpAddr, roce: bool) -> Gid {
    match ip {
        IpAddr::V6(v6) => Gid(v6.octets()),
        IpAddr::V4(v4) => {
            let mut g = v4.to_ipv6_mapped().octets();
            if !roce {
                (g[0], g[1]) = (0xff, 0x0e);
            }
            Gid(g)
        }
    }
}

/// INIT on `port`: a connected QP with `access`, a datagram QP (`ud`) with the CM's Q_Key.
fn init_attr(port: u8, ud: bool, access: AccessFlags) -> (QpAttr, M) {
    let base = QpAttr { qp_state: QpState::INIT, port_num: port, ..Default::default() };
    let mask = M::STATE | M::PKEY_INDEX | M::PORT;
    if ud {
        return (QpAttr { qkey: UDP_QKEY, ..base }, mask | M::QKEY);
    }
    (QpAttr { qp_access_flags: access, ..base }, mask | M::ACCESS_FLAGS)
}

/// The remote access the kernel's CM gives a connected QP whose other side sends reads and
/// atomics `initiator_depth` deep: writes always, reads and atomics unless it sends none.
fn remote_access(initiator_depth: u8) -> AccessFlags {
    match initiator_depth {
        0 => AccessFlags::REMOTE_WRITE,
        _ => AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
    }
}

/// A connected QP's local ACK timeout unless `RDMA_OPTION_ID_ACK_TIMEOUT` sets one: the
/// path's packet lifetime (18, the kernel's for RoCE) plus one, as the kernel's CM sets it
/// (measured on rxe).
const ACK_TIMEOUT: u8 = PACKET_LIFE_TIME + 1;

/// A datagram QP's RTR: nothing but the state.
fn ud_rtr() -> (QpAttr, M) {
    (QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE)
}

/// A datagram QP's RTS, sending from `psn`.
fn ud_rts(psn: u32) -> (QpAttr, M) {
    (QpAttr { qp_state: QpState::RTS, sq_psn: psn, ..Default::default() }, M::STATE | M::SQ_PSN)
}

/// Active side: the ECE the REP says the other side took (vendor 0: it has none, so this
/// side takes none either; another vendor's is a broken handshake, `EINVAL`).
fn take_ece(st: &mut IdState, qp: &Qp, taken: Ece) -> Result<()> {
    let want = match taken.vendor_id {
        0 => no_options(st.local_ece),
        v if v != st.local_ece.vendor_id => return Err(einval("ECE reply of another vendor")),
        _ => taken,
    };
    st.remote_ece.vendor_id = taken.vendor_id;
    ece_or_none(qp.set_ece(&want).map(|()| want)).map(drop)
}

/// The ECE `r` gives, none where the device has no ECE (`EOPNOTSUPP`), as librdmacm takes it.
fn ece_or_none(r: Result<Ece>) -> Result<Ece> {
    match r {
        Err(e) if e.errno() == Errno::EOPNOTSUPP => Ok(Ece::default()),
        r => r,
    }
}

/// `ece`'s vendor with no options: what a side asks for when the other has none to agree on.
fn no_options(ece: Ece) -> Ece {
    Ece { options: 0, ..ece }
}

/// Moves `qp` to the error state (a QP already destroyed or in RESET is left alone).
fn to_error(qp: &Qp) {
    let _ = qp.modify(&QpAttr { qp_state: QpState::ERR, ..Default::default() }, M::STATE);
}

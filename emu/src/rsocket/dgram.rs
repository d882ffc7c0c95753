//! Datagram rsockets (`SOCK_DGRAM`): one UD QP per socket, bound to an address and port the
//! connection manager holds in `RDMA_PS_UDP`. A destination's QP is found once by a SIDR
//! exchange (the CM's UD "connection": the bound socket answers every request with its QP)
//! and kept; each datagram carries its sender's address in front, so that a reply can go back
//! and `rrecvfrom` can name it.

use std::{
    collections::{HashMap, VecDeque},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, RawFd},
};

use super::Options;
use crate::{
    Fabric,
    cm::{CmChannel, CmEvent, CmEventType, CmId, ConnParam, PortSpace, UDP_QKEY},
    error::{Errno, Error, Result},
    objects::recv_queue::RecvWr,
    objects::{ah::Ah, channel::CompChannel, cq::Cq, mr::Mr, pd::Pd},
    qp::{Qp, QpAttr, QpCap, QpInitAttr, SendWr},
    types::{AccessFlags, QpAttrMask as M, QpState, QpType, Sge, Wc, WcStatus},
};

/// What each receive and send of librdmacm's datagram sockets takes of their buffers (its
/// `RS_SNDLOWAT`): their queues are the buffers' sizes over this, at most `SO_RCVBUF`'s and
/// `SO_SNDBUF`'s (twice what was set) and the `RDMA_RQSIZE` and `RDMA_SQSIZE` options.
const BUFFER_PER_ENTRY: usize = 2048;
/// The most a queue may hold (librdmacm's `RS_QP_MAX_SIZE`).
const MAX_ENTRIES: usize = 0xfffe;
/// The GRH in front of every UD receive.
const GRH: usize = 40;
/// The sender's address in front of every datagram: family (4 or 6), port, 16 address bytes.
const HEADER: usize = 20;

/// Where a destination's datagrams go.
#[derive(Debug)]
struct Dest {
    ah: Ah,
    qpn: u32,
    qkey: u32,
}

/// A bound datagram socket's verbs objects.
#[derive(Debug)]
struct Ud {
    pd: Pd,
    cq: Cq,
    comp: CompChannel,
    qp: Qp,
    /// `recvs` receive slots, then the send slots, each `slot` bytes.
    buf: Mr,
    recvs: usize,
    slot: usize,
    /// Largest datagram payload (the port's MTU less our header).
    max: usize,
    free_sends: Vec<usize>,
}

/// The state of a datagram socket.
#[derive(Debug)]
pub(super) struct Dgram {
    pub(super) v6: bool,
    id: CmId,
    ud: Option<Ud>,
    dests: HashMap<SocketAddr, Dest>,
    /// Destinations being looked up: the CM id asking, and whether it failed.
    lookups: Vec<(SocketAddr, CmId)>,
    unreachable: Vec<SocketAddr>,
    /// `rconnect`: where `rsend` goes and the only source `rrecv` takes.
    pub(super) peer: Option<SocketAddr>,
    inbox: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Datagrams that came for another socket on the port (this one is connected elsewhere):
    /// sent on to it, as the kernel would have delivered them, once it is known.
    forwards: VecDeque<(SocketAddr, Vec<u8>)>,
    pub(super) closed: bool,
    /// How many receives are kept posted, and sends may be in flight, once bound.
    queues: Queues,
}

/// The sizes of a datagram socket's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Queues {
    pub(super) recvs: usize,
    pub(super) sends: usize,
}

impl Queues {
    /// As librdmacm sizes them from a socket's options: 64 each by default (128 KiB buffers),
    /// 384 (the queue options' default) with buffers of 768 KiB or more.
    pub(super) fn of(o: &Options) -> Queues {
        let size = |buffer: usize, entries: u32| {
            (entries as usize).min(MAX_ENTRIES).min(buffer / BUFFER_PER_ENTRY).max(1)
        };
        Queues { recvs: size(o.recv_buffer, o.rq_size), sends: size(o.send_buffer, o.sq_size) }
    }
}

fn err(errno: i32, why: &'static str) -> Error {
    Error::new(Errno(errno), why)
}

fn encode_addr(a: SocketAddr) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[2..4].copy_from_slice(&a.port().to_be_bytes());
    match a.ip() {
        IpAddr::V4(v4) => {
            h[0] = 4;
            h[4..8].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            h[0] = 6;
            h[4..20].copy_from_slice(&v6.octets());
        }
    }
    h
}

fn decode_addr(h: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_be_bytes([*h.get(2)?, *h.get(3)?]);
    let ip = match h[0] {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(h.get(4..8)?).ok()?)),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(h.get(4..20)?).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

impl Dgram {
    pub(super) fn new(channel: &CmChannel, v6: bool, queues: Queues) -> Result<Dgram> {
        let id = CmId::create(channel, PortSpace::Udp)?;
        Ok(Dgram {
            v6,
            id,
            ud: None,
            dests: HashMap::new(),
            lookups: Vec::new(),
            unreachable: Vec::new(),
            peer: None,
            forwards: VecDeque::new(),
            inbox: VecDeque::new(),
            closed: false,
            queues,
        })
    }

    /// Sizes the queues the socket will have (unless bound already: then it has them).
    pub(super) fn set_queues(&mut self, queues: Queues) {
        if self.ud.is_none() {
            self.queues = queues;
        }
    }

    /// `rbind`: the address is the CM's, the QP made on its port (a wildcard's: the first
    /// device's, where loopback is), requests answered.
    pub(super) fn bind(&mut self, fabric: &Fabric, addr: SocketAddr) -> Result<()> {
        if self.ud.is_some() {
            return Err(err(libc::EINVAL, "the socket is bound already"));
        }
        self.id.bind_addr(addr)?;
        self.id.listen(0)?;
        let ud = self.make_ud(fabric)?;
        self.id.answer_lookups(ud.qp.qp_num())?;
        self.ud = Some(ud);
        self.id.answer_lookups_from(self.peer.map(|p| encode_addr(p).to_vec()));
        Ok(())
    }

    /// `rconnect`: `peer` the default destination and the only source; lookups from other
    /// sockets are left to another socket on the port, as a connected UDP socket leaves
    /// their datagrams.
    pub(super) fn connect(&mut self, peer: SocketAddr) {
        self.peer = Some(peer);
        self.id.answer_lookups_from(Some(encode_addr(peer).to_vec()));
        // What others sent meanwhile goes on to the socket on the port that takes it now.
        let (mine, others) = self.inbox.drain(..).partition(|(from, _)| *from == peer);
        self.inbox = mine;
        self.forwards.extend(others);
    }

    /// Binds to the wildcard address, on a port picked for it, unless bound.
    fn autobind(&mut self, fabric: &Fabric) -> Result<()> {
        if self.ud.is_some() {
            return Ok(());
        }
        let any =
            if self.v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { Ipv4Addr::UNSPECIFIED.into() };
        self.bind(fabric, SocketAddr::new(any, 0))
    }

    fn make_ud(&self, fabric: &Fabric) -> Result<Ud> {
        let (ctx, port) = match self.id.context() {
            Some(c) => (c, self.id.port_num()),
            None => {
                let dev = fabric.devices().into_iter().next();
                (dev.ok_or(err(libc::ENODEV, "no device"))?.open()?, 1)
            }
        };
        let mtu = 128usize << ctx.query_port(port)?.active_mtu.0.clamp(1, 5);
        let pd = ctx.alloc_pd()?;
        let comp = ctx.create_comp_channel()?;
        comp.set_nonblocking(true)?;
        let Queues { recvs, sends } = self.queues;
        let cq = ctx.create_cq((recvs + sends) as i32, Some(&comp), 0)?;
        let cap = QpCap {
            max_send_wr: sends as u32,
            max_recv_wr: recvs as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr { sq_sig_all: true, ..QpInitAttr::new(QpType::UD, &cq, cap) };
        let qp = pd.create_qp(&init)?;
        // Ready at once, with the CM's Q_Key, as the CM makes datagram QPs.
        let init = QpAttr {
            qp_state: QpState::INIT,
            port_num: port,
            qkey: UDP_QKEY,
            ..Default::default()
        };
        qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
        qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE)?;
        qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE | M::SQ_PSN)?;
        let slot = GRH + mtu;
        let buf = pd.reg_mr(slot * (recvs + sends), AccessFlags::LOCAL_WRITE)?;
        let free_sends = (0..sends).collect();
        let ud = Ud { pd, cq, comp, qp, buf, recvs, slot, max: mtu - HEADER, free_sends };
        for i in 0..recvs {
            ud.post_recv(i)?;
        }
        Ok(ud)
    }

    /// The CM id holding the socket's port.
    pub(super) fn id(&self) -> &CmId {
        &self.id
    }

    /// Whether the socket has its address and QP (an `rbind`, or the first send's own).
    pub(super) fn bound(&self) -> bool {
        self.ud.is_some()
    }

    /// The socket's address (none before a bind).
    pub(super) fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Takes the CM events (lookups answered, requests to answer) and the completions;
    /// whether there were any.
    pub(super) fn progress(&mut self, channel: &CmChannel) -> bool {
        let mut any = false;
        while let Some(ev) = channel.queued_event() {
            self.on_event(ev);
            any = true;
        }
        let Some(ud) = &mut self.ud else { return any };
        let mut wcs = [Wc::default(); 16];
        loop {
            let n = ud.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                match ud.completion(wc) {
                    // Not from the peer: a sender that looked this socket up before it
                    // connected (the answer is kept), whose datagram another socket on the
                    // port takes now. At most a queue's worth wait (the oldest dropped, as UDP
                    // drops what overflows).
                    Some(d) if self.peer.is_some_and(|p| p != d.0) => {
                        while self.forwards.len() >= ud.recvs {
                            self.forwards.pop_front();
                        }
                        self.forwards.push_back(d);
                    }
                    Some(d) => self.inbox.push_back(d),
                    None => {}
                }
            }
            any |= n > 0;
            if n < wcs.len() {
                break;
            }
        }
        self.send_forwards(channel);
        any
    }

    /// Sends on what [`Dgram::progress`] kept for another socket on the port, through its
    /// lookup (from this socket's own address, which a socket connected elsewhere does not
    /// answer), the original sender's address in front; what nobody takes is dropped.
    fn send_forwards(&mut self, channel: &CmChannel) {
        // (Every call's progress comes here: nothing kept, nothing to look at.)
        if self.forwards.is_empty() {
            return;
        }
        let Some(me) = self.local_addr() else { return };
        // Where this socket is reached from itself (a wildcard's: loopback).
        let here = source_for(me, me);
        while let Some((from, data)) = self.forwards.pop_front() {
            if let Ok(None) = self.send_as(channel, &data, here, from) {
                // (Its lookup, or a free send slot, is awaited.)
                self.forwards.push_front((from, data));
                return;
            }
        }
    }

    fn on_event(&mut self, ev: CmEvent) {
        use CmEventType as E;
        if ev.event == E::ConnectRequest {
            // Someone looks us up: our QP.
            let qpn = self.ud.as_ref().map_or(0, |u| u.qp.qp_num());
            let p = ConnParam { qp_num: qpn, ..Default::default() };
            if qpn == 0 || ev.id.accept(&p).is_err() {
                let _ = ev.id.reject(&[]);
            }
            let _ = ev.id.destroy();
            return;
        }
        let Some(i) = self.lookups.iter().position(|(_, id)| id.same(&ev.id)) else { return };
        let qpn = self.ud.as_ref().map_or(0, |u| u.qp.qp_num());
        // The lookup names the socket it is for, as its datagrams do: a socket connected to
        // this one answers it before any other on the port.
        let me = self.local_addr().map(|a| source_for(a, self.lookups[i].0));
        let private_data = me.map(|a| encode_addr(a).to_vec()).unwrap_or_default();
        let p = ConnParam { qp_num: qpn, private_data, ..Default::default() };
        match ev.event {
            E::AddrResolved if self.lookups[i].1.resolve_route(2000).is_ok() => return,
            E::RouteResolved if self.lookups[i].1.connect(&p).is_ok() => return,
            E::Established => {
                if let (Some(ud), Some(u)) = (&self.ud, ev.ud)
                    && let Ok(ah) = ud.pd.create_ah(&u.ah_attr)
                {
                    let (dest, _) = &self.lookups[i];
                    self.dests.insert(*dest, Dest { ah, qpn: u.qp_num, qkey: u.qkey });
                    let (_, id) = self.lookups.swap_remove(i);
                    let _ = id.destroy();
                    return;
                }
            }
            _ => {}
        }
        // Anything else ends the lookup: nobody answers there.
        let (dest, id) = self.lookups.swap_remove(i);
        let _ = id.destroy();
        self.unreachable.push(dest);
    }

    /// Where a send to `dest` stands: `Some(true)` ready, `Some(false)` nobody there, `None`
    /// still being looked up (started if it was not).
    fn lookup(&mut self, channel: &CmChannel, dest: SocketAddr) -> Result<Option<bool>> {
        if self.dests.contains_key(&dest) {
            return Ok(Some(true));
        }
        if let Some(i) = self.unreachable.iter().position(|d| *d == dest) {
            self.unreachable.swap_remove(i);
            return Ok(Some(false));
        }
        if !self.lookups.iter().any(|(d, _)| *d == dest) {
            let id = CmId::create(channel, PortSpace::Udp)?;
            id.resolve_addr(None, dest, 2000)?;
            self.lookups.push((dest, id));
        }
        Ok(None)
    }

    /// Sends one datagram to `dest` if it can now: `Ok(None)` to wait (a lookup, or no free
    /// send slot). A destination nobody answers for takes the datagram and drops it, as UDP.
    pub(super) fn send_to(
        &mut self,
        fabric: &Fabric,
        channel: &CmChannel,
        data: &[u8],
        dest: SocketAddr,
    ) -> Result<Option<usize>> {
        self.autobind(fabric)?;
        let from = source_for(self.id.local_addr().expect("bound"), dest);
        self.send_as(channel, data, dest, from)
    }

    /// [`Dgram::send_to`] of a bound socket, the datagram saying it is from `from`.
    fn send_as(
        &mut self,
        channel: &CmChannel,
        data: &[u8],
        dest: SocketAddr,
        from: SocketAddr,
    ) -> Result<Option<usize>> {
        let max = self.ud.as_ref().expect("bound").max;
        if data.len() > max {
            return Err(err(libc::EMSGSIZE, "larger than a datagram of the port's MTU"));
        }
        match self.lookup(channel, dest)? {
            None => return Ok(None),
            Some(false) => return Ok(Some(data.len())),
            Some(true) => {}
        }
        let d = &self.dests[&dest];
        let ud = self.ud.as_mut().expect("bound");
        let Some(i) = ud.free_sends.pop() else { return Ok(None) };
        let at = (ud.recvs + i) * ud.slot;
        ud.buf.write(at, &encode_addr(from))?;
        ud.buf.write(at + HEADER, data)?;
        let len = (HEADER + data.len()) as u32;
        let sge = [Sge { addr: ud.buf.addr() + at as u64, length: len, lkey: ud.buf.lkey() }];
        let wr = SendWr::send_ud((ud.recvs + i) as u64, &sge, &d.ah, d.qpn, d.qkey);
        if let Err(e) = ud.qp.post_send(&wr) {
            ud.free_sends.push(i);
            return Err(e);
        }
        Ok(Some(data.len()))
    }

    /// The next datagram there is (and its sender), copied into `out` (cut to its length); its
    /// whole length. `None` when none waits.
    pub(super) fn recv_from(&mut self, out: &mut [u8], peek: bool) -> Option<(usize, SocketAddr)> {
        // A connected socket takes datagrams from its peer only.
        while let Some((from, _)) = self.inbox.front() {
            if self.peer.is_none_or(|p| p == *from) {
                break;
            }
            self.inbox.pop_front();
        }
        let (from, data) = self.inbox.front()?;
        let (from, n) = (*from, data.len().min(out.len()));
        out[..n].copy_from_slice(&data[..n]);
        let whole = data.len();
        if !peek {
            self.inbox.pop_front();
        }
        Some((whole, from))
    }

    pub(super) fn readable(&self) -> bool {
        !self.inbox.is_empty()
    }

    pub(super) fn writable(&self) -> bool {
        self.ud.as_ref().is_none_or(|u| !u.free_sends.is_empty())
    }

    /// Arms the completion events; the descriptors a sleep watches besides the CM channel's.
    pub(super) fn arm(&self) -> Option<RawFd> {
        let ud = self.ud.as_ref()?;
        let _ = ud.cq.req_notify(false);
        Some(ud.comp.as_raw_fd())
    }

    /// Whether a completion event came (see `RSocket::woken`).
    pub(super) fn woken(&self) -> bool {
        self.ud.as_ref().is_some_and(|ud| ud.comp.ready())
    }

    pub(super) fn drain(&self) {
        if let Some(ud) = &self.ud {
            while let Some(cq) = ud.comp.queued_cq_event() {
                cq.ack_events(1);
            }
        }
    }

    /// Ends the socket: its lookups, its id, its objects.
    pub(super) fn close(&mut self) {
        self.closed = true;
        for (_, id) in self.lookups.drain(..) {
            let _ = id.destroy();
        }
        self.dests.clear();
        let _ = self.id.destroy();
        if let Some(ud) = self.ud.take() {
            let _ = ud.qp.destroy();
            let _ = ud.buf.dereg();
            while let Some(cq) = ud.comp.queued_cq_event() {
                cq.ack_events(1);
            }
            let _ = ud.cq.destroy();
            let _ = ud.comp.destroy();
            let _ = ud.pd.dealloc();
        }
    }
}

/// The address a datagram from a socket bound to `local` to `dest` says it comes from, as a
/// host's route would pick it: a wildcard, or a loopback address of the other family, answers
/// as loopback's address in the destination's family (the socket's QP is on loopback's port);
/// an IPv4-mapped address as its IPv4 one to an IPv4 destination.
fn source_for(local: SocketAddr, dest: SocketAddr) -> SocketAddr {
    let ip = match (local.ip(), dest.ip()) {
        (IpAddr::V6(v6), IpAddr::V4(_)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None if v6.is_unspecified() || v6.is_loopback() => Ipv4Addr::LOCALHOST.into(),
            None => local.ip(),
        },
        (IpAddr::V4(v4), IpAddr::V6(_)) if v4.is_unspecified() || v4.is_loopback() => {
            Ipv6Addr::LOCALHOST.into()
        }
        (ip, d) if ip.is_unspecified() => {
            if d.is_ipv4() {
                Ipv4Addr::LOCALHOST.into()
            } else {
                Ipv6Addr::LOCALHOST.into()
            }
        }
        (ip, _) => ip,
    };
    SocketAddr::new(ip, local.port())
}

impl Ud {
    fn post_recv(&self, i: usize) -> Result<()> {
        let sge = [Sge {
            addr: self.buf.addr() + (i * self.slot) as u64,
            length: self.slot as u32,
            lkey: self.buf.lkey(),
        }];
        self.qp.post_recv(&RecvWr { wr_id: i as u64, sg_list: &sge })
    }

    /// A completion: a send slot back, or a datagram (its sender and bytes).
    fn completion(&mut self, wc: &Wc) -> Option<(SocketAddr, Vec<u8>)> {
        let i = wc.wr_id as usize;
        if i >= self.recvs {
            self.free_sends.push(i - self.recvs);
            return None;
        }
        let got = (wc.status == WcStatus::SUCCESS).then(|| {
            let len = (wc.byte_len as usize).saturating_sub(GRH).min(self.slot - GRH);
            let mut b = vec![0u8; len];
            self.buf.read(i * self.slot + GRH, &mut b).ok()?;
            let from = decode_addr(b.get(..HEADER)?)?;
            Some((from, b.split_off(HEADER)))
        });
        if wc.status != WcStatus::WR_FLUSH_ERR {
            let _ = self.post_recv(i);
        }
        got.flatten()
    }
}

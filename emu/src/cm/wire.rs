//! The connection manager beyond a wire port: its messages travel as the IB CM's MADs
//! (module `mad`) to and from QP1 of the other end, so that an id connects to the kernel's
//! rdma_cm (rxe's, a RoCE NIC's) and to the emulator on another host (docs/wire.md).
//!
//! An address that no emulated port has, of the family of a wire port, resolves to that
//! port; `connect` sends a REQ (a SIDR REQ for a UD port space) to it. A REQ that comes in
//! is handed to the listener as one from this host is. From then on the other side is a
//! [`Remote`] with a [`WirePeer`], and every message to it goes out as a MAD. What comes in
//! is taken only where it fits: the communication IDs of a connection to the address it
//! came from, in a state that expects it.
//!
//! Not done over the wire: retransmission of our own messages (a lost one is lost: the
//! network between two wire ports is taken to be reliable for the CM), LAP/APR (path
//! migration), ECE.

use std::net::{IpAddr, SocketAddr};

use super::{
    CmId, ConnParam, Msg, PortSpace, REJ_CONSUMER_DEFINED, REJ_INVALID_SERVICE_ID, Remote,
    SIDR_REJECT, SIDR_UNSUPPORTED, State, UDP_QKEY, WirePeer,
    mad::{self, CmMad, Mad},
    request,
};
use crate::{
    error::Result,
    fabric::FabricInner,
    types::{Gid, Mtu},
};

/// The wire port an address beyond the emulated ports is reached through: its device and
/// port, and its address.
pub(super) fn route(fabric: &FabricInner, ip: IpAddr) -> Option<((u32, u8), IpAddr)> {
    fabric.wire.get()?.route(ip)
}

/// Whether `ip` is beyond the emulated ports, reached through a wire port.
pub(super) fn beyond(fabric: &FabricInner, ip: IpAddr) -> bool {
    fabric.addrs.port_of(ip).is_none() && route(fabric, ip).is_some()
}

/// The node GUID of device `dev` (a REQ and a REP name their CA by it).
fn ca_guid(fabric: &FabricInner, dev: u32) -> u64 {
    fabric.devices.get(dev as usize).map_or(0, |d| d.attr.node_guid)
}

/// Whether two addresses are one (an IPv4 address and its IPv4-mapped form are).
fn same(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

fn transmit(fabric: &FabricInner, local: IpAddr, peer: IpAddr, mad: &Mad) {
    transmit_bytes(fabric, local, peer, &mad.encode());
}

fn transmit_bytes(fabric: &FabricInner, local: IpAddr, peer: IpAddr, mad: &[u8]) {
    if let Some(w) = fabric.wire.get() {
        w.send_mad(local, peer, mad);
    }
}

/// The REP of `from`, our side, accepting the request of the other side's id `to`.
fn rep(fabric: &FabricInner, to: u32, from: &Remote, private: &[u8]) -> mad::Rep {
    let mut data = [0; mad::REP_PRIVATE];
    let n = private.len().min(mad::REP_PRIVATE);
    data[..n].copy_from_slice(&private[..n]);
    mad::Rep {
        local_id: comm(from.id),
        remote_id: to,
        qpn: from.qpn,
        psn: from.psn,
        responder_resources: from.responder_resources,
        initiator_depth: from.initiator_depth,
        rnr_retry_count: from.rnr_retry_count.min(7),
        flow_control: from.flow_control != 0,
        srq: false,
        ca_guid: ca_guid(fabric, from.device),
        private: data,
    }
}

/// How long a request waits for its answer before it is sent again (the network may have
/// lost it, or the other side's program was not up yet), and how many times it is sent
/// before `Unreachable` (`ETIMEDOUT`) is raised, as the kernel's CM gives up after its
/// retries (the kernel waits 4.3 s between them, 16 sends in all).
const REQUEST_RETRY_NS: u64 = 500_000_000;
const REQUEST_SENDS: u32 = 16;

/// `rdma_connect` of `id` to `dst` beyond a wire port: the REQ (a SIDR REQ in the UDP port
/// space) for `from`, our side, sent from `src`, and again until it is answered.
pub(super) fn connect(
    id: &CmId,
    (src, dst): (SocketAddr, SocketAddr),
    from: &Remote,
    p: &ConnParam,
    tos: u8,
) -> Result<()> {
    static ATTEMPTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let fabric = id.fabric();
    let service_id = mad::service_id(id.0.ps.code(), dst.port());
    let attempt = ATTEMPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tid = u64::from(from.id) << 32 | u64::from(attempt);
    let msg = if id.0.ps == PortSpace::Udp {
        let mut private = vec![0; mad::SIDR_REQ_PRIVATE];
        mad::put_ip_header(&mut private, src, dst.ip());
        private[mad::IP_HEADER..][..p.private_data.len()].copy_from_slice(&p.private_data);
        CmMad::SidrReq { request_id: comm(from.id), service_id, private }
    } else {
        // An id whose QP is UC asks for UC (the transport service type), as the kernel's.
        let uc = id.0.st.lock().qp.as_ref().is_some_and(|q| q.qp_type() == crate::QpType::UC);
        let mut req = req(fabric, (src, dst), from, p, tos, service_id)?;
        req.transport = u8::from(uc);
        CmMad::Req(Box::new(req))
    };
    id.0.st.lock().wire_tid = tid;
    let mad = Mad { tid, msg }.encode();
    send_request(id, (src.ip(), dst.ip()), mad, 1);
    Ok(())
}

/// Sends request `mad` (send number `sends`) of the id `id`, and sends it again later unless
/// it was answered by then.
fn send_request(id: &CmId, (local, peer): (IpAddr, IpAddr), mad: [u8; mad::MAD_LEN], sends: u32) {
    if let Some(w) = id.fabric().wire.get() {
        w.send_mad(local, peer, &mad);
    }
    let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
    id.at(id.fabric().now() + REQUEST_RETRY_NS, move |id, _| {
        let mut st = id.0.st.lock();
        if st.state != State::Connecting || st.remote.is_some() || st.wire_tid != tid {
            return;
        }
        if sends < REQUEST_SENDS {
            drop(st);
            return send_request(&id, (local, peer), mad, sends + 1);
        }
        st.state = super::State::Refused;
        drop(st);
        id.raise(super::CmEventType::Unreachable, -libc::ETIMEDOUT, ConnParam::default(), None);
    });
}

/// The REQ for `from`, our side, from `src` to `dst`.
fn req(
    fabric: &FabricInner,
    (src, dst): (SocketAddr, SocketAddr),
    from: &Remote,
    p: &ConnParam,
    tos: u8,
    service_id: u64,
) -> Result<mad::Req> {
    let port = super::device_at(fabric, from.device)?.port(from.port)?;
    let mtu = port.attr.lock().active_mtu;
    let mut private = [0; mad::REQ_PRIVATE];
    mad::put_ip_header(&mut private, src, dst.ip());
    private[mad::IP_HEADER..][..p.private_data.len()].copy_from_slice(&p.private_data);
    Ok(mad::Req {
        local_id: comm(from.id),
        service_id,
        ca_guid: ca_guid(fabric, from.device),
        qpn: from.qpn,
        responder_resources: from.responder_resources,
        initiator_depth: from.initiator_depth,
        transport: 0,
        psn: from.psn,
        retry_count: from.retry_count.min(7),
        rnr_retry_count: from.rnr_retry_count.min(7),
        flow_control: from.flow_control != 0,
        mtu: mtu.0 as u8,
        srq: p.srq,
        local_gid: Gid::of_ip(src.ip()),
        remote_gid: Gid::of_ip(dst.ip()),
        traffic_class: tos,
        hop_limit: 64,
        ack_timeout: 14,
        private,
    })
}

/// Sends `m` to `w` (`peer_qpn`: the other side's QP, which a DREQ names) as its MAD.
pub(super) fn send(fabric: &FabricInner, w: &WirePeer, peer_qpn: u32, m: Msg) {
    let sidr = mad::of_service_id(w.service_id).map(|(ps, _)| ps) == Some(PortSpace::Udp.code());
    let msg = match m {
        // Requests go out through `connect`; a request beyond a wire port is not withdrawn
        // (the kernel's REJ for it names the requester by its CA's GUID, not sent here).
        Msg::Req { .. } | Msg::Withdrawn { .. } => return,
        Msg::Rep { to, from, private } if sidr => CmMad::SidrRep {
            request_id: to,
            status: 0,
            qpn: from.qpn,
            service_id: w.service_id,
            qkey: UDP_QKEY,
            private,
        },
        Msg::Rep { to, from, private } => {
            let rep = rep(fabric, to, &from, &private);
            let bytes = Mad { tid: w.tid, msg: CmMad::Rep(Box::new(rep)) }.encode();
            if let Some(id) = super::manager(fabric).id(from.id) {
                id.0.st.lock().wire_rep = Some(Box::new(bytes));
            }
            return transmit_bytes(fabric, w.local, w.peer, &bytes);
        }
        Msg::Rej { to, reason, private } if sidr => CmMad::SidrRep {
            request_id: to,
            status: if reason == REJ_INVALID_SERVICE_ID { SIDR_UNSUPPORTED } else { SIDR_REJECT }
                as u8,
            qpn: 0,
            service_id: w.service_id,
            qkey: 0,
            private,
        },
        Msg::Rej { to, reason, private } => CmMad::Rej {
            local_id: comm(w.mine),
            remote_id: to,
            rejected: mad::REJECTED_REQ,
            reason: reason as u16,
            private,
        },
        Msg::Rtu { to } => CmMad::Rtu { local_id: comm(w.mine), remote_id: to },
        Msg::Dreq { to, from } => {
            CmMad::Dreq { local_id: comm(from), remote_id: to, remote_qpn: peer_qpn }
        }
        Msg::Drep { to } => CmMad::Drep { local_id: comm(w.mine), remote_id: to },
    };
    transmit(fabric, w.local, w.peer, &Mad { tid: w.tid, msg });
}

/// The communication ID our id numbered `num` goes by on the wire (0: none). An id's number
/// is only unique in this process, and the other side tells a request sent again from a new
/// one by its communication ID: so each process's are its own (its numbers under a mask
/// drawn when it starts).
fn comm(num: u32) -> u32 {
    if num == 0 { 0 } else { num ^ salt() }
}

/// The number of our id whose communication ID is `comm`.
fn num_of(comm: u32) -> u32 {
    if comm == 0 { 0 } else { comm ^ salt() }
}

fn salt() -> u32 {
    static SALT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SALT.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let nanos = t.map_or(0, |d| d.subsec_nanos());
        // The top bit set: no id's number (they count from 1) maps to 0.
        (nanos ^ std::process::id().rotate_left(16)) | 0x8000_0000
    })
}

/// Our id whose communication ID is `to` if it is connecting (its request out) to `peer`.
fn connecting_to(fabric: &FabricInner, to: u32, peer: IpAddr) -> Option<CmId> {
    let id = super::manager(fabric).id(num_of(to))?;
    let st = id.0.st.lock();
    let ours = st.state == State::Connecting && st.peer.is_some_and(|a| same(a.ip(), peer));
    drop(st);
    ours.then_some(id)
}

/// Our id whose communication ID is `to` if its other side is id `from` at `peer`.
fn connected_to(fabric: &FabricInner, to: u32, from: u32, peer: IpAddr) -> Option<CmId> {
    let id = super::manager(fabric).id(num_of(to))?;
    let r = id.0.st.lock().remote?;
    let ours = r.id == from && r.wire.is_some_and(|w| same(w.peer, peer));
    ours.then_some(id)
}

/// A MAD that came to QP1 of the wire port at `local` from `peer`.
pub(super) fn arrived(fabric: &FabricInner, local: IpAddr, peer: IpAddr, bytes: &[u8]) {
    let Some(Mad { tid, msg }) = Mad::decode(bytes) else { return };
    let Some((device, port)) = fabric.addrs.port_of(local) else { return };
    let wire = |mine, mtu, service_id| WirePeer { local, peer, mtu, mine, tid, service_id };
    // The other side as a REQ or REP names it; what neither carries is left at our own.
    let remote = |id, qpn, psn, (responder_resources, initiator_depth), wire| Remote {
        slot: 0,
        id,
        qpn,
        psn,
        device,
        port,
        responder_resources,
        initiator_depth,
        retry_count: 7,
        rnr_retry_count: 7,
        flow_control: 0,
        ece_vendor: 0,
        ece_options: 0,
        wire: Some(wire),
    };
    match msg {
        CmMad::Req(r) => {
            let Some((ps, dport)) = mad::of_service_id(r.service_id) else { return };
            let (Some(ps), Some((src, dst))) =
                (PortSpace::from_code(ps), mad::ip_header(&r.private))
            else {
                return;
            };
            let mtu = Mtu(u32::from(r.mtu));
            if let Some(id) = taken(fabric, r.local_id, peer) {
                // Sent again: our REP was lost, or is slow; it goes again while we wait for
                // the RTU (the kernel's CM sends its own again on a timer instead).
                let st = id.0.st.lock();
                if let (State::Accepting, Some(rep), Some(w)) =
                    (st.state, &st.wire_rep, st.remote.and_then(|r| r.wire))
                {
                    transmit_bytes(fabric, w.local, w.peer, &rep[..]);
                }
                return;
            }
            // RC or UC (RD and the reserved type are not for rdma_cm).
            if !(1..=5).contains(&r.mtu) || r.transport > 1 {
                return;
            }
            let rd = (r.responder_resources, r.initiator_depth);
            let from = Remote {
                retry_count: r.retry_count,
                rnr_retry_count: r.rnr_retry_count,
                flow_control: u8::from(r.flow_control),
                ..remote(r.local_id, r.qpn, r.psn, rd, wire(0, mtu, r.service_id))
            };
            let private = r.private[mad::IP_HEADER..].to_vec();
            request(fabric, ps, src, SocketAddr::new(dst, dport), from, private);
        }
        CmMad::SidrReq { request_id, service_id, private } => {
            let Some((ps, dport)) = mad::of_service_id(service_id) else { return };
            let Some((src, dst)) = mad::ip_header(&private) else { return };
            if ps != PortSpace::Udp.code() || taken(fabric, request_id, peer).is_some() {
                return;
            }
            let from = remote(request_id, 0, 0, (0, 0), wire(0, Mtu::MTU_4096, service_id));
            let private = private[mad::IP_HEADER..].to_vec();
            request(fabric, PortSpace::Udp, src, SocketAddr::new(dst, dport), from, private);
        }
        CmMad::Rep(r) => {
            let Some(id) = connecting_to(fabric, r.remote_id, peer) else {
                // The same REP again: our RTU was lost; it goes again, as the kernel's CM
                // answers a REP sent again.
                if let Some(id) = connected_to(fabric, r.remote_id, r.local_id, peer) {
                    let st = id.0.st.lock();
                    if let (State::Connected, Some(remote)) = (st.state, st.remote) {
                        drop(st);
                        super::send(fabric, &remote, Msg::Rtu { to: remote.id });
                    }
                }
                return;
            };
            let rd = (r.responder_resources, r.initiator_depth);
            // A REP names no MTU: the REQ's (ours) holds.
            let w = wire(id.0.num, Mtu::MTU_4096, 0);
            let from = Remote {
                rnr_retry_count: r.rnr_retry_count,
                flow_control: u8::from(r.flow_control),
                ..remote(r.local_id, r.qpn, r.psn, rd, w)
            };
            id.replied(from, &r.private);
        }
        CmMad::SidrRep { request_id, status, qpn, service_id, private, .. } => {
            let Some(id) = connecting_to(fabric, request_id, peer) else { return };
            if status != 0 {
                let reason = if i32::from(status) == SIDR_UNSUPPORTED {
                    REJ_INVALID_SERVICE_ID
                } else {
                    REJ_CONSUMER_DEFINED
                };
                return id.rejected(reason, &private);
            }
            let w = wire(id.0.num, Mtu::MTU_4096, service_id);
            id.replied(remote(request_id, qpn, 0, (0, 0), w), &private);
        }
        CmMad::Rej { local_id, remote_id, reason, private, .. } => {
            // Our request refused (the other side may have no id for it: 0).
            if let Some(id) = connecting_to(fabric, remote_id, peer) {
                id.rejected(i32::from(reason), &private);
            } else if let Some(id) = connected_to(fabric, remote_id, local_id, peer) {
                // Our reply refused, or the other side gave up waiting: it is over.
                id.disconnected_by_peer(false);
            }
        }
        CmMad::Rtu { local_id, remote_id } => {
            connected_to(fabric, remote_id, local_id, peer).inspect(CmId::ready_to_use);
        }
        CmMad::Dreq { local_id, remote_id, .. } => {
            match connected_to(fabric, remote_id, local_id, peer) {
                Some(id) if !matches!(id.0.st.lock().state, State::Disconnected) => {
                    id.disconnected_by_peer(true)
                }
                // A connection that is over here (or was never): answered at once, as the
                // kernel's CM answers, so the other side stops asking.
                _ => {
                    let msg = CmMad::Drep { local_id: remote_id, remote_id: local_id };
                    transmit(fabric, local, peer, &Mad { tid, msg });
                }
            }
        }
        CmMad::Drep { local_id, remote_id } => {
            connected_to(fabric, remote_id, local_id, peer).inspect(CmId::disconnect_replied);
        }
        // The other side needs longer: we wait for as long as it takes anyway.
        CmMad::Mra { .. } => {}
    }
}

/// Our id that took the request of id `id` from `peer` already, if one did (the other side
/// sent it again).
fn taken(fabric: &FabricInner, id: u32, peer: IpAddr) -> Option<CmId> {
    let c = super::manager(fabric).wire_request(id, peer)?;
    let r = c.0.st.lock().remote;
    r.is_some_and(|r| r.id == id && r.wire.is_some_and(|w| same(w.peer, peer))).then_some(c)
}

#[cfg(test)]
mod test {
    use std::{
        net::{IpAddr, SocketAddr, UdpSocket},
        time::{Duration, Instant},
    };

    use super::*;
    use crate::{
        Fabric, FabricConfig, Profile,
        cm::{CmChannel, CmEvent, CmEventType, addr::PortAddress},
    };

    /// A fabric with a wire port at `ours`, an event channel of it (not blocking) and a
    /// socket on port 4791 at `peer`, standing in for the other end's CM.
    fn wired(ours: &str, peer: &str) -> (Fabric, CmChannel, UdpSocket) {
        let wire = vec![PortAddress { ip: ours.parse().unwrap(), device: 0, port: 1 }];
        let cfg = FabricConfig { profile: Profile::Rxe, host: None, wire, ..Default::default() };
        let f = Fabric::try_new(cfg).unwrap();
        let ch = CmChannel::new(&f).unwrap();
        ch.set_nonblocking(true).unwrap();
        let peer = UdpSocket::bind((peer.parse::<IpAddr>().unwrap(), 4791)).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (f, ch, peer)
    }

    /// The next event on `ch` within a second; `None` if none comes.
    fn event(ch: &CmChannel) -> Option<CmEvent> {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if let Ok(e) = ch.get_event() {
                return Some(e);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// The MAD in the next datagram `peer` takes (BTH, DETH, MAD, ICRC).
    fn mad_at(peer: &UdpSocket) -> Mad {
        let mut b = [0u8; 512];
        let (n, _) = peer.recv_from(&mut b).unwrap();
        assert_eq!(n, 12 + 8 + mad::MAD_LEN + 4, "one MAD in a UD SEND");
        assert_eq!(&b[12..16], &crate::fabric::roce::GSI_QKEY.to_be_bytes());
        Mad::decode(&b[20..20 + mad::MAD_LEN]).unwrap()
    }

    /// A REQ to our port 7000 from the peer's CM, its id `local_id`.
    fn req_from(peer: SocketAddr, ours: IpAddr, local_id: u32) -> [u8; mad::MAD_LEN] {
        let mut private = [0; mad::REQ_PRIVATE];
        mad::put_ip_header(&mut private, SocketAddr::new(peer.ip(), 40000), ours);
        private[mad::IP_HEADER..][..5].copy_from_slice(b"hello");
        let req = mad::Req {
            local_id,
            service_id: mad::service_id(PortSpace::Tcp.code(), 7000),
            ca_guid: 0x1234,
            qpn: 0x77,
            responder_resources: 1,
            initiator_depth: 1,
            transport: 0,
            psn: 0x42,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: false,
            mtu: 3,
            srq: false,
            local_gid: Gid::of_ip(peer.ip()),
            remote_gid: Gid::of_ip(ours),
            traffic_class: 0,
            hop_limit: 64,
            ack_timeout: 14,
            private,
        };
        Mad { tid: 9, msg: CmMad::Req(Box::new(req)) }.encode()
    }

    /// A connection request from beyond the wire port reaches the listener, the answers go
    /// back as MADs with the other side's IDs, and what does not fit the connection (another
    /// address, other IDs, garbage, a message for no id) changes nothing; a DREQ for a
    /// connection that is over is answered.
    #[test]
    fn test_the_cm_answers_a_peer_beyond_the_wire_and_ignores_what_does_not_fit() {
        let (f, ch, peer) = wired("127.0.3.1", "127.0.3.2");
        let (ours, peer_at): (IpAddr, _) =
            ("127.0.3.1".parse().unwrap(), peer.local_addr().unwrap());
        let stranger: IpAddr = "127.0.3.3".parse().unwrap();
        let listener = CmId::create(&ch, PortSpace::Tcp).unwrap();
        listener.bind_addr(SocketAddr::new(ours, 7000)).unwrap();
        listener.listen(1).unwrap();
        let take = |from: IpAddr, b: &[u8]| arrived(&f.0, ours, from, b);

        // Garbage, a MAD of another class, a REP and an RTU for no connection: nothing.
        take(peer_at.ip(), &[0xff; 300]);
        let mut other = req_from(peer_at, ours, 5);
        other[1] = 0x01;
        take(peer_at.ip(), &other);
        let rep = Mad { tid: 1, msg: CmMad::Rtu { local_id: 5, remote_id: 1 } }.encode();
        take(peer_at.ip(), &rep);
        assert!(event(&ch).is_none());

        // A request for RD (transport 2) is not rdma_cm's: dropped. One for UC is taken;
        // refused by the application, its REJ goes back.
        let (mut rd, mut uc) = (req_from(peer_at, ours, 4), req_from(peer_at, ours, 3));
        rd[24 + 43] |= 2 << 1;
        uc[24 + 43] |= 1 << 1;
        take(peer_at.ip(), &rd);
        assert!(event(&ch).is_none());
        take(peer_at.ip(), &uc);
        let e = event(&ch).unwrap();
        assert_eq!(e.event, CmEventType::ConnectRequest);
        e.id.reject(b"no").unwrap();
        let Mad { msg: CmMad::Rej { remote_id, reason, private, .. }, .. } = mad_at(&peer) else {
            panic!("no REJ")
        };
        assert_eq!(
            (remote_id, i32::from(reason), &private[..2]),
            (3, REJ_CONSUMER_DEFINED, &b"no"[..])
        );

        // The request, and the same again (sent again by its CM): one ConnectRequest.
        take(peer_at.ip(), &req_from(peer_at, ours, 5));
        take(peer_at.ip(), &req_from(peer_at, ours, 5));
        let e = event(&ch).unwrap();
        assert_eq!(e.event, CmEventType::ConnectRequest);
        assert_eq!((e.param.qp_num, &e.param.private_data[..5]), (0x77, &b"hello"[..]));
        assert_eq!(e.id.peer_addr(), Some("127.0.3.2:40000".parse().unwrap()));
        assert!(event(&ch).is_none(), "the request sent again was taken as one");
        let conn = e.id;
        conn.accept(&ConnParam {
            qp_num: 0x99,
            private_data: b"yes".to_vec(),
            ..Default::default()
        })
        .unwrap();
        let Mad { tid, msg: CmMad::Rep(rep) } = mad_at(&peer) else { panic!("no REP") };
        assert_eq!((tid, rep.remote_id, rep.qpn, &rep.private[..3]), (9, 5, 0x99, &b"yes"[..]));
        let mine = rep.local_id;
        assert_ne!(mine, conn.0.num, "an id goes by its communication ID on the wire");
        // The request again before our RTU came (our REP lost): the same REP again.
        take(peer_at.ip(), &req_from(peer_at, ours, 5));
        let Mad { msg: CmMad::Rep(again), .. } = mad_at(&peer) else { panic!("no REP again") };
        assert_eq!(again, rep);

        // An RTU from another address, or naming another id, is not the peer's.
        take(stranger, &Mad { tid, msg: CmMad::Rtu { local_id: 5, remote_id: mine } }.encode());
        take(peer_at.ip(), &Mad { tid, msg: CmMad::Rtu { local_id: 6, remote_id: mine } }.encode());
        assert!(event(&ch).is_none());
        take(peer_at.ip(), &Mad { tid, msg: CmMad::Rtu { local_id: 5, remote_id: mine } }.encode());
        assert_eq!(event(&ch).unwrap().event, CmEventType::Established);

        // Its DREQ ends the connection; our disconnect answers it.
        let dreq = Mad { tid, msg: CmMad::Dreq { local_id: 5, remote_id: mine, remote_qpn: 0x99 } };
        take(peer_at.ip(), &dreq.encode());
        assert_eq!(event(&ch).unwrap().event, CmEventType::Disconnected);
        conn.disconnect().unwrap();
        let Mad { msg: CmMad::Drep { local_id, remote_id }, .. } = mad_at(&peer) else {
            panic!("no DREP")
        };
        assert_eq!((local_id, remote_id), (mine, 5));
        // The same DREQ again (our DREP lost): answered again, nothing raised.
        take(peer_at.ip(), &dreq.encode());
        let Mad { msg: CmMad::Drep { local_id, remote_id }, .. } = mad_at(&peer) else {
            panic!("no DREP")
        };
        assert_eq!((local_id, remote_id), (mine, 5));
    }

    /// The ids that took requests from beyond the wire are found by the requester's id and
    /// address; those destroyed are forgotten (the index stays as small as what is up), and a
    /// request of a destroyed one sent again is a new request.
    #[test]
    fn test_requests_of_ids_destroyed_are_forgotten() {
        let (f, ch, peer) = wired("127.0.4.1", "127.0.4.2");
        let (ours, peer_at): (IpAddr, _) =
            ("127.0.4.1".parse().unwrap(), peer.local_addr().unwrap());
        let listener = CmId::create(&ch, PortSpace::Tcp).unwrap();
        listener.bind_addr(SocketAddr::new(ours, 7000)).unwrap();
        listener.listen(4).unwrap();
        let request = |local_id| {
            arrived(&f.0, ours, peer_at.ip(), &req_from(peer_at, ours, local_id));
            let e = event(&ch).unwrap();
            assert_eq!(e.event, CmEventType::ConnectRequest);
            e.id
        };
        let kept = request(1);
        for local_id in 2..300 {
            let id = request(local_id);
            assert!(taken(&f.0, local_id, peer_at.ip()).is_some_and(|c| c.0.num == id.0.num));
            id.destroy().unwrap();
        }
        let index = super::super::manager(&f.0).wire_requests.lock().by_requester.len();
        assert!(index <= 64, "{index} requests remembered, one id up");
        assert!(taken(&f.0, 1, peer_at.ip()).is_some_and(|c| c.0.num == kept.0.num));
        assert!(taken(&f.0, 299, peer_at.ip()).is_none());
        let again = request(299);
        assert!(taken(&f.0, 299, peer_at.ip()).is_some_and(|c| c.0.num == again.0.num));
    }

    /// A request beyond the wire port that nobody answers is sent again, then reported
    /// `Unreachable` (`ETIMEDOUT`); one to a port nobody listens on is refused.
    #[test]
    fn test_a_request_is_sent_again_until_answered_and_a_refusal_is_reported() {
        let (f, ch, peer) = wired("127.0.3.11", "127.0.3.12");
        let (ours, peer_at): (IpAddr, _) =
            ("127.0.3.11".parse().unwrap(), peer.local_addr().unwrap());
        // (A refused or unanswered id stays in its connect state: each try takes a new one.)
        let resolved = || {
            let id = CmId::create(&ch, PortSpace::Tcp).unwrap();
            id.resolve_addr(None, SocketAddr::new(peer_at.ip(), 7001), 1000).unwrap();
            assert_eq!(event(&ch).unwrap().event, CmEventType::AddrResolved);
            let from = id.local_addr().map(|a| a.ip());
            assert_eq!(from, Some(ours), "from the wire port's address");
            id.resolve_route(1000).unwrap();
            assert_eq!(event(&ch).unwrap().event, CmEventType::RouteResolved);
            id
        };
        let id = resolved();
        id.connect(&ConnParam { qp_num: 0x55, ..Default::default() }).unwrap();
        let Mad { msg: CmMad::Req(first), .. } = mad_at(&peer) else { panic!("no REQ") };
        assert_eq!(mad::of_service_id(first.service_id), Some((PortSpace::Tcp.code(), 7001)));
        assert_eq!(
            mad::ip_header(&first.private).map(|(s, d)| (s.ip(), d)),
            Some((ours, peer_at.ip()))
        );
        let Mad { msg: CmMad::Req(again), .. } = mad_at(&peer) else { panic!("no REQ again") };
        assert_eq!(again, first);
        // Refused: REJ "invalid service ID" for our request.
        let rej = CmMad::Rej {
            local_id: 0,
            remote_id: first.local_id,
            rejected: mad::REJECTED_REQ,
            reason: REJ_INVALID_SERVICE_ID as u16,
            private: Vec::new(),
        };
        arrived(&f.0, ours, peer_at.ip(), &Mad { tid: 1, msg: rej }.encode());
        let e = event(&ch).unwrap();
        assert_eq!((e.event, e.status), (CmEventType::Rejected, REJ_INVALID_SERVICE_ID));
        let again = ConnParam { qp_num: 0x55, ..Default::default() };
        assert_eq!(id.connect(&again).unwrap_err().errno(), crate::Errno::EINVAL);
        // Asked again, and never answered: Unreachable once the sends run out.
        let id = resolved();
        id.connect(&again).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let e = loop {
            if let Some(e) = event(&ch) {
                break e;
            }
            assert!(Instant::now() < deadline, "never unreachable");
        };
        assert_eq!((e.event, e.status), (CmEventType::Unreachable, -libc::ETIMEDOUT));
        let mut sends = 0;
        peer.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut b = [0u8; 512];
        while peer.recv_from(&mut b).is_ok() {
            sends += 1;
        }
        // The first request's two sends were read above; the rest are still queued.
        assert!(sends >= REQUEST_SENDS as usize, "{sends} sends");

        // Asked once more and answered: the application (no QP of the id's own) hears the
        // reply and establishes, which sends the RTU; the REP again (our RTU lost) is
        // answered with the RTU again.
        peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(id.connect(&again).unwrap_err().errno(), crate::Errno::EINVAL);
        let id = resolved();
        id.connect(&again).unwrap();
        let Mad { tid, msg: CmMad::Req(req) } = mad_at(&peer) else { panic!("no REQ") };
        let rep = mad::Rep {
            local_id: 77,
            remote_id: req.local_id,
            qpn: 0x66,
            psn: 0x10,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            flow_control: false,
            srq: false,
            ca_guid: 9,
            private: [0; mad::REP_PRIVATE],
        };
        let rep = Mad { tid, msg: CmMad::Rep(Box::new(rep)) }.encode();
        arrived(&f.0, ours, peer_at.ip(), &rep);
        let e = event(&ch).unwrap();
        assert_eq!((e.event, e.param.qp_num), (CmEventType::ConnectResponse, 0x66));
        id.establish().unwrap();
        let rtu = CmMad::Rtu { local_id: req.local_id, remote_id: 77 };
        let got = |peer: &UdpSocket| loop {
            // Sends of the request still queued come first.
            match mad_at(peer).msg {
                CmMad::Req(_) => continue,
                m => break m,
            }
        };
        assert_eq!(got(&peer), rtu);
        arrived(&f.0, ours, peer_at.ip(), &rep);
        assert_eq!(got(&peer), rtu, "the REP again is answered with the RTU again");
    }
}

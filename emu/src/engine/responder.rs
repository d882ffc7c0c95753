//! The responder (after `rxe_resp.c`): checks PSNs, access and keys of incoming requests,
//! executes them against registered memory, consumes receive WQEs, and answers with ACKs,
//! NAKs, READ responses and atomic ACKs. Duplicates are answered without executing twice.

use std::sync::Arc;

use super::{
    Driver, enter_error, psn_add, psn_diff, raises_qp_errors,
    sgl::{self, SglError},
    wc, wc_ok,
};
use crate::packet::{Kind, MemRef, NakCode, Packet, Payload, Syndrome};
use crate::qp::transport::{ReadReq, Replay};
use crate::{
    error::{Result, einval},
    mem::{MemFault, MemRegion},
    objects::{cq::CqInner, keys::KeyTable, mr::MrInner, mw, pd::PdInner, recv_queue::RecvWr},
    qp::{QpInner, QpShared},
    types::{
        AccessFlags, EventType, FlushLevel, FlushType, Grh, QpState, QpType, WcFlags, WcOpcode,
        WcStatus,
    },
};

/// Validates and queues a receive WQE (rxe provider semantics), without the QP's lock; one
/// posted to a QP in ERR is flushed (under the lock).
pub(crate) fn post_recv(qp: &Arc<QpShared>, wr: &RecvWr<'_>) -> Result<()> {
    if matches!(qp.qp_type, QpType::XRC_SEND | QpType::XRC_RECV) {
        return Err(einval("XRC QPs have no receive queue (receives go to XRC SRQs)"));
    }
    if qp.srq.is_some() || qp.rss.is_some() {
        return Err(einval("the QP takes its receives from an SRQ or its WQs"));
    }
    // A receive posted in RESET is refused (IBA C10-22): by rxe, and by mlx5 from rdma-core
    // 40 on (before, it queued it).
    if qp.rq.state() == QpState::RESET {
        return Err(einval("QP is in RESET"));
    }
    if qp.rq.post(wr, qp.cap.max_recv_sge, "receive queue is full")? {
        let mut g = qp.inner.lock();
        // Unless it left ERR meanwhile (a RESET forgot what was posted).
        if g.state == QpState::ERR {
            flush_recv_queue(qp, &mut g);
        }
    }
    Ok(())
}

/// Completes every posted receive with `IBV_WC_WR_FLUSH_ERR`. (`_g`: the QP's lock is held,
/// which makes the caller the queue's one consumer.)
pub(crate) fn flush_recv_queue(qp: &QpShared, _g: &mut QpInner) {
    qp.rq.drain(|wr_id| {
        let _ = qp.recv_cq.push(wc(qp, wr_id, WcStatus::WR_FLUSH_ERR), true);
    });
}

/// Handles a request packet.
pub(crate) fn receive(qp: &Arc<QpShared>, g: &mut QpInner, mut pkt: Packet, drv: &mut Driver<'_>) {
    if pkt.kind == Kind::Raw {
        super::raw::receive(qp, g, pkt);
        return;
    }
    if pkt.kind == Kind::XrcResult {
        super::xrc::result(qp, g, pkt, drv);
        return;
    }
    // Requests to a QP that is not at least RTR (or is in ERR) are dropped, as on the wire;
    // so are requests of another transport than the QP's (the BTH opcode's first 3 bits).
    if !matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
        || pkt.dst_port != g.attr.port_num
        || !serves(qp.qp_type, pkt.transport)
    {
        return;
    }
    if g.resp.forwarded.is_some() {
        // Requests are executed in order: the rest waits for the forwarded request's answer.
        g.resp.held.push_back(pkt);
        return;
    }
    // IBA 11.6.3: the first packet to arrive at a connected QP still in RTR establishes the
    // connection (rxe raises no such event, so the rxe profile does not either).
    if g.state == QpState::RTR
        && qp.qp_type != QpType::UD
        && !g.resp.comm_est
        && raises_qp_errors(qp)
    {
        g.resp.comm_est = true;
        qp.raise(EventType::COMM_EST);
    }
    if qp.qp_type == QpType::UD {
        ud_receive(qp, g, &pkt);
        return;
    }
    if !reliable(qp) {
        // UC: no ACKs, no retransmissions; a gap means earlier messages were lost, and the
        // responder simply takes the next message (IBA 9.8.3).
        g.resp.epsn = pkt.psn;
        // Placed by its requester as it was posted (see `absent_peer::send_placing`).
        if pkt.ticket.take().is_some_and(|t| t.carried_out()) {
            advance(g, &pkt);
            return;
        }
        match pkt.kind {
            Kind::Send => send(qp, g, pkt, drv),
            Kind::Write => write(qp, g, pkt, drv),
            _ => {} // UC carries no READ or atomic
        }
        return;
    }
    let d = psn_diff(pkt.psn, g.resp.epsn);
    if d > 0 {
        if !g.resp.nak_seq_sent {
            g.resp.nak_seq_sent = true;
            let epsn = g.resp.epsn;
            let r = reply(g, &pkt, Kind::Ack, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            drv.send(&mut g.route, r);
        }
        return;
    }
    if pkt.gap {
        return;
    }
    if let Some(xrcd) = &qp.xrcd {
        // XRCETH: the SRQ must exist in the target QP's domain.
        g.resp.xrc = xrcd.srq(pkt.xrc_srqn);
        if g.resp.xrc.is_none() {
            if super::xrc::elsewhere(qp, xrcd, &pkt) {
                match d {
                    0 if refused(g, &pkt) => fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv),
                    0 => super::xrc::forward(qp, g, pkt, drv),
                    // A duplicate READ is read again, where the memory is.
                    _ if pkt.kind == Kind::ReadRequest && replayed_read(g, &pkt).is_some() => {
                        super::xrc::forward(qp, g, pkt, drv)
                    }
                    _ => duplicate(qp, g, &pkt, drv),
                }
            } else if d == 0 {
                fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
            }
            return;
        }
    }
    if d < 0 {
        duplicate(qp, g, &pkt, drv);
        return;
    }
    g.resp.nak_seq_sent = false;
    // Begun here: unless its requester carried it out itself while this process was stopped.
    if pkt.carried_out || pkt.ticket.take().is_some_and(|t| t.carried_out()) {
        return carried_out(g, &pkt);
    }
    match pkt.kind {
        Kind::Send => send(qp, g, pkt, drv),
        Kind::Write => write(qp, g, pkt, drv),
        Kind::ReadRequest => read(qp, g, pkt, drv),
        Kind::CompareSwap | Kind::FetchAdd => atomic(qp, g, pkt, drv),
        Kind::AtomicWrite => atomic_write(qp, g, pkt, drv),
        Kind::Flush => flush(qp, g, pkt, drv),
        _ => {}
    }
}

/// A WRITE or READ that its requester carried out itself (see `ipc::exports`), checked
/// then as it would have been here: only accounted for now. Neither is answered: the
/// requester completed it as if answered, nothing of its QP's outstanding before it (see
/// `absent_peer::carried`); a duplicate of it is answered as any other.
fn carried_out(g: &mut QpInner, pkt: &Packet) {
    if pkt.carried_out {
        // The note of requests carried out without being sent: PSNs from `psn` on, `npkts`
        // of them, in `msn` messages; nothing to answer.
        g.resp.epsn = super::psn_add(pkt.psn, pkt.npkts);
        g.resp.msn = g.resp.msn.wrapping_add(pkt.msn) & super::PSN_MASK;
        return;
    }
    match pkt.kind {
        Kind::Write => advance(g, pkt),
        Kind::ReadRequest => {
            remember(g, Replay::Read(ReadReq::of(pkt)));
            advance(g, pkt);
        }
        _ => {}
    }
}

/// Whether a QP of type `qp` takes requests sent by a QP of type `sender`.
fn serves(qp: QpType, sender: QpType) -> bool {
    match qp {
        QpType::XRC_RECV => sender == QpType::XRC_SEND,
        _ => qp == sender,
    }
}

/// A response to `req`, addressed back to its sender.
pub(super) fn reply(g: &QpInner, req: &Packet, kind: Kind, psn: u32, syndrome: Syndrome) -> Packet {
    let mut p = Packet::new(kind);
    p.src_dev = req.dst_dev;
    p.src_port = req.dst_port;
    p.src_qpn = req.dst_qpn;
    p.dst_dev = req.src_dev;
    p.dst_port = req.src_port;
    p.dst_qpn = req.src_qpn;
    p.psn = psn;
    p.syndrome = syndrome;
    p.msn = g.resp.msn;
    p.mtu = g.mtu;
    if req.src_dev == crate::types::WIRE_DEV {
        // Beyond a wire port: the BTH names no source QP, the connection does; the addresses
        // are the QP's path, or else the request's turned around.
        p.dst_qpn = g.attr.dest_qp_num;
        let back = |r: &Grh| Grh { sgid: r.dgid, dgid: r.sgid, ..*r };
        p.grh = g.wire_grh.or_else(|| req.grh.as_deref().map(back)).map(Box::new);
    }
    p
}

/// The request executed: advance the expected PSN and the MSN.
pub(super) fn advance(g: &mut QpInner, pkt: &Packet) {
    advance_past(g, pkt.psn, pkt.npkts);
}

/// The request of `npkts` PSNs from `psn` executed.
pub(super) fn advance_past(g: &mut QpInner, psn: u32, npkts: u32) {
    g.resp.epsn = psn_add(psn, npkts);
    g.resp.msn = g.resp.msn.wrapping_add(1) & super::PSN_MASK;
}

/// The 40 bytes a UD receive buffer starts with, as rxe and the RoCE v2 annex lay them out:
/// on RoCE v2 the packet's IP header, IPv6 (next header UDP), or between IPv4-mapped GIDs 20
/// zero bytes and the IPv4 header (TOS the traffic class, TTL the hop limit); on InfiniBand
/// an IB GRH (IBA 8.3, next header 0x1B). `headers` is the length of BTH and the extended
/// headers after it.
fn grh_bytes(grh: &Grh, paylen: u32, headers: u32, roce: bool) -> [u8; 40] {
    use crate::frame::{ipv4_header, ipv6_first_word};
    let mut h = [0u8; 40];
    let pad = (4 - paylen % 4) % 4;
    let udp_len = 8 + headers + paylen + pad + 4; // UDP, headers, payload, pad, ICRC
    if let (Some(s), Some(d)) = (grh.sgid.ipv4(), grh.dgid.ipv4()) {
        let ip = ipv4_header(s, d, udp_len as usize, grh.traffic_class, grh.hop_limit);
        h[20..].copy_from_slice(&ip);
        return h;
    }
    h[..4].copy_from_slice(&ipv6_first_word(grh.traffic_class, grh.flow_label));
    let (len, next) = if roce { (udp_len, libc::IPPROTO_UDP as u8) } else { (paylen, 0x1b) };
    h[4..6].copy_from_slice(&(len.min(u16::MAX as u32) as u16).to_be_bytes());
    h[6] = next;
    h[7] = grh.hop_limit;
    h[8..24].copy_from_slice(&grh.sgid.0);
    h[24..40].copy_from_slice(&grh.dgid.0);
    h
}

/// What a UD receive over RoCE reports as `sl`: 0 on rxe; on mlx5 (the full profile) the
/// CQE's field holds the packet's network header type there, which programs read to tell the
/// GRH area's layouts apart: 2 for IPv4, 1 for IPv6 (0 would be RoCE v1).
fn roce_sl(profile: crate::Profile, grh: &Grh) -> u8 {
    match profile {
        crate::Profile::Rxe => 0,
        crate::Profile::Full if grh.sgid.ipv4().is_some() => 2,
        crate::Profile::Full => 1,
    }
}

/// The largest UD payload: the largest path MTU.
pub(super) const MAX_UD_PAYLOAD: usize = 4096;

/// A UD datagram: checked against the Q_Key, dropped without a receive, delivered after the
/// 40-byte GRH area with the sender's QPN in `src_qp` (IBA 9.8.5, 11.4.2).
fn ud_receive(qp: &Arc<QpShared>, g: &mut QpInner, pkt: &Packet) {
    if pkt.kind != Kind::Send || pkt.qkey != g.attr.qkey {
        return;
    }
    // Sized by what the datagram carries, which no MTU lets exceed 4 KiB.
    let paylen: usize = pkt.payload.pieces().map(|p| p.len()).sum();
    if paylen > MAX_UD_PAYLOAD {
        return;
    }
    let total = 40 + paylen;
    // Gathered in the QP's scratch buffer (allocated once), so that a payload that faults
    // drops the datagram before it takes a receive.
    let mut data = std::mem::take(&mut g.resp.ud_scratch);
    data.clear();
    data.resize(total, 0);
    data[..40].copy_from_slice(&ud_head(g, pkt.grh.as_deref(), paylen, pkt.imm.is_some()));
    let gathered = sgl::gather(&pkt.payload, &mut data[40..]).is_ok_and(|n| n == paylen);
    // No receive: the datagram is dropped.
    let r = if gathered { pop_recv(qp, g) } else { None };
    let Some(r) = r else {
        g.resp.ud_scratch = data;
        return;
    };
    let res = sgl::scatter(&recv_pd(qp, g), &r.sges, &data[..], data.len() as u32);
    g.resp.ud_scratch = data;
    let wr_id = r.wr_id;
    done_recv(qp, r);
    let status = match res {
        Ok(()) => WcStatus::SUCCESS,
        Err(SglError::TooLong) => WcStatus::LOC_LEN_ERR,
        Err(SglError::Protection) => WcStatus::LOC_PROT_ERR,
    };
    if status != WcStatus::SUCCESS {
        let _ = qp.recv_cq.push(wc(qp, wr_id, status), true);
        enter_error(qp, g);
        return;
    }
    let d = Datagram {
        total: total as u32,
        grh: pkt.grh.as_deref(),
        imm: pkt.imm,
        src_qpn: pkt.src_qpn,
        src_lid: pkt.src_lid,
        solicited: pkt.solicited,
    };
    ud_received(qp, g, wr_id, &d);
}

/// The 40 bytes a UD receive buffer starts with, for a datagram of `paylen` bytes (with an
/// immediate or not) that came with `grh` or without (zeros).
pub(super) fn ud_head(g: &QpInner, grh: Option<&Grh>, paylen: usize, imm: bool) -> [u8; 40] {
    match grh {
        // BTH, DETH and the immediate data, if any.
        Some(grh) => grh_bytes(grh, paylen as u32, 12 + 8 + if imm { 4 } else { 0 }, g.port.roce),
        None => [0; 40],
    }
}

/// What a UD receive completion reports of the datagram that consumed it.
pub(super) struct Datagram<'a> {
    /// Its length with the 40-byte GRH area.
    pub(super) total: u32,
    pub(super) grh: Option<&'a Grh>,
    pub(super) imm: Option<u32>,
    pub(super) src_qpn: u32,
    pub(super) src_lid: u16,
    pub(super) solicited: bool,
}

/// Completes the receive `wr_id` that datagram `d` filled (the CQ overrun puts the QP in
/// error).
pub(super) fn ud_received(qp: &Arc<QpShared>, g: &mut QpInner, wr_id: u64, d: &Datagram<'_>) {
    let mut flags = WcFlags::empty();
    if d.grh.is_some() || g.port.roce {
        flags |= WcFlags::GRH;
    }
    if d.imm.is_some() {
        flags |= WcFlags::WITH_IMM;
    }
    let mut w = wc_ok(qp, wr_id, WcOpcode::RECV, d.total, flags);
    w.imm_data = d.imm.unwrap_or(0);
    w.src_qp = d.src_qpn;
    w.slid = d.src_lid;
    if let Some(grh) = d.grh.filter(|_| g.port.roce) {
        w.sl = roce_sl(qp.ctx.device.profile, grh);
    }
    if qp.recv_cq.push(w, d.solicited).is_err() {
        enter_error(qp, g);
    }
}

/// RC and XRC answer with ACKs, NAKs and RNR NAKs; UC never answers.
fn reliable(qp: &QpShared) -> bool {
    qp.qp_type.is_reliable()
}

/// The CQ that receive completions go to: the XRC SRQ's, or the QP's.
fn recv_cq<'a>(qp: &'a QpShared, g: &'a QpInner) -> &'a Arc<CqInner> {
    match &g.resp.xrc {
        Some(s) => s.xrc.as_ref().map_or(&qp.recv_cq, |x| &x.1),
        None => &qp.recv_cq,
    }
}

/// The PD a receive WQE's lkeys are checked against: an XRC SRQ's; a plain SRQ's in the full
/// profile, as hardware (the WQE belongs to the SRQ), where rxe checks them against the QP's.
pub(super) fn recv_pd(qp: &QpShared, g: &QpInner) -> Arc<PdInner> {
    match &g.resp.xrc {
        Some(x) => x.pd.clone(),
        None => own_recv_pd(qp).clone(),
    }
}

/// [`recv_pd`] outside XRC.
pub(super) fn own_recv_pd(qp: &QpShared) -> &Arc<PdInner> {
    match &qp.srq {
        Some(s) if qp.ctx.device.profile == crate::Profile::Full => &s.pd,
        _ => &qp.pd,
    }
}

/// The PD remote keys are checked against: the XRC SRQ's, or the QP's.
fn key_pd(qp: &QpShared, g: &QpInner) -> Arc<PdInner> {
    g.resp.xrc.as_ref().map_or_else(|| qp.pd.clone(), |s| s.pd.clone())
}

pub(super) fn ack(qp: &QpShared, g: &mut QpInner, pkt: &Packet, drv: &mut Driver<'_>) {
    advance(g, pkt);
    if !reliable(qp) {
        return;
    }
    let last = psn_add(pkt.psn, pkt.npkts - 1);
    if drv.ack_across(pkt, last, g.resp.msn) {
        return;
    }
    let r = reply(g, pkt, Kind::Ack, last, Syndrome::Ack);
    drv.send(&mut g.route, r);
}

/// An error the responder detects (IBA 9.7.5.2): NAK the request, complete the receive WQE it
/// consumed (if any) with its status, move the QP to ERR, and raise the affiliated event.
pub(super) fn fail(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    pkt: &Packet,
    code: NakCode,
    recv: Option<(WcStatus, u64)>,
    drv: &mut Driver<'_>,
) {
    if !reliable(qp) {
        // UC (IBA 9.8.3): a bad rkey drops the message silently, the QP goes on; a receive a
        // WRITE with immediate took off an SRQ for it completes in error (class D, as rxe;
        // `write` takes none off the QP's own receive queue). A receive that cannot take the
        // message completes in error and the QP goes to ERR (as rxe).
        if let Some((status, wr_id)) = recv {
            let _ = qp.recv_cq.push(wc(qp, wr_id, status), true);
        }
        if code != NakCode::RemoteAccessError {
            enter_error(qp, g);
        }
        return;
    }
    let r = reply(g, pkt, Kind::Ack, pkt.psn, Syndrome::Nak(code));
    drv.send(&mut g.route, r);
    if let Some((status, wr_id)) = recv {
        let _ = recv_cq(qp, g).push(wc(qp, wr_id, status), true);
    }
    enter_error(qp, g);
    if raises_qp_errors(qp) {
        qp.raise(match code {
            NakCode::RemoteAccessError => EventType::QP_ACCESS_ERR,
            NakCode::InvalidRequest => EventType::QP_REQ_ERR,
            _ => EventType::QP_FATAL,
        });
    }
}

/// A receive WQE taken off the SRQ or the RQ.
pub(crate) struct Recv {
    pub(crate) wr_id: u64,
    pub(crate) sges: crate::objects::recv_queue::Sges,
    /// The RQ slot it came from, to give the SGE vector back (an SRQ slot may already be
    /// reposted by another thread, so SRQ vectors are simply dropped).
    rq_slot: Option<u32>,
}

/// Takes the next receive WQE, from the QP's SRQ if it has one. Under the QP's lock (`g`);
/// hand it to [`done_recv`] before the lock is released.
pub(crate) fn pop_recv(qp: &QpShared, g: &mut QpInner) -> Option<Recv> {
    if let Some(srq) = g.resp.xrc.as_ref().or(qp.srq.as_ref()) {
        return srq.pop().map(|(wr_id, sges)| Recv { wr_id, sges, rq_slot: None });
    }
    let (wr_id, sges, counter) = qp.rq.take_out()?;
    Some(Recv { wr_id, sges, rq_slot: Some(counter) })
}

/// Consumes a taken WQE: returns its SGE vector to its RQ slot (keeping its allocation).
pub(crate) fn done_recv(qp: &QpShared, r: Recv) {
    if let Some(counter) = r.rq_slot {
        qp.rq.give_back(r.sges, counter);
    }
}

pub(super) fn rnr(qp: &QpShared, g: &mut QpInner, pkt: &Packet, drv: &mut Driver<'_>) {
    if !reliable(qp) {
        return; // UC: no receive posted, the message is dropped
    }
    let t = g.attr.min_rnr_timer;
    let r = reply(g, pkt, Kind::Ack, pkt.psn, Syndrome::Rnr(t));
    drv.send(&mut g.route, r);
}

/// The flags a receive completion of `pkt` on a connected QP carries; `grh`: whether it says
/// a GRH came (rxe sets `IBV_WC_GRH` on every receive over RoCE; mlx5, which the full profile
/// follows, only on UD receives).
pub(super) fn recv_flags(grh: bool, pkt: &Packet) -> WcFlags {
    Arrival::of(pkt).flags(grh)
}

/// What a receive completion reports of the message that consumed it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Arrival {
    pub(super) len: u32,
    pub(super) imm: Option<u32>,
    pub(super) inv: Option<u32>,
    pub(super) src_lid: u16,
    pub(super) solicited: bool,
}

impl Arrival {
    fn of(pkt: &Packet) -> Arrival {
        Arrival {
            len: pkt.len,
            imm: pkt.imm,
            inv: pkt.inv,
            src_lid: pkt.src_lid,
            solicited: pkt.solicited,
        }
    }

    fn flags(&self, grh: bool) -> WcFlags {
        let mut f = WcFlags::empty();
        f.set(WcFlags::GRH, grh);
        f.set(WcFlags::WITH_IMM, self.imm.is_some());
        f.set(WcFlags::WITH_INV, self.inv.is_some());
        f
    }
}

fn complete_recv(qp: &Arc<QpShared>, g: &mut QpInner, pkt: &Packet, opcode: WcOpcode, wr_id: u64) {
    complete_arrival(qp, g, &Arrival::of(pkt), opcode, wr_id);
}

/// Completes the receive WQE `wr_id` with the message `a`. (Inlined where it is called: out
/// of line, its registers moved with whatever else the build placed beside it: a SEND hop
/// measured 825 or 853 instructions as unrelated code changed, 799 inlined.)
#[inline(always)]
pub(super) fn complete_arrival(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    a: &Arrival,
    opcode: WcOpcode,
    wr_id: u64,
) {
    let grh = g.port.roce && qp.ctx.device.profile == crate::Profile::Rxe;
    let mut w = wc_ok(qp, wr_id, opcode, a.len, a.flags(grh));
    // `imm_data` and `invalidated_rkey` share the completion's union.
    w.imm_data = a.imm.or(a.inv).unwrap_or(0);
    w.slid = a.src_lid;
    if recv_cq(qp, g).push(w, a.solicited).is_err() {
        // rxe: a receive completion lost to a CQ overrun puts the QP in ERR.
        enter_error(qp, g);
    }
}

fn send(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if drv.forced_rnr(&pkt) {
        rnr(qp, g, &pkt, drv);
        return;
    }
    if let Some(srq) = qp.srq.as_ref().filter(|s| s.tm.is_some()) {
        return tm_send(qp, g, pkt, drv, srq.clone());
    }
    let Some(r) = pop_recv(qp, g) else {
        rnr(qp, g, &pkt, drv);
        return;
    };
    let res = match &pkt.payload {
        // Placed as it arrived: whether all of it landed, in this very WQE.
        Payload::Landed(landed) => match landed {
            Some(l) if l.rq_slot.is_some() && l.rq_slot == r.rq_slot => Ok(()),
            _ => Err(SglError::Protection),
        },
        payload => sgl::scatter(&recv_pd(qp, g), &r.sges, payload, pkt.len),
    };
    let wr_id = r.wr_id;
    done_recv(qp, r);
    match res {
        Ok(()) => {
            if let Some(rkey) = pkt.inv
                && mw::invalidate(&qp.ctx.device.keys.read(), rkey, Some(qp.qpn)).is_err()
            {
                // The rkey names no window this SEND may invalidate (IBA 9.9.6.3, responder
                // class J, as rxe): the message was received, so it is acknowledged, but the
                // receive completes in error and the QP goes to ERR; no NAK.
                ack(qp, g, &pkt, drv);
                let _ = recv_cq(qp, g).push(wc(qp, wr_id, WcStatus::REM_INV_REQ_ERR), true);
                enter_error(qp, g);
                return;
            }
            complete_recv(qp, g, &pkt, WcOpcode::RECV, wr_id);
            ack(qp, g, &pkt, drv);
        }
        Err(e) => scatter_failed(qp, g, &pkt, e, wr_id, drv),
    }
}

/// A received message that could not be placed in the receive WQE `wr_id`: IBA 9.7.5.2.2, a
/// message longer than the buffer is a Local Length Error on the responder and an Invalid
/// Request for the requester; a bad lkey a Local Protection Error.
fn scatter_failed(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    pkt: &Packet,
    e: SglError,
    wr_id: u64,
    drv: &mut Driver<'_>,
) {
    match e {
        SglError::TooLong => {
            fail(qp, g, pkt, NakCode::InvalidRequest, Some((WcStatus::LOC_LEN_ERR, wr_id)), drv)
        }
        SglError::Protection => {
            let status = Some((WcStatus::LOC_PROT_ERR, wr_id));
            fail(qp, g, pkt, NakCode::RemoteOperationalError, status, drv)
        }
    }
}

/// A big-endian field of up to 8 bytes (the TMH's and RVH's).
fn be_word(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |a, &b| a << 8 | u64::from(b))
}

/// A SEND to a QP on a tag-matching SRQ, as an mlx5 HCA places it: a tagged message (TMH
/// opcode EAGER or RNDV) that matches a posted tag lands in the tag's buffer without its
/// 16-byte TMH and completes `IBV_WC_TM_RECV` with `MATCH | DATA_VALID` and the tag's `wr_id`
/// (a rendezvous: its RVH and what follows, with `IBV_WC_TM_RNDV_INCOMPLETE`, the read left to
/// software, as mlx5's software-rendezvous completion); anything else goes whole to an
/// ordinary receive WQE: `IBV_WC_TM_RECV` for an unexpected tagged message (which pauses
/// matching until the application syncs), `IBV_WC_TM_NO_TAG` otherwise. A matched message's
/// TMH tag and `app_ctx` go with its completion (`ibv_wc_read_tm_info`); one in an ordinary
/// buffer has its TMH in the buffer, and zeros there.
fn tm_send(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    pkt: Packet,
    drv: &mut Driver<'_>,
    srq: Arc<crate::objects::srq::SrqInner>,
) {
    use crate::objects::srq::tmh;
    let mut header = [0u8; tmh::LEN];
    let tagged = pkt.len as usize >= tmh::LEN && sgl::gather(&pkt.payload, &mut header).is_ok();
    let (op, app_ctx, tag) = if tagged {
        (header[0], be_word(&header[4..8]) as u32, be_word(&header[8..16]))
    } else {
        (tmh::NO_TAG, 0, 0)
    };
    let tm = srq.tm.as_ref().expect("a tag-matching SRQ");
    let hit = tm.lock().take_match(op, tag);
    let (wr_id, opcode, flags, status, res) = if let Some(t) = hit {
        let mut all = vec![0u8; pkt.len as usize];
        let data = match sgl::gather(&pkt.payload, &mut all) {
            Ok(_) => Payload::Bytes(all[tmh::LEN..].to_vec().into()),
            Err(_) => Payload::None,
        };
        // A rendezvous the HCA runs itself: the match completes now, the data once its READ
        // of the sender's buffer (the RVH's va, rkey, length) is done, then the FIN goes back.
        // Too long for the tag's buffer, no RVH, or no room to queue the work: software's.
        if op == tmh::RNDV && all.len() >= tmh::LEN + 16 {
            let (va, rkey, len) =
                (be_word(&all[16..24]), be_word(&all[24..28]) as u32, be_word(&all[28..32]) as u32);
            let room: u64 = t.sges.iter().map(|s| s.length as u64).sum();
            let mut fin = [0u8; tmh::LEN];
            fin[0] = tmh::FIN;
            fin[4..8].copy_from_slice(&app_ctx.to_be_bytes());
            fin[8..16].copy_from_slice(&tag.to_be_bytes());
            let done = crate::qp::queue::Hidden::RndvRead { wr_id: t.wr_id() };
            if len as u64 <= room
                && super::requester::queue_rndv(g, (va, rkey, len), &t.sges, done, fin)
            {
                let mut w = wc_ok(qp, t.wr_id(), WcOpcode::TM_RECV, 0, WcFlags::TM_MATCH);
                (w.tm_tag, w.tm_priv) = (tag, app_ctx);
                if recv_cq(qp, g).push(w, pkt.solicited).is_err() {
                    enter_error(qp, g);
                }
                return ack(qp, g, &pkt, drv);
            }
        }
        let len = pkt.len - tmh::LEN as u32;
        let res = sgl::scatter(&srq.pd, &t.sges, &data, len);
        let status = if op == tmh::RNDV { WcStatus::TM_RNDV_INCOMPLETE } else { WcStatus::SUCCESS };
        let flags = WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID;
        (t.wr_id(), WcOpcode::TM_RECV, flags, status, res.map(|()| len))
    } else {
        let Some(r) = pop_recv(qp, g) else {
            rnr(qp, g, &pkt, drv);
            return;
        };
        let unexpected = op == tmh::EAGER || op == tmh::RNDV;
        if unexpected {
            tm.lock().unexpected();
        }
        let res = sgl::scatter(&recv_pd(qp, g), &r.sges, &pkt.payload, pkt.len);
        let wr_id = r.wr_id;
        done_recv(qp, r);
        let opcode = if unexpected { WcOpcode::TM_RECV } else { WcOpcode::TM_NO_TAG };
        (wr_id, opcode, WcFlags::empty(), WcStatus::SUCCESS, res.map(|()| pkt.len))
    };
    // A message in an ordinary buffer carries its TMH there, not in its completion (zero
    // there, as mlx5's CQE for one: rdma-core's tag-matching tests read it so).
    let (tag, app_ctx) = if flags.contains(WcFlags::TM_MATCH) { (tag, app_ctx) } else { (0, 0) };
    match res {
        Ok(len) => {
            let mut w = wc_ok(qp, wr_id, opcode, len, flags);
            (w.status, w.tm_tag, w.tm_priv) = (status, tag, app_ctx);
            if recv_cq(qp, g).push(w, pkt.solicited).is_err() {
                enter_error(qp, g);
            }
            ack(qp, g, &pkt, drv);
        }
        Err(e) => scatter_failed(qp, g, &pkt, e, wr_id, drv),
    }
}

/// Looks up the MR behind `rkey` for `[va, va+len)` with `access`, for this QP; `Ok(None)`
/// for a zero-length access, which IBA does not check.
fn target(
    qp: &QpShared,
    g: &QpInner,
    rkey: u32,
    va: u64,
    len: u32,
    access: AccessFlags,
) -> Result<Option<(Arc<MemRegion>, usize)>, ()> {
    let keys = qp.ctx.device.keys.read();
    resolve(&keys, &key_pd(qp, g), qp.qpn, (rkey, va, len), access)
}

/// The memory `rkey` names for `[va, va+len)` (`key`), if it is in `pd` and grants `access`
/// (a type 2 window: to the QP `qpn`).
pub(super) fn resolve(
    keys: &KeyTable,
    pd: &Arc<PdInner>,
    qpn: u32,
    (rkey, va, len): (u32, u64, u32),
    access: AccessFlags,
) -> Result<Option<(Arc<MemRegion>, usize)>, ()> {
    if len == 0 {
        return Ok(None);
    }
    match mr_target(keys, pd, (rkey, va, len), access) {
        // Not a memory region: perhaps a memory window.
        None => mw::resolve(keys, pd, qpn, rkey, va, len as u64, access).map(Some).ok_or(()),
        Some(t) => t.map(|(mr, off)| Some((mr.region.clone(), off))),
    }
}

/// The MR `rkey` names and the offset of `[va, va+len)` in it: `None` when the key names no
/// MR (a window, or nothing), `Err` when the MR is not `pd`'s, does not grant `access`, or
/// does not hold the range.
pub(super) fn mr_target<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    (rkey, va, len): (u32, u64, u32),
    access: AccessFlags,
) -> Option<Result<(&'k MrInner, usize), ()>> {
    let mr = keys.mr(rkey)?;
    if mr.rkey != rkey || !Arc::ptr_eq(&mr.pd, pd) || !mr.access.contains(access) {
        return Some(Err(()));
    }
    Some(mr.offset_of(va, len as u64).map(|off| (&**mr, off)).ok_or(()))
}

/// Whether the QP's own attributes refuse the request `pkt` outright (an invalid request):
/// remote access it does not enable, or an atomic write's bad size or alignment. (An atomic's
/// misaligned word is refused after its rkey is checked, as rxe orders the two: see `atomic`.)
pub(super) fn refused(g: &QpInner, pkt: &Packet) -> bool {
    refused_by_qp(g, pkt.kind, pkt.len, pkt.va, pkt.feth)
}

/// Whether the responder refuses a request of `kind` of `len` bytes at `va` (with FETH
/// `feth`): [`refused`], or an atomic's misaligned word. The express paths leave these to the
/// packet path.
pub(super) fn refuses(g: &QpInner, kind: Kind, len: u32, va: u64, feth: u8) -> bool {
    refused_by_qp(g, kind, len, va, feth)
        || matches!(kind, Kind::CompareSwap | Kind::FetchAdd) && va & 7 != 0
}

fn refused_by_qp(g: &QpInner, kind: Kind, len: u32, va: u64, feth: u8) -> bool {
    let allows = |a| g.attr.qp_access_flags.contains(a);
    match kind {
        Kind::Write => !allows(AccessFlags::REMOTE_WRITE),
        Kind::AtomicWrite => !allows(AccessFlags::REMOTE_WRITE) || len != 8 || va & 7 != 0,
        // The QP must enable each placement type the FLUSH asks for (as rxe checks).
        Kind::Flush => !allows(flush_access(feth)),
        Kind::ReadRequest => !allows(AccessFlags::REMOTE_READ) || g.attr.max_dest_rd_atomic == 0,
        Kind::CompareSwap | Kind::FetchAdd => {
            !allows(AccessFlags::REMOTE_ATOMIC) || g.attr.max_dest_rd_atomic == 0
        }
        _ => false,
    }
}

fn write(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if refused(g, &pkt) {
        // UC: a WRITE the QP does not enable is dropped before it takes a receive, and the QP
        // goes on (as rxe; nothing could tell the requester).
        if !reliable(qp) {
            return;
        }
        return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv);
    }
    let dest = target(qp, g, pkt.rkey, pkt.va, pkt.len, AccessFlags::REMOTE_WRITE);
    // A WRITE of several packets carries its RETH in the first and its immediate in the last:
    // the first is checked (and NAKed) before the last needs a receive WQE.
    if pkt.imm.is_some() && pkt.npkts > 1 && dest.is_err() {
        return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
    }
    // UC, class E: a WRITE with immediate whose rkey fails is dropped without taking a receive
    // off the QP's own receive queue: the next message finds it there (as rxe).
    if pkt.imm.is_some() && dest.is_err() && !reliable(qp) && qp.srq.is_none() {
        return;
    }
    // WRITE_WITH_IMM consumes a receive WQE, taken before the data lands.
    let recv = if pkt.imm.is_some() {
        match pop_recv(qp, g) {
            Some(r) => {
                let id = r.wr_id;
                done_recv(qp, r);
                Some(id)
            }
            None => return rnr(qp, g, &pkt, drv),
        }
    } else {
        None
    };
    // The receive of a WRITE with immediate that failed its rkey: rxe reports a remote access
    // error; the full profile a local access error, as verbs documents for the responder.
    let status = match qp.ctx.device.profile {
        crate::Profile::Rxe => WcStatus::REM_ACCESS_ERR,
        crate::Profile::Full => WcStatus::LOC_ACCESS_ERR,
    };
    let recv_status = recv.map(|id| (status, id));
    match dest {
        Ok(Some((region, off))) => {
            let copied = match &pkt.payload {
                // Placed as it arrived: whether all of it landed, where it belongs.
                Payload::Landed(landed) => landed.as_ref().is_some_and(|l| match &l.dst[..] {
                    [m] => {
                        l.rq_slot.is_none() && Arc::ptr_eq(&m.region, &region) && m.offset == off
                    }
                    _ => false,
                }),
                payload => {
                    let dst = std::iter::once((&region, off, pkt.len as usize));
                    sgl::copy_into(payload, dst).is_ok()
                }
            };
            if !copied {
                return fail(qp, g, &pkt, NakCode::RemoteAccessError, recv_status, drv);
            }
        }
        Ok(None) => {}
        Err(()) => return fail(qp, g, &pkt, NakCode::RemoteAccessError, recv_status, drv),
    }
    if let Some(wr_id) = recv {
        complete_recv(qp, g, &pkt, WcOpcode::RECV_RDMA_WITH_IMM, wr_id);
    }
    ack(qp, g, &pkt, drv);
}

/// ATOMIC WRITE: the QP and the target must allow remote writes; the 8 bytes land as one
/// store at an 8-byte aligned address, then an ACK, as for an RDMA WRITE.
fn atomic_write(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if refused(g, &pkt) {
        return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv);
    }
    let Ok(Some((region, off))) = target(qp, g, pkt.rkey, pkt.va, 8, AccessFlags::REMOTE_WRITE)
    else {
        return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
    };
    let stored = store_word(&pkt, &region, off);
    if stored.is_err() {
        return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
    }
    ack(qp, g, &pkt, drv);
}

/// The access a FLUSH's placement types need, of the QP and of the memory.
fn flush_access(feth: u8) -> AccessFlags {
    let placement = FlushType::from_bits_retain(feth & 0xf);
    let mut access = AccessFlags::empty();
    if placement.contains(FlushType::GLOBAL) {
        access |= AccessFlags::FLUSH_GLOBAL;
    }
    if placement.contains(FlushType::PERSISTENT) {
        access |= AccessFlags::FLUSH_PERSISTENT;
    }
    access
}

/// FLUSH (IBA 1.5): the QP and the memory must grant each placement type asked for; the range
/// (selectivity RANGE: the request's, MR: the whole region its rkey names) is made globally
/// visible (every store before it in this QP's order is already in memory, and a fence orders
/// them for other readers) and, for PERSISTENT, written back to the file behind it (`msync`;
/// anonymous memory has nothing further to reach). Then an ACK, as rxe answers it.
fn flush(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if refused(g, &pkt) {
        return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv);
    }
    let access = flush_access(pkt.feth);
    let level = FlushLevel((pkt.feth >> 4) & 0x3);
    let range = if level == FlushLevel::MR || pkt.len == 0 {
        // The MR the rkey names (an empty range too must lie in memory the rkey grants).
        let keys = qp.ctx.device.keys.read();
        let mr = keys.mr(pkt.rkey).filter(|mr| {
            mr.rkey == pkt.rkey && Arc::ptr_eq(&mr.pd, &key_pd(qp, g)) && mr.access.contains(access)
        });
        match mr {
            Some(mr) if level == FlushLevel::MR => {
                Ok(Some((mr.region.clone(), 0, mr.region.len())))
            }
            Some(mr) => {
                mr.offset_of(pkt.va, 0).map(|off| Some((mr.region.clone(), off, 0))).ok_or(())
            }
            None => Err(()),
        }
    } else {
        target(qp, g, pkt.rkey, pkt.va, pkt.len, access)
            .map(|t| t.map(|(region, off)| (region, off, pkt.len as usize)))
    };
    let Ok(Some((region, off, len))) = range else {
        return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
    };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    if access.contains(AccessFlags::FLUSH_PERSISTENT) && !region.write_back(off, len) {
        return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
    }
    ack(qp, g, &pkt, drv);
}

/// ATOMIC WRITE: stores the 8 bytes the request carries at `off` as one.
pub(super) fn store_word(pkt: &Packet, region: &MemRegion, off: usize) -> Result<(), MemFault> {
    let mut word = [0u8; 8];
    match sgl::gather(&pkt.payload, &mut word) {
        Ok(8) => region.store(off, word),
        _ => Err(MemFault::OutOfBounds),
    }
}

/// CMP_SWP (`kind`) or FETCH_ADD at `off` with the operands `compare` and `swap_add`: the
/// value found there.
pub(super) fn fetch_op(
    kind: Kind,
    compare: u64,
    swap_add: u64,
    region: &MemRegion,
    off: usize,
) -> Result<u64, MemFault> {
    if kind == Kind::CompareSwap {
        region.compare_swap(off, compare, swap_add)
    } else {
        region.fetch_add(off, swap_add)
    }
}

pub(super) fn remember(g: &mut QpInner, r: Replay) {
    let cap = (g.attr.max_dest_rd_atomic as usize).max(1);
    while g.resp.replay.len() >= cap {
        g.resp.replay.pop_front();
    }
    g.resp.replay.push_back(r);
}

/// Executes a READ: copies the target range straight into the destination the request
/// carries, and builds the response (for a requester in another process, the response
/// names the target range: the fabric copies it out as it sends, or lets a large one be
/// read from here).
fn read_response(qp: &QpShared, g: &QpInner, req: &Packet, r: ReadReq) -> Result<Packet, ()> {
    let mut p = reply(g, req, Kind::ReadResponse, r.psn, Syndrome::Ack);
    p.npkts = r.npkts;
    p.len = r.len;
    if let Some((region, offset)) = target(qp, g, r.rkey, r.va, r.len, AccessFlags::REMOTE_READ)? {
        let src = MemRef { region, offset, len: r.len as usize };
        if matches!(req.payload, Payload::Remote) {
            p.payload = Payload::One(src);
        } else {
            let dst = req.payload.ranges().iter().map(|m| (&m.region, m.offset, m.len));
            // The destination was checked by the requester, so this cannot fault.
            sgl::copy_into(&Payload::One(src.clone()), dst).map_err(|_| ())?;
            p.payload = Payload::Placed(src);
        }
    }
    Ok(p)
}

fn read(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if refused(g, &pkt) {
        return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv);
    }
    let r = ReadReq::of(&pkt);
    match read_response(qp, g, &pkt, r) {
        Ok(resp) => {
            remember(g, Replay::Read(r));
            advance(g, &pkt);
            let mut resp = resp;
            resp.msn = g.resp.msn;
            drv.send(&mut g.route, resp);
        }
        Err(()) => fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv),
    }
}

fn atomic(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if refused(g, &pkt) {
        return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv);
    }
    let (region, off) = match target(qp, g, pkt.rkey, pkt.va, 8, AccessFlags::REMOTE_ATOMIC) {
        Ok(Some(t)) => t,
        _ => return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv),
    };
    // A misaligned word once the rkey passed: rxe checks it as it executes the atomic.
    if pkt.va & 7 != 0 {
        return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv);
    }
    let orig = match fetch_op(pkt.kind, pkt.compare, pkt.swap_add, &region, off) {
        Ok(v) => v,
        Err(MemFault::Misaligned) => return fail(qp, g, &pkt, NakCode::InvalidRequest, None, drv),
        Err(MemFault::OutOfBounds | MemFault::Unreadable) => {
            return fail(qp, g, &pkt, NakCode::RemoteAccessError, None, drv);
        }
    };
    remember(g, Replay::Atomic { psn: pkt.psn, orig });
    advance(g, &pkt);
    let mut resp = reply(g, &pkt, Kind::AtomicAck, pkt.psn, Syndrome::Ack);
    resp.orig = orig;
    drv.send(&mut g.route, resp);
}

/// A request whose PSN is behind the expected one: re-ACK SENDs and WRITEs, answer READs and
/// atomics from the saved results (an atomic is never executed twice).
/// The READ `pkt` repeats, if it is still kept to answer again.
fn replayed_read(g: &QpInner, pkt: &Packet) -> Option<ReadReq> {
    g.resp.replay.iter().find_map(|r| match *r {
        Replay::Read(r) if r.psn == pkt.psn => Some(r),
        _ => None,
    })
}

fn duplicate(qp: &Arc<QpShared>, g: &mut QpInner, pkt: &Packet, drv: &mut Driver<'_>) {
    match pkt.kind {
        // An ATOMIC WRITE is not done again: a later write may have landed since. A FLUSH
        // repeated is acknowledged again (IBA oA19-14).
        Kind::Send | Kind::Write | Kind::AtomicWrite | Kind::Flush => {
            let last_done = psn_add(g.resp.epsn, super::PSN_MASK);
            let r = reply(g, pkt, Kind::Ack, last_done, Syndrome::Ack);
            drv.send(&mut g.route, r);
        }
        Kind::ReadRequest => {
            let saved = replayed_read(g, pkt);
            // The memory is read again, as rxe does: a READ has no side effect to protect.
            if let Some(Ok(resp)) = saved.map(|r| read_response(qp, g, pkt, r)) {
                drv.send(&mut g.route, resp);
            }
        }
        Kind::CompareSwap | Kind::FetchAdd => {
            let saved = g.resp.replay.iter().find_map(|r| match *r {
                Replay::Atomic { psn, orig } if psn == pkt.psn => Some(orig),
                _ => None,
            });
            if let Some(orig) = saved {
                let mut resp = reply(g, pkt, Kind::AtomicAck, pkt.psn, Syndrome::Ack);
                resp.orig = orig;
                drv.send(&mut g.route, resp);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::engine::testkit::{bytes, feed, pair, request};

    #[test]
    fn test_check_psn_duplicate_atomic_is_answered_from_saved_result() {
        let (_f, a, b) = pair();
        b.mr.write_u64(0, 10).unwrap();
        let mut p = request(Kind::FetchAdd, &a.qp, &b.qp, 100);
        (p.va, p.rkey, p.len, p.swap_add) = (b.mr.addr(), b.mr.rkey(), 8, 5);
        let first = feed(&b.qp, &a.qp, p.clone());
        let again = feed(&b.qp, &a.qp, p);
        assert_eq!(b.mr.read_u64(0).unwrap(), 15, "executed once");
        for r in [&first[0], &again[0]] {
            assert_eq!((r.kind, r.psn, r.orig), (Kind::AtomicAck, 100, 10));
        }
        assert_eq!(b.qp.query().unwrap().rq_psn, 101);
    }

    #[test]
    fn test_check_psn_duplicate_write_is_acked_not_executed() {
        let (_f, a, b) = pair();
        let mut p = request(Kind::Write, &a.qp, &b.qp, 100);
        (p.va, p.rkey, p.len, p.payload) = (b.mr.addr(), b.mr.rkey(), 3, bytes(b"abc"));
        let first = feed(&b.qp, &a.qp, p.clone());
        assert_eq!(
            (first[0].kind, first[0].psn, first[0].syndrome),
            (Kind::Ack, 100, Syndrome::Ack)
        );
        b.mr.write(0, b"xyz").unwrap();
        let again = feed(&b.qp, &a.qp, p);
        assert_eq!(
            (again[0].kind, again[0].psn, again[0].syndrome),
            (Kind::Ack, 100, Syndrome::Ack)
        );
        let mut got = [0u8; 3];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"xyz", "a duplicate WRITE must not be executed again");
    }

    #[test]
    fn test_check_psn_ahead_naks_once_and_drops() {
        let (_f, a, b) = pair();
        let mut p = request(Kind::Write, &a.qp, &b.qp, 105);
        (p.va, p.rkey, p.len, p.payload) = (b.mr.addr(), b.mr.rkey(), 1, bytes(b"!"));
        let first = feed(&b.qp, &a.qp, p.clone());
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].psn, first[0].syndrome),
            (100, Syndrome::Nak(NakCode::PsnSequenceError)),
            "NAK names the expected PSN"
        );
        assert!(feed(&b.qp, &a.qp, p).is_empty(), "one NAK per gap");
        assert_eq!(b.mr.read_u64(0).unwrap(), 0);
        assert_eq!(b.qp.state(), QpState::RTS, "a sequence error does not hurt the QP");
    }

    #[test]
    fn test_send_without_receive_gets_rnr_nak_with_min_rnr_timer() {
        let (_f, a, b) = pair();
        let mut p = request(Kind::Send, &a.qp, &b.qp, 100);
        (p.len, p.payload) = (2, bytes(b"hi"));
        let out = feed(&b.qp, &a.qp, p);
        assert_eq!((out[0].psn, out[0].syndrome), (100, Syndrome::Rnr(12)));
        assert_eq!(b.qp.query().unwrap().rq_psn, 100, "the PSN is not consumed");
    }

    #[test]
    fn test_duplicate_read_reads_current_memory_into_the_new_destination() {
        let (_f, a, b) = pair();
        b.mr.write(0, b"one").unwrap();
        let dst = sgl::resolve(
            &a.qp.0,
            &[crate::Sge { addr: a.mr.addr(), length: 3, lkey: a.mr.lkey() }],
            true,
        )
        .unwrap();
        let mut p = request(Kind::ReadRequest, &a.qp, &b.qp, 100);
        (p.va, p.rkey, p.len, p.payload) = (b.mr.addr(), b.mr.rkey(), 3, dst);
        let out = feed(&b.qp, &a.qp, p.clone());
        assert_eq!((out[0].kind, out[0].psn, out[0].len), (Kind::ReadResponse, 100, 3));
        b.mr.write(0, b"two").unwrap();
        let again = feed(&b.qp, &a.qp, p);
        assert_eq!(again[0].kind, Kind::ReadResponse);
        let mut got = [0u8; 3];
        a.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"two");
        assert_eq!(b.qp.query().unwrap().rq_psn, 101);
    }

    #[test]
    fn test_requests_to_a_qp_below_rtr_are_dropped() {
        let (_f, a, b) = pair();
        b.qp.modify(
            &crate::QpAttr { qp_state: QpState::RESET, ..Default::default() },
            crate::QpAttrMask::STATE,
        )
        .unwrap();
        let p = request(Kind::Send, &a.qp, &b.qp, 100);
        assert!(feed(&b.qp, &a.qp, p).is_empty());
    }
}

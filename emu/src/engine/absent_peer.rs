//! Work for a peer process that takes nothing in: stopped (SIGSTOP, a debugger), or running
//! but its threads not scheduled. A NIC goes on answering for such a process, so an RC QP
//! carries out its RDMA WRITEs and READs to one itself, in order (`ipc::exports` checks
//! each as the peer's responder would, and moves the bytes), and completes them as if the
//! peer had answered.
//!
//! Those already sent, whose records still wait in the ring unbegun, are claimed there
//! ([`carry_out`], when the ACK timer finds the peer stopped; [`carry_out_for_lagging`], when
//! a thread of ours polling an empty CQ finds the peer's reader has taken nothing in for a
//! while); the peer accounts for them as it takes them in. While the peer stays stopped,
//! those posted next are carried out without being sent at all ([`carry_out_unsent`]), so
//! that a stream of them is not bounded by the ring; the peer hears of their PSNs in one note,
//! before the next request that is sent ([`note_unsent`]). The first request that cannot be
//! carried out (a SEND, an atomic, a WRITE with immediate, one the peer's tables refuse, one
//! in several ring records) and everything after it wait for the peer to continue.
//!
//! A WRITE is also carried out as it is sent when the peer's reader looks absent
//! ([`send_placing`]): a UC QP waits for no answer that would make it look again. A UC WRITE
//! too long to be sent whole, which the peer could not take in before its reader woke, is
//! carried out instead of being sent where that reader is not at work ([`carry_out_ahead`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{Driver, PSN_MASK, completer, packets_for, psn_add, sgl};
use crate::packet::{Kind, Packet, Payload, Syndrome};
use crate::qp::transport::Unsent;
use crate::{
    fabric::host::{self, AbsentPeer, Claimed, Hold},
    ipc::exports::{Op, Request},
    qp::{QpInner, QpShared, queue::Hidden, queue::SendWqe},
    types::{QpState, QpType, SendFlags, WrOpcode},
};

/// The pause after a QP's last WRITE carried out as it was sent (or that found the peer's
/// reader asleep) after which the next is carried out so too (see [`send_placing`]): far shorter than a
/// round trip through a peer's reader that shares its core with a spinning application (tens
/// of microseconds), far longer than the gap between the WRITEs of a stream (a fraction of
/// one).
const PLACE_GAP: Duration = Duration::from_micros(2);

/// Carries out what it can of the QP's outstanding requests, oldest first, for its stopped
/// peer; whether it carried out any.
pub(crate) fn carry_out(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) -> bool {
    let Some(peer) = absent_peer(g, drv, false) else { return false };
    carry_out_to(qp, g, peer, drv)
}

/// Carries out what it can of the QP's outstanding requests, oldest first, for its peer whose
/// reader has taken nothing in for a while (see `fabric::host::LAG`); whether it carried out
/// any.
pub(crate) fn carry_out_for_lagging(qp: &Arc<QpShared>) -> bool {
    let mut drv = Driver::new(&qp.ctx.fabric);
    let any = {
        let mut g = crate::sync::lock::lock_lent(&qp.inner);
        let sending = matches!(g.state, QpState::RTS | QpState::SQD) && g.sq.in_flight() > 0;
        let any = sending
            && absent_peer(&g, &drv, true)
                .is_some_and(|peer| carry_out_to(qp, &mut g, peer, &mut drv));
        if any {
            drv.service(qp, &mut g);
        }
        any
    };
    drv.finish();
    any
}

fn carry_out_to(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    mut peer: AbsentPeer,
    drv: &mut Driver<'_>,
) -> bool {
    let mut any = false;
    while g.sq.in_flight() > 0 && g.req.failed.is_none() {
        let w = g.sq.ring.at(g.sq.tail);
        let Some(answer) = carried(qp, g, w, |req| peer.carry_out(w.first_psn, req)) else {
            break;
        };
        completer::receive(qp, g, answer, drv);
        any = true;
    }
    any
}

/// Carries out the WQE at `idx`, the next to send, for the stopped peer without sending it,
/// if it can, nothing being outstanding; whether it did. Once the peer is found running again
/// the QP stops trying.
pub(crate) fn carry_out_unsent(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    drv: &mut Driver<'_>,
) -> bool {
    if g.sq.in_flight() != 0 {
        return false;
    }
    let Some(peer) = absent_peer(g, drv, false) else {
        g.req.carrying = false;
        return false;
    };
    let w = g.sq.ring.at(idx);
    let Some(mut answer) = carried(qp, g, w, |req| peer.carry_out_unsent(req)) else {
        return false;
    };
    // Sent, in the requester's books, and answered at once.
    let (psn, npkts) = (g.req.psn, packets_for(w.length, g.mtu));
    let end = psn_add(psn, npkts);
    let w = g.sq.ring.at_mut(idx);
    (w.first_psn, w.last_psn) = (psn, psn_add(psn, npkts - 1));
    answer.psn = if answer.kind == Kind::Ack { w.last_psn } else { psn };
    if w.is_read_or_atomic() {
        g.req.rd_atomic_in_flight += 1;
    }
    g.sq.next = idx.wrapping_add(1);
    g.req.psn = end;
    g.req.unsent = Some(match g.req.unsent {
        Some(u) => Unsent { end, messages: u.messages + 1, ..u },
        None => Unsent { psn, end, messages: 1 },
    });
    completer::receive(qp, g, answer, drv);
    true
}

/// Carries out the UC WRITE at `idx`, the next to send, without sending it, if it is too long
/// to be sent whole (see `host::Node::whole`: it would go through the ring as fragments, in
/// several records from 60 KiB on), does not follow the QP's previous one closely (a stream's
/// are left to the peer's reader, whose copies run beside ours), and nothing we sent the peer
/// before is still to be taken in there (see `host::AbsentPeer::carry_out_ahead`): its bytes
/// placed in the peer's memory through our view of it or by system calls, checked as the
/// peer's responder would check them, and complete. Whether it did (if not, nothing changed).
/// Fragments are only the peer's reader's to take in: an application spinning on its memory
/// for the WRITE to land (qperf's `uc_rdma_write_poll_lat`, perftest's `ib_write_lat -c UC`)
/// waited for the end of its reader's nap, or for its woken reader to get the core it spins
/// on (~1 ms). The peer's responder hears nothing of it: a UC responder
/// takes whatever PSN comes next (IBA 9.8.3).
pub(crate) fn carry_out_ahead(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    drv: &mut Driver<'_>,
) -> bool {
    let w = g.sq.ring.at(idx);
    let Some(node) = drv.fabric.remote_node(g.attr.dest_qp_num) else { return false };
    if w.opcode != WrOpcode::RDMA_WRITE || node.whole(w.length as usize) || !drv.fabric.express() {
        return false;
    }
    if g.req.wrote_at.is_some_and(|t| t.elapsed() < PLACE_GAP) {
        return false;
    }
    let Some(peer) = absent_peer(g, drv, true) else { return false };
    if carried(qp, g, w, |req| peer.carry_out_ahead(req)).is_none() {
        return false;
    }
    g.req.wrote_at = Some(Instant::now());
    let (psn, npkts) = (g.req.psn, packets_for(w.length, g.mtu));
    let w = g.sq.ring.at_mut(idx);
    (w.first_psn, w.last_psn) = (psn, psn_add(psn, npkts - 1));
    g.sq.next = idx.wrapping_add(1);
    g.req.psn = psn_add(psn, npkts);
    completer::complete_ok(qp, g);
    true
}

/// Tells the peer of the requests carried out without being sent, if any: called before the
/// next request is sent, which the note must precede (its responder takes them in order).
pub(crate) fn note_unsent(qp: &QpShared, g: &mut QpInner, drv: &mut Driver<'_>) {
    let Some(u) = g.req.unsent.take() else { return };
    let mut note = Packet::new(Kind::Write);
    note.carried_out = true;
    (note.psn, note.npkts, note.msn) = (u.psn, u.end.wrapping_sub(u.psn) & PSN_MASK, u.messages);
    (note.src_dev, note.src_qpn, note.src_port) = (qp.device_index(), qp.qpn, g.attr.port_num);
    ((note.dst_dev, note.dst_port), note.dst_qpn) =
        (g.dest.unwrap_or_default(), g.attr.dest_qp_num);
    note.src_lid = g.port.lid;
    drv.send(&mut g.route, note);
}

/// Sends `pkt`, the request of the WQE at `idx`, and carries it out at once if it is a WRITE
/// the peer's reader looks absent for, and the peer's exports allow it: its bytes placed in
/// the peer's memory, its record marked so. A peer whose application spins on its memory for
/// the WRITE to land (`ib_write_lat`) leaves its reader, on the same core, the CPU only at the
/// end of a time slice (~70 us a round trip here, 3 us placed). A UC requester waits for
/// nothing, so no thread of ours would otherwise ever carry it out; an RC one, polling for
/// the ACK, would only after `fabric::host::LAG`.
///
/// UC: where its record is the oldest in our ring to the peer that is neither placed nor
/// begun (no earlier request of ours is still to land). RC: where nothing else of the QP's is
/// outstanding (a stream's requests are left to the reader, or to a lagging peer's
/// requester); it completes then, as for a lagging peer.
///
/// Each placement is a system call, where the records of a stream cost the reader, taking
/// them in one after another, a copy each. So a WRITE is only placed if its send found the
/// peer's reader asleep (and rang it, or held its bell: see [`holds_bell`]), or the QP's
/// previous WRITE was placed; and then only [`PLACE_GAP`] after the last such: a stream's
/// second WRITE ends the run. While such a run goes on, the peer's reader is not woken for
/// the records it only has to account for (until half its ring waits: see
/// `host::release_bell`).
pub(crate) fn send_placing(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    pkt: Packet,
    drv: &mut Driver<'_>,
) {
    let write = g.sq.ring.at(idx).opcode == WrOpcode::RDMA_WRITE;
    send_placing_as(qp, g, idx, pkt, drv, write);
    if write && qp.qp_type == QpType::UC {
        g.req.wrote_at = Some(Instant::now());
    }
}

/// [`send_placing`] of a WRITE (`write`) or another request.
fn send_placing_as(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    pkt: Packet,
    drv: &mut Driver<'_>,
    write: bool,
) {
    let run = std::mem::take(&mut g.req.placed_last);
    let alone = placing(qp, g, true) && write;
    if !run && !alone {
        drv.send(&mut g.route, pkt);
        host::rang_bell();
        return;
    }
    let hold = if run || alone && holds_bell(qp) { Hold::All } else { Hold::Napping };
    let send = || drv.send(&mut g.route, pkt);
    let (claimed, held) = match alone {
        true => host::holding_bell(hold, || host::claiming(send)),
        false => (None, host::holding_bell(hold, send).1),
    };
    let anyway = run || host::rang_bell() || held;
    let placed = place_alone(qp, g, idx, drv, claimed, anyway);
    if held {
        host::release_bell(!placed);
    }
}

/// Whether a WRITE sent alone, to be carried out next (see [`send_placing`]), holds the bell
/// of a peer's reader asleep too, ringing it only if the WRITE is not carried out: where the
/// application polled the QP's send CQ since its last such WRITE, as in a ping-pong
/// over memory (`ib_write_lat`: each side polls for its WRITE's completion, then spins on
/// its memory for the other's). Rung for each, the peer's reader took the record in only to
/// account for it, then watched its rings, on the core its application spun on: between two
/// pinned processes the 99th percentile of the round trip was ~20 us. A stream posts on
/// without polling (`ib_write_bw`, every hundred or so): its reader, rung at once, takes over
/// what follows, where held it left the requester to carry out every WRITE itself, at
/// about half the rate.
pub(crate) fn holds_bell(qp: &QpShared) -> bool {
    qp.send_cq.polled_since_asked()
}

/// Carries out the WRITE at `idx`, just sent alone (see [`send_placing`]), through our view
/// of the peer's memory if we have one; else by any means if `anyway` or the peer's reader is
/// not at work (see `Whole::placing`). Then settles its record if it was written `claimed`.
/// Whether it was carried out.
pub(super) fn place_alone(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    drv: &mut Driver<'_>,
    claimed: Option<Claimed>,
    anyway: bool,
) -> bool {
    let at = claimed.and_then(|c| c.at);
    let anyway = anyway || claimed.is_some_and(|c| c.unattended());
    let viewed = place_sent(qp, g, idx, drv, Placing::ThroughView, at);
    let placed = viewed || anyway && place_sent(qp, g, idx, drv, Placing::Any, at);
    g.req.placed_last = placed && !viewed;
    if let Some((c, node)) = claimed.zip(drv.fabric.remote_node(g.attr.dest_qp_num)) {
        node.settle(c, placed);
    }
    placed
}

/// Whether the QP's request just sent (the one at `g.sq.next - 1`) is alone, as
/// [`place_sent`] carries out only those: UC, or nothing else of the QP's outstanding.
fn alone(qp: &QpShared, g: &QpInner) -> bool {
    qp.qp_type == QpType::UC || g.sq.in_flight() == 1
}

/// Whether a WRITE of the QP, `sent` or about to be, is sent for its requester to carry out
/// next (see `host::Whole::placing`): alone (RC), or the first for [`PLACE_GAP`] (UC, whose
/// streams are left to the peer's reader).
pub(crate) fn placing(qp: &QpShared, g: &QpInner, sent: bool) -> bool {
    match qp.qp_type {
        QpType::UC => g.req.placed_at.is_none_or(|t| t.elapsed() >= PLACE_GAP),
        _ => g.sq.in_flight() == u32::from(sent),
    }
}

/// How [`place_sent`] may carry a WRITE out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placing {
    /// By system calls if need be: a WRITE whose send found the peer's reader asleep or
    /// napping on its application's looks (or that follows one so placed), [`PLACE_GAP`]
    /// after the last.
    Any,
    /// Only through our view of the peer's memory (one `memcpy`, less than the peer's
    /// reader spends taking the record in and answering it): any WRITE that is alone. A
    /// ping-pong of WRITEs whose processes also poll their CQs (`ib_write_lat`) keeps each
    /// reader napping unrung; without this its WRITEs waited for those naps.
    ThroughView,
}

/// See [`send_placing`]: whether the WQE at `idx` was carried out. (Out of line: the posts
/// it is called from are inlined where they are called.)
#[inline(never)]
pub(super) fn place_sent(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    drv: &mut Driver<'_>,
    how: Placing,
    claimed: Option<u32>,
) -> bool {
    let alone = alone(qp, g);
    if !alone || g.sq.ring.at(idx).opcode != WrOpcode::RDMA_WRITE || !drv.fabric.express() {
        return false;
    }
    if how == Placing::Any {
        let now = Instant::now();
        if g.req.placed_at.replace(now).is_some_and(|t| now - t < PLACE_GAP) {
            return false;
        }
    }
    let Some(mut peer) = absent_peer(g, drv, true) else { return false };
    peer.views_only = how == Placing::ThroughView;
    peer.claimed = claimed;
    // Alone, it follows no record the peer may be pulling: one it would pull is carried out
    // too (a large WRITE, through a view in one copy).
    peer.lagging = false;
    if qp.qp_type == QpType::UC {
        let w = g.sq.ring.at(idx);
        carried(qp, g, w, |req| peer.carry_out_first(w.first_psn, req)).is_some()
    } else {
        carry_out_to(qp, g, peer, drv) && g.sq.in_flight() == 0
    }
}

/// The peer of the QP, if it is a process on the host fabric that is stopped, or, if
/// `lagging`, one whose reader has taken nothing in for a while.
fn absent_peer(g: &QpInner, drv: &Driver<'_>, lagging: bool) -> Option<AbsentPeer> {
    let dest_qpn = g.attr.dest_qp_num;
    if g.wire_grh.is_some() || g.dest.is_none() {
        return None;
    }
    drv.fabric.remote_node(dest_qpn)?.absent_peer(dest_qpn, lagging)
}

/// Carries out the WQE `w` through `place` if it is an RDMA WRITE (without immediate) or READ
/// that `place` can carry out: the answer the peer would have sent, its PSN that of `w` as
/// sent.
fn carried(
    qp: &QpShared,
    g: &QpInner,
    w: &SendWqe,
    place: impl FnOnce(Request<'_>) -> bool,
) -> Option<Packet> {
    let (dev, _) = g.dest?;
    if w.hidden != Hidden::None || w.length > g.port.max_msg_sz {
        return None;
    }
    let dst = (dev, g.attr.dest_qp_num);
    let request = |op| Request {
        dst,
        src_qpn: qp.qpn,
        qp_type: qp.qp_type,
        rkey: w.rkey,
        va: w.remote_addr,
        op,
    };
    let mut answer = match w.opcode {
        WrOpcode::RDMA_WRITE => {
            let src = sources(qp, &w.sges, &w.inline, w.flags)?;
            if !place(request(Op::Write(&src))) {
                return None;
            }
            let mut ack = Packet::new(Kind::Ack);
            ack.psn = w.last_psn;
            ack
        }
        WrOpcode::RDMA_READ => {
            let mut data = Vec::new();
            if !place(request(Op::Read(&mut data, w.length as usize))) {
                return None;
            }
            let mut resp = Packet::new(Kind::ReadResponse);
            (resp.psn, resp.len) = (w.first_psn, w.length);
            resp.payload = Payload::Bytes(data.into());
            resp
        }
        _ => return None,
    };
    answer.syndrome = Syndrome::Ack;
    (answer.src_qpn, answer.dst_qpn) = (g.attr.dest_qp_num, qp.qpn);
    Some(answer)
}

/// Where a WRITE's bytes lie in this process, in order: its inline data, or its SGEs' memory
/// (`None` if an SGE is not usable: the WRITE then fails as the packet path fails it).
fn sources(
    qp: &QpShared,
    sges: &[crate::Sge],
    inline: &[u8],
    flags: SendFlags,
) -> Option<smallvec::SmallVec<[(u64, usize); 2]>> {
    if flags.contains(SendFlags::INLINE) {
        return Some(smallvec::smallvec![(inline.as_ptr() as u64, inline.len())]);
    }
    let payload = sgl::resolve(qp, sges, false).ok()?;
    let pieces = payload
        .ranges()
        .iter()
        .map(|m| (m.region.host_addr().wrapping_add(m.offset as u64), m.len));
    Some(pieces.collect())
}

//! The express lane: the commonest work request run with only the checks that can change
//! from one request to the next.
//!
//! A WRITE or SEND (with or without immediate) of one piece (inline bytes or one SGE) on an RC
//! or UC QP whose connection the express path proved ([`Lane`], kept on the QP until it is
//! modified or destroyed), and an RC READ or atomic into one SGE: this is what a benchmark's
//! or a test's loop posts millions of times. The lane makes the express path's decisions (`express::run`) for exactly these
//! requests, in the same order and with the same helpers, without the generality the others
//! need; any request it does not take, or finds it cannot finish, goes the general express
//! way (and from there to packets) untouched: the lane changes nothing before it is sure to
//! complete the request.

use std::sync::Arc;

use super::{
    completer,
    express::{self, Src},
    packets_for, psn_add,
    responder::{self, Arrival},
};
use crate::packet::Kind;
use crate::{
    fabric::FabricInner,
    qp::{
        QpInner, QpShared, SendWr,
        transport::{Lane, Replay},
    },
    types::{AccessFlags, QpState, QpType, SendFlags, Sge, WcFlags, WcOpcode, WrOpcode},
};

impl Lane {
    /// The connection of `qp` to its peer, if it is fit for the express path.
    pub(super) fn prove(qp: &Arc<QpShared>, g: &mut QpInner, f: &FabricInner) -> Option<Lane> {
        let dest = g.dest?;
        let dqpn = g.attr.dest_qp_num;
        if g.wire_grh.is_some() || f.remote_node(dqpn).is_some() {
            g.lane_across = true;
            return None;
        }
        let dst = g.route.resolve(f, dest.0, dqpn)?;
        let pairs = match qp.qp_type {
            QpType::XRC_SEND => dst.qp_type == QpType::XRC_RECV,
            ty => dst.qp_type == ty && dst.xrcd.is_none(),
        };
        if Arc::ptr_eq(&dst, qp) || !pairs {
            return None;
        }
        qp.lane_hint.point_at(&dst);
        Some(Lane { dst, dest })
    }
}

/// Runs `wr` on the QP's lane at the post if it can: its completion goes straight to the send
/// CQ. Whether it ran (if not, nothing changed).
#[inline]
pub(crate) fn post(qp: &Arc<QpShared>, g: &mut QpInner, wr: &SendWr<'_>, f: &FabricInner) -> bool {
    match wr.opcode {
        WrOpcode::RDMA_WRITE => post_plain::<false, false>(qp, g, wr, f),
        WrOpcode::RDMA_WRITE_WITH_IMM => post_plain::<false, true>(qp, g, wr, f),
        WrOpcode::SEND => post_plain::<true, false>(qp, g, wr, f),
        WrOpcode::SEND_WITH_IMM => post_plain::<true, true>(qp, g, wr, f),
        WrOpcode::ATOMIC_FETCH_AND_ADD | WrOpcode::ATOMIC_CMP_AND_SWP => post_atomic(qp, g, wr, f),
        WrOpcode::RDMA_READ => post_read(qp, g, wr, f),
        _ => false,
    }
}

/// [`post`] of a WRITE or a SEND (`SEND`), with immediate or not (`IMM`): one copy for each,
/// whose branches on what the opcode decides are gone.
#[inline(always)]
fn post_plain<const SEND: bool, const IMM: bool>(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    f: &FabricInner,
) -> bool {
    let imm = IMM.then_some(wr.imm_data);
    let flags = if IMM { WcFlags::WITH_IMM } else { WcFlags::empty() };
    let done = (if SEND { WcOpcode::SEND } else { WcOpcode::RDMA_WRITE }, flags);
    let Some(lane) = &g.lane else { return false };
    if !idle(g) {
        return false;
    }
    // What the post checks of the request, then what the express path checks of the QP.
    let (cap, inline) = (&qp.cap, wr.send_flags.contains(SendFlags::INLINE));
    if wr.sg_list.len() > cap.max_send_sge as usize {
        return false;
    }
    let len = match wr.sg_list {
        _ if inline && wr.inline_data.len() <= cap.max_inline_data as usize => {
            wr.inline_data.len() as u32
        }
        [sge] if !inline => sge.length,
        _ => return false,
    };
    let dest = lane.dest;
    if !open(qp, g, f, len, dest) {
        return false;
    }
    let Some(dst) = lane.peer() else { return false };
    let Some(mut dg) = dst.inner.try_lock() else { return false };
    let psn = g.req.psn;
    let kind = if SEND { Kind::Send } else { Kind::Write };
    let receives = SEND || IMM;
    if !express::takes(dst, &dg, qp.qp_type, psn, dest.1)
        || responder::refuses(&dg, kind, len, wr.remote_addr, 0)
        || receives && dst.srq.as_ref().is_some_and(|s| s.tm.is_some())
    {
        return false;
    }
    let lkeys = qp.ctx.device.keys.read();
    let Some(rkeys) = dst.ctx.device.keys.under(&lkeys) else { return false };
    let piece = match wr.sg_list {
        _ if inline => Src::Bytes(wr.inline_data),
        [sge] if sge.length == 0 => Src::Bytes(&[]),
        [sge] => match express::source(&lkeys, &qp.pd, sge) {
            Some(src) => src,
            None => return false,
        },
        _ => return false,
    };
    let target = match SEND {
        true => None,
        false => match express::remote_span(
            rkeys,
            &dst.pd,
            (wr.rkey, wr.remote_addr, len),
            AccessFlags::REMOTE_WRITE,
        ) {
            Some(t) => t,
            None => return false,
        },
    };
    if receives {
        let pd = responder::own_recv_pd(dst);
        // By value (`move`): captured by reference, the piece and the target were laid out
        // on the stack for every request (~20 instructions, when one copy of the lane served
        // every opcode).
        let place = move |sges: &[Sge]| {
            let copied = match (target, SEND, sges) {
                (Some(span), _, _) => express::copy_into(piece, span),
                (None, false, _) => true,
                (None, true, _) => express::scatter(rkeys, pd, sges, len)
                    .is_some_and(|into| into.fill(rkeys, sges, piece, len)),
            };
            copied.then_some(())
        };
        let Some(wr_id) = express::take_recv(dst, &mut dg, place) else { return false };
        let arrival = Arrival {
            len,
            imm,
            inv: None,
            src_lid: g.port.lid,
            solicited: wr.send_flags.contains(SendFlags::SOLICITED),
        };
        let opcode = if SEND { WcOpcode::RECV } else { WcOpcode::RECV_RDMA_WITH_IMM };
        responder::complete_arrival(dst, &mut dg, &arrival, opcode, wr_id);
    } else if let Some(span) = target
        && !express::copy_into(piece, span)
    {
        return false;
    }
    drop(lkeys);
    let npkts = packets_for(len, g.mtu);
    dg.resp.nak_seq_sent = false;
    responder::advance_past(&mut dg, psn, npkts);
    drop(dg);
    g.req.psn = psn_add(psn, npkts);
    completer::send_done_as(qp, wr.wr_id, done, wr.send_flags, len);
    completer::progressed(g);
    true
}

/// Whether the QP may run a request at its post: in RTS, with nothing queued before it and no
/// RNR wait (as `express::post` asks).
#[inline(always)]
fn idle(g: &QpInner) -> bool {
    g.state == QpState::RTS && g.sq.head == g.sq.tail && g.req.rnr_until.is_none()
}

/// Whether a message of `len` bytes may go to the lane's peer at `dest` now (as `express::run`
/// asks): no longer than the port takes, the express path on, both ports up.
#[inline(always)]
fn open(qp: &QpShared, g: &QpInner, f: &FabricInner, len: u32, dest: (u32, u8)) -> bool {
    len <= g.port.max_msg_sz
        && (f.express_all_up()
            || f.express() && f.ports_up((qp.device_index(), g.attr.port_num), dest))
}

/// An RC FETCH_ADD or CMP_SWP into one result SGE, of an aligned remote word, run at the post
/// as `express::run` runs it (the same checks in the same order, the same helper); anything
/// else goes its way. (Out of line: the WRITE's lane stays as small as it was.)
#[inline(never)]
fn post_atomic(qp: &Arc<QpShared>, g: &mut QpInner, wr: &SendWr<'_>, f: &FabricInner) -> bool {
    let Some(lane) = &g.lane else { return false };
    let ([sge], false) = (wr.sg_list, wr.send_flags.contains(SendFlags::INLINE)) else {
        return false;
    };
    // UC carries no atomics (the packet path fails them); a misaligned one is the post's or
    // the responder's to refuse.
    if qp.qp_type != QpType::RC
        || qp.cap.max_send_sge == 0
        || !idle(g)
        || g.attr.max_rd_atomic == 0
        || sge.length < 8
        || wr.remote_addr & 7 != 0
        || !open(qp, g, f, sge.length, lane.dest)
    {
        return false;
    }
    let Some(dst) = lane.peer() else { return false };
    let Some(mut dg) = dst.inner.try_lock() else { return false };
    let (psn, cas) = (g.req.psn, wr.opcode == WrOpcode::ATOMIC_CMP_AND_SWP);
    let kind = if cas { Kind::CompareSwap } else { Kind::FetchAdd };
    if !express::takes(dst, &dg, qp.qp_type, psn, lane.dest.1)
        || responder::refuses(&dg, kind, sge.length, wr.remote_addr, 0)
    {
        return false;
    }
    let lkeys = qp.ctx.device.keys.read();
    let Some(rkeys) = dst.ctx.device.keys.under(&lkeys) else { return false };
    let target = (&dst.pd, wr.rkey, wr.remote_addr);
    let op = (cas, wr.compare_add, wr.swap);
    let Some(orig) = express::atomic((&lkeys, &qp.pd, wr.sg_list), (rkeys, target), op) else {
        return false;
    };
    drop(lkeys);
    responder::remember(&mut dg, Replay::Atomic { psn, orig });
    dg.resp.nak_seq_sent = false;
    responder::advance_past(&mut dg, psn, 1);
    drop(dg);
    g.req.psn = psn_add(psn, 1);
    let opcode = if cas { WcOpcode::COMP_SWAP } else { WcOpcode::FETCH_ADD };
    completer::send_done_as(qp, wr.wr_id, (opcode, WcFlags::empty()), wr.send_flags, sge.length);
    completer::progressed(g);
    true
}

/// An RC READ into one SGE, run at the post as `express::run` runs it: the remote range
/// checked for REMOTE_READ, the SGE for LOCAL_WRITE, the bytes copied, the READ remembered for
/// a duplicate to be answered from; anything else goes its way. (Out of line, as the atomics'.)
#[inline(never)]
fn post_read(qp: &Arc<QpShared>, g: &mut QpInner, wr: &SendWr<'_>, f: &FabricInner) -> bool {
    let Some(lane) = &g.lane else { return false };
    // (A READ carries no inline data: one with the flag is the post's to judge.)
    let ([sge], false) = (wr.sg_list, wr.send_flags.contains(SendFlags::INLINE)) else {
        return false;
    };
    // UC carries no READ (the packet path fails it).
    let len = sge.length;
    if qp.qp_type != QpType::RC
        || qp.cap.max_send_sge == 0
        || !idle(g)
        || g.attr.max_rd_atomic == 0
        || !open(qp, g, f, len, lane.dest)
    {
        return false;
    }
    let Some(dst) = lane.peer() else { return false };
    let Some(mut dg) = dst.inner.try_lock() else { return false };
    let psn = g.req.psn;
    if !express::takes(dst, &dg, qp.qp_type, psn, lane.dest.1)
        || responder::refuses(&dg, Kind::ReadRequest, len, wr.remote_addr, 0)
    {
        return false;
    }
    let lkeys = qp.ctx.device.keys.read();
    let Some(rkeys) = dst.ctx.device.keys.under(&lkeys) else { return false };
    let remote = (wr.rkey, wr.remote_addr, len);
    let Some(source) = express::remote_span(rkeys, &dst.pd, remote, AccessFlags::REMOTE_READ)
    else {
        return false;
    };
    if let Some(source) = source {
        let Some(into) = express::local_span(&lkeys, &qp.pd, sge, true) else { return false };
        if !express::copy_into(Src::Span(source), into) {
            return false;
        }
    }
    drop(lkeys);
    let npkts = packets_for(len, g.mtu);
    responder::remember(&mut dg, Replay::read(psn, npkts, wr.remote_addr, wr.rkey, len));
    dg.resp.nak_seq_sent = false;
    responder::advance_past(&mut dg, psn, npkts);
    drop(dg);
    g.req.psn = psn_add(psn, npkts);
    let done = (WcOpcode::RDMA_READ, WcFlags::empty());
    completer::send_done_as(qp, wr.wr_id, done, wr.send_flags, len);
    completer::progressed(g);
    true
}

#[cfg(test)]
mod test {
    use crate::{engine::testkit, *};

    fn lock_of(qp: &Qp) -> usize {
        &qp.0.inner as *const _ as usize
    }

    /// A QP's hint leads to the peer its lane runs to, once a post proved the lane; a QP
    /// reconnected to another peer drops it rather than prefetch the old peer's lines.
    #[test]
    fn the_hint_follows_the_first_lane_and_is_dropped_when_the_lane_moves() {
        let (f, a, b) = testkit::pair();
        assert_eq!(a.qp.0.lane_hint.points_at(), None, "no lane yet");
        let src = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        let wr = SendWr::write(1, &src, b.mr.addr(), b.mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        assert_eq!(a.cq.poll_one().unwrap().status, WcStatus::SUCCESS);
        assert_eq!(a.qp.0.lane_hint.points_at(), Some(lock_of(&b.qp)));

        let c = testkit::side(&f.devices()[1]);
        let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
        a.qp.modify(&reset, QpAttrMask::STATE).unwrap();
        a.qp.connect(100, &c.qp.endpoint(300), &RcParams::default()).unwrap();
        c.qp.connect(300, &a.qp.endpoint(100), &RcParams::default()).unwrap();
        let wr = SendWr::write(2, &src, c.mr.addr(), c.mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        assert_eq!(a.cq.poll_one().unwrap().status, WcStatus::SUCCESS);
        assert_eq!(a.qp.0.lane_hint.points_at(), None, "the old peer's lines are left alone");
    }
}

//! The completer (after `rxe_comp.c`): matches ACKs, NAKs and responses to outstanding WQEs,
//! completes them in order, and decides on retries.

use std::sync::Arc;

use super::{
    Driver, PSN_MASK, enter_error, psn_add, psn_diff, requester, rnr_delay_ns,
    sgl::{self, SglError},
    wc, wc_ok,
};
use crate::packet::{Kind, NakCode, Packet, Payload, Syndrome};
use crate::{
    qp::{QpInner, QpShared},
    types::{QpState, SendFlags, WcFlags, WcOpcode, WcStatus, WrOpcode},
};

/// Handles a response packet (ACK/NAK, READ response, atomic ACK).
pub(crate) fn receive(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if !matches!(g.state, QpState::RTS | QpState::SQD | QpState::SQE) {
        return;
    }
    if pkt.gap {
        // A READ response whose first packets were lost on a wire: the READ is retried at
        // once, as rxe retries on a response PSN past the one it expects.
        let tail = (g.sq.in_flight() > 0).then(|| g.sq.ring.at(g.sq.tail));
        if tail.is_some_and(|w| w.is_read_or_atomic() && psn_diff(pkt.psn, w.first_psn) > 0) {
            retry_once(qp, g);
        }
        return;
    }
    let before = psn_add(pkt.psn, PSN_MASK);
    match (pkt.kind, pkt.syndrome) {
        (Kind::Ack, Syndrome::Ack) => ack_through(qp, g, pkt.psn),
        (Kind::Ack, Syndrome::Rnr(timer)) => {
            ack_through(qp, g, before);
            if tail_holds(g, pkt.psn) {
                rnr(qp, g, timer, drv);
            }
        }
        (Kind::Ack, Syndrome::Nak(NakCode::PsnSequenceError)) => {
            ack_through(qp, g, before);
            if g.sq.in_flight() > 0 {
                retry_once(qp, g);
            }
        }
        (Kind::Ack, Syndrome::Nak(code)) => {
            ack_through(qp, g, before);
            if tail_holds(g, pkt.psn) {
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::REM_INV_REQ_ERR,
                    NakCode::RemoteAccessError => WcStatus::REM_ACCESS_ERR,
                    _ => WcStatus::REM_OP_ERR,
                };
                fail_wqe(qp, g, g.sq.tail, status);
            }
        }
        (Kind::ReadResponse | Kind::AtomicAck, _) => {
            ack_through(qp, g, before);
            if g.sq.in_flight() == 0 || g.sq.ring.at(g.sq.tail).first_psn != pkt.psn {
                return; // a duplicate of a response already taken
            }
            let tail = g.sq.tail;
            let wqe = g.sq.ring.at(tail);
            let data = match (pkt.kind, wqe.opcode) {
                (Kind::ReadResponse, WrOpcode::RDMA_READ) => pkt.payload,
                (
                    Kind::AtomicAck,
                    WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD,
                ) => Payload::Bytes(pkt.orig.to_ne_bytes().as_slice().into()),
                _ => {
                    fail_wqe(qp, g, tail, WcStatus::BAD_RESP_ERR);
                    return;
                }
            };
            let len = if pkt.kind == Kind::AtomicAck { 8 } else { pkt.len };
            match sgl::scatter(&qp.pd, &wqe.sges, &data, len) {
                Ok(()) => complete_ok(qp, g),
                Err(SglError::Protection | SglError::TooLong) => {
                    fail_wqe(qp, g, tail, WcStatus::LOC_PROT_ERR)
                }
            }
        }
        _ => {}
    }
}

/// Whether the oldest outstanding WQE is the one the response at `psn` is about.
fn tail_holds(g: &QpInner, psn: u32) -> bool {
    if g.sq.in_flight() == 0 {
        return false;
    }
    let w = g.sq.ring.at(g.sq.tail);
    psn_diff(psn, w.first_psn) >= 0 && psn_diff(psn, w.last_psn) <= 0
}

/// Completes, in order, every SEND/WRITE WQE whose last PSN is at or before `psn`. A READ or
/// atomic reached this way lost its response: that is an implicit NAK, and the requester
/// retransmits from it.
pub(crate) fn ack_through(qp: &Arc<QpShared>, g: &mut QpInner, psn: u32) {
    while g.sq.in_flight() > 0 {
        let w = g.sq.ring.at(g.sq.tail);
        if psn_diff(w.last_psn, psn) > 0 {
            break;
        }
        if w.is_read_or_atomic() {
            retry_once(qp, g);
            break;
        }
        complete_ok(qp, g);
    }
}

/// For work the device queued itself ([`Hidden`]): its completion, which never goes to the
/// send CQ (a rendezvous READ completes its tag on the receive CQ, with `status`); whether `w`
/// was such work.
fn hidden_done(qp: &QpShared, w: &crate::qp::queue::SendWqe, status: WcStatus) -> bool {
    use crate::qp::queue::Hidden;
    match w.hidden {
        Hidden::None => false,
        Hidden::RndvRead { wr_id } => {
            let mut c = wc_ok(qp, wr_id, WcOpcode::TM_RECV, w.length, WcFlags::TM_DATA_VALID);
            c.status = status;
            let _ = qp.recv_cq.push(c, false);
            true
        }
        Hidden::Fin => true,
    }
}

/// Completes the tail WQE successfully and records forward progress.
pub(crate) fn complete_ok(qp: &QpShared, g: &mut QpInner) {
    let tail = g.sq.tail;
    let w = g.sq.ring.at(tail);
    if w.is_read_or_atomic() {
        g.req.rd_atomic_in_flight -= 1;
    }
    if hidden_done(qp, w, WcStatus::SUCCESS) {
        // Completed where it belongs.
    } else {
        send_done(qp, w.wr_id, w.opcode, w.flags, w.length);
    }
    g.sq.tail = tail.wrapping_add(1);
    progressed(g);
}

/// The requester made progress: the retry budgets start afresh and the ACK deadline is
/// gone (or, where it outlives its requests, no longer a timeout when it passes: see
/// `requester::lazy_deadline`).
pub(crate) fn progressed(g: &mut QpInner) {
    g.req.retry_started = false;
    g.req.retry_left = g.attr.retry_cnt;
    g.req.rnr_retry_left = g.attr.rnr_retry;
    if requester::lazy_deadline(g) {
        g.req.progressed_since = true;
    } else {
        g.req.retrans_at = None;
    }
}

/// The successful completion of the application's send WR `wr_id`, if it is signaled.
pub(crate) fn send_done(qp: &QpShared, wr_id: u64, op: WrOpcode, flags: SendFlags, len: u32) {
    send_done_as(qp, wr_id, completed_as(op), flags, len);
}

/// The opcode and flags of a send WR's completion.
#[inline]
fn completed_as(op: WrOpcode) -> (WcOpcode, WcFlags) {
    match op {
        WrOpcode::SEND | WrOpcode::SEND_WITH_INV => (WcOpcode::SEND, WcFlags::empty()),
        WrOpcode::BIND_MW => (WcOpcode::BIND_MW, WcFlags::empty()),
        WrOpcode::LOCAL_INV => (WcOpcode::LOCAL_INV, WcFlags::empty()),
        WrOpcode::SEND_WITH_IMM => (WcOpcode::SEND, WcFlags::WITH_IMM),
        WrOpcode::RDMA_WRITE => (WcOpcode::RDMA_WRITE, WcFlags::empty()),
        WrOpcode::RDMA_WRITE_WITH_IMM => (WcOpcode::RDMA_WRITE, WcFlags::WITH_IMM),
        WrOpcode::RDMA_READ => (WcOpcode::RDMA_READ, WcFlags::empty()),
        WrOpcode::ATOMIC_CMP_AND_SWP => (WcOpcode::COMP_SWAP, WcFlags::empty()),
        WrOpcode::ATOMIC_WRITE => (WcOpcode::ATOMIC_WRITE, WcFlags::empty()),
        WrOpcode::FLUSH => (WcOpcode::FLUSH, WcFlags::empty()),
        WrOpcode::TSO => (WcOpcode::TSO, WcFlags::empty()),
        _ => (WcOpcode::FETCH_ADD, WcFlags::empty()),
    }
}

/// [`send_done`] of a request whose completion's opcode and flags the caller knows already
/// (the lane's, which told its opcodes apart to run them).
#[inline]
pub(crate) fn send_done_as(
    qp: &QpShared,
    wr_id: u64,
    (opcode, wc_flags): (WcOpcode, WcFlags),
    flags: SendFlags,
    len: u32,
) {
    if qp.sq_sig_all || flags.contains(SendFlags::SIGNALED) {
        // A lost send completion (CQ overrun) does not stop the QP, as in rxe.
        let _ = qp.send_cq.push(wc_ok(qp, wr_id, opcode, len, wc_flags), false);
    }
}

/// Completes the tail WQE with `status` and leaves the QP as it is (a UD send that failed
/// alone).
pub(crate) fn complete_err(qp: &QpShared, g: &mut QpInner, status: WcStatus) {
    let w = g.sq.ring.at(g.sq.tail);
    if !hidden_done(qp, w, status) {
        let _ = qp.send_cq.push(wc(qp, w.wr_id, status), false);
    }
    g.sq.tail = g.sq.tail.wrapping_add(1);
}

/// Completes the WQE at `idx` (the oldest outstanding, or the next to send) with `status`
/// and moves the QP to ERR, flushing the rest.
pub(crate) fn fail_wqe(qp: &Arc<QpShared>, g: &mut QpInner, idx: u32, status: WcStatus) {
    debug_assert_eq!(idx, g.sq.tail, "WQEs fail in order");
    let w = g.sq.ring.at(idx);
    if !hidden_done(qp, w, status) {
        let _ = qp.send_cq.push(wc(qp, w.wr_id, status), false);
    }
    g.sq.tail = idx.wrapping_add(1);
    if g.sq.next == idx {
        g.sq.next = g.sq.tail;
    }
    enter_error(qp, g);
}

/// Completes every WQE left on the send queue with `IBV_WC_WR_FLUSH_ERR`.
pub(crate) fn flush_send_queue(qp: &QpShared, g: &mut QpInner) {
    while g.sq.tail != g.sq.head {
        let w = g.sq.ring.at(g.sq.tail);
        if !hidden_done(qp, w, WcStatus::WR_FLUSH_ERR) {
            let _ = qp.send_cq.push(wc(qp, w.wr_id, WcStatus::WR_FLUSH_ERR), false);
        }
        g.sq.tail = g.sq.tail.wrapping_add(1);
    }
    g.sq.next = g.sq.tail;
    g.req.rd_atomic_in_flight = 0;
    g.req.failed = None;
}

/// Resends from the oldest outstanding WQE, or fails it with `IBV_WC_RETRY_EXC_ERR` once
/// `retry_cnt` retries are spent (IBA 9.7.6.1.3; unlike rxe, 7 means seven retries).
pub(crate) fn retry(qp: &Arc<QpShared>, g: &mut QpInner) {
    if g.req.retry_left == 0 {
        fail_wqe(qp, g, g.sq.tail, WcStatus::RETRY_EXC_ERR);
        return;
    }
    g.req.retry_left -= 1;
    g.req.retry_started = true;
    rewind(g);
}

/// [`retry`] for what a packet implies (a NAK, a response past a lost one), unless a retry
/// is already under way: the packets of several READs in flight that all follow a lost
/// response would otherwise spend one retry each, and the whole budget at once.
fn retry_once(qp: &Arc<QpShared>, g: &mut QpInner) {
    if !g.req.retry_started {
        retry(qp, g);
    }
}

/// After an RNR NAK: wait the responder's RNR timer, then resend; or fail with
/// `IBV_WC_RNR_RETRY_EXC_ERR` when `rnr_retry` retries are spent (7 = retry forever).
fn rnr(qp: &Arc<QpShared>, g: &mut QpInner, timer: u8, drv: &mut Driver<'_>) {
    if g.req.rnr_retry_left == 0 {
        fail_wqe(qp, g, g.sq.tail, WcStatus::RNR_RETRY_EXC_ERR);
        return;
    }
    if g.req.rnr_retry_left != 7 {
        g.req.rnr_retry_left -= 1;
    }
    rewind(g);
    g.req.rnr_until = Some(drv.now() + rnr_delay_ns(timer));
}

/// Makes the oldest outstanding WQE the next to send, with its original PSN.
fn rewind(g: &mut QpInner) {
    g.sq.next = g.sq.tail;
    if g.sq.tail != g.sq.head {
        g.req.psn = g.sq.ring.at(g.sq.tail).first_psn;
    }
    g.req.rd_atomic_in_flight = 0;
    g.req.retrans_at = None;
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::{
        SendWr, Sge,
        engine::testkit::{feed, request, unanswered_pair},
    };

    /// Three WRITEs sent while the peer is unreachable (RESET): all in flight, PSNs 100..102.
    fn three_in_flight()
    -> (crate::Fabric, crate::engine::testkit::Side, crate::engine::testkit::Side) {
        let (f, a, b) = unanswered_pair();
        let s = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        for i in 0..3 {
            a.qp.post_send(&SendWr::write(i, &s, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
        }
        assert_eq!(a.qp.0.inner.lock().sq.in_flight(), 3);
        (f, a, b)
    }

    fn ack(
        a: &crate::engine::testkit::Side,
        b: &crate::engine::testkit::Side,
        psn: u32,
        s: Syndrome,
    ) {
        let mut p = request(Kind::Ack, &b.qp, &a.qp, psn);
        p.syndrome = s;
        feed(&a.qp, &b.qp, p);
    }

    #[test]
    fn test_check_ack_completes_in_order_through_the_acked_psn() {
        let (_f, a, b) = three_in_flight();
        ack(&a, &b, 101, Syndrome::Ack);
        let ids: Vec<u64> = std::iter::from_fn(|| a.cq.poll_one()).map(|w| w.wr_id).collect();
        assert_eq!(ids, vec![0, 1], "a coalesced ACK completes every WQE it covers");
        ack(&a, &b, 100, Syndrome::Ack);
        assert_eq!(a.cq.poll_one(), None, "a stale ACK changes nothing");
    }

    #[test]
    fn test_error_retry_psn_sequence_nak_rewinds_and_spends_a_retry() {
        let (_f, a, b) = three_in_flight();
        ack(&a, &b, 101, Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(a.cq.poll_one().map(|w| w.wr_id), Some(0), "implicitly acked");
        let g = a.qp.0.inner.lock();
        // The resend went out at once (and was lost again): PSNs 101, 102 were reused.
        assert_eq!(g.req.psn, 103);
        assert_eq!(g.req.retry_left, 6);
        assert_eq!(g.sq.in_flight(), 2);
    }

    #[test]
    fn test_responses_past_a_lost_one_start_one_retry_not_one_each() {
        let (_f, a, b) = unanswered_pair();
        let s = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        for i in 0..3 {
            a.qp.post_send(&SendWr::read(i, &s, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
        }
        assert_eq!(a.qp.0.inner.lock().sq.in_flight(), 3, "three READs, PSNs 100..102");
        // The response to the first was lost; those to the second and third arrive.
        for psn in [101, 102] {
            let mut p = request(Kind::ReadResponse, &b.qp, &a.qp, psn);
            (p.len, p.payload) = (8, crate::engine::testkit::bytes(&[7; 8]));
            feed(&a.qp, &b.qp, p);
        }
        assert_eq!(a.qp.0.inner.lock().req.retry_left, 6, "one retry for the one loss");
        assert_eq!(a.cq.poll_one(), None);
        // The retried first READ's response completes it, and the budget is whole again.
        let mut p = request(Kind::ReadResponse, &b.qp, &a.qp, 100);
        (p.len, p.payload) = (8, crate::engine::testkit::bytes(&[7; 8]));
        feed(&a.qp, &b.qp, p);
        assert_eq!(a.cq.poll_one().map(|w| (w.wr_id, w.status)), Some((0, WcStatus::SUCCESS)));
        let g = a.qp.0.inner.lock();
        assert_eq!((g.req.retry_left, g.req.retry_started), (7, false));
    }

    #[test]
    fn test_a_read_response_missing_its_first_packets_retries_the_read_at_once() {
        let (_f, a, b) = unanswered_pair();
        // 4 KiB at the path MTU of 1 KiB.
        let s = [Sge { addr: a.mr.addr(), length: 4096, lkey: a.mr.lkey() }];
        a.qp.post_send(&SendWr::read(0, &s, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
        assert_eq!(a.qp.0.inner.lock().req.psn, 104, "a READ of four response packets from 100");
        let mut p = request(Kind::ReadResponse, &b.qp, &a.qp, 102);
        p.gap = true;
        feed(&a.qp, &b.qp, p);
        let g = a.qp.0.inner.lock();
        assert_eq!((g.req.retry_left, g.req.psn), (6, 104), "retried (and resent) at once");
    }

    #[test]
    fn test_rnr_retry_waits_then_resends() {
        let (_f, a, b) = three_in_flight();
        ack(&a, &b, 100, Syndrome::Rnr(1));
        let g = a.qp.0.inner.lock();
        assert!(g.req.rnr_until.is_some());
        assert_eq!(g.sq.in_flight(), 0, "rewound: nothing is in flight during the wait");
        assert_eq!(g.req.psn, 100);
        assert_eq!(g.req.rnr_retry_left, 7, "7 means retry forever");
    }

    #[test]
    fn test_nak_remote_access_fails_the_wqe_and_flushes_the_rest() {
        let (_f, a, b) = three_in_flight();
        ack(&a, &b, 100, Syndrome::Nak(NakCode::RemoteAccessError));
        let st: Vec<WcStatus> = std::iter::from_fn(|| a.cq.poll_one()).map(|w| w.status).collect();
        assert_eq!(
            st,
            vec![WcStatus::REM_ACCESS_ERR, WcStatus::WR_FLUSH_ERR, WcStatus::WR_FLUSH_ERR]
        );
        assert_eq!(a.qp.state(), QpState::ERR);
    }

    #[test]
    fn test_response_to_a_non_read_wqe_is_a_bad_response() {
        let (_f, a, b) = three_in_flight();
        let p = request(Kind::ReadResponse, &b.qp, &a.qp, 100);
        feed(&a.qp, &b.qp, p);
        assert_eq!(a.cq.poll_one().map(|w| w.status), Some(WcStatus::BAD_RESP_ERR));
    }
}

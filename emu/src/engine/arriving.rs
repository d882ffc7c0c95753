//! A small SEND, RDMA WRITE, READ or atomic from another process, taken in straight from the
//! ring record it came in: the responder half of the express lane (`lane`), for a requester that
//! is not here; and the responses to ours.
//!
//! Through the packet path such a SEND is decoded into a packet, its payload copied out of the
//! record, the packet handed to the responder, which copies the payload again into the receive WQE
//! and sends the ACK. Here the record's header is read where it lies, the payload copied once, from
//! the record into the WQE's buffer, and the ACK written in its short form (one for a run of them
//! taken in at once: [`OwedAck`]). It is taken so only where the responder would do exactly that:
//! an RC or UC QP of the SEND's transport, idle (its lock free, nothing in its inbox, nothing
//! unsent on its send queue), the SEND the next it expects, a receive posted whose SGEs hold it, no
//! tag matching, and nothing that must see packets (fault rules, a packet trace). Everything is
//! checked before anything changes; anything else goes the packet path untouched, which gives it
//! its RNR, its NAK, its error completion and its events. A WRITE is taken so when its rkey names
//! an MR of the QP's PD (not a window, not on-demand memory) that grants the remote write and holds
//! its range, and, with immediate, a receive is posted (no tag matching); its record is begun only
//! then, right before its copy, as the packet path begins it (its sender may have carried it out
//! meanwhile: then it is only accounted for, as there).
//!
//! A READ request (of less than 16 KiB: `host::Node::whole`) is taken so when its rkey names
//! such an MR granting the remote read: its record begun, the range is read straight into the
//! record of its response, written to the requester's ring as the packet path's response
//! would be. An atomic likewise (its word aligned in memory), executed once, its answer
//! written straight into a record.
//!
//! For the requester, an ACK in its short form and a READ's or atomic's response are taken in
//! the same way: an RC QP in RTS, idle, completes what the ACK acknowledges, or places the
//! response in the READ or atomic it answers (its oldest outstanding WQE, whose SGEs take it),
//! as `completer::receive` does, without a packet; the requester is serviced after it only
//! where anything is left for it to do.

use std::sync::Arc;

use super::{
    Driver, PSN_MASK, ack_route, completer,
    express::{self, Src},
    psn_add,
    responder::{self, Arrival},
};
use crate::packet::Kind;
use crate::qp::transport::Replay;
use crate::{
    fabric::{
        FabricInner,
        host::{Node, Whole},
    },
    qp::{QpInner, QpShared},
    sync::lock::LockGuard,
    types::{AccessFlags, QpState, QpType, Sge, WcOpcode, WrOpcode},
    wire::{self, Ack, Op, RequestHead},
};

/// The QP `qp` of `m`'s transport, locked, if it takes `m` as its next request now and
/// grants the access it asks for (a refused one is the packet path's to NAK), with the node
/// its ACK or answer goes to (RC) — known before anything changes, so that nothing fails after.
#[inline(always)]
fn taker<'q, 'f>(
    qp: &'q Arc<QpShared>,
    f: &'f FabricInner,
    m: &RequestHead,
) -> Option<(LockGuard<'q, QpInner>, Option<&'f Node>)> {
    if !matches!(qp.qp_type, QpType::RC | QpType::UC) || m.transport != qp.qp_type {
        return None;
    }
    let ack_to = match qp.qp_type {
        QpType::RC => Some(ack_route(f, m.dst, m.src)?),
        _ => f.express().then_some(None)?,
    };
    let (kind, va) = match m.op {
        Op::Write(va, _) => (Kind::Write, va),
        Op::Read(va, _) => (Kind::ReadRequest, va),
        Op::Atomic(a) => (a.kind(), a.va),
        _ => (Kind::Send, 0),
    };
    let g = qp.inner.try_lock()?;
    let next = express::takes(qp, &g, qp.qp_type, m.psn, m.dst.1)
        && g.sq.next == g.sq.head
        && !responder::refuses(&g, kind, m.len, va, 0);
    next.then_some((g, ack_to))
}

/// The ACK owed for the SENDs and WRITEs a batch of records took in, to the node `to`: one
/// for a run of them between one pair of QPs (of at most [`OwedAck::RUN`]), sent when the
/// batch takes in anything else or ends ([`OwedAck::pay`]). An ACK acknowledges every PSN up
/// to its own, so the run's last one stands for all (the packet path's requester takes a run
/// of ACKs so too).
#[derive(Debug)]
pub(crate) struct OwedAck<'f> {
    to: &'f Node,
    ack: Ack,
    /// The messages it acknowledges.
    run: u32,
}

impl OwedAck<'_> {
    /// The most messages one ACK owed acknowledges: a long batch (a ring full of small
    /// messages) still acknowledges as it goes, well inside any requester's ACK timeout.
    pub(crate) const RUN: u32 = 64;

    /// Sends the ACK owed, if any.
    #[inline]
    pub(crate) fn pay(owed: &mut Option<OwedAck<'_>>) {
        if let Some(o) = owed.take() {
            o.to.send_ack(&o.ack);
        }
    }

    /// The ACK owed, to be sent later (see the host fabric's `Rx::deferred`).
    pub(crate) fn into_ack(self) -> Ack {
        self.ack
    }
}

/// The request `m` was executed: the next PSN expected, and its ACK owed if `ack_to` (a
/// SEND's or WRITE's on RC; a READ's or atomic's answer acknowledges it), replacing one owed
/// between the same QPs (which it acknowledges too) or paying one owed between others first.
#[inline(always)]
fn done<'f>(
    g: &mut QpInner,
    m: &RequestHead,
    ack_to: Option<&'f Node>,
    owed: &mut Option<OwedAck<'f>>,
) {
    g.resp.nak_seq_sent = false;
    responder::advance_past(g, m.psn, m.npkts);
    if let Some(to) = ack_to {
        let psn = psn_add(m.psn, m.npkts - 1);
        let ack = Ack { src: m.dst, dst: m.src, psn, msn: g.resp.msn };
        let run = match owed {
            Some(o) if (o.ack.src, o.ack.dst) == (ack.src, ack.dst) && o.run < OwedAck::RUN => {
                o.run + 1
            }
            _ => {
                OwedAck::pay(owed);
                1
            }
        };
        *owed = Some(OwedAck { to, ack, run });
    }
}

/// Takes the SEND `m` (its `payload` the record's bytes) into our QP `qp`, the QP it names, if
/// it can (see the module's text), its ACK left `owed` (see [`OwedAck`]). Whether it did; if
/// not, nothing changed.
pub(crate) fn send<'f>(
    qp: &Arc<QpShared>,
    f: &'f FabricInner,
    m: &RequestHead,
    payload: &[u8],
    owed: &mut Option<OwedAck<'f>>,
) -> bool {
    if qp.srq.as_ref().is_some_and(|s| s.tm.is_some()) {
        return false;
    }
    let Some((mut g, ack_to)) = taker(qp, f, m) else { return false };
    let keys = qp.ctx.device.keys.read();
    let pd = responder::own_recv_pd(qp);
    let place = |sges: &[Sge]| {
        express::scatter(&keys, pd, sges, m.len)
            .is_some_and(|into| into.fill(&keys, sges, express::Src::Bytes(payload), m.len))
            .then_some(())
    };
    let Some(wr_id) = express::take_recv(qp, &mut g, place) else { return false };
    drop(keys);
    let arrival =
        Arrival { len: m.len, imm: m.imm, inv: None, src_lid: m.src_lid, solicited: m.solicited };
    responder::complete_arrival(qp, &mut g, &arrival, WcOpcode::RECV, wr_id);
    done(&mut g, m, ack_to, owed);
    true
}

/// Takes the WRITE `m` (its `payload` the record's bytes) into our QP `qp`, the QP it names,
/// if it can (see the module's text), its ACK left `owed` (see [`OwedAck`]); `begin` begins
/// the record's request: whether its sender carried it out already. With immediate, it
/// consumes a receive, which completes with the length written (its buffer untouched).
/// Whether it did; if not, nothing changed but the record begun, which the packet path then
/// finds begun.
pub(crate) fn write<'f>(
    qp: &Arc<QpShared>,
    f: &'f FabricInner,
    m: &RequestHead,
    payload: &[u8],
    begin: impl FnOnce() -> bool,
    owed: &mut Option<OwedAck<'f>>,
) -> bool {
    let Op::Write(va, rkey) = m.op else { return false };
    if m.imm.is_some() && qp.srq.as_ref().is_some_and(|s| s.tm.is_some()) {
        return false;
    }
    let Some((mut g, ack_to)) = taker(qp, f, m) else { return false };
    let keys = qp.ctx.device.keys.read();
    let Some(target) = express::remote(&keys, &qp.pd, (rkey, va, m.len), AccessFlags::REMOTE_WRITE)
    else {
        return false;
    };
    let copy = move || {
        target.is_none_or(|(region, off)| {
            express::copy_piece(express::Src::Bytes(payload), 0, region, off, payload.len())
        })
    };
    if m.imm.is_none() {
        // Carried out by its sender, it was completed there as if acknowledged (see
        // `absent_peer::carried`), nothing of the QP's outstanding before it: an ACK would only
        // be taken there for a duplicate.
        if begin() {
            done(&mut g, m, None, owed);
            return true;
        }
        if !copy() {
            return false;
        }
    } else {
        let place = move || begin() || copy();
        // The receive is looked for first: without one, nothing is written (an RNR NAK).
        let Some(wr_id) = express::take_recv(qp, &mut g, |_| place().then_some(())) else {
            return false;
        };
        let arrival = Arrival {
            len: m.len,
            imm: m.imm,
            inv: None,
            src_lid: m.src_lid,
            solicited: m.solicited,
        };
        responder::complete_arrival(qp, &mut g, &arrival, WcOpcode::RECV_RDMA_WITH_IMM, wr_id);
    }
    drop(keys);
    done(&mut g, m, ack_to, owed);
    true
}

/// Takes the READ request `m` into our QP `qp`, the QP it names, if it can (see the module's
/// text); `begin` begins the record's request: whether its requester carried it out already
/// (then it is only accounted for, as the packet path does). The range is read straight into
/// the response's record, written to the requester's ring as the packet path's response would
/// be. Whether it did; if not (no room for the response now, say), nothing changed but the
/// record begun, which the packet path then finds begun.
pub(crate) fn read(
    qp: &Arc<QpShared>,
    f: &FabricInner,
    m: &RequestHead,
    begin: impl FnOnce() -> bool,
) -> bool {
    let Op::Read(va, rkey) = m.op else { return false };
    let Some((mut g, Some(node))) = taker(qp, f, m) else { return false };
    let keys = qp.ctx.device.keys.read();
    let Some(target) = express::remote(&keys, &qp.pd, (rkey, va, m.len), AccessFlags::REMOTE_READ)
    else {
        return false;
    };
    // A longer response is the packet path's to send (the requester may read it from here).
    if !node.whole(m.len as usize) {
        return false;
    }
    let piece = match target {
        Some((region, off)) => Src::Mem(region, off, m.len as usize),
        None => Src::Bytes(&[]),
    };
    let executed = |g: &mut QpInner| {
        responder::remember(g, Replay::read(m.psn, m.npkts, va, rkey, m.len));
        done(g, m, None, &mut None);
    };
    if begin() {
        executed(&mut g);
        return true;
    }
    // With the MSN the READ moves the responder to.
    let resp = answer(m, m.npkts, m.len, Op::ReadResponse(g.resp.msn.wrapping_add(1) & PSN_MASK));
    let fill = |d: &mut [u8]| {
        wire::encode_request_head(&resp, d);
        express::read_piece(piece, &mut d[wire::REQUEST_HEAD..])
    };
    if !node.send_whole(m.src.2, wire::REQUEST_HEAD + m.len as usize, Whole::default(), fill).0 {
        return false;
    }
    drop(keys);
    executed(&mut g);
    true
}

/// Executes the atomic request `m` on our QP `qp`, the QP it names, if it can (see the
/// module's text), and answers it (once executed, it is answered whatever the ring's room).
/// Whether it did; if not, nothing changed.
pub(crate) fn atomic(qp: &Arc<QpShared>, f: &FabricInner, m: &RequestHead) -> bool {
    let Op::Atomic(a) = m.op else { return false };
    let Some((mut g, Some(node))) = taker(qp, f, m) else { return false };
    let keys = qp.ctx.device.keys.read();
    let Some(Some((region, off))) =
        express::remote(&keys, &qp.pd, (a.rkey, a.va, 8), AccessFlags::REMOTE_ATOMIC)
    else {
        return false;
    };
    // A word misaligned in memory, or gone, is the packet path's to refuse.
    if region.host_addr().wrapping_add(off as u64) % 8 != 0 {
        return false;
    }
    let Ok(orig) = responder::fetch_op(a.kind(), a.compare, a.swap_add, region, off) else {
        return false;
    };
    drop(keys);
    responder::remember(&mut g, Replay::Atomic { psn: m.psn, orig });
    done(&mut g, m, None, &mut None);
    // Written whole here: it goes the general way if the ring has no room for it now.
    let mut resp = [0; wire::REQUEST_HEAD];
    wire::encode_request_head(&answer(m, 1, 0, Op::AtomicAck(g.resp.msn, orig)), &mut resp);
    node.send_bytes(m.src.2, &resp);
    true
}

/// The answer `op` (of `npkts` PSNs, `len` bytes) to the READ or atomic `m`, as
/// `responder::read_response` and `responder::atomic` build it (`reply`'s fields).
fn answer(m: &RequestHead, npkts: u32, len: u32, op: Op) -> RequestHead {
    RequestHead {
        src: m.dst,
        dst: m.src,
        transport: QpType::RC,
        psn: m.psn,
        npkts,
        len,
        imm: None,
        solicited: false,
        src_lid: 0,
        op,
    }
}

/// Takes the READ response or atomic ACK `m` (a READ's `payload` the bytes read) in for our QP
/// `qp`, the QP it names, if it can: an RC QP in RTS, idle, whose oldest outstanding WQE is
/// the READ or atomic it answers and whose SGEs take its data; placed there and completed as
/// `completer::receive` does, then the requester goes on as after an ACK (see [`ack`]).
/// Whether it did; if not, nothing changed.
pub(crate) fn read_response<'f>(
    qp: &Arc<QpShared>,
    f: &'f FabricInner,
    m: &RequestHead,
    payload: &[u8],
    drv: &mut Option<Driver<'f>>,
) -> bool {
    if m.transport != QpType::RC {
        return false;
    }
    let Some(mut g) = idle_requester(qp, f).filter(|g| g.sq.in_flight() > 0) else {
        return false;
    };
    let placed = {
        let w = g.sq.ring.at(g.sq.tail);
        let word;
        let (data, answers) = match m.op {
            Op::AtomicAck(_, orig) => {
                word = orig.to_ne_bytes();
                let atomic = matches!(
                    w.opcode,
                    WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
                );
                (&word[..], atomic)
            }
            _ => (payload, w.opcode == WrOpcode::RDMA_READ),
        };
        let len = data.len() as u32;
        let keys = qp.ctx.device.keys.read();
        answers
            && w.first_psn == m.psn
            && express::scatter(&keys, &qp.pd, &w.sges, len)
                .is_some_and(|into| into.fill(&keys, &w.sges, Src::Bytes(data), len))
    };
    if !placed {
        return false;
    }
    completer::complete_ok(qp, &mut g);
    go_on(qp, &mut g, f, drv);
    true
}

/// Takes the ACK `a` in for our QP `qp`, the QP it names, if it can (see the module's text):
/// what it acknowledges completes, and the requester goes on (see [`go_on`]). Whether it did;
/// if not, nothing changed.
pub(crate) fn ack<'f>(
    qp: &Arc<QpShared>,
    f: &'f FabricInner,
    a: &Ack,
    drv: &mut Option<Driver<'f>>,
) -> bool {
    let Some(mut g) = idle_requester(qp, f) else { return false };
    completer::ack_through(qp, &mut g, a.psn);
    go_on(qp, &mut g, f, drv);
    true
}

/// Our QP `qp`, locked, if it takes a response the short way now: an RC QP in RTS, nothing
/// in its inbox, nothing that must see packets.
fn idle_requester<'q>(qp: &'q Arc<QpShared>, f: &FabricInner) -> Option<LockGuard<'q, QpInner>> {
    if qp.qp_type != QpType::RC || !f.express() {
        return None;
    }
    let g = qp.inner.try_lock()?;
    (g.state == QpState::RTS && qp.inbox.is_empty()).then_some(g)
}

/// After a response taken in the short way: the requester goes on through `drv` (made on
/// first use) if anything is left to send, to wait for or to fail, as the packet path's
/// service after the response would.
fn go_on<'f>(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    f: &'f FabricInner,
    drv: &mut Option<Driver<'f>>,
) {
    // What `requester::run` then finds with nothing to do, and the timer nothing to wait for.
    let idle = g.sq.in_flight() == 0
        && g.sq.next == g.sq.head
        && g.req.rnr_until.is_none()
        && g.req.failed.is_none();
    if idle {
        g.req.drained_reported = false;
    } else {
        drv.get_or_insert_with(|| Driver::new(f)).service(qp, g);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::{engine::testkit, packet::Payload, wire::Atomic};

    /// The answers the short way writes to a READ and to an atomic from another process are,
    /// byte for byte, what the packet path's responder sends for them: the response packet,
    /// encoded, with the MSN the request moved the responder to.
    #[test]
    fn test_an_answer_written_without_a_packet_is_the_packets() {
        let (_f, a, b) = testkit::pair();
        b.mr.write(0, b"read me!").unwrap();
        let (va, rkey) = (b.mr.addr(), b.mr.rkey());
        let fetch_add = Atomic { compare_swap: false, va, rkey, swap_add: 5, compare: 0 };
        for (psn, op) in [(100, Op::Read(va, rkey)), (101, Op::Atomic(fetch_add))] {
            let kind = if psn == 100 { Kind::ReadRequest } else { Kind::FetchAdd };
            let mut req = testkit::request(kind, &a.qp, &b.qp, psn);
            (req.va, req.rkey, req.len, req.swap_add) = (va, rkey, 8, 5);
            // From another process: the requester's buffers are not here.
            req.payload = Payload::Remote;
            let m = RequestHead {
                src: (req.src_dev, req.src_port, req.src_qpn),
                dst: (req.dst_dev, req.dst_port, req.dst_qpn),
                transport: QpType::RC,
                psn,
                npkts: 1,
                len: 8,
                imm: None,
                solicited: false,
                src_lid: 0,
                op,
            };
            let sent = testkit::feed(&b.qp, &a.qp, req);
            let [resp] = &sent[..] else { panic!("{sent:?}") };
            let msn = b.qp.0.inner.lock().resp.msn;
            let ours = match op {
                Op::Read(..) => answer(&m, 1, 8, Op::ReadResponse(msn)),
                _ => answer(&m, 1, 0, Op::AtomicAck(msn, resp.orig)),
            };
            let mut bytes = Vec::new();
            wire::encode(resp, &mut bytes).unwrap();
            let mut head = [0xa5; wire::REQUEST_HEAD];
            wire::encode_request_head(&ours, &mut head);
            assert_eq!(head[..], bytes[..wire::REQUEST_HEAD], "{op:?}");
            let data: &[u8] = if psn == 100 { b"read me!" } else { b"" };
            assert_eq!(&bytes[wire::REQUEST_HEAD..], data, "{op:?}");
        }
    }
}

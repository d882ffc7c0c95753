//! A small SEND, WRITE, READ or atomic request to another process, written straight into its
//! ring record: the requester half of `arriving`. A WRITE whose send found the peer's reader
//! asleep is then carried out at once, as the packet path's `absent_peer::send_placing` does.
//!
//! Through the packet path such a message is built into a packet (its payload resolved into
//! pieces of our memory), handed through the driver, the fabric and the host fabric's node,
//! laid out as a message and cut into fragments, of which it makes one. Here the WQE's header
//! is written into the record as that packet's would be, and its payload copied after it from
//! the one SGE (or the inline bytes), in one pass. It is sent so only where the packet path
//! would send exactly that record at once: an RC or UC QP connected to another process on the
//! host fabric, nothing that must see packets (fault rules, a packet trace), both ports up, no
//! carry-out run or note pending, a message of one piece below 16 KiB (`host::Node::whole`),
//! its lkey fit;
//! and the ring to the peer set up, nothing of ours waiting before it, room for the record.
//! (Messages of a few KiB cost the packet path's building and fragmenting as much as their
//! copies: `ib_write_bw` between two processes on this 2-vCPU VM, medians of four runs, the
//! packet path against this: 2 KiB 0.53 against 0.85 Mpps, 4 KiB 0.42 against 0.60, 8 KiB 0.34
//! against 0.43; `ib_send_bw` 4 KiB 0.42 against 0.84.)
//! Everything is checked before the WQE changes; anything else goes the packet path, which
//! gives a bad lkey its error completion. A READ or an atomic (RC) carries nothing: its lkey
//! is looked at when its response comes, as there; a READ below 16 KiB is answered in one
//! record, which `arriving` takes in the short way too, as an atomic's.

use std::sync::Arc;

use super::{
    Driver, absent_peer, completer,
    express::{self, Src},
    packets_for, psn_add, requester,
};
use crate::{
    fabric::{
        FabricInner,
        host::{self, Whole},
    },
    objects::keys::KeyTable,
    qp::{QpInner, QpShared, SendWr},
    types::{QpState, QpType, SendFlags, WrOpcode},
    wire::{self, Atomic, Op, RequestHead},
};

/// Sends the WQE at `idx` (the next to send) straight into the record to its peer's process
/// if it can (see the module's text). Whether it did; if not, nothing changed.
pub(crate) fn send(qp: &Arc<QpShared>, g: &mut QpInner, idx: u32, drv: &mut Driver<'_>) -> bool {
    let f = drv.fabric;
    let w = g.sq.ring.at(idx);
    let Some(dest) = g.dest else { return false };
    let fit = matches!(qp.qp_type, QpType::RC | QpType::UC)
        && g.lane_across
        && w.length <= g.port.max_msg_sz
        && w.xrc_srqn == 0
        && w.ud.is_none()
        && g.wire_grh.is_none()
        && g.req.unsent.is_none()
        && !g.req.placed_last
        && !g.req.carrying
        && (f.express_all_up()
            || f.express()
                && f.port_up(qp.device_index(), g.attr.port_num)
                && f.port_up(dest.0, dest.1));
    if !fit {
        return false;
    }
    let Some(node) = f.remote_node(g.attr.dest_qp_num) else { return false };
    let keys = qp.ctx.device.keys.read();
    let Some((m, piece)) = message(qp, g, &keys, idx) else { return false };
    // A longer message is the packet path's to send (the peer may read it from our memory).
    if !node.whole(piece.len()) {
        return false;
    }
    let fill = |d: &mut [u8]| {
        wire::encode_request_head(&m, d);
        express::read_piece(piece, &mut d[wire::REQUEST_HEAD..])
    };
    let write = matches!(m.op, Op::Write(..)) && m.imm.is_none();
    // A WRITE alone in flight, the only kind carried out as it is sent (see below), is
    // written claimed, the peer's bell held.
    let alone = absent_peer::placing(qp, g, false);
    let how = Whole {
        carriable: matches!(m.op, Op::Write(..) | Op::Read(..)),
        lands: alone && (write || matches!(m.op, Op::Atomic(_))),
        placing: alone && write,
    };
    let send = || node.send_whole(m.dst.2, wire::REQUEST_HEAD + piece.len(), how, fill);
    // A ping-pong's holds the bell of a reader asleep too until the WRITE is found not
    // carried out (see `absent_peer::holds_bell`). Asked only here, past the length check:
    // asking marks the CQ, and the packet path, taking a WRITE refused above, would find no
    // poll since.
    let ((sent, claimed), held) = match how.placing && absent_peer::holds_bell(qp) {
        true => host::holding_bell(host::Hold::All, send),
        false => (send(), false),
    };
    if !sent {
        return false;
    }
    drop(keys);
    let (psn, npkts) = (m.psn, m.npkts);
    let w = g.sq.ring.at_mut(idx);
    (w.first_psn, w.last_psn) = (psn, psn_add(psn, npkts - 1));
    g.req.psn = psn_add(psn, npkts);
    g.sq.next = idx.wrapping_add(1);
    if matches!(m.op, Op::Read(..) | Op::Atomic(_)) {
        g.req.rd_atomic_in_flight += 1;
    }
    // As `send_placing` after the send (no run of WRITEs was going on): a WRITE alone is
    // carried out now, where the peer's reader is not at work (asleep, or napping on its
    // application's looks) through our view of the peer's memory if we have one, or by any
    // means it can be; the bell of a napping reader is rung only if not. One to a reader at
    // work, which takes it in as it comes, only through a view.
    let rang = host::rang_bell() || held;
    if how.placing {
        let placed = absent_peer::place_alone(qp, g, idx, drv, claimed, rang);
        host::release_bell(!placed);
    }
    if qp.qp_type == QpType::UC {
        // Unreliable: the WR is complete once its message is on the wire.
        completer::complete_ok(qp, g);
    }
    true
}

/// What [`post`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Posted {
    /// Nothing: the request goes the general way.
    Not,
    /// Queued and sent.
    Sent,
    /// Queued and sent, and what arrived for the QP meanwhile waits for its service.
    SentServiceDue,
}

/// A SEND (with or without immediate) or a WRITE with immediate posted on an RC or UC QP
/// connected to another process, nothing of the QP's unsent before it: checked, queued and
/// sent into the peer's ring as `requester::post` and then [`at_post`] would do it (the same
/// checks, the same WQE, [`send`] itself, the timers armed), without a driver's service around
/// it (~250 instructions a request). A plain WRITE, which its requester may carry out, a READ,
/// an atomic, and anything `send` turns away (for which nothing changed) go the general way.
#[inline(never)]
pub(crate) fn post(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    f: &FabricInner,
) -> Posted {
    let message = matches!(
        wr.opcode,
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
    );
    if !message || g.sq.next != g.sq.head || !quiet(qp, g) {
        return Posted::Not;
    }
    // Every check `requester::post` makes of it (the QP in RTS among them).
    let Some(length) = requester::express_length(qp, g, wr) else { return Posted::Not };
    let idx = g.sq.head;
    if requester::queue(g, wr, length, None).is_err() {
        return Posted::Not;
    }
    // Not dropped unless it must run something (see below): a driver moved or dropped at the
    // end of a function that lent it out is copied first (~30 instructions).
    let mut drv = std::mem::ManuallyDrop::new(Driver::new(f));
    drv.enter(Arc::as_ptr(qp));
    let sent = !held(g, idx) && send(qp, g, idx, &mut drv);
    drv.depth -= 1;
    let posted = if !sent {
        // Taken back (nothing else changed): the general way queues it again.
        g.sq.head = idx;
        Posted::Not
    } else if qp.inbox.is_empty() {
        g.req.drained_reported = false;
        requester::arm_timers(qp, g, &mut drv);
        Posted::Sent
    } else {
        g.req.drained_reported = false;
        Posted::SentServiceDue
    };
    // Nothing was handed to it (`send` and the timers hand nothing on): nothing to run or free.
    if !drv.idle() {
        std::mem::ManuallyDrop::into_inner(drv).finish();
    }
    posted
}

/// Sends the WQE a post just queued, the QP's only unsent one, the short way at once, as the
/// QP's service would (`requester::run` then [`send`]) when there is nothing else for it to
/// do: the QP in RTS, no RNR wait, no failed WQE, nothing in its inbox, and nothing that
/// holds the WQE back (a fence, the limit of READs and atomics in flight, a local operation,
/// a carry-out run). Its timers are armed as the service's end arms them. Whether it did (if
/// not, nothing changed, and the service runs as before).
pub(crate) fn at_post(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) -> bool {
    let idx = g.sq.next;
    if idx.wrapping_add(1) != g.sq.head || !quiet(qp, g) {
        return false;
    }
    drv.enter(Arc::as_ptr(qp));
    let sent = !held(g, idx) && send(qp, g, idx, drv);
    drv.depth -= 1;
    if !sent {
        return false;
    }
    g.req.drained_reported = false;
    if qp.inbox.is_empty() {
        requester::arm_timers(qp, g, drv);
    } else {
        // Packets came meanwhile: the service takes them in (and arms the timers).
        drv.service_and_arm(qp, g);
    }
    true
}

/// Whether the QP lets a WQE go to its peer's process at the post ([`at_post`], [`post`]):
/// connected to another process, in RTS, with no RNR wait, no failed WQE, no carry-out run
/// and nothing in its inbox.
#[inline(always)]
fn quiet(qp: &QpShared, g: &QpInner) -> bool {
    g.lane_across
        && g.state == QpState::RTS
        && g.req.rnr_until.is_none()
        && g.req.failed.is_none()
        && !g.req.carrying
        && qp.inbox.is_empty()
}

/// Whether the WQE at `idx` waits for something before it goes (a local operation, a fence,
/// the limit of READs and atomics in flight).
#[inline(always)]
fn held(g: &QpInner, idx: u32) -> bool {
    let w = g.sq.ring.at(idx);
    w.is_local() || requester::waits(g, w)
}

/// The message the WQE at `idx` makes at the QP's next PSN, field for field as
/// `requester::build` makes its packet, and its payload: the inline bytes or the one SGE's
/// memory (`keys` looked up), nothing for a READ or an atomic. `None` for a WQE not sent so:
/// another operation, a READ or atomic not on RC, several SGEs, an lkey that does not fit.
#[inline(always)]
fn message<'a>(
    qp: &QpShared,
    g: &'a QpInner,
    keys: &'a KeyTable,
    idx: u32,
) -> Option<(RequestHead, Src<'a>)> {
    let w = g.sq.ring.at(idx);
    let (imm, op) = match w.opcode {
        WrOpcode::SEND => (None, Op::Send),
        WrOpcode::SEND_WITH_IMM => (Some(w.imm), Op::Send),
        WrOpcode::RDMA_WRITE => (None, Op::Write(w.remote_addr, w.rkey)),
        WrOpcode::RDMA_WRITE_WITH_IMM => (Some(w.imm), Op::Write(w.remote_addr, w.rkey)),
        WrOpcode::RDMA_READ => (None, Op::Read(w.remote_addr, w.rkey)),
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD => {
            // FETCH_ADD's addend is its swap_add.
            let compare_swap = w.opcode == WrOpcode::ATOMIC_CMP_AND_SWP;
            let swap_add = if compare_swap { w.swap } else { w.compare_add };
            let (va, rkey, compare) = (w.remote_addr, w.rkey, w.compare_add);
            (None, Op::Atomic(Atomic { compare_swap, va, rkey, swap_add, compare }))
        }
        _ => return None,
    };
    // READs and atomics carry nothing (their buffers are looked at when the response comes).
    let rd_atomic = matches!(op, Op::Read(..) | Op::Atomic(_));
    if rd_atomic && qp.qp_type != QpType::RC {
        return None;
    }
    let piece = match w.sges.as_slice() {
        _ if rd_atomic => Src::Bytes(&[]),
        _ if w.flags.contains(SendFlags::INLINE) => Src::Bytes(&w.inline),
        [] => Src::Bytes(&[]),
        [sge] if sge.length == 0 => Src::Bytes(&[]),
        [sge] => express::source(keys, &qp.pd, sge)?,
        _ => return None,
    };
    let (len, npkts) = match op {
        Op::Atomic(_) => (8, 1),
        _ => (w.length, packets_for(w.length, g.mtu)),
    };
    if piece.len() != if rd_atomic { 0 } else { len as usize } {
        return None;
    }
    let dest = g.dest?;
    let m = RequestHead {
        src: (qp.device_index(), g.attr.port_num, qp.qpn),
        dst: (dest.0, dest.1, g.attr.dest_qp_num),
        transport: qp.qp_type,
        psn: g.req.psn,
        npkts,
        len,
        imm,
        // The solicited event is a SEND's or an immediate's only.
        solicited: w.flags.contains(SendFlags::SOLICITED) && (op == Op::Send || imm.is_some()),
        src_lid: g.port.lid,
        op,
    };
    Some((m, piece))
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::{
        SendWr, Sge,
        engine::{requester, testkit},
    };

    /// What `leaving` writes for a WQE is, byte for byte, what the packet path writes for it:
    /// `requester::build`'s packet, encoded. For every operation it sends: with immediate and
    /// without, asking for the solicited event (which only a SEND or an immediate carries),
    /// of no bytes, a READ into an lkey that does not fit (its request goes all the same), and
    /// FETCH_ADD and CMP_SWP (whose operands `build` places as it does).
    #[test]
    fn test_a_record_written_from_the_wqe_is_the_packets() {
        let (_f, a, _b) = testkit::unanswered_pair();
        let qp = &a.qp.0;
        let (mr, lkey) = (a.mr.addr(), a.mr.lkey());
        a.mr.write(0, b"eight by").unwrap();
        let sg = [Sge { addr: mr, length: 8, lkey }];
        let unfit = [Sge { addr: mr, length: 8, lkey: lkey ^ 0x100 }];
        let (va, rkey) = (0x7000_0000_0040, 0x1234);
        let solicited = |w: SendWr<'static>| SendWr { send_flags: SendFlags::SOLICITED, ..w };
        let wrs: Vec<SendWr<'_>> = vec![
            SendWr::send(1, &sg),
            solicited(SendWr::send(2, &[])).with_imm(0xfeed),
            SendWr::write(3, &sg, va, rkey),
            SendWr { send_flags: SendFlags::SOLICITED, ..SendWr::write(4, &sg, va, rkey) },
            SendWr { send_flags: SendFlags::SOLICITED, ..SendWr::write(5, &sg, va, rkey) }
                .with_imm(7),
            SendWr::read(6, &sg, va, rkey),
            SendWr::read(7, &unfit, va, rkey),
            SendWr::fetch_add(8, &sg, va, rkey, 0x55),
            SendWr::cmp_swap(9, &sg, va, rkey, 0x66, 0x77),
        ];
        for wr in &wrs {
            let mut g = qp.inner.lock();
            assert!(
                requester::post(qp, &mut g, wr, &qp.ctx.fabric, requester::Operands::Checked)
                    .unwrap(),
                "{wr:?} queued"
            );
            let idx = g.sq.next;
            let keys = qp.ctx.device.keys.read();
            let (m, piece) = message(qp, &g, &keys, idx).expect("sent so");
            let mut record = vec![0xa5; wire::REQUEST_HEAD + piece.len()];
            wire::encode_request_head(&m, &mut record);
            assert!(express::read_piece(piece, &mut record[wire::REQUEST_HEAD..]));
            drop(keys);
            let pkt = requester::build(qp, &mut g, idx).unwrap();
            let mut bytes = Vec::new();
            wire::encode(&pkt, &mut bytes).unwrap();
            assert_eq!(record, bytes, "{wr:?}");
            assert_eq!((m.psn, m.npkts), (pkt.psn, pkt.npkts));
            g.sq.next = idx.wrapping_add(1);
        }
    }
}

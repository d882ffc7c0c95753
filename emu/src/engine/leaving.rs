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
//! carry-out run or note pending, a message of one piece that one record holds, its lkey fit;
//! and the ring to the peer set up, nothing of ours waiting before it, room for the record.
//! Everything is checked before the WQE changes; anything else goes the packet path, which
//! gives a bad lkey its error completion. A READ or an atomic (RC) carries nothing: its lkey
//! is looked at when its response comes, as there; a READ of up to [`SHORT_MAX`] bytes is
//! answered in one record, which `arriving` takes in the short way too, as an atomic's.

use std::sync::Arc;

use super::{
    Driver, absent_peer,
    arriving::{Atomic, Message, Op},
    completer,
    express::{self, Src},
    packets_for, psn_add,
};
use crate::{
    fabric::{host, wire},
    qp::{QpInner, QpShared},
    types::{QpType, SendFlags, WrOpcode},
};

/// The longest message sent so (a ping-pong's, a small message's: the ones whose cost is the
/// path's, not the copy's).
pub(super) const SHORT_MAX: u32 = 1024;

/// Sends the WQE at `idx` (the next to send) straight into the record to its peer's process
/// if it can (see the module's text). Whether it did; if not, nothing changed.
pub(crate) fn send(qp: &Arc<QpShared>, g: &mut QpInner, idx: u32, drv: &mut Driver<'_>) -> bool {
    let f = drv.fabric;
    let w = g.sq.ring.at(idx);
    let (imm, op) = match w.opcode {
        WrOpcode::SEND => (None, Op::Send),
        WrOpcode::SEND_WITH_IMM => (Some(w.imm), Op::Send),
        WrOpcode::RDMA_WRITE => (None, Op::Write(w.remote_addr, w.rkey)),
        WrOpcode::RDMA_WRITE_WITH_IMM => (Some(w.imm), Op::Write(w.remote_addr, w.rkey)),
        WrOpcode::RDMA_READ => (None, Op::Read(w.remote_addr, w.rkey)),
        WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD => {
            // As `build` fills the packet: FETCH_ADD's addend is its swap_add.
            let compare_swap = w.opcode == WrOpcode::ATOMIC_CMP_AND_SWP;
            let swap_add = if compare_swap { w.swap } else { w.compare_add };
            let (va, rkey, compare) = (w.remote_addr, w.rkey, w.compare_add);
            (None, Op::Atomic(Atomic { compare_swap, va, rkey, swap_add, compare }))
        }
        _ => return false,
    };
    // READs and atomics carry nothing (their buffers are looked at when the response comes).
    let rd_atomic = matches!(op, Op::Read(..) | Op::Atomic(_));
    if rd_atomic && qp.qp_type != QpType::RC {
        return false;
    }
    let Some(dest) = g.dest else { return false };
    let src = (qp.device_index(), g.attr.port_num, qp.qpn);
    let dst = (dest.0, dest.1, g.attr.dest_qp_num);
    let fit = matches!(qp.qp_type, QpType::RC | QpType::UC)
        && g.lane_across
        && w.length <= SHORT_MAX
        && w.length <= g.port.max_msg_sz
        && w.xrc_srqn == 0
        && w.ud.is_none()
        && g.wire_grh.is_none()
        && g.req.unsent.is_none()
        && !g.req.placed_last
        && !g.req.carrying
        && f.express()
        && f.port_up(src.0, src.1)
        && f.port_up(dst.0, dst.1);
    if !fit {
        return false;
    }
    let Some(node) = f.remote_node(dst.2) else { return false };
    let inline = w.flags.contains(SendFlags::INLINE);
    let keys = qp.ctx.device.keys.read();
    let piece = match w.sges.as_slice() {
        _ if rd_atomic => Src::Bytes(&[]),
        _ if inline => Src::Bytes(&w.inline),
        [] => Src::Bytes(&[]),
        [sge] if sge.length == 0 => Src::Bytes(&[]),
        [sge] => match express::source(&keys, &qp.pd, sge) {
            Some(src) => src,
            None => return false,
        },
        _ => return false,
    };
    let (len, npkts) = match op {
        Op::Atomic(_) => (8, 1),
        _ => (w.length, packets_for(w.length, g.mtu)),
    };
    let psn = g.req.psn;
    let carried = if rd_atomic { 0 } else { len };
    if piece.len() != carried as usize {
        return false;
    }
    let m = Message {
        src,
        dst,
        transport: qp.qp_type,
        psn,
        npkts,
        len,
        imm,
        // As `build` sets it: the solicited event is a SEND's or an immediate's only.
        solicited: w.flags.contains(SendFlags::SOLICITED) && (op == Op::Send || imm.is_some()),
        src_lid: g.port.lid,
        op,
    };
    let fill = |d: &mut [u8]| {
        wire::encode_request_head(&m, d);
        express::read_piece(piece, &mut d[wire::REQUEST_HEAD..])
    };
    if !node.send_whole(dst.2, wire::REQUEST_HEAD + carried as usize, fill) {
        return false;
    }
    drop(keys);
    let w = g.sq.ring.at_mut(idx);
    (w.first_psn, w.last_psn) = (psn, psn_add(psn, npkts - 1));
    g.req.psn = psn_add(psn, npkts);
    g.sq.next = idx.wrapping_add(1);
    if rd_atomic {
        g.req.rd_atomic_in_flight += 1;
    }
    // As `send_placing` after the send (no run of WRITEs was going on): a WRITE whose send
    // rang the peer's bell is carried out now, if it can be.
    if host::rang_bell() {
        g.req.placed_last = absent_peer::place_sent(qp, g, idx, drv);
    }
    if qp.qp_type == QpType::UC {
        // Unreliable: the WR is complete once its message is on the wire.
        completer::complete_ok(qp, g);
    }
    true
}

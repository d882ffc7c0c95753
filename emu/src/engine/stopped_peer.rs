//! Work for a peer process that is stopped (SIGSTOP, a debugger): a NIC goes on answering for
//! a stopped process, so the RDMA WRITEs and READs an RC QP has outstanding to one are carried
//! out by this side itself, in order, while their requests still wait unread in the ring
//! (`fabric::exports` checks each as the peer's responder would, and moves the bytes), then
//! complete as if the peer had answered. The first request that cannot be carried out (a
//! SEND, an atomic, a WRITE with immediate, one the peer's tables refuse or that did not go
//! into the ring in one record) and everything after it wait for the peer to continue.

use std::sync::Arc;

use super::{
    Driver, completer,
    packet::{Kind, Packet, Payload, Syndrome},
    sgl,
};
use crate::{
    fabric::exports::{Op, Request},
    qp::{QpInner, QpShared, queue::Hidden},
    types::{SendFlags, WrOpcode},
};

/// Carries out what it can of the QP's outstanding requests, oldest first, for its stopped
/// peer; whether it carried out any.
pub(crate) fn carry_out(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) -> bool {
    let fabric = drv.fabric;
    let dest_qpn = g.attr.dest_qp_num;
    let Some((dev, _)) = g.dest else { return false };
    let Some(mut peer) = fabric.remote_node(dest_qpn).and_then(|n| n.stopped_peer(dest_qpn)) else {
        return false;
    };
    let mut any = false;
    while g.sq.in_flight() > 0 && g.req.failed.is_none() {
        let w = g.sq.ring.at(g.sq.tail);
        if w.hidden != Hidden::None {
            break;
        }
        let request = |op| Request {
            dst: (dev, dest_qpn),
            src_qpn: qp.qpn,
            rkey: w.rkey,
            va: w.remote_addr,
            op,
        };
        let mut answer = match w.opcode {
            WrOpcode::RDMA_WRITE => {
                let Some(src) = sources(qp, &w.sges, &w.inline, w.flags) else { break };
                if !peer.carry_out(w.first_psn, request(Op::Write(&src))) {
                    break;
                }
                // The ACK the peer would have sent.
                let mut ack = Packet::new(Kind::Ack);
                (ack.syndrome, ack.psn) = (Syndrome::Ack, w.last_psn);
                ack
            }
            WrOpcode::RDMA_READ => {
                let mut data = Vec::new();
                if !peer.carry_out(w.first_psn, request(Op::Read(&mut data, w.length as usize))) {
                    break;
                }
                // The response the peer would have sent.
                let mut resp = Packet::new(Kind::ReadResponse);
                (resp.syndrome, resp.psn, resp.len) = (Syndrome::Ack, w.first_psn, w.length);
                resp.npkts = w.last_psn.wrapping_sub(w.first_psn).wrapping_add(1);
                resp.payload = Payload::Bytes(data.into());
                resp
            }
            _ => break,
        };
        (answer.src_qpn, answer.dst_qpn) = (dest_qpn, qp.qpn);
        completer::receive(qp, g, answer, drv);
        any = true;
    }
    any
}

/// Where a WRITE's bytes lie in this process, in order: its inline data, or its SGEs' memory
/// (`None` if an SGE is not usable: the WRITE then fails as the packet path fails it).
fn sources(
    qp: &QpShared,
    sges: &[crate::Sge],
    inline: &[u8],
    flags: SendFlags,
) -> Option<Vec<(u64, usize)>> {
    if flags.contains(SendFlags::INLINE) {
        return Some(vec![(inline.as_ptr() as u64, inline.len())]);
    }
    let payload = sgl::resolve(qp, sges, false).ok()?;
    let pieces = payload
        .ranges()
        .iter()
        .map(|m| (m.region.host_addr().wrapping_add(m.offset as u64), m.len));
    Some(pieces.collect())
}

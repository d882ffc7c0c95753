//! A small SEND from another process, taken in straight from the ring record it came in: the
//! responder half of the express lane (`lane`), for a requester that is not here.
//!
//! Through the packet path such a SEND is decoded into a packet, its payload copied out of the
//! record, the packet handed to the responder, which copies the payload again into the receive
//! WQE and sends the ACK. Here the record's header is read where it lies, the payload copied
//! once, from the record into the WQE's buffer, and the ACK written in its short form. It is
//! taken so only where the responder would do exactly that: an RC or UC QP of the SEND's
//! transport, idle (its lock free, nothing in its inbox, nothing unsent on its send queue), the
//! SEND the next it expects, a receive posted whose SGEs hold it, no tag matching, and nothing
//! that must see packets (fault rules, a packet trace). Everything is checked before anything
//! changes; anything else goes the packet path untouched, which gives it its RNR, its NAK, its
//! error completion and its events.

use std::sync::Arc;

use super::{
    ack_route, express, psn_add,
    responder::{self, Arrival},
};
use crate::{
    fabric::{FabricInner, wire::Ack},
    qp::QpShared,
    types::{QpType, Sge, WcOpcode},
};

/// What the header of a SEND (with or without immediate) says, read from its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Send {
    /// The sender's and the receiver's `(device, port, QPN)`.
    pub(crate) src: (u32, u8, u32),
    pub(crate) dst: (u32, u8, u32),
    pub(crate) transport: QpType,
    pub(crate) psn: u32,
    pub(crate) npkts: u32,
    pub(crate) len: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) solicited: bool,
    pub(crate) src_lid: u16,
}

/// Takes `m` (its `payload` the record's bytes) into our QP `qp`, the QP it names, if it can
/// (see the module's text). Whether it did; if not, nothing changed.
pub(crate) fn send(qp: &Arc<QpShared>, f: &FabricInner, m: &Send, payload: &[u8]) -> bool {
    let reliable = match qp.qp_type {
        QpType::RC => true,
        QpType::UC => false,
        _ => return false,
    };
    if m.transport != qp.qp_type
        || payload.len() != m.len as usize
        || qp.srq.as_ref().is_some_and(|s| s.tm.is_some())
    {
        return false;
    }
    // The ACK's way out is known before the receive is taken: it cannot fail after.
    let ack_to = match reliable {
        true => match ack_route(f, m.dst, m.src) {
            Some(node) => Some(node),
            None => return false,
        },
        false if f.express() => None,
        false => return false,
    };
    let Some(mut g) = qp.inner.try_lock() else { return false };
    if !express::takes(qp, &g, qp.qp_type, m.psn, m.dst.1) || g.sq.next != g.sq.head {
        return false;
    }
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
    g.resp.nak_seq_sent = false;
    responder::advance_past(&mut g, m.psn, m.npkts);
    if let Some(node) = ack_to {
        let psn = psn_add(m.psn, m.npkts - 1);
        node.send_ack(&Ack { src: m.dst, dst: m.src, psn, msn: g.resp.msn });
    }
    true
}

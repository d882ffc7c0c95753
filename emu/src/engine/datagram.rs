//! The express path for UD: a datagram to a QP of this process delivered by the posting
//! thread, straight into the receiver's memory and receive queue, both completions written at
//! once, as `express` does for connected QPs. UD has no connection to prove once: each request
//! names its own destination (an address handle and a QPN), looked up as the packet path's
//! route looks it up.
//!
//! It runs only where the packet path would send the datagram at once and the receiver take
//! it: the sender in RTS with nothing queued before it, its address handle of its own PD (rxe),
//! the message within the path MTU, its SGEs fit; the receiver a UD QP of this process on that
//! port, at least in RTR, its Q_Key the datagram's, nothing waiting in its inbox, a receive
//! posted that holds the datagram and its 40-byte GRH area; no fault rule, simulation or packet
//! trace, both ports up. Anything else (a datagram the receiver drops, one that fails a
//! receive, a multicast group, a peer in another process or over a wire) goes the packet path,
//! which gives it its exact outcome: the request changes nothing before it is sure to finish.
//! What it leaves behind is what the packet path would: the sender's PSN one further, the
//! receive completion, then the send completion (the order in which the packet path's driver,
//! servicing the receiver inline, writes them).

use std::sync::Arc;

use super::{
    completer,
    express::{self, Request, Scatter, Src},
    packet::Grh,
    psn_add,
    requester::MULTICAST_QPN,
    responder::{self, Datagram, MAX_UD_PAYLOAD},
};
use crate::{
    fabric::{FabricInner, wire_port::WIRE_DEV},
    qp::{QpInner, QpShared, SendWr},
    types::{QpState, QpType, SendFlags},
};

/// Where a UD request goes, as the post resolved it: the destination `(device, port)`, QPN
/// and Q_Key, the GRH (a global address handle), and whether the address handle is another
/// PD's (which rxe fails when the request runs).
pub(crate) type UdDest = ((u32, u8), u32, u32, Option<Grh>, bool);

/// Delivers the UD SEND `wr` of `length` bytes (checked by the post) to `dest` at the post if
/// it can (see the module's text). Whether it did; if not, nothing changed. (Out of line: the
/// post that calls it is inlined into every opcode's.)
#[inline(never)]
pub(crate) fn post(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    dest: &UdDest,
    length: u32,
    f: &FabricInner,
) -> bool {
    let &((dev, port), dqpn, qkey, ref grh, foreign) = dest;
    // As the post would queue it and the QP's service send it at once (`requester::build`).
    let sends_now = g.state == QpState::RTS
        && g.sq.head == g.sq.tail
        && g.sq.depth > 0
        && g.req.rnr_until.is_none()
        && !foreign
        && length <= g.port.max_msg_sz
        && length <= g.port.mtu
        && length as usize <= MAX_UD_PAYLOAD;
    // As the driver would hand it to a QP of this fabric (`Driver::transmit`).
    if !sends_now
        || dqpn == MULTICAST_QPN
        || dev == WIRE_DEV
        || !f.express()
        || !f.port_up(qp.device_index(), g.attr.port_num)
        || !f.port_up(dev, port)
        || f.remote_node(dqpn).is_some()
    {
        return false;
    }
    // The last destination, kept (no reference count moves per datagram), or the one the
    // fabric numbers so now.
    let dst = match g.ud_peer.take() {
        Some(d) if d.qpn == dqpn && d.device_index() == dev && d.life.is_alive() => d,
        _ => match f.lookup_qp(dev, dqpn) {
            Some(d) if !Arc::ptr_eq(&d, qp) => d,
            _ => return false,
        },
    };
    let sent = deliver(qp, g, wr, (&dst, port, qkey, grh.as_ref()), length);
    g.ud_peer = Some(dst);
    sent
}

/// [`post`] to `dst`, a QP of this fabric other than the sender, at `port` with `qkey` and
/// `grh`.
#[inline(always)]
fn deliver(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    (dst, port, qkey, grh): (&Arc<QpShared>, u8, u32, Option<&Grh>),
    length: u32,
) -> bool {
    let Some(mut dg) = dst.inner.try_lock() else { return false };
    // As the receiver would take it (`responder::receive`, then `ud_receive`), in order.
    let qkey = if qkey & 0x8000_0000 != 0 { g.attr.qkey } else { qkey };
    let takes = matches!(dg.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
        && port == dg.attr.port_num
        && dst.qp_type == QpType::UD
        && dg.resp.forwarded.is_none()
        && dst.inbox.is_empty()
        && qkey == dg.attr.qkey
        && dst.srq.as_ref().is_none_or(|s| s.tm.is_none());
    if !takes {
        return false;
    }
    let lkeys = qp.ctx.device.keys.read();
    let Some(rkeys) = dst.ctx.device.keys.under(&lkeys) else { return false };
    let req = Request::of_wr(wr, length);
    let inline = wr.send_flags.contains(SendFlags::INLINE);
    // The common one-piece source, found as it is checked.
    let one = match wr.sg_list {
        _ if inline => Some(Src::Bytes(wr.inline_data)),
        [sge] if sge.length == 0 => Some(Src::Bytes(&[])),
        [sge] => match express::source(&lkeys, &qp.pd, sge) {
            Some(src) => Some(src),
            None => return false,
        },
        _ => None,
    };
    if one.is_none() && !wr.sg_list.iter().all(|s| express::local_ok(&lkeys, &qp.pd, s, false)) {
        return false;
    }
    let imm = (wr.opcode == crate::types::WrOpcode::SEND_WITH_IMM).then_some(wr.imm_data);
    let head = responder::ud_head(&dg, grh, length as usize, imm.is_some());
    let total = 40 + length;
    let pd = responder::own_recv_pd(dst);
    let place = |sges: &[crate::Sge]| {
        let copied = match (one, express::scatter(rkeys, pd, sges, total)?) {
            // The common one-piece datagram into one receive SGE, without the iterators.
            (Some(piece), Scatter::One(span)) => {
                let (area, rest) = (span.part(0, 40)?, span.part(40, length as usize)?);
                area.write(&head).is_ok() && express::copy_into(piece, rest)
            }
            _ => {
                let src = std::iter::once(Src::Bytes(&head)).chain(express::sources(&lkeys, &req));
                express::copy(src, express::ranges(rkeys, sges, total))
            }
        };
        copied.then_some(())
    };
    let Some(wr_id) = express::take_recv(dst, &mut dg, place) else { return false };
    drop(lkeys);
    let d = Datagram {
        total,
        grh,
        imm,
        src_qpn: qp.qpn,
        src_lid: g.port.lid,
        solicited: wr.send_flags.contains(SendFlags::SOLICITED),
    };
    responder::ud_received(dst, &mut dg, wr_id, &d);
    drop(dg);
    g.req.psn = psn_add(g.req.psn, 1);
    completer::send_done(qp, wr.wr_id, wr.opcode, wr.send_flags, length);
    completer::progressed(g);
    true
}

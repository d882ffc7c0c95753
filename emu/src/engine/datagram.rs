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
//! receive, a multicast group, a peer over a wire) goes the packet path, which gives it its
//! exact outcome: the request changes nothing before it is sure to finish. What it leaves
//! behind is what the packet path would: the sender's PSN one further, the receive
//! completion, then the send completion (the order in which the packet path's driver,
//! servicing the receiver inline, writes them).
//!
//! Between processes, the two halves run apart: the sender writes the datagram into the ring
//! to the receiver's process at the post ([`send_across`]: the record the packet path would
//! write) and completes it, as UD waits for nothing; the receiving process takes the record
//! in straight from its ring ([`arrive`]) where its QP would take it at once, and as a packet
//! otherwise.

use std::sync::Arc;

use super::{
    completer,
    express::{self, Request, Scatter, Src},
    psn_add,
    requester::MULTICAST_QPN,
    responder::{self, Datagram, MAX_UD_PAYLOAD},
    sgl,
};
use crate::packet::{Kind, Packet, Payload};
use crate::{
    fabric::FabricInner,
    objects::{keys::KeyTable, pd::PdInner},
    qp::{QpInner, QpShared, SendWr, queue::UdTarget},
    types::WIRE_DEV,
    types::{Grh, QpState, QpType, SendFlags, WrOpcode},
    wire,
};

/// Delivers the UD SEND `wr` of `length` bytes (checked by the post) to `dest` at the post if
/// it can (see the module's text). Whether it did; if not, nothing changed. (Out of line: the
/// post that calls it is inlined into every opcode's.)
#[inline(never)]
pub(crate) fn post(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    dest: &UdTarget,
    length: u32,
    f: &FabricInner,
) -> bool {
    let &((dev, port), dqpn, qkey, ref grh, foreign) = dest;
    // As the post would queue it and the QP's service send it at once (`requester::build`):
    // UD carries a SEND, with immediate or not, and nothing else (the service fails the rest).
    let sends_now = matches!(wr.opcode, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM)
        && g.state == QpState::RTS
        && g.sq.head == g.sq.tail
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
    {
        return false;
    }
    if let Some(node) = f.remote_node(dqpn) {
        return send_across(qp, g, wr, dest, length, node);
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
    let imm = (wr.opcode == WrOpcode::SEND_WITH_IMM).then_some(wr.imm_data);
    let head = responder::ud_head(&dg, grh, length as usize, imm.is_some());
    let total = 40 + length;
    let pd = responder::own_recv_pd(dst);
    let body = (one, || express::sources(&lkeys, &req));
    let place = |sges: &[crate::Sge]| place(rkeys, pd, sges, &head, body, length as usize);
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

/// [`post`] to a QP of another process: the datagram sent into the ring to its process at
/// once, as the QP's service would send it (`requester::run`, `Driver::transmit`), and the
/// request completed (UD waits for nothing), without the WQE, the driver and the service
/// around it. (The receiving process takes it in as any datagram.)
fn send_across(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    dest: &UdTarget,
    length: u32,
    node: &crate::fabric::host::Node,
) -> bool {
    let Some(pkt) = packet(qp, g, wr, dest, length) else { return false };
    node.send(&pkt);
    g.req.psn = psn_add(pkt.psn, 1);
    completer::send_done(qp, wr.wr_id, wr.opcode, wr.send_flags, length);
    completer::progressed(g);
    true
}

/// The packet `requester::build` makes of the UD SEND `wr` of `length` bytes to `dest`, at
/// the QP's next PSN; `None` where its SGEs do not resolve (the packet path fails it).
fn packet(
    qp: &QpShared,
    g: &QpInner,
    wr: &SendWr<'_>,
    &((dev, port), dqpn, qkey, grh, _): &UdTarget,
    length: u32,
) -> Option<Packet> {
    let mut pkt = Packet::new(Kind::Send);
    pkt.transport = qp.qp_type;
    pkt.mtu = g.mtu;
    pkt.imm = (wr.opcode == WrOpcode::SEND_WITH_IMM).then_some(wr.imm_data);
    pkt.xrc_srqn = wr.xrc_remote_srqn;
    pkt.len = length;
    pkt.payload = if wr.send_flags.contains(SendFlags::INLINE) {
        Payload::Bytes(wr.inline_data.into())
    } else {
        sgl::resolve(qp, wr.sg_list, false).ok()?
    };
    pkt.solicited = wr.send_flags.contains(SendFlags::SOLICITED);
    pkt.src_dev = qp.device_index();
    pkt.src_qpn = qp.qpn;
    pkt.src_lid = g.port.lid;
    pkt.src_port = g.attr.port_num;
    (pkt.dst_dev, pkt.dst_port) = (dev, port);
    pkt.dst_qpn = dqpn;
    // A Q_Key with the high bit set means "use the QP's own" (IBA 10.2.5).
    pkt.qkey = if qkey & 0x8000_0000 != 0 { g.attr.qkey } else { qkey };
    pkt.grh = grh.map(Box::new);
    pkt.npkts = 1;
    pkt.psn = g.req.psn;
    Some(pkt)
}

/// Takes the datagram `d` from another process in, straight from its ring record, into our
/// QP `qp` it names, if the packet path would deliver it at once (its receiver free, nothing
/// before it in its inbox, nothing of its own unsent that its service would send after it,
/// the Q_Key its own, a receive posted that holds it): written into the receive, the receive
/// completed, as `responder::ud_receive` would. Whether it did; if not, nothing changed.
pub(crate) fn arrive(qp: &Arc<QpShared>, f: &FabricInner, d: &wire::Datagram<'_>) -> bool {
    let Some(mut g) = qp.inner.try_lock() else { return false };
    let takes = f.express()
        && matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
        && d.dst.1 == g.attr.port_num
        && qp.qp_type == QpType::UD
        && g.resp.forwarded.is_none()
        && qp.inbox.is_empty()
        && g.sq.next == g.sq.head
        && d.qkey == g.attr.qkey
        && d.payload.len() <= MAX_UD_PAYLOAD
        && qp.srq.as_ref().is_none_or(|s| s.tm.is_none());
    if !takes {
        return false;
    }
    let keys = qp.ctx.device.keys.read();
    let length = d.payload.len();
    let head = responder::ud_head(&g, d.grh.as_ref(), length, d.imm.is_some());
    let total = 40 + length as u32;
    let pd = responder::own_recv_pd(qp);
    let payload = Src::Bytes(d.payload);
    let body = (Some(payload), || std::iter::once(payload));
    let place = |sges: &[crate::Sge]| place(&keys, pd, sges, &head, body, length);
    let Some(wr_id) = express::take_recv(qp, &mut g, place) else { return false };
    drop(keys);
    let arrived = Datagram {
        total,
        grh: d.grh.as_ref(),
        imm: d.imm,
        src_qpn: d.src.2,
        src_lid: d.src_lid,
        solicited: d.solicited,
    };
    responder::ud_received(qp, &mut g, wr_id, &arrived);
    true
}

/// Writes a datagram into the receive `sges` (checked in `pd`, as the packet path's scatter
/// checks them): its GRH area `head`, then its `length` bytes, `body`: the one piece they are,
/// if they are one, and all of its pieces in order. `None` if the receive does not hold it or
/// a copy faulted (nothing is taken then).
#[inline(always)]
fn place<'s, I: Iterator<Item = Src<'s>>>(
    keys: &KeyTable,
    pd: &Arc<PdInner>,
    sges: &[crate::Sge],
    head: &'s [u8; 40],
    (one, pieces): (Option<Src<'_>>, impl FnOnce() -> I),
    length: usize,
) -> Option<()> {
    let total = 40 + length as u32;
    let copied = match (one, express::scatter(keys, pd, sges, total)?) {
        // The common one-piece datagram into one receive SGE, without the iterators.
        (Some(piece), Scatter::One(span)) => {
            let (area, rest) = (span.part(0, 40)?, span.part(40, length)?);
            area.write(head).is_ok() && express::copy_into(piece, rest)
        }
        _ => {
            let src = std::iter::once(Src::Bytes(head)).chain(pieces());
            express::copy(src, express::ranges(keys, sges, total))
        }
    };
    copied.then_some(())
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::{engine::requester, *};

    /// What `packet` makes of a UD SEND is, byte for byte, what the packet path sends for it:
    /// `requester::build`'s packet, encoded. Inline or from an SGE, with immediate or not,
    /// solicited or not, to the Q_Key given or the QP's own, through a global address handle
    /// or not.
    #[test]
    fn test_a_datagram_made_from_the_wr_is_the_packets() {
        let f = Fabric::new(FabricConfig::default());
        let devs = f.devices();
        let (a, b) = (
            crate::engine::testkit::side_of(&devs[0], QpType::UD),
            crate::engine::testkit::side_of(&devs[1], QpType::UD),
        );
        use QpAttrMask as M;
        for s in [&a, &b] {
            let init =
                QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: 77, ..Default::default() };
            s.qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
            s.qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE)
                .unwrap();
            let rts = QpAttr { qp_state: QpState::RTS, sq_psn: 5, ..Default::default() };
            s.qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
        }
        a.mr.write(0, b"datagram").unwrap();
        let sg = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        let to = b.qp.endpoint(0);
        let ahs = [false, true].map(|is_global| {
            let attr = AhAttr {
                is_global,
                dgid: to.gid,
                dlid: to.lid,
                port_num: 1,
                hop_limit: 9,
                traffic_class: 3,
                ..Default::default()
            };
            a.qp.pd().create_ah(&attr).unwrap()
        });
        let qp = &a.qp.0;
        for (i, ah) in ahs.iter().enumerate() {
            for (qkey, imm, inline, solicited) in [
                (77, None, false, false),
                (0x8000_0000, Some(9), true, true),
                (5, None, true, false),
            ] {
                let mut wr = SendWr::send_ud(i as u64, &sg, ah, b.qp.qp_num(), qkey);
                if inline {
                    wr.send_flags |= SendFlags::INLINE;
                    wr.inline_data = b"inline!";
                }
                if solicited {
                    wr.send_flags |= SendFlags::SOLICITED;
                }
                if let Some(imm) = imm {
                    wr = wr.with_imm(imm);
                }
                let mut g = qp.inner.lock();
                let length = if inline { 7 } else { 8 };
                // Queued (B has no receive posted: the express path leaves the datagram to the
                // packet path), with the address as the post resolved it.
                assert!(
                    requester::post(qp, &mut g, &wr, &qp.ctx.fabric, requester::Operands::Checked)
                        .is_ok_and(|q| q)
                );
                let idx = g.sq.next;
                let dest = g.sq.ring.at(idx).ud.expect("a UD WQE");
                assert_eq!(dest.1, b.qp.qp_num());
                let ours = packet(qp, &g, &wr, &dest, length).expect("resolves");
                let theirs = requester::build(qp, &mut g, idx).unwrap();
                let (mut x, mut y) = (Vec::new(), Vec::new());
                crate::wire::encode(&ours, &mut x).unwrap();
                crate::wire::encode(&theirs, &mut y).unwrap();
                assert_eq!(x, y, "{wr:?}");
                assert_eq!((ours.psn, ours.npkts), (theirs.psn, theirs.npkts));
                g.sq.next = idx.wrapping_add(1);
                g.sq.tail = g.sq.next;
            }
        }
    }
}

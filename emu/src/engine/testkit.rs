//! Test helpers for the engine's unit tests: a connected RC pair, hand-made packets, and a way
//! to feed one packet to one QP and look at what came out, with nothing else running.

use std::sync::Arc;

use super::Driver;
use crate::{
    packet::{Kind, Packet, Payload},
    qp::QpShared,
    *,
};

pub(crate) struct Side {
    pub(crate) qp: Qp,
    pub(crate) mr: Mr,
    pub(crate) cq: Cq,
}

/// An RC QP not yet connected on its own context of `d`, with a CQ and 4 KiB of memory that
/// every access may reach.
pub(crate) fn side(d: &Device) -> Side {
    side_of(d, QpType::RC)
}

/// [`side`] with a QP of type `ty`.
pub(crate) fn side_of(d: &Device, ty: QpType) -> Side {
    let ctx = d.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, 0).unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(4096, all).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr::new(ty, &cq, cap)).unwrap();
    Side { qp, mr, cq }
}

pub(crate) fn pair() -> (Fabric, Side, Side) {
    let f = Fabric::new(FabricConfig::default());
    let devs = f.devices();
    let (a, b) = (side(&devs[0]), side(&devs[1]));
    a.qp.connect(100, &b.qp.endpoint(200), &RcParams::default()).unwrap();
    b.qp.connect(200, &a.qp.endpoint(100), &RcParams::default()).unwrap();
    (f, a, b)
}

/// [`pair`] with its second QP moved back to RESET: what the first sends is never answered.
pub(crate) fn unanswered_pair() -> (Fabric, Side, Side) {
    let (f, a, b) = pair();
    let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
    b.qp.modify(&reset, QpAttrMask::STATE).unwrap();
    (f, a, b)
}

/// A request packet from `from` to `to` with PSN `psn`.
pub(crate) fn request(kind: Kind, from: &Qp, to: &Qp, psn: u32) -> Packet {
    let mut p = Packet::new(kind);
    p.src_dev = from.0.device_index();
    p.src_qpn = from.qp_num();
    p.dst_dev = to.0.device_index();
    p.dst_qpn = to.qp_num();
    p.psn = psn;
    p
}

/// Bytes as a payload.
pub(crate) fn bytes(b: &[u8]) -> Payload {
    Payload::Bytes(b.into())
}

/// Hands `pkt` to `qp` as the fabric would, services only `qp`, and returns the packets it sent
/// back to `peer` (taken out of the peer's inbox, which nothing else drains).
pub(crate) fn feed(qp: &Qp, peer: &Qp, pkt: Packet) -> Vec<Packet> {
    let shared: &Arc<QpShared> = &qp.0;
    let fabric = shared.ctx.fabric.clone();
    let mut drv = Driver::new(&fabric);
    {
        // Mark the peer active so that nothing is delivered to it inline.
        drv.enter(Arc::as_ptr(&peer.0));
        shared.inbox.push(pkt);
        let mut g = shared.inner.lock();
        drv.service(shared, &mut g);
    }
    // Leave the peer's inbox alone: nothing more is serviced.
    drv.ready.clear();
    drv.check_timers.clear();
    drop(drv);
    peer.0.inbox.drain()
}

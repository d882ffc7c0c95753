//! XRC domains shared between processes: a SEND that reaches an XRC target QP in one process
//! for an XRC SRQ that another process created in the same domain (both opened the same file,
//! as `ibv_xsrq_pingpong` does with `/tmp/xrc_domain`; on a real HCA the domain is one object
//! of the kernel, whichever process asked).
//!
//! The target QP hands the message to the SRQ's process ([`Kind::XrcDeliver`]) and waits: that
//! process takes a receive off the SRQ, places the data, completes it on the SRQ's CQ and
//! answers ([`Kind::XrcResult`]) with what the target QP tells the requester: ACK, RNR NAK (no
//! receive posted) or a NAK (no such SRQ in the domain, a receive too small). Requests that
//! reach the target QP meanwhile wait behind the forwarded one, so they still execute in
//! order. RDMA WRITE, READ and atomics whose SRQ (and so whose PD) lives in another process
//! are NAKed with a remote access error: their memory is not this process's to reach.

use std::sync::Arc;

use super::{
    Driver, Route,
    packet::{Kind, NakCode, Packet, Payload, Syndrome},
    responder::{self, ack, fail, recv_flags, rnr},
    sgl::{self, SglError},
};
use crate::{
    fabric::FabricInner,
    objects::{mw, srq::SrqInner, xrcd::XrcdInner},
    qp::{QpInner, QpShared},
    types::{LinkLayer, Wc, WcOpcode, WcStatus},
};

/// Whether the SRQ `pkt` names may live in another process of the domain: the domain is
/// file-backed and the SRQ number belongs to another node of the host fabric.
pub(crate) fn elsewhere(qp: &QpShared, xrcd: &XrcdInner, pkt: &Packet) -> bool {
    xrcd.file.is_some() && qp.ctx.fabric.remote_node(pkt.xrc_srqn).is_some()
}

/// Hands the SEND `pkt` to the process of its SRQ; the target QP answers the requester when
/// that process has placed it (see [`result`]).
pub(crate) fn forward(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if drv.forced_rnr(&pkt) {
        rnr(qp, g, &pkt, drv);
        return;
    }
    let Some((dev, ino)) = qp.xrcd.as_ref().and_then(|x| x.file) else { return };
    let mut fwd = pkt.clone();
    fwd.kind = Kind::XrcDeliver;
    (fwd.src_dev, fwd.src_port, fwd.src_qpn) = (pkt.dst_dev, pkt.dst_port, qp.qpn);
    fwd.dst_qpn = pkt.xrc_srqn;
    (fwd.va, fwd.compare) = (dev, ino);
    let mut header = pkt;
    header.payload = Payload::None;
    g.resp.forwarded = Some(Box::new(header));
    // Between processes, not on the wire: no trace, no fault rule.
    drv.transmit(&mut Route::default(), fwd);
}

/// The SRQ's process answered: the target QP ACKs or NAKs the forwarded SEND, then executes
/// the requests that waited behind it.
pub(crate) fn result(qp: &Arc<QpShared>, g: &mut QpInner, res: &Packet, drv: &mut Driver<'_>) {
    let Some(req) = g.resp.forwarded.take_if(|r| r.psn == res.psn) else { return };
    match res.syndrome {
        Syndrome::Ack => ack(qp, g, &req, drv),
        Syndrome::Rnr(_) => rnr(qp, g, &req, drv),
        Syndrome::Nak(code) => fail(qp, g, &req, code, None, drv),
    }
    while g.resp.forwarded.is_none() {
        let Some(next) = g.resp.held.pop_front() else { break };
        responder::receive(qp, g, next, drv);
    }
}

/// In the SRQ's process: places a forwarded SEND and answers the target QP.
pub(crate) fn deliver(fabric: &FabricInner, pkt: Packet, drv: &mut Driver<'_>) {
    let mut r = Packet::new(Kind::XrcResult);
    (r.src_dev, r.src_port, r.src_qpn) = (pkt.dst_dev, pkt.dst_port, pkt.xrc_srqn);
    (r.dst_dev, r.dst_port, r.dst_qpn) = (pkt.src_dev, pkt.src_port, pkt.src_qpn);
    r.psn = pkt.psn;
    r.syndrome = place(fabric, &pkt);
    drv.transmit(&mut Route::default(), r);
}

/// What the target QP answers for `pkt`, after the receive it took (if any) completed.
fn place(fabric: &FabricInner, pkt: &Packet) -> Syndrome {
    let Some(dev) = fabric.devices.get(pkt.dst_dev as usize) else {
        return Syndrome::Nak(NakCode::RemoteAccessError);
    };
    let file = (pkt.va, pkt.compare);
    let xrcd = dev.xrcds.lock().iter().find(|(f, _)| *f == file).and_then(|(_, w)| w.upgrade());
    let Some(srq) = xrcd.and_then(|x| x.srq(pkt.xrc_srqn)) else {
        return Syndrome::Nak(NakCode::RemoteAccessError);
    };
    let Some((wr_id, sges)) = srq.pop() else { return Syndrome::Rnr(0) };
    let tgt = Wc { wr_id, qp_num: pkt.src_qpn, ..Default::default() };
    let fails = |status, code| {
        push(&srq, Wc { status, ..tgt }, true);
        Syndrome::Nak(code)
    };
    match sgl::scatter(&srq.pd, &sges, &pkt.payload, pkt.len) {
        Ok(()) => {}
        // As `responder::send`: a message longer than the receive is a local length error
        // here and an invalid request for the requester.
        Err(SglError::TooLong) => return fails(WcStatus::LOC_LEN_ERR, NakCode::InvalidRequest),
        Err(SglError::Protection) => {
            return fails(WcStatus::LOC_PROT_ERR, NakCode::RemoteOperationalError);
        }
    }
    if let Some(rkey) = pkt.inv
        && mw::invalidate(&dev.keys.read(), rkey).is_err()
    {
        return fails(WcStatus::REM_INV_REQ_ERR, NakCode::InvalidRequest);
    }
    let roce =
        dev.port(pkt.dst_port).is_ok_and(|p| p.attr.lock().link_layer == LinkLayer::ETHERNET);
    let wc = Wc {
        status: WcStatus::SUCCESS,
        opcode: WcOpcode::RECV,
        byte_len: pkt.len,
        wc_flags: recv_flags(roce, pkt),
        // `imm_data` and `invalidated_rkey` share the completion's union.
        imm_data: pkt.imm.or(pkt.inv).unwrap_or(0),
        slid: pkt.src_lid,
        ..tgt
    };
    if push(&srq, wc, pkt.solicited) {
        Syndrome::Ack
    } else {
        // A completion lost to a CQ overrun: the target QP fails (in its process).
        Syndrome::Nak(NakCode::RemoteOperationalError)
    }
}

/// Completes on the XRC SRQ's CQ; whether the CQ took it.
fn push(srq: &SrqInner, wc: Wc, solicited: bool) -> bool {
    srq.xrc.as_ref().is_some_and(|(_, cq)| cq.push(wc, solicited).is_ok())
}

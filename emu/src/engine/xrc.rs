//! XRC domains shared between processes: a SEND that reaches an XRC target QP in one process
//! for an XRC SRQ that another process created in the same domain (both opened the same file,
//! as `ibv_xsrq_pingpong` does with `/tmp/xrc_domain`; on a real HCA the domain is one object
//! of the kernel, whichever process asked).
//!
//! The target QP hands the request to the SRQ's process ([`Kind::XrcDeliver`]) and waits: that
//! process executes it against its own memory, with the SRQ's PD checking the rkey (IBA's XRC
//! annex: the XRC SRQ a request names decides the PD of its memory accesses), and answers
//! ([`Kind::XrcResult`]) with what the target QP tells the requester. A SEND (or a WRITE with
//! immediate) takes a receive off the SRQ and completes it on the SRQ's CQ: ACK, RNR NAK (no
//! receive posted) or NAK (no such SRQ in the domain, a receive too small, a bad rkey). A READ
//! comes back with the bytes read, an atomic with the value it found; the target QP sends the
//! response and keeps it for duplicates as for its own requests (a duplicate READ is read
//! again, through the SRQ's process). Requests that reach the target QP meanwhile wait behind
//! the forwarded one, so they still execute in order.

use std::sync::Arc;

use super::{
    Driver, psn_diff,
    responder::{
        self, ack, advance, fail, fetch_op, recv_flags, remember, reply, resolve, rnr, store_word,
    },
    sgl::{self, SglError},
};
use crate::packet::{Forwarded, Kind, NakCode, Packet, Payload, Syndrome};
use crate::qp::transport::{ReadReq, Replay, Route};
use crate::{
    fabric::FabricInner,
    mem::{MemFault, MemRegion},
    objects::{device::DeviceInner, mw, srq::SrqInner, xrcd::XrcdInner},
    qp::{QpInner, QpShared},
    types::{AccessFlags, Wc, WcOpcode, WcStatus},
};

/// Whether the SRQ `pkt` names may live in another process of the domain: the domain is
/// file-backed and the SRQ number belongs to another node of the host fabric.
pub(crate) fn elsewhere(qp: &QpShared, xrcd: &XrcdInner, pkt: &Packet) -> bool {
    xrcd.file.is_some() && qp.ctx.fabric.remote_node(pkt.xrc_srqn).is_some()
}

/// Hands the request `pkt` to the process of its SRQ; the target QP answers the requester when
/// that process has executed it (see [`result`]).
pub(crate) fn forward(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if pkt.kind == Kind::Send && drv.forced_rnr(&pkt) {
        rnr(qp, g, &pkt, drv);
        return;
    }
    let Some(file) = qp.xrcd.as_ref().and_then(|x| x.file) else { return };
    let mut fwd = pkt.clone();
    fwd.kind = Kind::XrcDeliver;
    fwd.forwarded = Some(Box::new(Forwarded { kind: pkt.kind, file }));
    (fwd.src_dev, fwd.src_port, fwd.src_qpn) = (pkt.dst_dev, pkt.dst_port, qp.qpn);
    fwd.dst_qpn = pkt.xrc_srqn;
    let mut header = pkt;
    if header.kind == Kind::ReadRequest {
        // Where the data goes stays with the request; the SRQ's process only reads.
        fwd.payload = Payload::None;
    } else {
        header.payload = Payload::None;
    }
    g.resp.forwarded = Some(Box::new(header));
    // Between processes, not on the wire: no trace, no fault rule.
    drv.transmit(&mut Route::default(), fwd);
}

/// The SRQ's process answered: the target QP responds to the forwarded request as if it had
/// executed it, then executes the requests that waited behind it.
pub(crate) fn result(qp: &Arc<QpShared>, g: &mut QpInner, res: Packet, drv: &mut Driver<'_>) {
    let Some(req) = g.resp.forwarded.take_if(|r| r.psn == res.psn) else { return };
    let again = psn_diff(req.psn, g.resp.epsn) < 0;
    match (res.syndrome, req.kind) {
        (Syndrome::Ack, Kind::ReadRequest) => {
            let r = ReadReq::of(&req);
            let mut resp = reply(g, &req, Kind::ReadResponse, req.psn, Syndrome::Ack);
            (resp.npkts, resp.len, resp.payload) = (req.npkts, req.len, res.payload);
            if !again {
                remember(g, Replay::Read(r));
                advance(g, &req);
            }
            resp.msn = g.resp.msn;
            drv.send(&mut g.route, resp);
        }
        (Syndrome::Ack, Kind::CompareSwap | Kind::FetchAdd) => {
            remember(g, Replay::Atomic { psn: req.psn, orig: res.orig });
            advance(g, &req);
            let mut resp = reply(g, &req, Kind::AtomicAck, req.psn, Syndrome::Ack);
            resp.orig = res.orig;
            drv.send(&mut g.route, resp);
        }
        (Syndrome::Ack, _) => ack(qp, g, &req, drv),
        (Syndrome::Rnr(_), _) => rnr(qp, g, &req, drv),
        // A duplicate READ that fails now is left unanswered, as rxe leaves one it cannot read.
        (Syndrome::Nak(_), _) if again => {}
        (Syndrome::Nak(code), _) => fail(qp, g, &req, code, None, drv),
    }
    while g.resp.forwarded.is_none() {
        let Some(next) = g.resp.held.pop_front() else { break };
        responder::receive(qp, g, next, drv);
    }
}

/// In the SRQ's process: executes a forwarded request and answers the target QP.
pub(crate) fn deliver(fabric: &FabricInner, mut pkt: Packet, drv: &mut Driver<'_>) {
    let mut r = Packet::new(Kind::XrcResult);
    (r.src_dev, r.src_port, r.src_qpn) = (pkt.dst_dev, pkt.dst_port, pkt.xrc_srqn);
    (r.dst_dev, r.dst_port, r.dst_qpn) = (pkt.src_dev, pkt.src_port, pkt.src_qpn);
    r.psn = pkt.psn;
    r.syndrome = match Target::of(fabric, &pkt) {
        Some(t) => t.execute(&mut pkt, &mut r),
        None => Syndrome::Nak(NakCode::RemoteAccessError),
    };
    drv.transmit(&mut Route::default(), r);
}

/// Where a forwarded request executes: the SRQ it names, in the domain it came from.
struct Target<'a> {
    dev: &'a DeviceInner,
    srq: Arc<SrqInner>,
    kind: Kind,
}

impl<'a> Target<'a> {
    fn of(fabric: &'a FabricInner, pkt: &Packet) -> Option<Target<'a>> {
        let dev = fabric.devices.get(pkt.dst_dev as usize)?;
        let fwd = pkt.forwarded.as_deref()?;
        let xrcds = dev.xrcds.lock();
        let xrcd = xrcds.iter().find(|(f, _)| *f == fwd.file).and_then(|(_, w)| w.upgrade())?;
        drop(xrcds);
        Some(Target { dev, srq: xrcd.srq(pkt.xrc_srqn)?, kind: fwd.kind })
    }

    /// Executes `pkt`; what the target QP answers (READ bytes and atomic results go in `res`).
    fn execute(&self, pkt: &mut Packet, res: &mut Packet) -> Syndrome {
        const ACCESS: Syndrome = Syndrome::Nak(NakCode::RemoteAccessError);
        let access = match self.kind {
            Kind::Send => return self.receive(pkt, None),
            Kind::Write | Kind::AtomicWrite => AccessFlags::REMOTE_WRITE,
            Kind::ReadRequest => AccessFlags::REMOTE_READ,
            Kind::CompareSwap | Kind::FetchAdd => AccessFlags::REMOTE_ATOMIC,
            _ => return ACCESS,
        };
        let len = if matches!(self.kind, Kind::Write | Kind::ReadRequest) { pkt.len } else { 8 };
        let dest = {
            let keys = self.dev.keys.read();
            resolve(&keys, &self.srq.pd, pkt.src_qpn, (pkt.rkey, pkt.va, len), access)
        };
        if self.kind == Kind::Write && pkt.imm.is_some() {
            // The receive is consumed, and completes with the access error if the rkey fails.
            return self.receive(pkt, Some(dest));
        }
        let Ok(dest) = dest else { return ACCESS };
        let Some((region, off)) = dest else { return Syndrome::Ack }; // zero length
        let done = match self.kind {
            Kind::Write => land(pkt, &region, off).map_err(|()| MemFault::OutOfBounds),
            Kind::AtomicWrite => store_word(pkt, &region, off),
            Kind::ReadRequest => {
                let mut bytes = vec![0; pkt.len as usize];
                let read = region.read(off, &mut bytes);
                (res.len, res.payload) = (pkt.len, Payload::Bytes(bytes.into()));
                read
            }
            // A forwarded request's own kind is `XrcDeliver`: the original is `self.kind`.
            _ => fetch_op(self.kind, pkt.compare, pkt.swap_add, &region, off).map(|v| res.orig = v),
        };
        match done {
            Ok(()) => Syndrome::Ack,
            Err(MemFault::Misaligned) => Syndrome::Nak(NakCode::InvalidRequest),
            Err(_) => ACCESS,
        }
    }

    /// A SEND, or a WRITE with immediate whose memory (if any) is `dest`: takes a receive off
    /// the SRQ, places the data and completes the receive on the SRQ's CQ.
    fn receive(&self, pkt: &Packet, dest: Option<Result<Option<MemTarget>, ()>>) -> Syndrome {
        let (srq, dev) = (&self.srq, self.dev);
        let Some((wr_id, sges)) = srq.pop() else { return Syndrome::Rnr(0) };
        let tgt = Wc { wr_id, qp_num: pkt.src_qpn, ..Default::default() };
        let fails = |status, code| {
            push(srq, Wc { status, ..tgt }, true);
            Syndrome::Nak(code)
        };
        let opcode = match dest {
            None => {
                match sgl::scatter(&srq.pd, &sges, &pkt.payload, pkt.len) {
                    Ok(()) => {}
                    // As `responder::send`: a message longer than the receive is a local length
                    // error here and an invalid request for the requester.
                    Err(SglError::TooLong) => {
                        return fails(WcStatus::LOC_LEN_ERR, NakCode::InvalidRequest);
                    }
                    Err(SglError::Protection) => {
                        return fails(WcStatus::LOC_PROT_ERR, NakCode::RemoteOperationalError);
                    }
                }
                if let Some(rkey) = pkt.inv
                    && mw::invalidate(&dev.keys.read(), rkey, None).is_err()
                {
                    return fails(WcStatus::REM_INV_REQ_ERR, NakCode::InvalidRequest);
                }
                WcOpcode::RECV
            }
            Some(dest) => {
                let placed = dest.and_then(|d| d.map_or(Ok(()), |(r, off)| land(pkt, &r, off)));
                if placed.is_err() {
                    return fails(WcStatus::REM_ACCESS_ERR, NakCode::RemoteAccessError);
                }
                WcOpcode::RECV_RDMA_WITH_IMM
            }
        };
        // XRC is the full profile's: as mlx5, no IBV_WC_GRH on a connected QP's receive.
        let wc = Wc {
            status: WcStatus::SUCCESS,
            opcode,
            byte_len: pkt.len,
            wc_flags: recv_flags(false, pkt),
            // `imm_data` and `invalidated_rkey` share the completion's union.
            imm_data: pkt.imm.or(pkt.inv).unwrap_or(0),
            slid: pkt.src_lid,
            ..tgt
        };
        if push(srq, wc, pkt.solicited) {
            Syndrome::Ack
        } else {
            // A completion lost to a CQ overrun: the target QP fails (in its process).
            Syndrome::Nak(NakCode::RemoteOperationalError)
        }
    }
}

/// Writes a WRITE's payload at `off` of `region`.
fn land(pkt: &Packet, region: &Arc<MemRegion>, off: usize) -> Result<(), ()> {
    let dst = std::iter::once((region, off, pkt.len as usize));
    sgl::copy_into(&pkt.payload, dst).map_err(|_| ())
}

/// Memory a request reaches: a region and the offset in it.
type MemTarget = (Arc<MemRegion>, usize);

/// Completes on the XRC SRQ's CQ; whether the CQ took it.
fn push(srq: &SrqInner, wc: Wc, solicited: bool) -> bool {
    srq.xrc.as_ref().is_some_and(|(_, cq)| cq.push(wc, solicited).is_ok())
}

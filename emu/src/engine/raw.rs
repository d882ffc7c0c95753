//! Raw packet QPs (`IBV_QPT_RAW_PACKET`): a send WR carries a whole Ethernet frame (or, with
//! `IBV_WR_TSO`, a header and a payload the NIC cuts into frames), flow steering decides which
//! QPs of the fabric receive it (see `engine::flow`), and a receive holds the whole frame.
//! An RSS QP has no receive queue of its own: the Toeplitz hash of the frame's selected fields
//! picks a WQ from its indirection table.
//!
//! The segment is the whole fabric: a frame also goes to every other process on the host
//! fabric, where that process's steering rules pick its receivers (each process's ports are
//! ports of their own on one switch).

use std::sync::Arc;

use super::{Driver, enter_error, responder, sgl, wc, wc_ok};
use crate::packet::{Kind, Packet, Payload};
use crate::qp::transport::Route;
use crate::{
    fabric::FabricInner,
    frame::{self, Headers},
    objects::sgl::land,
    qp::{QpInner, QpShared},
    types::{QpState, SendFlags, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode},
};

/// The smallest frame a raw send may carry: the Ethernet header a ConnectX inlines into the
/// WQE, with a VLAN tag (mlx5's `MLX5_ETH_L2_INLINE_HEADER_SIZE`).
pub(crate) const MIN_FRAME: u64 = 18;

/// Sends the WQE at `idx` of a raw packet QP: gathers its bytes, applies the offloads it asks
/// for and puts the frame(s) on the segment. The WR is complete once they left.
pub(crate) fn transmit(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    idx: u32,
    drv: &mut Driver<'_>,
) -> Result<(), WcStatus> {
    let wqe = g.sq.ring.at(idx);
    let bytes = if wqe.flags.contains(SendFlags::INLINE) {
        wqe.inline.clone()
    } else {
        let payload = sgl::resolve(qp, &wqe.sges, false).map_err(|_| WcStatus::LOC_PROT_ERR)?;
        let mut out = vec![0u8; wqe.length as usize];
        sgl::gather(&payload, &mut out).map_err(|_| WcStatus::LOC_PROT_ERR)?;
        out
    };
    let frames = if wqe.opcode == WrOpcode::TSO {
        frame::segment(&wqe.tso_hdr, &bytes, wqe.mss as usize)
    } else {
        let mut f = bytes;
        if wqe.flags.contains(SendFlags::IP_CSUM) {
            frame::insert_checksums(&mut f);
        }
        vec![f]
    };
    let port = g.attr.port_num;
    for f in frames {
        send_frame(qp, port, f, drv);
    }
    Ok(())
}

/// Puts one frame on the segment: a copy to every QP steering gives it to, here and in the
/// other processes of the host fabric.
fn send_frame(qp: &Arc<QpShared>, port: u8, f: Vec<u8>, drv: &mut Driver<'_>) {
    let fabric = &qp.ctx.fabric;
    let Some(h) = Headers::parse(&f) else { return };
    let mut pkt = Packet::new(Kind::Raw);
    pkt.src_dev = qp.device_index();
    pkt.src_qpn = qp.qpn;
    pkt.src_port = port;
    pkt.dst_qpn = super::requester::MULTICAST_QPN;
    pkt.len = f.len() as u32;
    pkt.payload = Payload::Bytes(f.into());
    if let Some(pcap) = &fabric.pcap {
        // Once per frame, however many receivers it has.
        pcap.record(fabric, &pkt, drv.now(), false);
    }
    fabric.multicast_to_other_nodes(&pkt);
    steer(fabric, &h, &pkt, drv);
}

/// Hands a frame that another process put on the segment to the QPs steering here picks.
pub(crate) fn arrived(fabric: &FabricInner, pkt: &Packet, drv: &mut Driver<'_>) {
    let Payload::Bytes(f) = &pkt.payload else { return };
    if let Some(h) = Headers::parse(f) {
        steer(fabric, &h, pkt, drv);
    }
}

/// Sends a copy of the frame `pkt` (headers `h`) to every QP of this fabric that steering picks
/// (never back to the QP that sent it).
fn steer(fabric: &FabricInner, h: &Headers, pkt: &Packet, drv: &mut Driver<'_>) {
    for s in fabric.steer(h, pkt.src_qpn) {
        let mut copy = pkt.clone();
        copy.dst_dev = s.dev;
        copy.dst_port = s.port;
        copy.dst_qpn = s.qp.qpn;
        // A frame has no immediate data: the word carries the flow tag.
        copy.imm = Some(s.tag);
        drv.send(&mut Route::default(), copy);
    }
}

/// A frame steered to this QP.
pub(crate) fn receive(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet) {
    let Payload::Bytes(f) = &pkt.payload else { return };
    let Some(h) = Headers::parse(f) else { return };
    if let Some(rss) = &qp.rss {
        let hash = frame::rss_hash(&rss.key, rss.fields, &h);
        let wqs = &rss.table.wqs;
        let wq = &wqs[hash as usize & (wqs.len() - 1)];
        wq.deliver(f, pkt.imm.unwrap_or(0));
        return;
    }
    if !matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
        || pkt.dst_port != g.attr.port_num
    {
        return;
    }
    // No receive posted: the frame is dropped, as a NIC drops it.
    let Some(r) = responder::pop_recv(qp, g) else { return };
    let landed = land(qp.rx_offloads, &qp.pd, &r.sges, f);
    let wr_id = r.wr_id;
    responder::done_recv(qp, r);
    let wc = match landed {
        Ok(l) => Wc {
            flow_tag: pkt.imm.unwrap_or(0),
            ..l.wc(wc_ok(qp, wr_id, WcOpcode::RECV, 0, WcFlags::empty()))
        },
        Err(status) => {
            let _ = qp.recv_cq.push(wc(qp, wr_id, status), true);
            enter_error(qp, g);
            return;
        }
    };
    if qp.recv_cq.push(wc, false).is_err() {
        enter_error(qp, g);
    }
}

//! Raw packet QPs (`IBV_QPT_RAW_PACKET`): a send WR carries a whole Ethernet frame (or, with
//! `IBV_WR_TSO`, a header and a payload the NIC cuts into frames), flow steering decides which
//! QPs of the fabric receive it (see `objects::flow`), and a receive holds the whole frame.
//! An RSS QP has no receive queue of its own: the Toeplitz hash of the frame's selected fields
//! picks a WQ from its indirection table.
//!
//! Frames travel within one process (the host fabric between processes carries RDMA only).

use std::sync::Arc;

use super::{
    Driver, Route, enter_error,
    frame::{self, Headers},
    packet::{Kind, Packet, Payload},
    responder, sgl, wc, wc_ok,
};
use crate::{
    objects::wq::IndTableInner,
    qp::{QpInner, QpShared},
    types::{QpState, SendFlags, WcFlags, WcOpcode, WcStatus, WrOpcode},
};

/// The smallest frame a raw send may carry: the Ethernet header a ConnectX inlines into the
/// WQE, with a VLAN tag (mlx5's `MLX5_ETH_L2_INLINE_HEADER_SIZE`).
pub(crate) const MIN_FRAME: u64 = 18;

/// What makes a raw packet QP an RSS QP.
#[derive(Debug)]
pub(crate) struct Rss {
    pub(crate) table: Arc<IndTableInner>,
    pub(crate) key: Vec<u8>,
    pub(crate) fields: u64,
}

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

/// Puts one frame on the segment: a copy to every QP steering gives it to.
fn send_frame(qp: &Arc<QpShared>, port: u8, f: Vec<u8>, drv: &mut Driver<'_>) {
    let fabric = &qp.ctx.fabric;
    let Some(h) = Headers::parse(&f) else { return };
    let mut pkt = Packet::new(Kind::Raw);
    pkt.src_dev = qp.device_index();
    pkt.src_qpn = qp.qpn;
    pkt.src_port = port;
    pkt.len = f.len() as u32;
    pkt.payload = Payload::Bytes(f.into_boxed_slice());
    if let Some(pcap) = &fabric.pcap {
        // Once per frame, however many receivers it has.
        pcap.record(fabric, &pkt, drv.now(), false);
    }
    for (dev, port, dst) in fabric.steer(&h, qp.qpn) {
        let mut copy = pkt.clone();
        copy.dst_dev = dev;
        copy.dst_port = port;
        copy.dst_qpn = dst.qpn;
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
        wq.deliver(qp, &pkt.payload, pkt.len);
        return;
    }
    if !matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
        || pkt.dst_port != g.attr.port_num
    {
        return;
    }
    // No receive posted: the frame is dropped, as a NIC drops it.
    let Some(r) = responder::pop_recv(qp, g) else { return };
    let res = sgl::scatter(qp, &qp.pd, &r.sges, &pkt.payload, pkt.len);
    let wr_id = r.wr_id;
    responder::done_recv(g, r);
    let status = match res {
        Ok(()) => WcStatus::SUCCESS,
        Err(sgl::SglError::TooLong) => WcStatus::LOC_LEN_ERR,
        Err(sgl::SglError::Protection) => WcStatus::LOC_PROT_ERR,
    };
    if status != WcStatus::SUCCESS {
        let _ = qp.recv_cq.push(wc(qp, wr_id, status), true);
        enter_error(qp, g);
        return;
    }
    let mut flags = WcFlags::empty();
    if frame::ipv4_checksums_ok(f, &h) {
        flags |= WcFlags::IP_CSUM_OK;
    }
    if qp.recv_cq.push(wc_ok(qp, wr_id, WcOpcode::RECV, pkt.len, flags), false).is_err() {
        enter_error(qp, g);
    }
}

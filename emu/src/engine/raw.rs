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

use super::{
    Driver, Route, enter_error,
    packet::{Kind, Packet, Payload},
    responder, sgl, wc, wc_ok,
};
use crate::{
    fabric::FabricInner,
    frame::{self, Headers},
    objects::{pd::PdInner, wq::IndTableInner},
    qp::{QpInner, QpShared},
    types::{QpState, SendFlags, Sge, Wc, WcFlags, WcOpcode, WcStatus, WqFlags, WrOpcode},
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

/// What the completion of a receive that took a frame reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Landed {
    byte_len: u32,
    cvlan: u16,
    flags: WcFlags,
}

impl Landed {
    /// `base` (a successful receive completion) with what the frame gave it.
    pub(crate) fn wc(self, base: Wc) -> Wc {
        Wc {
            byte_len: self.byte_len,
            cvlan: self.cvlan,
            wc_flags: base.wc_flags | self.flags,
            ..base
        }
    }
}

/// Writes the received frame `f` into the receive buffers `sges` (which must be in `pd`) as the
/// receive offloads `rx` shape it: the C-VLAN tag taken out, the FCS written after the frame,
/// the last cache line filled with zeros. The status of a receive that cannot take it.
pub(crate) fn land(
    rx: WqFlags,
    pd: &Arc<PdInner>,
    sges: &[Sge],
    f: &[u8],
) -> Result<Landed, WcStatus> {
    let mut flags = WcFlags::empty();
    if Headers::parse(f).is_some_and(|h| frame::ipv4_checksums_ok(f, &h)) {
        flags |= WcFlags::IP_CSUM_OK;
    }
    let stripped = if rx.contains(WqFlags::CVLAN_STRIPPING) { frame::strip_cvlan(f) } else { None };
    let (mut bytes, cvlan) = stripped.unwrap_or_else(|| (f.to_vec(), 0));
    if rx.contains(WqFlags::SCATTER_FCS) {
        // The FCS covers the frame as the wire carried it, tag included.
        bytes.extend_from_slice(&frame::fcs(f));
    }
    let byte_len = bytes.len() as u32;
    if rx.contains(WqFlags::PCI_WRITE_END_PADDING) {
        bytes.resize(bytes.len() + end_padding(sges, bytes.len() as u64), 0);
    }
    let n = bytes.len() as u32;
    sgl::scatter(pd, sges, &Payload::Bytes(bytes.into()), n).map_err(|e| match e {
        sgl::SglError::TooLong => WcStatus::LOC_LEN_ERR,
        sgl::SglError::Protection => WcStatus::LOC_PROT_ERR,
    })?;
    Ok(Landed { byte_len, cvlan, flags })
}

/// The cache line the end padding fills.
const CACHE_LINE: u64 = 64;

/// How many bytes after the first `len` of the buffers `sges` complete the cache line the last
/// byte lands in (within that SGE: padding never writes where the receive does not point).
fn end_padding(sges: &[Sge], len: u64) -> usize {
    let mut left = len;
    for s in sges.iter().filter(|s| s.length > 0) {
        let room = u64::from(s.length);
        if left <= room {
            let end = s.addr.wrapping_add(left);
            let pad = end.checked_next_multiple_of(CACHE_LINE).map_or(0, |e| e - end);
            return pad.min(room - left) as usize;
        }
        left -= room;
    }
    0
}

//! A large RDMA WRITE (with or without immediate) from another process, placed piece by piece
//! as its ring records arrive.
//!
//! Held until whole, a message's bytes are copied into the ring by the sender and out of it by
//! the receiver one after the other: the two copies of a 1 MiB WRITE never overlap. Landed as
//! it comes, each record is copied out while the sender writes the next, as a NIC's DMA places
//! a message packet by packet.
//!
//! A WRITE lands only when the responder would take it as its next request and place it: an RC
//! QP with nothing waiting before it, its PSN the one expected, the QP and an MR (not a
//! window, not on-demand memory) granting the remote write. Everything else waits until whole
//! and takes the packet path as before. Each piece lands only while the rkey still names the
//! MR it began with; once a piece cannot land (deregistered meanwhile, or memory that went
//! away under its MR), the rest is dropped and the responder answers the whole WRITE with the
//! remote access error a failed copy gets. The finished request then goes through the
//! responder as any other (PSN, state, rkey and ACK), only without its copy. As with a NIC,
//! what landed stays where it landed if the QP is reset or moves to an error meanwhile.

use std::sync::Arc;

use super::{
    Driver,
    packet::{Kind, MemRef, Packet, Payload},
    responder,
};
use crate::{
    fabric::FabricInner,
    mem::MemRegion,
    qp::QpShared,
    types::{AccessFlags, QpState, QpType},
};

/// A WRITE being landed.
#[derive(Debug)]
pub(crate) struct Landing {
    qp: Arc<QpShared>,
    /// The request, without its payload.
    pkt: Packet,
    region: Arc<MemRegion>,
    /// Where in `region` the message begins, and where its next byte lands.
    start: usize,
    at: usize,
    /// Payload bytes still to come.
    left: usize,
    /// Every piece so far landed.
    intact: bool,
}

impl Landing {
    /// Begins landing `pkt`, the head of a WRITE to our QP `qp` (whose payload follows), if
    /// the responder would take it now and place it.
    pub(crate) fn begin(fabric: &FabricInner, qp: &Arc<QpShared>, pkt: Packet) -> Option<Landing> {
        // A WRITE with immediate too: its data lands as it arrives, and it takes its receive
        // (or is RNR NAKed, to come again) once whole, as on an HCA, where only the last packet
        // needs a receive.
        let write = pkt.kind == Kind::Write && !pkt.gap && pkt.len > 0;
        // Fault rules, traces and simulated time see whole packets only.
        if !write || qp.qp_type != QpType::RC || qp.xrcd.is_some() || !fabric.express() {
            return None;
        }
        let mut g = qp.inner.lock();
        if !qp.inbox.is_empty() {
            // The requests before it (the last WRITE of a stream, say) go first, as they
            // would, so that this one can be judged as the next.
            let mut drv = Driver::new(fabric);
            drv.service(qp, &mut g);
            drop(g);
            drv.finish();
            g = qp.inner.lock();
        }
        let takes = matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
            && pkt.dst_port == g.attr.port_num
            && pkt.transport == QpType::RC
            && g.resp.forwarded.is_none()
            && qp.inbox.is_empty()
            && g.resp.epsn == pkt.psn
            && !responder::refused(&g, &pkt);
        if !takes {
            return None;
        }
        let keys = qp.ctx.device.keys.read();
        let key = (pkt.rkey, pkt.va, pkt.len);
        let (mr, start) =
            responder::mr_target(&keys, &qp.pd, key, AccessFlags::REMOTE_WRITE)?.ok()?;
        if mr.region.on_demand() {
            return None;
        }
        let (region, left) = (mr.region.clone(), pkt.len as usize);
        Some(Landing { qp: qp.clone(), pkt, region, start, at: start, left, intact: true })
    }

    /// Lands the next `bytes` of the payload (the caller checked they belong to it).
    pub(crate) fn land(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.left);
        if self.intact {
            // Under the key table's lock, as the MR is deregistered under it.
            let keys = self.qp.ctx.device.keys.read();
            let still =
                keys.mr(self.pkt.rkey).is_some_and(|mr| Arc::ptr_eq(&mr.region, &self.region));
            self.intact = still && self.region.write(self.at, &bytes[..n]).is_ok();
        }
        self.at += n;
        self.left -= n;
    }

    /// Payload bytes still to come.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// The request, its payload landed (or not, if a piece could not), for the responder.
    pub(crate) fn finish(self) -> Packet {
        let mut pkt = self.pkt;
        let landed = MemRef { region: self.region, offset: self.start, len: pkt.len as usize };
        pkt.payload = Payload::Landed((self.intact && self.left == 0).then_some(landed));
        pkt
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::engine::{
        packet::{NakCode, Syndrome},
        testkit::{Side, feed, pair, request},
    };

    /// The head of a 3,000-byte WRITE (three packets) from `a` to the start of `b`'s memory.
    fn head(a: &Side, b: &Side, psn: u32) -> Packet {
        let mut p = request(Kind::Write, &a.qp, &b.qp, psn);
        (p.va, p.rkey, p.len, p.npkts) = (b.mr.addr(), b.mr.rkey(), 3000, 3);
        p
    }

    fn begin(b: &Side, pkt: Packet) -> Option<Landing> {
        Landing::begin(&b.qp.0.ctx.fabric, &b.qp.0, pkt)
    }

    #[test]
    fn test_a_write_lands_as_it_arrives_then_is_acknowledged_once_whole() {
        let (_f, a, b) = pair();
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut l = begin(&b, head(&a, &b, 100)).expect("the next request, allowed: it lands");
        l.land(&data[..1000]);
        let mut got = vec![0u8; 3000];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(&got[..1000], &data[..1000], "placed before the rest arrived");
        assert!(got[1000..].iter().all(|&x| x == 0));
        l.land(&data[1000..2500]);
        l.land(&data[2500..]);
        assert_eq!(l.left(), 0);
        let out = feed(&b.qp, &a.qp, l.finish());
        assert_eq!((out.len(), out[0].kind, out[0].syndrome), (1, Kind::Ack, Syndrome::Ack));
        assert_eq!(out[0].psn, 102, "the ACK of the WRITE's last packet");
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(got, data);
        assert_eq!(b.qp.query().unwrap().rq_psn, 103);
    }

    #[test]
    fn test_only_a_write_the_responder_would_place_next_lands() {
        let (_f, a, b) = pair();
        let wrong = [
            |p: &mut Packet| p.psn = 101,
            |p: &mut Packet| p.rkey ^= 0x100,
            |p: &mut Packet| p.len = 4097,
            |p: &mut Packet| p.kind = Kind::Send,
            |p: &mut Packet| p.transport = QpType::UC,
        ];
        for (i, spoil) in wrong.iter().enumerate() {
            let mut p = head(&a, &b, 100);
            spoil(&mut p);
            assert!(begin(&b, p).is_none(), "case {i}");
        }
        let err = crate::QpAttr { qp_state: QpState::ERR, ..Default::default() };
        b.qp.modify(&err, crate::QpAttrMask::STATE).unwrap();
        assert!(begin(&b, head(&a, &b, 100)).is_none(), "a QP in error takes nothing");
    }

    #[test]
    fn test_a_write_with_immediate_lands_and_takes_its_receive_once_whole() {
        let (_f, a, b) = pair();
        let mut pkt = head(&a, &b, 100);
        pkt.imm = Some(0x0102_0304);
        let mut l = begin(&b, pkt.clone()).expect("it lands");
        l.land(&[9; 3000]);
        // No receive posted: the whole WRITE is RNR NAKed, its data already in place.
        let out = feed(&b.qp, &a.qp, l.finish());
        assert!(matches!(out[0].syndrome, Syndrome::Rnr(_)), "{:?}", out[0].syndrome);
        assert_eq!(b.mr.read_u64(0).unwrap(), u64::from_ne_bytes([9; 8]));
        assert_eq!(b.qp.query().unwrap().rq_psn, 100, "the WRITE comes again");
        b.qp.post_recv(&crate::RecvWr { wr_id: 77, sg_list: &[] }).unwrap();
        let mut l = begin(&b, pkt).expect("it comes again and lands");
        l.land(&[8; 3000]);
        let out = feed(&b.qp, &a.qp, l.finish());
        assert_eq!((out[0].kind, out[0].syndrome), (Kind::Ack, Syndrome::Ack));
        let wc = b.cq.poll_one().expect("the receive completes");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.imm_data),
            (77, crate::WcOpcode::RECV_RDMA_WITH_IMM, 0x0102_0304)
        );
        assert_eq!(wc.byte_len, 3000);
        assert_eq!(b.mr.read_u64(2992).unwrap(), u64::from_ne_bytes([8; 8]));
    }

    #[test]
    fn test_requests_waiting_before_it_are_executed_first() {
        let (_f, a, b) = pair();
        let mut first = request(Kind::Write, &a.qp, &b.qp, 100);
        (first.va, first.rkey, first.len) = (b.mr.addr() + 3000, b.mr.rkey(), 2);
        first.payload = Payload::Bytes(b"hi"[..].into());
        b.qp.0.inbox.push(first);
        let l = begin(&b, head(&a, &b, 101)).expect("the next request once the first is done");
        let mut got = [0u8; 2];
        b.mr.read(3000, &mut got).unwrap();
        assert_eq!(&got, b"hi");
        assert!(b.qp.0.inbox.is_empty());
        drop(l);
    }

    #[test]
    fn test_a_deregistration_midway_stops_the_rest_and_the_write_fails() {
        let (_f, a, b) = pair();
        let mut l = begin(&b, head(&a, &b, 100)).unwrap();
        l.land(&[1; 1000]);
        b.mr.dereg().unwrap();
        l.land(&[2; 2000]);
        let pkt = l.finish();
        assert!(matches!(pkt.payload, Payload::Landed(None)));
        let out = feed(&b.qp, &a.qp, pkt);
        assert_eq!(out[0].syndrome, Syndrome::Nak(NakCode::RemoteAccessError));
    }
}

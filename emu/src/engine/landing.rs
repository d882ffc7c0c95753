//! A large RDMA WRITE (with or without immediate) or SEND from another process, placed piece
//! by piece as its ring records arrive.
//!
//! Held until whole, a message's bytes are copied into the ring by the sender and out of it by
//! the receiver one after the other: the two copies of a 1 MiB WRITE never overlap. Landed as
//! it comes, each record is copied out while the sender writes the next, as a NIC's DMA places
//! a message packet by packet.
//!
//! A message lands only when the responder would take it as its next request and place it: an
//! RC QP with nothing waiting before it, its PSN the one expected; for a WRITE, the QP and an MR
//! (not a window, not on-demand memory) granting the remote write; for a SEND, a receive WQE
//! posted on the QP's own receive queue whose SGEs hold it. Everything else waits until whole
//! and takes the packet path as before. Each piece lands only while its key still names the
//! MR it began with; once a piece cannot land (deregistered meanwhile, or memory that went
//! away under its MR), the rest is dropped and the responder answers the whole message as the
//! failed copy it was (a remote access error for a WRITE; a local protection error on the
//! receive, for a SEND). The finished request then goes through the responder as any other
//! (PSN, state, keys, receive and ACK), only without its copy. As with a NIC, what landed
//! stays where it landed if the QP is reset or moves to an error meanwhile.

use std::sync::Arc;

use super::{Driver, responder};
use crate::packet::{Kind, Landed, MemRef, Packet, Payload};
use crate::{
    fabric::FabricInner,
    objects::{keys::KeyTable, pd::PdInner},
    qp::QpShared,
    types::{AccessFlags, QpState, QpType, Sge},
};

/// A WRITE or SEND being landed.
#[derive(Debug)]
pub(crate) struct Landing {
    qp: Arc<QpShared>,
    /// The request, without its payload.
    pkt: Packet,
    /// Where the payload lands, in order, each range with the key that names its MR (the
    /// WRITE's rkey, or the lkey of an SGE of the receive WQE a SEND lands in).
    dst: Vec<(u32, MemRef)>,
    /// The range being filled, and how much of it is.
    cur: usize,
    filled: usize,
    /// Payload bytes still to come.
    left: usize,
    /// Every piece so far landed.
    intact: bool,
    /// A SEND: the slot of the receive WQE it lands in.
    rq_slot: Option<u32>,
}

impl Landing {
    /// Begins landing `pkt`, the head of a WRITE or SEND to our QP `qp` (whose payload
    /// follows), if the responder would take it now and place it: for a SEND, in the receive
    /// WQE at the head of the QP's own receive queue (one of an SRQ may be taken meanwhile by
    /// another QP), whose SGEs must hold it.
    pub(crate) fn begin(fabric: &FabricInner, qp: &Arc<QpShared>, pkt: Packet) -> Option<Landing> {
        // A WRITE with immediate too: its data lands as it arrives, and it takes its receive
        // (or is RNR NAKed, to come again) once whole, as on an HCA, where only the last packet
        // needs a receive.
        let lands = matches!(pkt.kind, Kind::Write | Kind::Send) && !pkt.gap && pkt.len > 0;
        // Fault rules, traces and simulated time see whole packets only.
        if !lands || qp.qp_type != QpType::RC || qp.xrcd.is_some() || !fabric.express() {
            return None;
        }
        if pkt.kind == Kind::Send && qp.srq.is_some() {
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
        let len = pkt.len as usize;
        let (dst, rq_slot) = if pkt.kind == Kind::Write {
            let key = (pkt.rkey, pkt.va, pkt.len);
            let (mr, offset) =
                responder::mr_target(&keys, &qp.pd, key, AccessFlags::REMOTE_WRITE)?.ok()?;
            let region = (!mr.region.on_demand()).then(|| mr.region.clone())?;
            (vec![(pkt.rkey, MemRef { region, offset, len })], None)
        } else {
            // None posted: the packet path answers with an RNR NAK.
            let (sges, slot) = qp.rq.peek()?;
            (receive_ranges(&keys, responder::own_recv_pd(qp), sges, len)?, Some(slot))
        };
        drop(keys);
        let (cur, filled, intact) = (0, 0, true);
        Some(Landing { qp: qp.clone(), pkt, dst, cur, filled, left: len, intact, rq_slot })
    }

    /// Lands the next `bytes` of the payload (the caller checked they belong to it).
    pub(crate) fn land(&mut self, mut bytes: &[u8]) {
        let n = bytes.len().min(self.left);
        self.left -= n;
        bytes = &bytes[..n];
        // Under the key table's lock, as MRs are deregistered under it.
        let keys = self.qp.ctx.device.keys.read();
        while !bytes.is_empty() {
            let Some((key, m)) = self.dst.get(self.cur) else { return };
            let k = bytes.len().min(m.len - self.filled);
            // Each piece only while its key still names the MR it began with.
            let still = keys.mr(*key).is_some_and(|mr| Arc::ptr_eq(&mr.region, &m.region));
            self.intact &= still && m.region.write(m.offset + self.filled, &bytes[..k]).is_ok();
            bytes = &bytes[k..];
            self.filled += k;
            if self.filled == m.len {
                (self.cur, self.filled) = (self.cur + 1, 0);
            }
        }
    }

    /// Payload bytes still to come.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// The request, its payload landed (or not, if a piece could not), for the responder.
    pub(crate) fn finish(self) -> Packet {
        let mut pkt = self.pkt;
        let landed = (self.intact && self.left == 0).then(|| {
            let dst = self.dst.into_iter().map(|(_, m)| m).collect();
            Box::new(Landed { dst, rq_slot: self.rq_slot })
        });
        pkt.payload = Payload::Landed(landed);
        pkt
    }
}

/// The memory a SEND of `len` bytes lands in through the receive SGEs `sges`, as the packet
/// path's scatter checks it: room for it all, and every SGE the data reaches an lkey of a
/// writable MR of `pd` (not on-demand memory) that holds it. `None` for anything else (the
/// packet path then gives its exact error).
fn receive_ranges(
    keys: &KeyTable,
    pd: &Arc<PdInner>,
    sges: &[Sge],
    len: usize,
) -> Option<Vec<(u32, MemRef)>> {
    let mut left = len;
    let mut out = Vec::new();
    for s in sges.iter().filter(|s| s.length > 0) {
        if left == 0 {
            break;
        }
        let mr = keys.mr(s.lkey)?;
        let writable = Arc::ptr_eq(&mr.pd, pd) && mr.access.contains(AccessFlags::LOCAL_WRITE);
        let offset = mr.offset_of(s.addr, s.length as u64).filter(|_| writable)?;
        if mr.region.on_demand() {
            return None;
        }
        let take = left.min(s.length as usize);
        left -= take;
        out.push((s.lkey, MemRef { region: mr.region.clone(), offset, len: take }));
    }
    (left == 0).then_some(out)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::{
        engine::testkit::{Side, feed, pair, request},
        packet::{NakCode, Syndrome},
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

    /// The head of a 3,000-byte SEND (three packets) from `a` to `b`.
    fn send_head(a: &Side, b: &Side) -> Packet {
        let mut p = request(Kind::Send, &a.qp, &b.qp, 100);
        (p.len, p.npkts) = (3000, 3);
        p
    }

    fn post_recv(b: &Side, wr_id: u64, sges: &[crate::Sge]) {
        b.qp.post_recv(&crate::RecvWr { wr_id, sg_list: sges }).unwrap();
    }

    fn sge(s: &Side, off: u64, len: u32) -> crate::Sge {
        crate::Sge { addr: s.mr.addr() + off, length: len, lkey: s.mr.lkey() }
    }

    #[test]
    fn test_a_send_lands_across_the_sges_of_the_posted_receive_as_it_arrives() {
        let (_f, a, b) = pair();
        post_recv(&b, 5, &[sge(&b, 0, 1000), sge(&b, 2000, 2096)]);
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        let mut l = begin(&b, send_head(&a, &b)).expect("a receive that holds it: it lands");
        l.land(&data[..1500]);
        let mut got = vec![0u8; 4096];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(&got[..1000], &data[..1000]);
        assert_eq!(&got[2000..2500], &data[1000..1500], "placed before the rest arrived");
        l.land(&data[1500..]);
        let out = feed(&b.qp, &a.qp, l.finish());
        assert_eq!((out[0].kind, out[0].syndrome, out[0].psn), (Kind::Ack, Syndrome::Ack, 102));
        let wc = b.cq.poll_one().expect("the receive completes");
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (5, crate::WcStatus::SUCCESS, crate::WcOpcode::RECV)
        );
        assert_eq!(wc.byte_len, 3000);
        b.mr.read(0, &mut got).unwrap();
        assert_eq!((&got[..1000], &got[2000..4000]), (&data[..1000], &data[1000..]));
        assert!(got[1000..2000].iter().all(|&x| x == 0), "between the SGEs: untouched");
    }

    #[test]
    fn test_a_send_lands_only_in_a_receive_that_holds_it() {
        let (_f, a, b) = pair();
        assert!(begin(&b, send_head(&a, &b)).is_none(), "no receive: the packet path's RNR");
        post_recv(&b, 1, &[sge(&b, 0, 2999)]);
        assert!(begin(&b, send_head(&a, &b)).is_none(), "too small: its length error");
        let (_f, a, b) = pair();
        let mut bad = sge(&b, 0, 3000);
        bad.lkey ^= 0x100;
        post_recv(&b, 1, &[bad]);
        assert!(begin(&b, send_head(&a, &b)).is_none(), "a bad lkey: its protection error");
    }

    #[test]
    fn test_a_send_whose_receive_memory_goes_midway_fails_its_receive() {
        let (_f, a, b) = pair();
        post_recv(&b, 9, &[sge(&b, 0, 4096)]);
        let mut l = begin(&b, send_head(&a, &b)).unwrap();
        l.land(&[1; 1000]);
        b.mr.dereg().unwrap();
        l.land(&[2; 2000]);
        let out = feed(&b.qp, &a.qp, l.finish());
        assert_eq!(out[0].syndrome, Syndrome::Nak(NakCode::RemoteOperationalError));
        let wc = b.cq.poll_one().unwrap();
        assert_eq!((wc.wr_id, wc.status), (9, crate::WcStatus::LOC_PROT_ERR));
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

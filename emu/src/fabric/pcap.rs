//! Packet traces: every packet the fabric sends, written as the RoCE v2 frames a NIC would put
//! on the wire (Ethernet, IPv4 or IPv6 from the GIDs, UDP to port 4791, BTH and the extended
//! headers, payload, ICRC), in the classic pcap format that Wireshark and tshark read.
//!
//! A message the engine moves as one unit is written as its packets (FIRST/MIDDLE/LAST at the
//! path MTU, consecutive PSNs). A packet a fault corrupts is written with a wrong ICRC, as the
//! receiver would see it. Each frame is written with one `write` as it is sent, so a trace
//! survives a process that is killed.

use std::{fs::File, io::Write, path::Path};

use crate::sync::Mutex;

use super::{
    FabricInner,
    roce::{icrc, op},
};
use crate::{
    error::Result,
    frame::{csum_add, fold, ipv4_header, ipv6_first_word},
    packet::{Kind, NakCode, Packet, Payload, Syndrome},
    types::{Grh, QpType},
};

/// The UDP port of RoCE v2.
pub(crate) const ROCE_V2_PORT: u16 = 4791;

#[derive(Debug)]
pub(crate) struct Pcap {
    file: Mutex<File>,
}

impl Pcap {
    /// Creates (or truncates) `path` and writes the pcap file header (Ethernet link type).
    pub(crate) fn create(path: &Path) -> Result<Pcap> {
        let fail = |e: std::io::Error| {
            crate::Error::new(
                crate::Errno(e.raw_os_error().unwrap_or(libc::EIO)),
                "cannot write the packet trace file",
            )
        };
        let mut file = File::create(path).map_err(fail)?;
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65535u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        file.write_all(&h).map_err(fail)?;
        Ok(Pcap { file: Mutex::new(file) })
    }

    /// Writes `pkt` as it leaves at `now` (nanoseconds); `damaged`: with a wrong ICRC.
    pub(crate) fn record(&self, fabric: &FabricInner, pkt: &Packet, now: u64, damaged: bool) {
        if let (Kind::Raw, Payload::Bytes(f)) = (pkt.kind, &pkt.payload) {
            // A raw packet QP's frame is already what the wire carries.
            return self.write_frame(now, f);
        }
        let transport = fabric.lookup_qp_any(pkt.src_qpn).map_or(QpType::RC, |q| q.qp_type);
        let ends = Ends::of(fabric, pkt, transport);
        let payload = payload_bytes(pkt);
        let mut out = Vec::new();
        for seg in segments(pkt, transport, payload.len()) {
            let data = &payload[seg.data.clone()];
            let frame = frame(&ends, &seg.headers, data, damaged);
            record_header(&mut out, now, frame.len());
            out.extend_from_slice(&frame);
        }
        // A trace that cannot be written loses frames, never the traffic.
        let _ = self.file.lock().write_all(&out);
    }

    fn write_frame(&self, now: u64, frame: &[u8]) {
        let mut out = Vec::with_capacity(16 + frame.len());
        record_header(&mut out, now, frame.len());
        out.extend_from_slice(frame);
        let _ = self.file.lock().write_all(&out);
    }
}

/// A pcap record header: the time and the captured and original lengths.
fn record_header(out: &mut Vec<u8>, now: u64, len: usize) {
    out.extend_from_slice(&((now / 1_000_000_000) as u32).to_le_bytes());
    out.extend_from_slice(&((now / 1000 % 1_000_000) as u32).to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

/// The bytes of an Ethernet header, before the IP header.
pub(super) const ETHERNET_LEN: usize = 14;

/// The addresses of both ends, and the IP header's other fields.
pub(super) struct Ends {
    pub(super) ip: Grh,
    pub(super) src_port: u16,
}

impl Ends {
    fn of(fabric: &FabricInner, pkt: &Packet, transport: QpType) -> Ends {
        let gid = |dev: u32, port: u8| {
            let d = fabric.devices.get(dev as usize)?;
            d.port(port).ok()?.gids.first().map(|e| e.gid)
        };
        let ip = match &pkt.grh {
            Some(g) => **g,
            None => Grh {
                sgid: gid(pkt.src_dev, pkt.src_port).unwrap_or_default(),
                dgid: gid(pkt.dst_dev, pkt.dst_port).unwrap_or_default(),
                hop_limit: 64,
                ..Grh::default()
            },
        };
        let src_port = udp_source_port(transport, pkt.src_qpn, pkt.dst_qpn, ip.flow_label);
        Ends { ip, src_port }
    }
}

/// The UDP source port of a RoCE v2 packet, as rxe (Linux 6.1) picks it, in 0xc000..: for a
/// connected QP from the flow label, or where that is 0 from the product of the two QPNs (the
/// same both ways, so requests and responses share it); for a datagram QP from its own QPN.
pub(super) fn udp_source_port(
    transport: QpType,
    src_qpn: u32,
    dst_qpn: u32,
    flow_label: u32,
) -> u16 {
    if transport == QpType::UD {
        let hash = src_qpn.wrapping_mul(0x61c8_8647) >> (32 - 14);
        return 0xc000 + hash as u16;
    }
    let label = match flow_label & 0xf_ffff {
        0 => {
            let mut v = u64::from(src_qpn) * u64::from(dst_qpn);
            v ^= v >> 20;
            v ^= v >> 40;
            (v & 0xf_ffff) as u32
        }
        l => l,
    };
    let low = (label & 0x3fff) ^ (label & 0xf_c000) >> 14;
    0xc000 | low as u16
}

/// One packet of a message: its transport headers (BTH onwards) and its part of the payload.
pub(super) struct Segment {
    pub(super) headers: Vec<u8>,
    pub(super) data: std::ops::Range<usize>,
}

/// The payload as bytes (read from memory where the packet refers to it).
pub(super) fn payload_bytes(pkt: &Packet) -> Vec<u8> {
    fn read(out: &mut Vec<u8>, m: &crate::packet::MemRef) {
        let start = out.len();
        out.resize(start + m.len, 0);
        let _ = m.region.read(m.offset, &mut out[start..]);
    }
    let mut out = Vec::new();
    match &pkt.payload {
        Payload::Placed(m) => read(&mut out, m),
        Payload::Landed(Some(l)) => l.dst.iter().for_each(|m| read(&mut out, m)),
        p => {
            for piece in p.pieces() {
                let start = out.len();
                out.resize(start + piece.len(), 0);
                let _ = piece.read(0, &mut out[start..]);
            }
        }
    }
    out
}

/// Where a packet stands in its message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Only,
    First,
    Middle,
    Last,
}

/// The packets of `pkt`, with their headers, as they would be on the wire.
pub(super) fn segments(pkt: &Packet, transport: QpType, payload_len: usize) -> Vec<Segment> {
    let prefix = match transport {
        QpType::UC => 0x20,
        QpType::UD => 0x60,
        QpType::XRC_SEND | QpType::XRC_RECV => 0xa0,
        _ => 0x00,
    };
    // A READ request is one packet whatever the length it asks for; so are atomics and ACKs.
    let carries_data =
        matches!(pkt.kind, Kind::Send | Kind::Write | Kind::ReadResponse | Kind::AtomicWrite);
    let n = if carries_data { pkt.npkts.max(1) as usize } else { 1 };
    let mtu = if pkt.mtu > 0 { pkt.mtu as usize } else { payload_len.div_ceil(n).max(1) };
    (0..n)
        .map(|i| {
            let place = match (n, i) {
                (1, _) => Place::Only,
                (_, 0) => Place::First,
                (_, i) if i == n - 1 => Place::Last,
                _ => Place::Middle,
            };
            let start = (i * mtu).min(payload_len);
            let end = if place == Place::Last || place == Place::Only {
                payload_len
            } else {
                ((i + 1) * mtu).min(payload_len)
            };
            let data = if carries_data { start..end } else { 0..0 };
            let psn = (pkt.psn + i as u32) & crate::engine::PSN_MASK;
            Segment { headers: headers(pkt, prefix, place, psn, data.len()), data }
        })
        .collect()
}

fn headers(pkt: &Packet, prefix: u8, place: Place, psn: u32, data_len: usize) -> Vec<u8> {
    use Place::*;
    let last = matches!(place, Only | Last);
    let first = matches!(place, Only | First);
    let (code, reth, imm, inv, aeth) = match pkt.kind {
        Kind::Send => {
            let code = match (place, pkt.imm.is_some(), pkt.inv.is_some()) {
                (First, ..) => op::SEND_FIRST,
                (Middle, ..) => op::SEND_MIDDLE,
                (Last, true, _) => op::SEND_LAST_IMM,
                (Last, _, true) => op::SEND_LAST_INV,
                (Last, ..) => op::SEND_LAST,
                (Only, true, _) => op::SEND_ONLY_IMM,
                (Only, _, true) => op::SEND_ONLY_INV,
                (Only, ..) => op::SEND_ONLY,
            };
            (code, false, last && pkt.imm.is_some(), last && pkt.inv.is_some(), false)
        }
        Kind::Write => {
            let code = match (place, pkt.imm.is_some()) {
                (First, _) => op::WRITE_FIRST,
                (Middle, _) => op::WRITE_MIDDLE,
                (Last, true) => op::WRITE_LAST_IMM,
                (Last, false) => op::WRITE_LAST,
                (Only, true) => op::WRITE_ONLY_IMM,
                (Only, false) => op::WRITE_ONLY,
            };
            (code, first, last && pkt.imm.is_some(), false, false)
        }
        Kind::ReadRequest => (op::READ_REQUEST, true, false, false, false),
        Kind::ReadResponse => {
            let code = match place {
                First => op::READ_RESP_FIRST,
                Middle => op::READ_RESP_MIDDLE,
                Last => op::READ_RESP_LAST,
                Only => op::READ_RESP_ONLY,
            };
            (code, false, false, false, place != Middle)
        }
        Kind::CompareSwap => (op::COMPARE_SWAP, false, false, false, false),
        Kind::FetchAdd => (op::FETCH_ADD, false, false, false, false),
        Kind::AtomicWrite => (op::ATOMIC_WRITE, true, false, false, false),
        Kind::Flush => (op::FLUSH, true, false, false, false),
        Kind::Ack => (op::ACK, false, false, false, true),
        Kind::AtomicAck => (op::ATOMIC_ACK, false, false, false, true),
        Kind::Raw => unreachable!("raw frames are written as they are"),
        Kind::XrcDeliver | Kind::XrcResult => unreachable!("never on a wire, never traced"),
    };
    let ud = prefix == 0x60;
    let pad = ((4 - data_len % 4) % 4) as u8;
    let mut h = Vec::with_capacity(64);
    // BTH: opcode; SE, MigReq, PadCnt, TVer; P_Key; reserved; DestQP; AckReq; PSN.
    h.push(prefix | code);
    let se = pkt.solicited && last && matches!(pkt.kind, Kind::Send | Kind::Write);
    h.push(u8::from(se) << 7 | pad << 4);
    h.extend_from_slice(&0xffffu16.to_be_bytes());
    h.push(0);
    h.extend_from_slice(&pkt.dst_qpn.to_be_bytes()[1..]);
    let ack_req = pkt.kind.is_request() && last && !ud && prefix != 0x20;
    h.push(u8::from(ack_req) << 7);
    h.extend_from_slice(&psn.to_be_bytes()[1..]);
    if prefix == 0xa0 && pkt.kind.is_request() {
        h.push(0);
        h.extend_from_slice(&pkt.xrc_srqn.to_be_bytes()[1..]);
    }
    if ud {
        h.extend_from_slice(&pkt.qkey.to_be_bytes());
        h.push(0);
        h.extend_from_slice(&pkt.src_qpn.to_be_bytes()[1..]);
    }
    if pkt.kind == Kind::Flush {
        // FETH: selectivity level in bits 4..5, placement type in bits 0..3.
        h.extend_from_slice(&u32::from(pkt.feth & 0x3f).to_be_bytes());
    }
    if reth {
        h.extend_from_slice(&pkt.va.to_be_bytes());
        h.extend_from_slice(&pkt.rkey.to_be_bytes());
        h.extend_from_slice(&pkt.len.to_be_bytes());
    }
    if matches!(pkt.kind, Kind::CompareSwap | Kind::FetchAdd) {
        h.extend_from_slice(&pkt.va.to_be_bytes());
        h.extend_from_slice(&pkt.rkey.to_be_bytes());
        h.extend_from_slice(&pkt.swap_add.to_be_bytes());
        h.extend_from_slice(&pkt.compare.to_be_bytes());
    }
    if aeth {
        let syndrome = match pkt.syndrome {
            Syndrome::Ack => 0x1f, // ACK, credits not tracked ("invalid" count)
            Syndrome::Rnr(t) => 0x20 | (t & 0x1f),
            Syndrome::Nak(c) => {
                0x60 | match c {
                    NakCode::PsnSequenceError => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccessError => 2,
                    NakCode::RemoteOperationalError => 3,
                }
            }
        };
        h.push(syndrome);
        h.extend_from_slice(&pkt.msn.to_be_bytes()[1..]);
    }
    if pkt.kind == Kind::AtomicAck {
        h.extend_from_slice(&pkt.orig.to_be_bytes());
    }
    if imm {
        // ImmDt is the application's `__be32` as it lies in memory (the engine carries it as
        // the application wrote it), not a number to put in network order.
        h.extend_from_slice(&pkt.imm.unwrap_or(0).to_ne_bytes());
    }
    if inv {
        h.extend_from_slice(&pkt.inv.unwrap_or(0).to_be_bytes());
    }
    h
}

/// One Ethernet frame: Ethernet, IP, UDP, the transport headers, payload, pad and ICRC.
pub(super) fn frame(ends: &Ends, transport: &[u8], data: &[u8], damaged: bool) -> Vec<u8> {
    let pad = (4 - data.len() % 4) % 4;
    let udp_len = 8 + transport.len() + data.len() + pad + 4;
    let (src, dst) = (&ends.ip.sgid, &ends.ip.dgid);
    let v4 = src.ipv4().zip(dst.ipv4());
    let mut f = Vec::with_capacity(14 + 40 + udp_len);
    f.extend_from_slice(&dst.mac());
    f.extend_from_slice(&src.mac());
    f.extend_from_slice(&(if v4.is_some() { 0x0800u16 } else { 0x86dd }).to_be_bytes());
    let ip_start = f.len();
    let pseudo = match v4 {
        Some((s, d)) => {
            f.extend_from_slice(&ipv4_header(
                s,
                d,
                udp_len,
                ends.ip.traffic_class,
                ends.ip.hop_limit,
            ));
            let mut p = csum_add(0, &s);
            p = csum_add(p, &d);
            p + 17 + udp_len as u32
        }
        None => {
            f.extend_from_slice(&ipv6_first_word(ends.ip.traffic_class, ends.ip.flow_label));
            f.extend_from_slice(&(udp_len as u16).to_be_bytes());
            f.extend_from_slice(&[17, ends.ip.hop_limit]);
            f.extend_from_slice(&src.0);
            f.extend_from_slice(&dst.0);
            let mut p = csum_add(0, &src.0);
            p = csum_add(p, &dst.0);
            p + 17 + udp_len as u32
        }
    };
    let udp_start = f.len();
    f.extend_from_slice(&ends.src_port.to_be_bytes());
    f.extend_from_slice(&ROCE_V2_PORT.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(transport);
    f.extend_from_slice(data);
    f.extend(std::iter::repeat_n(0, pad));
    let mut icrc = icrc(&f[ip_start..], v4.is_some(), udp_start - ip_start);
    if damaged {
        icrc = !icrc;
    }
    f.extend_from_slice(&icrc.to_le_bytes());
    let csum = match fold(csum_add(pseudo, &f[udp_start..])) {
        0 => 0xffff,
        c => c,
    };
    f[udp_start + 6..udp_start + 8].copy_from_slice(&csum.to_be_bytes());
    f
}

#[cfg(test)]
pub(super) mod test {
    use super::*;
    use crate::types::Gid;

    #[test]
    fn test_a_write_is_cut_at_the_mtu_with_reth_only_on_the_first_packet() {
        let mut p = Packet::new(Kind::Write);
        (p.npkts, p.mtu, p.psn, p.dst_qpn, p.len, p.imm) =
            (3, 1024, 0xff_fffe, 0x12, 2500, Some(7));
        let segs = segments(&p, QpType::RC, 2500);
        let ops: Vec<u8> = segs.iter().map(|s| s.headers[0]).collect();
        assert_eq!(ops, [op::WRITE_FIRST, op::WRITE_MIDDLE, op::WRITE_LAST_IMM]);
        let lens: Vec<usize> = segs.iter().map(|s| s.headers.len()).collect();
        assert_eq!(lens, [12 + 16, 12, 12 + 4]);
        let psns: Vec<&[u8]> = segs.iter().map(|s| &s.headers[9..12]).collect();
        assert_eq!(psns, [&[0xff, 0xff, 0xfe][..], &[0xff, 0xff, 0xff], &[0, 0, 0]]);
        assert_eq!(segs[2].data, 2048..2500);
        assert_eq!(segs[2].headers[8] & 0x80, 0x80, "AckReq on the last packet");
        assert_eq!(segs[2].headers[1] >> 4 & 3, 0, "2500 - 2048 = 452: no pad");
    }

    #[test]
    fn test_a_flush_is_one_packet_with_feth_then_reth() {
        let mut p = Packet::new(Kind::Flush);
        (p.psn, p.dst_qpn, p.va, p.rkey, p.len, p.feth) = (5, 0x12, 0x1000, 0x77, 4096, 0x12);
        let segs = segments(&p, QpType::RC, 0);
        assert_eq!(segs.len(), 1);
        let h = &segs[0].headers;
        assert_eq!(h[0], op::FLUSH);
        assert_eq!(h.len(), 12 + 4 + 16, "BTH, FETH, RETH");
        assert_eq!(&h[12..16], &[0, 0, 0, 0x12], "selectivity MR (1 << 4), placement GLOBAL");
        assert_eq!(&h[16..24], &0x1000u64.to_be_bytes());
        assert_eq!(&h[28..32], &4096u32.to_be_bytes());
        assert_eq!(segs[0].data, 0..0);
    }

    #[test]
    fn test_ud_sends_carry_a_deth_and_acks_an_aeth() {
        let mut p = Packet::new(Kind::Send);
        (p.qkey, p.src_qpn, p.dst_qpn) = (0x1111_1111, 0x22, 0x33);
        let h = &segments(&p, QpType::UD, 5)[0].headers;
        assert_eq!(h[0], 0x64);
        assert_eq!(&h[12..20], &[0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x22]);
        assert_eq!(h[1] >> 4 & 3, 3, "5 bytes of payload take 3 of pad");
        let mut a = Packet::new(Kind::Ack);
        (a.syndrome, a.msn) = (Syndrome::Rnr(12), 9);
        assert_eq!(&segments(&a, QpType::RC, 0)[0].headers[12..], &[0x2c, 0, 0, 9]);
    }

    #[test]
    fn test_frame_checksums_verify() {
        let v4 = |a: u8| Gid::ipv4_mapped([10, 0, 0, a]);
        let ip = Grh { sgid: v4(1), dgid: v4(2), hop_limit: 64, ..Grh::default() };
        let ends = Ends { ip, src_port: 0xc011 };
        let f = frame(&ends, &[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 0, 1], b"abcd", false);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(fold(csum_add(0, &f[14..34])), 0, "IPv4 header checksum");
        assert_eq!(&f[36..38], &4791u16.to_be_bytes());
        let udp = &f[34..];
        let mut p = csum_add(0, &f[26..34]);
        p += 17 + udp.len() as u32;
        assert_eq!(fold(csum_add(p, udp)), 0, "UDP checksum");
        let bad = frame(&ends, &[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 0, 1], b"abcd", true);
        assert_eq!(f.len(), bad.len());
        assert_ne!(f[f.len() - 4..], bad[bad.len() - 4..]);
    }

    /// Frames the kernel's rxe (Linux 6.1) sent, captured in the rxe VM by
    /// `conformance/wire/rxe_frames.c`: the IP packet onwards of each.
    pub(crate) fn rxe_frames() -> Vec<(String, Vec<u8>)> {
        crate::captured::tagged_hex(include_str!("testdata/rxe-frames.txt"), "frame")
    }

    /// The sending side of the check that rxe accepts the emulator's packets (docs/wire.md,
    /// run by hand in the rxe VM): a UD SEND of the alphabet, built by the encoder, from an
    /// ordinary UDP socket. Does nothing unless `RDMA_EMU_WIRE_PEER` says `SRC,DST,QPN`.
    #[test]
    fn wire_peer_sends_one_ud_send() {
        let Ok(spec) = std::env::var("RDMA_EMU_WIRE_PEER") else { return };
        let parts: Vec<&str> = spec.split(',').collect();
        let (src, dst): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
            (parts[0].parse().unwrap(), parts[1].parse().unwrap());
        let qpn: u32 = parts[2].parse().unwrap();
        let v4 = |a: std::net::Ipv4Addr| Gid::ipv4_mapped(a.octets());
        let payload = b"abcdefghijklmnopqrstuvwxyz";
        let mut p = Packet::new(Kind::Send);
        (p.dst_qpn, p.src_qpn, p.qkey, p.psn, p.len) = (qpn, 0x77, 0x1111_1111, 0x42, 26);
        let ip = Grh { sgid: v4(src), dgid: v4(dst), hop_limit: 64, ..Grh::default() };
        let src_port = udp_source_port(QpType::UD, p.src_qpn, qpn, 0);
        let seg = &segments(&p, QpType::UD, payload.len())[0];
        let f = frame(&Ends { ip, src_port }, &seg.headers, payload, false);
        // An unconnected socket with DF sends IP identification 0, as the ICRC assumed.
        let sock = std::net::UdpSocket::bind((src, src_port)).unwrap();
        crate::sys::set_dont_fragment(std::os::fd::AsRawFd::as_raw_fd(&sock)).unwrap();
        sock.send_to(&f[14 + 20 + 8..], (dst, ROCE_V2_PORT)).unwrap();
        println!("sent {} bytes from {src}:{src_port:#x} to QPN {qpn:#x}", f.len() - 42);
    }

    #[test]
    fn test_the_icrc_of_every_frame_rxe_sent_verifies() {
        let frames = rxe_frames();
        assert_eq!(frames.len(), 10);
        for (what, f) in &frames {
            let udp_at = usize::from(f[0] & 0xf) * 4;
            let (body, sent) = f.split_at(f.len() - 4);
            let ours = icrc(body, true, udp_at).to_le_bytes();
            assert_eq!(ours, sent, "{what}: the ICRC rxe computed");
        }
    }

    /// The emulator builds, for the same requests, the frames rxe built: byte for byte from
    /// the IP header to the payload's pad, but for what each sender picks for itself (the IP
    /// identification, and so the header checksum and the ICRC, which covers it; rxe leaves
    /// the UDP checksum 0). That the ICRC over the same bytes is the same is the test above.
    #[test]
    fn test_the_emulator_encodes_each_request_as_rxe_does() {
        let v4 = Gid::ipv4_mapped;
        let ip = Grh {
            sgid: v4([10, 0, 2, 15]),
            dgid: v4([10, 0, 2, 2]),
            hop_limit: 64,
            ..Grh::default()
        };
        // What rxe_frames.c posted: its buffer holds a..z over and over.
        let data: Vec<u8> = (0..8192).map(|i| b'a' + (i % 26) as u8).collect();
        let rc = |kind: Kind, psn: u32, len: u32| {
            let mut p = Packet::new(kind);
            (p.dst_qpn, p.psn, p.len, p.mtu) = (0x12_3456, psn, len, 1024);
            p.npkts = len.div_ceil(1024).max(1);
            p
        };
        let mut expected = Vec::new();
        // rxe numbered the RC QP 0x11, its first, and the UD QP 0x12 (the DETH says so).
        let mut add = |p: Packet, transport: QpType, src_qpn: u32, payload: &[u8]| {
            let port = udp_source_port(transport, src_qpn, p.dst_qpn, 0);
            let ends = Ends { ip, src_port: port };
            for seg in segments(&p, transport, payload.len()) {
                let f = frame(&ends, &seg.headers, &payload[seg.data.clone()], false);
                expected.push(f[14..].to_vec());
            }
        };
        add(rc(Kind::Send, 0x100, 16), QpType::RC, 0x11, &data[..16]);
        let mut p = rc(Kind::Send, 0x101, 8);
        // rxe_frames.c posts htonl(0x01020304): that is what the application's field holds.
        p.imm = Some(0x0102_0304u32.to_be());
        add(p, QpType::RC, 0x11, &data[..8]);
        let mut p = rc(Kind::Write, 0x102, 2500);
        (p.va, p.rkey) = (0x10000, 0x55);
        add(p, QpType::RC, 0x11, &data[..2500]);
        let mut p = rc(Kind::Write, 0x105, 5);
        (p.va, p.rkey, p.imm) = (0x20000, 0x55, Some(0x0a0b_0c0du32.to_be()));
        add(p, QpType::RC, 0x11, &data[..5]);
        let mut p = rc(Kind::ReadRequest, 0x106, 3000);
        (p.va, p.rkey) = (0x30000, 0x66);
        add(p, QpType::RC, 0x11, &[]);
        let mut p = rc(Kind::CompareSwap, 0x109, 8);
        (p.va, p.rkey, p.compare, p.swap_add) =
            (0x40000, 0x77, 0x1111_2222_3333_4444, 0x5555_6666_7777_8888);
        add(p, QpType::RC, 0x11, &[]);
        let mut p = rc(Kind::FetchAdd, 0x10a, 8);
        (p.va, p.rkey, p.swap_add) = (0x40008, 0x77, 3);
        add(p, QpType::RC, 0x11, &[]);
        let mut p = Packet::new(Kind::Send);
        (p.dst_qpn, p.src_qpn, p.qkey, p.psn, p.len) = (0x65_4321, 0x12, 0x1111_1111, 0x200, 32);
        add(p, QpType::UD, 0x12, &data[..32]);

        let sent = rxe_frames();
        assert_eq!(sent.len(), expected.len());
        for ((what, theirs), ours) in sent.iter().zip(&expected) {
            let masked = |f: &[u8]| {
                let mut f = f.to_vec();
                f[4..6].fill(0); // identification
                f[10..12].fill(0); // header checksum
                f[26..28].fill(0); // UDP checksum
                f.truncate(f.len() - 4); // ICRC
                f
            };
            assert_eq!(masked(ours), masked(theirs), "{what}");
        }
    }
}

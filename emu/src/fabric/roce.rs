//! Reading RoCE v2 packets: the UDP payload of a datagram to port 4791, from the Base
//! Transport Header to the ICRC, as a wire port takes it in. Everything in it is untrusted:
//! each length is checked before it is used, and what does not parse is refused, never a
//! panic. (The ICRC is returned, not checked here: over IPv4 it covers the IP identification,
//! which an unprivileged UDP socket does not see; see docs/wire.md.)
//!
//! The wire port's receive path (`wire_port`) takes its packets through here; the tests check
//! the decoder against the frames rxe sent, and against mangled ones.

use crate::{
    frame::{ipv4_header, ipv6_first_word},
    packet::Kind,
    types::QpType,
};

/// The QPN of the general services interface (QP1), where management datagrams go: the
/// connection manager's among them.
pub(crate) const GSI_QPN: u32 = 1;
/// QP1's Q_Key on every port.
pub(crate) const GSI_QKEY: u32 = 0x8001_0000;

/// The 5-bit opcodes within a transport (IBA 9.2, Table 38; FLUSH and ATOMIC WRITE of 1.5).
pub(crate) mod op {
    pub(crate) const SEND_FIRST: u8 = 0x00;
    pub(crate) const SEND_MIDDLE: u8 = 0x01;
    pub(crate) const SEND_LAST: u8 = 0x02;
    pub(crate) const SEND_LAST_IMM: u8 = 0x03;
    pub(crate) const SEND_ONLY: u8 = 0x04;
    pub(crate) const SEND_ONLY_IMM: u8 = 0x05;
    pub(crate) const WRITE_FIRST: u8 = 0x06;
    pub(crate) const WRITE_MIDDLE: u8 = 0x07;
    pub(crate) const WRITE_LAST: u8 = 0x08;
    pub(crate) const WRITE_LAST_IMM: u8 = 0x09;
    pub(crate) const WRITE_ONLY: u8 = 0x0a;
    pub(crate) const WRITE_ONLY_IMM: u8 = 0x0b;
    pub(crate) const READ_REQUEST: u8 = 0x0c;
    pub(crate) const READ_RESP_FIRST: u8 = 0x0d;
    pub(crate) const READ_RESP_MIDDLE: u8 = 0x0e;
    pub(crate) const READ_RESP_LAST: u8 = 0x0f;
    pub(crate) const READ_RESP_ONLY: u8 = 0x10;
    pub(crate) const ACK: u8 = 0x11;
    pub(crate) const ATOMIC_ACK: u8 = 0x12;
    pub(crate) const COMPARE_SWAP: u8 = 0x13;
    pub(crate) const FETCH_ADD: u8 = 0x14;
    // IBA 1.5 (RC only).
    pub(crate) const FLUSH: u8 = 0x1c;
    pub(crate) const ATOMIC_WRITE: u8 = 0x1d;
    pub(crate) const SEND_LAST_INV: u8 = 0x16;
    pub(crate) const SEND_ONLY_INV: u8 = 0x17;
}

/// One packet as it crossed the wire (one MTU's worth of a message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WirePacket<'a> {
    pub(crate) transport: QpType,
    pub(crate) kind: Kind,
    /// The first (or only) packet of its message.
    pub(crate) first: bool,
    /// The last (or only) packet of its message.
    pub(crate) last: bool,
    pub(crate) solicited: bool,
    pub(crate) ack_req: bool,
    pub(crate) pkey: u16,
    pub(crate) dst_qpn: u32,
    pub(crate) psn: u32,
    /// XRCETH: the SRQ an XRC request is for.
    pub(crate) xrc_srqn: Option<u32>,
    /// DETH: `(qkey, source QPN)`.
    pub(crate) deth: Option<(u32, u32)>,
    /// FETH (FLUSH): placement type and selectivity level.
    pub(crate) feth: Option<u32>,
    /// RETH: `(virtual address, rkey, DMA length)`.
    pub(crate) reth: Option<(u64, u32, u32)>,
    /// AtomicETH: `(virtual address, rkey, swap or add, compare)`.
    pub(crate) atomic: Option<(u64, u32, u64, u64)>,
    /// AETH: `(syndrome, MSN)`.
    pub(crate) aeth: Option<(u8, u32)>,
    /// AtomicAckETH: the original value.
    pub(crate) atomic_ack: Option<u64>,
    /// ImmDt, as the application's `__be32` holds it (the wire's bytes in memory order).
    pub(crate) imm: Option<u32>,
    /// IETH: the rkey to invalidate.
    pub(crate) inv: Option<u32>,
    /// The payload, without its pad.
    pub(crate) payload: &'a [u8],
    /// The ICRC as sent (little-endian on the wire).
    pub(crate) icrc: u32,
}

/// Why a packet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Shorter than its headers, pad and ICRC.
    Short,
    /// A transport header version other than 0.
    Version,
    /// An opcode this transport does not have (or a transport the emulator has not: RD, CNP).
    Opcode,
}

/// The extended headers an opcode carries, in wire order after the BTH.
#[derive(Clone, Copy, Default)]
struct Layout {
    kind: Option<Kind>,
    first: bool,
    last: bool,
    feth: bool,
    reth: bool,
    atomic: bool,
    aeth: bool,
    atomic_ack: bool,
    imm: bool,
    inv: bool,
}

/// The layout of the 5-bit opcode `code` (IBA 9.2, Table 38; FLUSH and ATOMIC WRITE of 1.5).
fn layout(code: u8) -> Layout {
    let l = |kind, first, last| Layout { kind: Some(kind), first, last, ..Layout::default() };
    match code {
        op::SEND_FIRST => l(Kind::Send, true, false),
        op::SEND_MIDDLE => l(Kind::Send, false, false),
        op::SEND_LAST => l(Kind::Send, false, true),
        op::SEND_LAST_IMM => Layout { imm: true, ..l(Kind::Send, false, true) },
        op::SEND_ONLY => l(Kind::Send, true, true),
        op::SEND_ONLY_IMM => Layout { imm: true, ..l(Kind::Send, true, true) },
        op::SEND_LAST_INV => Layout { inv: true, ..l(Kind::Send, false, true) },
        op::SEND_ONLY_INV => Layout { inv: true, ..l(Kind::Send, true, true) },
        op::WRITE_FIRST => Layout { reth: true, ..l(Kind::Write, true, false) },
        op::WRITE_MIDDLE => l(Kind::Write, false, false),
        op::WRITE_LAST => l(Kind::Write, false, true),
        op::WRITE_LAST_IMM => Layout { imm: true, ..l(Kind::Write, false, true) },
        op::WRITE_ONLY => Layout { reth: true, ..l(Kind::Write, true, true) },
        op::WRITE_ONLY_IMM => Layout { reth: true, imm: true, ..l(Kind::Write, true, true) },
        op::READ_REQUEST => Layout { reth: true, ..l(Kind::ReadRequest, true, true) },
        op::READ_RESP_FIRST => Layout { aeth: true, ..l(Kind::ReadResponse, true, false) },
        op::READ_RESP_MIDDLE => l(Kind::ReadResponse, false, false),
        op::READ_RESP_LAST => Layout { aeth: true, ..l(Kind::ReadResponse, false, true) },
        op::READ_RESP_ONLY => Layout { aeth: true, ..l(Kind::ReadResponse, true, true) },
        op::ACK => Layout { aeth: true, ..l(Kind::Ack, true, true) },
        op::ATOMIC_ACK => Layout { aeth: true, atomic_ack: true, ..l(Kind::AtomicAck, true, true) },
        op::COMPARE_SWAP => Layout { atomic: true, ..l(Kind::CompareSwap, true, true) },
        op::FETCH_ADD => Layout { atomic: true, ..l(Kind::FetchAdd, true, true) },
        op::FLUSH => Layout { feth: true, reth: true, ..l(Kind::Flush, true, true) },
        op::ATOMIC_WRITE => Layout { reth: true, ..l(Kind::AtomicWrite, true, true) },
        _ => Layout::default(),
    }
}

/// Reads big-endian fields off the front of a byte slice, refusing what runs short.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Refused> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(Refused::Short)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u32(&mut self) -> Result<u32, Refused> {
        self.take().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, Refused> {
        self.take().map(u64::from_be_bytes)
    }

    /// A 24-bit field after a reserved byte.
    fn u24(&mut self) -> Result<u32, Refused> {
        Ok(self.u32()? & 0xff_ffff)
    }
}

/// The packet in `d`, the UDP payload of a RoCE v2 datagram.
pub(crate) fn decode(d: &[u8]) -> Result<WirePacket<'_>, Refused> {
    let (body, icrc) = d.split_last_chunk::<4>().ok_or(Refused::Short)?;
    let mut f = Fields(body);
    let bth: [u8; 12] = f.take()?;
    if bth[1] & 0x0f != 0 {
        return Err(Refused::Version);
    }
    let transport = match bth[0] & 0xe0 {
        0x00 => QpType::RC,
        0x20 => QpType::UC,
        0x60 => QpType::UD,
        0xa0 => QpType::XRC_SEND,
        _ => return Err(Refused::Opcode),
    };
    let code = bth[0] & 0x1f;
    let lay = layout(code);
    let Some(kind) = lay.kind else { return Err(Refused::Opcode) };
    let allowed = match transport {
        // UC: SENDs and WRITEs; UD: SEND only (with or without immediate).
        QpType::UC => matches!(kind, Kind::Send | Kind::Write) && !lay.inv,
        QpType::UD => code == op::SEND_ONLY || code == op::SEND_ONLY_IMM,
        _ => true,
    };
    if !allowed {
        return Err(Refused::Opcode);
    }
    let request = kind.is_request();
    let xrc_srqn = (transport == QpType::XRC_SEND && request).then(|| f.u24()).transpose()?;
    let deth = if transport == QpType::UD { Some((f.u32()?, f.u24()?)) } else { None };
    let feth = lay.feth.then(|| f.u32()).transpose()?;
    let reth = if lay.reth { Some((f.u64()?, f.u32()?, f.u32()?)) } else { None };
    let atomic = if lay.atomic { Some((f.u64()?, f.u32()?, f.u64()?, f.u64()?)) } else { None };
    let aeth = if lay.aeth {
        let w = f.u32()?;
        Some(((w >> 24) as u8, w & 0xff_ffff))
    } else {
        None
    };
    let atomic_ack = lay.atomic_ack.then(|| f.u64()).transpose()?;
    let imm = lay.imm.then(|| f.take().map(u32::from_ne_bytes)).transpose()?;
    let inv = lay.inv.then(|| f.u32()).transpose()?;
    let pad = usize::from(bth[1] >> 4 & 3);
    let payload =
        f.0.get(..f.0.len().checked_sub(pad).ok_or(Refused::Short)?).ok_or(Refused::Short)?;
    Ok(WirePacket {
        transport,
        kind,
        first: lay.first,
        last: lay.last,
        solicited: bth[1] & 0x80 != 0,
        ack_req: bth[8] & 0x80 != 0,
        pkey: u16::from_be_bytes([bth[2], bth[3]]),
        dst_qpn: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
        psn: u32::from_be_bytes([0, bth[9], bth[10], bth[11]]),
        xrc_srqn,
        deth,
        feth,
        reth,
        atomic,
        aeth,
        atomic_ack,
        imm,
        inv,
        payload,
        icrc: u32::from_le_bytes(*icrc),
    })
}

/// The invariant CRC of RoCE v2 (IBA Annex A17.3.3): CRC-32 over 64 one-bits standing for the
/// LRH, then the IP and UDP headers and the BTH with every field a router may change masked
/// to ones (IPv4 TOS, TTL and checksum; IPv6 traffic class, flow label and hop limit; UDP
/// checksum; the BTH's reserved byte), then the rest of the packet. Computed before the UDP
/// checksum is filled in, which it masks anyway.
pub(crate) fn icrc(ip_onwards: &[u8], v4: bool, udp_at: usize) -> u32 {
    let mut masked = ip_onwards.to_vec();
    if v4 {
        masked[1] = 0xff;
        masked[8] = 0xff;
        masked[10] = 0xff;
        masked[11] = 0xff;
    } else {
        masked[0] |= 0x0f;
        masked[1] = 0xff;
        masked[2] = 0xff;
        masked[3] = 0xff;
        masked[7] = 0xff;
    }
    masked[udp_at + 6] = 0xff;
    masked[udp_at + 7] = 0xff;
    masked[udp_at + 8 + 4] = 0xff;
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&masked);
    h.finalize()
}

/// The IP identification under which a RoCE v2 packet that came to `dst` from `src:src_port`
/// over IPv4 with DF carries a valid ICRC; `None` if there is none (the packet is damaged).
/// `udp_payload` is what a UDP socket delivers (BTH to ICRC). A receiver on such a socket
/// never sees the identification, which the ICRC covers; the CRC is affine in its 16 bits
/// (the ICRC of identification `x` is the ICRC of 0 xor the effects of `x`'s set bits), so
/// the one that fits is found by elimination over GF(2).
pub(crate) fn icrc_v4_identification(
    src: [u8; 4],
    dst: [u8; 4],
    src_port: u16,
    udp_payload: &[u8],
) -> Option<u16> {
    let (body, sent) = udp_payload.split_last_chunk::<4>()?;
    let udp_len = 8 + udp_payload.len();
    let mut ip = Vec::with_capacity(20 + udp_len);
    ip.extend_from_slice(&ipv4_header(src, dst, udp_len, 0, 0));
    ip.extend_from_slice(&src_port.to_be_bytes());
    ip.extend_from_slice(&4791u16.to_be_bytes());
    ip.extend_from_slice(&(udp_len as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(body);
    let crc_with = |ip: &mut Vec<u8>, id: u16| {
        ip[4..6].copy_from_slice(&id.to_be_bytes());
        icrc(ip, true, 20)
    };
    let base = crc_with(&mut ip, 0);
    if base == u32::from_le_bytes(*sent) {
        // The emulator's own packets (and any sender's first): no need to solve.
        return Some(0);
    }
    // Column k: what bit k of the identification changes in the CRC.
    let mut cols: Vec<(u32, u16)> =
        (0..16).map(|k| (crc_with(&mut ip, 1 << k) ^ base, 1 << k)).collect();
    let mut want = (u32::from_le_bytes(*sent) ^ base, 0u16);
    // Gaussian elimination on the columns, carrying which identification bits each stands for.
    let mut basis: Vec<(u32, u16)> = Vec::new();
    for col in cols.drain(..) {
        let mut c = col;
        for b in &basis {
            if c.0 & (1 << (31 - b.0.leading_zeros())) != 0 {
                c = (c.0 ^ b.0, c.1 ^ b.1);
            }
        }
        if c.0 != 0 {
            basis.push(c);
        }
    }
    for b in &basis {
        if want.0 & (1 << (31 - b.0.leading_zeros())) != 0 {
            want = (want.0 ^ b.0, want.1 ^ b.1);
        }
    }
    (want.0 == 0).then_some(want.1)
}

/// Whether a RoCE v2 packet that came to `dst` from `src:src_port` over IPv6 carries a valid
/// ICRC (`udp_payload`: BTH to ICRC). Every field of the IPv6 header it covers is known to
/// the receiver (traffic class, flow label and hop limit are masked).
pub(crate) fn icrc_v6_checks(
    src: [u8; 16],
    dst: [u8; 16],
    src_port: u16,
    udp_payload: &[u8],
) -> bool {
    let Some((body, sent)) = udp_payload.split_last_chunk::<4>() else { return false };
    let udp_len = 8 + udp_payload.len();
    let mut ip = Vec::with_capacity(40 + udp_len);
    ip.extend_from_slice(&ipv6_first_word(0, 0));
    ip.extend_from_slice(&(udp_len as u16).to_be_bytes());
    ip.extend_from_slice(&[17, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&src_port.to_be_bytes());
    ip.extend_from_slice(&4791u16.to_be_bytes());
    ip.extend_from_slice(&(udp_len as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(body);
    icrc(&ip, false, 40) == u32::from_le_bytes(*sent)
}

#[cfg(test)]
mod test {
    use super::*;

    /// The UDP payloads of the frames rxe sent (see `pcap`'s tests).
    fn rxe_payloads() -> Vec<(String, Vec<u8>)> {
        super::super::pcap::test::rxe_frames()
            .into_iter()
            .map(|(what, ip)| {
                let udp = usize::from(ip[0] & 0xf) * 4;
                (what, ip[udp + 8..].to_vec())
            })
            .collect()
    }

    #[test]
    fn test_every_packet_rxe_sent_reads_back_as_posted() {
        let abc = |n: usize| (0..n).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>();
        let p = rxe_payloads();
        let pkts: Vec<WirePacket<'_>> = p.iter().map(|(_, d)| decode(d).unwrap()).collect();
        let kinds: Vec<(Kind, bool, bool)> =
            pkts.iter().map(|p| (p.kind, p.first, p.last)).collect();
        use Kind::*;
        assert_eq!(
            kinds,
            [
                (Send, true, true),
                (Send, true, true),
                (Write, true, false),
                (Write, false, false),
                (Write, false, true),
                (Write, true, true),
                (ReadRequest, true, true),
                (CompareSwap, true, true),
                (FetchAdd, true, true),
                (Send, true, true),
            ]
        );
        let psns: Vec<u32> = pkts.iter().map(|p| p.psn).collect();
        assert_eq!(psns, [0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x109, 0x10a, 0x200]);
        for p in &pkts[..9] {
            assert_eq!((p.transport, p.dst_qpn, p.pkey), (QpType::RC, 0x12_3456, 0xffff));
            assert_eq!(p.ack_req, p.last, "rxe asks for an ACK at each message's end");
        }
        assert_eq!(pkts[0].payload, &abc(16)[..]);
        assert_eq!(pkts[1].imm, Some(0x0102_0304u32.to_be()), "htonl(0x01020304), as posted");
        assert_eq!(pkts[2].reth, Some((0x10000, 0x55, 2500)));
        let write: Vec<u8> = pkts[2..5].iter().flat_map(|p| p.payload.iter().copied()).collect();
        assert_eq!(write, abc(2500));
        let imm = Some(0x0a0b_0c0du32.to_be());
        assert_eq!((pkts[5].reth, pkts[5].imm), (Some((0x20000, 0x55, 5)), imm));
        assert_eq!(pkts[5].payload, b"abcde", "the pad is not payload");
        assert_eq!((pkts[6].reth, pkts[6].payload.len()), (Some((0x30000, 0x66, 3000)), 0));
        let swap = (0x40000, 0x77, 0x5555_6666_7777_8888, 0x1111_2222_3333_4444);
        assert_eq!(pkts[7].atomic, Some(swap));
        assert_eq!(pkts[8].atomic, Some((0x40008, 0x77, 3, 0)));
        let ud = &pkts[9];
        assert_eq!(
            (ud.transport, ud.dst_qpn, ud.deth),
            (QpType::UD, 0x65_4321, Some((0x1111_1111, 0x12)))
        );
        assert_eq!((ud.payload, ud.ack_req), (&abc(32)[..], false));
    }

    /// The receiving side of the check that the emulator reads what rxe sends (docs/wire.md,
    /// run by hand in the rxe VM): an ordinary UDP socket on port 4791 takes one datagram,
    /// which must check (the ICRC, the identification found) and read as rxe's UD SEND. Does
    /// nothing unless `RDMA_EMU_WIRE_LISTEN` names the local IPv4 address.
    #[test]
    fn wire_peer_receives_one_ud_send() {
        let Ok(local) = std::env::var("RDMA_EMU_WIRE_LISTEN") else { return };
        let local: std::net::Ipv4Addr = local.parse().unwrap();
        let sock = std::net::UdpSocket::bind((local, 4791)).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        println!("listening");
        let mut buf = [0u8; 9000];
        let (n, from) = sock.recv_from(&mut buf).unwrap();
        let std::net::SocketAddr::V4(from) = from else { panic!("{from}") };
        let d = &buf[..n];
        let id = icrc_v4_identification(from.ip().octets(), local.octets(), from.port(), d);
        let p = decode(d).unwrap();
        println!(
            "received {n} bytes from {from}: identification {id:?}, {:?} {:?} psn {:#x} deth {:x?} payload {:?}",
            p.transport,
            p.kind,
            p.psn,
            p.deth,
            String::from_utf8_lossy(p.payload)
        );
        assert!(id.is_some(), "the ICRC does not check");
        assert_eq!((p.transport, p.kind, p.dst_qpn), (QpType::UD, Kind::Send, 0x77));
        assert_eq!(p.deth.map(|d| d.0), Some(0x1111_1111));
        assert_eq!(p.payload, b"sent by rxe");
    }

    /// A receiver on a UDP socket finds the IP identification each of rxe's packets was sent
    /// under (it never sees it) from the ICRC alone, and a packet damaged anywhere has none.
    #[test]
    fn test_the_icrc_is_checked_without_the_ip_identification() {
        for (what, ip) in super::super::pcap::test::rxe_frames() {
            let udp = usize::from(ip[0] & 0xf) * 4;
            let id = u16::from_be_bytes([ip[4], ip[5]]);
            let sport = u16::from_be_bytes([ip[udp], ip[udp + 1]]);
            let (src, dst) = ([10, 0, 2, 15], [10, 0, 2, 2]);
            let mut payload = ip[udp + 8..].to_vec();
            assert_eq!(icrc_v4_identification(src, dst, sport, &payload), Some(id), "{what}");
            assert_eq!(icrc_v4_identification(src, [10, 0, 2, 3], sport, &payload), None);
            assert_eq!(icrc_v4_identification(src, dst, sport ^ 1, &payload), None);
            for at in [0, 7, payload.len() / 2, payload.len() - 1] {
                payload[at] ^= 0x10;
                assert_eq!(icrc_v4_identification(src, dst, sport, &payload), None, "{what} {at}");
                payload[at] ^= 0x10;
            }
        }
    }

    /// Hostile bytes: rxe's packets cut short, grown, bit-flipped, or noise. Nothing panics,
    /// and whatever is accepted has its payload inside the datagram.
    #[test]
    fn test_mangled_packets_are_refused_or_read_within_their_bytes() {
        let p = rxe_payloads();
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..50_000 {
            let mut d = p[(next() % p.len() as u64) as usize].1.clone();
            match next() % 4 {
                0 => d.truncate((next() % (d.len() as u64 + 1)) as usize),
                1 => d.extend((0..next() % 64).map(|_| next() as u8)),
                2 => {
                    for _ in 0..1 + next() % 4 {
                        let i = (next() % d.len() as u64) as usize;
                        d[i] ^= 1 << (next() % 8);
                    }
                }
                _ => d = (0..next() % 128).map(|_| next() as u8).collect(),
            }
            match decode(&d) {
                Ok(w) => {
                    let (start, end) = (d.as_ptr() as usize, d.as_ptr() as usize + d.len());
                    let at = w.payload.as_ptr() as usize;
                    assert!(at >= start && at + w.payload.len() <= end);
                    accepted += 1;
                }
                Err(_) => refused += 1,
            }
        }
        assert!(accepted > 0 && refused > 0, "{accepted} accepted, {refused} refused");
    }
}

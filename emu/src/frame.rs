//! Ethernet frames as a raw packet QP sends and receives them: the header fields flow
//! steering matches, the Toeplitz hash RSS spreads by, the checksums a NIC inserts
//! (`IBV_SEND_IP_CSUM`) and checks (`IBV_WC_IP_CSUM_OK`), and TCP segmentation (TSO); and the
//! IP headers around a RoCE v2 packet (its wire form, its trace, a UD receive's GRH area).
//! Bytes in, bytes out: it knows nothing of QPs or the fabric, which both use it.

const ETH_HDR: usize = 14;
const ETHERTYPE_VLAN: u16 = 0x8100;
pub(crate) const ETHERTYPE_IPV4: u16 = 0x0800;
pub(crate) const ETHERTYPE_IPV6: u16 = 0x86dd;
pub(crate) const PROTO_TCP: u8 = 6;
pub(crate) const PROTO_UDP: u8 = 17;

/// The IPv4 header fields a flow can match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ipv4 {
    pub(crate) src: u32,
    pub(crate) dst: u32,
    pub(crate) proto: u8,
    pub(crate) tos: u8,
    pub(crate) ttl: u8,
    /// The 3 flag bits (reserved, DF, MF).
    pub(crate) flags: u8,
    /// Offset of the header in the frame, and its length.
    at: usize,
    hlen: usize,
}

/// The IPv6 header fields a flow can match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ipv6 {
    pub(crate) src: [u8; 16],
    pub(crate) dst: [u8; 16],
    pub(crate) flow_label: u32,
    pub(crate) next_hdr: u8,
    pub(crate) traffic_class: u8,
    pub(crate) hop_limit: u8,
    at: usize,
}

/// What the headers of a frame say (fields absent from the frame are `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Headers {
    pub(crate) dst_mac: [u8; 6],
    pub(crate) src_mac: [u8; 6],
    /// The EtherType after any VLAN tag.
    pub(crate) ether_type: u16,
    /// The 802.1Q tag control (priority, CFI, VLAN id), when tagged.
    pub(crate) vlan: Option<u16>,
    pub(crate) ipv4: Option<Ipv4>,
    pub(crate) ipv6: Option<Ipv6>,
    /// TCP or UDP: (protocol, source port, destination port, offset of the L4 header).
    pub(crate) l4: Option<(u8, u16, u16, usize)>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Headers {
    /// Parses what it can of `f`; `None` if it is shorter than an Ethernet header.
    pub(crate) fn parse(f: &[u8]) -> Option<Headers> {
        if f.len() < ETH_HDR {
            return None;
        }
        let mut h = Headers::default();
        h.dst_mac.copy_from_slice(&f[0..6]);
        h.src_mac.copy_from_slice(&f[6..12]);
        let mut at = 12;
        h.ether_type = be16(f, at);
        if h.ether_type == ETHERTYPE_VLAN && f.len() >= ETH_HDR + 4 {
            h.vlan = Some(be16(f, at + 2));
            at += 4;
            h.ether_type = be16(f, at);
        }
        at += 2;
        let (proto, l4_at) = match h.ether_type {
            ETHERTYPE_IPV4 if f.len() >= at + 20 && f[at] >> 4 == 4 => {
                let hlen = (f[at] & 0xf) as usize * 4;
                if hlen < 20 || f.len() < at + hlen {
                    return Some(h);
                }
                let ip = Ipv4 {
                    src: be32(f, at + 12),
                    dst: be32(f, at + 16),
                    proto: f[at + 9],
                    tos: f[at + 1],
                    ttl: f[at + 8],
                    flags: f[at + 6] >> 5,
                    at,
                    hlen,
                };
                h.ipv4 = Some(ip);
                // A fragment after the first carries no L4 header.
                let frag_off = be16(f, at + 6) & 0x1fff;
                if frag_off != 0 {
                    return Some(h);
                }
                (ip.proto, at + hlen)
            }
            ETHERTYPE_IPV6 if f.len() >= at + 40 && f[at] >> 4 == 6 => {
                let mut ip = Ipv6 {
                    flow_label: be32(f, at) & 0x000f_ffff,
                    traffic_class: ((be16(f, at) >> 4) & 0xff) as u8,
                    next_hdr: f[at + 6],
                    hop_limit: f[at + 7],
                    at,
                    ..Default::default()
                };
                ip.src.copy_from_slice(&f[at + 8..at + 24]);
                ip.dst.copy_from_slice(&f[at + 24..at + 40]);
                h.ipv6 = Some(ip);
                (ip.next_hdr, at + 40)
            }
            _ => return Some(h),
        };
        if matches!(proto, PROTO_TCP | PROTO_UDP) && f.len() >= l4_at + 4 {
            h.l4 = Some((proto, be16(f, l4_at), be16(f, l4_at + 2), l4_at));
        }
        Some(h)
    }

    pub(crate) fn is_multicast(&self) -> bool {
        self.dst_mac[0] & 1 != 0
    }
}

/// The ones' complement sum of `data` (RFC 1071), folded to 16 bits, added to `start`.
pub(crate) fn csum_add(start: u32, data: &[u8]) -> u32 {
    let mut sum = start;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// A sum [`csum_add`] folded, complemented: the checksum.
pub(crate) fn fold(sum: u32) -> u16 {
    !(sum as u16)
}

/// The first word of an IPv6 header (or IB GRH): version 6, traffic class, flow label.
pub(crate) fn ipv6_first_word(traffic_class: u8, flow_label: u32) -> [u8; 4] {
    (6 << 28 | u32::from(traffic_class) << 20 | flow_label & 0xf_ffff).to_be_bytes()
}

/// The IPv4 header of a RoCE v2 packet carrying `udp_len` bytes of UDP: DF, checksum.
pub(crate) fn ipv4_header(
    src: [u8; 4],
    dst: [u8; 4],
    udp_len: usize,
    tos: u8,
    ttl: u8,
) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[..2].copy_from_slice(&[0x45, tos]);
    h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    h[4..12].copy_from_slice(&[0, 0, 0x40, 0, ttl, PROTO_UDP, 0, 0]); // DF, UDP
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let csum = fold(csum_add(0, &h));
    h[10..12].copy_from_slice(&csum.to_be_bytes());
    h
}

/// The pseudo-header sum of an L4 segment of `len` bytes with protocol `proto`.
fn pseudo_sum(f: &[u8], h: &Headers, proto: u8, len: usize) -> u32 {
    let mut s = 0;
    if let Some(ip) = h.ipv4 {
        s = csum_add(s, &f[ip.at + 12..ip.at + 20]);
    } else if let Some(ip) = h.ipv6 {
        s = csum_add(s, &f[ip.at + 8..ip.at + 40]);
    }
    csum_add(s, &[0, proto, (len >> 8) as u8, len as u8])
}

/// The L4 length of the frame: what the IP header says follows it, within the frame.
fn l4_len(f: &[u8], h: &Headers, l4_at: usize) -> usize {
    let end = match (h.ipv4, h.ipv6) {
        (Some(ip), _) => ip.at + be16(f, ip.at + 2) as usize,
        (_, Some(ip)) => ip.at + 40 + be16(f, ip.at + 4) as usize,
        _ => f.len(),
    };
    end.min(f.len()).saturating_sub(l4_at)
}

/// `IBV_SEND_IP_CSUM`: fills in the IPv4 header checksum and the TCP/UDP checksum.
pub(crate) fn insert_checksums(f: &mut [u8]) {
    let Some(h) = Headers::parse(f) else { return };
    if let Some(ip) = h.ipv4 {
        f[ip.at + 10..ip.at + 12].fill(0);
        let c = fold(csum_add(0, &f[ip.at..ip.at + ip.hlen]));
        f[ip.at + 10..ip.at + 12].copy_from_slice(&c.to_be_bytes());
    }
    if let Some((proto, _, _, at)) = h.l4 {
        let len = l4_len(f, &h, at);
        let field = at + if proto == PROTO_TCP { 16 } else { 6 };
        if field + 2 > at + len {
            return;
        }
        f[field..field + 2].fill(0);
        let mut c = fold(csum_add(pseudo_sum(f, &h, proto, len), &f[at..at + len]));
        if proto == PROTO_UDP && c == 0 {
            c = 0xffff; // 0 means "no checksum" in UDP over IPv4
        }
        f[field..field + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// Whether a received frame earns `IBV_WC_IP_CSUM_OK`: an IPv4 frame whose header checksum
/// and (for TCP/UDP) L4 checksum are right, as a ConnectX reports L3 and L4 OK.
pub(crate) fn ipv4_checksums_ok(f: &[u8], h: &Headers) -> bool {
    let Some(ip) = h.ipv4 else { return false };
    if fold(csum_add(0, &f[ip.at..ip.at + ip.hlen])) != 0 {
        return false;
    }
    match h.l4 {
        Some((proto, _, _, at)) => {
            let len = l4_len(f, h, at);
            if proto == PROTO_UDP && len >= 8 && be16(f, at + 6) == 0 {
                return true; // UDP without a checksum
            }
            fold(csum_add(pseudo_sum(f, h, proto, len), &f[at..at + len])) == 0
        }
        None => true,
    }
}

/// Receive VLAN stripping: the frame without its 802.1Q tag, and the tag's TCI; `None` for an
/// untagged frame.
pub(crate) fn strip_cvlan(f: &[u8]) -> Option<(Vec<u8>, u16)> {
    if f.len() < ETH_HDR + 4 || be16(f, 12) != ETHERTYPE_VLAN {
        return None;
    }
    let mut out = Vec::with_capacity(f.len() - 4);
    out.extend_from_slice(&f[..12]);
    out.extend_from_slice(&f[16..]);
    Some((out, be16(f, 14)))
}

/// The frame check sequence the wire carries after `f`: IEEE 802.3's CRC-32, least
/// significant byte first.
pub(crate) fn fcs(f: &[u8]) -> [u8; 4] {
    crc32fast::hash(f).to_le_bytes()
}

/// TCP segmentation offload: the frames a NIC sends for `hdr` (Ethernet + IP + TCP headers)
/// followed by `payload`, cut into `mss`-byte segments. Each frame gets the header with its IP
/// length (and IPv4 identification and checksum) and TCP sequence number advanced, FIN and PSH
/// only on the last segment, CWR only on the first, and the TCP checksum filled in. A header
/// that is not Ethernet + IP + TCP is copied unchanged in front of each segment.
pub(crate) fn segment(hdr: &[u8], payload: &[u8], mss: usize) -> Vec<Vec<u8>> {
    let h = Headers::parse(hdr).filter(|h| {
        h.l4.is_some_and(|(proto, _, _, at)| {
            proto == PROTO_TCP && hdr.len() >= at + 20 && hdr.len() == at + tcp_hlen(hdr, at)
        })
    });
    let chunks: Vec<&[u8]> =
        if payload.is_empty() { vec![&[][..]] } else { payload.chunks(mss.max(1)).collect() };
    let n = chunks.len();
    let mut out = Vec::with_capacity(n);
    let mut seq_off = 0u32;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let mut f = Vec::with_capacity(hdr.len() + chunk.len());
        f.extend_from_slice(hdr);
        f.extend_from_slice(chunk);
        if let Some(h) = &h {
            let (_, _, _, at) = h.l4.expect("filtered");
            if let Some(ip) = h.ipv4 {
                let total = (f.len() - ip.at) as u16;
                f[ip.at + 2..ip.at + 4].copy_from_slice(&total.to_be_bytes());
                let id = be16(hdr, ip.at + 4).wrapping_add(i as u16);
                f[ip.at + 4..ip.at + 6].copy_from_slice(&id.to_be_bytes());
            } else if let Some(ip) = h.ipv6 {
                let plen = (f.len() - ip.at - 40) as u16;
                f[ip.at + 4..ip.at + 6].copy_from_slice(&plen.to_be_bytes());
            }
            let seq = be32(hdr, at + 4).wrapping_add(seq_off);
            f[at + 4..at + 8].copy_from_slice(&seq.to_be_bytes());
            const FIN: u8 = 0x01;
            const PSH: u8 = 0x08;
            const CWR: u8 = 0x80;
            if i + 1 < n {
                f[at + 13] &= !(FIN | PSH);
            }
            if i > 0 {
                f[at + 13] &= !CWR;
            }
            insert_checksums(&mut f);
        }
        seq_off = seq_off.wrapping_add(chunk.len() as u32);
        out.push(f);
    }
    out
}

fn tcp_hlen(f: &[u8], at: usize) -> usize {
    (f[at + 12] >> 4) as usize * 4
}

/// The Toeplitz hash of `input` under `key` (the Microsoft RSS definition): for every set bit
/// of the input, XOR in the 32 key bits starting at that bit's position.
pub(crate) fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let mut result = 0u32;
    let key_bit =
        |i: usize| -> u32 { key.get(i / 8).map_or(0, |b| ((b >> (7 - i % 8)) & 1) as u32) };
    // The 32-bit window of the key starting at bit 0, slid one bit per input bit.
    let mut window = (0..32).fold(0u32, |w, i| (w << 1) | key_bit(i));
    for (byte_i, b) in input.iter().enumerate() {
        for bit in 0..8 {
            if b & (0x80 >> bit) != 0 {
                result ^= window;
            }
            window = (window << 1) | key_bit(byte_i * 8 + bit + 32);
        }
    }
    result
}

/// The RSS hash of a frame: Toeplitz over the selected fields present in it, in the order
/// source address, destination address, source port, destination port (ports only when the
/// frame's L4 protocol is the one selected). 0 when no selected field is present.
pub(crate) fn rss_hash(key: &[u8], fields: u64, h: &Headers) -> u32 {
    use crate::types::hash_fields::*;
    let mut input = Vec::with_capacity(36);
    if let Some(ip) = h.ipv4 {
        if fields & SRC_IPV4 != 0 {
            input.extend_from_slice(&ip.src.to_be_bytes());
        }
        if fields & DST_IPV4 != 0 {
            input.extend_from_slice(&ip.dst.to_be_bytes());
        }
    }
    if let Some(ip) = h.ipv6 {
        if fields & SRC_IPV6 != 0 {
            input.extend_from_slice(&ip.src);
        }
        if fields & DST_IPV6 != 0 {
            input.extend_from_slice(&ip.dst);
        }
    }
    if let Some((proto, sport, dport, _)) = h.l4 {
        let (s, d) = if proto == PROTO_TCP {
            (SRC_PORT_TCP, DST_PORT_TCP)
        } else {
            (SRC_PORT_UDP, DST_PORT_UDP)
        };
        if fields & s != 0 {
            input.extend_from_slice(&sport.to_be_bytes());
        }
        if fields & d != 0 {
            input.extend_from_slice(&dport.to_be_bytes());
        }
    }
    if input.is_empty() { 0 } else { toeplitz(key, &input) }
}

#[cfg(test)]
pub(crate) mod test {
    use super::*;

    /// The key of Microsoft's RSS verification suite.
    pub(crate) const MS_KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    /// An Ethernet + IPv4 + TCP/UDP frame with `payload`, checksums filled in.
    pub(crate) fn ipv4_frame(
        proto: u8,
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        let l4 = if proto == PROTO_TCP { 20 } else { 8 };
        let mut f = vec![0u8; 14 + 20 + l4];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        let total = (20 + l4 + payload.len()) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[22] = 64;
        f[23] = proto;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        if proto == PROTO_TCP {
            f[46] = 5 << 4;
            f[47] = 0x18; // PSH, ACK
        } else {
            f[38..40].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        }
        f.extend_from_slice(payload);
        insert_checksums(&mut f);
        f
    }

    #[test]
    fn test_fcs_is_the_ethernet_crc_and_stripping_removes_the_tag() {
        let f = ipv4_frame(PROTO_UDP, [10, 0, 0, 1], 1, [10, 0, 0, 2], 2, b"fcs");
        // A frame followed by its FCS leaves the CRC-32 residue of IEEE 802.3.
        let mut wire = f.clone();
        wire.extend_from_slice(&fcs(&f));
        assert_eq!(crc32fast::hash(&wire), 0x2144_df1c);
        // The check value of CRC-32/ISO-HDLC, least significant byte first.
        assert_eq!(fcs(b"123456789"), 0xcbf4_3926u32.to_le_bytes());

        assert!(strip_cvlan(&f).is_none(), "untagged");
        let mut tagged = f[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0xa0, 0x64]); // PCP 5, VID 100
        tagged.extend_from_slice(&f[12..]);
        assert_eq!(strip_cvlan(&tagged), Some((f, 0xa064)));
    }

    #[test]
    fn test_toeplitz_matches_the_microsoft_verification_suite() {
        // (source, source port, destination, destination port, IPv4 hash, IPv4 + TCP hash)
        let cases = [
            ([66, 9, 149, 187], 2794, [161, 142, 100, 80], 1766, 0x323e_8fc2, 0x51cc_c178),
            ([199, 92, 111, 2], 14230, [65, 69, 140, 83], 4739, 0xd718_262a, 0xc626_b0ea),
            ([24, 19, 198, 95], 12898, [12, 22, 207, 184], 38024, 0xd2d0_a5de, 0x5c2b_394a),
            ([38, 27, 205, 30], 48228, [209, 142, 163, 6], 2217, 0x8298_9176, 0xafc7_327f),
            ([153, 39, 163, 191], 44251, [202, 188, 127, 2], 1303, 0x5d18_09c5, 0x10e8_28a2),
        ];
        use crate::types::hash_fields::*;
        for (src, sport, dst, dport, ip_hash, tcp_hash) in cases {
            let f = ipv4_frame(PROTO_TCP, src, sport, dst, dport, b"");
            let h = Headers::parse(&f).unwrap();
            assert_eq!(rss_hash(&MS_KEY, IPV4, &h), ip_hash, "{src:?}");
            assert_eq!(rss_hash(&MS_KEY, IPV4 | TCP, &h), tcp_hash, "{src:?}");
            // UDP port bits do not hash a TCP frame's ports.
            assert_eq!(rss_hash(&MS_KEY, IPV4 | UDP, &h), ip_hash);
        }
    }

    #[test]
    fn test_checksums_inserted_are_verified_and_a_flipped_bit_fails() {
        let mut f = ipv4_frame(PROTO_UDP, [10, 0, 0, 1], 5000, [10, 0, 0, 2], 6000, b"hello");
        let h = Headers::parse(&f).unwrap();
        assert_eq!(h.l4.map(|l| (l.0, l.1, l.2)), Some((PROTO_UDP, 5000, 6000)));
        assert!(ipv4_checksums_ok(&f, &h));
        let last = f.len() - 1;
        f[last] ^= 1;
        assert!(!ipv4_checksums_ok(&f, &h));
    }

    #[test]
    fn test_tso_cuts_segments_with_fixed_up_headers() {
        let hdr = ipv4_frame(PROTO_TCP, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80, b"");
        let payload: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let frames = segment(&hdr, &payload, 1000);
        assert_eq!(frames.len(), 3);
        for (i, f) in frames.iter().enumerate() {
            let h = Headers::parse(f).unwrap();
            assert!(ipv4_checksums_ok(f, &h), "segment {i}");
            assert_eq!(be16(f, 16) as usize, f.len() - 14, "IP total length");
            assert_eq!(be16(f, 18), i as u16, "IP id");
            assert_eq!(be32(f, 38), i as u32 * 1000, "sequence number");
            let psh = f[47] & 0x08 != 0;
            assert_eq!(psh, i == 2, "PSH only on the last");
            assert_eq!(&f[54..], &payload[i * 1000..(i * 1000 + 1000).min(2500)]);
        }
    }
}

//! The IB CM's messages in their wire form (InfiniBand Architecture volume 1, chapter 12):
//! 256-byte management datagrams (MADs) of the CM class, sent to and from QP1 as UD SENDs
//! with the GSI's Q_Key. Over a wire port they are how the connection manager speaks to
//! the kernel's (rxe's, a RoCE NIC's) and to the emulator's on another host (`super::wire`).
//!
//! rdma_cm's own header rides in the private data of a REQ and a SIDR REQ: the two IP
//! addresses and the source port ([`IpHeader`]), the service ID naming the port space and
//! the destination port.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::types::Gid;

/// The bytes of a MAD.
pub(crate) const MAD_LEN: usize = 256;
/// The common MAD header before each message's fields.
const HDR: usize = 24;

const BASE_VERSION: u8 = 1;
const CLASS_CM: u8 = 0x07;
const CLASS_VERSION: u8 = 2;
/// Every CM message is a "Send" (none is a response the MAD layer matches).
const METHOD_SEND: u8 = 0x03;

const REQ: u16 = 0x0010;
const MRA: u16 = 0x0011;
const REJ: u16 = 0x0012;
const REP: u16 = 0x0013;
const RTU: u16 = 0x0014;
const DREQ: u16 = 0x0015;
const DREP: u16 = 0x0016;
const SIDR_REQ: u16 = 0x0017;
const SIDR_REP: u16 = 0x0018;

/// Private data of each message, in bytes.
pub(crate) const REQ_PRIVATE: usize = 92;
pub(crate) const REP_PRIVATE: usize = 196;
pub(crate) const REJ_PRIVATE: usize = 148;
pub(crate) const SIDR_REQ_PRIVATE: usize = 216;
pub(crate) const SIDR_REP_PRIVATE: usize = 136;

/// The REJ's "message rejected": the REQ (the passive side refuses it).
pub(crate) const REJECTED_REQ: u8 = 0;

/// A connection request. Fields the emulator does not use (EECNs, alternate path, the CM
/// timeouts, P_Key) are written as the kernel writes them and not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Req {
    pub(crate) local_id: u32,
    pub(crate) service_id: u64,
    pub(crate) ca_guid: u64,
    pub(crate) qpn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    /// Transport service type: 0 RC, 1 UC.
    pub(crate) transport: u8,
    pub(crate) psn: u32,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) flow_control: bool,
    /// Path MTU, as `enum ibv_mtu` (1: 256 .. 5: 4096).
    pub(crate) mtu: u8,
    pub(crate) srq: bool,
    /// The primary path: the sender's GID and the receiver's.
    pub(crate) local_gid: Gid,
    pub(crate) remote_gid: Gid,
    pub(crate) traffic_class: u8,
    pub(crate) hop_limit: u8,
    pub(crate) ack_timeout: u8,
    pub(crate) private: [u8; REQ_PRIVATE],
}

/// A reply accepting a connection request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rep {
    pub(crate) local_id: u32,
    pub(crate) remote_id: u32,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) flow_control: bool,
    pub(crate) srq: bool,
    pub(crate) ca_guid: u64,
    pub(crate) private: [u8; REP_PRIVATE],
}

/// A message of the CM class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CmMad {
    Req(Box<Req>),
    Rep(Box<Rep>),
    Rtu {
        local_id: u32,
        remote_id: u32,
    },
    Rej {
        local_id: u32,
        remote_id: u32,
        rejected: u8,
        reason: u16,
        private: Vec<u8>,
    },
    Dreq {
        local_id: u32,
        remote_id: u32,
        remote_qpn: u32,
    },
    Drep {
        local_id: u32,
        remote_id: u32,
    },
    /// "Message receipt acknowledged": the other side needs longer to answer.
    Mra {
        local_id: u32,
        remote_id: u32,
    },
    SidrReq {
        request_id: u32,
        service_id: u64,
        private: Vec<u8>,
    },
    SidrRep {
        request_id: u32,
        status: u8,
        qpn: u32,
        service_id: u64,
        qkey: u32,
        private: Vec<u8>,
    },
}

/// A MAD: its transaction ID and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mad {
    pub(crate) tid: u64,
    pub(crate) msg: CmMad,
}

/// A MAD being written: fields at their offsets after the common header.
struct Out([u8; MAD_LEN]);

impl Out {
    fn u8(&mut self, at: usize, v: u8) {
        self.0[HDR + at] = v;
    }
    fn u16(&mut self, at: usize, v: u16) {
        self.0[HDR + at..HDR + at + 2].copy_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, at: usize, v: u32) {
        self.0[HDR + at..HDR + at + 4].copy_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, at: usize, v: u64) {
        self.0[HDR + at..HDR + at + 8].copy_from_slice(&v.to_be_bytes());
    }
    /// A 24-bit field in the top of the word at `at`, `low` in its last byte.
    fn u24(&mut self, at: usize, v: u32, low: u8) {
        self.u32(at, (v & 0xff_ffff) << 8 | u32::from(low));
    }
    fn bytes(&mut self, at: usize, b: &[u8]) {
        self.0[HDR + at..HDR + at + b.len()].copy_from_slice(b);
    }
}

/// A MAD being read.
struct In<'a>(&'a [u8; MAD_LEN]);

impl In<'_> {
    fn u8(&self, at: usize) -> u8 {
        self.0[HDR + at]
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes(self.0[HDR + at..HDR + at + 2].try_into().expect("2 bytes"))
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.0[HDR + at..HDR + at + 4].try_into().expect("4 bytes"))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.0[HDR + at..HDR + at + 8].try_into().expect("8 bytes"))
    }
    /// The 24-bit field in the top of the word at `at`.
    fn u24(&self, at: usize) -> u32 {
        self.u32(at) >> 8
    }
    fn bytes<const N: usize>(&self, at: usize) -> [u8; N] {
        self.0[HDR + at..HDR + at + N].try_into().expect("N bytes")
    }
    fn gid(&self, at: usize) -> Gid {
        Gid(self.bytes(at))
    }
}

impl Mad {
    pub(crate) fn encode(&self) -> [u8; MAD_LEN] {
        let mut o = Out([0; MAD_LEN]);
        let attr = match &self.msg {
            CmMad::Req(r) => {
                o.u32(0, r.local_id);
                o.u64(8, r.service_id);
                o.u64(16, r.ca_guid);
                o.u24(32, r.qpn, r.responder_resources);
                o.u24(36, 0, r.initiator_depth);
                // Remote CM response timeout 20 (4.3 s), transport, end-to-end flow control.
                o.u24(40, 0, 20 << 3 | (r.transport & 3) << 1 | u8::from(r.flow_control));
                // Local CM response timeout 20, retry count.
                o.u24(44, r.psn, 20 << 3 | (r.retry_count & 7));
                o.u16(48, 0xffff);
                o.u8(50, (r.mtu & 0xf) << 4 | (r.rnr_retry_count & 7));
                // Max CM retries 15, SRQ.
                o.u8(51, 15 << 4 | u8::from(r.srq) << 3);
                // Permissive LIDs: a RoCE path has none.
                o.u16(52, 0xffff);
                o.u16(54, 0xffff);
                o.bytes(56, &r.local_gid.0);
                o.bytes(72, &r.remote_gid.0);
                o.u8(92, r.traffic_class);
                o.u8(93, r.hop_limit);
                o.u8(95, (r.ack_timeout & 0x1f) << 3);
                o.bytes(140, &r.private);
                REQ
            }
            CmMad::Rep(r) => {
                o.u32(0, r.local_id);
                o.u32(4, r.remote_id);
                o.u24(12, r.qpn, 0);
                o.u24(20, r.psn, 0);
                o.u8(24, r.responder_resources);
                o.u8(25, r.initiator_depth);
                // Target ACK delay 15 (rxe's local_ca_ack_delay), failover accepted (0) as
                // rdma_cm asks, end-to-end flow control.
                o.u8(26, 15 << 3 | u8::from(r.flow_control));
                o.u8(27, (r.rnr_retry_count & 7) << 5 | u8::from(r.srq) << 4);
                o.u64(28, r.ca_guid);
                o.bytes(36, &r.private);
                REP
            }
            CmMad::Rtu { local_id, remote_id } => {
                o.u32(0, *local_id);
                o.u32(4, *remote_id);
                RTU
            }
            CmMad::Rej { local_id, remote_id, rejected, reason, private } => {
                o.u32(0, *local_id);
                o.u32(4, *remote_id);
                o.u8(8, rejected << 6);
                o.u16(10, *reason);
                o.bytes(84, &private[..private.len().min(REJ_PRIVATE)]);
                REJ
            }
            CmMad::Dreq { local_id, remote_id, remote_qpn } => {
                o.u32(0, *local_id);
                o.u32(4, *remote_id);
                o.u24(8, *remote_qpn, 0);
                DREQ
            }
            CmMad::Drep { local_id, remote_id } => {
                o.u32(0, *local_id);
                o.u32(4, *remote_id);
                DREP
            }
            CmMad::Mra { local_id, remote_id } => {
                o.u32(0, *local_id);
                o.u32(4, *remote_id);
                // The REP is acknowledged; service timeout 20.
                o.u8(8, 1 << 6);
                o.u8(9, 20 << 3);
                MRA
            }
            CmMad::SidrReq { request_id, service_id, private } => {
                o.u32(0, *request_id);
                o.u16(4, 0xffff);
                o.u64(8, *service_id);
                o.bytes(16, &private[..private.len().min(SIDR_REQ_PRIVATE)]);
                SIDR_REQ
            }
            CmMad::SidrRep { request_id, status, qpn, service_id, qkey, private } => {
                o.u32(0, *request_id);
                o.u8(4, *status);
                o.u24(8, *qpn, 0);
                o.u64(12, *service_id);
                o.u32(20, *qkey);
                o.bytes(96, &private[..private.len().min(SIDR_REP_PRIVATE)]);
                SIDR_REP
            }
        };
        let h = &mut o.0;
        (h[0], h[1], h[2], h[3]) = (BASE_VERSION, CLASS_CM, CLASS_VERSION, METHOD_SEND);
        h[8..16].copy_from_slice(&self.tid.to_be_bytes());
        h[16..18].copy_from_slice(&attr.to_be_bytes());
        o.0
    }

    /// The message in `b`; `None` for anything but a CM message of the class version the
    /// kernel speaks, and for attributes the emulator does not take (LAP, APR, ...).
    pub(crate) fn decode(b: &[u8]) -> Option<Mad> {
        let b: &[u8; MAD_LEN] = b.get(..MAD_LEN)?.try_into().ok()?;
        if b[0] != BASE_VERSION || b[1] != CLASS_CM || b[2] != CLASS_VERSION || b[3] != METHOD_SEND
        {
            return None;
        }
        let tid = u64::from_be_bytes(b[8..16].try_into().ok()?);
        let attr = u16::from_be_bytes([b[16], b[17]]);
        let i = In(b);
        let ids = || (i.u32(0), i.u32(4));
        let msg = match attr {
            REQ => CmMad::Req(Box::new(Req {
                local_id: i.u32(0),
                service_id: i.u64(8),
                ca_guid: i.u64(16),
                qpn: i.u24(32),
                responder_resources: i.u8(35),
                initiator_depth: i.u8(39),
                transport: i.u8(43) >> 1 & 3,
                flow_control: i.u8(43) & 1 != 0,
                psn: i.u24(44),
                retry_count: i.u8(47) & 7,
                mtu: i.u8(50) >> 4,
                rnr_retry_count: i.u8(50) & 7,
                srq: i.u8(51) & 0x08 != 0,
                local_gid: i.gid(56),
                remote_gid: i.gid(72),
                traffic_class: i.u8(92),
                hop_limit: i.u8(93),
                ack_timeout: i.u8(95) >> 3,
                private: i.bytes(140),
            })),
            REP => CmMad::Rep(Box::new(Rep {
                local_id: i.u32(0),
                remote_id: i.u32(4),
                qpn: i.u24(12),
                psn: i.u24(20),
                responder_resources: i.u8(24),
                initiator_depth: i.u8(25),
                rnr_retry_count: i.u8(27) >> 5,
                flow_control: i.u8(26) & 1 != 0,
                srq: i.u8(27) & 0x10 != 0,
                ca_guid: i.u64(28),
                private: i.bytes(36),
            })),
            RTU => CmMad::Rtu { local_id: ids().0, remote_id: ids().1 },
            REJ => CmMad::Rej {
                local_id: ids().0,
                remote_id: ids().1,
                rejected: i.u8(8) >> 6,
                reason: i.u16(10),
                private: i.bytes::<REJ_PRIVATE>(84).to_vec(),
            },
            DREQ => CmMad::Dreq { local_id: ids().0, remote_id: ids().1, remote_qpn: i.u24(8) },
            DREP => CmMad::Drep { local_id: ids().0, remote_id: ids().1 },
            MRA => CmMad::Mra { local_id: ids().0, remote_id: ids().1 },
            SIDR_REQ => CmMad::SidrReq {
                request_id: i.u32(0),
                service_id: i.u64(8),
                private: i.bytes::<SIDR_REQ_PRIVATE>(16).to_vec(),
            },
            SIDR_REP => CmMad::SidrRep {
                request_id: i.u32(0),
                status: i.u8(4),
                qpn: i.u24(8),
                service_id: i.u64(12),
                qkey: i.u32(20),
                private: i.bytes::<SIDR_REP_PRIVATE>(96).to_vec(),
            },
            _ => return None,
        };
        Some(Mad { tid, msg })
    }
}

/// rdma_cm's header at the front of a REQ's (and SIDR REQ's) private data: the requester's
/// address and port, and the address it asked for (the port is in the service ID).
pub(crate) const IP_HEADER: usize = 36;

/// The service ID of port `port` in port space `ps` (`enum rdma_port_space`'s value).
pub(crate) fn service_id(ps: u32, port: u16) -> u64 {
    u64::from(ps) << 16 | u64::from(port)
}

/// The port space and port a service ID names (rdma_cm's: the top 32 bits zero).
pub(crate) fn of_service_id(id: u64) -> Option<(u32, u16)> {
    (id >> 32 == 0).then_some(((id >> 16) as u32, id as u16))
}

/// Writes rdma_cm's header for a request from `src` to `dst` at the front of `private`.
pub(crate) fn put_ip_header(private: &mut [u8], src: SocketAddr, dst: IpAddr) {
    let h = &mut private[..IP_HEADER];
    h[0] = 0;
    h[1] = if src.is_ipv4() { 4 << 4 } else { 6 << 4 };
    h[2..4].copy_from_slice(&src.port().to_be_bytes());
    let at = |ip: IpAddr| match ip {
        // An IPv4 address sits in the last word of its 16 bytes, the rest zero.
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    };
    h[4..20].copy_from_slice(&at(src.ip()));
    h[20..36].copy_from_slice(&at(dst));
}

/// The requester's address and the address it asked for, from rdma_cm's header; `None` for
/// another header version or IP version.
pub(crate) fn ip_header(private: &[u8]) -> Option<(SocketAddr, IpAddr)> {
    let h = private.get(..IP_HEADER)?;
    let port = u16::from_be_bytes([h[2], h[3]]);
    let v6 = |b: &[u8]| Ipv6Addr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
    let (src, dst): (IpAddr, IpAddr) = match (h[0], h[1] >> 4) {
        (0, 4) => {
            let v4 = |b: &[u8]| IpAddr::from(<[u8; 4]>::try_from(&b[12..16]).expect("4 bytes"));
            (v4(&h[4..20]), v4(&h[20..36]))
        }
        (0, 6) => (v6(&h[4..20]).into(), v6(&h[20..36]).into()),
        _ => return None,
    };
    Some((SocketAddr::new(src, port), dst))
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::fabric::roce::GSI_QKEY;

    /// The UDP payloads (BTH to ICRC) of the IB CM MADs rxe sent (Linux 6.1, captured in the
    /// rxe VM): `rping -c -a 10.0.4.2 -p 7174` from 10.0.4.1 to an address where nobody
    /// answered: its REQ, and the REJ (reason 4, timeout) once it gave up.
    fn rxe_mads() -> Vec<(String, Vec<u8>)> {
        crate::captured::tagged_hex(include_str!("testdata/rxe-cm-mads.txt"), "mad")
    }

    /// BTH (12) and DETH (8) before the MAD, ICRC (4) after it.
    fn mad_of(datagram: &[u8]) -> &[u8] {
        assert_eq!(datagram.len(), 12 + 8 + MAD_LEN + 4);
        assert_eq!(datagram[0], 0x64, "UD SEND only");
        assert_eq!(&datagram[5..8], &[0, 0, 1], "to QP1");
        assert_eq!(&datagram[12..16], &GSI_QKEY.to_be_bytes());
        assert_eq!(&datagram[17..20], &[0, 0, 1], "from QP1");
        &datagram[20..20 + MAD_LEN]
    }

    #[test]
    fn test_rxes_req_and_rej_decode_and_encode_to_the_same_bytes() {
        let mads = rxe_mads();
        let (_, req) = mads.iter().find(|(w, _)| w == "req").unwrap();
        let bytes = mad_of(req);
        let mad = Mad::decode(bytes).unwrap();
        let CmMad::Req(r) = &mad.msg else { panic!("{mad:?}") };
        assert_eq!(of_service_id(r.service_id), Some((0x0106, 7174)), "RDMA_PS_TCP");
        assert_eq!((r.qpn, r.psn, r.transport, r.mtu), (0x11, 0xf8ef09, 0, 3));
        assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
        assert_eq!((r.retry_count, r.rnr_retry_count, r.srq), (7, 7, false));
        assert_eq!(r.local_gid, Gid::of_ip("10.0.4.1".parse().unwrap()));
        assert_eq!(r.remote_gid, Gid::of_ip("10.0.4.2".parse().unwrap()));
        assert_eq!((r.hop_limit, r.traffic_class), (64, 0));
        let (src, dst) = ip_header(&r.private).unwrap();
        assert_eq!((src, dst), ("10.0.4.1:40431".parse().unwrap(), "10.0.4.2".parse().unwrap()));
        // What the emulator writes of the fields it knows is what rxe wrote (the flow label,
        // ACK timeout and the fields the emulator does not read aside).
        let mut ours = mad.encode();
        let mut theirs: [u8; MAD_LEN] = bytes.try_into().unwrap();
        for b in [&mut ours, &mut theirs] {
            b[HDR + 88..HDR + 92].fill(0);
            b[HDR + 95] = 0;
        }
        assert_eq!(ours, theirs);
        let mut private = [0u8; REQ_PRIVATE];
        put_ip_header(&mut private, src, dst);
        assert_eq!(private, r.private);

        let (_, rej) = mads.iter().find(|(w, _)| w == "rej").unwrap();
        let mad = Mad::decode(mad_of(rej)).unwrap();
        let CmMad::Rej { local_id, remote_id, rejected, reason, .. } = mad.msg else {
            panic!("{mad:?}")
        };
        assert_eq!((local_id, remote_id, rejected, reason), (r.local_id, 0, 2, 4));
    }

    #[test]
    fn test_every_message_survives_its_wire_form_and_others_are_refused() {
        let gid = Gid::of_ip("fd77::2".parse().unwrap());
        let req = Req {
            local_id: 0x1234_5678,
            service_id: service_id(0x0106, 18515),
            ca_guid: 0x0202_03ff_fe04_0506,
            qpn: 0xab_cdef,
            responder_resources: 16,
            initiator_depth: 8,
            transport: 0,
            psn: 0x12_3456,
            retry_count: 6,
            rnr_retry_count: 5,
            flow_control: true,
            mtu: 5,
            srq: true,
            local_gid: gid,
            remote_gid: Gid::of_ip("fd77::1".parse().unwrap()),
            traffic_class: 0x20,
            hop_limit: 64,
            ack_timeout: 14,
            private: [7; REQ_PRIVATE],
        };
        let rep = Rep {
            local_id: 9,
            remote_id: 0x1234_5678,
            qpn: 0x11,
            psn: 0xff_ffff,
            responder_resources: 4,
            initiator_depth: 2,
            rnr_retry_count: 7,
            flow_control: true,
            srq: false,
            ca_guid: 1,
            private: [3; REP_PRIVATE],
        };
        for msg in [
            CmMad::Req(Box::new(req)),
            CmMad::Rep(Box::new(rep)),
            CmMad::Rtu { local_id: 1, remote_id: 2 },
            CmMad::Rej {
                local_id: 0,
                remote_id: 2,
                rejected: 0,
                reason: 28,
                private: vec![5; 148],
            },
            CmMad::Dreq { local_id: 1, remote_id: 2, remote_qpn: 0x12 },
            CmMad::Drep { local_id: 2, remote_id: 1 },
            CmMad::Mra { local_id: 2, remote_id: 1 },
            CmMad::SidrReq { request_id: 3, service_id: 0x0111_0007, private: vec![1; 216] },
            CmMad::SidrRep {
                request_id: 3,
                status: 0,
                qpn: 0x44,
                service_id: 0x0111_0007,
                qkey: 0x0123_4567,
                private: vec![2; 136],
            },
        ] {
            let mad = Mad { tid: 0x0102_0304_0506_0708, msg };
            let b = mad.encode();
            assert_eq!(Mad::decode(&b).as_ref(), Some(&mad));
            assert_eq!(Mad::decode(&b[..MAD_LEN - 1]), None, "short");
            for (at, v) in [(0, 2), (1, 0x81), (2, 1), (3, 0x81)] {
                let mut other = b;
                other[at] = v;
                assert_eq!(Mad::decode(&other), None, "header byte {at}");
            }
        }
        let mut lap = Mad { tid: 1, msg: CmMad::Drep { local_id: 1, remote_id: 2 } }.encode();
        lap[17] = 0x19;
        assert_eq!(Mad::decode(&lap), None, "LAP is not taken");
        assert_eq!(ip_header(&[0; 35]), None);
        assert_eq!(ip_header(&[1; 36]), None, "header version 1");
        let mut v6 = [0u8; IP_HEADER];
        put_ip_header(&mut v6, "[fd77::1]:5000".parse().unwrap(), "fd77::2".parse().unwrap());
        assert_eq!(
            ip_header(&v6),
            Some(("[fd77::1]:5000".parse().unwrap(), "fd77::2".parse().unwrap()))
        );
        assert_eq!(of_service_id(1 << 40), None);
    }
}

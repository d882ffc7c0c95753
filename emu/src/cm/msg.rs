//! The connection manager's messages (after the IB CM's REQ, REP, RTU, REJ and DREQ), and
//! their byte form between processes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::PortSpace;
use crate::wire::Reader;

/// One side of a connection, as the other side needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Remote {
    /// The node slot of its process on the host fabric (0: this fabric has none).
    pub(crate) slot: u8,
    /// Its CM id's number there.
    pub(crate) id: u32,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) device: u32,
    pub(crate) port: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    /// End-to-end flow control offered (REQ) or taken (REP): 0 or 1, told to the other side.
    pub(crate) flow_control: u8,
    /// Enhanced Connection Establishment: the vendor and the options offered (REQ) or taken
    /// (REP); vendor 0 for none.
    pub(crate) ece_vendor: u32,
    pub(crate) ece_options: u32,
    /// A side beyond a wire port (`super::wire`): where its messages go. Never in the byte
    /// form between processes.
    pub(crate) wire: Option<WirePeer>,
}

/// A connection's other side beyond a wire port, as one of our ids knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WirePeer {
    /// Our wire address, and the address the other side's messages came from.
    pub(crate) local: IpAddr,
    pub(crate) peer: IpAddr,
    /// The path MTU the request named (a reply names none: the largest).
    pub(crate) mtu: crate::types::Mtu,
    /// Our id's number: the local communication ID of what it sends (0 before it has one).
    pub(crate) mine: u32,
    /// The exchange's transaction ID (the request's; the answers carry it back).
    pub(crate) tid: u64,
    /// The service ID the request was for (a SIDR reply names it).
    pub(crate) service_id: u64,
}

/// A message to the CM of a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// A connection request to whoever listens on `dst` in `ps`.
    Req { ps: PortSpace, src: SocketAddr, dst: SocketAddr, from: Remote, private: Vec<u8> },
    /// The request of id `to` was accepted by `from`.
    Rep { to: u32, from: Remote, private: Vec<u8> },
    /// Ready to use: the connection of id `to` is up.
    Rtu { to: u32 },
    /// The request of id `to` was refused, for `reason` (an IB CM reject reason).
    Rej { to: u32, reason: i32, private: Vec<u8> },
    /// The connection of id `to` was ended by the other side's id `from`.
    Dreq { to: u32, from: u32 },
    /// The other side took the DREQ of id `to`.
    Drep { to: u32 },
    /// The requester's id `from`, of the node in `slot`, went before its request was answered:
    /// the request ends. (The kernel's IB CM sends a REJ, reason "timeout", that names no id
    /// of the other side's and that the other side matches to the request by its requester.)
    /// `slot` is where it came from, never in the byte form.
    Withdrawn { slot: u8, from: u32 },
}

/// The most private data any message carries.
const MAX_PRIVATE: usize = 256;

impl Msg {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(96);
        match self {
            Msg::Req { ps, src, dst, from, private } => {
                o.push(0);
                o.extend_from_slice(&ps.code().to_le_bytes());
                put_addr(&mut o, src);
                put_addr(&mut o, dst);
                put_remote(&mut o, from);
                put_bytes(&mut o, private);
            }
            Msg::Rep { to, from, private } => {
                o.push(1);
                o.extend_from_slice(&to.to_le_bytes());
                put_remote(&mut o, from);
                put_bytes(&mut o, private);
            }
            Msg::Rtu { to } => {
                o.push(2);
                o.extend_from_slice(&to.to_le_bytes());
            }
            Msg::Rej { to, reason, private } => {
                o.push(3);
                o.extend_from_slice(&to.to_le_bytes());
                o.extend_from_slice(&reason.to_le_bytes());
                put_bytes(&mut o, private);
            }
            Msg::Dreq { to, from } => {
                o.push(4);
                o.extend_from_slice(&to.to_le_bytes());
                o.extend_from_slice(&from.to_le_bytes());
            }
            Msg::Drep { to } => {
                o.push(5);
                o.extend_from_slice(&to.to_le_bytes());
            }
            Msg::Withdrawn { slot: _, from } => {
                o.push(6);
                o.extend_from_slice(&from.to_le_bytes());
            }
        }
        o
    }

    /// The message in `b`, if it is one (whatever another process sent).
    pub(crate) fn decode(b: &[u8]) -> Option<Msg> {
        let mut r = Reader(b);
        let m = match r.take::<1>()?[0] {
            0 => {
                let ps = PortSpace::from_code(r.u32()?)?;
                let (src, dst) = (addr(&mut r)?, addr(&mut r)?);
                Msg::Req { ps, src, dst, from: remote(&mut r)?, private: bytes(&mut r)? }
            }
            1 => Msg::Rep { to: r.u32()?, from: remote(&mut r)?, private: bytes(&mut r)? },
            2 => Msg::Rtu { to: r.u32()? },
            3 => Msg::Rej { to: r.u32()?, reason: r.u32()? as i32, private: bytes(&mut r)? },
            4 => Msg::Dreq { to: r.u32()?, from: r.u32()? },
            5 => Msg::Drep { to: r.u32()? },
            6 => Msg::Withdrawn { slot: 0, from: r.u32()? },
            _ => return None,
        };
        r.0.is_empty().then_some(m)
    }
}

fn put_addr(o: &mut Vec<u8>, a: &SocketAddr) {
    let ip = match a.ip() {
        IpAddr::V4(v4) => {
            o.push(4);
            v4.to_ipv6_mapped().octets()
        }
        IpAddr::V6(v6) => {
            o.push(6);
            v6.octets()
        }
    };
    o.extend_from_slice(&ip);
    o.extend_from_slice(&a.port().to_le_bytes());
}

fn put_remote(o: &mut Vec<u8>, r: &Remote) {
    o.push(r.slot);
    for w in [r.id, r.qpn, r.psn, r.device, r.ece_vendor, r.ece_options] {
        o.extend_from_slice(&w.to_le_bytes());
    }
    o.extend_from_slice(&[
        r.port,
        r.responder_resources,
        r.initiator_depth,
        r.retry_count,
        r.rnr_retry_count,
        r.flow_control,
    ]);
}

fn put_bytes(o: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(MAX_PRIVATE)];
    o.extend_from_slice(&(b.len() as u16).to_le_bytes());
    o.extend_from_slice(b);
}

/// The CM's fields, read off the front of a message with the host fabric's reader.
fn addr(r: &mut Reader<'_>) -> Option<SocketAddr> {
    let family = r.take::<1>()?[0];
    let ip = Ipv6Addr::from(r.take::<16>()?);
    let port = r.u16()?;
    let ip = match family {
        4 => IpAddr::V4(ip.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED)),
        6 => IpAddr::V6(ip),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn remote(r: &mut Reader<'_>) -> Option<Remote> {
    let slot = r.take::<1>()?[0];
    let (id, qpn, psn, device) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    let (ece_vendor, ece_options) = (r.u32()?, r.u32()?);
    let [port, responder_resources, initiator_depth, retry_count, rnr_retry_count, flow_control] =
        r.take()?;
    Some(Remote {
        slot,
        id,
        qpn,
        psn,
        device,
        port,
        responder_resources,
        initiator_depth,
        retry_count,
        rnr_retry_count,
        flow_control,
        ece_vendor,
        ece_options,
        wire: None,
    })
}

fn bytes(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let n = r.u16()? as usize;
    if n > MAX_PRIVATE || n > r.0.len() {
        return None;
    }
    let (b, rest) = r.0.split_at(n);
    r.0 = rest;
    Some(b.to_vec())
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_every_message_survives_its_byte_form_and_garbage_is_refused() {
        let from = Remote {
            slot: 3,
            id: 77,
            qpn: 0x3_0012,
            psn: 0xabcdef,
            device: 1,
            port: 1,
            responder_resources: 4,
            initiator_depth: 2,
            retry_count: 7,
            rnr_retry_count: 6,
            flow_control: 1,
            ece_vendor: 0x00ff_ffff,
            ece_options: 3,
            wire: None,
        };
        let (src, dst) = ("127.0.0.1:40000".parse().unwrap(), "[::1]:7471".parse().unwrap());
        for m in [
            Msg::Req { ps: PortSpace::Tcp, src, dst, from, private: b"hello".to_vec() },
            Msg::Rep { to: 9, from, private: vec![1; 196] },
            Msg::Rtu { to: 9 },
            Msg::Rej { to: 9, reason: 28, private: vec![] },
            Msg::Dreq { to: 1, from: 2 },
            Msg::Drep { to: 2 },
            Msg::Withdrawn { slot: 0, from: 3 },
        ] {
            let b = m.encode();
            assert_eq!(Msg::decode(&b), Some(m));
            assert_eq!(Msg::decode(&b[..b.len() - 1]), None);
        }
        assert_eq!(Msg::decode(&[9]), None);
        assert_eq!(Msg::decode(&[3, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]), None);
    }
}

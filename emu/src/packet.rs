//! What travels on the fabric: one packet per message (or per run of consecutive packets of a
//! message), carrying the fields the wire headers would (BTH, RETH, AtomicETH, AETH,
//! AtomicAckETH, ImmDt).
//!
//! A message longer than the path MTU occupies `npkts` PSNs exactly as its packets would on
//! the wire; the engine moves it as one unit so that a large transfer costs one copy. Payload
//! is carried by reference to the source memory (the requester's registered buffer, already
//! checked), so the responder copies straight from source to destination.
//!
//! Data, not behaviour: below the QP (whose inbox holds packets) and the engine (which makes
//! and takes them), and read by the fabric's wire forms and traces.

use std::sync::Arc;

use crate::{
    ipc::ring::Lent,
    mem::{MemFault, MemRegion, PeerRange},
    types::{Grh, QpType},
};

/// Every kind of message a wire carries (the host fabric's own XRC forwarding aside): what
/// tests of hostile input make one of each of.
/// PSNs are 24 bits.
pub(crate) const PSN_MASK: u32 = 0x00ff_ffff;

/// `a - b` in PSN space, as a signed distance (IBA 9.7.1: modulo 2^24, half the space ahead).
pub(crate) fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

pub(crate) fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Number of packets (PSNs) a message of `len` bytes occupies at `mtu`, a path MTU (a power
/// of two: a shift, where a division's latency sat on every work request).
pub(crate) fn packets_for(len: u32, mtu: u32) -> u32 {
    debug_assert!(mtu.is_power_of_two(), "path MTU {mtu}");
    let n = (u64::from(len) + u64::from(mtu) - 1) >> mtu.trailing_zeros();
    (n as u32).max(1)
}

#[cfg(test)]
pub(crate) const WIRE_KINDS: [Kind; 10] = [
    Kind::Send,
    Kind::Write,
    Kind::ReadRequest,
    Kind::ReadResponse,
    Kind::CompareSwap,
    Kind::FetchAdd,
    Kind::AtomicWrite,
    Kind::Flush,
    Kind::Ack,
    Kind::AtomicAck,
];

/// What a message is, at the granularity the engine moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// SEND (ONLY or FIRST..LAST), with or without ImmDt.
    Send,
    /// RDMA WRITE, with or without ImmDt.
    Write,
    ReadRequest,
    ReadResponse,
    CompareSwap,
    FetchAdd,
    /// ATOMIC WRITE (IBA 1.5): RETH and 8 bytes written as one.
    AtomicWrite,
    /// FLUSH (IBA 1.5): FETH and RETH, no payload; answered by an ACK.
    Flush,
    /// ACK / NAK (an AETH).
    Ack,
    /// ATOMIC ACKNOWLEDGE (AETH + AtomicAckETH).
    AtomicAck,
    /// An Ethernet frame of a raw packet QP (the payload is the whole frame).
    Raw,
    /// Between processes, never on a wire: a request an XRC target QP took for an XRC SRQ of
    /// another process in the same (file-shared) domain, handed to that process to execute
    /// (see `engine::xrc`). `xrc_srqn` and `dst_qpn` name the SRQ, `src_*` the target QP,
    /// [`Packet::forwarded`] the request's kind and the domain; the other fields are the
    /// request's.
    XrcDeliver,
    /// The answer to an `XrcDeliver`, to the target QP: its `syndrome` is what the target QP
    /// tells the requester; `orig` an atomic's result, the payload a READ's bytes.
    XrcResult,
}

impl Kind {
    /// Requests go to the responder, everything else to the completer.
    pub(crate) fn is_request(self) -> bool {
        matches!(
            self,
            Kind::Send
                | Kind::Write
                | Kind::ReadRequest
                | Kind::CompareSwap
                | Kind::FetchAdd
                | Kind::AtomicWrite
                | Kind::Flush
                | Kind::Raw
        )
    }
}

/// NAK codes of the AETH (IBA 9.7.5.2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
}

/// The AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syndrome {
    Ack,
    /// RNR NAK with the responder's 5-bit timer code.
    Rnr(u8),
    Nak(NakCode),
}

/// A piece of source memory a payload is gathered from.
#[derive(Debug, Clone)]
pub(crate) struct MemRef {
    pub(crate) region: Arc<MemRegion>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Message payload.
#[derive(Debug, Clone, Default)]
pub(crate) enum Payload {
    #[default]
    None,
    /// Bytes the packet carries itself: inline data copied at post time, or what arrived
    /// from another process.
    Bytes(Bytes),
    /// One source range (the common single-SGE case, without an allocation).
    One(MemRef),
    /// Several source ranges, in order.
    Gather(Vec<MemRef>),
    /// A READ request from another process: the destination lies there, so the response
    /// carries the bytes instead of placing them.
    Remote,
    /// A READ response within one process: the responder already placed the data at the
    /// requester (as the NIC's DMA would); this is where it came from, for packet traces.
    Placed(MemRef),
    /// A message from another process that came in several records of a ring, read from
    /// there in place.
    Lent(Box<[Lent]>),
    /// A large reliable SEND or WRITE from another process: the requester's memory, which
    /// stays as it is until the ACK, read straight into the destination.
    Peer(Box<[PeerRange]>),
    /// A large WRITE or SEND from another process that was placed as its records arrived (see
    /// `engine::landing`): where it landed, or `None` if a piece could not land.
    Landed(Option<Box<Landed>>),
}

/// Where a message placed as it arrived landed.
#[derive(Debug, Clone)]
pub(crate) struct Landed {
    /// Its memory, in order.
    pub(crate) dst: Vec<MemRef>,
    /// A SEND: the slot of the receive queue whose WQE it landed in.
    pub(crate) rq_slot: Option<u32>,
}

impl Payload {
    /// The memory ranges of a `One`/`Gather` payload, in order.
    pub(crate) fn ranges(&self) -> &[MemRef] {
        match self {
            Payload::One(m) => std::slice::from_ref(m),
            Payload::Gather(v) => v,
            Payload::None
            | Payload::Bytes(_)
            | Payload::Remote
            | Payload::Placed(_)
            | Payload::Landed(_)
            | Payload::Lent(_)
            | Payload::Peer(_) => &[],
        }
    }

    /// Visits the payload as consecutive pieces: `(source, offset-or-bytes)`.
    #[inline]
    pub(crate) fn pieces(&self) -> Pieces<'_> {
        match self {
            Payload::None | Payload::Remote | Payload::Placed(_) | Payload::Landed(_) => {
                Pieces::One(None)
            }
            Payload::Bytes(b) => Pieces::One(Some(Piece::Bytes(b))),
            Payload::One(m) => Pieces::One(Some(Piece::Mem(m))),
            Payload::Lent(v) => Pieces::Lent(v.iter()),
            Payload::Gather(v) => Pieces::Mem(v.iter()),
            Payload::Peer(v) => Pieces::Peer(v.iter()),
        }
    }

    /// The bytes it carries, all pieces together.
    #[inline]
    pub(crate) fn carried(&self) -> usize {
        match self.pieces() {
            Pieces::One(p) => p.map_or(0, |p| p.len()),
            more => more.map(|p| p.len()).sum(),
        }
    }
}

/// A payload's pieces, in order (see [`Payload::pieces`]): one state per kind of payload,
/// not a chain of them, as every packet sent or received walks them.
pub(crate) enum Pieces<'a> {
    One(Option<Piece<'a>>),
    Lent(std::slice::Iter<'a, Lent>),
    Mem(std::slice::Iter<'a, MemRef>),
    Peer(std::slice::Iter<'a, PeerRange>),
}

impl<'a> Iterator for Pieces<'a> {
    type Item = Piece<'a>;

    #[inline]
    fn next(&mut self) -> Option<Piece<'a>> {
        match self {
            Pieces::One(p) => p.take(),
            Pieces::Lent(it) => it.next().map(|l| Piece::Bytes(l)),
            Pieces::Mem(it) => it.next().map(Piece::Mem),
            Pieces::Peer(it) => it.next().map(Piece::Peer),
        }
    }
}

/// Bytes a payload carries: its own (a few in place, more on the heap), or lent by the ring
/// they arrived in (read in place, so a large message from another process is copied once,
/// from the ring to its destination).
#[derive(Debug, Clone)]
pub(crate) enum Bytes {
    /// The small messages of latency tests and of protocols' headers: no allocation.
    Inline(u8, [u8; INLINE_BYTES]),
    Owned(Box<[u8]>),
    Lent(Lent),
}

/// The most bytes a payload holds in place: as many as fit beside the enum's tag within the
/// size of its largest other variant (a `Bytes` stays 32 bytes).
pub(crate) const INLINE_BYTES: usize = 22;

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Inline(len, b) => &b[..*len as usize],
            Bytes::Owned(b) => b,
            Bytes::Lent(l) => l,
        }
    }
}

impl From<Box<[u8]>> for Bytes {
    fn from(b: Box<[u8]>) -> Bytes {
        Bytes::Owned(b)
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes::Owned(v.into_boxed_slice())
    }
}

impl From<&[u8]> for Bytes {
    fn from(b: &[u8]) -> Bytes {
        if b.len() <= INLINE_BYTES {
            let mut inline = [0; INLINE_BYTES];
            inline[..b.len()].copy_from_slice(b);
            return Bytes::Inline(b.len() as u8, inline);
        }
        Bytes::Owned(b.into())
    }
}

/// One contiguous piece of a payload.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Piece<'a> {
    Bytes(&'a [u8]),
    Mem(&'a MemRef),
    Peer(&'a PeerRange),
}

impl Piece<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Mem(m) => m.len,
            Piece::Peer(p) => p.len,
        }
    }

    /// Copies its bytes from `off` into `dst`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), MemFault> {
        match self {
            Piece::Bytes(b) => {
                let src = b.get(off..off + dst.len()).ok_or(MemFault::OutOfBounds)?;
                dst.copy_from_slice(src);
                Ok(())
            }
            Piece::Mem(m) if off + dst.len() > m.len => Err(MemFault::OutOfBounds),
            Piece::Mem(m) => m.region.read(m.offset + off, dst),
            Piece::Peer(p) => p.read(off, dst),
        }
    }
}

/// A packet (or a run of consecutive packets of one message).
#[derive(Debug, Clone)]
pub(crate) struct Packet {
    pub(crate) kind: Kind,
    /// The sending QP's transport, which a BTH opcode names (requests; RC for the rest).
    pub(crate) transport: QpType,
    pub(crate) src_dev: u32,
    pub(crate) src_qpn: u32,
    /// Source port's LID (0 on Ethernet), reported as `wc.slid`.
    pub(crate) src_lid: u16,
    pub(crate) src_port: u8,
    pub(crate) dst_dev: u32,
    pub(crate) dst_port: u8,
    pub(crate) dst_qpn: u32,
    /// BTH PSN of the first packet.
    pub(crate) psn: u32,
    /// How many PSNs the message occupies (>= 1).
    pub(crate) npkts: u32,
    /// The path MTU it was cut into `npkts` packets by (packet traces show each packet).
    pub(crate) mtu: u32,
    /// BTH SE bit.
    pub(crate) solicited: bool,
    /// ImmDt, when present. On a raw frame: the flow tag of the rule that steered it.
    pub(crate) imm: Option<u32>,
    /// IETH: the rkey a SEND_WITH_INV invalidates at the responder.
    pub(crate) inv: Option<u32>,
    /// XRCETH: the XRC SRQ a request to an XRC target QP goes to.
    pub(crate) xrc_srqn: u32,
    /// RETH / AtomicETH virtual address, rkey and DMA length.
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
    /// FETH of a FLUSH: placement type (bits 0..3) and selectivity level (bits 4..5).
    pub(crate) feth: u8,
    /// AtomicETH operands.
    pub(crate) swap_add: u64,
    pub(crate) compare: u64,
    /// AETH.
    pub(crate) syndrome: Syndrome,
    pub(crate) msn: u32,
    /// AtomicAckETH: the value the target held before the atomic.
    pub(crate) orig: u64,
    /// DETH Q_Key (UD).
    pub(crate) qkey: u32,
    /// The GRH (UD; what the receiver finds in its first 40 bytes).
    pub(crate) grh: Option<Box<Grh>>,
    /// `XrcDeliver`: what was forwarded.
    pub(crate) forwarded: Option<Box<Forwarded>>,
    /// A packet of a request whose earlier packets were lost on a wire: it only tells the
    /// responder how far the sender is (a PSN-sequence NAK when that is ahead, as rxe answers
    /// the first packet out of sequence); nothing of it executes.
    pub(crate) gap: bool,
    /// SEND/WRITE: the data. READ request: where the requester wants the data; the responder
    /// places it there when it executes the READ, as a NIC's DMA would, so the data is the
    /// memory as it was at that point of the responder's order.
    pub(crate) payload: Payload,
    /// For a request from another process that came whole in one ring record: the record,
    /// through which its responder learns, as it begins, whether the requester carried it out
    /// itself meanwhile (see `ipc::exports`).
    pub(crate) ticket: Option<crate::ipc::ring::Ticket>,
    /// The note of requests that the requester carried out itself, without sending them,
    /// while this process was stopped (see `engine::absent_peer`): a request of no bytes
    /// whose `npkts` PSNs from `psn` cover them, `msn` messages in all.
    pub(crate) carried_out: bool,
}

impl Packet {
    pub(crate) fn new(kind: Kind) -> Packet {
        Packet {
            kind,
            transport: QpType::RC,
            src_dev: 0,
            src_qpn: 0,
            src_lid: 0,
            src_port: 1,
            dst_dev: 0,
            dst_port: 1,
            dst_qpn: 0,
            psn: 0,
            npkts: 1,
            mtu: 0,
            solicited: false,
            imm: None,
            inv: None,
            xrc_srqn: 0,
            va: 0,
            rkey: 0,
            len: 0,
            feth: 0,
            swap_add: 0,
            compare: 0,
            syndrome: Syndrome::Ack,
            msn: 0,
            orig: 0,
            qkey: 0,
            grh: None,
            forwarded: None,
            gap: false,
            payload: Payload::None,
            ticket: None,
            carried_out: false,
        }
    }
}

/// A request an XRC target QP hands to the process of its XRC SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Forwarded {
    pub(crate) kind: Kind,
    /// The domain's file (device, inode).
    pub(crate) file: (u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_payloads_are_held_in_place_and_read_back_whole() {
        for len in [0, 1, 2, INLINE_BYTES - 1, INLINE_BYTES, INLINE_BYTES + 1, 4096] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let b = Bytes::from(&src[..]);
            assert_eq!(&b[..], &src[..], "{len} bytes");
            assert_eq!(matches!(b, Bytes::Inline(..)), len <= INLINE_BYTES, "{len} bytes");
            assert_eq!(&b.clone()[..], &src[..]);
        }
        // Holding bytes in place does not make every packet larger.
        assert_eq!(std::mem::size_of::<Bytes>(), 32);
    }
}

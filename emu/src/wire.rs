//! The byte form of a packet between processes: the header fields the wire would carry, then
//! the payload gathered from the sender's memory at the moment it leaves (as a NIC's DMA read).
//!
//! A READ request carries no payload: its destination is in the requester's process, so the
//! decoded request says [`Payload::Remote`] and the responder answers with the bytes.

use std::{ops::Range, sync::Arc};

use crate::{
    mem::{MemFault, PeerProcess, PeerRange},
    packet::{Forwarded, Kind, NakCode, Packet, Payload, Piece, Syndrome},
    types::{Gid, Grh, QpType},
};

/// Bumped whenever the layout below changes; a mismatching packet is dropped.
const VERSION: u8 = 6;
/// First byte of a control message (see [`Control`]).
const CONTROL: u8 = 0x81;
/// First byte of a connection manager message (its bytes are the CM's business).
const CM: u8 = 0x82;
/// First byte of an ACK in its short form (see [`Ack`]).
const ACK: u8 = 0x83;

/// What a message taken the short way is: its operation and what only it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Send,
    /// A WRITE, to this address and rkey.
    Write(u64, u32),
    /// A READ request, of this address and rkey (`len` bytes, answered in `npkts` PSNs).
    Read(u64, u32),
    /// A READ's response (its payload the bytes read), with the responder's MSN.
    ReadResponse(u32),
    /// A CMP_SWP or FETCH_ADD of the word at `va`.
    Atomic(Atomic),
    /// An atomic's response: the responder's MSN and the word the atomic found.
    AtomicAck(u32, u64),
}

/// An atomic request: CMP_SWP (`compare_swap`: `swap_add` in where `compare` is found) or
/// FETCH_ADD (`swap_add` added), of the word at `va` through `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Atomic {
    pub(crate) compare_swap: bool,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) swap_add: u64,
    pub(crate) compare: u64,
}

impl Atomic {
    /// Its packet kind.
    pub(crate) fn kind(&self) -> Kind {
        if self.compare_swap { Kind::CompareSwap } else { Kind::FetchAdd }
    }
}

/// What the header of a record of the short way (`engine::arriving`, `engine::leaving`) says,
/// read from its record: that of a SEND (with or without immediate), a WRITE, a READ or an
/// atomic, or of a READ's or an atomic's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// The sender's and the receiver's `(device, port, QPN)`.
    pub(crate) src: (u32, u8, u32),
    pub(crate) dst: (u32, u8, u32),
    pub(crate) transport: QpType,
    pub(crate) psn: u32,
    pub(crate) npkts: u32,
    pub(crate) len: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) solicited: bool,
    pub(crate) src_lid: u16,
    pub(crate) op: Op,
}

/// What a control message asks every node of the host fabric to do (the `rdma-emu` command
/// sends them, so events can be raised in a running program).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// `Device::raise_event` on device `dev` (port 0: a device event).
    Event { dev: u32, port: u8, event: u32 },
    /// `Device::set_port_state`.
    PortState { dev: u32, port: u8, up: bool },
    /// Sent to its peer's node only: the connected QP `qpn` was destroyed by its owner, so
    /// the peer's death later is a parting, not a broken connection.
    QpClosed { qpn: u32 },
}

/// A message between nodes.
#[derive(Debug)]
pub(crate) enum Message {
    /// A packet, decoded into the packet the caller handed in.
    Packet,
    Control(Control),
    /// For the connection manager (`crate::cm`).
    Cm(Vec<u8>),
}

pub(crate) fn encode_control(c: Control) -> Vec<u8> {
    let (kind, dev, port, value) = match c {
        Control::Event { dev, port, event } => (0, dev, port, event),
        Control::PortState { dev, port, up } => (1, dev, port, u32::from(up)),
        Control::QpClosed { qpn } => (2, 0, 0, qpn),
    };
    let mut out = vec![CONTROL, kind, port];
    out.extend_from_slice(&dev.to_le_bytes());
    out.extend_from_slice(&value.to_le_bytes());
    out
}

/// A positive acknowledgement from a responder: all an ACK says, where the full header takes 91
/// bytes (an ACK answers every SEND and WRITE of a reliable QP; in a ping-pong between
/// processes, writing and reading its full form took a fifth of each round's instructions).
/// It decodes to the packet `responder::reply` builds for it, as its full form does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ack {
    pub(crate) src: (u32, u8, u32),
    pub(crate) dst: (u32, u8, u32),
    pub(crate) psn: u32,
    pub(crate) msn: u32,
}

/// The bytes of an [`Ack`].
pub(crate) const ACK_LEN: usize = 4 + 6 * 4;

impl Ack {
    pub(crate) fn encode(&self) -> [u8; ACK_LEN] {
        let mut out = [0u8; ACK_LEN];
        let ((sdev, sport, sqpn), (ddev, dport, dqpn)) = (self.src, self.dst);
        out[..4].copy_from_slice(&[ACK, VERSION, sport, dport]);
        for (i, w) in [sdev, sqpn, ddev, dqpn, self.psn, self.msn].into_iter().enumerate() {
            out[4 + 4 * i..8 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// The ACK in `bytes`, if they are one in its short form (what `engine::arriving` takes
    /// in without a packet; [`decode_message`] reads it into one).
    pub(crate) fn peek(bytes: &[u8]) -> Option<Ack> {
        let mut r = Reader(bytes);
        let [first, version, src_port, dst_port] = r.take::<4>()?;
        if first != ACK || version != VERSION || bytes.len() != ACK_LEN {
            return None;
        }
        let (src_dev, src_qpn, dst_dev) = (r.u32()?, r.u32()?, r.u32()?);
        let (dst_qpn, psn, msn) = (r.u32()?, r.u32()?, r.u32()?);
        Some(Ack { src: (src_dev, src_port, src_qpn), dst: (dst_dev, dst_port, dst_qpn), psn, msn })
    }

    /// Into `p` (a fresh `Packet::new`), as [`decode_head`] would decode the full form.
    fn decode(bytes: &[u8], p: &mut Packet) -> Option<()> {
        Ack::peek(bytes)?.into_packet(p);
        Some(())
    }

    /// The packet `responder::reply` builds for this ACK, into `p` (a fresh `Packet::new`).
    pub(crate) fn into_packet(self, p: &mut Packet) {
        (p.kind, p.syndrome) = (Kind::Ack, Syndrome::Ack);
        ((p.src_dev, p.src_port, p.src_qpn), (p.dst_dev, p.dst_port, p.dst_qpn)) =
            (self.src, self.dst);
        (p.psn, p.msn) = (self.psn, self.msn);
    }
}

/// `flags` bit of a request that carries an ACK between the same two QPs the other way (see
/// [`carry_ack`]), its PSN and MSN in the words a request of a reliable QP leaves zero (the
/// Q_Key's and the XRC SRQ's).
const CARRIES_ACK: u8 = 32;
/// Where those words and `flags` lie in a request's header.
const FLAGS_AT: usize = 4;
const QKEY_AT: usize = 9 + 10 * 4;

/// Lets the request whose header begins `head` carry `ack` (owed by the request's sender to
/// its receiver: a SEND or WRITE of an RC QP to the QP the ACK is for), as the reply of a
/// ping-pong does: its receiver then takes no ACK of its own in. Whether it does (if not,
/// nothing changed).
pub(crate) fn carry_ack(head: &mut [u8], ack: &Ack) -> bool {
    let Some(h) = head.get_mut(..FIXED_HEAD) else { return false };
    let word = |h: &[u8], at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    // A QPN names one QP (of one device) on its node: the two name the pair.
    let fits = h[..4] == [VERSION, kind_code(Kind::Send), 0, 0]
        || h[..4] == [VERSION, kind_code(Kind::Write), 0, 0];
    let fits = fits
        && h[FLAGS_AT] & !3 == 0
        && (h[7], h[8]) == (0, QpType::RC.0 as u8)
        && (word(h, 13), word(h, 21)) == (ack.src.2, ack.dst.2)
        && (word(h, QKEY_AT), word(h, QKEY_AT + 4)) == (0, 0);
    if fits {
        h[FLAGS_AT] |= CARRIES_ACK;
        h[QKEY_AT..QKEY_AT + 4].copy_from_slice(&ack.psn.to_le_bytes());
        h[QKEY_AT + 4..QKEY_AT + 8].copy_from_slice(&ack.msn.to_le_bytes());
    }
    fits
}

/// The ACK the request in `bytes` carries (see [`carry_ack`]): between the same two QPs,
/// whatever else the request holds.
pub(crate) fn carried_ack(bytes: &[u8]) -> Option<Ack> {
    let h = bytes.get(..FIXED_HEAD)?;
    if h[0] != VERSION || h[FLAGS_AT] & CARRIES_ACK == 0 {
        return None;
    }
    let word = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap());
    Some(Ack {
        src: (word(9), h[5], word(13)),
        dst: (word(17), h[6], word(21)),
        psn: word(QKEY_AT),
        msn: word(QKEY_AT + 4),
    })
}

/// A SEND or a WRITE (with or without immediate), a READ or an atomic request or response in
/// `bytes` that holds nothing the short way in (`engine::arriving`) leaves to the packet path:
/// no GRH, no rkey to invalidate, no NAK, its payload carried whole, neither pulled nor carried
/// out. Its header, and its payload; `None` for anything else (which [`decode_message`] then
/// reads).
#[inline]
pub(crate) fn peek_request(bytes: &[u8]) -> Option<(RequestHead, &[u8])> {
    let mut r = Reader(bytes.get(..FIXED_HEAD)?);
    let [version, kind, syn, syn_arg, flags, src_port, dst_port, has_grh, transport] =
        r.take::<9>()?;
    let flags_ok = match kind_of(kind)? {
        Kind::Send | Kind::Write => flags & !(3 | CARRIES_ACK) == 0,
        Kind::ReadRequest | Kind::ReadResponse => flags == 0,
        Kind::CompareSwap | Kind::FetchAdd | Kind::AtomicAck => flags == 0,
        _ => false,
    };
    if !flags_ok || version != VERSION || (syn, syn_arg, has_grh) != (0, 0, 0) {
        return None;
    }
    let (src_dev, src_qpn, dst_dev) = (r.u32()?, r.u32()?, r.u32()?);
    let (dst_qpn, psn, npkts, imm) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    let (rkey, len, msn, _qkey, _xrc_srqn) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    let (src_lid, va) = (r.u16()?, r.u64()?);
    // An atomic's operands, or its answer's word: read only for those.
    let mut words = || Some((r.u64()?, r.u64()?, r.u64()?));
    let payload = &bytes[FIXED_HEAD..];
    let (op, carried) = match kind_of(kind)? {
        Kind::Send => (Op::Send, len),
        Kind::Write => (Op::Write(va, rkey), len),
        Kind::ReadRequest => (Op::Read(va, rkey), 0),
        Kind::ReadResponse => (Op::ReadResponse(msn), len),
        Kind::AtomicAck => (Op::AtomicAck(msn, words()?.2), 0),
        k => {
            let (swap_add, compare, _) = words()?;
            let compare_swap = k == Kind::CompareSwap;
            (Op::Atomic(Atomic { compare_swap, va, rkey, swap_add, compare }), 0)
        }
    };
    let m = RequestHead {
        src: (src_dev, src_port, src_qpn),
        dst: (dst_dev, dst_port, dst_qpn),
        transport: QpType(u32::from(transport)),
        psn,
        npkts,
        len,
        imm: (flags & 2 != 0).then_some(imm),
        solicited: flags & 1 != 0,
        src_lid,
        op,
    };
    (payload.len() == carried as usize && npkts >= 1).then_some((m, payload))
}

/// A UD SEND as [`peek_datagram`] finds it in its record.
#[derive(Debug)]
pub(crate) struct Datagram<'a> {
    /// `(device, port, QPN)` of the sender and of the receiver.
    pub(crate) src: (u32, u8, u32),
    pub(crate) dst: (u32, u8, u32),
    pub(crate) qkey: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) solicited: bool,
    pub(crate) src_lid: u16,
    pub(crate) grh: Option<Grh>,
    pub(crate) payload: &'a [u8],
}

/// The UD SEND in `bytes` (a whole record's message) if it is exactly what a UD requester
/// sends (`engine::datagram::packet`, `requester::build`): one packet, its payload whole
/// after its header, nothing a SEND does not carry; `None` for anything else, which the
/// decoder then judges.
pub(crate) fn peek_datagram(bytes: &[u8]) -> Option<Datagram<'_>> {
    let mut r = Reader(bytes.get(..FIXED_HEAD)?);
    let [version, kind, syn, syn_arg, flags, src_port, dst_port, has_grh, transport] =
        r.take::<9>()?;
    let head_ok = version == VERSION
        && kind_of(kind)? == Kind::Send
        && (syn, syn_arg) == (0, 0)
        && flags & !3 == 0
        && has_grh <= 1
        && u32::from(transport) == QpType::UD.0;
    if !head_ok {
        return None;
    }
    let (src_dev, src_qpn, dst_dev) = (r.u32()?, r.u32()?, r.u32()?);
    let (dst_qpn, _psn, npkts, imm) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    let (rkey, len, msn, qkey, _xrc_srqn) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    let src_lid = r.u16()?;
    let words = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    if (npkts, rkey, msn, words) != (1, 0, 0, (0, 0, 0, 0)) {
        return None;
    }
    let mut rest = Reader(&bytes[FIXED_HEAD..]);
    let grh = match has_grh {
        1 => Some(Grh {
            sgid: Gid(rest.take()?),
            dgid: Gid(rest.take()?),
            traffic_class: rest.take::<1>()?[0],
            hop_limit: rest.take::<1>()?[0],
            flow_label: rest.u32()?,
        }),
        _ => None,
    };
    let payload = rest.0;
    (payload.len() == len as usize).then_some(Datagram {
        src: (src_dev, src_port, src_qpn),
        dst: (dst_dev, dst_port, dst_qpn),
        qkey,
        imm: (flags & 2 != 0).then_some(imm),
        solicited: flags & 1 != 0,
        src_lid,
        grh,
        payload,
    })
}

/// Why a message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The bytes are not a message (another version, truncated, out of range).
    Malformed,
    /// A payload to be read from a process other than `from`, the one that sent it.
    Pull,
}

/// The message in `bytes`, sent by the process `from` (as the kernel named it; `None` when
/// no process could be pinned down). A packet is decoded into `pkt` (a fresh
/// [`Packet::new`]: built where it will be used, not moved there), its payload left for the
/// caller to take from `bytes[range]` (see [`decode_head`]).
#[inline(always)]
pub(crate) fn decode_message(
    bytes: &[u8],
    from: Option<&Arc<PeerProcess>>,
    pkt: &mut Packet,
) -> Result<(Message, Option<Range<usize>>), Refused> {
    match bytes.first() {
        Some(&CONTROL) => decode_control(bytes).ok_or(Refused::Malformed),
        Some(&CM) => Ok((Message::Cm(bytes[1..].to_vec()), None)),
        Some(&ACK) => {
            Ack::decode(bytes, pkt).map(|()| (Message::Packet, None)).ok_or(Refused::Malformed)
        }
        _ => decode_head(bytes, from, pkt).map(|range| (Message::Packet, range)),
    }
}

fn decode_control(bytes: &[u8]) -> Option<(Message, Option<Range<usize>>)> {
    let mut r = Reader(&bytes[1..]);
    let [kind, port] = r.take::<2>()?;
    let (dev, value) = (r.u32()?, r.u32()?);
    let c = match kind {
        0 => Control::Event { dev, port, event: value },
        1 => Control::PortState { dev, port, up: value != 0 },
        2 => Control::QpClosed { qpn: value },
        _ => return None,
    };
    Some((Message::Control(c), None))
}

/// A message in byte form, not yet laid out: the header, then the payload still in the
/// sender's memory, so it can be gathered straight to where it goes.
pub(crate) struct Encoded<'a> {
    head: Head<'a>,
    payload: Option<&'a Payload>,
    /// Header and payload bytes, counted once (each fragment asks).
    len: usize,
}

/// The most header bytes a packet has (with a GRH and the forwarded fields).
const MAX_HEAD: usize = 146;

/// A message's header: a packet's, encoded where the message is written (so sending a packet
/// to another process neither allocates nor moves its bytes about), or bytes on the heap (a
/// pulled payload's source ranges after the packet's header, a control or CM message), or a
/// whole message laid out by the caller (an ACK's short form, a short way's record).
enum Head<'a> {
    Packet(&'a Packet),
    Heap(Vec<u8>),
    Bytes(&'a [u8]),
}

/// Writes fields of known sizes into a packet's header.
struct Cursor<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Cursor<'_> {
    #[inline(always)]
    fn put<const N: usize>(&mut self, b: [u8; N]) {
        self.buf[self.at..self.at + N].copy_from_slice(&b);
        self.at += N;
    }
}

impl Head<'_> {
    fn len(&self) -> usize {
        match self {
            Head::Packet(pkt) => head_len(pkt),
            Head::Heap(v) => v.len(),
            Head::Bytes(b) => b.len(),
        }
    }
}

impl<'a> Encoded<'a> {
    fn new(head: Head<'a>, payload: Option<&'a Payload>) -> Encoded<'a> {
        let carried = payload.map_or(0, Payload::carried);
        Encoded { len: head.len() + carried, head, payload }
    }

    pub(crate) fn packet(pkt: &'a Packet) -> Encoded<'a> {
        Encoded::new(Head::Packet(pkt), (pkt.kind != Kind::ReadRequest).then_some(&pkt.payload))
    }

    /// `pkt` with its payload left in the memory of this process, `pid`, for the receiver to
    /// read from there (see [`pullable`]).
    pub(crate) fn pulled(pkt: &'a Packet, pid: u32) -> Encoded<'a> {
        let ranges = pkt.payload.ranges();
        let mut head = vec![0; head_len(pkt)];
        head.reserve(8 + PULLED_RANGE * ranges.len());
        encode_head(pkt, true, &mut head);
        head.extend_from_slice(&pid.to_le_bytes());
        head.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
        for m in ranges {
            // The shared memory the range lies in, if any (0: none), for a receiver that
            // maps it to copy from there (see `crate::shared_mem`).
            let shared = m.region.shared_in(m.offset, m.len).map_or(0, |s| s.id());
            head.extend_from_slice(&(m.region.host_addr() + m.offset as u64).to_le_bytes());
            head.extend_from_slice(&(m.len as u64).to_le_bytes());
            head.extend_from_slice(&shared.to_le_bytes());
        }
        Encoded::new(Head::Heap(head), None)
    }

    /// A message the caller laid out whole.
    pub(crate) fn bytes(bytes: &'a [u8]) -> Encoded<'a> {
        Encoded::new(Head::Bytes(bytes), None)
    }

    pub(crate) fn control(c: Control) -> Encoded<'static> {
        Encoded::new(Head::Heap(encode_control(c)), None)
    }

    /// A connection manager message.
    pub(crate) fn cm(body: &[u8]) -> Encoded<'static> {
        let mut head = Vec::with_capacity(1 + body.len());
        head.push(CM);
        head.extend_from_slice(body);
        Encoded::new(Head::Heap(head), None)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the message's bytes `from..from + dst.len()` into `dst`. Fails only if the
    /// payload's source memory faults, which the requester's checks rule out.
    pub(crate) fn copy_to(&self, from: usize, dst: &mut [u8]) -> Result<(), MemFault> {
        if from == 0 && dst.len() == self.len {
            return self.copy_whole(dst);
        }
        let mut at = 0; // message offset of the current piece
        let mut out = 0; // bytes of `dst` written
        let mut buf;
        let head: &[u8] = match &self.head {
            Head::Heap(v) => v,
            Head::Bytes(b) => b,
            // The whole header lands in `dst`: encoded there.
            Head::Packet(pkt) if from == 0 && dst.len() >= head_len(pkt) => {
                let n = encode_head(pkt, false, dst);
                (at, out) = (n, n);
                &[]
            }
            Head::Packet(pkt) => {
                buf = [0u8; MAX_HEAD];
                let n = encode_head(pkt, false, &mut buf);
                &buf[..n]
            }
        };
        let head = (out == 0).then_some(Piece::Bytes(head));
        for piece in head.into_iter().chain(self.payload.into_iter().flat_map(|p| p.pieces())) {
            let (start, end) = (at, at + piece.len());
            at = end;
            let want = from + out;
            if end <= want {
                continue;
            }
            if out == dst.len() {
                break;
            }
            let skip = want - start;
            let n = (end - want).min(dst.len() - out);
            piece.read(skip, &mut dst[out..out + n])?;
            out += n;
        }
        debug_assert_eq!(out, dst.len());
        Ok(())
    }
}

impl Encoded<'_> {
    /// The whole message into `dst`, of its length (every message of one record): the header
    /// encoded in place, each piece after the one before, with none of the arithmetic of a
    /// fragment that starts and ends anywhere (a fifth of a small message's cost to send).
    #[inline(always)]
    fn copy_whole(&self, dst: &mut [u8]) -> Result<(), MemFault> {
        let mut at = match &self.head {
            Head::Packet(pkt) => encode_head(pkt, false, dst),
            Head::Heap(v) => copy_head(v, dst),
            Head::Bytes(b) => copy_head(b, dst),
        };
        for piece in self.payload.into_iter().flat_map(Payload::pieces) {
            let end = at + piece.len();
            piece.read(0, &mut dst[at..end])?;
            at = end;
        }
        debug_assert_eq!(at, dst.len());
        Ok(())
    }
}

/// Copies `head` to the front of `dst`; its length.
fn copy_head(head: &[u8], dst: &mut [u8]) -> usize {
    dst[..head.len()].copy_from_slice(head);
    head.len()
}

/// Appends `pkt` to `out` (what a ring record or datagram carries, in one piece).
#[cfg(test)]
pub(crate) fn encode(pkt: &Packet, out: &mut Vec<u8>) -> Result<(), MemFault> {
    let e = Encoded::packet(pkt);
    let at = out.len();
    out.resize(at + e.len(), 0);
    e.copy_to(0, &mut out[at..])
}

/// Whether the payload a peer sent is as long as the packet says: the engine sizes what it
/// writes by the header's length, so a packet from another process must not say otherwise.
pub(crate) fn payload_fits(pkt: &Packet) -> bool {
    match pkt.payload {
        Payload::None => !matches!(pkt.kind, Kind::Send | Kind::Write | Kind::Raw) || pkt.len == 0,
        Payload::Remote => pkt.kind == Kind::ReadRequest,
        Payload::Landed(ref landed) => {
            let all = |l: &crate::packet::Landed| {
                l.dst.iter().map(|m| m.len).sum::<usize>() == pkt.len as usize
            };
            matches!(pkt.kind, Kind::Write | Kind::Send) && landed.as_deref().is_none_or(all)
        }
        _ => {
            let carried = pkt.payload.pieces().try_fold(0usize, |t, p| t.checked_add(p.len()));
            carried == Some(pkt.len as usize)
        }
    }
}

/// At most this many source ranges in a pulled payload (a work request's SGEs).
const MAX_PULL_RANGES: u32 = 1024;

/// Whether the receiver may read `pkt`'s payload straight from this process's memory, if it
/// is allowed to and the sending QP is reliable: a SEND or WRITE gathered from registered
/// memory, which the application leaves alone until the ACK completes it; or a READ
/// response, read from the target memory before the READ completes at the requester, which
/// is all a READ promises (the target's application learns of the READ only afterwards, and
/// if the memory is gone by then the pull fails and the requester asks again).
pub(crate) fn pullable(pkt: &Packet) -> bool {
    matches!(pkt.kind, Kind::Send | Kind::Write | Kind::ReadResponse)
        && matches!(pkt.payload, Payload::One(_) | Payload::Gather(_))
        && pkt.payload.ranges().len() <= MAX_PULL_RANGES as usize
}

/// The header bytes of a SEND, WRITE, READ, atomic or their responses without GRH (see
/// [`encode_request_head`]).
pub(crate) const REQUEST_HEAD: usize = FIXED_HEAD;

/// Writes the header of the message `m` (no GRH, no rkey to invalidate, no XRC SRQ) at the
/// start of `out` (at least [`REQUEST_HEAD`] bytes), byte for byte as [`encode_head`] writes
/// that of the packet the packet path makes for it (`requester::build` for a request,
/// `responder::read_response` for a READ's response, `responder::atomic` for an atomic's):
/// the short way (`engine::leaving`, `engine::arriving`) writes its record without a packet.
/// (Tests hold the two to the same bytes.)
pub(crate) fn encode_request_head(m: &RequestHead, out: &mut [u8]) {
    let mut out = Cursor { buf: &mut out[..FIXED_HEAD], at: 0 };
    let (mut va, mut rkey, mut msn, mut words) = (0, 0, 0, [0u64; 3]);
    let kind = match m.op {
        Op::Send => Kind::Send,
        Op::Write(a, k) => {
            (va, rkey) = (a, k);
            Kind::Write
        }
        Op::Read(a, k) => {
            (va, rkey) = (a, k);
            Kind::ReadRequest
        }
        Op::ReadResponse(n) => {
            msn = n;
            Kind::ReadResponse
        }
        Op::Atomic(a) => {
            (va, rkey, words) = (a.va, a.rkey, [a.swap_add, a.compare, 0]);
            a.kind()
        }
        Op::AtomicAck(n, orig) => {
            (msn, words) = (n, [0, 0, orig]);
            Kind::AtomicAck
        }
    };
    let flags = u8::from(m.solicited) | u8::from(m.imm.is_some()) << 1;
    out.put([VERSION, kind_code(kind), 0, 0, flags, m.src.1, m.dst.1, 0]);
    out.put([m.transport.0 as u8]);
    let (src, dst, imm) = (m.src, m.dst, m.imm.unwrap_or(0));
    for v in [src.0, src.2, dst.0, dst.2, m.psn, m.npkts, imm, rkey, m.len, msn] {
        out.put(v.to_le_bytes());
    }
    out.put([0; 8]);
    out.put(m.src_lid.to_le_bytes());
    for v in [va, words[0], words[1], words[2]] {
        out.put(v.to_le_bytes());
    }
    debug_assert_eq!(out.at, FIXED_HEAD);
}

/// How many bytes [`encode_head`] writes for `pkt`.
fn head_len(pkt: &Packet) -> usize {
    let grh = if pkt.grh.is_some() { 16 + 16 + 2 + 4 } else { 0 };
    let feth = usize::from(pkt.kind == Kind::Flush);
    let forwarded = if pkt.forwarded.is_some() && pkt.kind == Kind::XrcDeliver { 17 } else { 0 };
    FIXED_HEAD + grh + feth + forwarded
}

/// The header fields every packet has: 9 bytes, 12 words, the LID, 4 double words.
const FIXED_HEAD: usize = 9 + 12 * 4 + 2 + 4 * 8;

/// Writes the header fields of `pkt` at the start of `out` (at least [`head_len`] bytes), as
/// [`decode`] reads them (`pulled`: source ranges follow instead of the payload); how many.
fn encode_head(pkt: &Packet, pulled: bool, out: &mut [u8]) -> usize {
    // The fixed fields go to a part of known length, so that no write checks its bounds.
    let (fixed, rest) = out.split_at_mut(FIXED_HEAD);
    let mut out = Cursor { buf: fixed, at: 0 };
    let kind = kind_code(pkt.kind);
    let (syn, syn_arg) = match pkt.syndrome {
        Syndrome::Ack => (0, 0),
        Syndrome::Rnr(t) => (1, t),
        Syndrome::Nak(NakCode::PsnSequenceError) => (2, 0),
        Syndrome::Nak(NakCode::InvalidRequest) => (2, 1),
        Syndrome::Nak(NakCode::RemoteAccessError) => (2, 2),
        Syndrome::Nak(NakCode::RemoteOperationalError) => (2, 3),
    };
    // ImmDt and IETH never travel together; one word carries whichever is present.
    let flags = u8::from(pkt.solicited)
        | u8::from(pkt.imm.is_some()) << 1
        | u8::from(pkt.inv.is_some()) << 2
        | u8::from(pulled) << 3
        | u8::from(pkt.carried_out) << 4;
    out.put([VERSION, kind, syn, syn_arg, flags, pkt.src_port, pkt.dst_port]);
    out.put([u8::from(pkt.grh.is_some())]);
    out.put([pkt.transport.0 as u8]);
    for v in [pkt.src_dev, pkt.src_qpn, pkt.dst_dev, pkt.dst_qpn, pkt.psn, pkt.npkts] {
        out.put(v.to_le_bytes());
    }
    for v in [pkt.imm.or(pkt.inv).unwrap_or(0), pkt.rkey, pkt.len, pkt.msn, pkt.qkey, pkt.xrc_srqn]
    {
        out.put(v.to_le_bytes());
    }
    out.put(pkt.src_lid.to_le_bytes());
    for v in [pkt.va, pkt.swap_add, pkt.compare, pkt.orig] {
        out.put(v.to_le_bytes());
    }
    debug_assert_eq!(out.at, FIXED_HEAD);
    let mut out = Cursor { buf: rest, at: 0 };
    if let Some(grh) = &pkt.grh {
        out.put(grh.sgid.0);
        out.put(grh.dgid.0);
        out.put([grh.traffic_class, grh.hop_limit]);
        out.put(grh.flow_label.to_le_bytes());
    }
    if pkt.kind == Kind::Flush {
        out.put([pkt.feth]);
    }
    if let Some(f) = pkt.forwarded.as_deref().filter(|_| pkt.kind == Kind::XrcDeliver) {
        out.put([kind_code(f.kind)]);
        out.put(f.file.0.to_le_bytes());
        out.put(f.file.1.to_le_bytes());
    }
    debug_assert_eq!(FIXED_HEAD + out.at, head_len(pkt));
    FIXED_HEAD + out.at
}

fn kind_code(kind: Kind) -> u8 {
    match kind {
        Kind::Send => 0,
        Kind::Write => 1,
        Kind::ReadRequest => 2,
        Kind::ReadResponse => 3,
        Kind::CompareSwap => 4,
        Kind::FetchAdd => 5,
        Kind::Ack => 6,
        Kind::AtomicAck => 7,
        Kind::AtomicWrite => 8,
        Kind::Raw => 9,
        Kind::XrcDeliver => 10,
        Kind::XrcResult => 11,
        Kind::Flush => 12,
    }
}

fn kind_of(code: u8) -> Option<Kind> {
    Some(match code {
        0 => Kind::Send,
        1 => Kind::Write,
        2 => Kind::ReadRequest,
        3 => Kind::ReadResponse,
        4 => Kind::CompareSwap,
        5 => Kind::FetchAdd,
        6 => Kind::Ack,
        7 => Kind::AtomicAck,
        8 => Kind::AtomicWrite,
        9 => Kind::Raw,
        10 => Kind::XrcDeliver,
        11 => Kind::XrcResult,
        12 => Kind::Flush,
        _ => return None,
    })
}

/// The kind, source QP and PSN of the packet whose message is `bytes`, from its header alone
/// (to find a request among those sent).
pub(crate) fn packet_ids(bytes: &[u8]) -> Option<(Kind, u32, u32)> {
    let mut r = Reader(bytes);
    let [version, kind, ..] = r.take::<9>()?;
    if version != VERSION {
        return None;
    }
    let (_src_dev, src_qpn, _dst_dev, _dst_qpn, psn) =
        (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    Some((kind_of(kind)?, src_qpn, psn))
}

/// Whether the packet laid out in `bytes` (see `encode_head`) left its payload in the sender's
/// memory, for the receiver to pull.
pub(crate) fn pulled(bytes: &[u8]) -> bool {
    matches!(bytes, [VERSION, _, _, _, flags, ..] if flags & 8 != 0)
}

/// Reads fixed-size fields off the front of a byte slice.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

/// The packet in `bytes`, or `None` if they are not one (another version, or truncated).
#[cfg(test)]
pub(crate) fn decode(bytes: &[u8]) -> Option<Packet> {
    let mut p = Packet::new(Kind::Ack);
    let range = decode_head(bytes, None, &mut p).ok()?;
    if let Some(r) = range {
        p.payload = Payload::Bytes(bytes[r].into());
    }
    Some(p)
}

/// The packet in `bytes` but for its payload, decoded into `p` (a fresh [`Packet::new`]), and
/// where in `bytes` the payload lies (a packet with none or, for a READ request,
/// [`Payload::Remote`], says `None`). A payload to be read from the sender's memory is read
/// only from `from`, the process that sent it: a message that names another process (its own
/// number can be anyone's) is refused.
#[inline(always)]
pub(crate) fn decode_head(
    bytes: &[u8],
    from: Option<&Arc<PeerProcess>>,
    p: &mut Packet,
) -> Result<Option<Range<usize>>, Refused> {
    let (range, pulled) = decode_fields(bytes, p).ok_or(Refused::Malformed)?;
    if let Some((pid, ranges)) = pulled {
        let from = from.filter(|f| f.pid() == pid).ok_or(Refused::Pull)?;
        let ranges = ranges.into_iter().map(|(addr, len, shared)| {
            let view = (shared != 0).then(|| from.view(shared)).flatten();
            PeerRange { from: from.clone(), addr, len, shared, view }
        });
        p.payload = Payload::Peer(ranges.collect());
    }
    Ok(range)
}

/// The source ranges of a pulled payload (address, length, shared memory), with the process
/// the message says they are in.
type Pulled = (u32, Vec<(u64, usize, u32)>);

/// Bytes per source range of a pulled payload: its address, length and shared memory.
const PULLED_RANGE: usize = 8 + 8 + 4;

#[inline(always)]
fn decode_fields(bytes: &[u8], p: &mut Packet) -> Option<(Option<Range<usize>>, Option<Pulled>)> {
    // The fixed fields are read from a part of known length: one bounds check for them all.
    let mut r = Reader(bytes.get(..FIXED_HEAD)?);
    let [version, kind, syn, syn_arg, flags, src_port, dst_port, has_grh, transport] =
        r.take::<9>()?;
    if version != VERSION {
        return None;
    }
    let kind = kind_of(kind)?;
    p.kind = kind;
    p.syndrome = match (syn, syn_arg) {
        (0, _) => Syndrome::Ack,
        (1, t) => Syndrome::Rnr(t),
        (2, 0) => Syndrome::Nak(NakCode::PsnSequenceError),
        (2, 1) => Syndrome::Nak(NakCode::InvalidRequest),
        (2, 2) => Syndrome::Nak(NakCode::RemoteAccessError),
        (2, 3) => Syndrome::Nak(NakCode::RemoteOperationalError),
        _ => return None,
    };
    p.solicited = flags & 1 != 0;
    p.carried_out = flags & 16 != 0;
    p.transport = QpType(u32::from(transport));
    (p.src_port, p.dst_port) = (src_port, dst_port);
    (p.src_dev, p.src_qpn, p.dst_dev) = (r.u32()?, r.u32()?, r.u32()?);
    (p.dst_qpn, p.psn, p.npkts) = (r.u32()?, r.u32()?, r.u32()?);
    let imm = r.u32()?;
    p.imm = (flags & 2 != 0).then_some(imm);
    p.inv = (flags & 4 != 0).then_some(imm);
    (p.rkey, p.len, p.msn, p.qkey) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    p.xrc_srqn = r.u32()?;
    if flags & CARRIES_ACK != 0 {
        // The ACK carried is its receiver's to take in (see `carried_ack`), not the request's.
        (p.qkey, p.xrc_srqn) = (0, 0);
    }
    p.src_lid = r.u16()?;
    (p.va, p.swap_add, p.compare, p.orig) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let mut r = Reader(&bytes[FIXED_HEAD..]);
    if has_grh != 0 {
        let (sgid, dgid) = (Gid(r.take()?), Gid(r.take()?));
        let [traffic_class, hop_limit] = r.take()?;
        let flow_label = r.u32()?;
        p.grh = Some(Box::new(Grh { sgid, dgid, traffic_class, flow_label, hop_limit }));
    }
    if kind == Kind::Flush {
        p.feth = r.take::<1>()?[0];
    }
    if kind == Kind::XrcDeliver {
        let (kind, file) = (kind_of(r.take::<1>()?[0])?, (r.u64()?, r.u64()?));
        p.forwarded = Some(Box::new(Forwarded { kind, file }));
    }
    if flags & 8 != 0 {
        let (pid, n) = (r.u32()?, r.u32()?);
        if n > MAX_PULL_RANGES {
            return None;
        }
        let ranges = (0..n).map(|_| {
            let (addr, len, shared) = (r.u64()?, r.u64()?, r.u32()?);
            Some((addr, usize::try_from(len).ok()?, shared))
        });
        return Some((None, Some((pid, ranges.collect::<Option<_>>()?))));
    }
    let at = bytes.len() - r.0.len();
    if kind == Kind::ReadRequest {
        p.payload = Payload::Remote;
    } else if at < bytes.len() {
        return Some((Some(at..bytes.len()), None));
    }
    Some((None, None))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_every_field_survives_a_round_trip() {
        let mut p = Packet::new(Kind::Send);
        p.transport = QpType::UD;
        (p.src_dev, p.src_qpn, p.src_lid, p.src_port) = (1, 0x10011, 7, 2);
        (p.dst_dev, p.dst_port, p.dst_qpn, p.psn, p.npkts) = (0, 1, 0x20012, 0xabcdef, 3);
        (p.solicited, p.imm, p.va, p.rkey, p.len) = (true, Some(0x1234), 0xdead_beef, 9, 5);
        (p.swap_add, p.compare, p.msn, p.orig, p.qkey) = (11, 12, 13, 14, 0x1111_1111);
        p.syndrome = Syndrome::Nak(NakCode::RemoteAccessError);
        p.grh = Some(Box::new(Grh {
            sgid: Gid([1; 16]),
            dgid: Gid([2; 16]),
            traffic_class: 0x28,
            flow_label: 0xabcde,
            hop_limit: 7,
        }));
        p.payload = Payload::Bytes(b"hello".as_slice().into());
        let mut bytes = Vec::new();
        encode(&p, &mut bytes).unwrap();
        let q = decode(&bytes).unwrap();
        assert_eq!(format!("{p:?}"), format!("{q:?}"));

        p.kind = Kind::XrcDeliver;
        p.forwarded = Some(Box::new(Forwarded { kind: Kind::FetchAdd, file: (3, 1 << 40) }));
        bytes.clear();
        encode(&p, &mut bytes).unwrap();
        let q = decode(&bytes).unwrap();
        assert_eq!(format!("{p:?}"), format!("{q:?}"));
        // The largest header there is (GRH and forwarded fields).
        assert_eq!(head_len(&p), MAX_HEAD);
    }

    /// The short form of an ACK decodes to the very packet its full form decodes to (the
    /// packet `responder::reply` builds); a short form cut, lengthened or of another version is
    /// refused.
    #[test]
    fn test_an_ack_in_short_form_is_the_ack_in_full() {
        let mut p = Packet::new(Kind::Ack);
        (p.src_dev, p.src_port, p.src_qpn) = (2, 1, 0x30007);
        (p.dst_dev, p.dst_port, p.dst_qpn, p.psn, p.msn) = (5, 2, 0x10009, 0xff_fffe, 41);
        let mut full = Vec::new();
        encode(&p, &mut full).unwrap();
        let ack = Ack { src: (2, 1, 0x30007), dst: (5, 2, 0x10009), psn: 0xff_fffe, msn: 41 };
        let short = ack.encode().to_vec();
        assert!(short.len() * 3 < full.len(), "{} against {}", short.len(), full.len());
        let decoded = |bytes: &[u8]| {
            let mut q = Packet::new(Kind::Send);
            match decode_message(bytes, None, &mut q) {
                Ok((Message::Packet, None)) => Ok(format!("{q:?}")),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e),
            }
        };
        assert_eq!(decoded(&full), Ok(format!("{p:?}")));
        assert_eq!(decoded(&short), Ok(format!("{p:?}")));
        let mut other = short.clone();
        other[1] = VERSION + 1;
        let mut longer = short.clone();
        longer.push(0);
        for bad in [&short[..short.len() - 1], &other, &longer, &short[..1]] {
            assert_eq!(decoded(bad), Err(Refused::Malformed));
            assert_eq!(Ack::peek(bad), None);
        }
        // Read in place (the short way in), it is the ACK that was written; the full form is
        // not read so.
        assert_eq!(Ack::peek(&short), Some(ack));
        assert_eq!(short, ack.encode());
        assert_eq!(Ack::peek(&full), None);
    }

    /// A SEND or WRITE (with immediate too) of an RC QP carries an ACK between the same two
    /// QPs: read back as it was written, the request read in place and decoded as before.
    /// Nothing else carries one (another transport, kind or pair of QPs, a header cut short, a
    /// request carrying one already), and a request that carries none says so.
    #[test]
    fn test_a_request_carries_an_ack_between_its_qps() {
        let (va, rkey) = (0x7654_3210_0000, 0x4321);
        let m = |transport, op, imm| RequestHead {
            src: (1, 2, 0x10011),
            dst: (3, 1, 0x20012),
            transport,
            psn: 0xab_cdef,
            npkts: 1,
            len: 5,
            imm,
            solicited: true,
            src_lid: 7,
            op,
        };
        let ack = Ack { src: (1, 2, 0x10011), dst: (3, 1, 0x20012), psn: 0x12_3456, msn: 77 };
        for (op, imm) in [(Op::Send, None), (Op::Write(va, rkey), Some(0xfeed))] {
            let m = m(QpType::RC, op, imm);
            let mut bytes = vec![0; REQUEST_HEAD];
            encode_request_head(&m, &mut bytes);
            bytes.extend_from_slice(b"hello");
            let decoded = decode(&bytes).map(|p| format!("{p:?}"));
            assert_eq!(carried_ack(&bytes), None);
            assert!(carry_ack(&mut bytes, &ack));
            assert_eq!(carried_ack(&bytes), Some(ack));
            assert_eq!(peek_request(&bytes), Some((m, &b"hello"[..])), "{op:?}");
            assert_eq!(decode(&bytes).map(|p| format!("{p:?}")), decoded, "{op:?}");
            assert!(!carry_ack(&mut bytes, &ack), "one ACK per request");
        }
        let other = |f: &dyn Fn(&mut Ack)| {
            let mut a = ack;
            f(&mut a);
            a
        };
        let not_carried = [
            (m(QpType::UC, Op::Send, None), ack),
            (m(QpType::RC, Op::Read(va, rkey), None), ack),
            (m(QpType::RC, Op::ReadResponse(3), None), ack),
            (m(QpType::RC, Op::Send, None), other(&|a| a.src.2 += 1)),
            (m(QpType::RC, Op::Send, None), other(&|a| a.dst.2 += 1)),
        ];
        for (m, ack) in not_carried {
            let mut bytes = vec![0; REQUEST_HEAD];
            encode_request_head(&m, &mut bytes);
            let was = bytes.clone();
            assert!(!carry_ack(&mut bytes, &ack), "{m:?} {ack:?}");
            assert_eq!(bytes, was);
        }
        assert!(!carry_ack(&mut [VERSION; 8], &ack), "cut short");
        assert_eq!(carried_ack(&ack.encode()), None, "an ACK carries none");
    }

    /// A SEND or WRITE read in place ([`peek_request`]) says what its decoded packet says; a
    /// message it must leave to the packet path (another kind, a GRH, an rkey to invalidate, a
    /// payload pulled or cut short) is not read so.
    #[test]
    fn test_a_request_read_in_place_reads_as_it_decodes() {
        let mut p = Packet::new(Kind::Send);
        p.transport = QpType::UC;
        (p.src_dev, p.src_port, p.src_qpn, p.src_lid) = (1, 2, 0x10011, 7);
        (p.dst_dev, p.dst_port, p.dst_qpn, p.psn, p.npkts) = (3, 1, 0x20012, 0xab_cdef, 3);
        (p.solicited, p.imm, p.len) = (true, Some(0x1234), 5);
        p.payload = Payload::Bytes(b"hello".as_slice().into());
        let mut bytes = Vec::new();
        encode(&p, &mut bytes).unwrap();
        let (m, payload) = peek_request(&bytes).unwrap();
        let q = decode(&bytes).unwrap();
        assert_eq!(payload, b"hello");
        assert_eq!(
            (m.src, m.dst, m.transport, m.psn, m.npkts, m.len),
            (
                (q.src_dev, q.src_port, q.src_qpn),
                (q.dst_dev, q.dst_port, q.dst_qpn),
                q.transport,
                q.psn,
                q.npkts,
                q.len
            )
        );
        assert_eq!((m.imm, m.solicited, m.src_lid), (q.imm, q.solicited, q.src_lid));
        assert_eq!(m.op, Op::Send);
        (p.imm, p.solicited) = (None, false);
        bytes.clear();
        encode(&p, &mut bytes).unwrap();
        let (m, _) = peek_request(&bytes).unwrap();
        assert_eq!((m.imm, m.solicited), (None, false));
        let mut write = p.clone();
        (write.kind, write.va, write.rkey) = (Kind::Write, 0xdead_beef_0000, 0x1234);
        let mut w = Vec::new();
        encode(&write, &mut w).unwrap();
        let (m, payload) = peek_request(&w).unwrap();
        assert_eq!((m.op, payload), (Op::Write(0xdead_beef_0000, 0x1234), &b"hello"[..]));
        (write.imm, write.solicited) = (Some(0x5678), true);
        w.clear();
        encode(&write, &mut w).unwrap();
        let (m, _) = peek_request(&w).unwrap();
        let q = decode(&w).unwrap();
        assert_eq!((m.imm, m.solicited, m.op), (q.imm, q.solicited, Op::Write(q.va, q.rkey)));
        // A READ request carries nothing; its response carries the bytes read and the MSN.
        let mut read = p.clone();
        (read.kind, read.va, read.rkey, read.len, read.npkts) = (Kind::ReadRequest, 8, 9, 700, 1);
        (read.imm, read.solicited, read.payload) = (None, false, Payload::Remote);
        let mut r = Vec::new();
        encode(&read, &mut r).unwrap();
        let (m, payload) = peek_request(&r).unwrap();
        assert_eq!((m.op, m.len, payload), (Op::Read(8, 9), 700, &b""[..]));
        let mut resp = read.clone();
        (resp.kind, resp.msn, resp.len) = (Kind::ReadResponse, 0x77, 5);
        resp.payload = Payload::Bytes(b"hello".as_slice().into());
        r.clear();
        encode(&resp, &mut r).unwrap();
        let (m, payload) = peek_request(&r).unwrap();
        assert_eq!(
            (m.op, m.len, m.psn, payload),
            (Op::ReadResponse(0x77), 5, p.psn, &b"hello"[..])
        );

        assert!(peek_request(&bytes[..bytes.len() - 1]).is_none());
        let (mut inv, mut grh, mut nak) = (p.clone(), p.clone(), p.clone());
        write.kind = Kind::FetchAdd;
        (nak.kind, nak.syndrome, nak.imm) = (Kind::ReadResponse, Syndrome::Rnr(3), None);
        inv.inv = Some(9);
        let gid = |b| Gid([b; 16]);
        let g = Grh { sgid: gid(1), dgid: gid(2), traffic_class: 0, flow_label: 0, hop_limit: 1 };
        grh.grh = Some(Box::new(g));
        for o in [&write, &inv, &grh, &nak] {
            bytes.clear();
            encode(o, &mut bytes).unwrap();
            assert!(peek_request(&bytes).is_none(), "{o:?}");
        }
        let e = Encoded::pulled(&p, std::process::id());
        let mut pulled = vec![0; e.len()];
        e.copy_to(0, &mut pulled).unwrap();
        assert!(peek_request(&pulled).is_none());
    }

    /// The short way writes a SEND's, WRITE's, READ's or atomic's header as the packet path
    /// encodes `requester::build`'s packet, and a READ's or atomic's response's as it encodes
    /// `responder::read_response`'s or `responder::atomic`'s (`reply`'s fields).
    #[test]
    fn test_a_request_head_written_without_a_packet_is_the_packets() {
        let (va, rkey) = (0x7654_3210_0000, 0x4321);
        let cas = Atomic { compare_swap: true, va, rkey, swap_add: 0x55, compare: 0x66 };
        let fadd = Atomic { compare_swap: false, swap_add: 0x77, ..cas };
        for (transport, imm, solicited, op) in [
            (QpType::RC, None, false, Op::Send),
            (QpType::RC, Some(0xfeed_f00d), true, Op::Send),
            (QpType::UC, None, true, Op::Send),
            (QpType::RC, Some(0xfeed_f00d), true, Op::Write(va, rkey)),
            (QpType::UC, Some(1), false, Op::Write(va, rkey)),
            (QpType::RC, None, false, Op::Read(va, rkey)),
            (QpType::RC, None, false, Op::ReadResponse(0xab_0001)),
            (QpType::RC, None, false, Op::Atomic(cas)),
            (QpType::RC, None, false, Op::Atomic(fadd)),
            (QpType::RC, None, false, Op::AtomicAck(0xab_0002, 0x1122_3344_5566_7788)),
        ] {
            let mut p = Packet::new(match op {
                Op::Send => Kind::Send,
                Op::Write(..) => Kind::Write,
                Op::Read(..) => Kind::ReadRequest,
                Op::ReadResponse(_) => Kind::ReadResponse,
                Op::Atomic(a) if a.compare_swap => Kind::CompareSwap,
                Op::Atomic(_) => Kind::FetchAdd,
                Op::AtomicAck(..) => Kind::AtomicAck,
            });
            (p.len, p.payload) = (5, Payload::Bytes(b"hello".as_slice().into()));
            match op {
                Op::Write(va, rkey) | Op::Read(va, rkey) => (p.va, p.rkey) = (va, rkey),
                Op::Atomic(a) => {
                    (p.va, p.rkey, p.swap_add, p.compare) = (a.va, a.rkey, a.swap_add, a.compare);
                    (p.len, p.payload) = (8, Payload::None);
                }
                Op::ReadResponse(msn) => p.msn = msn,
                Op::AtomicAck(msn, orig) => {
                    (p.msn, p.orig) = (msn, orig);
                    (p.len, p.payload) = (0, Payload::None);
                }
                Op::Send => {}
            }
            if !matches!(op, Op::ReadResponse(_) | Op::AtomicAck(..)) {
                (p.transport, p.src_lid) = (transport, 7);
            }
            (p.src_dev, p.src_port, p.src_qpn) = (1, 2, 0x10011);
            (p.dst_dev, p.dst_port, p.dst_qpn, p.psn) = (3, 1, 0x20012, 0xab_cdef);
            (p.npkts, p.solicited, p.imm) = (2, solicited, imm);
            let mut bytes = Vec::new();
            encode(&p, &mut bytes).unwrap();
            let m = RequestHead {
                src: (p.src_dev, p.src_port, p.src_qpn),
                dst: (p.dst_dev, p.dst_port, p.dst_qpn),
                transport: p.transport,
                psn: p.psn,
                npkts: p.npkts,
                len: p.len,
                imm,
                solicited,
                src_lid: p.src_lid,
                op,
            };
            let mut head = [0xa5; REQUEST_HEAD];
            encode_request_head(&m, &mut head);
            assert_eq!(head[..], bytes[..REQUEST_HEAD], "{transport:?} {imm:?} {op:?}");
            let carried: &[u8] = match p.kind {
                Kind::Send | Kind::Write | Kind::ReadResponse => b"hello",
                _ => b"",
            };
            assert_eq!(&bytes[REQUEST_HEAD..], carried);
            // And read back in place, as it was written.
            let (back, payload) = peek_request(&bytes).unwrap();
            assert_eq!((back, payload), (m, carried), "{op:?}");
        }
    }

    /// A message is written in fragments from any offset: a header that does not land whole
    /// at the start of the destination is encoded aside, and its part copied.
    #[test]
    fn test_a_message_copied_in_pieces_is_the_message_copied_whole() {
        let mut p = Packet::new(Kind::Write);
        (p.dst_qpn, p.psn, p.va, p.rkey, p.len) = (0x10002, 77, 0x1000, 5, 40);
        p.payload = Payload::Bytes((0..40u8).collect::<Vec<_>>().into());
        let e = Encoded::packet(&p);
        let mut whole = vec![0; e.len()];
        e.copy_to(0, &mut whole).unwrap();
        assert_eq!(whole.len(), head_len(&p) + 40);
        assert_eq!(decode(&whole).map(|q| format!("{q:?}")), Some(format!("{p:?}")));
        let mut flush = p.clone();
        (flush.kind, flush.feth) = (Kind::Flush, 0x12);
        let mut buf = [0; MAX_HEAD];
        assert_eq!(encode_head(&flush, false, &mut buf), head_len(&flush));
        for step in [1, 7, 64, head_len(&p) - 1, head_len(&p) + 1] {
            let mut pieces = vec![0; e.len()];
            for (i, chunk) in pieces.chunks_mut(step).enumerate() {
                e.copy_to(i * step, chunk).unwrap();
            }
            assert_eq!(pieces, whole, "in pieces of {step}");
        }
    }

    #[test]
    fn test_a_read_request_leaves_its_destination_behind() {
        let mut p = Packet::new(Kind::ReadRequest);
        p.syndrome = Syndrome::Rnr(14);
        p.payload = Payload::Bytes(b"not sent".as_slice().into());
        let mut bytes = Vec::new();
        encode(&p, &mut bytes).unwrap();
        let q = decode(&bytes).unwrap();
        assert!(matches!(q.payload, Payload::Remote));
        assert_eq!((q.syndrome, q.imm, q.grh.is_none()), (Syndrome::Rnr(14), None, true));
    }

    #[test]
    fn test_control_messages_round_trip() {
        for c in [
            Control::Event { dev: 1, port: 2, event: 10 },
            Control::PortState { dev: 0, port: 1, up: false },
            Control::QpClosed { qpn: 0x2_0011 },
        ] {
            match decode_message(&encode_control(c), None, &mut Packet::new(Kind::Ack)) {
                Ok((Message::Control(d), None)) => assert_eq!(c, d),
                other => panic!("{other:?}"),
            }
        }
        let mut bytes = Vec::new();
        encode(&Packet::new(Kind::Ack), &mut bytes).unwrap();
        let mut p = Packet::new(Kind::Send);
        assert!(matches!(decode_message(&bytes, None, &mut p), Ok((Message::Packet, None))));
        assert_eq!(p.kind, Kind::Ack);
    }

    #[test]
    fn test_garbage_is_not_a_packet() {
        assert!(decode(&[]).is_none());
        assert!(decode(&[VERSION + 1; 100]).is_none());
        let mut bytes = Vec::new();
        encode(&Packet::new(Kind::Ack), &mut bytes).unwrap();
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
    }
}

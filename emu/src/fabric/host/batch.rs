//! One look's take: what arrived, reassembled from fragments or records where it came in
//! pieces, decoded and handed to the engine, its deliveries made once the look ends.

use super::*;

/// What `receive` took in: a datagram from the socket, or a record of a ring (which can lend
/// its payload in place), with who sent it.
pub(super) enum Arrived<'a> {
    Datagram(&'a [u8], Source),
    Record(Read<'a>, Source),
}

impl Arrived<'_> {
    /// A record of the ring that the node in `slot` writes.
    pub(super) fn record(slot: u8, rec: Read<'_>) -> Arrived<'_> {
        let pid = rec.ring().sender().map_or(0, |p| p.pid());
        Arrived::Record(rec, Source { slot, pid })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Arrived::Datagram(d, _) => d,
            Arrived::Record(r, _) => r.bytes(),
        }
    }

    pub(super) fn source(&self) -> Source {
        match self {
            Arrived::Datagram(_, s) | Arrived::Record(_, s) => *s,
        }
    }

    /// The process whose memory a payload of this message may be read from: a ring's sender.
    pub(super) fn process(&self) -> Option<&Arc<PeerProcess>> {
        match self {
            Arrived::Datagram(..) => None,
            Arrived::Record(r, _) => r.ring().sender(),
        }
    }
}

/// The packets one `receive` took in, by how they are delivered.
pub(super) struct Batch<'a, 'r> {
    /// The QPs whose inboxes it filled, to service. (This list and the next two are
    /// [`Rx`]'s, borrowed: made and dropped with each batch, they cost ~25 instructions a
    /// receive.)
    pub(super) ready: &'r mut engine::QpList,
    /// Datagrams to a multicast group, for the members here, and Ethernet frames, for the
    /// raw packet QPs steering here picks.
    pub(super) multicast: &'r mut Vec<Packet>,
    /// SENDs for XRC SRQs here, from target QPs in other processes.
    pub(super) xrc: &'r mut Vec<Packet>,
    /// Where what cannot be used is counted.
    pub(super) drops: Option<&'a Drops>,
    /// Anything was taken in.
    pub(super) took: bool,
    /// The driver of the QPs serviced as their packets were taken in, if any was.
    pub(super) drv: Option<Driver<'a>>,
    /// The ACK owed for the last SENDs or WRITEs taken in (paid before anything else is taken
    /// in, and at the end).
    pub(super) owed: Option<OwedAck<'a>>,
    /// The QP the last message was for (see [`Batch::qp`]): [`Rx::last_qp`], kept from one
    /// receive to the next. (This field and the next two are `Rx`'s, borrowed: moved out and
    /// back at each receive, they cost ~55 instructions.)
    pub(super) last_qp: &'r mut Option<(u32, std::sync::Weak<crate::qp::QpShared>)>,
    /// The node's reader only: the other QPs it delivered to since it last gave their biases
    /// back (see `give_back_biases`), at most [`PASSED`]: [`Rx::passed`].
    pub(super) passed: &'r mut Vec<std::sync::Weak<crate::qp::QpShared>>,
    /// The records of packets waiting for the batch's delivery that nothing else keeps: not
    /// freed until those are delivered, so that their writer finds them unsettled
    /// (`Ring::all_settled`, `Ring::claim_oldest`) and carries nothing of the same QP out
    /// ahead of them (a UC WRITE landing before the SEND posted ahead of it completed). Its
    /// room is [`Rx::kept`]'s, empty between receives.
    pub(super) kept: &'r mut Vec<Record>,
}

/// How many QPs besides the last one the reader gives the biases back of, per round.
const PASSED: usize = 16;

impl<'a> Batch<'a, '_> {
    pub(super) fn dropped(&self, why: Refused) {
        if let Some(d) = self.drops {
            Drops::count(match why {
                Refused::Malformed => &d.malformed,
                Refused::Pull => &d.pulls,
            });
        }
    }

    /// Our QP `qpn`, while it lives: the one the last message was for, without a look through
    /// the fabric's table (a read lock, a hash, a weak reference upgraded: 70 instructions,
    /// twice per message and its ACK) when it is that one again.
    #[inline]
    pub(super) fn qp(
        &mut self,
        fabric: &FabricInner,
        qpn: u32,
    ) -> Option<Arc<crate::qp::QpShared>> {
        if let Some((last, qp)) = &self.last_qp
            && *last == qpn
            && let Some(qp) = qp.upgrade()
            // Destroyed (it leaves the table just after): as the table would soon say.
            && qp.life.is_alive()
        {
            return Some(qp);
        }
        let qp = fabric.lookup_qp_any(qpn)?;
        if let Some((_, left)) = self.last_qp.replace((qpn, Arc::downgrade(&qp)))
            && self.passed.len() < PASSED
            && is_reader()
            && !self.passed.iter().any(|p| p.ptr_eq(&left))
        {
            self.passed.push(left);
        }
        Some(qp)
    }

    /// Takes one datagram or ring record in.
    pub(super) fn take<'r>(
        &mut self,
        fabric: &'a FabricInner,
        partial: &mut Partials,
        a: Arrived<'r>,
    ) {
        self.took = true;
        let d = a.bytes();
        let Some(h) = FrameHead::parse(d) else { return self.dropped(Refused::Malformed) };
        let to = self.qp(fabric, h.dst_qpn);
        if let Some(qp) = &to {
            // Counted, not timed (a clock read per message was 1% of a cross-process round):
            // one thread receives at a time, so a plain increment counts each.
            qp.heard.store(qp.heard.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        }
        // An ACK, or a small SEND, WRITE, READ or atomic request or response, that came whole
        // in its record is taken in from there if it can be (a WRITE's or READ's record is
        // begun as its ticket would be: see `decode`).
        if let (Arrived::Record(rec, _), Some(qp)) = (&a, &to)
            && h.whole()
        {
            let bytes = &rec.bytes()[HEADER..];
            let ours = |(dev, port, qpn): (u32, u8, u32)| {
                (dev, qpn) == (qp.device_index(), qp.qpn) && fabric.port_up(dev, port)
            };
            if let Some(ack) = wire::carried_ack(bytes) {
                // Taken in before the request that carries it, as if it came first.
                OwedAck::pay(&mut self.owed);
                if !(ours(ack.dst) && engine::arriving::ack(qp, fabric, &ack, &mut self.drv)) {
                    let mut pkt = Packet::new(Kind::Ack);
                    ack.into_packet(&mut pkt);
                    self.hand_over(fabric, pkt, Some(qp.clone()));
                }
            }
            let took = if let Some(ack) = wire::Ack::peek(bytes) {
                OwedAck::pay(&mut self.owed);
                ours(ack.dst) && engine::arriving::ack(qp, fabric, &ack, &mut self.drv)
            } else if let Some(d) = wire::peek_datagram(bytes) {
                OwedAck::pay(&mut self.owed);
                ours(d.dst) && engine::datagram::arrive(qp, fabric, &d)
            } else if let Some((m, payload)) = wire::peek_request(bytes) {
                use crate::wire::Op;
                use engine::arriving;
                // A SEND or WRITE taken in leaves its ACK owed; anything else comes after
                // what is owed.
                if !matches!(m.op, Op::Send | Op::Write(..)) {
                    OwedAck::pay(&mut self.owed);
                }
                let owed = &mut self.owed;
                ours(m.dst)
                    && match m.op {
                        Op::Send => arriving::send(qp, fabric, &m, payload, owed),
                        Op::Write(..) => {
                            arriving::write(qp, fabric, &m, payload, || rec.begin(), owed)
                        }
                        Op::Read(..) => arriving::read(qp, fabric, &m, || rec.begin()),
                        Op::Atomic(_) => arriving::atomic(qp, fabric, &m),
                        Op::ReadResponse(_) | Op::AtomicAck(..) => {
                            arriving::read_response(qp, fabric, &m, payload, &mut self.drv)
                        }
                    }
            } else {
                false
            };
            if took {
                return;
            }
        }
        OwedAck::pay(&mut self.owed);
        // The packet is built here and moved once, into its QP's inbox.
        let mut pkt = Packet::new(Kind::Ack);
        // The record the packet came whole from (or ended in) that neither it nor its payload
        // keeps: freed once the packet is delivered (see `Batch::kept`).
        let mut rest = None;
        let got = match a {
            Arrived::Record(rec, src) if !h.whole() => {
                match land(fabric, partial, src, h, &rec, &to) {
                    Some(got) => {
                        rest = Some(rec);
                        got.map(|p| p.map(|p| pkt = p).is_some())
                    }
                    // A message its ring can hold whole stays there until placed.
                    None if h.total <= rec.ring().max_held_message() => {
                        match hold(partial, src, h, rec) {
                            Ok(Some(recs)) => decode_held(recs).map(|p| pkt = p).map(|()| true),
                            other => other.map(|_| false),
                        }
                    }
                    None => {
                        let a = Arrived::Record(rec, src);
                        self.decode(fabric, partial, a, &to, &mut pkt, &mut rest)
                    }
                }
            }
            a => self.decode(fabric, partial, a, &to, &mut pkt, &mut rest),
        };
        match got {
            Ok(true) if wire::payload_fits(&pkt) => {}
            Ok(true) => return self.dropped(Refused::Malformed),
            Ok(false) => return,
            Err(why) => return self.dropped(why),
        }
        if self.hand_over(fabric, pkt, to)
            && let Some(rec) = rest
        {
            self.kept.push(rec.keep());
        }
    }

    /// Hands the packet `pkt`, taken in, to its QP (`to`, if the frame named it) or to those
    /// it is for. Whether it waits for the batch's delivery (`deliver`).
    fn hand_over(
        &mut self,
        fabric: &'a FabricInner,
        pkt: Packet,
        to: Option<Arc<crate::qp::QpShared>>,
    ) -> bool {
        if pkt.dst_qpn == engine::requester::MULTICAST_QPN {
            self.multicast.push(pkt);
            return true;
        }
        if pkt.kind == Kind::XrcDeliver {
            self.xrc.push(pkt);
            return true;
        }
        if !fabric.port_up(pkt.dst_dev, pkt.dst_port) {
            return false;
        }
        // The QP looked up by the frame's destination, if the packet names it on its device.
        let named =
            |q: &Arc<crate::qp::QpShared>| q.qpn == pkt.dst_qpn && q.device_index() == pkt.dst_dev;
        let Some(qp) = to.filter(named) else { return false };
        // A QP nobody is servicing takes its packet at once: one that waits for nothing
        // before it is handled without going through the inbox; the others go behind theirs.
        if let Some(mut g) = qp.inner.try_lock() {
            let drv = Self::driver(&mut self.drv, fabric);
            if qp.inbox.is_empty() {
                drv.service_arrival(&qp, &mut g, pkt);
            } else {
                qp.inbox.push(pkt);
                drv.service(&qp, &mut g);
            }
            return false;
        }
        qp.inbox.push(pkt);
        if !self.ready.iter().any(|q| Arc::ptr_eq(q, &qp)) {
            self.ready.push(qp);
        }
        true
    }

    /// Whether a datagram or record completes a packet, which is then decoded into `pkt` (a
    /// fresh `Packet::new`: built where it is used, not moved there); a control message is
    /// carried out here, for our QP `to` if it names one.
    #[inline(always)]
    fn decode<'r>(
        &mut self,
        fabric: &'a FabricInner,
        partial: &mut Partials,
        a: Arrived<'r>,
        to: &Option<Arc<crate::qp::QpShared>>,
        pkt: &mut Packet,
        rest: &mut Option<Read<'r>>,
    ) -> Result<bool, Refused> {
        let (lend, in_place) = {
            let Some(msg) = reassemble(partial, a.source(), a.bytes())? else { return Ok(false) };
            let range = match wire::decode_message(&msg, a.process(), pkt)? {
                (Message::Packet, range) => range,
                (Message::Control(c), _) => {
                    apply(fabric, c, to.as_deref());
                    return Ok(false);
                }
                (Message::Cm(body), _) => {
                    // What came before it is done first: a DREQ's `Disconnected` must find the
                    // completions of what its sender acknowledged before it in their CQs.
                    self.deliver(fabric);
                    fabric.cm.arrived(fabric, a.source().slot, &body);
                    return Ok(false);
                }
            };
            // A large payload of a one-record message stays in the ring until placed.
            let in_place = matches!((&a, &msg), (Arrived::Record(..), Cow::Borrowed(_)));
            let lend = match range {
                Some(r) if in_place && r.len() >= LEND_MIN => {
                    Some(HEADER + r.start..HEADER + r.end)
                }
                Some(r) => {
                    pkt.payload = Payload::Bytes(msg[r].into());
                    None
                }
                None => None,
            };
            (lend, in_place)
        };
        if let Arrived::Record(rec, _) = a {
            // A WRITE or READ of an RC QP, or a WRITE of a UC one, that came whole in one record
            // keeps it until its responder begins it: its sender may carry it out itself
            // meanwhile (see `exports`, `engine::absent_peer`), and then it is only accounted
            // for.
            let claimable = match pkt.transport {
                crate::QpType::RC => matches!(pkt.kind, Kind::Write | Kind::ReadRequest),
                crate::QpType::UC => pkt.kind == Kind::Write,
                _ => false,
            } && in_place;
            if claimable {
                let (ticket, lent) = rec.ticket(lend);
                if let Some(l) = lent {
                    pkt.payload = Payload::Bytes(Bytes::Lent(l));
                }
                pkt.ticket = Some(ticket);
            } else if let Some(range) = lend {
                pkt.payload = Payload::Bytes(Bytes::Lent(rec.lend(range)));
            } else {
                *rest = Some(rec);
            }
        }
        Ok(true)
    }

    /// The batch's one driver (its `drv`), made on first use.
    fn driver<'b>(drv: &'b mut Option<Driver<'a>>, fabric: &'a FabricInner) -> &'b mut Driver<'a> {
        drv.get_or_insert_with(|| Driver::new(fabric))
    }

    /// Lets go of `batch`, delivered: dropped only if it owns memory or a reference, the
    /// commonest owning none (~50 instructions a receive).
    pub(super) fn end(batch: std::mem::ManuallyDrop<Batch<'_, '_>>) {
        debug_assert!(!batch.holds_any(), "a batch ended undelivered");
        let bare = batch.drv.is_none() && batch.owed.is_none();
        if !bare {
            drop(std::mem::ManuallyDrop::into_inner(batch));
        }
    }

    /// Whether it took in anything to deliver.
    pub(super) fn holds_any(&self) -> bool {
        !self.ready.is_empty()
            || !self.multicast.is_empty()
            || !self.xrc.is_empty()
            || self.drv.is_some()
    }

    /// Services what it took in (see `holds_any`). Out of line, once per batch that took
    /// something, so that `ci.sh bench` counts it apart from the empty looks around it.
    #[inline(never)]
    pub(super) fn deliver(&mut self, fabric: &'a FabricInner) {
        let drv = Self::driver(&mut self.drv, fabric);
        for qp in self.ready.drain(..) {
            let mut g = qp.inner.lock();
            drv.service(&qp, &mut g);
        }
        for pkt in self.multicast.drain(..) {
            if pkt.kind == Kind::Raw {
                engine::raw::arrived(fabric, &pkt, drv);
            } else {
                engine::fan_out(fabric, &pkt, drv);
            }
        }
        for pkt in self.xrc.drain(..) {
            engine::xrc::deliver(fabric, pkt, drv);
        }
        if let Some(drv) = self.drv.take() {
            drv.finish();
        }
        if !self.kept.is_empty() {
            self.kept.clear();
        }
    }
}

/// The messages being reassembled, by source.
/// Hashed with Fx: looked up for every fragment; a peer's choice of its slot and pid (its own
/// at most) cannot make many collide.
pub(super) type Partials = FxHashMap<Source, Partial>;

/// A message arriving in fragments from one source (they arrive in order).
#[derive(Debug)]
pub(super) enum Partial {
    /// Copied together: from datagrams, or too large for its ring to hold whole.
    Copied(Vec<u8>),
    /// Kept where it arrives: the records of its fragments so far, and their bytes.
    Held(Vec<Record>, usize),
    /// A WRITE or SEND placed as it arrives, and its bytes so far.
    Landing(Box<Landing>, usize),
}

impl Partial {
    /// The message's bytes so far.
    pub(super) fn len(&self) -> usize {
        match self {
            Partial::Copied(v) => v.len(),
            Partial::Held(_, got) | Partial::Landing(_, got) => *got,
        }
    }
}

/// The header of a fragment.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameHead {
    pub(super) flags: u8,
    pub(super) total: usize,
    pub(super) offset: usize,
    pub(super) dst_qpn: u32,
}

/// The largest message a peer may announce: the largest a work request can carry (2 GiB) and
/// its headers. Memory for it is taken only as its fragments arrive.
const MAX_MESSAGE: usize = (1 << 31) + 64 * 1024;

impl FrameHead {
    /// The header of the frame `d`, if it is one (the magic, and a total and offset that fit).
    pub(super) fn parse(d: &[u8]) -> Option<FrameHead> {
        let head = d.first_chunk::<HEADER>()?;
        let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
        let (flags, total, offset) = (head[5], word(8) as usize, word(12) as usize);
        let fits = total <= MAX_MESSAGE && offset <= total && d.len() - HEADER <= total - offset;
        (word(0) == MAGIC && fits).then_some(FrameHead { flags, total, offset, dst_qpn: word(16) })
    }

    pub(super) fn whole(&self) -> bool {
        self.flags & (FIRST | LAST) == FIRST | LAST
    }
}

/// Adds one datagram to its source's message; the whole message once its last fragment is in.
/// A fragment that does not continue the message in progress is dropped (its source died
/// mid-message, or the slot changed hands).
pub(super) fn reassemble<'a>(
    partial: &mut Partials,
    src: Source,
    d: &'a [u8],
) -> Result<Option<Cow<'a, [u8]>>, Refused> {
    let h = FrameHead::parse(d).ok_or(Refused::Malformed)?;
    let body = &d[HEADER..];
    if h.flags & FIRST != 0 {
        if h.flags & LAST != 0 {
            if !partial.is_empty() {
                partial.remove(&src);
            }
            return match body.len() == h.total {
                true => Ok(Some(Cow::Borrowed(body))),
                false => Err(Refused::Malformed),
            };
        }
        // Room for what the announced length needs, but only as its bytes arrive.
        let mut v = Vec::with_capacity(h.total.min(4 * FRAGMENT));
        v.extend_from_slice(body);
        partial.insert(src, Partial::Copied(v));
        return Ok(None);
    }
    let body_len = body.len();
    let add = |p: &mut Partial| match p {
        Partial::Copied(v) => {
            v.extend_from_slice(body);
            true
        }
        Partial::Held(..) | Partial::Landing(..) => false,
    };
    match continued(partial, src, h, body_len, add)? {
        Some(Partial::Copied(msg)) => Ok(Some(Cow::Owned(msg))),
        Some(Partial::Held(..) | Partial::Landing(..)) => Err(Refused::Malformed),
        None => Ok(None),
    }
}

/// Adds a fragment (not the first) of `len` bytes to its source's message, through `add`
/// (`false`: the message in progress is not of its kind); the whole message once it was the
/// last. A fragment that does not continue the message in progress drops both.
pub(super) fn continued(
    partial: &mut Partials,
    src: Source,
    h: FrameHead,
    len: usize,
    add: impl FnOnce(&mut Partial) -> bool,
) -> Result<Option<Partial>, Refused> {
    let cur = partial.get_mut(&src).ok_or(Refused::Malformed)?;
    let got = cur.len();
    if got != h.offset || got + len > h.total || !add(cur) {
        partial.remove(&src);
        return Err(Refused::Malformed);
    }
    if h.flags & LAST == 0 {
        return Ok(None);
    }
    let whole = partial.remove(&src).filter(|whole| whole.len() == h.total);
    whole.map(Some).ok_or(Refused::Malformed)
}

/// As [`reassemble`], for a fragment that stays in its ring: the records of the whole message
/// once its last one is in.
pub(super) fn hold(
    partial: &mut Partials,
    src: Source,
    h: FrameHead,
    rec: Read<'_>,
) -> Result<Option<Vec<Record>>, Refused> {
    let len = rec.bytes().len() - HEADER;
    if h.flags & FIRST != 0 {
        partial.insert(src, Partial::Held(vec![rec.keep()], len));
        return Ok(None);
    }
    let add = |p: &mut Partial| match p {
        Partial::Held(recs, got) => {
            recs.push(rec.keep());
            *got += len;
            true
        }
        Partial::Copied(_) | Partial::Landing(..) => false,
    };
    match continued(partial, src, h, len, add)? {
        Some(Partial::Held(recs, _)) => Ok(Some(recs)),
        Some(Partial::Copied(_) | Partial::Landing(..)) => Err(Refused::Malformed),
        None => Ok(None),
    }
}

/// A fragment of a message that came as ring records, if it is part of a WRITE or SEND being
/// landed (see `engine::landing`): its first, which begins the landing if the responder of our
/// QP `to` takes the message now, or a later one; the whole request once the last is in. `None`
/// for every other message.
pub(super) fn land(
    fabric: &FabricInner,
    partial: &mut Partials,
    src: Source,
    h: FrameHead,
    rec: &Read<'_>,
    to: &Option<Arc<crate::qp::QpShared>>,
) -> Option<Result<Option<Packet>, Refused>> {
    let body = &rec.bytes()[HEADER..];
    if h.flags & FIRST != 0 {
        let mut pkt = Packet::new(Kind::Ack);
        let range = match wire::decode_message(body, None, &mut pkt) {
            Ok((Message::Packet, Some(range))) => range,
            _ => return None,
        };
        let named =
            |q: &&Arc<crate::qp::QpShared>| q.qpn == pkt.dst_qpn && q.device_index() == pkt.dst_dev;
        let qp = to.as_ref().filter(named)?;
        // The payload is the rest of the message, after its head in this record.
        let whole =
            pkt.len as usize == h.total - range.start && fabric.port_up(pkt.dst_dev, pkt.dst_port);
        let mut landing = whole.then(|| Landing::begin(fabric, qp, pkt)).flatten()?;
        landing.land(&body[range]);
        partial.insert(src, Partial::Landing(Box::new(landing), body.len()));
        return Some(Ok(None));
    }
    let Some(Partial::Landing(landing, got)) = partial.get_mut(&src) else { return None };
    if *got != h.offset || body.len() > landing.left() {
        partial.remove(&src);
        return Some(Err(Refused::Malformed));
    }
    landing.land(body);
    *got += body.len();
    if h.flags & LAST == 0 {
        return Some(Ok(None));
    }
    match partial.remove(&src) {
        Some(Partial::Landing(landing, got)) if got == h.total => Some(Ok(Some(landing.finish()))),
        _ => Some(Err(Refused::Malformed)),
    }
}

/// The packet whose fragments are `recs`, its payload left in them.
fn decode_held(recs: Vec<Record>) -> Result<Packet, Refused> {
    let first = recs.first().ok_or(Refused::Malformed)?.bytes().len();
    // Held messages carry their payload: none names another process's memory.
    let mut pkt = Packet::new(Kind::Ack);
    let range = match wire::decode_message(&recs[0].bytes()[HEADER..], None, &mut pkt)? {
        (Message::Packet, range) => range,
        // Control messages are a few bytes: never in fragments.
        (Message::Control(_) | Message::Cm(_), _) => return Err(Refused::Malformed),
    };
    if !matches!(pkt.payload, Payload::None) {
        return Err(Refused::Malformed); // a READ request: never in fragments either
    }
    let start = range.map_or(first, |r| HEADER + r.start);
    let parts = recs.into_iter().enumerate().filter_map(|(i, rec)| {
        let len = rec.bytes().len();
        let from = if i == 0 { start } else { HEADER };
        (from < len).then(|| rec.lend(from..len))
    });
    pkt.payload = Payload::Lent(parts.collect());
    Ok(pkt)
}

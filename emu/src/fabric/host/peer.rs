//! Another node, as a destination: its ring and socket, the backlog its flusher pushes, the
//! doorbell, and datagrams laid out.

use super::*;

/// One datagram: the header (magic, source slot, FIRST/LAST flags, the message's total
/// length, this fragment's offset in it, the destination QPN) and the fragment.
pub(in crate::fabric) fn frame(
    src: u8,
    flags: u8,
    total: u32,
    offset: u32,
    dst_qpn: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut d = vec![0; HEADER + body.len()];
    write_header(&mut d, [src, flags], [MAGIC, total, offset, dst_qpn]);
    d[HEADER..].copy_from_slice(body);
    d
}

/// The header of [`frame`], into the front of `d`: `[magic, total, offset, dst_qpn]`.
fn write_header(d: &mut [u8], [src, flags]: [u8; 2], words: [u32; 4]) {
    d[..4].copy_from_slice(&words[0].to_le_bytes());
    d[4..8].copy_from_slice(&[src, flags, 0, 0]);
    for (i, w) in words[1..].iter().enumerate() {
        d[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }
}

/// One fragment of a message: `range` of `msg`'s bytes, framed for the node of `dst_qpn`.
struct Fragment<'a> {
    pub(super) src: u8,
    pub(super) dst_qpn: u32,
    pub(super) msg: &'a Encoded<'a>,
    pub(super) range: std::ops::Range<usize>,
}

impl Fragment<'_> {
    pub(super) fn len(&self) -> usize {
        HEADER + self.range.len()
    }

    /// Frames it into `d` (of `len()` bytes); `false` if the payload could not be read.
    pub(super) fn write(&self, d: &mut [u8]) -> bool {
        let total = self.msg.len();
        let mut flags = if self.range.start == 0 { FIRST } else { 0 };
        if self.range.end == total {
            flags |= LAST;
        }
        let words = [MAGIC, total as u32, self.range.start as u32, self.dst_qpn];
        write_header(d, [self.src, flags], words);
        self.msg.copy_to(self.range.start, &mut d[HEADER..]).is_ok()
    }

    pub(super) fn to_vec(&self) -> Option<Vec<u8>> {
        let mut d = vec![0; self.len()];
        self.write(&mut d).then_some(d)
    }
}

/// Whether every byte of `pkt`'s payload lies in memory shared with other processes.
pub(super) fn in_shared(pkt: &Packet) -> bool {
    pkt.payload.ranges().iter().all(|m| m.region.shared_for(m.offset, m.len).is_some())
}

/// Another node, as a destination.
#[derive(Debug)]
pub(super) struct Peer {
    pub(super) path: PathBuf,
    /// Which of the nodes that held its slot it is (see `write_incarnation`).
    pub(super) incarnation: u128,
    /// Our slot, as the source of what we send.
    pub(super) src: u8,
    /// (The QP lock's kind: taken for every message sent.)
    pub(super) tx: crate::sync::lock::Lock<PeerTx>,
    /// The flusher sleeps on `cv` with `wake` held while it finds the backlog empty; a sender
    /// that queued to the backlog takes `wake` to ring it, so the ring cannot come between
    /// the flusher's look and its sleep.
    pub(super) wake: Mutex<()>,
    cv: Condvar,
    /// The peer (or this node) is gone: its flusher and any sender waiting for room stop.
    shutdown: AtomicBool,
    /// When its process was last seen stopped (see `Node::absent_peer`).
    seen_stopped: Mutex<Option<Instant>>,
}

#[derive(Debug, Default)]
pub(super) struct PeerTx {
    /// Connected and non-blocking; `None` until first used or after the peer went away.
    pub(super) sock: Option<UnixDatagram>,
    /// The ring to the peer, once it has its descriptor; without one, datagrams on `sock`.
    pub(super) ring: Option<Arc<Ring>>,
    ring_tried: bool,
    exports_offered: bool,
    /// The names of our shared memory passed to the peer (see `Peer::offer_shared`).
    shared_offered: Vec<u32>,
    /// The names of the peer's shared memory we asked it for a view of (see
    /// `Peer::want_view`).
    views_wanted: Vec<u32>,
    /// Fragments the peer had no room for, framed, in order.
    pub(super) backlog: VecDeque<Vec<u8>>,
    /// The flusher took a fragment off the backlog and is sending it: later ones must queue.
    pub(super) flushing: bool,
    flusher_started: bool,
}

impl PeerTx {
    /// The ring to the peer, for a look through its records under `tx` (the carry-outs'):
    /// none while the flusher writes into it without `tx` (`Peer::flush_loop`), since the
    /// records the reader frees meanwhile may be written again under the look.
    pub(super) fn ring_at_rest(&self) -> Option<&Arc<Ring>> {
        if self.flushing { None } else { self.ring.as_ref() }
    }
}

impl crate::shared_mem::Holder for Peer {
    /// Tells the peer, if it was passed the memory, that it may let its view go (once: a
    /// datagram lost to a full socket leaves the view until the peer drops it for another).
    fn retired(&self, id: u32) {
        let mut tx = self.tx.lock();
        let Some(i) = tx.shared_offered.iter().position(|&o| o == id) else { return };
        tx.shared_offered.swap_remove(i);
        if let Some(s) = tx.sock.as_ref() {
            let _ = s.send(&frame(self.src, RETIRED, 0, 0, 0, &id.to_le_bytes()));
        }
    }
}

/// What a non-blocking send came to.
enum Sent {
    Done,
    Full,
    Gone,
}

impl Peer {
    pub(super) fn new(path: PathBuf, src: u8, incarnation: u128) -> Peer {
        Peer {
            path,
            incarnation,
            src,
            tx: Default::default(),
            wake: Mutex::new(()),
            cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            seen_stopped: Mutex::new(None),
        }
    }

    /// Whether a message of `len` bytes is better read by the peer from here than streamed
    /// through the ring, if the peer has shown it may read our memory (see `wire::pullable`):
    /// one large enough (`large`, see `Node::pulls`), one the ring cannot hold whole, or a
    /// reply (`replying`) for which it has no room now.
    pub(super) fn better_pulled(&self, len: usize, replying: bool, large: bool) -> bool {
        let tx = self.tx.lock();
        let Some(ring) = tx.ring.as_ref().filter(|r| r.reader_may_pull()) else { return false };
        // Records carry headers and may leave a filler at the wrap: ask for twice the bytes.
        large || len > ring.max_held_message() || (replying && ring.room() < 2 * len)
    }

    /// Its process, as its lock file names it (0 if it does not).
    pub(super) fn pid(&self) -> u32 {
        (self.incarnation >> 96) as u32
    }

    /// Whether its process is stopped (SIGSTOP, a debugger). Seen stopped a moment ago is
    /// taken as stopped still, without looking again: a wait or a request carried out for a
    /// peer that just continued is correct, only slower (whoever begins a request first has it).
    pub(super) fn stopped(&self) -> bool {
        let pid = self.pid();
        let mut seen = self.seen_stopped.lock();
        if !seen.is_some_and(|t| t.elapsed() < STOPPED_LOOK) {
            let stopped = pid != 0 && pid != std::process::id() && crate::sys::process_stopped(pid);
            *seen = stopped.then(Instant::now);
        }
        seen.is_some()
    }

    /// Closes its ring (nothing more will come through it) and stops its flusher.
    pub(super) fn retire(&self) {
        if let Some(r) = &self.tx.lock().ring {
            r.close();
        }
        self.shut();
    }

    /// Stops its flusher: the peer (or this node) is gone.
    pub(super) fn shut(&self) {
        self.shutdown.store(true, Ordering::Release);
        let _w = self.wake.lock();
        self.cv.notify_all();
    }

    /// Makes our ring to the peer, its pages in place, and passes it over, if not done yet: as
    /// a QP connects to the peer (see `Node::watch`), not in the first message, which then
    /// neither waits for it nor faults its pages in one by one (2 MiB of them: ~1.5 ms here,
    /// which `ib_send_bw -s 4096`'s 1,000 SENDs paid on the way, 1.2-1.8 GB/s against
    /// 2.3-3.8 with the ring made ahead).
    pub(super) fn offer_ring_early(&self) {
        self.offer_ring_once(&mut self.tx.lock(), true);
    }

    /// Makes our ring to the peer and passes it over, unless that was tried before (a ring
    /// that could not be made or passed leaves datagrams for good).
    fn offer_ring_once(&self, tx: &mut PeerTx, populate: bool) {
        if !tx.ring_tried {
            tx.ring_tried = true;
            tx.ring = self.offer_ring(&mut tx.sock, populate).map(Arc::new);
        }
    }

    /// Sends `msg` for the peer's QP `dst_qpn`, in fragments, in order; what does not fit now
    /// goes to the backlog.
    pub(super) fn send(self: &Arc<Self>, dst_qpn: u32, msg: &Encoded<'_>, lands: bool) {
        let src = self.src;
        let mut tx = self.tx.lock();
        self.offer_ring_once(&mut tx, false);
        // Out of `tx` while it is written (and put back below), rather than cloned: no
        // reference count moves per message.
        let ring = tx.ring.take();
        let step = ring.as_ref().map_or(FRAGMENT, |r| r.max_record().min(RECORD) - HEADER);
        let total = msg.len();
        let mut rung = 0;
        let mut start = 0;
        while start < total {
            let end = (start + step).min(total);
            let frag = Fragment { src, dst_qpn, msg, range: start..end };
            start = end;
            if tx.backlog.is_empty() && !tx.flushing {
                // (`lands` only within `claiming`: see `Node::send_to`.)
                let claimed = lands
                    && total <= step
                    && ring.as_deref().is_some_and(|r| r.asleep() || r.napping());
                match self.try_fragment(&mut tx, ring.as_deref(), &frag, claimed) {
                    Sent::Done => {
                        if claimed && let Some(r) = ring.as_deref() {
                            let (slot, at) = (slot_of(dst_qpn), Some(r.last_written() as u32));
                            CLAIMED.set(Some(Claimed { slot, at, napping: false }));
                        }
                        if rung == 0 {
                            rung = ring.as_ref().map_or(0, |r| r.take_bell(lands));
                        }
                        continue;
                    }
                    Sent::Gone => break,
                    Sent::Full => {}
                }
            }
            match frag.to_vec() {
                Some(d) => tx.backlog.push_back(d),
                None => break,
            }
        }
        tx.ring = ring;
        if rung != 0 {
            self.ring_asked(&mut tx, rung);
        }
        if !tx.backlog.is_empty() {
            if !tx.flusher_started {
                tx.flusher_started = true;
                let me = self.clone();
                let spawned = crate::sys::spawn("rdma-emu-flush".into(), move || me.flush_loop());
                if spawned.is_err() {
                    // No thread to push it: the backlog is lost, as on a congested wire.
                    tx.backlog.clear();
                    tx.flusher_started = false;
                }
            }
            drop(tx);
            let _w = self.wake.lock();
            self.cv.notify_one();
        }
    }

    /// See [`Node::send_whole`]; the message carries `carry` if it can ([`wire::carry_ack`]).
    /// Whether it was sent, and whether it carries the ACK. (Inline: each message sent so lays
    /// out its record in place.)
    #[inline(always)]
    pub(super) fn send_whole(
        self: &Arc<Self>,
        dst_qpn: u32,
        len: usize,
        how: Whole,
        carry: Option<&wire::Ack>,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> (bool, bool, Option<Claimed>) {
        let mut tx = self.tx.lock();
        if !tx.backlog.is_empty() || tx.flushing {
            return (false, false, None);
        }
        let Some(ring) = tx.ring.as_deref() else { return (false, false, None) };
        if HEADER + len > ring.max_record().min(RECORD) {
            return (false, false, None);
        }
        let mut carried = false;
        let framed = |d: &mut [u8]| {
            write_header(d, [self.src, FIRST | LAST], [MAGIC, len as u32, 0, dst_qpn]);
            let d = &mut d[HEADER..];
            fill(d) && {
                carried = carry.is_some_and(|a| wire::carry_ack(d, a));
                true
            }
        };
        // Claimed only where the peer's reader is not at work (asleep, rung below, or napping
        // on its application's looks): a thread of the peer that takes records in as they come
        // would only wait for us, where it could have carried the request out meanwhile.
        let claimed = how.placing && (ring.asleep() || ring.napping());
        let marks = Marks { carriable: how.carriable, claimed };
        if ring.write_marked(HEADER + len, marks, framed) != Written::Done {
            return (false, false, None);
        }
        // Placing: the bell of a reader napping on its application's looks is left alone
        // until the request is found not carried out (see `Node::settle`); one asleep is rung
        // now, and stays awake for what follows, unless the caller holds it (a ping-pong's:
        // see `engine::absent_peer::holds_bell`).
        let napping = how.placing && ring.napping();
        let at = (how.placing && claimed).then(|| ring.last_written() as u32);
        let bell = ring.take_bell(how.lands && !napping);
        if bell != 0 {
            self.ring_asked(&mut tx, bell);
        }
        if !how.placing {
            return (true, carried, None);
        }
        (true, carried, Some(Claimed { slot: slot_of(dst_qpn), at, napping }))
    }

    /// The peer's reader asked to be rung for what was just written: rung now, or, while this
    /// thread holds the bell (see [`holding_bell`]), once it lets go.
    fn ring_asked(self: &Arc<Self>, tx: &mut PeerTx, bell: u32) {
        let hold = match this_thread::hold_bell::get() {
            h if h == Hold::All as u64 => true,
            h if h == Hold::Napping as u64 => bell == ring::DELEGATED,
            _ => false,
        };
        if hold {
            match HELD_BELL.replace(Some((self.clone(), bell))) {
                // Ours taken again (an ACK deferred went just before the message): one is
                // held, the reader's first request, which stands for both.
                Some((held, first)) if Arc::ptr_eq(&held, self) => {
                    HELD_BELL.set(Some((held, first)));
                }
                Some((held, _)) => held.release_bell(true, 0),
                None => {}
            }
        } else {
            ring_bell(&mut tx.sock, &self.path, self.src);
            this_thread::rang::set(1);
        }
    }

    /// See [`release_bell`](self::release_bell): `bell` is the reader's request that was taken.
    pub(super) fn release_bell(&self, wake: bool, bell: u32) {
        let mut tx = self.tx.lock();
        // A message another thread wrote meanwhile found the bell asked for by nobody; and
        // what the reader is to account for must not fill the ring (a writer that finds it
        // full waits for a reader that nobody woke).
        let wake = wake
            || match tx.ring.as_deref() {
                Some(r) => {
                    r.ask_bell_again(bell);
                    r.oldest_unbegun() || r.room() < RING_BYTES / 2
                }
                None => true,
            };
        if wake {
            ring_bell(&mut tx.sock, &self.path, self.src);
        }
    }

    /// Sends `frag` now if it can: into the ring, or as a datagram (one the socket has no room
    /// for yet is queued, laid out, on the backlog: `Done` all the same).
    fn try_fragment(
        &self,
        tx: &mut PeerTx,
        ring: Option<&Ring>,
        frag: &Fragment<'_>,
        claimed: bool,
    ) -> Sent {
        let Some(r) = ring else {
            let Some(d) = frag.to_vec() else { return Sent::Gone };
            return match try_send(&mut tx.sock, &self.path, &d) {
                Sent::Full => {
                    tx.backlog.push_back(d);
                    Sent::Done
                }
                sent => sent,
            };
        };
        match self.write_waiting(r, frag, &mut tx.sock, claimed) {
            Written::Done => Sent::Done,
            Written::Full => Sent::Full,
            Written::Refused => Sent::Gone,
        }
    }

    /// Writes `frag` into `ring`. A thread that is not taking in messages waits a little for
    /// room rather than copying to the backlog: its work request waits as in a NIC's full
    /// send queue. Only a little, for it may hold a QP's lock that the reader needs to take in
    /// what frees the peer to read (each node's reader waiting on the other's application
    /// would never end), and never while taking messages in itself.
    fn write_waiting(
        &self,
        ring: &Ring,
        frag: &Fragment<'_>,
        sock: &mut Option<UnixDatagram>,
        claimed: bool,
    ) -> Written {
        let mut since = None;
        let marks = Marks { carriable: true, claimed };
        loop {
            match ring.write_marked(frag.len(), marks, |d| frag.write(d)) {
                Written::Full if !receiving() && !self.shutdown.load(Ordering::Acquire) => {
                    // A reader asleep on a full ring (its records carried out by us, only to
                    // be accounted for) frees nothing until woken.
                    if since.is_none() && ring.rings(true) {
                        ring_bell(sock, &self.path, self.src);
                    }
                    let t0 = *since.get_or_insert_with(std::time::Instant::now);
                    if t0.elapsed() > SEND_PATIENCE {
                        return Written::Full;
                    }
                    std::thread::yield_now();
                }
                w => return w,
            }
        }
    }

    /// Makes a ring for the peer (its pages in place if `populate`) and passes it over; `None`
    /// (datagrams it is, then) if either fails.
    fn offer_ring(&self, sock: &mut Option<UnixDatagram>, populate: bool) -> Option<Ring> {
        let ring = Ring::create(RING_BYTES, populate).ok()?;
        self.pass(sock, RING, ring.fd()).then_some(ring)
    }

    /// Passes the peer our exports, once.
    pub(super) fn offer_exports(&self, exports: &Exports) {
        let mut tx = self.tx.lock();
        if !std::mem::replace(&mut tx.exports_offered, true) {
            self.pass(&mut tx.sock, EXPORTS, exports.fd());
        }
    }

    /// Passes the peer our memory moved into `shared`, once, if it proved it may read our
    /// memory anyway (see `Ring::reader_may_pull`: a view shows it no more than it could read
    /// with `process_vm_readv`), and says so in the ring: whichever thread of the peer's
    /// reads the ring next takes the descriptor first (see `receive_marked`).
    pub(super) fn offer_shared(self: &Arc<Self>, shared: &crate::shared_mem::SharedMem) {
        let mut tx = self.tx.lock();
        let Some(ring) = tx.ring.clone().filter(|r| r.reader_may_pull()) else { return };
        if tx.shared_offered.contains(&shared.id()) {
            return;
        }
        let (base, len) = shared.range();
        let mut body = [0u8; 20];
        body[..4].copy_from_slice(&shared.id().to_le_bytes());
        body[4..12].copy_from_slice(&base.to_le_bytes());
        body[12..].copy_from_slice(&(len as u64).to_le_bytes());
        let d = frame(self.src, SHARED, 0, 0, 0, &body);
        if !self.pass_framed(&mut tx.sock, &d, shared.fd().as_raw_fd()) {
            return;
        }
        tx.shared_offered.push(shared.id());
        ring.offer_view(shared.id());
        drop(tx);
        let me: Arc<dyn crate::shared_mem::Holder> = self.clone();
        shared.passed_to(Arc::downgrade(&me));
    }

    /// Asks the peer, once, for a view of its shared memory named `id` (it passes it as it
    /// passes the memory its payloads come from: see [`Peer::offer_shared`]). The names asked
    /// for last are remembered, as many as a process has shared at once: one asked for long
    /// ago and still shared may be asked for again.
    pub(super) fn want_view(&self, tx: &mut PeerTx, id: u32) {
        if tx.views_wanted.contains(&id) {
            return;
        }
        if tx.views_wanted.len() >= crate::shared_mem::MAX_LIVE {
            tx.views_wanted.remove(0);
        }
        tx.views_wanted.push(id);
        let d = frame(self.src, WANTED, 0, 0, 0, &id.to_le_bytes());
        if let Some(sock) = &tx.sock {
            // Not waited for: a view is worth a datagram, not a wait (none: asked no more).
            let _ = sock.send(&d);
        }
    }

    /// Passes the descriptor `fd` in a datagram of kind `flag`; whether it went. The peer's
    /// socket may be briefly full: it is retried for up to 100 ms.
    pub(super) fn pass(
        &self,
        sock: &mut Option<UnixDatagram>,
        flag: u8,
        fd: std::os::fd::RawFd,
    ) -> bool {
        self.pass_framed(sock, &frame(self.src, flag, 0, 0, 0, &[]), fd)
    }

    /// Passes the descriptor `fd` with the datagram `d`, as [`Peer::pass`].
    fn pass_framed(
        &self,
        sock: &mut Option<UnixDatagram>,
        d: &[u8],
        fd: std::os::fd::RawFd,
    ) -> bool {
        for _ in 0..100 {
            if sock.is_none() {
                *sock = connect(&self.path, true).ok();
            }
            let Some(s) = sock.as_ref() else { return false };
            match crate::sys::send_with_fd(s.as_raw_fd(), d, fd) {
                Ok(()) => return true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Pushes the backlog, waiting for room, so the threads that send never wait.
    fn flush_loop(&self) {
        let mut sock: Option<UnixDatagram> = None;
        loop {
            let (d, ring) = {
                let mut w = self.wake.lock();
                loop {
                    {
                        let mut tx = self.tx.lock();
                        tx.flushing = false;
                        if self.shutdown.load(Ordering::Acquire) {
                            return;
                        }
                        if let Some(d) = tx.backlog.pop_front() {
                            tx.flushing = true;
                            break (d, tx.ring.clone());
                        }
                    }
                    w = self.cv.wait(w);
                }
            };
            let sent = match ring {
                Some(r) => self.flush_to_ring(&r, &d, &mut sock),
                None => send_blocking(&mut sock, &self.path, &d),
            };
            if !sent {
                // The peer is gone: so is everything queued for it.
                self.tx.lock().backlog.clear();
            }
        }
    }

    /// Writes the framed fragment `d` into `ring` as soon as the reader makes room; `false`
    /// if the peer went away first.
    fn flush_to_ring(&self, ring: &Ring, d: &[u8], sock: &mut Option<UnixDatagram>) -> bool {
        loop {
            match ring.write(d.len(), |b| {
                b.copy_from_slice(d);
                true
            }) {
                Written::Done => break,
                _ if self.shutdown.load(Ordering::Acquire) => return false,
                _ => {
                    if ring.rings(true) {
                        ring_bell(sock, &self.path, self.src);
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        // What the backlog held (a large WRITE's fragments among them) may land unannounced.
        if ring.rings(true) {
            ring_bell(sock, &self.path, self.src);
        }
        true
    }
}

/// Wakes the node whose socket is at `path`: records wait in our ring.
pub(super) fn ring_bell(sock: &mut Option<UnixDatagram>, path: &Path, src: u8) {
    // Laid out in place: a reader that sleeps between messages is rung once per message.
    let mut bell = [0; HEADER];
    write_header(&mut bell, [src, BELL], [MAGIC, 0, 0, 0]);
    // A full socket needs no more waking.
    let _ = try_send(sock, path, &bell);
}

pub(super) fn connect(path: &Path, nonblocking: bool) -> io::Result<UnixDatagram> {
    let s = UnixDatagram::unbound()?;
    s.connect(path)?;
    s.set_nonblocking(nonblocking)?;
    if !nonblocking {
        // Bounded, so a flusher re-checks a peer that stopped reading without dying.
        s.set_write_timeout(Some(Duration::from_millis(100)))?;
    }
    Ok(s)
}

/// One non-blocking send; reconnects once if the peer's socket changed hands.
fn try_send(sock: &mut Option<UnixDatagram>, path: &Path, d: &[u8]) -> Sent {
    for _ in 0..2 {
        if sock.is_none() {
            match connect(path, true) {
                Ok(s) => *sock = Some(s),
                Err(_) => return Sent::Gone,
            }
        }
        match sock.as_ref().map(|s| s.send(d)) {
            Some(Ok(_)) => return Sent::Done,
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => return Sent::Full,
            _ => *sock = None,
        }
    }
    Sent::Gone
}

/// Sends `d`, waiting for room; `false` if the peer is gone.
fn send_blocking(sock: &mut Option<UnixDatagram>, path: &Path, d: &[u8]) -> bool {
    let mut reconnects = 0;
    loop {
        if sock.is_none() {
            match connect(path, false) {
                Ok(s) => *sock = Some(s),
                Err(_) => return false,
            }
        }
        match sock.as_ref().map(|s| s.send(d)) {
            Some(Ok(_)) => return true,
            Some(Err(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            _ => {
                *sock = None;
                reconnects += 1;
                if reconnects > 1 {
                    return false;
                }
            }
        }
    }
}

//! The receiving side: the reader thread's loop, and the looks of application threads that
//! poll, taking records and datagrams in (see [`batch`]) and acting on control
//! messages.

use super::*;

/// The receiving side, shared by the reader thread and the threads that poll a CQ.
#[derive(Debug)]
pub(super) struct Inbound {
    /// Non-blocking; the reader waits for it with poll(2).
    pub(super) sock: UnixDatagram,
    /// Where `sock` is bound, and our slot: a thread that took a doorbell meant for the
    /// reader rings it again (see `receive_marked`).
    pub(super) path: PathBuf,
    pub(super) slot: u8,
    /// Held by whoever is receiving, so datagrams are taken and reassembled in order. (Taken
    /// at every empty poll of an application thread: a lock whose release is a plain store.)
    pub(super) rx: crate::sync::lock::Lock<Rx>,
    pub(super) quit: AtomicBool,
    /// Raised by the looks application threads take (see `Node::progress`), lowered by the
    /// reader: while it is raised again between the reader's looks, the reader need not be
    /// rung. (A flag rather than a count: a look finds it raised and writes nothing, where a
    /// count made every empty poll a locked instruction on a line the reader reads.)
    pub(super) polled: AtomicBool,
    /// Counts the times an application thread armed a CQ to sleep on its event (see
    /// `Node::attend`): then nobody will look at the rings but the reader.
    pub(super) sleepers: AtomicU64,
    /// The reader naps between application looks (it has not asked for doorbells).
    pub(super) napping: AtomicBool,
    /// Whether any peer's ring is attached (`rx.rings` is not empty): until one is, an
    /// application thread looks only at the socket, every so many looks (see
    /// `Node::look_without_rings`).
    pub(super) has_rings: AtomicBool,
    /// Empty looks of application threads while `has_rings` is false.
    pub(super) looks_without_rings: AtomicU32,
    /// The user whose processes may send to us.
    pub(super) uid: u32,
    pub(super) drops: Drops,
    /// By slot, the exports its node passed us, and the process that passed them.
    pub(super) peer_exports: Mutex<FxHashMap<u8, Exported>>,
    /// The rings our peers write to us, whose gates they raise while they act on our memory
    /// (see `exports`).
    pub(super) gates: Mutex<Vec<Arc<Ring>>>,
    /// Views of our shared memory our peers asked for, taken off the socket and not passed
    /// yet: by slot, the process that asked and the memory's name.
    pub(super) wanted: Mutex<Vec<(u8, u32, u32)>>,
    /// Whether `wanted` may hold any (a look per receive that writes nothing).
    pub(super) any_wanted: AtomicBool,
    /// Whether `rx` holds an ACK deferred (written under `rx`: a look before its lock).
    pub(super) ack_deferred: AtomicBool,
    /// Held (written) by a test, keeps the reader from taking anything in once it wakes, as
    /// when its thread is not scheduled for a while.
    #[cfg(test)]
    pub(super) reader_held: crate::sync::RwLock<()>,
    /// ACKs sent in their short form, as records of their own.
    #[cfg(test)]
    pub(super) acks_sent: AtomicU32,
}

impl Inbound {
    /// The ACK deferred in `rx` (see [`Rx::deferred`]), taken out: sent already, carried by
    /// a message (else see [`Node::pay_deferred`]).
    pub(super) fn take_deferred(&self, rx: &mut Rx) -> Option<wire::Ack> {
        let ack = rx.deferred.take();
        if let Some(ack) = &ack {
            owe(&rx.rings, ack, false);
            self.ack_deferred.store(false, Ordering::Relaxed);
        }
        ack
    }

    /// Rings our own doorbell: the reader, asleep on the socket, wakes.
    pub(super) fn wake_reader(&self) {
        ring_bell(&mut None, &self.path, self.slot);
    }

    /// An application thread looks at what came in: raises `polled` unless raised (a load
    /// first, so steady polling writes nothing to the line the reader reads).
    pub(super) fn mark_polled(&self) {
        if !self.polled.load(Ordering::Relaxed) {
            self.polled.store(true, Ordering::Relaxed);
        }
    }
}

/// A peer's exports and the process that passed them to us.
type Exported = (Arc<PeerExports>, Arc<PeerProcess>);

#[derive(Debug)]
pub(super) struct Rx {
    pub(super) buf: Vec<u8>,
    /// See [`Batch::last_qp`].
    pub(super) last_qp: Option<(u32, std::sync::Weak<crate::qp::QpShared>)>,
    /// See [`Batch::passed`].
    pub(super) passed: Vec<std::sync::Weak<crate::qp::QpShared>>,
    /// [`Batch::kept`]'s room, empty between receives (made anew for each, it was an
    /// allocation whenever the reader took in a record to keep).
    pub(super) kept: Vec<Record>,
    /// [`Batch::ready`]'s, [`Batch::multicast`]'s and [`Batch::xrc`]'s room, empty between
    /// receives.
    pub(super) ready: engine::QpList,
    pub(super) multicast: Vec<Packet>,
    pub(super) xrc: Vec<Packet>,
    /// Per source, the message being reassembled (its fragments arrive in order).
    pub(super) partial: Partials,
    /// The rings other nodes write to us, by their slot.
    pub(super) rings: Vec<(u8, Arc<Ring>)>,
    /// The ACK owed at the end of an application thread's look that took in SENDs or WRITEs,
    /// left to the node's next move: carried by the next request its QP sends to the QP the
    /// ACK is for ([`wire::carry_ack`]: the reply of a ping-pong, whose receiver then takes in
    /// one record rather than two), or sent at the next look at the rings by any thread (the
    /// reader's too), or as an application thread arms a CQ to sleep ([`Node::attend`]). An
    /// ACK is late so only while the application neither posts nor polls an empty CQ: as long
    /// as a message that came meanwhile waits to be taken in.
    pub(super) deferred: Option<wire::Ack>,
}

/// Says, in the ring its node writes to us, that we owe `ack` (or no longer do), so that
/// the node takes it in should our process die first (see `ring::OWED_AT`).
pub(super) fn owe(rings: &[(u8, Arc<Ring>)], ack: &wire::Ack, owed: bool) {
    const _: () = assert!(wire::ACK_LEN <= ring::OWED_MAX);
    let bytes = ack.encode();
    for (_, r) in rings.iter().filter(|(s, _)| *s == slot_of(ack.dst.2)) {
        r.owe(owed.then_some(&bytes[..]));
    }
}

/// Waits for messages and services them until the node quits or its fabric is gone.
pub(super) fn read_loop(inbound: &Inbound, fabric: &Weak<FabricInner>) {
    this_thread::reader::set(1);
    let mut sleepers = inbound.sleepers.load(Ordering::SeqCst);
    let mut nap = None;
    // Rounds in a row that found records streaming in: the socket is looked at only every
    // few of them (a system call or two per look, as long as copying a record out).
    let mut streaming = 0u32;
    // The rings to watch and arm, listed anew each round into the same list (a list made per
    // round was an allocation per message whenever no application thread polled), and emptied
    // before the reader sleeps: a dead peer's ring must not outlive its watcher's cleanup.
    let mut rings: Vec<Arc<Ring>> = Vec::new();
    // While `rings` holds the rings in which records waited as the reader began a nap on an
    // application thread's looks: how far they had been read then.
    let mut read_mark = 0;
    // How long the next watch of the rings after traffic lasts (see `busy_wait`).
    let mut watch = READER_SPIN;
    loop {
        let socket = streaming.is_multiple_of(16);
        if socket {
            let woke = crate::sys::wait_readable(inbound.sock.as_raw_fd(), nap);
            inbound.napping.store(false, Ordering::SeqCst);
            let Ok(rung) = woke else { return };
            // Napped while an application thread polls, and it polled on meanwhile, with
            // nothing come on the socket: it takes in what comes, so nap on without taking the
            // rings. A reader that took them at each nap's end was, on a core it shares with
            // that thread, preempted holding them, and the poller shut out until it yielded.
            // Not if records that waited as the nap began wait still, nobody having read a
            // record since: written before their writers saw the nap, they rang no bell.
            let left = !rings.is_empty()
                && read_so_far(&rings) == read_mark
                && rings.iter().any(|r| r.pending());
            rings.clear();
            if nap == Some(POLLED_NAP)
                && !rung
                && !left
                && !inbound.quit.load(Ordering::Acquire)
                && inbound.polled.swap(false, Ordering::Relaxed)
                && polled_nap_again(inbound, sleepers)
            {
                continue;
            }
        }
        if inbound.quit.load(Ordering::Acquire) {
            return;
        }
        #[cfg(test)]
        drop(inbound.reader_held.read());
        let Some(fabric) = fabric.upgrade() else { return };
        // Lent (never kept), as is everything this thread takes in for (see `give_back_biases`).
        let mut rx = crate::sync::lock::lock_lent(&inbound.rx);
        let events = fabric.cq_events.load(Ordering::Relaxed);
        let came = receive(inbound, &mut rx, &fabric, socket);
        give_back_biases(&mut rx);
        let woke = fabric.cq_events.load(Ordering::Relaxed) != events;
        if inbound.polled.swap(false, Ordering::Relaxed) && polled_nap_again(inbound, sleepers) {
            // An application thread is reading the rings: look again soon, rung only for what
            // lands unannounced (that thread may be spinning on the memory it lands in,
            // looking no more: see `Ring::take_bell`). Records that wait already (written
            // before their writers saw the request, they rang no bell) are looked at again at
            // the nap's end, unless somebody took records in meanwhile. (A shorter nap for
            // them woke the reader every few tens of microseconds in a ping-pong, on the
            // cores the application threads spin on.)
            let waiting = rx.rings.iter().fold(false, |w, (_, r)| r.delegate() | w);
            if waiting {
                rings.extend(rx.rings.iter().map(|(_, r)| r.clone()));
                read_mark = read_so_far(&rings);
            }
            nap = Some(POLLED_NAP);
            streaming = 0;
            continue;
        }
        sleepers = inbound.sleepers.load(Ordering::SeqCst);
        // Nobody else looks. Right after traffic, more is likely on its way (the next READ
        // request of a stream, the next WRITE): watch the rings a little before sleeping, as
        // waking costs far more than that. Not when what came raised a completion event: the
        // thread it wakes may need this very CPU, and it looks for the traffic itself.
        rings.clear();
        rings.extend(rx.rings.iter().map(|(_, r)| r.clone()));
        drop(rx);
        let watched = came && !woke;
        let spun = watched && busy_wait(&rings, &inbound.quit, watch);
        if watched {
            watch = next_watch(watch, spun);
        }
        // Then ask for doorbells, and sleep unless something came meanwhile.
        let waiting = !spun && rings.iter().fold(false, |w, r| r.arm() | w);
        rings.clear();
        if spun {
            nap = Some(Duration::ZERO);
            streaming += 1;
            continue;
        }
        streaming = 0;
        nap = if waiting { Some(Duration::ZERO) } else { None };
    }
}

/// How far `rings` have been read, all told: unchanged while nobody takes a record in.
fn read_so_far(rings: &[Arc<Ring>]) -> u64 {
    rings.iter().fold(0, |n, r| n.wrapping_add(r.read_to()))
}

/// Whether the reader may nap [`POLLED_NAP`] (unrung) on the strength of an application
/// thread's looks: not if that thread went to sleep on a CQ event since the reader counted
/// `sleepers` (it says so before it sleeps, and rings us if we nap: one of us sees the other).
fn polled_nap_again(inbound: &Inbound, sleepers: u64) -> bool {
    inbound.napping.store(true, Ordering::SeqCst);
    if inbound.sleepers.load(Ordering::SeqCst) == sleepers {
        return true;
    }
    inbound.napping.store(false, Ordering::SeqCst);
    false
}

/// The watch after one of `watch` that found a record (`spun`) or not. Requests that come
/// further apart than the watch (fio's 16 READs of a MiB, one every ~150 us here) had the
/// reader watch in vain after each: a third of a core. A watch that found nothing halves the
/// next; one that found a record restores it whole.
pub(super) fn next_watch(watch: Duration, spun: bool) -> Duration {
    if spun { READER_SPIN } else { (watch / 2).max(READER_SPIN_MIN) }
}

/// Watches `rings` for up to `watch`; whether a record arrived.
fn busy_wait(rings: &[Arc<Ring>], quit: &AtomicBool, watch: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < watch {
        for _ in 0..64 {
            if rings.iter().any(|r| r.pending()) {
                return true;
            }
            std::hint::spin_loop();
        }
        if quit.load(Ordering::Relaxed) {
            return false;
        }
    }
    false
}

/// Takes in what has arrived (the socket's datagrams too if `socket`, then the rings), hands
/// each complete packet to its QP's inbox in arrival order, then services those QPs; whether
/// anything came (a fragment of a message still arriving counts: more of it is on its way).
pub(super) fn receive(inbound: &Inbound, rx: &mut Rx, fabric: &FabricInner, socket: bool) -> bool {
    receive_as(inbound, rx, fabric, socket, false)
}

/// [`receive()`]; `looking`: by an application thread's look, which leaves the ACK owed at its
/// end deferred (see [`Rx::deferred`]).
pub(super) fn receive_as(
    inbound: &Inbound,
    rx: &mut Rx,
    fabric: &FabricInner,
    socket: bool,
    looking: bool,
) -> bool {
    if rx.deferred.is_some()
        && let Some(node) = fabric.node.get()
    {
        node.pay_deferred(rx);
    }
    // Nothing waits in any ring (what a thread spinning on an empty CQ finds almost every
    // look): no batch is made and dropped, ~375 instructions a look down to ~115.
    if !socket
        && !inbound.any_wanted.load(Ordering::Relaxed)
        && rx.rings.iter().all(|(_, r)| r.nothing_to_read())
    {
        return false;
    }
    let was = set_receiving(true);
    let delivered = receive_marked(inbound, rx, fabric, socket, looking);
    set_receiving(was);
    delivered
}

/// After the reader took records in: gives back the biases it took on the way (see
/// `sync::bias::Bias::disown`), those of the rings' locks and of the QPs it delivered to
/// (their locks and their CQs' producers), so that the application's thread, which polls and
/// posts from then on, owns them. A reader that took them first (the peer's first messages
/// came before the application first polled) kept them, and the application's thread revoked
/// each: `ib_send_lat`'s client then took ~8 more locked instructions per round trip, and
/// `ib_send_bw -q 4`'s two more per message where only the last QP's were given back.
pub(super) fn give_back_biases(rx: &mut Rx) {
    rx.rings.iter().for_each(|(_, r)| r.disown_reading());
    let last = rx.last_qp.as_ref().map(|(_, q)| q);
    for qp in rx.passed.iter().chain(last).filter_map(std::sync::Weak::upgrade) {
        crate::sync::lock::disown(&qp.inner);
        qp.send_cq.disown_producer();
        qp.recv_cq.disown_producer();
    }
    rx.passed.clear();
}

/// Takes into `batch` the records waiting in `rings`.
fn read_rings<'a>(
    inbound: &Inbound,
    fabric: &'a FabricInner,
    rings: &mut Vec<(u8, Arc<Ring>)>,
    partial: &mut Partials,
    batch: &mut Batch<'a, '_>,
) {
    // (A loop, not `retain`: its steps cost a look at a single ring ~40 instructions.)
    let mut i = 0;
    while let Some((slot, ring)) = rings.get(i) {
        let slot = *slot;
        let read = ring.read(|rec| batch.take(fabric, partial, Arrived::record(slot, rec)));
        if read.is_ok() {
            i += 1;
        } else {
            // A ring that breaks its format is dropped: what its writer sends is lost.
            Drops::count(&inbound.drops.malformed);
            rings.remove(i);
        }
    }
}

/// [`receive_as`] once something waits: takes in what waits on the socket and in the rings,
/// and delivers it. (Out of line, apart from the empty looks: `./ci.sh bench` counts it.)
#[inline(never)]
pub(super) fn receive_marked(
    inbound: &Inbound,
    rx: &mut Rx,
    fabric: &FabricInner,
    socket: bool,
    looking: bool,
) -> bool {
    let Rx { buf, partial, rings, last_qp, passed, kept, ready, multicast, xrc, deferred } = rx;
    // Ended in place (see `Batch::end`), never moved: a move copies it whole.
    let mut batch = std::mem::ManuallyDrop::new(Batch {
        ready,
        multicast,
        xrc,
        drops: Some(&inbound.drops),
        took: false,
        drv: None,
        owed: None,
        last_qp,
        passed,
        kept,
    });
    let mut rang = false;
    if socket {
        rang = take_datagrams(inbound, buf, rings, &mut |a| batch.take(fabric, partial, a));
    }
    if rings.iter().any(|(_, r)| r.unseen_views().is_some()) {
        // A peer passed us its shared memory, which messages in its ring may name: the
        // datagram that passes it waits on the socket, and is taken first, whichever thread
        // this is (one that polls takes messages in while the reader sleeps). A doorbell taken
        // with it is for records read just below, but the reader must still wake to ask for
        // the next (see below).
        let seen: Vec<_> =
            rings.iter().filter_map(|(_, r)| Some((r.clone(), r.unseen_views()?))).collect();
        rang |= take_datagrams(inbound, buf, rings, &mut |a| batch.take(fabric, partial, a));
        // Looked for, whether or not it came as it should: no look at the socket per poll.
        seen.iter().for_each(|(r, id)| r.saw_views(*id));
    }
    if rang && !is_reader() {
        // The doorbell was for the reader, asleep: its writer asks for no other until the
        // reader arms the ring again, which it does only once woken (qperf's event-mode tests
        // hung, the reader asleep, every message after one an application thread took unrung).
        // So was a ring: the reader, asleep on the socket, did not arm it, and its writer
        // would never ring (the socket's wake-up is lost to this thread's read of it).
        inbound.wake_reader();
    }
    if inbound.any_wanted.load(Ordering::Relaxed) {
        pass_wanted_views(inbound, fabric);
    }
    read_rings(inbound, fabric, rings, partial, &mut batch);
    match batch.owed.take() {
        Some(owed) if looking => {
            let ack = owed.into_ack();
            owe(rings, &ack, true);
            *deferred = Some(ack);
            inbound.ack_deferred.store(true, Ordering::Relaxed);
        }
        mut owed => OwedAck::pay(&mut owed),
    }
    inbound.has_rings.store(!rings.is_empty(), Ordering::Release);
    let took = batch.took;
    let delivering = batch.holds_any();
    if delivering {
        batch.deliver(fabric);
    }
    // Its records freed (delivered), the list's room serves the next receive.
    if !batch.kept.is_empty() {
        batch.kept.clear();
    }
    Batch::end(batch);
    delivering || took
}

/// Takes the datagrams waiting on the socket: rings offered to us (replacing, after reading
/// it out, the ring of a node that left the slot the offerer took), doorbells, and messages.
/// What a process of another user sent is dropped unread. Whether a doorbell or a ring was
/// among them: either is the reader's to act on (a ring it must arm before it sleeps).
fn take_datagrams(
    inbound: &Inbound,
    buf: &mut [u8],
    rings: &mut Vec<(u8, Arc<Ring>)>,
    take: &mut dyn FnMut(Arrived<'_>),
) -> bool {
    let mut rang = false;
    loop {
        let got = match crate::sys::recv_with_fd(inbound.sock.as_raw_fd(), buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return rang,
        };
        let Some(cred) = got.cred.filter(|c| c.uid == inbound.uid) else {
            Drops::count(&inbound.drops.foreign);
            continue;
        };
        let d = &buf[..got.len];
        match (d.get(4..6), got.fd) {
            (Some(&[src, flags]), Some(fd)) if flags & RING != 0 => {
                let from = PeerProcess::open(cred.pid).ok().map(Arc::new);
                let ring = match Ring::open(fd, from) {
                    Ok(ring) => Arc::new(ring),
                    Err(_) => {
                        Drops::count(&inbound.drops.rings);
                        continue;
                    }
                };
                if let Some(i) = rings.iter().position(|(s, _)| *s == src) {
                    // Another node's slot is taken over only once that node left it.
                    let old = &rings[i].1;
                    let same = old.sender().is_some_and(|p| p.pid() == cred.pid);
                    if !same && !old.abandoned() {
                        Drops::count(&inbound.drops.rings);
                        continue;
                    }
                    let (_, old) = rings.swap_remove(i);
                    let _ = old.read(|rec| take(Arrived::record(src, rec)));
                }
                inbound.gates.lock().push(ring.clone());
                rings.push((src, ring));
                rang = true;
            }
            (Some(&[src, flags]), Some(fd)) if flags & EXPORTS != 0 => {
                let from = PeerProcess::open(cred.pid).map(Arc::new);
                match (PeerExports::open(fd), from) {
                    (Ok(e), Ok(from)) => {
                        inbound.peer_exports.lock().insert(src, (Arc::new(e), from));
                    }
                    _ => Drops::count(&inbound.drops.rings),
                }
            }
            (Some(&[src, flags]), Some(fd)) if flags & SHARED != 0 => {
                // Mapped for the sender of the ring from that node, if it is the process
                // that passed it: its payloads name it (and are pulled until it is mapped).
                let from = ring_sender(rings, src, cred.pid);
                let view = d.get(HEADER..HEADER + 20).and_then(|b| {
                    let id = u32::from_le_bytes(b[..4].try_into().ok()?);
                    let base = u64::from_le_bytes(b[4..12].try_into().ok()?);
                    let len = usize::try_from(u64::from_le_bytes(b[12..].try_into().ok()?)).ok()?;
                    crate::shared_mem::SharedView::open(&fd, id, base, len).ok()
                });
                match (from, view) {
                    (Some(from), Some(view)) => {
                        // Written through too, by the WRITEs we carry out there.
                        let view = Arc::new(view);
                        if let Some(p) = exported_by(inbound, src, from) {
                            p.add_view(view.clone());
                        }
                        from.add_view(view);
                    }
                    _ => Drops::count(&inbound.drops.rings),
                }
            }
            (Some(&[src, flags]), _) if flags & RETIRED != 0 => {
                let from = ring_sender(rings, src, cred.pid);
                let id = d.get(HEADER..HEADER + 4).and_then(|b| b.try_into().ok());
                let id = id.map(u32::from_le_bytes);
                if let (Some(from), Some(id)) = (from, id) {
                    if let Some(p) = exported_by(inbound, src, from) {
                        p.drop_view(id);
                    }
                    from.drop_view(id);
                }
            }
            (Some(&[src, flags]), _) if flags & WANTED != 0 => {
                let id = d.get(HEADER..HEADER + 4).and_then(|b| b.try_into().ok());
                match id.map(u32::from_le_bytes) {
                    Some(id) => {
                        inbound.wanted.lock().push((src, cred.pid, id));
                        inbound.any_wanted.store(true, Ordering::Relaxed);
                    }
                    None => Drops::count(&inbound.drops.malformed),
                }
            }
            (Some(&[_, flags]), _) if flags & BELL != 0 => rang = true,
            (Some(&[_, flags]), _) if flags & (RING | EXPORTS | SHARED) != 0 => {}
            (Some(&[src, _]), _) => take(Arrived::Datagram(d, Source { slot: src, pid: cred.pid })),
            _ => Drops::count(&inbound.drops.malformed),
        }
    }
}

/// Passes our peers the views of our shared memory they asked for (see `Peer::want_view`),
/// where it is still there, to the process that asked.
#[cold]
fn pass_wanted_views(inbound: &Inbound, fabric: &FabricInner) {
    inbound.any_wanted.store(false, Ordering::Relaxed);
    let wanted = std::mem::take(&mut *inbound.wanted.lock());
    let Some(node) = fabric.node.get() else { return };
    for (slot, pid, id) in wanted {
        let peer = node.peers.lock().get(&slot).cloned();
        if let Some(peer) = peer.filter(|p| p.pid() == pid)
            && let Some(shared) = crate::shared_mem::find(id)
        {
            peer.offer_shared(&shared);
        }
    }
}

/// The process whose exports the node in `slot` passed us, if it is `from` (as a process,
/// and not the very same record of it).
fn exported_by(inbound: &Inbound, slot: u8, from: &Arc<PeerProcess>) -> Option<Arc<PeerProcess>> {
    let exported = inbound.peer_exports.lock().get(&slot).map(|(_, p)| p.clone())?;
    (exported.pid() == from.pid() && !Arc::ptr_eq(&exported, from)).then_some(exported)
}

/// The process that writes the ring from the node in `slot`, if it is process `pid` (the
/// sender of a datagram about that ring's payloads).
fn ring_sender(rings: &[(u8, Arc<Ring>)], slot: u8, pid: u32) -> Option<&Arc<PeerProcess>> {
    let ring = rings.iter().find(|(s, _)| *s == slot).map(|(_, r)| r)?;
    ring.sender().filter(|p| p.pid() == pid)
}

/// Takes down the ports the fabric's directory records down (see [`Node::record_port`]), as
/// a fabric joins: as on a host whose cable was pulled before the program started.
pub(crate) fn take_recorded_ports(fabric: &FabricInner, node: &Node) {
    for (dev, port) in node.ports_down() {
        apply(fabric, Control::PortState { dev, port, up: false }, None);
    }
}

/// Carries out a control message from another node (addressed to our QP `to`, if any), as
/// the local control API would.
pub(super) fn apply(fabric: &FabricInner, c: Control, to: Option<&crate::qp::QpShared>) {
    let dev_index = match c {
        Control::Event { dev, .. } | Control::PortState { dev, .. } => dev,
        Control::QpClosed { qpn } => {
            if let Some(qp) = to {
                let mut g = crate::sync::lock::lock_lent(&qp.inner);
                // Only if still connected to it (not since reconnected elsewhere).
                g.peer_closed |= g.attr.dest_qp_num == qpn;
            }
            return;
        }
    };
    let (Some(inner), Some(fabric)) =
        (fabric.devices.get(dev_index as usize), fabric.this.upgrade())
    else {
        return;
    };
    let dev = crate::Device { inner: inner.clone(), fabric };
    // Invalid requests were refused by the sender's own checks; nothing to report here.
    let _ = match c {
        Control::Event { port, event, .. } => {
            dev.raise_event(EventType(event), (port != 0).then_some(port))
        }
        Control::PortState { port, up, .. } => {
            let state = if up { crate::PortState::ACTIVE } else { crate::PortState::DOWN };
            dev.set_port_state(port, state)
        }
        Control::QpClosed { .. } => return,
    };
}

/// The node in `slot` is gone. An RC/UC QP connected to a QP there that was still open when
/// its process died goes to the error state, flushing its work requests (and, in the full
/// profile, raising `QP_FATAL`) instead of waiting or retrying into the void. A connection the
/// CM made ends as the kernel ends a dead process's: with a DREQ, which the CM reports as
/// `DISCONNECTED`, and nothing done to the QP, which its owner disconnects (a server whose
/// client died serves on, where a QP_FATAL would make many stop). A QP whose peer
/// was destroyed first is left as real hardware leaves it: its spare receives stay posted, and
/// send work still outstanding meets the retry timer (`RETRY_EXC_ERR`) as it would had the
/// peer process lived on. Flushing that work at once would fail a program that, as the
/// rdma-core examples do, posts one send more than its peer waits for and polls its last
/// completions while that extra send is still unacknowledged.
pub(super) fn peer_died(fabric: &FabricInner, slot: u8, incarnation: Option<u128>) {
    let by_cm = fabric.cm.peer_died(fabric, slot, incarnation);
    for qp in fabric.live_qps() {
        if !qp.qp_type.is_reliable() && qp.qp_type != QpType::UC {
            continue;
        }
        let mut g = crate::sync::lock::lock_lent(&qp.inner);
        let connected =
            matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE);
        // Connected to a newcomer in the slot, which lives.
        let [lo, hi] = g.peer_incarnation;
        let known = u128::from(hi) << 64 | u128::from(lo);
        let other = incarnation.is_some_and(|i| known != 0 && known != i);
        if !connected || slot_of(g.attr.dest_qp_num) != slot || g.peer_closed || other {
            continue;
        }
        // The event first: whoever sees a flushed completion finds the event queued too.
        if by_cm.contains(&qp.qpn) {
            continue;
        }
        if engine::raises_qp_errors(&qp) {
            qp.raise(EventType::QP_FATAL);
        }
        engine::enter_error(&qp, &mut g);
    }
}

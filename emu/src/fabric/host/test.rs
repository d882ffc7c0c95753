use super::*;
use crate::{
    Fabric, FabricConfig, QpState, RcParams, RecvWr, SendWr, Sge, WcStatus,
    engine::testkit::{Side, side},
};
use std::sync::RwLock;

/// Held (written) by a test, these keep every watcher of this process waiting: before it
/// looks at a slot's lock, or after it took it, before dealing with the death. A death
/// noticed late, as when the watcher's thread is not scheduled for a while.
pub(super) static WATCHERS_HELD: [RwLock<()>; 2] = [RwLock::new(()), RwLock::new(())];

#[test]
fn test_a_poller_locked_out_of_the_rings_yields_once_every_few_dozen_looks_in_a_row() {
    this_thread::looks::set(0);
    let yields = |n| (0..n).filter(|_| Looks::of_this_thread(Looks::missed)).count();
    assert_eq!(yields(Looks::LOCKED_OUT - 1), 0, "a short run does not yield");
    assert_eq!(yields(1), 1, "the run's last look yields");
    assert_eq!(yields(3 * Looks::LOCKED_OUT), 3, "a longer run yields every so many");
    assert_eq!(yields(Looks::LOCKED_OUT - 1), 0);
    Looks::of_this_thread(Looks::took);
    assert_eq!(yields(Looks::LOCKED_OUT - 1), 0, "a look that took the rings ended the run");
    assert_eq!(yields(1), 1);
}

/// Lagging peers are looked for once every few looks that took the rings.
#[test]
fn test_lagging_peers_are_due_a_look_once_every_few_looks() {
    let mut looks = Looks::default();
    let due = (0..10 * LAG_LOOKS).filter(|_| looks.took()).count();
    assert_eq!(due, 10);
}

/// A peer is named lagging once [`LAG`] has passed since a record of ours in its ring that
/// might be carried out was found unfreed, the oldest unbegun: never at the look that
/// first finds it, nor for a record its reader has freed since, nor while nothing is
/// written, nor for records that cannot be carried out (an ACK, a SEND).
#[test]
fn test_a_peer_is_named_lagging_for_a_record_left_unfreed_for_lag() {
    let ring = Arc::new(Ring::create(1 << 16, false).unwrap());
    let peer = Arc::new(Peer::new(PathBuf::from("/nonexistent"), 1, 0));
    peer.tx.lock().ring = Some(ring.clone());
    let peers = crate::sync::lock::Lock::new(FxHashMap::from_iter([(7u8, peer.clone())]));
    let mut watch = LagWatch::default();
    let mut named = || watch.lagging(&peers).len();
    let after_lag = || std::thread::sleep(LAG + Duration::from_micros(100));
    for _ in 0..2 {
        assert_eq!(named(), 0, "nothing written");
        after_lag();
    }
    assert_eq!(ring.write_marked(16, Marks::default(), |_| true), Written::Done);
    for _ in 0..2 {
        assert_eq!(named(), 0, "nothing to carry out");
        after_lag();
    }
    assert_eq!(ring.write(16, |_| true), Written::Done);
    assert_eq!(named(), 0, "first found: only noted");
    after_lag();
    // The flusher writes into the ring without the sender's lock: no look then.
    peer.tx.lock().flushing = true;
    assert_eq!(named(), 0, "the flusher at it");
    peer.tx.lock().flushing = false;
    assert_eq!(named(), 1, "unfreed and unbegun for LAG");
    ring.read(|rec| drop(rec)).unwrap();
    for _ in 0..2 {
        after_lag();
        assert_eq!(named(), 0, "freed");
    }
}

/// The engine tests' QP with its CQ and a page of memory, on a fabric's first device.
type End = Side;

fn end_on(f: &Fabric) -> End {
    side(&f.devices()[0])
}

/// What the tests below do with an end.
trait Talk {
    fn slot(&self) -> u8;
    fn next(&self) -> crate::Wc;
    fn send(&self, to: &End, word: u64);
    /// The first 8 bytes of its page, as a scatter list.
    fn word(&self) -> [Sge; 1];
}

impl Talk for End {
    fn slot(&self) -> u8 {
        slot_of(self.qp.qp_num())
    }

    fn next(&self) -> crate::Wc {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = self.cq.poll_one() {
                return wc;
            }
            assert!(Instant::now() < deadline, "no completion");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn word(&self) -> [Sge; 1] {
        [Sge { addr: self.mr.addr(), length: 8, lkey: self.mr.lkey() }]
    }

    /// Sends `word` to `to`, which takes it into its page: both completions succeed.
    fn send(&self, to: &End, word: u64) {
        let rsge = to.word();
        to.qp.post_recv(&RecvWr { wr_id: word, sg_list: &rsge }).unwrap();
        self.mr.write(0, &word.to_le_bytes()).unwrap();
        let sge = self.word();
        self.qp.post_send(&SendWr::send(word, &sge).signaled()).unwrap();
        assert_eq!(self.next().status, WcStatus::SUCCESS, "the send of {word}");
        let got = to.next();
        assert_eq!((got.status, got.wr_id), (WcStatus::SUCCESS, word));
        let mut bytes = [0; 8];
        to.mr.read(0, &mut bytes).unwrap();
        assert_eq!(u64::from_le_bytes(bytes), word);
    }
}

/// A process looks for lagging peers only once it has sent a request it might carry out
/// for one (a WRITE or READ): SENDs and their ACKs, both ways, make no such look.
#[test]
fn test_only_a_write_or_read_sent_makes_a_node_look_for_lagging_peers() {
    let (dir, (a, fa), (b, fb)) = talking("carriable", end_on);
    let looks = |f: &Fabric| f.0.node.get().unwrap().sent_carriable.load(Ordering::Relaxed);
    for word in 1..=4 {
        a.send(&b, word);
        b.send(&a, word + 100);
    }
    assert!(!looks(&fa) && !looks(&fb), "SENDs and ACKs only");
    let sge = a.word();
    let write = SendWr::write(9, &sge, b.mr.addr() + 64, b.mr.rkey()).signaled();
    a.qp.post_send(&write).unwrap();
    assert_eq!((a.next().wr_id, looks(&fa), looks(&fb)), (9, true, false));
    talk_and_part((a, fa), (b, fb), &dir);
}

/// The ACK an application thread's look owes goes with the reply its QP sends to the QP
/// it is for (a ping-pong's: no record of its own); one that no reply takes is sent at the
/// next look, or as the application arms its CQ to sleep.
#[test]
fn test_a_reply_carries_the_ack_and_an_ack_no_reply_takes_still_goes() {
    let (dir, (a, fa), (b, fb)) = talking("carried", end_on);
    let inbound = inbound_of(&fb);
    // B's reader, asleep, takes nothing in once woken: B's application thread does.
    let held = reader_held_asleep(inbound);
    let acks = || inbound.acks_sent.load(Ordering::Relaxed);
    let (ra, rb) = (a.word(), b.word());
    // A's SEND taken in by B's look, whose ACK it owes; A has no completion yet.
    let send = |word: u64| taken_in_by_look(&a, &b, inbound, word);
    let before = acks();
    send(10);
    assert!(a.cq.poll_one().is_none(), "completed before its ACK");
    // B's reply carries it: A completes its SEND, then takes the reply.
    a.qp.post_recv(&RecvWr { wr_id: 11, sg_list: &ra }).unwrap();
    b.qp.post_send(&SendWr::send(11, &rb).signaled()).unwrap();
    let (first, then) = (a.next(), a.next());
    assert_eq!(
        (first.wr_id, first.opcode, first.status),
        (10, crate::WcOpcode::SEND, WcStatus::SUCCESS)
    );
    assert_eq!(
        (then.wr_id, then.opcode, then.status),
        (11, crate::WcOpcode::RECV, WcStatus::SUCCESS)
    );
    assert_eq!(acks(), before, "the ACK went as a record of its own");
    assert!(inbound.rx.lock().deferred.is_none());
    // A's ACK of the reply, owed by A's look, goes once nothing carries it.
    assert_eq!(b.next().wr_id, 11);
    // One no reply takes: sent at B's next look (an empty poll).
    send(12);
    assert!(b.cq.poll_one().is_none());
    assert_eq!(acks(), before + 1);
    let sent = a.next();
    assert_eq!((sent.wr_id, sent.status), (12, WcStatus::SUCCESS));
    // Or as B arms its CQ to sleep on its event.
    send(13);
    b.cq.req_notify(false).unwrap();
    assert_eq!(acks(), before + 2);
    let sent = a.next();
    assert_eq!((sent.wr_id, sent.status), (13, WcStatus::SUCCESS));
    drop(held);
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A node that leaves with an ACK deferred sends it first: the peer's SEND completes, as
/// it did when the ACK went at once.
#[test]
fn test_an_ack_deferred_goes_before_its_node_leaves() {
    node_goes_owing_an_ack("deferred-exit", false);
}

/// A node whose process dies holding an ACK back (deferred by a look, not sent yet) has
/// its peer take the ACK in as the death is dealt with: the SEND it acknowledges
/// completes, as a NIC acknowledged it as it landed, whatever its process did next.
#[test]
fn test_an_ack_a_dead_node_held_back_completes_its_peers_send() {
    let _one = ONE_AT_A_TIME.lock();
    node_goes_owing_an_ack("deferred-death", true);
}

/// B takes A's SEND in by a look, owing its ACK; then B's node goes (if `dies`, as its
/// process would die there: the ACK never sent). A's SEND completes all the same.
fn node_goes_owing_an_ack(tag: &str, dies: bool) {
    let (dir, (a, fa), (b, fb)) = talking(tag, end_on);
    let inbound = inbound_of(&fb);
    let held = reader_held_asleep(inbound);
    taken_in_by_look(&a, &b, inbound, 20);
    if dies {
        let mut rx = inbound.rx.lock();
        assert!(rx.deferred.take().is_some());
        inbound.ack_deferred.store(false, Ordering::Relaxed);
    }
    assert!(a.cq.poll_one().is_none(), "completed before its ACK");
    drop(held);
    drop((b, fb));
    let sent = a.next();
    assert_eq!((sent.wr_id, sent.status), (20, WcStatus::SUCCESS));
    drop((a, fa));
    let _ = std::fs::remove_dir_all(dir);
}

/// An ACK deferred goes before a connection manager's message of its node (the peer
/// acts on a DREQ by flushing the sends the ACK completes) and before its QP's closing,
/// with nothing else to carry it (no look, no reply, the reader asleep).
#[test]
fn test_an_ack_deferred_goes_before_a_cm_message_and_its_qps_closing() {
    let (dir, (a, fa), (b, fb)) = talking("deferred-cm", end_on);
    let inbound = inbound_of(&fb);
    let held = reader_held_asleep(inbound);
    let acks = || inbound.acks_sent.load(Ordering::Relaxed);
    let send = |word: u64| taken_in_by_look(&a, &b, inbound, word);
    let before = acks();
    send(30);
    // A message A's connection manager does not understand: dropped there, after the ACK.
    fb.0.node.get().unwrap().send_cm(a.slot(), &[0xff; 4]);
    assert_eq!(acks(), before + 1, "the ACK went first");
    let sent = a.next();
    assert_eq!((sent.wr_id, sent.status), (30, WcStatus::SUCCESS));
    send(31);
    b.qp.destroy().unwrap();
    assert_eq!(acks(), before + 2, "the ACK went before the QP's closing");
    let sent = a.next();
    assert_eq!((sent.wr_id, sent.status), (31, WcStatus::SUCCESS));
    drop(held);
    drop((a, b, fa, fb));
    let _ = std::fs::remove_dir_all(dir);
}

/// The thread that holds `rx` as a CM message or a QP's closing goes (a reader kept off
/// its core in the middle of a batch, on a loaded host) is waited for: the ACK it pays
/// as it goes on goes first. (Not so where it was waited for 1,000 yields: `fi_pingpong`
/// over rxm had its `fin` flushed in CI.)
#[test]
fn test_an_ack_its_payer_is_slow_to_send_goes_before_a_cm_message_and_a_closing() {
    let (dir, (a, fa), (b, fb)) = talking("deferred-slow", end_on);
    let inbound = inbound_of(&fb);
    let node = fb.0.node.get().unwrap();
    let held = reader_held_asleep(inbound);
    let acks = || inbound.acks_sent.load(Ordering::Relaxed);
    // `close` goes once another thread took `rx`, which pays what is owed 100 ms later.
    let owed_then = |word: u64, close: &dyn Fn()| {
        taken_in_by_look(&a, &b, inbound, word);
        let before = acks();
        std::thread::scope(|s| {
            let (took, took_rx) = std::sync::mpsc::channel();
            s.spawn(move || {
                let mut rx = inbound.rx.lock();
                took.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                node.pay_deferred(&mut rx);
            });
            took_rx.recv().unwrap();
            close();
            assert_eq!(acks(), before + 1, "the ACK of {word} went first");
        });
        let sent = a.next();
        assert_eq!((sent.wr_id, sent.status), (word, WcStatus::SUCCESS));
    };
    owed_then(40, &|| node.send_cm(a.slot(), &[0xff; 4]));
    owed_then(41, &|| b.qp.destroy().unwrap());
    drop(held);
    drop((a, b, fa, fb));
    let _ = std::fs::remove_dir_all(dir);
}

/// A's SEND of `word` to B, taken in by B's look (B's reader held asleep, see
/// `reader_held_asleep`), whose ACK B then owes.
fn taken_in_by_look(a: &End, b: &End, inbound: &Inbound, word: u64) {
    b.qp.post_recv(&RecvWr { wr_id: word, sg_list: &b.word() }).unwrap();
    a.qp.post_send(&SendWr::send(word, &a.word()).signaled()).unwrap();
    let got = b.next();
    assert_eq!((got.status, got.wr_id), (WcStatus::SUCCESS, word));
    assert!(inbound.rx.lock().deferred.is_some(), "the ACK of {word} owed");
}

/// Once the peer takes in again: what follows is taken in, in order, both ways, and both
/// QPs are still in RTS; then the fabrics and their directory go.
fn talk_and_part((a, fa): (End, Fabric), (b, fb): (End, Fabric), dir: &std::path::Path) {
    a.send(&b, 5);
    b.send(&a, 6);
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::RTS, QpState::RTS));
    drop((a, b, fa, fb));
    let _ = std::fs::remove_dir_all(dir);
}

fn connected(a: &End, b: &End) {
    let p = RcParams::default();
    a.qp.connect(0, &b.qp.endpoint(0), &p).unwrap();
    b.qp.connect(0, &a.qp.endpoint(0), &p).unwrap();
}

fn host_dir(tag: &str) -> (std::path::PathBuf, FabricConfig) {
    let dir = std::env::temp_dir().join(format!("rdma-emu-watch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let host = Some(dir.to_str().unwrap().to_owned());
    (dir, FabricConfig { host, ..Default::default() })
}

/// Two fabrics joined by a host fabric in a directory of their own (`tag`), an end on
/// each (made by `end`), connected, and one message each way (which passes the rings and
/// each one's exports).
fn talking(
    tag: &str,
    end: impl Fn(&Fabric) -> End,
) -> (std::path::PathBuf, (End, Fabric), (End, Fabric)) {
    talking_with(tag, |_| {}, end)
}

/// [`talking`], the fabrics configured as `config` says.
fn talking_with(
    tag: &str,
    config: impl FnOnce(&mut FabricConfig),
    end: impl Fn(&Fabric) -> End,
) -> (std::path::PathBuf, (End, Fabric), (End, Fabric)) {
    let (dir, mut cfg) = host_dir(tag);
    config(&mut cfg);
    let (fa, fb) = (Fabric::new(cfg.clone()), Fabric::new(cfg));
    let (a, b) = (end(&fa), end(&fb));
    connected(&a, &b);
    a.send(&b, 1);
    b.send(&a, 2);
    (dir, (a, fa), (b, fb))
}

/// Waits (a bounded guard) until the reader of `inbound` sleeps: every ring it reads
/// armed, nobody receiving.
fn until_reader_asleep(inbound: &Inbound) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let asleep = |rx: &Rx| !rx.rings.is_empty() && rx.rings.iter().all(|(_, r)| r.armed());
    while !inbound.rx.try_lock().is_some_and(|rx| asleep(&rx)) {
        assert!(Instant::now() < deadline, "the reader never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The receiving side of `f`'s node.
fn inbound_of(f: &Fabric) -> &Inbound {
    &f.0.node.get().unwrap().inbound
}

/// Holds the reader of `inbound` once it sleeps: woken, it takes nothing in until the guard
/// goes.
fn reader_held_asleep(inbound: &Inbound) -> crate::sync::RwLockWriteGuard<'_, ()> {
    until_reader_asleep(inbound);
    inbound.reader_held.write()
}

/// Watchers are held one at a time (the tests below would hold each other's).
static ONE_AT_A_TIME: crate::sync::Mutex<()> = crate::sync::Mutex::new(());

/// Whether the lock of `slot` in `dir` is free of its owner, and held (shared) by a
/// watcher: with `shared`, or free of both.
fn lock_is(dir: &std::path::Path, slot: u8, shared: bool) -> bool {
    let open = || std::fs::File::open(dir.join(lock_name(slot))).unwrap();
    open().try_lock_shared().is_ok() && open().try_lock().is_err() == shared
}

/// Waits (a bounded guard) until the node of `f` has dealt with the death of the node in
/// `slot`: it has forgotten it as a peer.
fn until_forgotten(f: &Fabric, slot: u8) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.0.node.get().unwrap().peers.lock().contains_key(&slot) {
        assert!(Instant::now() < deadline, "the death in slot {slot} was never dealt with");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits (a bounded guard) until `end`'s QP was failed by its peer's death.
fn until_failed(end: &End) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while end.qp.state() != QpState::ERR {
        assert!(Instant::now() < deadline, "the death of its peer never failed the QP");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A survivor talking to a node that then dies while this process's watchers are held
/// at `gate`; then a newcomer joins and talks to the survivor. `check` is given the
/// survivor's fabric, its QPs to the dead node and to the newcomer, the newcomer's, and the
/// dead node's slot. At the end the newcomer dies too, and is forgotten.
fn death_noticed_late(tag: &str, gate: usize, check: impl FnOnce(&Fabric, [&End; 3], u8)) {
    let _one = ONE_AT_A_TIME.lock();
    let (dir, cfg) = host_dir(tag);
    let (fs, fa) = (Fabric::new(cfg.clone()), Fabric::new(cfg.clone()));
    let (s1, a) = (end_on(&fs), end_on(&fa));
    // Before the watchers start (as QPs connect): one already waiting for the lock
    // would not be held before it.
    let held = WATCHERS_HELD[gate].write().unwrap();
    connected(&s1, &a);
    s1.send(&a, 1);
    a.send(&s1, 2);
    let dead = a.slot();
    drop((a, fa));
    // The node goes with the fabric's last reference, which a thread of it may hold for
    // a moment; then (at the second gate) the watcher takes the lock.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lock_is(&dir, dead, gate == 1) {
        assert!(Instant::now() < deadline, "the dead node's slot lock never came free");
        std::thread::sleep(Duration::from_millis(1));
    }
    // As if its process had been killed: the close its QP sent as it went is forgotten
    // (a QP whose peer closed is not failed by the death).
    let parted = || s1.qp.0.inner.lock().peer_closed;
    while !parted() {
        assert!(Instant::now() < deadline, "the dead node's QP never parted");
        std::thread::sleep(Duration::from_millis(1));
    }
    s1.qp.0.inner.lock().peer_closed = false;
    let fb = Fabric::new(cfg);
    let (s2, b) = (end_on(&fs), end_on(&fb));
    connected(&s2, &b);
    s2.send(&b, 3);
    b.send(&s2, 4);
    drop(held);
    check(&fs, [&s1, &s2, &b], dead);
    let newcomer = b.slot();
    drop((b, fb));
    until_forgotten(&fs, newcomer);
    drop((s1, s2, fs));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_a_newcomer_in_the_slot_of_a_node_that_died_unnoticed_is_a_new_peer() {
    // Held before the lock: the newcomer takes the dead node's slot (and has been sent to
    // through a ring of its own, not the one the dead node left).
    death_noticed_late("before", 0, |_, [s1, s2, b], dead| {
        assert_eq!(b.slot(), dead, "the newcomer took the free slot");
        // The watcher came to the slot after the newcomer took it: it sees the death all
        // the same (not only at the newcomer's), and fails the QP connected to the dead
        // node alone.
        until_failed(s1);
        s2.send(b, 5);
        b.send(s2, 6);
        assert_eq!(s2.qp.state(), QpState::RTS);
    });
}

#[test]
fn test_a_joining_node_removes_the_lives_of_dead_nodes_and_no_other() {
    let (dir, cfg) = host_dir("lives");
    let fa = Fabric::new(cfg.clone());
    let a = fa.0.joined().unwrap().unwrap();
    // A node killed (its life's lock free), and one in the middle of joining elsewhere.
    let dead = dir.join(life_name(7));
    std::fs::write(&dead, "").unwrap();
    let joining = std::fs::File::create(dir.join(life_name(8))).unwrap();
    joining.try_lock().unwrap();
    let fb = Fabric::new(cfg);
    let b = fb.0.joined().unwrap().unwrap();
    assert!(!dead.exists(), "a dead node's life is swept");
    for n in [a, b] {
        assert!(dir.join(life_name(n.incarnation)).exists(), "a live node's stays");
    }
    assert!(dir.join(life_name(8)).exists(), "a locked life stays");
    let names =
        std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok());
    let hidden: Vec<String> = names.filter(|n| n.starts_with('.')).collect();
    assert!(hidden.is_empty(), "no life left under its hidden name: {hidden:?}");
    drop((fa, fb, joining));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_a_connection_request_a_dying_node_never_took_in_is_rejected() {
    use crate::cm::{CmChannel, CmEventType as E, CmId, ConnParam, PortSpace};
    let (dir, cfg) = host_dir("unanswered");
    let addresses = crate::cm::addr::PortAddress::parse_list("127.0.0.2=emu1").unwrap();
    let cfg = FabricConfig { addresses, ..cfg };
    let (fa, fb) = (Fabric::new(cfg.clone()), Fabric::new(cfg));
    let at: std::net::SocketAddr = "127.0.0.2:7612".parse().unwrap();
    let sch = CmChannel::new(&fa).unwrap();
    let server = CmId::create(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(at).unwrap();
    server.listen(1).unwrap();
    let next = |ch: &CmChannel, want: E| {
        let ev = ch.get_event().unwrap();
        assert_eq!(ev.event, want, "status {}", ev.status);
        ev
    };
    let cch = CmChannel::new(&fb).unwrap();
    let client = CmId::create(&cch, PortSpace::Tcp).unwrap();
    client.resolve_addr(None, at, 2000).unwrap();
    next(&cch, E::AddrResolved);
    client.resolve_route(2000).unwrap();
    next(&cch, E::RouteResolved);
    // The listener's node takes nothing in from now on, and goes with the request in its
    // ring: nothing there will ever answer it.
    let inbound = fa.0.node.get().unwrap().inbound.clone();
    let held = inbound.reader_held.write();
    client.connect(&ConnParam::default()).unwrap();
    drop((server, sch, fa));
    cch.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let ev = loop {
        if let Ok(ev) = cch.get_event() {
            break ev;
        }
        assert!(Instant::now() < deadline, "the request was never answered");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!((ev.event, ev.status), (E::Rejected, crate::cm::REJ_CONSUMER_DEFINED));
    drop(held);
    drop((client, cch, fb));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_a_slot_stays_taken_until_the_death_of_its_node_is_dealt_with() {
    // Held after taking the lock: the slot stays taken until the death is dealt with, so
    // the newcomer takes another, and its QPs live on once it was.
    death_noticed_late("after", 1, |fs, [s1, s2, b], dead| {
        assert_ne!(b.slot(), dead, "a slot whose death is being dealt with stays taken");
        until_forgotten(fs, dead);
        until_failed(s1);
        s2.send(b, 5);
        b.send(s2, 6);
        assert_eq!(s2.qp.state(), QpState::RTS);
    });
}

/// A peer process that has not taken in what it was sent (its threads not scheduled on a
/// loaded machine: here its rings' lock is held) is waited for, as a NIC would answer for
/// it, not timed out: the SEND (which needs the peer's receive queue, so its requester
/// cannot carry it out) completes once the peer takes it in, however many of the sender's
/// timeouts passed meanwhile (a pingpong pair under Valgrind on a busy CI machine failed
/// with RETRY_EXC_ERR without this).
#[test]
fn test_a_peer_behind_on_what_it_was_sent_is_waited_for_not_timed_out() {
    let (dir, cfg) = host_dir("behind");
    let (fa, fb) = (Fabric::new(cfg.clone()), Fabric::new(cfg));
    let (a, b) = (end_on(&fa), end_on(&fb));
    // About 4 ms per timeout and the most retries: ~33 ms before the SEND would fail
    // without the wait, and as long for the peer to answer once it takes the SEND in (a
    // budget of 2 ms failed once on a loaded machine under AddressSanitizer).
    let p = RcParams { timeout: 10, retry_cnt: 7, ..Default::default() };
    a.qp.connect(0, &b.qp.endpoint(0), &p).unwrap();
    b.qp.connect(0, &a.qp.endpoint(0), &p).unwrap();
    a.send(&b, 1);
    let held = inbound_of(&fb).rx.lock();
    let rsge = b.word();
    b.qp.post_recv(&RecvWr { wr_id: 2, sg_list: &rsge }).unwrap();
    let sge = a.word();
    a.qp.post_send(&SendWr::send(2, &sge).signaled()).unwrap();
    // Twenty-four of its timeouts pass with the SEND unread in the peer's ring, the
    // requester polling all along.
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        assert_eq!(a.cq.poll_one(), None);
    }
    assert_eq!(a.qp.state(), QpState::RTS);
    drop(held);
    let wc = a.next();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::SUCCESS));
    assert_eq!((b.next().wr_id, b.qp.state()), (2, QpState::RTS));
    drop((a, b, fa, fb));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A requester that polls its CQ while its peer's process takes nothing in (its reader
/// not scheduled while its application thread spins on memory for the very WRITE: here
/// its rings' lock is held) carries its WRITEs and READs out itself: they complete, the
/// WRITE's bytes are in the peer's memory and the READ brings the peer's, before the peer
/// took anything in. Once the peer does, it only accounts for them: the SEND behind them
/// is taken in order, and both QPs stay in RTS.
#[test]
fn test_a_polling_requester_carries_out_what_a_peer_not_taking_in_waits_for() {
    let (dir, (a, fa), (b, fb)) = talking("lagging", end_on);
    let held = inbound_of(&fb).rx.lock();
    a.mr.write(64, b"landed!!").unwrap();
    b.mr.write(128, b"read me.").unwrap();
    let sge = |at: u64| Sge { addr: a.mr.addr() + at, length: 8, lkey: a.mr.lkey() };
    let (from, into) = ([sge(64)], [sge(256)]);
    let write = SendWr::write(3, &from, b.mr.addr() + 64, b.mr.rkey()).signaled();
    a.qp.post_send(&write).unwrap();
    let read = SendWr::read(4, &into, b.mr.addr() + 128, b.mr.rkey()).signaled();
    a.qp.post_send(&read).unwrap();
    // A stream behind them, each to a place of its own.
    let words: Vec<[u8; 8]> = (0..12u64).map(|i| (i * 0x0101_0101 + 7).to_le_bytes()).collect();
    for (i, w) in words.iter().enumerate() {
        let at = 512 + 8 * i as u64;
        a.mr.write(at as usize, w).unwrap();
        let piece = [sge(at)];
        let wr = SendWr::write(10 + i as u64, &piece, b.mr.addr() + at, b.mr.rkey());
        a.qp.post_send(&wr.signaled()).unwrap();
    }
    for id in [3, 4].into_iter().chain(10..22) {
        let wc = a.next();
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::SUCCESS));
    }
    let mut got = [0u8; 8];
    b.mr.read(64, &mut got).unwrap();
    assert_eq!(&got, b"landed!!");
    a.mr.read(256, &mut got).unwrap();
    assert_eq!(&got, b"read me.");
    for (i, w) in words.iter().enumerate() {
        b.mr.read(512 + 8 * i, &mut got).unwrap();
        assert_eq!(&got, w, "WRITE {i}");
    }
    // The peer still holds both in its ring, unbegun.
    assert!(fa.0.node.get().unwrap().behind(b.slot()));
    drop(held);
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A WRITE sent alone to a peer whose reader naps on its application's looks (which a
/// thread spinning on memory for the WRITE to land does not make: qperf's
/// `rc_rdma_write_poll_lat`) lands as it is posted, no thread of the peer taking anything
/// in: its requester carries it out (the memory not shared: by system call) and it
/// completes then. The peer accounts for it later; both QPs stay in RTS.
#[test]
fn test_a_write_alone_lands_as_posted_while_the_peers_reader_naps_on_looks() {
    let unshared = |c: &mut FabricConfig| c.share_mr = false;
    let (dir, (a, fa), (b, fb)) = talking_with("napping", unshared, end_on);
    // Held here, B's rings are taken in by nobody; napped on, as the reader does.
    until_reader_asleep(inbound_of(&fb));
    let rx = inbound_of(&fb).rx.lock();
    rx.rings.iter().for_each(|(_, r)| assert!(!r.delegate(), "nothing waits"));
    for (i, word) in [b"landed!!", b"and this"].into_iter().enumerate() {
        a.mr.write(64, word).unwrap();
        let from = [Sge { addr: a.mr.addr() + 64, length: 8, lkey: a.mr.lkey() }];
        let wr = SendWr::write(i as u64, &from, b.mr.addr() + 64, b.mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        let mut got = [0u8; 8];
        b.mr.read(64, &mut got).unwrap();
        assert_eq!(&got, word, "landed as posted");
        let wc = a.cq.poll_one().expect("completed as posted");
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::SUCCESS));
    }
    assert!(rx.rings.iter().all(|(_, r)| r.delegated()), "no bell rung");
    // As the reader may have left them, asleep (napped on, it looks again in a while).
    rx.rings.iter().for_each(|(_, r)| {
        r.arm();
    });
    drop(rx);
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A UC end on `f` whose MR of `len` bytes takes WRITEs.
fn uc_end(f: &Fabric, len: usize) -> End {
    let ctx = f.devices()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let access = crate::AccessFlags::LOCAL_WRITE | crate::AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(len, access).unwrap();
    let cap = crate::QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&crate::QpInitAttr::new(crate::QpType::UC, &cq, cap)).unwrap();
    End { qp, mr, cq }
}

/// A UC WRITE of several ring records (qperf's `uc_rdma_write_poll_lat` and perftest's
/// `ib_write_lat -c UC` of 64 KiB) sent to a peer whose reader is asleep, or naps on its
/// application's looks, lands as it is posted, no thread of the peer taking anything in:
/// its requester carries it out ahead, without sending it (the memory not shared: by system
/// call), and it is complete then. What follows still goes and lands: the peer's responder
/// takes the next PSN that comes.
#[test]
fn test_a_uc_write_of_several_records_lands_as_posted_while_the_peers_reader_is_away() {
    const LEN: usize = 100 * 1024;
    let unshared = |c: &mut FabricConfig| c.share_mr = false;
    let (dir, (a, fa), (b, fb)) = talking_with("ahead", unshared, |f| uc_end(f, LEN));
    // Held here, B's rings are taken in by nobody: asleep as the reader left them, then
    // napped on, as the reader does.
    until_reader_asleep(inbound_of(&fb));
    let rx = inbound_of(&fb).rx.lock();
    for nap in [false, true] {
        if nap {
            rx.rings.iter().for_each(|(_, r)| assert!(!r.delegate(), "nothing waits"));
        }
        // Not one of a stream (see `absent_peer::carry_out_ahead`).
        std::thread::sleep(Duration::from_millis(1));
        let bytes: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251 + usize::from(nap)) as u8).collect();
        a.mr.write(0, &bytes).unwrap();
        let from = [Sge { addr: a.mr.addr(), length: LEN as u32, lkey: a.mr.lkey() }];
        let wr = SendWr::write(7, &from, b.mr.addr(), b.mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        let mut got = vec![0u8; LEN];
        b.mr.read(0, &mut got).unwrap();
        assert!(got == bytes, "nap {nap}: landed as posted");
        let wc = a.cq.poll_one().expect("complete as posted");
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::SUCCESS));
        let left = |r: &Ring| (if nap { r.delegated() } else { r.asleep() }, r.nothing_to_read());
        assert!(rx.rings.iter().all(|(_, r)| left(r) == (true, true)), "nap {nap}: not sent");
    }
    // As the reader may have left them, asleep (napped on, it looks again in a while).
    rx.rings.iter().for_each(|(_, r)| {
        r.arm();
    });
    drop(rx);
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A UC WRITE posted right after a SEND that the peer took in but has not delivered yet
/// (its QP busy: the SEND's packet waits for the batch's end) is not carried out ahead of
/// it: the SEND's record stays in the ring until delivered. An application that SENDs and
/// then WRITEs a flag finds the SEND's completion once it sees the flag.
#[test]
fn test_a_uc_write_is_not_carried_out_ahead_of_a_send_taken_in_but_not_delivered() {
    const LEN: usize = 100 * 1024;
    let unshared = |c: &mut FabricConfig| c.share_mr = false;
    let (dir, (a, fa), (b, fb)) = talking_with("behind-send", unshared, |f| uc_end(f, LEN));
    let inbound = inbound_of(&fb);
    // B's reader takes nothing in; its rings are napped on, as the reader does.
    let held = reader_held_asleep(inbound);
    inbound.rx.lock().rings.iter().for_each(|(_, r)| assert!(!r.delegate(), "nothing waits"));
    b.qp.post_recv(&RecvWr { wr_id: 3, sg_list: &b.word() }).unwrap();
    a.qp.post_send(&SendWr::send(3, &a.word()).signaled()).unwrap();
    let bytes: Vec<u8> = (0..LEN).map(|i| (i * 13 + i / 509) as u8).collect();
    std::thread::scope(|s| {
        // B's QP is busy: a look takes the SEND in and waits to deliver it.
        let busy = b.qp.0.inner.lock();
        let look = s.spawn(|| receive(inbound, &mut inbound.rx.lock(), &fb.0, false));
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.qp.0.inbox.is_empty() {
            assert!(Instant::now() < deadline, "the SEND was never taken in");
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(1));
        a.mr.write(0, &bytes).unwrap();
        let from = [Sge { addr: a.mr.addr(), length: LEN as u32, lkey: a.mr.lkey() }];
        let wr = SendWr::write(4, &from, b.mr.addr(), b.mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        let mut got = vec![0u8; LEN];
        b.mr.read(0, &mut got).unwrap();
        assert!(got != bytes, "the WRITE landed before the SEND was delivered");
        drop(busy);
        assert!(look.join().unwrap());
    });
    let wc = b.next();
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (3, WcStatus::SUCCESS, crate::WcOpcode::RECV));
    for id in [3, 4] {
        let wc = a.next();
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::SUCCESS));
    }
    drop(held);
    // A SEND behind the WRITE: once B has it, the WRITE landed (B's memory is read only
    // then: not while B's reader writes it). The SEND's word is B's first 8 bytes.
    a.send(&b, 5);
    let mut got = vec![0u8; LEN];
    b.mr.read(0, &mut got).unwrap();
    assert!(got[8..] == bytes[8..], "the WRITE landed");
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A doorbell that an application thread takes off the socket (it does so to take a peer's
/// shared memory before the ring records that name it) is passed on to the reader, whom it
/// was for: the ring's writer asks for no other until the reader, woken, asks again.
#[test]
fn test_a_doorbell_an_application_thread_takes_is_passed_on_to_the_reader() {
    let (dir, (a, fa), (b, fb)) = talking("bell-passed", end_on);
    let inbound = inbound_of(&fb);
    until_reader_asleep(inbound);
    // The reader, asleep on the socket, wakes and ends without reading it: from here on
    // only this thread takes datagrams off B's socket.
    inbound.quit.store(true, Ordering::Release);
    inbound.wake_reader();
    let mut buf = vec![0u8; HEADER + FRAGMENT];
    let mut bells = || {
        let mut n = 0;
        while let Ok(got) = crate::sys::recv_with_fd(inbound.sock.as_raw_fd(), &mut buf) {
            n += usize::from(buf[..got.len].get(5).is_some_and(|f| f & BELL != 0));
        }
        n
    };
    assert_eq!(bells(), 1, "the reader was rung to end");
    // A's writer passes shared memory, writes, finds B's reader asked to be rung: rings.
    let mut rx = inbound.rx.lock();
    let (from_a, ring) = rx.rings[0].clone();
    ring.offer_view(1);
    ring_bell(&mut None, &inbound.path, from_a);
    receive(inbound, &mut rx, &fb.0, false);
    assert_eq!(ring.unseen_views(), None, "the datagrams were taken");
    drop(rx);
    assert_eq!(bells(), 1, "the doorbell was not passed on to the reader");
    drop((a, b, fa, fb));
    let _ = std::fs::remove_dir_all(dir);
}

/// A reader napping while an application thread polls takes the rings at none of its
/// naps' ends while that thread polls on: held by this thread (as by a poller preempted
/// on the reader's core), they are not waited for, each nap ending in another (three in a
/// row here). Once nobody polls, the reader takes them again.
#[test]
fn test_a_reader_napping_while_its_rings_are_polled_leaves_them_to_the_poller() {
    let (dir, (a, fa), (b, fb)) = talking("polled-nap", end_on);
    let inbound = inbound_of(&fb);
    let disarmed = |rx: &Rx| rx.rings.iter().all(|(_, r)| !r.armed());
    // Whether, the rings held, the reader ends three naps without waiting for them (each
    // nap's end takes the mark of a look, set again here at once). One that found no look
    // marked (this thread descheduled for a nap's length) waits for them: tried again, as
    // often as a loaded machine needs (a reader that waits for them at every nap's end
    // fails every try).
    let rung = || crate::sys::wait_readable(inbound.sock.as_raw_fd(), Some(Duration::ZERO));
    let naps_without_the_rings = || {
        // Woken (if asleep, armed, from an attempt before), it finds the rings polled.
        assert!(b.cq.poll_one().is_none());
        inbound.wake_reader();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut woken = Instant::now();
        loop {
            assert!(b.cq.poll_one().is_none());
            // One that found no look marked (this thread descheduled) sleeps: woken again.
            if woken.elapsed() > Duration::from_millis(50) {
                inbound.wake_reader();
                woken = Instant::now();
            }
            // Napping on the polls, its bell taken.
            let napping = inbound.napping.load(Ordering::SeqCst) && !rung().unwrap();
            if napping && inbound.rx.try_lock().is_some_and(|rx| disarmed(&rx)) {
                break;
            }
            assert!(Instant::now() < deadline, "the reader never napped on the polls");
        }
        inbound.polled.store(true, Ordering::Relaxed);
        let held = inbound.rx.lock();
        // (Long beside 1 ms naps: on a loaded machine the reader waits its turn for a core;
        // one that waits for the rings ends no nap while they are held, however long.)
        let (mut naps, until) = (0, Instant::now() + Duration::from_secs(2));
        while naps < 3 && Instant::now() < until {
            if !inbound.polled.load(Ordering::Relaxed) {
                naps += 1;
                inbound.polled.store(true, Ordering::Relaxed);
            }
            std::thread::yield_now();
        }
        drop(held);
        naps == 3
    };
    let left = (0..20).any(|_| naps_without_the_rings());
    assert!(left, "the reader waited for the rings at the end of a nap on polls");
    talk_and_part((a, fa), (b, fb), &dir);
}

/// The emulator's own buffers that peers reach (an rsocket's ring and send buffer) move
/// into shared memory on a host fabric as an application's do, and whole: their storage is
/// page-aligned, so no partial page at either end is left for a peer to copy by system
/// calls. Without a host fabric they stay where they are.
#[test]
fn test_the_emulators_own_buffers_move_into_shared_memory_whole() {
    let (dir, cfg) = host_dir("own-buffers");
    let hosted = Fabric::new(cfg);
    let alone = Fabric::new(FabricConfig::default());
    use crate::AccessFlags;
    let writable = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    for (f, shares) in [(&hosted, true), (&alone, false)] {
        let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
        for (len, access) in [(128 * 1024 + 100, AccessFlags::LOCAL_WRITE), (4096 + 8, writable)] {
            let mr = crate::Mr::register_owned_for_peers(&pd, len, access).unwrap();
            let inner = mr.snapshot();
            let r = &inner.region;
            let whole = r.shared_in(0, len).is_some_and(|s| s.covers(r.host_addr(), len));
            assert_eq!(whole, shares, "{len} bytes, host fabric: {shares}");
        }
    }
    drop(hosted);
    let _ = std::fs::remove_dir_all(dir);
}

/// The reader's watch after traffic shrinks while it finds nothing, to a floor, and is
/// whole again once it finds a record: a stream keeps it, sparse requests wear it down.
#[test]
fn test_the_readers_watch_wears_down_in_vain_and_is_restored_by_a_find() {
    let mut w = READER_SPIN;
    let mut seen = vec![w];
    for _ in 0..6 {
        w = next_watch(w, false);
        seen.push(w);
    }
    assert!(seen.windows(2).all(|p| p[1] <= p[0] / 2 || p[1] == READER_SPIN_MIN), "{seen:?}");
    assert_eq!(w, READER_SPIN_MIN, "{seen:?}");
    assert_eq!(next_watch(READER_SPIN_MIN, false), READER_SPIN_MIN);
    assert_eq!(next_watch(w, true), READER_SPIN);
}

/// What a node's reader takes in for is left with nobody's bias (the QPs it delivered to,
/// the producers' end of their CQs; nor is the ring's lock kept), so that the thread
/// that then polls and posts owns each, by its bias, and revokes none: every QP a round
/// of the reader delivered to, not only the last.
#[test]
fn test_a_reader_leaves_the_biases_of_what_it_took_in_to_the_application() {
    let (dir, (a, fa), (b, fb)) = talking("reader-bias", end_on);
    let (a2, b2) = (end_on(&fa), end_on(&fb));
    let (a3, b3) = (end_on(&fa), end_on(&fb));
    connected(&a2, &b2);
    connected(&a3, &b3);
    let (rsge, rsge3) = (b2.word(), b3.word());
    b2.qp.post_recv(&RecvWr { wr_id: 7, sg_list: &rsge }).unwrap();
    b3.qp.post_recv(&RecvWr { wr_id: 9, sg_list: &rsge3 }).unwrap();
    let inbound = inbound_of(&fb);
    // Nobody polls b2's nor b3's CQ: b's reader takes both SENDs in, in one round.
    let held = reader_held_asleep(inbound);
    let (sge, sge3) = (a2.word(), a3.word());
    a2.qp.post_send(&SendWr::send(1, &sge).signaled()).unwrap();
    a3.qp.post_send(&SendWr::send(3, &sge3).signaled()).unwrap();
    drop(held);
    assert_eq!(a2.next().status, WcStatus::SUCCESS, "acknowledged: b took it in");
    assert_eq!(a3.next().status, WcStatus::SUCCESS, "acknowledged: b took it in");
    let left = || {
        // The ring's bias may be this thread's, or revoked: this thread polled b's CQ as
        // the fabrics first talked, and took in what it found in the ring then, which the
        // reader may have revoked as it read the ring next. It is not the reader's.
        let rings_free = inbound
            .rx
            .try_lock()
            .is_some_and(|rx| rx.rings.iter().all(|(_, r)| !r.reading_bias_others()));
        rings_free
            && [&b2, &b3]
                .iter()
                .all(|e| crate::sync::lock::bias_nobodys(&e.qp.0.inner) && e.cq.0.producer_bias().0)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !left() {
        // Which is kept, should one be: the rings' locks, the QPs', the CQs' producers'.
        let kept = || {
            let rx = inbound.rx.try_lock();
            let rings = rx.map(|rx| {
                rx.rings.iter().map(|(_, r)| !r.reading_bias_others()).collect::<Vec<_>>()
            });
            let qps = [&b2, &b3].map(|e| crate::sync::lock::bias_nobodys(&e.qp.0.inner));
            let cqs = [&b2, &b3].map(|e| e.cq.0.producer_bias());
            format!("rings {rings:?}, QPs {qps:?}, CQs {cqs:?}")
        };
        assert!(Instant::now() < deadline, "the reader kept a bias of what it took in: {}", kept());
        std::thread::sleep(Duration::from_millis(1));
    }
    // This thread then owns what it polls and posts to, none revoked.
    assert_eq!(b2.next().wr_id, 7);
    assert_eq!(b3.next().wr_id, 9);
    b2.qp.post_recv(&RecvWr { wr_id: 8, sg_list: &rsge }).unwrap();
    a2.qp.post_send(&SendWr::send(2, &sge).signaled()).unwrap();
    assert_eq!(a2.next().status, WcStatus::SUCCESS);
    assert_eq!(b2.next().wr_id, 8);
    // Taken in by this thread's poll or by the reader again: never revoked.
    let (nobodys, ours) = b2.cq.0.producer_bias();
    assert!(nobodys || ours, "the completions' end is nobody's or ours");
    drop((a2, b2, a3, b3));
    talk_and_part((a, fa), (b, fb), &dir);
}

/// Before any peer's ring is attached, a thread polling takes in what waits on the socket
/// itself: with both readers kept from taking anything in, the rings the QPs' connecting
/// passed over the socket, a SEND in one and its ACK in the other are taken in by the
/// threads polling each side's CQ.
#[test]
fn test_a_poller_takes_in_the_rings_first_offered_while_the_reader_is_kept_from_them() {
    let (dir, cfg) = host_dir("first-rings");
    let (fa, fb) = (Fabric::new(cfg.clone()), Fabric::new(cfg));
    let (a, b) = (end_on(&fa), end_on(&fb));
    // Held before the QPs connect, which passes the rings.
    let held = (inbound_of(&fa).reader_held.write(), inbound_of(&fb).reader_held.write());
    connected(&a, &b);
    assert!(!inbound_of(&fa).has_rings.load(Ordering::Relaxed));
    assert!(!inbound_of(&fb).has_rings.load(Ordering::Relaxed));
    let rsge = b.word();
    b.qp.post_recv(&RecvWr { wr_id: 7, sg_list: &rsge }).unwrap();
    a.mr.write(0, &7u64.to_le_bytes()).unwrap();
    let sge = a.word();
    a.qp.post_send(&SendWr::send(7, &sge).signaled()).unwrap();
    let (mut sent, mut got) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent.is_none() || got.is_none() {
        sent = sent.or_else(|| a.cq.poll_one());
        got = got.or_else(|| b.cq.poll_one());
        assert!(Instant::now() < deadline, "a SEND was not taken in by the polling threads");
    }
    assert_eq!(sent.map(|w| (w.status, w.wr_id)), Some((WcStatus::SUCCESS, 7)));
    assert_eq!(got.map(|w| (w.status, w.wr_id)), Some((WcStatus::SUCCESS, 7)));
    let mut bytes = [0; 8];
    b.mr.read(0, &mut bytes).unwrap();
    assert_eq!(u64::from_le_bytes(bytes), 7);
    assert!(inbound_of(&fa).has_rings.load(Ordering::Relaxed));
    assert!(inbound_of(&fb).has_rings.load(Ordering::Relaxed));
    drop(held);
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A process on the host fabric that talks to no other (as every program on the shim
/// is): its threads polling empty CQs write nothing the node shares and look at no
/// socket (two threads ping-ponging in one process, through the C ABI, took twice as long
/// a round trip when they did).
#[test]
fn test_polls_of_a_process_that_talks_to_no_other_write_nothing_shared() {
    let (dir, cfg) = host_dir("alone");
    let f = Fabric::new(cfg);
    let (a, b) = (end_on(&f), end_on(&f));
    connected(&a, &b);
    for _ in 0..10 * SOCKET_LOOKS {
        assert!(a.cq.poll_one().is_none());
    }
    let inbound = inbound_of(&f);
    assert_eq!(inbound.looks_without_rings.load(Ordering::Relaxed), 0);
    assert!(!inbound.polled.load(Ordering::Relaxed));
    a.send(&b, 3);
    drop((a, b, f));
    let _ = std::fs::remove_dir_all(dir);
}

/// A QP connected to a QP of another process gets ready to talk to it in the connecting
/// modify: the timer thread runs, and our ring to that node, its pages in place, is
/// passed, before the first message (whose post would otherwise wait for both).
#[test]
fn test_a_qp_connected_to_another_process_passes_its_ring_before_the_first_message() {
    let (dir, cfg) = host_dir("ring-ahead");
    let (fa, fb) = (Fabric::new(cfg.clone()), Fabric::new(cfg));
    let (a, b) = (end_on(&fa), end_on(&fb));
    let ready = |f: &Fabric, slot: u8| {
        let peer = f.0.node.get().unwrap().peers.lock().get(&slot).cloned();
        let ring = peer.is_some_and(|p| p.tx.lock().ring.is_some());
        (ring, f.0.timer.started())
    };
    assert_eq!(ready(&fa, b.slot()), (false, false));
    assert_eq!(ready(&fb, a.slot()), (false, false));
    connected(&a, &b);
    assert_eq!(ready(&fa, b.slot()), (true, true));
    assert_eq!(ready(&fb, a.slot()), (true, true));
    talk_and_part((a, fa), (b, fb), &dir);
}

/// WRITEs carried out as they are sent, on either transport: with the peer's reader
/// asleep, then kept from taking anything in, each of a run of WRITEs (one after a pause)
/// is in the peer's memory by the time its post returns (not only once a poll finds the
/// peer lagging), and complete (an RC one with no ACK to come). Their records wait for the
/// peer to account for them, which sends no ACK for them (their requester completed them
/// already); what follows is taken in, in order, once it does.
#[test]
fn test_writes_are_carried_out_as_they_are_sent_while_the_peer_takes_nothing_in() {
    for ty in [crate::QpType::RC, crate::QpType::UC] {
        let end = |f: &Fabric| crate::engine::testkit::side_of(&f.devices()[0], ty);
        let (dir, (a, fa), (b, fb)) = talking(&format!("placed-{ty:?}"), end);
        let node_b = fb.0.node.get().unwrap();
        until_reader_asleep(&node_b.inbound);
        let held = node_b.inbound.rx.lock();
        for i in 0..64u64 {
            let (at, word) = (8 * i, (i + 0x5eed).to_le_bytes());
            a.mr.write(at as usize, &word).unwrap();
            let piece = [Sge { addr: a.mr.addr() + at, length: 8, lkey: a.mr.lkey() }];
            let wr = SendWr::write(i, &piece, b.mr.addr() + at, b.mr.rkey()).signaled();
            a.qp.post_send(&wr).unwrap();
            let mut got = [0u8; 8];
            b.mr.read(at as usize, &mut got).unwrap();
            assert_eq!(got, word, "{ty:?} WRITE {i}");
            let wc = a.next();
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS), "{ty:?}");
            std::thread::sleep(Duration::from_micros(20));
        }
        assert!(fa.0.node.get().unwrap().behind(b.slot()), "{ty:?}");
        // What the peer's application then does with that memory stays: its reader only
        // accounts for those WRITEs when it takes their records in (before the SEND).
        b.mr.write(0, &[0u8; 512]).unwrap();
        let mut held = held;
        let acks = node_b.inbound.acks_sent.load(Ordering::Relaxed);
        receive(&node_b.inbound, &mut held, &fb.0, false);
        assert_eq!(node_b.inbound.acks_sent.load(Ordering::Relaxed), acks, "{ty:?}");
        drop(held);
        a.send(&b, 3);
        let mut got = [0xffu8; 512];
        b.mr.read(0, &mut got).unwrap();
        assert!(got[8..].iter().all(|&x| x == 0), "{ty:?}: a WRITE carried out landed again");
        talk_and_part((a, fa), (b, fb), &dir);
    }
}

/// `len` bytes of fresh memory of `end`'s application (an anonymous mapping, never
/// unmapped), registered on its PD for local and remote writes, as C registers it.
#[allow(unsafe_code)]
fn application_memory(end: &End, len: usize) -> (*mut u8, crate::Mr) {
    let (rw, anon) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: a fresh anonymous mapping, left mapped for the test's life.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, rw, anon, -1, 0) }.cast::<u8>();
    assert_ne!(p.cast(), libc::MAP_FAILED);
    // SAFETY: the mapping outlives the MR (never unmapped).
    let mem = unsafe { crate::RawMemory::new(p, len) };
    let access = crate::AccessFlags::LOCAL_WRITE | crate::AccessFlags::REMOTE_WRITE;
    (p, end.mr.pd().reg_mr_raw(mem, p as u64, access).unwrap())
}

/// A WRITE its requester carries out as it is sent leaves its record only to be accounted
/// for, and wakes no reader asleep for it (woken, the reader ran and then watched its rings
/// on the core its application spun on: `ib_write_lat` between two pinned processes lost
/// tens of microseconds a wake, its 99th percentile ~20 us): where the requester's
/// application polled for each before the next, as in a ping-pong. A run of them rings the
/// reader once half the ring waits (a writer finding it full would wait for a reader
/// nobody woke); a stream, posted without polling, rings it at once; what follows is taken
/// in, in order.
#[test]
#[allow(unsafe_code)] // application memory, registered as C registers it
fn test_a_write_carried_out_as_it_is_sent_wakes_no_reader_asleep() {
    const LEN: usize = 4096;
    let (dir, (a, fa), (b, fb)) = talking("placed-quiet", end_on);
    let (na, nb) = (fa.0.node.get().unwrap(), fb.0.node.get().unwrap());
    // Memory of B's application, which B's process moves into shared memory as it is
    // registered: A gets a view of it.
    let (p, mr) = application_memory(&b, LEN);
    let post = |i: u64| {
        let at = 8 * (i % 64);
        a.mr.write(at as usize, &i.to_le_bytes()).unwrap();
        let sg = [Sge { addr: a.mr.addr() + at, length: 8, lkey: a.mr.lkey() }];
        let wr = SendWr::write(i, &sg, mr.addr() + at, mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
    };
    let landed = |i: u64| {
        let at = 8 * (i % 64);
        let wc = a.next();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS));
        let mut got = [0u8; 8];
        // SAFETY: 8 bytes of the mapping, which the WRITE completed into.
        unsafe { std::ptr::copy_nonoverlapping(p.add(at as usize), got.as_mut_ptr(), 8) };
        assert_eq!(u64::from_le_bytes(got), i, "WRITE {i} landed as it completed");
    };
    // Each polled for before the next is posted, as in a ping-pong.
    let write = |i: u64| {
        post(i);
        landed(i);
    };
    // The first gets A a view of B's memory (B's reader passes it): the next go through it.
    write(0);
    let views = || na.inbound.peer_exports.lock().get(&b.slot()).map(|e| e.1.view_count());
    let deadline = Instant::now() + Duration::from_secs(10);
    while views() != Some(1) || na.behind(b.slot()) {
        assert!(Instant::now() < deadline, "no view of B's memory, or B's ring unread");
        std::thread::sleep(Duration::from_millis(1));
    }
    // One through the view (after one carried out by system calls, a run of WRITEs
    // goes on, which wakes no reader anyway), then one alone, its peer's reader asleep.
    write(1);
    until_reader_asleep(&nb.inbound);
    write(2);
    std::thread::sleep(Duration::from_millis(20));
    assert!(na.behind(b.slot()), "B's reader was woken for a WRITE carried out");
    // Each record takes more than 32 bytes: half the ring is reached well before the end.
    let most = 3 + (RING_BYTES / 32) as u64;
    let woke = (3..most).find(|&i| {
        write(i);
        !na.behind(b.slot())
    });
    assert!(woke.is_some(), "B's reader never woken while its ring filled");
    // A stream, posted without a poll between, rings the reader at once (it takes over
    // what follows).
    until_reader_asleep(&nb.inbound);
    (most..most + 2).for_each(post);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!na.behind(b.slot()), "B's reader was not woken for a stream");
    (most..most + 2).for_each(landed);
    a.send(&b, 3);
    drop(mr);
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A ping-pong's WRITE too long for a record (from `PULL_MIN` on: the packet path's, the
/// peer asked to read it) still lands and completes, each one posted after the last
/// completed, its peer's reader asleep before it: a bell held for it (see
/// `absent_peer::holds_bell`) must not keep the reader from what it has to do.
#[test]
#[allow(unsafe_code)] // application memory, registered as C registers it
fn test_a_ping_pongs_long_write_lands_with_its_peers_reader_asleep() {
    const LEN: usize = 2 * PULL_MIN;
    const MSG: usize = PULL_MIN + 4096;
    let (dir, (a, fa), (b, fb)) = talking("placed-long", end_on);
    let nb = fb.0.node.get().unwrap();
    let (p, mr) = application_memory(&b, LEN);
    let src = a.mr.pd().reg_mr(MSG, crate::AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..6u64 {
        let at = (i as usize % 2) * (LEN - MSG);
        let bytes: Vec<u8> = (0..MSG).map(|k| (k as u64 * 7 + i) as u8).collect();
        src.write(0, &bytes).unwrap();
        if i > 0 {
            until_reader_asleep(&nb.inbound);
        }
        let sg = [Sge { addr: src.addr(), length: MSG as u32, lkey: src.lkey() }];
        let wr = SendWr::write(i, &sg, mr.addr() + at as u64, mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        let wc = a.next();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS), "WRITE {i}");
        let mut got = vec![0u8; MSG];
        // SAFETY: MSG bytes of the mapping, which the WRITE completed into.
        unsafe { std::ptr::copy_nonoverlapping(p.add(at), got.as_mut_ptr(), MSG) };
        assert!(got == bytes, "WRITE {i} landed whole as it completed");
    }
    drop((mr, src));
    talk_and_part((a, fa), (b, fb), &dir);
}

/// A run of SENDs that the peer takes in at once is acknowledged by one ACK per
/// `OwedAck::RUN` of them, the last one's, which covers the ones before: the requester takes
/// that many records in for the run, and every SEND completes on both sides, in order, its
/// bytes where its receive put them.
#[test]
fn test_a_run_of_sends_taken_in_at_once_is_acknowledged_once_per_run() {
    // Queues deep enough for a run that takes two ACKs.
    const RUN: u64 = 70;
    let end = |f: &Fabric| {
        let ctx = f.devices()[0].open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None, 0).unwrap();
        let mr = pd.reg_mr(4096, crate::AccessFlags::LOCAL_WRITE).unwrap();
        let cap = crate::QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(&crate::QpInitAttr::new(crate::QpType::RC, &cq, cap)).unwrap();
        End { qp, mr, cq }
    };
    let (dir, (a, fa), (b, fb)) = talking("owed", end);
    let at = |e: &End, i: u64| Sge { addr: e.mr.addr() + 8 * i, length: 8, lkey: e.mr.lkey() };
    for i in 0..RUN {
        b.qp.post_recv(&RecvWr { wr_id: i, sg_list: &[at(&b, i)] }).unwrap();
        a.mr.write(8 * i as usize, &(i + 100).to_le_bytes()).unwrap();
    }
    let heard = || a.qp.0.heard.load(Ordering::Relaxed);
    let before = heard();
    // The peer takes nothing in until the whole run waits in its ring.
    let held = inbound_of(&fb).rx.lock();
    for i in 0..RUN {
        a.qp.post_send(&SendWr::send(i, &[at(&a, i)]).signaled()).unwrap();
    }
    drop(held);
    for i in 0..RUN {
        let wc = a.next();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS));
        let wc = b.next();
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (i, WcStatus::SUCCESS, 8));
        let mut got = [0u8; 8];
        b.mr.read(8 * i as usize, &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), i + 100);
    }
    let acks = RUN.div_ceil(u64::from(engine::arriving::OwedAck::RUN));
    assert_eq!(heard() - before, acks, "records the requester took in for the run");
    talk_and_part((a, fa), (b, fb), &dir);
}

/// Large payloads from registered memory that moved into shared memory (see
/// `crate::shared_mem`) are copied by the receiving node from its view of that memory,
/// not pulled: a WRITE and a SEND from the requester's memory and a READ of the
/// responder's land byte for byte, through the views each node maps of the other's. So
/// too from MRs whose ends are not on page boundaries (as `malloc` hands out), of which
/// only the whole pages moved: the partial pages at their ends are pulled.
#[test]
fn test_large_payloads_are_copied_from_the_peers_shared_memory() {
    for off in [0, 100] {
        payloads_copied_from_the_peers_shared_memory(off);
    }
}

/// See `test_large_payloads_are_copied_from_the_peers_shared_memory`: MRs from `off`
/// bytes into a mapping to `off` bytes before its end.
#[allow(unsafe_code)] // application memory, registered as C registers it
fn payloads_copied_from_the_peers_shared_memory(off: usize) {
    const LEN: usize = 256 * 1024;
    let len = LEN - 2 * off;
    let (dir, (a, fa), (b, fb)) = talking(&format!("shared-mr-{off}"), end_on);
    let raw = |e: &End, seed: u8| {
        let (rw, anon) =
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY: a fresh anonymous mapping, left mapped for the test's life.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), LEN, rw, anon, -1, 0) }.cast::<u8>();
        assert_ne!(p.cast(), libc::MAP_FAILED);
        // SAFETY: `p` is LEN bytes of ours; the MR's lie `off` bytes in.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p.add(off), len) };
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 253) as u8 ^ seed);
        // SAFETY: the mapping outlives the MR (never unmapped).
        let mem = unsafe { crate::RawMemory::new(p.add(off), len) };
        let all = crate::AccessFlags::LOCAL_WRITE
            | crate::AccessFlags::REMOTE_WRITE
            | crate::AccessFlags::REMOTE_READ;
        (e.mr.pd().reg_mr_raw(mem, p as u64 + off as u64, all).unwrap(), bytes)
    };
    let ((ma, bytes_a), (mb, bytes_b)) = (raw(&a, 0x11), raw(&b, 0x22));
    let views = |f: &Fabric| {
        let rx = inbound_of(f).rx.lock();
        rx.rings.iter().filter_map(|(_, r)| r.sender()).map(|p| p.view_count()).sum::<usize>()
    };

    let expect = |seed: u8, from: usize, i: usize| ((from + i) % 253) as u8 ^ seed;
    let sge = |m: &crate::Mr, off: u64, len: usize| Sge {
        addr: m.addr() + off,
        length: len as u32,
        lkey: m.lkey(),
    };
    // A WRITE of A's bytes 4096.. to B's 0..
    let n = 100_000;
    let piece = [sge(&ma, 4096, n)];
    let wr = SendWr::write(7, &piece, mb.addr(), mb.rkey()).signaled();
    a.qp.post_send(&wr).unwrap();
    assert_eq!(a.next().status, WcStatus::SUCCESS);
    assert!((0..n).all(|i| bytes_b[i] == expect(0x11, 4096, i)), "the WRITE");
    // A READ by A of B's bytes 8192.. into A's 0..
    let piece = [sge(&ma, 0, n - 8192)];
    let wr = SendWr::read(8, &piece, mb.addr() + 8192, mb.rkey()).signaled();
    a.qp.post_send(&wr).unwrap();
    assert_eq!(a.next().status, WcStatus::SUCCESS);
    // (B's bytes 8192..n are A's bytes 4096+8192.. as the WRITE put them.)
    assert!((0..n - 8192).all(|i| bytes_a[i] == expect(0x11, 4096 + 8192, i)), "the READ");
    // A SEND of A's bytes 180_000.. into B's 131_072.. (from 64 KiB on: pulled from memory
    // only partly shared, see `Node::pulls`)
    let m = len - 180_000;
    let into = [sge(&mb, 131_072, m)];
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: &into }).unwrap();
    let piece = [sge(&ma, 180_000, m)];
    a.qp.post_send(&SendWr::send(9, &piece).signaled()).unwrap();
    assert_eq!(a.next().status, WcStatus::SUCCESS);
    let wc = b.next();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len as usize), (9, WcStatus::SUCCESS, m));
    assert!((0..m).all(|i| bytes_b[131_072 + i] == expect(0x11, 180_000, i)), "the SEND");
    // Each node copied from its view of the other's memory.
    let copied = |f: &Fabric| {
        let rx = inbound_of(f).rx.lock();
        rx.rings.iter().filter_map(|(_, r)| r.sender()).map(|p| p.view_copies()).sum::<u64>()
    };
    // (The WRITE, alone in flight, was A's to carry out into B's memory as it sent it.)
    assert!(copied(&fb) >= 1, "B copied the SEND from its view");
    assert!(copied(&fa) >= 1, "A copied the READ's response from its view");
    // Deregistered, the memory moves back, and each node lets its view of the other's go.
    assert_eq!((views(&fa), views(&fb)), (1, 1));
    drop((ma, mb));
    let deadline = Instant::now() + Duration::from_secs(10);
    while views(&fa) + views(&fb) > 0 {
        assert!(Instant::now() < deadline, "views kept");
        std::thread::sleep(Duration::from_millis(1));
    }
    talk_and_part((a, fa), (b, fb), &dir);
}

/// Memory that peers may only read (`LOCAL_WRITE` alone, as `ib_send_lat`'s) moves into
/// shared memory from the size of the smallest message pulled on (`PULL_MIN`): a SEND of
/// that size out of a 32 KiB MR is copied by the receiver from its view of the sender's
/// memory, one copy, where it went as packets while such MRs moved from 64 KiB on. A
/// smaller MR stays where it is; its SEND of the same size arrives all the same.
#[test]
#[allow(unsafe_code)] // application memory, registered as C registers it
fn test_memory_peers_only_read_is_shared_from_the_size_they_pull() {
    const MAP: usize = 32 * 1024;
    let (dir, (a, fa), (b, fb)) = talking("read-only-shared", end_on);
    let (rw, anon) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: a fresh anonymous mapping, left mapped for the test's life.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), MAP, rw, anon, -1, 0) }.cast::<u8>();
    assert_ne!(p.cast(), libc::MAP_FAILED);
    // SAFETY: `p` is MAP bytes of ours.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p, MAP) };
    bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
    let into = b.mr.pd().reg_mr(PULL_MIN, crate::AccessFlags::LOCAL_WRITE).unwrap();
    let senders = |f: &Fabric| {
        let rx = inbound_of(f).rx.lock();
        let p = rx.rings.iter().filter_map(|(_, r)| r.sender());
        p.map(|p| (p.view_count(), p.view_copies())).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    let (whole, small) = (MAP, crate::shared_mem::MIN_READ_ONLY_BYTES - 4096);
    for (wr_id, mr_len) in [(1, whole), (2, small)] {
        // SAFETY: the mapping outlives the MR (never unmapped).
        let mem = unsafe { crate::RawMemory::new(p, mr_len) };
        let mr = a.mr.pd().reg_mr_raw(mem, p as u64, crate::AccessFlags::LOCAL_WRITE).unwrap();
        assert_eq!(mr.snapshot().region.shared_id() != 0, mr_len == whole, "{mr_len}");
        into.write(0, &[0; PULL_MIN]).unwrap();
        let sink = [Sge { addr: into.addr(), length: PULL_MIN as u32, lkey: into.lkey() }];
        b.qp.post_recv(&RecvWr { wr_id, sg_list: &sink }).unwrap();
        let before = senders(&fb).1;
        let len = PULL_MIN.min(mr_len) as u32;
        let piece = [Sge { addr: mr.addr(), length: len, lkey: mr.lkey() }];
        a.qp.post_send(&SendWr::send(wr_id, &piece).signaled()).unwrap();
        assert_eq!(a.next().status, WcStatus::SUCCESS);
        let wc = b.next();
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (wr_id, WcStatus::SUCCESS, len));
        let mut got = vec![0; len as usize];
        into.read(0, &mut got).unwrap();
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "{mr_len}");
        assert_eq!(senders(&fb).1 - before, u64::from(mr_len == whole), "{mr_len}");
        // Deregistered, the memory is private again, and B lets its view go.
        drop(mr);
        let deadline = Instant::now() + Duration::from_secs(10);
        while senders(&fb).0 > 0 {
            assert!(Instant::now() < deadline, "a view kept");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    talk_and_part((a, fa), (b, fb), &dir);
}

/// An RDMA WRITE into memory its responder's process moved into shared memory is carried
/// out by its requester through a view of that memory: the first, sent to a reader asleep,
/// by system calls (the requester's process then asks for the view); once the view is
/// passed, each that is alone, whether or not the reader sleeps, by a copy into it. Pages
/// registered again move into another file: the old view is not written, the WRITE lands
/// in the memory the new MR names.
#[test]
#[allow(unsafe_code)] // application memory, registered as C registers it
fn test_a_write_alone_is_placed_through_a_view_of_the_peers_memory() {
    const LEN: usize = 8192;
    let (dir, (a, fa), (b, fb)) = talking("write-view", end_on);
    let (rw, anon) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: a fresh anonymous mapping, left mapped for the test's life.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), LEN, rw, anon, -1, 0) }.cast::<u8>();
    assert_ne!(p.cast(), libc::MAP_FAILED);
    let word = |i: u64| {
        let mut w = [0u8; 8];
        // SAFETY: `p` is LEN bytes of ours, read once the WRITE there completed.
        unsafe { std::ptr::copy_nonoverlapping(p.add(8 * i as usize), w.as_mut_ptr(), 8) };
        u64::from_le_bytes(w)
    };
    let reg = || {
        // SAFETY: the mapping outlives the MR (never unmapped).
        let mem = unsafe { crate::RawMemory::new(p, LEN) };
        let access = crate::AccessFlags::LOCAL_WRITE | crate::AccessFlags::REMOTE_WRITE;
        b.mr.pd().reg_mr_raw(mem, p as u64, access).unwrap()
    };
    // WRITE `i` of A's to B's word `i` of `mr`, and its completion.
    let post = |mr: &crate::Mr, i: u64| {
        a.mr.write(8 * i as usize, &i.to_le_bytes()).unwrap();
        let sg = [Sge { addr: a.mr.addr() + 8 * i, length: 8, lkey: a.mr.lkey() }];
        let wr = SendWr::write(i, &sg, mr.addr() + 8 * i, mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
    };
    let landed = |i: u64| {
        let wc = a.next();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS));
        assert_eq!(word(i), i, "WRITE {i} landed");
    };
    let (na, nb) = (fa.0.node.get().unwrap(), fb.0.node.get().unwrap());
    // A's record of B's process: the views it has of B's memory, and the writes made
    // through them.
    let exported = || na.inbound.peer_exports.lock().get(&b.slot()).unwrap().1.clone();
    let views = || exported().view_count();
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // Posted while B's reader cannot take it in (nor is rung: its rings disarmed, as
    // while its application polls, and then its reader rung, as a poll does). Alone, a
    // WRITE is carried out only through a view: the first asks for one and waits for B;
    // the next ten go through the view.
    let unattended = |f: &dyn Fn()| {
        let rx = nb.inbound.rx.lock();
        rx.rings.iter().for_each(|(_, r)| r.disarm());
        f();
        drop(rx);
        nb.inbound.wake_reader();
    };
    for first in [1, 20] {
        let mr = reg();
        unattended(&|| post(&mr, first));
        landed(first);
        wait_for("no view of B's memory was passed", &|| views() == 1);
        assert_eq!(exported().view_writes(), 0);
        unattended(&|| {
            for i in first + 1..first + 11 {
                post(&mr, i);
                landed(i);
            }
        });
        assert_eq!(exported().view_writes(), 10, "each WRITE went through the view");
        // Deregistered, the pages move back and A lets its view go; registered again
        // (the next round), they are another file's, which is viewed anew.
        drop(mr);
        wait_for("the view of the old file was kept", &|| views() == 0);
    }
    talk_and_part((a, fa), (b, fb), &dir);
}

#[test]
fn test_fragments_reassemble_per_source_and_gaps_are_dropped() {
    let mut p = Partials::default();
    let mut reassemble = |d: &[u8]| {
        let src = Source { slot: d[4], pid: 7 };
        reassemble(&mut p, src, d).ok().flatten().map(|m| m.into_owned())
    };
    assert_eq!(reassemble(&frame(1, FIRST | LAST, 2, 0, 0, b"ab")), Some(b"ab".to_vec()));
    assert_eq!(reassemble(&frame(1, FIRST, 4, 0, 0, b"ab")), None);
    assert_eq!(reassemble(&frame(2, FIRST, 2, 0, 0, b"x")), None);
    assert_eq!(reassemble(&frame(1, LAST, 4, 2, 0, b"cd")), Some(b"abcd".to_vec()));
    assert_eq!(reassemble(&frame(2, LAST, 2, 1, 0, b"y")), Some(b"xy".to_vec()));
    // A middle fragment with no start, a gap, a bad magic: nothing.
    assert_eq!(reassemble(&frame(3, LAST, 4, 2, 0, b"cd")), None);
    assert_eq!(reassemble(&frame(1, FIRST, 6, 0, 0, b"ab")), None);
    assert_eq!(reassemble(&frame(1, LAST, 6, 4, 0, b"ef")), None);
    let mut bad = frame(1, FIRST | LAST, 1, 0, 0, b"z");
    bad[0] ^= 1;
    assert_eq!(reassemble(&bad), None);
}

#[test]
fn test_qpns_name_their_node() {
    assert_eq!(slot_of(0x03_0011), 3);
    assert_eq!(slot_of(0x11), 0);
}

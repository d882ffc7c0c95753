//! The host-wide fabric: fabrics in different processes (or several in one) that share a
//! name meet in one directory and exchange packets over Unix datagram sockets.
//!
//! # Layout
//! The directory (`<runtime>/rdma-emu-<uid>/<name>`, mode 0700, or an absolute path) holds,
//! per node slot `s` in 1..=255, `s.lock` (held with `flock` by the live owner, so the kernel
//! releases it when the process dies, however it dies) and `s.sock` (its inbound socket).
//! A node's QPNs are `s << 16 | n`, so any node routes a packet by its destination QPN alone,
//! without a shared table.
//!
//! # Progress and back-pressure
//! Each node has a reader thread that receives, reassembles and services the destination QP,
//! so one-sided operations complete while the owning application is blocked elsewhere. The
//! reader never blocks on a send (that could deadlock two readers sending to each other): all
//! sends are non-blocking, and what a full peer refuses waits in that peer's backlog, which a
//! per-peer flusher thread pushes with blocking sends. Per peer, datagrams leave in order.

use std::{
    collections::{HashMap, VecDeque},
    fs::{DirBuilder, File, OpenOptions},
    io,
    os::unix::{
        fs::{DirBuilderExt, MetadataExt, PermissionsExt},
        io::AsRawFd,
        net::UnixDatagram,
    },
    path::{Path, PathBuf},
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use parking_lot::{Condvar, Mutex};

use super::{
    FabricInner, wire,
    wire::{Control, Message, encode_control},
};
use crate::{
    engine::{
        self, Driver,
        packet::{Kind, Packet},
    },
    error::{Errno, Error},
    types::{EventType, QpState, QpType},
};

/// Node slots (the top 8 bits of a 24-bit QPN); 0 is the in-process-only numbering.
const SLOTS: u8 = 255;
/// Payload bytes per datagram: well under the default socket send buffer (~208 KiB).
const FRAGMENT: usize = 60 * 1024;
const MAGIC: u32 = u32::from_le_bytes(*b"REMU");
const HEADER: usize = 20;
const FIRST: u8 = 1;
const LAST: u8 = 2;

/// The node slot that owns `qpn`.
pub(crate) fn slot_of(qpn: u32) -> u8 {
    (qpn >> 16) as u8
}

/// Where the fabric called `name` lives: an absolute path as given, else
/// `$RDMA_EMU_RUNTIME_DIR`, `$XDG_RUNTIME_DIR` or `/tmp`, then `rdma-emu-<uid>/<name>`.
pub fn fabric_dir(name: &str) -> PathBuf {
    if name.starts_with('/') {
        return PathBuf::from(name);
    }
    let base = ["RDMA_EMU_RUNTIME_DIR", "XDG_RUNTIME_DIR"]
        .iter()
        .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    base.join(format!("rdma-emu-{}", crate::sys::uid())).join(name)
}

/// Creates `dir` (0700) if needed and refuses one that another user owns or that others may
/// write: joining it would let them inject packets into this process's memory.
fn prepare_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent()
        && !parent.exists()
    {
        DirBuilder::new().recursive(true).mode(0o700).create(parent)?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = std::fs::metadata(dir)?;
    let me = crate::sys::uid();
    if meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("it belongs to uid {}, not to this process's uid {me}", meta.uid()),
        ));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "other users may write to it (it must not be group- or world-writable)",
        ));
    }
    Ok(())
}

/// This fabric's membership of a host fabric: its slot, its socket, its peers.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) slot: u8,
    dir: PathBuf,
    /// Held (flock) while this node lives; the kernel drops it with the process.
    _lock: File,
    inbound: Arc<Inbound>,
    peers: Mutex<HashMap<u8, Arc<Peer>>>,
    fabric: Weak<FabricInner>,
}

/// The receiving side, shared by the reader thread and the threads that poll a CQ.
#[derive(Debug)]
struct Inbound {
    /// Non-blocking; the reader waits for it with poll(2).
    sock: UnixDatagram,
    /// Held by whoever is receiving, so datagrams are taken and reassembled in order.
    rx: Mutex<Rx>,
    quit: AtomicBool,
}

#[derive(Debug)]
struct Rx {
    buf: Vec<u8>,
    /// Per source slot, the message being reassembled (its fragments arrive in order).
    partial: HashMap<u8, Vec<u8>>,
}

impl Node {
    /// Claims the lowest free slot in `dir`, binds its socket, clears what dead nodes left,
    /// and starts the reader thread.
    pub(crate) fn join(dir: &Path, fabric: Weak<FabricInner>) -> crate::Result<Node> {
        Node::try_join(dir, fabric).map_err(|e| {
            eprintln!("rdma-emu: cannot join the host fabric at {}: {e}", dir.display());
            let errno = e.raw_os_error().map_or(Errno::EACCES, Errno);
            Error::new(errno, "cannot join the host fabric (see RDMA_EMU_FABRIC)")
        })
    }

    fn try_join(dir: &Path, fabric: Weak<FabricInner>) -> io::Result<Node> {
        prepare_dir(dir)?;
        let mut claimed = None;
        for slot in 1..=SLOTS {
            let lock = lock_file(dir, slot)?;
            if lock.try_lock().is_ok() {
                claimed = Some((slot, lock));
                break;
            }
        }
        let Some((slot, lock)) = claimed else {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "all 255 node slots are taken"));
        };
        sweep(dir, slot)?;
        let path = sock_path(dir, slot);
        remove_if_exists(&path)?;
        let sock = UnixDatagram::bind(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))?;
        sock.set_nonblocking(true)?;
        let rx = Mutex::new(Rx { buf: vec![0; HEADER + FRAGMENT], partial: HashMap::new() });
        let inbound = Arc::new(Inbound { sock, rx, quit: AtomicBool::new(false) });
        let (reader, weak) = (inbound.clone(), fabric.clone());
        std::thread::Builder::new()
            .name(format!("rdma-emu-node{slot}"))
            .spawn(move || read_loop(&reader, &weak))?;
        let peers = Mutex::default();
        Ok(Node { slot, dir: dir.to_owned(), _lock: lock, inbound, peers, fabric })
    }

    /// Receives and services whatever has arrived, unless another thread is already at it;
    /// whether anything was delivered. Called by threads that poll an empty CQ: a spinning
    /// application may hold the CPU the reader thread would need.
    pub(crate) fn progress(&self, fabric: &FabricInner) -> bool {
        match self.inbound.rx.try_lock() {
            Some(mut rx) => receive(&self.inbound, &mut rx, fabric),
            None => false,
        }
    }

    /// Sends `pkt` to the node owning its destination QPN. A peer that is gone loses it, as
    /// a wire would; the sender's timers notice.
    pub(crate) fn send(&self, pkt: &Packet) {
        self.send_to(slot_of(pkt.dst_qpn), pkt);
    }

    /// Sends the multicast datagram `pkt` to every other live node, each of which hands it to
    /// its own members of the group.
    pub(crate) fn multicast(&self, pkt: &Packet) {
        for slot in self.live_slots() {
            self.send_to(slot, pkt);
        }
    }

    /// The slots of the other nodes that have a socket (live, or dead and not swept yet).
    fn live_slots(&self) -> Vec<u8> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries
            .filter_map(|e| {
                let name = e.ok()?.file_name();
                name.to_str()?.strip_suffix(".sock")?.parse::<u8>().ok()
            })
            .filter(|&slot| slot != self.slot)
            .collect()
    }

    fn send_to(&self, slot: u8, pkt: &Packet) {
        let mut msg = Vec::with_capacity(128);
        if wire::encode(pkt, &mut msg).is_err() {
            return;
        }
        let peer = self.peer(slot);
        let total = msg.len() as u32;
        let mut offset = 0;
        let frames = std::iter::from_fn(|| {
            if offset >= msg.len() {
                return None;
            }
            let end = (offset + FRAGMENT).min(msg.len());
            let mut flags = if offset == 0 { FIRST } else { 0 };
            if end == msg.len() {
                flags |= LAST;
            }
            let d = frame(self.slot, flags, total, offset as u32, pkt.dst_qpn, &msg[offset..end]);
            offset = end;
            Some(d)
        });
        peer.send(frames);
    }

    /// Tells the node of `dest_qpn` that our QP `qpn`, connected to it, was destroyed: after
    /// the packets already sent to it, so it arrives after the last ACKs.
    pub(crate) fn part(&self, qpn: u32, dest_qpn: u32) {
        let msg = encode_control(Control::QpClosed { qpn });
        let d = frame(self.slot, FIRST | LAST, msg.len() as u32, 0, dest_qpn, &msg);
        self.peer(slot_of(dest_qpn)).send(std::iter::once(d));
    }

    /// Sends a control message to every other live node; how many took it.
    pub(crate) fn broadcast(&self, c: Control) -> usize {
        let msg = encode_control(c);
        let d = frame(self.slot, FIRST | LAST, msg.len() as u32, 0, 0, &msg);
        let Ok(sock) = UnixDatagram::unbound() else { return 0 };
        let slots = self.live_slots();
        slots
            .into_iter()
            .filter(|&slot| sock.send_to(&d, sock_path(&self.dir, slot)).is_ok())
            .count()
    }

    /// The node in `slot`, as a destination; the first use starts watching for its death.
    fn peer(&self, slot: u8) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(&slot) {
            return p.clone();
        }
        let p = Arc::new(Peer::new(sock_path(&self.dir, slot)));
        peers.insert(slot, p.clone());
        drop(peers);
        self.spawn_watcher(slot);
        p
    }

    /// Makes sure the death of the node in `slot` will be noticed.
    pub(crate) fn watch(&self, slot: u8) {
        self.peer(slot);
    }

    /// A thread that waits for the lock of the node in `slot`: the kernel releases it when
    /// that process dies, however it dies. Then every QP connected there fails (see
    /// `peer_died`), so a survivor waiting for a message that will never come is not left
    /// hanging.
    fn spawn_watcher(&self, slot: u8) {
        let path = self.dir.join(format!("{slot}.lock"));
        let fabric = self.fabric.clone();
        let spawned =
            std::thread::Builder::new().name(format!("rdma-emu-watch{slot}")).spawn(move || {
                let gone = File::open(&path).map_or(true, |f| f.lock_shared().is_ok());
                let Some(fabric) = fabric.upgrade() else { return };
                if !gone {
                    return;
                }
                if let Some(node) = fabric.node.get() {
                    node.peers.lock().remove(&slot);
                    // What it sent before it went (its last ACKs) is queued here: take it in
                    // before judging what is still outstanding.
                    let mut rx = node.inbound.rx.lock();
                    receive(&node.inbound, &mut rx, &fabric);
                }
                peer_died(&fabric, slot);
            });
        // Without the thread a dead peer is still noticed by the senders' retry timers.
        drop(spawned);
    }
}

impl Node {
    /// Waits, at most `limit`, until nothing this node sent is still queued in the process
    /// (every backlog pushed to its peer's socket); whether it got there.
    pub(crate) fn flush(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        // Take in what has arrived, so that it is acknowledged as a NIC would have done
        // before the QPs go (a thread servicing inbound packets holds this lock: its replies
        // are about to be sent).
        if let Some(mut rx) = self.inbound.rx.try_lock_for(limit)
            && let Some(fabric) = self.fabric.upgrade()
        {
            receive(&self.inbound, &mut rx, &fabric);
        }
        let peers: Vec<Arc<Peer>> = self.peers.lock().values().cloned().collect();
        for p in peers {
            loop {
                let tx = p.tx.lock();
                if tx.backlog.is_empty() && !tx.flushing {
                    break;
                }
                drop(tx);
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        true
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // What the application handed over before letting go (final ACKs too) still leaves.
        self.flush(Duration::from_secs(1));
        self.inbound.quit.store(true, Ordering::Release);
        let path = sock_path(&self.dir, self.slot);
        // Wake the reader (it sees `quit`), then remove the socket before the lock goes, so
        // the next owner of the slot never finds ours.
        if let Ok(s) = UnixDatagram::unbound() {
            let _ = s.send_to(&[], &path);
        }
        let _ = std::fs::remove_file(&path);
        for p in self.peers.lock().values() {
            p.tx.lock().shutdown = true;
            p.cv.notify_all();
        }
    }
}

/// Removes the sockets of dead nodes (their lock is free): nobody will read them again.
fn sweep(dir: &Path, mine: u8) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let slot = name.to_str().and_then(|n| n.strip_suffix(".sock")?.parse::<u8>().ok());
        let Some(slot) = slot.filter(|&s| s != mine) else { continue };
        let dead = match File::open(dir.join(format!("{slot}.lock"))) {
            Ok(f) => f.try_lock().is_ok(),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        };
        if dead {
            remove_if_exists(&sock_path(dir, slot))?;
        }
    }
    Ok(())
}

/// One datagram: the header (magic, source slot, FIRST/LAST flags, the message's total
/// length, this fragment's offset in it, the destination QPN) and the fragment.
fn frame(src: u8, flags: u8, total: u32, offset: u32, dst_qpn: u32, body: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(HEADER + body.len());
    d.extend_from_slice(&MAGIC.to_le_bytes());
    d.extend_from_slice(&[src, flags, 0, 0]);
    d.extend_from_slice(&total.to_le_bytes());
    d.extend_from_slice(&offset.to_le_bytes());
    d.extend_from_slice(&dst_qpn.to_le_bytes());
    d.extend_from_slice(body);
    d
}

fn lock_file(dir: &Path, slot: u8) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{slot}.lock")))
}

fn sock_path(dir: &Path, slot: u8) -> PathBuf {
    dir.join(format!("{slot}.sock"))
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Waits for datagrams and services them until the node quits or its fabric is gone.
fn read_loop(inbound: &Inbound, fabric: &Weak<FabricInner>) {
    loop {
        if crate::sys::wait_readable(inbound.sock.as_raw_fd()).is_err() {
            return;
        }
        if inbound.quit.load(Ordering::Acquire) {
            return;
        }
        let Some(fabric) = fabric.upgrade() else { return };
        let mut rx = inbound.rx.lock();
        receive(inbound, &mut rx, &fabric);
    }
}

/// Takes every datagram waiting, hands each complete packet to its QP's inbox (in arrival
/// order), then services those QPs; whether any packet was delivered.
fn receive(inbound: &Inbound, rx: &mut Rx, fabric: &FabricInner) -> bool {
    let sock = &inbound.sock;
    let mut ready: Vec<Arc<crate::qp::QpShared>> = Vec::new();
    // Datagrams to a multicast group, for the members here.
    let mut multicast = Vec::new();
    // SENDs for XRC SRQs here, from target QPs in other processes.
    let mut xrc = Vec::new();
    loop {
        let n = match sock.recv(&mut rx.buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut to = None;
        if n >= HEADER {
            let dst = u32::from_le_bytes(rx.buf[16..20].try_into().expect("4 bytes"));
            to = fabric.lookup_qp_any(dst);
            if let Some(qp) = &to {
                qp.heard.store(fabric.now().max(1), Ordering::Relaxed);
            }
        }
        let Rx { buf, partial } = rx;
        let Some(msg) = reassemble(partial, &buf[..n]) else { continue };
        let pkt = match wire::decode_message(&msg) {
            Some(Message::Packet(p)) => p,
            Some(Message::Control(c)) => {
                apply(fabric, c, to.as_deref());
                continue;
            }
            None => continue,
        };
        if pkt.dst_qpn == engine::requester::MULTICAST_QPN {
            multicast.push(pkt);
            continue;
        }
        if pkt.kind == Kind::XrcDeliver {
            xrc.push(pkt);
            continue;
        }
        if !fabric.port_up(pkt.dst_dev, pkt.dst_port) {
            continue;
        }
        let Some(qp) = fabric.lookup_qp(pkt.dst_dev, pkt.dst_qpn) else { continue };
        qp.inbox.lock().push_back(pkt);
        if !ready.iter().any(|q| Arc::ptr_eq(q, &qp)) {
            ready.push(qp);
        }
    }
    let delivered = !ready.is_empty() || !multicast.is_empty() || !xrc.is_empty();
    let mut drv = Driver::new(fabric);
    for qp in ready {
        let mut g = qp.inner.lock();
        drv.service(&qp, &mut g);
    }
    for pkt in &multicast {
        engine::fan_out(fabric, pkt, &mut drv);
    }
    for pkt in xrc {
        engine::xrc::deliver(fabric, pkt, &mut drv);
    }
    drv.finish();
    delivered
}

/// Adds one datagram to its source's message; the whole message once its last fragment is in.
/// A fragment that does not continue the message in progress is dropped (its source died
/// mid-message, or the slot changed hands).
fn reassemble(partial: &mut HashMap<u8, Vec<u8>>, d: &[u8]) -> Option<Vec<u8>> {
    let (head, body) = d.split_first_chunk::<HEADER>()?;
    let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    let (magic, src, flags, total, offset) = (word(0), head[4], head[5], word(8), word(12));
    if magic != MAGIC {
        return None;
    }
    if flags & FIRST != 0 {
        if flags & LAST != 0 {
            partial.remove(&src);
            return (body.len() == total as usize).then(|| body.to_vec());
        }
        let mut v = Vec::with_capacity(total as usize);
        v.extend_from_slice(body);
        partial.insert(src, v);
        return None;
    }
    let cur = partial.get_mut(&src)?;
    if cur.len() != offset as usize || cur.len() + body.len() > total as usize {
        partial.remove(&src);
        return None;
    }
    cur.extend_from_slice(body);
    if flags & LAST == 0 {
        return None;
    }
    let msg = partial.remove(&src)?;
    (msg.len() == total as usize).then_some(msg)
}

/// Carries out a control message from another node (addressed to our QP `to`, if any), as
/// the local control API would.
fn apply(fabric: &FabricInner, c: Control, to: Option<&crate::qp::QpShared>) {
    let dev_index = match c {
        Control::Event { dev, .. } | Control::PortState { dev, .. } => dev,
        Control::QpClosed { qpn } => {
            if let Some(qp) = to {
                let mut g = qp.inner.lock();
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
/// profile, raising `QP_FATAL`) instead of waiting or retrying into the void. A QP whose peer
/// was destroyed first is left as real hardware leaves it: its spare receives stay posted, and
/// send work still outstanding meets the retry timer (`RETRY_EXC_ERR`) as it would had the
/// peer process lived on. Flushing that work at once would fail a program that, as the
/// rdma-core examples do, posts one send more than its peer waits for and polls its last
/// completions while that extra send is still unacknowledged.
fn peer_died(fabric: &FabricInner, slot: u8) {
    for qp in fabric.live_qps() {
        if !qp.qp_type.is_reliable() && qp.qp_type != QpType::UC {
            continue;
        }
        let mut g = qp.inner.lock();
        let connected =
            matches!(g.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE);
        if !connected || slot_of(g.attr.dest_qp_num) != slot || g.peer_closed {
            continue;
        }
        // The event first: whoever sees a flushed completion finds the event queued too.
        if engine::raises_qp_errors(&qp) {
            qp.raise(EventType::QP_FATAL);
        }
        engine::enter_error(&qp, &mut g);
    }
}

/// Another node, as a destination.
#[derive(Debug)]
struct Peer {
    path: PathBuf,
    tx: Mutex<PeerTx>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct PeerTx {
    /// Connected and non-blocking; `None` until first used or after the peer went away.
    sock: Option<UnixDatagram>,
    /// Datagrams the peer had no room for, in order.
    backlog: VecDeque<Vec<u8>>,
    /// The flusher took a datagram off the backlog and is sending it: later ones must queue.
    flushing: bool,
    flusher_started: bool,
    shutdown: bool,
}

/// What a non-blocking send came to.
enum Sent {
    Done,
    Full,
    Gone,
}

impl Peer {
    fn new(path: PathBuf) -> Peer {
        Peer { path, tx: Mutex::default(), cv: Condvar::new() }
    }

    /// Sends `frames` (one message) in order; what does not fit now goes to the backlog.
    fn send(self: &Arc<Self>, frames: impl Iterator<Item = Vec<u8>>) {
        let mut tx = self.tx.lock();
        for d in frames {
            if tx.backlog.is_empty() && !tx.flushing {
                match try_send(&mut tx.sock, &self.path, &d) {
                    Sent::Done => continue,
                    Sent::Gone => return,
                    Sent::Full => {}
                }
            }
            tx.backlog.push_back(d);
        }
        if !tx.backlog.is_empty() {
            if !tx.flusher_started {
                tx.flusher_started = true;
                let me = self.clone();
                let spawned = std::thread::Builder::new()
                    .name("rdma-emu-flush".into())
                    .spawn(move || me.flush_loop());
                if spawned.is_err() {
                    // No thread to push it: the backlog is lost, as on a congested wire.
                    tx.backlog.clear();
                    tx.flusher_started = false;
                }
            }
            self.cv.notify_one();
        }
    }

    /// Pushes the backlog with blocking sends, so the threads that send never block.
    fn flush_loop(&self) {
        let mut sock: Option<UnixDatagram> = None;
        loop {
            let d = {
                let mut tx = self.tx.lock();
                tx.flushing = false;
                let d = loop {
                    if tx.shutdown {
                        return;
                    }
                    if let Some(d) = tx.backlog.pop_front() {
                        break d;
                    }
                    self.cv.wait(&mut tx);
                };
                tx.flushing = true;
                d
            };
            if !send_blocking(&mut sock, &self.path, &d) {
                // The peer is gone: so is everything queued for it.
                self.tx.lock().backlog.clear();
            }
        }
    }
}

fn connect(path: &Path, nonblocking: bool) -> io::Result<UnixDatagram> {
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

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_fragments_reassemble_per_source_and_gaps_are_dropped() {
        let mut p = HashMap::new();
        assert_eq!(
            reassemble(&mut p, &frame(1, FIRST | LAST, 2, 0, 0, b"ab")),
            Some(b"ab".to_vec())
        );
        assert_eq!(reassemble(&mut p, &frame(1, FIRST, 4, 0, 0, b"ab")), None);
        assert_eq!(reassemble(&mut p, &frame(2, FIRST, 2, 0, 0, b"x")), None);
        assert_eq!(reassemble(&mut p, &frame(1, LAST, 4, 2, 0, b"cd")), Some(b"abcd".to_vec()));
        assert_eq!(reassemble(&mut p, &frame(2, LAST, 2, 1, 0, b"y")), Some(b"xy".to_vec()));
        // A middle fragment with no start, a gap, a bad magic: nothing.
        assert_eq!(reassemble(&mut p, &frame(3, LAST, 4, 2, 0, b"cd")), None);
        assert_eq!(reassemble(&mut p, &frame(1, FIRST, 6, 0, 0, b"ab")), None);
        assert_eq!(reassemble(&mut p, &frame(1, LAST, 6, 4, 0, b"ef")), None);
        let mut bad = frame(1, FIRST | LAST, 1, 0, 0, b"z");
        bad[0] ^= 1;
        assert_eq!(reassemble(&mut p, &bad), None);
    }

    #[test]
    fn test_qpns_name_their_node() {
        assert_eq!(slot_of(0x03_0011), 3);
        assert_eq!(slot_of(0x11), 0);
    }

    #[test]
    fn test_a_directory_of_another_user_or_writable_by_others_is_refused() {
        let dir = std::env::temp_dir().join(format!("rdma-emu-dirtest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        prepare_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare_dir(&dir).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The host-wide fabric: fabrics in different processes (or several in one) that share a
//! name meet in one directory and exchange packets through shared memory.
//!
//! # Layout
//! The directory (`<runtime>/rdma-emu-<uid>/<name>`, mode 0700, or an absolute path; who may
//! join it and whose messages are taken is [`trust`](super::trust)'s business) holds,
//! per node slot `s` in 1..=255, `s.lock` (held with `flock` by the live owner, so the kernel
//! releases it when the process dies, however it dies) and `s.sock` (its inbound socket).
//! A node's QPNs are `s << 16 | n`, so any node routes a packet by its destination QPN alone,
//! without a shared table.
//!
//! # Transport
//! The first time a node sends to another, it creates a ring in shared memory for that
//! direction (see [`ring`](crate::ipc::ring)) and passes it over the peer's socket; every message
//! after that is written straight into the ring, gathered from the sender's memory, and read
//! by the peer with no system call on either side. A doorbell datagram wakes the peer only if
//! it asked for one before sleeping. Where a ring cannot be made, messages go as datagrams on
//! the socket, which also carries the control messages of the `rdma-emu` command.
//!
//! # Progress and back-pressure
//! Each node has a reader thread that receives, reassembles and services the destination QP,
//! so one-sided operations complete while the owning application is blocked elsewhere; an
//! application thread polling an empty CQ reads the rings itself, and while it does the
//! reader sleeps without asking for doorbells. The reader never blocks on a send (that could
//! deadlock two readers sending to each other): what a full ring or socket refuses waits in
//! that peer's backlog, which a per-peer flusher thread pushes. Per peer, messages leave in
//! order.

use std::{
    borrow::Cow,
    collections::VecDeque,
    fs::File,
    io,
    os::unix::{io::AsRawFd, net::UnixDatagram},
    path::{Path, PathBuf},
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;

use super::{
    FabricInner,
    trust::{self, FabricDir, Location},
};
use crate::{
    engine::{self, Driver, arriving::OwedAck, landing::Landing},
    error::{Errno, Error},
    ipc::{
        exports::{self, Exports, PeerExports},
        ring::{self, Marks, Read, Record, Ring, Written},
    },
    mem::PeerProcess,
    packet::{Bytes, Kind, Packet, Payload},
    types::{EventType, QpState, QpType},
    wire::{self, Control, Encoded, Message, Refused},
};

/// Node slots (the top 8 bits of a 24-bit QPN); 0 is the in-process-only numbering.
const SLOTS: u8 = 255;
/// Payload bytes per datagram: well under the default socket send buffer (~208 KiB).
const FRAGMENT: usize = 60 * 1024;
const MAGIC: u32 = u32::from_le_bytes(*b"REMU");
const HEADER: usize = 20;
pub(super) const FIRST: u8 = 1;
pub(super) const LAST: u8 = 2;
/// A datagram that carries the descriptor of the sender's ring to us.
pub(super) const RING: u8 = 4;
/// A doorbell: records wait in the sender's ring.
pub(super) const BELL: u8 = 8;
/// A datagram that carries the descriptor of the sender's exports (see `exports`).
pub(super) const EXPORTS: u8 = 16;
/// A datagram that carries the descriptor of the sender's memory moved into shared memory
/// (see `crate::shared_mem`): its name, address and length follow the header.
pub(super) const SHARED: u8 = 32;
/// A datagram that says the sender's shared memory named after the header moved back.
pub(super) const RETIRED: u8 = 64;
/// A datagram that asks for a view of the receiver's shared memory named after the header
/// (the sender carries out WRITEs there: see `exports`).
pub(super) const WANTED: u8 = 128;
/// Bytes of records per ring (one per ordered pair of nodes that talk): small enough to stay
/// in the caches as messages stream through (a ring of 4 MiB or more moves a third as fast
/// here), large enough to hold a 1 MiB message whole while the next one is written.
const RING_BYTES: usize = 2 << 20;
/// Bytes per ring record of a long message at most: the receiver places the records of a
/// WRITE or SEND as they arrive (see `engine::landing`), so smaller records overlap the two copies sooner.
/// (1 MiB WRITEs between two processes on this 2-vCPU VM, side by side: 23-25 GB/s with 64
/// KiB records against 17-19 with a quarter MiB, the largest a 2 MiB ring takes; at another
/// hour, when the VM moved data between its cores twice as fast, the two were level.)
const RECORD: usize = 64 * 1024;
/// By default (see [`FabricConfig::host_pull_min`](crate::FabricConfig::host_pull_min)), a
/// message of a reliable QP from this size on is read by its receiver straight from the
/// sender's memory where it is shared (one `memcpy`; from [`PULL_UNSHARED_MIN`] on wherever it
/// lies, with process_vm_readv), where the receiver may read it, rather than
/// streamed through the ring (two copies, overlapping as records arrive). `ib_write_bw`
/// between two processes on this 2-vCPU VM, each build's runs side by side: 16 KiB 4.7 ->
/// 6.9 GB/s, 32 KiB 5.0 -> 10.9, 64 KiB 6.0 -> 13.4..15.7, 256 KiB 9.4..9.9 -> 22.1..25.0,
/// 1 MiB 12.2..14.3 -> 15.9..21.4; 8 KiB level (3.1..3.8 either way). `ib_send_lat`: 16 KiB
/// 2.9 -> 2.2 us, 64 KiB 7.4 -> 3.8, 1 MiB 80 -> 48.
pub(crate) const PULL_MIN: usize = 16 * 1024;
// Memory that peers may only read moves into shared memory from the size of a message they
// would pull from it on (one `memcpy` then, not packets).
const _: () = assert!(crate::shared_mem::MIN_READ_ONLY_BYTES <= PULL_MIN);
/// From this size on (and from `pull_min`), a message is read by its receiver even where the
/// sender's memory is not shared (see `crate::shared_mem`): that read is `process_vm_readv`,
/// a system call that pins pages, which costs more than the ring's two copies below it.
/// `ib_write_bw` between two processes on this 2-vCPU VM, memory not shared, read against
/// streamed: 16 KiB 3.4 against 5.1 GB/s, 32 KiB 5.3 against 5.5, 64 KiB 7.0 against 4.3.
const PULL_UNSHARED_MIN: usize = 64 * 1024;
/// Payloads from this size on are placed straight from the ring (smaller ones are copied out,
/// freeing their record at once).
const LEND_MIN: usize = 2048;
/// How long a sender waits for room in a full ring before leaving the rest to the flusher.
const SEND_PATIENCE: Duration = Duration::from_millis(2);
/// How long a peer's process seen stopped is taken as stopped without looking again.
const STOPPED_LOOK: Duration = Duration::from_millis(1);
/// How long the reader watches the rings after taking something in, before it sleeps, while
/// its watches find records coming.
const READER_SPIN: Duration = Duration::from_micros(50);
/// The shortest watch: each watch that found nothing halves the next down to this one.
const READER_SPIN_MIN: Duration = Duration::from_micros(3);
/// How long the oldest record of ours in a peer's ring may wait unbegun, its reader freeing
/// nothing meanwhile, before a thread of ours that polls an empty CQ carries out the WRITEs
/// and READs waiting there itself (see `Node::carry_out_for_lagging`). Long enough for a
/// reader or an application thread that is looking to take a record in; a reader woken by a
/// doorbell may take longer, and then finds the request carried out, which only cost the
/// requester, waiting anyway, a system call. A reader at work on the oldest record is not
/// lagging; nor are the WRITEs a reader pulls (from `PULL_MIN` on) carried out for it: it may
/// be pulling the one before them, at length, and the requester copying the next meanwhile,
/// its QP locked all along, held `ib_write_bw -s 1048576` back by ~10%. `ib_write_lat`
/// between two pinned processes, 8 bytes: 536 us without, 23 us with 20 us, 8.8..9.5 us with
/// 5 us, 4.8..5.0 us with 2 us; `ib_write_bw` 8 B and 64 KiB level across these (within the
/// runs' noise).
const LAG: Duration = Duration::from_micros(2);
/// Looks of an application thread that took the rings (or looked at the socket), between two
/// of its looks for lagging peers (a clock read and a look at each peer's ring).
const LAG_LOOKS: u32 = 8;
/// Empty looks of application threads between two looks at the socket while no peer has
/// passed a ring (a system call each; see `Node::look_without_rings`).
const SOCKET_LOOKS: u32 = 64;
/// How long the reader, while an application thread polls, sleeps between looks of its own.
const POLLED_NAP: Duration = Duration::from_millis(1);

/// QPs one node can hold at once: the QPNs `s << 16 | 1..=0xffff` of its slot.
pub(crate) const NODE_QPS: u32 = 0xffff;

/// The node slot that owns `qpn`.
pub(crate) fn slot_of(qpn: u32) -> u8 {
    (qpn >> 16) as u8
}

/// Where the fabric called `name` lives: an absolute path as given, else
/// `$RDMA_EMU_RUNTIME_DIR`, `$XDG_RUNTIME_DIR` or `/tmp`, then `rdma-emu-<uid>/<name>`.
pub fn fabric_dir(name: &str) -> PathBuf {
    Location::of(name).path()
}

/// A directory of this user's own for `name`, placed and checked as a fabric's directory is
/// (created mode 0700 where missing, every directory on the way checked): its path.
pub fn private_dir(name: &str) -> io::Result<PathBuf> {
    let loc = Location::of(name);
    FabricDir::open(&loc)?;
    Ok(loc.path())
}

/// What `rdma-emu run` puts in [`ROOT_DIRS_VAR`](trust::ROOT_DIRS_VAR) for a program it runs
/// in a user namespace of its own: the directories of root's on the way to the host fabric
/// `name` and to those named relative to the runtime directory (a program may pick another
/// fabric by name), so that the program can check them (see `trust`).
pub fn root_dirs_on_the_way(name: &str) -> io::Result<String> {
    let mut pairs = trust::root_dirs(&Location::of(name))?;
    for pair in trust::root_dirs(&Location::of("default"))? {
        if !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    Ok(pairs.join(","))
}

/// What a node refused to take from its peers, by kind (see [`Fabric::host_drops`]).
///
/// [`Fabric::host_drops`]: crate::Fabric::host_drops
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostDrops {
    /// Datagrams from a process of another user, or that came without credentials.
    pub foreign: u64,
    /// Rings refused: not sealed, not the size or format of a ring, or offered for the slot
    /// of another node that still writes its own.
    pub rings: u64,
    /// Messages, fragments and ring records that broke the format.
    pub malformed: u64,
    /// Payloads to be read from a process other than the one that sent them.
    pub pulls: u64,
}

/// The counters behind [`HostDrops`].
#[derive(Debug, Default)]
struct Drops {
    foreign: AtomicU64,
    rings: AtomicU64,
    malformed: AtomicU64,
    pulls: AtomicU64,
}

impl Drops {
    fn count(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HostDrops {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HostDrops {
            foreign: get(&self.foreign),
            rings: get(&self.rings),
            malformed: get(&self.malformed),
            pulls: get(&self.pulls),
        }
    }
}

/// The slot's lock file, held (flock) while the node lives: the kernel drops it with the
/// process. A child made by `fork` shares the lock until it lets go of its copy of the
/// descriptor, which `sys` has it do at once: else the slot would outlive a dead parent
/// (its peers unaware, its connections never ended) for as long as the child lived.
#[derive(Debug)]
struct SlotLock(File);

impl SlotLock {
    fn new(file: File) -> SlotLock {
        crate::sys::let_go_in_children(file.as_raw_fd());
        SlotLock(file)
    }
}

impl Drop for SlotLock {
    fn drop(&mut self) {
        crate::sys::keep_in_children(self.0.as_raw_fd());
    }
}

/// This fabric's membership of a host fabric: its slot, its socket, its peers.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) slot: u8,
    dir: Arc<FabricDir>,
    _lock: SlotLock,
    /// The lock of its life (see `life_name`), and its incarnation, which names it.
    _life: SlotLock,
    incarnation: u128,
    inbound: Arc<Inbound>,
    /// (The QP lock's kind: looked up for every message sent, by one thread at a time.)
    peers: crate::sync::lock::Lock<FxHashMap<u8, Arc<Peer>>>,
    /// The other nodes' slots as last listed, for datagrams and frames to every node.
    others: Mutex<Listing>,
    fabric: Weak<FabricInner>,
    /// Messages of reliable QPs from this many bytes on are offered to be pulled (see
    /// [`FabricConfig::host_pull_min`](crate::FabricConfig::host_pull_min)).
    pull_min: usize,
    /// This process's id, which a message its receiver pulls names (`getpid` is a system call).
    pid: u32,
    /// What our peers may carry out for us while we are stopped (`None` if it could not be
    /// made: then they wait for us, as they always did).
    pub(crate) exports: Option<Exports>,
    /// Taken by an application thread that looks for lagging peers, by one at a time.
    lag: Mutex<LagWatch>,
    /// Whether this node sent another a request it might carry out for a lagging reader (a
    /// WRITE or READ): until it has, no look for lagging peers is made (see `progress`), and
    /// a process that only SENDs (`ib_send_lat`) makes none.
    sent_carriable: AtomicBool,
    /// Whether this node has a peer yet (a QP connected to another process's, or a message
    /// sent to one): until it has, a look without rings looks at nothing (see `progress`).
    met: AtomicBool,
    /// The fork generation of the process that joined (see [`Node::inherited`]).
    born: u64,
}

/// A listing of the fabric directory's sockets, kept while the directory does not change.
#[derive(Debug, Default)]
struct Listing {
    /// The directory's mtime when listed.
    mtime: Option<SystemTime>,
    /// When it was listed.
    taken: Option<SystemTime>,
    slots: Vec<u8>,
}

/// A directory's mtime moves in coarse clock ticks: a change within the tick of the last
/// listing leaves it unchanged, so a listing is trusted only once this much younger than it.
const MTIME_TICK: Duration = Duration::from_millis(20);

impl Listing {
    /// Whether this listing still holds for a directory of modification time `mtime`.
    fn holds(&self, mtime: SystemTime) -> bool {
        self.mtime == Some(mtime) && self.taken.is_some_and(|t| t > mtime + MTIME_TICK)
    }
}

/// The receiving side, shared by the reader thread and the threads that poll a CQ.
#[derive(Debug)]
struct Inbound {
    /// Non-blocking; the reader waits for it with poll(2).
    sock: UnixDatagram,
    /// Where `sock` is bound, and our slot: a thread that took a doorbell meant for the
    /// reader rings it again (see `receive_marked`).
    path: PathBuf,
    slot: u8,
    /// Held by whoever is receiving, so datagrams are taken and reassembled in order. (Taken
    /// at every empty poll of an application thread: a lock whose release is a plain store.)
    rx: crate::sync::lock::Lock<Rx>,
    quit: AtomicBool,
    /// Raised by the looks application threads take (see `Node::progress`), lowered by the
    /// reader: while it is raised again between the reader's looks, the reader need not be
    /// rung. (A flag rather than a count: a look finds it raised and writes nothing, where a
    /// count made every empty poll a locked instruction on a line the reader reads.)
    polled: AtomicBool,
    /// Counts the times an application thread armed a CQ to sleep on its event (see
    /// `Node::attend`): then nobody will look at the rings but the reader.
    sleepers: AtomicU64,
    /// The reader naps between application looks (it has not asked for doorbells).
    napping: AtomicBool,
    /// Whether any peer's ring is attached (`rx.rings` is not empty): until one is, an
    /// application thread looks only at the socket, every so many looks (see
    /// `Node::look_without_rings`).
    has_rings: AtomicBool,
    /// Empty looks of application threads while `has_rings` is false.
    looks_without_rings: AtomicU32,
    /// The user whose processes may send to us.
    uid: u32,
    drops: Drops,
    /// By slot, the exports its node passed us, and the process that passed them.
    peer_exports: Mutex<FxHashMap<u8, Exported>>,
    /// The rings our peers write to us, whose gates they raise while they act on our memory
    /// (see `exports`).
    gates: Mutex<Vec<Arc<Ring>>>,
    /// Views of our shared memory our peers asked for, taken off the socket and not passed
    /// yet: by slot, the process that asked and the memory's name.
    wanted: Mutex<Vec<(u8, u32, u32)>>,
    /// Whether `wanted` may hold any (a look per receive that writes nothing).
    any_wanted: AtomicBool,
    /// Whether `rx` holds an ACK deferred (written under `rx`: a look before its lock).
    ack_deferred: AtomicBool,
    /// Held (written) by a test, keeps the reader from taking anything in once it wakes, as
    /// when its thread is not scheduled for a while.
    #[cfg(test)]
    reader_held: parking_lot::RwLock<()>,
    /// ACKs sent in their short form, as records of their own.
    #[cfg(test)]
    acks_sent: AtomicU32,
}

impl Inbound {
    /// The ACK deferred in `rx` (see [`Rx::deferred`]), taken out: sent already, carried by
    /// a message (else see [`Node::pay_deferred`]).
    fn take_deferred(&self, rx: &mut Rx) -> Option<wire::Ack> {
        let ack = rx.deferred.take();
        if let Some(ack) = &ack {
            owe(&rx.rings, ack, false);
            self.ack_deferred.store(false, Ordering::Relaxed);
        }
        ack
    }

    /// Rings our own doorbell: the reader, asleep on the socket, wakes.
    fn wake_reader(&self) {
        ring_bell(&mut None, &self.path, self.slot);
    }

    /// An application thread looks at what came in: raises `polled` unless raised (a load
    /// first, so steady polling writes nothing to the line the reader reads).
    fn mark_polled(&self) {
        if !self.polled.load(Ordering::Relaxed) {
            self.polled.store(true, Ordering::Relaxed);
        }
    }
}

/// A peer's exports and the process that passed them to us.
type Exported = (Arc<PeerExports>, Arc<PeerProcess>);

#[derive(Debug)]
struct Rx {
    buf: Vec<u8>,
    /// See [`Batch::last_qp`].
    last_qp: Option<(u32, std::sync::Weak<crate::qp::QpShared>)>,
    /// See [`Batch::passed`].
    passed: Vec<std::sync::Weak<crate::qp::QpShared>>,
    /// [`Batch::kept`]'s room, empty between receives (made anew for each, it was an
    /// allocation whenever the reader took in a record to keep).
    kept: Vec<Record>,
    /// [`Batch::ready`]'s, [`Batch::multicast`]'s and [`Batch::xrc`]'s room, empty between
    /// receives.
    ready: engine::QpList,
    multicast: Vec<Packet>,
    xrc: Vec<Packet>,
    /// Per source, the message being reassembled (its fragments arrive in order).
    partial: Partials,
    /// The rings other nodes write to us, by their slot.
    rings: Vec<(u8, Arc<Ring>)>,
    /// The ACK owed at the end of an application thread's look that took in SENDs or WRITEs,
    /// left to the node's next move: carried by the next request its QP sends to the QP the
    /// ACK is for ([`wire::carry_ack`]: the reply of a ping-pong, whose receiver then takes in
    /// one record rather than two), or sent at the next look at the rings by any thread (the
    /// reader's too), or as an application thread arms a CQ to sleep ([`Node::attend`]). An
    /// ACK is late so only while the application neither posts nor polls an empty CQ: as long
    /// as a message that came meanwhile waits to be taken in.
    deferred: Option<wire::Ack>,
}

/// Says, in the ring its node writes to us, that we owe `ack` (or no longer do), so that
/// the node takes it in should our process die first (see `ring::OWED_AT`).
fn owe(rings: &[(u8, Arc<Ring>)], ack: &wire::Ack, owed: bool) {
    const _: () = assert!(wire::ACK_LEN <= ring::OWED_MAX);
    let bytes = ack.encode();
    for (_, r) in rings.iter().filter(|(s, _)| *s == slot_of(ack.dst.2)) {
        r.owe(owed.then_some(&bytes[..]));
    }
}

/// A peer node whose process takes nothing in now: stopped, or its threads not scheduled (see
/// [`Node::absent_peer`]). Our QPs may carry out their WRITEs and READs to it themselves.
pub(crate) struct AbsentPeer {
    peer: Arc<Peer>,
    exports: Arc<PeerExports>,
    process: Arc<PeerProcess>,
    /// Where in our ring to it the search for the next request resumes.
    from: u64,
    /// The peer runs, but its reader lags: the records it would pull from us are left to it
    /// (it may be pulling the one before them, at length).
    pub(crate) lagging: bool,
    /// Only WRITEs into memory we have a view of are carried out (no system call).
    pub(crate) views_only: bool,
    /// Where the request's record lies in our ring to the peer if we wrote it claimed (see
    /// [`Claimed`]).
    pub(crate) claimed: Option<u32>,
}

impl AbsentPeer {
    /// Carries out `req`, a request our QP has not sent, in the stopped process, if its
    /// exports allow it; whether it did.
    pub(crate) fn carry_out_unsent(&self, req: exports::Request<'_>) -> bool {
        let mut tx = self.peer.tx.lock();
        let Some(ring) = tx.ring.clone() else { return false };
        self.place(&mut tx, &ring, req)
    }

    /// Carries out `req`, a request our QP has not sent, if its exports allow it, the peer's
    /// reader is not at work (asleep, or napping on its application's looks: one at work takes
    /// records in as they come, its copies beside ours; one asleep, woken by the bell, may
    /// wait for a core a spinning application holds) and nothing we sent the peer before is
    /// still to be taken in (every record of our ring to it freed or placed, nothing queued for
    /// it): landing now, it overtakes nothing. Whether it did.
    pub(crate) fn carry_out_ahead(&self, req: exports::Request<'_>) -> bool {
        let mut tx = self.peer.tx.lock();
        let Some(ring) = tx.ring_at_rest().cloned() else { return false };
        let unattended = ring.napping() || ring.asleep();
        if !unattended || !tx.backlog.is_empty() || !ring.all_settled() {
            return false;
        }
        self.place(&mut tx, &ring, req)
    }

    /// Carries out `req` (see `exports::place`), `ring` being ours to the peer; whether it
    /// did. One written by system calls into memory the peer moved into shared memory asks
    /// the peer, once, for a view of it: the next are written through that.
    fn place(&self, tx: &mut PeerTx, ring: &Ring, req: exports::Request<'_>) -> bool {
        match exports::place(&self.exports, &self.process, ring, req, self.views_only) {
            exports::Placed::No => false,
            exports::Placed::Yes => true,
            exports::Placed::Unviewed(id) => {
                self.peer.want_view(tx, id);
                !self.views_only
            }
        }
    }

    /// Carries out `req`, the request at `psn` that our QP sent, in the stopped process, if
    /// its exports allow the request and its record still waits in our ring to it, not taken
    /// up by the stopped process's responder: the record is then marked carried out. Whether
    /// it was.
    pub(crate) fn carry_out(&mut self, psn: u32, req: exports::Request<'_>) -> bool {
        let mut from = self.from;
        let done = self.carry_out_record(psn, req, Some(&mut from));
        self.from = from;
        done
    }

    /// Carries out `req`, the request at `psn` that our QP just sent, if its record is the
    /// oldest our ring to the peer holds neither freed nor placed, and the peer's reader has
    /// not begun it: no earlier request of ours is still to land there, so this one landing
    /// first breaks no order. Whether it was.
    pub(crate) fn carry_out_first(&self, psn: u32, req: exports::Request<'_>) -> bool {
        self.carry_out_record(psn, req, None)
    }

    /// [`AbsentPeer::carry_out`] (searching from `from` on) or [`AbsentPeer::carry_out_first`]
    /// (`None`).
    fn carry_out_record(
        &self,
        psn: u32,
        req: exports::Request<'_>,
        from: Option<&mut u64>,
    ) -> bool {
        let (dst_qpn, src_qpn) = (req.dst.1, req.src_qpn);
        // Held throughout: nothing is written to the ring while we look through it.
        let mut tx = self.peer.tx.lock();
        let Some(ring) = tx.ring_at_rest().cloned() else { return false };
        // A lagging peer pulls those records itself (see `LAG`).
        let not_pulled = self.lagging;
        let wanted = |b: &[u8]| {
            request_ids(b).is_some_and(|(dst, src, p)| dst == dst_qpn && src == src_qpn && p == psn)
                && !(not_pulled && wire::pulled(&b[HEADER..]))
        };
        let written = self.claimed.and_then(|at| ring.claim_written(at as usize, wanted));
        let claim = written.or_else(|| match from {
            Some(from) => ring.claim(from, wanted),
            None => ring.claim_oldest(wanted),
        });
        let Some(claim) = claim else { return false };
        if !self.place(&mut tx, &ring, req) {
            return false;
        }
        claim.placed();
        true
    }
}

/// The destination QP, source QP and PSN of a ring record that holds a whole WRITE or READ
/// request (those a requester may carry out itself, see `engine::absent_peer`).
fn request_ids(b: &[u8]) -> Option<(u32, u32, u32)> {
    let head = FrameHead::parse(b).filter(FrameHead::whole)?;
    let (kind, src, psn) = wire::packet_ids(&b[HEADER..])?;
    matches!(kind, Kind::Write | Kind::ReadRequest).then_some((head.dst_qpn, src, psn))
}

/// Words of each thread's own (see `sync::tls`: in the C shim a `thread_local!` costs a call
/// to `__tls_get_addr` at each access, and these are read at every look at the rings and every
/// message sent).
mod this_thread {
    crate::sync::tls::tls_word! {
        /// Its [`Looks`](super::Looks), packed.
        pub(super) mod looks = "rdma_emu_host_looks";
    }
    crate::sync::tls::tls_word! {
        /// See [`rang_bell`](super::rang_bell) (0 or 1).
        pub(super) mod rang = "rdma_emu_host_rang";
    }
    crate::sync::tls::tls_word! {
        /// See [`holding_bell`](super::holding_bell): 0, or the [`Hold`](super::Hold) held.
        pub(super) mod hold_bell = "rdma_emu_host_hold_bell";
    }
    crate::sync::tls::tls_word! {
        /// Whether the thread is inside `receive` (0 or 1): the replies it sends must never
        /// wait.
        pub(super) mod receiving = "rdma_emu_host_receiving";
    }
    crate::sync::tls::tls_word! {
        /// Whether the thread is a node's reader (see `read_loop`), whom doorbells are for
        /// (0 or 1).
        pub(super) mod reader = "rdma_emu_host_reader";
    }
}

/// Whether this thread is inside `receive`.
#[inline(always)]
fn receiving() -> bool {
    this_thread::receiving::get() != 0
}

/// Marks this thread inside `receive` or not; whether it was.
#[inline(always)]
fn set_receiving(inside: bool) -> bool {
    this_thread::receiving::replace(inside.into()) != 0
}

/// Whether this thread is a node's reader.
fn is_reader() -> bool {
    this_thread::reader::get() != 0
}

/// A polling thread's looks: those in a row that found another thread taking the rings in,
/// and when to yield the CPU to it; and those that took the rings, which pace the look for
/// lagging peers (see `Node::carry_out_for_lagging`).
///
/// A process pinned to one core (`taskset`, a container's CPU quota, or two processes on two
/// cores each with a reader thread) runs its reader and its polling application thread there
/// in turn. When the scheduler preempts the reader in the middle of taking records in, the
/// poller, spinning on an empty CQ, finds the rings taken look after look for the rest of its
/// time slice (milliseconds), and what the reader holds (the ACKs that free the poller's send
/// queue) waits as long. Seen as `ib_send_bw -s 4096` between two pinned processes running at
/// 0.14 Mpps in one run and 0.7 the next: the client's polls found the rings taken 88% of the
/// time, its reader holding them half the run. Yielding after a few dozen such looks (each well
/// under a microsecond) costs a system call where the holder runs on another core, and gives
/// it the CPU where it waits for this one.
#[derive(Debug, Default)]
struct Looks {
    locked_out: u32,
    taken: u32,
}

impl Looks {
    /// Looks in a row that found the rings taken before the poller yields.
    const LOCKED_OUT: u32 = 64;

    /// Runs `f` on the calling thread's looks.
    #[inline(always)]
    fn of_this_thread<R>(f: impl FnOnce(&mut Looks) -> R) -> R {
        this_thread::looks::with(|word| {
            let w = word.get();
            let mut looks = Looks { locked_out: w as u32, taken: (w >> 32) as u32 };
            let r = f(&mut looks);
            word.set(u64::from(looks.locked_out) | u64::from(looks.taken) << 32);
            r
        })
    }

    /// Counts a look that found the rings taken: whether to yield now.
    fn missed(&mut self) -> bool {
        let n = self.locked_out + 1;
        self.locked_out = if n == Self::LOCKED_OUT { 0 } else { n };
        n == Self::LOCKED_OUT
    }

    /// A look took the rings (or found none to take): the run of misses ends. Whether lagging
    /// peers are due a look (every [`LAG_LOOKS`]).
    fn took(&mut self) -> bool {
        self.locked_out = 0;
        self.taken = self.taken.wrapping_add(1);
        self.taken.is_multiple_of(LAG_LOOKS)
    }
}

/// Which peers' readers have taken nothing in for a while (see `Node::carry_out_for_lagging`).
///
/// A polling thread looks every [`LAG_LOOKS`] looks, but reads a peer's ring (its head, and
/// the state of our oldest record there: words the peer's reader writes) only when records
/// there might be carried out (WRITEs, READs: see [`Ring::carriable_to`]), and only once
/// [`LAG`] has passed since it found them there, not seen freed. Read at every look, those
/// lines went back and forth between the two processes' cores in a ping-pong, where the
/// peer's reader takes and frees our records (`ib_send_lat` between two pinned processes,
/// half a round trip, in a run where the VM's cores were slow to pass lines: 1.05..1.09 us
/// with those reads at every look, 0.87..0.92 us with none).
#[derive(Debug, Default)]
struct LagWatch {
    peers: smallvec::SmallVec<[Watched; 4]>,
}

/// A peer's ring as [`LagWatch`] last looked at it.
#[derive(Debug, Clone, Copy)]
struct Watched {
    slot: u8,
    /// How far its reader had freed our ring at the last look at it.
    freed: u64,
    /// If records that might be carried out were written beyond that: how far, and since
    /// when.
    unfreed: Option<(u64, Instant)>,
}

impl LagWatch {
    /// The peers whose oldest record of ours is unbegun, records of ours that might be
    /// carried out there unfreed for [`LAG`]; each such peer is then given another `LAG`
    /// before it is named again. (Held in place: a slow machine finds peers lagging at every
    /// look.)
    fn lagging(
        &mut self,
        peers: &crate::sync::lock::Lock<FxHashMap<u8, Arc<Peer>>>,
    ) -> smallvec::SmallVec<[Arc<Peer>; 4]> {
        // The clock is read only for a peer with such records.
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(Instant::now);
        let mut lagging = smallvec::SmallVec::new();
        let mut watched = smallvec::SmallVec::new();
        for (&slot, peer) in peers.lock().iter() {
            // A peer not looked at yet has freed nothing we know of.
            let Watched { freed, unfreed, .. } = (self.peers.iter().find(|p| p.slot == slot))
                .copied()
                .unwrap_or(Watched { slot, freed: 0, unfreed: None });
            // A sender at it now, or the flusher writing into its ring without `tx` (records
            // the reader frees meanwhile may be written again under the look): looked at next
            // time.
            let tx = peer.tx.try_lock();
            let Some(ring) = tx.as_ref().and_then(|tx| tx.ring_at_rest()) else {
                watched.push(Watched { slot, freed, unfreed });
                continue;
            };
            let carriable = ring.carriable_to();
            let (mark, since) = match unfreed {
                Some(u) => u,
                None if carriable <= freed => {
                    watched.push(Watched { slot, freed, unfreed: None });
                    continue;
                }
                // Written beyond what we saw freed: looked at once LAG has passed.
                None => (carriable, now()),
            };
            if now().duration_since(since) < LAG {
                watched.push(Watched { slot, freed, unfreed: Some((mark, since)) });
                continue;
            }
            let freed = ring.freed_to();
            let unfreed = if freed >= mark {
                // All we had written then is freed: what we wrote since is watched from now.
                (carriable > freed).then(|| (carriable, now()))
            } else if ring.oldest_unbegun() {
                lagging.push(peer.clone());
                Some((carriable, now()))
            } else {
                // The reader is at work on our oldest record: looked at again after LAG.
                Some((mark, now()))
            };
            watched.push(Watched { slot, freed, unfreed });
        }
        self.peers = watched;
        lagging
    }
}

/// Who sent what `receive` takes in: the source slot it claims, and the process the kernel
/// named (for a ring, the one that passed it to us). Messages are reassembled per source, so
/// a process that claims another's slot garbles only its own messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Source {
    slot: u8,
    pid: u32,
}

impl Node {
    /// Claims the lowest free slot in `dir`, binds its socket, clears what dead nodes left,
    /// and starts the reader thread.
    pub(crate) fn join(
        loc: &Location,
        fabric: Weak<FabricInner>,
        pull_min: usize,
    ) -> crate::Result<Node> {
        Node::try_join(loc, fabric, pull_min).map_err(|e| {
            eprintln!("rdma-emu: cannot join the host fabric at {}: {e}", loc.path().display());
            let errno = e.raw_os_error().map_or(Errno::EACCES, Errno);
            Error::new(errno, "cannot join the host fabric (see RDMA_EMU_FABRIC)")
        })
    }

    fn try_join(loc: &Location, fabric: Weak<FabricInner>, pull_min: usize) -> io::Result<Node> {
        let dir = Arc::new(FabricDir::open(loc)?);
        let mut claimed = None;
        for slot in 1..=SLOTS {
            let lock = dir.open_file(&lock_name(slot), true)?;
            if lock.try_lock().is_ok() {
                claimed = Some((slot, lock));
                break;
            }
        }
        let Some((slot, mut lock)) = claimed else {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "all 255 node slots are taken"));
        };
        // Before the socket is bound, hence before any QP of ours can be connected to; the
        // life's lock before anyone can read the incarnation.
        let incarnation = new_incarnation();
        // Made under a hidden name and locked before it takes its own: a node sweeping the
        // directory for the lives of dead nodes (see `sweep`) never finds it unlocked.
        let (hidden, name) = (format!(".{}", life_name(incarnation)), life_name(incarnation));
        let life = dir.open_file(&hidden, true)?;
        life.try_lock()?;
        std::fs::rename(dir.entry(&hidden), dir.entry(&name))?;
        let before = incarnation_in(&dir.read_file(&lock_name(slot)).unwrap_or_default());
        write_incarnation(&mut lock, incarnation)?;
        // The node we follow in the slot is dead (its lock was free): its life is over.
        if before != 0 {
            let _ = dir.remove(&life_name(before));
        }
        sweep(&dir, slot)?;
        dir.remove(&sock_name(slot))?;
        let path = dir.entry(&sock_name(slot));
        let sock = UnixDatagram::bind(&path).map_err(|e| {
            let shown = dir.shown().join(sock_name(slot));
            io::Error::new(e.kind(), format!("binding {}: {e}", shown.display()))
        })?;
        sock.set_nonblocking(true)?;
        crate::sys::pass_credentials(sock.as_raw_fd())?;
        let partial = Partials::default();
        let rx = Rx {
            buf: vec![0; HEADER + FRAGMENT],
            partial,
            rings: Vec::new(),
            last_qp: None,
            passed: Vec::new(),
            kept: Vec::new(),
            ready: engine::QpList::new(),
            multicast: Vec::new(),
            xrc: Vec::new(),
            deferred: None,
        };
        let rx = crate::sync::lock::Lock::new(rx);
        let (quit, polled) = (AtomicBool::new(false), AtomicBool::new(false));
        let (uid, drops) = (crate::sys::uid(), Drops::default());
        let (sleepers, napping) = (AtomicU64::new(0), AtomicBool::new(false));
        let (peer_exports, gates) = (Mutex::default(), Mutex::default());
        let inbound = Arc::new(Inbound {
            sock,
            path: path.clone(),
            slot,
            rx,
            quit,
            polled,
            sleepers,
            napping,
            has_rings: AtomicBool::new(false),
            looks_without_rings: AtomicU32::new(0),
            uid,
            drops,
            peer_exports,
            gates,
            wanted: Mutex::default(),
            any_wanted: AtomicBool::new(false),
            ack_deferred: AtomicBool::new(false),
            #[cfg(test)]
            reader_held: parking_lot::RwLock::new(()),
            #[cfg(test)]
            acks_sent: AtomicU32::new(0),
        });
        let (reader, weak) = (inbound.clone(), fabric.clone());
        crate::sys::spawn(format!("rdma-emu-node{slot}"), move || read_loop(&reader, &weak))?;
        let (peers, others) = (Default::default(), Mutex::default());
        let exports = Exports::create().ok();
        let (lag, sent_carriable) = (Mutex::default(), AtomicBool::new(false));
        Ok(Node {
            slot,
            dir,
            _lock: SlotLock::new(lock),
            _life: SlotLock::new(life),
            incarnation,
            inbound,
            peers,
            others,
            fabric,
            pull_min,
            pid: std::process::id(),
            exports,
            lag,
            sent_carriable,
            met: AtomicBool::new(false),
            born: crate::sys::fork_generation(),
        })
    }

    /// Whether this is a copy a child made by `fork` holds of its parent's node. The parent
    /// still is that node: its socket, its slot, the rings it shares with its peers. The copy
    /// takes nothing in (what it read would be the parent's), sends nothing at exit, and
    /// leaves the parent's socket in place; the child joins as a node of its own for objects
    /// it makes (as a child opens a device anew, in rdma-core), and the parent's objects,
    /// which it may not use (the verbs' rule for a child), see nothing more and send nothing:
    /// a record the child wrote to a ring the parent writes would garble the parent's stream.
    pub(crate) fn inherited(&self) -> bool {
        self.born != crate::sys::fork_generation()
    }

    /// Withdraws our MR `(dev, rkey)` from the exports; returns once no peer can be writing or
    /// reading it on our behalf.
    pub(crate) fn withdraw_mr(&self, dev: u32, rkey: u32) {
        if self.exports.as_ref().is_some_and(|e| e.clear_mr(dev, rkey)) {
            let gates: Vec<Arc<Ring>> = {
                let mut g = self.inbound.gates.lock();
                g.retain(|r| !r.abandoned());
                g.clone()
            };
            exports::wait_for_peers(&gates);
        }
    }

    /// The node of `dst_qpn`, if it passed us its exports and its process is stopped
    /// (SIGSTOP, a debugger) or, if `lagging` (the caller found our oldest record in its ring
    /// unbegun a while, see [`LAG`]), running: our QPs may then carry out their requests to it
    /// themselves.
    pub(crate) fn absent_peer(&self, dst_qpn: u32, lagging: bool) -> Option<AbsentPeer> {
        if self.inherited() {
            return None;
        }
        let slot = slot_of(dst_qpn);
        let peer = self.peers.lock().get(&slot).cloned()?;
        let known = self.inbound.peer_exports.lock().get(&slot).cloned();
        let (exports, process) = known.filter(|(_, p)| p.pid() == peer.pid())?;
        (lagging || peer.stopped()).then_some(AbsentPeer {
            peer,
            exports,
            process,
            from: 0,
            lagging,
            views_only: false,
            claimed: None,
        })
    }

    /// What this node refused to take from its peers so far.
    pub(crate) fn drops(&self) -> HostDrops {
        self.inbound.drops.snapshot()
    }

    /// How many peers' rings are attached, once no thread is taking in what they hold (the
    /// receive that drops a broken ring delivers what it read before it lets go of them).
    #[cfg(test)]
    pub(super) fn rings_settled(&self) -> usize {
        self.inbound.rx.lock().rings.len()
    }

    /// Takes in and services what the rings hold, unless another thread is already at it;
    /// whether anything was delivered. Called by threads that poll an empty CQ: a spinning
    /// application may hold the CPU the reader thread would need.
    ///
    /// Inline, and only loads of words nobody writes then until there is something to look at
    /// (a thread spinning on an empty CQ looks millions of times): the rest is out of line.
    #[inline]
    pub(crate) fn progress(&self, fabric: &FabricInner) -> bool {
        // Without a ring (no process has sent to us through one) there is nothing to look at;
        // nor does a sender hold back a doorbell for the looks not counted then.
        if self.inbound.has_rings.load(Ordering::Acquire) {
            return self.look_at_rings(fabric);
        }
        // A process that talks to no other (the shim joins the host fabric all the same):
        // its threads polling each other's CQs write nothing shared here.
        self.met.load(Ordering::Relaxed) && self.look_without_rings(fabric)
    }

    /// [`Node::progress`] before any peer passed us a ring: every [`SOCKET_LOOKS`] empty
    /// looks, takes in what waits on the socket (a ring offered, messages sent as datagrams),
    /// as the reader would.
    ///
    /// The reader wakes for it, but on a core it shares with this thread (a process pinned
    /// to one core, or two processes spinning on two cores) it runs only when this thread's
    /// time slice ends: `ib_send_bw` between two pinned processes waited ~2-4 ms for each
    /// side's ring to be taken in (the client's first 128 SENDs, then their ACKs), 1,000
    /// SENDs reading 0.1-0.3 Mpps. What comes later comes in rings, which this thread reads.
    #[inline(never)]
    fn look_without_rings(&self, fabric: &FabricInner) -> bool {
        if self.inherited() {
            return false;
        }
        self.inbound.mark_polled();
        // The node's count, not the thread's: a thread polling CQs of two nodes in turn (two
        // fabrics in one process) would find its count's multiples at one of them only.
        // Racing threads may lose a count or two: a look comes a little later.
        let looks = self.inbound.looks_without_rings.load(Ordering::Relaxed);
        self.inbound.looks_without_rings.store(looks.wrapping_add(1), Ordering::Relaxed);
        if looks.is_multiple_of(SOCKET_LOOKS)
            && let Some(mut rx) = self.inbound.rx.try_lock()
            && receive(&self.inbound, &mut rx, fabric, true)
        {
            return true;
        }
        self.sent_carriable.load(Ordering::Relaxed)
            && Looks::of_this_thread(Looks::took)
            && self.carry_out_for_lagging(fabric)
    }

    #[inline(never)]
    fn look_at_rings(&self, fabric: &FabricInner) -> bool {
        if self.inherited() {
            return false;
        }
        self.inbound.mark_polled();
        let Some(mut rx) = self.inbound.rx.try_lock() else {
            if Looks::of_this_thread(Looks::missed) {
                // The thread taking the rings in (our reader, most often) may be descheduled
                // on this very core, by us: let it finish.
                std::thread::yield_now();
            }
            return false;
        };
        let lag_due = Looks::of_this_thread(Looks::took);
        if receive_as(&self.inbound, &mut rx, fabric, false, true) {
            return true;
        }
        drop(rx);
        lag_due && self.sent_carriable.load(Ordering::Relaxed) && self.carry_out_for_lagging(fabric)
    }

    /// Every few looks (see [`Looks::took`]): carries out the WRITEs and READs of our QPs
    /// waiting in the ring of a peer whose reader has taken nothing in for [`LAG`]. Whether
    /// any was.
    ///
    /// A process whose thread spins on memory for a WRITE to land (`ib_write_lat`, and any
    /// program that waits on a flag in its buffer) enters no verb while it waits, so only its
    /// reader thread can take the WRITE in; and on the core the spinning thread holds, the
    /// scheduler runs the reader only when the spinner's slice ends (~0.6 ms a round trip
    /// here). The requester, waiting on its own CQ, carries the WRITE out instead, as it does
    /// for a stopped peer (see `engine::absent_peer`).
    /// (Called only once this node has sent another a WRITE or READ: see `progress`.)
    #[inline(never)]
    fn carry_out_for_lagging(&self, fabric: &FabricInner) -> bool {
        // Not while fault rules or a packet trace must see the answers as sent.
        if !fabric.express() {
            return false;
        }
        let lagging = {
            let Some(mut watch) = self.lag.try_lock() else { return false };
            watch.lagging(&self.peers)
        };
        let mut any = false;
        for peer in lagging {
            // Our QPs whose requests wait there unbegun, each once.
            let mut qpns = smallvec::SmallVec::<[u32; 4]>::new();
            {
                let tx = peer.tx.lock();
                let Some(ring) = tx.ring_at_rest() else { continue };
                // Not one the reader pulls: it may well be pulling the one before, at length.
                ring.unbegun(|b| {
                    if let Some((_, src, _)) = request_ids(b)
                        && !wire::pulled(&b[HEADER..])
                        && !qpns.contains(&src)
                    {
                        qpns.push(src);
                    }
                    qpns.len() < qpns.inline_size()
                });
            }
            for qpn in qpns {
                if let Some(qp) = fabric.lookup_qp_any(qpn) {
                    any |= engine::absent_peer::carry_out_for_lagging(&qp);
                }
            }
        }
        any
    }

    /// Called when an application thread arms a CQ and is about to sleep on its event: a
    /// reader napping on the strength of that thread's earlier looks is woken, so that what
    /// arrives next is taken in (and the event raised) at once, not at the end of the nap.
    pub(crate) fn attend(&self) {
        self.inbound.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.inbound.napping.load(Ordering::SeqCst) {
            self.inbound.wake_reader();
        }
        // Nobody may look at the rings for a while: the ACK deferred goes now (a thread that
        // holds `rx` is receiving, and paid it first).
        if self.inbound.ack_deferred.load(Ordering::Relaxed)
            && let Some(mut rx) = self.inbound.rx.try_lock()
        {
            self.pay_deferred(&mut rx);
        }
    }

    /// Sends the ACK deferred in `rx`, if any (`rx` held: nobody defers another meanwhile).
    fn pay_deferred(&self, rx: &mut Rx) {
        if let Some(ack) = rx.deferred.take() {
            self.send_deferred(&ack);
            owe(&rx.rings, &ack, false);
            self.inbound.ack_deferred.store(false, Ordering::Release);
        }
    }

    /// Before a message that must not overtake an ACK this node owes: waits for a thread
    /// taking messages in to be done (it pays what its batch owes before it lets go of
    /// `rx`: a completion the application polled may come from a batch still being taken
    /// in), and sends the ACK an application thread's look deferred. A connection manager's
    /// message must not overtake one: the peer acts on a DREQ by moving its QP to the error
    /// state, which flushes the sends the ACK would have completed (`fi_pingpong` over rxm
    /// failed with a flushed `fin` whose receiver had taken it in and disconnected); on a NIC
    /// the ACK leaves as the message lands, long before the application can answer it. Nor
    /// must a QP's closing, which its peer takes for the end of what it sends. A thread
    /// inside `receive` (this one) paid both before it took in what it acts on. The thread
    /// that holds `rx` is waited for up to `patience`: as long as a loaded host may keep it
    /// off its core ([`SETTLE_WAIT`]; 1,000 yields let a CI run's rxm `fin` be flushed
    /// again) where the caller holds no lock it may need, briefly ([`SETTLE_SPIN`]) where
    /// the caller may (a QP's, as it closes: see [`FabricInner::settle_acks`]).
    pub(crate) fn settle_deferred(&self, patience: Duration) {
        if receiving() {
            return;
        }
        let start = Instant::now();
        loop {
            if let Some(mut rx) = self.inbound.rx.try_lock() {
                return self.pay_deferred(&mut rx);
            }
            // Yields first (a batch ends in microseconds), then naps: a holder preempted for
            // a scheduler's slice or more is not raced for its core.
            match start.elapsed() {
                w if w >= patience => return,
                w if w < SETTLE_SPIN => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }

    /// Sends an ACK deferred (see [`Rx::deferred`]) as a reply is sent: never waiting for
    /// room (its sender holds `rx`, which the peer's own replies may wait for).
    fn send_deferred(&self, ack: &wire::Ack) {
        let was = set_receiving(true);
        self.send_ack(ack);
        set_receiving(was);
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

    /// Whether another node holds `slot` (its numbers name objects of a process on the fabric).
    pub(crate) fn slot_taken(&self, slot: u8) -> bool {
        self.live_slots().contains(&slot)
    }

    /// The slots of the other nodes that have a socket (live, or dead and not swept yet).
    /// Listed again only when the directory changed: one `stat` per call otherwise.
    fn live_slots(&self) -> Vec<u8> {
        let Ok(mtime) = self.dir.mtime() else { return Vec::new() };
        let mut others = self.others.lock();
        if !others.holds(mtime) {
            let taken = SystemTime::now();
            let Ok(names) = self.dir.names() else { return Vec::new() };
            let slots = names
                .iter()
                .filter_map(|name| name.strip_suffix(".sock")?.parse::<u8>().ok())
                .filter(|&slot| slot != self.slot)
                .collect();
            *others = Listing { mtime: Some(mtime), taken: Some(taken), slots };
        }
        others.slots.clone()
    }

    fn send_to(&self, slot: u8, pkt: &Packet) {
        // A child's copy of its parent's node sends nothing (see `inherited`): what a child
        // posts to an inherited QP is lost, as on a wire to nowhere.
        if self.inherited() {
            return;
        }
        // The ACK a look deferred for the QP a WRITE goes to rides on it the short way
        // (`send_whole`); this way it goes just before it: the requester it completes may be
        // waiting for nothing else (a WRITE answered by a WRITE, neither side polling). (Not
        // before a SEND: perftest's handshake over the CM, so quickened, lost its own race
        // to listen for its data connection most of the time.)
        if pkt.kind == Kind::Write
            && self.inbound.ack_deferred.load(Ordering::Relaxed)
            && !receiving()
            && let Some(mut rx) = self.inbound.rx.try_lock()
            && rx.deferred.is_some_and(|a| a.dst.2 == pkt.dst_qpn)
        {
            self.pay_deferred(&mut rx);
        }
        let peer = self.peer(slot);
        let msg = Encoded::packet(pkt);
        // Large (see `pulls`) or more than the ring holds whole, or a reply the ring has no
        // room for now (the reader's replies never wait, and would go the slow way, as
        // datagrams): read from here, where allowed. (Smaller messages skip the peer's lock,
        // unless they are replies; no ring holds less than half its bytes whole.)
        let replying = receiving();
        let pull = (replying || msg.len() >= self.pull_min.min(RING_BYTES / 2))
            && wire::pullable(pkt)
            && peer.better_pulled(msg.len(), replying, self.pulls(msg.len(), || in_shared(pkt)))
            && self.reliable(pkt.src_qpn);
        let msg = if pull {
            for m in pkt.payload.ranges() {
                if let Some(shared) = m.region.shared_in(m.offset, m.len) {
                    peer.offer_shared(shared);
                }
            }
            Encoded::pulled(pkt, self.pid)
        } else {
            msg
        };
        // A WRITE lands unannounced (see `Ring::take_bell`); the peer's reader is rung for one
        // sent alone (see `claiming`): a stream's are taken in by the thread that looks for
        // the completions of what it sends meanwhile, or the next that is sent alone.
        let lands = CLAIM_WRITTEN.get() && pkt.kind == Kind::Write && pkt.imm.is_none();
        peer.send(pkt.dst_qpn, &msg, lands);
        if matches!(pkt.kind, Kind::Write | Kind::ReadRequest) {
            self.note_carriable_sent();
        }
    }

    /// Whether a message of `len` bytes is read by the peer from our memory, if the peer may
    /// (see `Peer::better_pulled`), rather than streamed through the ring: from `pull_min` on
    /// out of shared memory (`shared`: one `memcpy` by the reader), from
    /// [`PULL_UNSHARED_MIN`] on out of any.
    fn pulls(&self, len: usize, shared: impl FnOnce() -> bool) -> bool {
        len >= self.pull_min && (len >= PULL_UNSHARED_MIN || shared())
    }

    /// Whether a message of `len` bytes is short enough to go written whole into one record
    /// (`engine::leaving`, `engine::arriving`), below `pull_min`. (Above it, between 16 and 64
    /// KiB, whole records gave `ib_send_bw` and `ib_read_bw` a slow mode in some runs, a fifth
    /// of their rate, not yet understood; the packet path streams them steadily.)
    pub(crate) fn whole(&self, len: usize) -> bool {
        len < self.pull_min
    }

    /// Writes a message of `len` bytes, which `fill` lays out (returning `false` to give up),
    /// to the node of our peer QP `dst_qpn` as one record of its ring, if that can be done now:
    /// the ring set up, nothing of ours queued before it, room for it. Whether it was sent (if
    /// not, nothing was: the caller sends the message the general way), and, for a message
    /// sent `placing`, what [`Node::settle`] must be given after the attempt to carry it out.
    pub(crate) fn send_whole(
        &self,
        dst_qpn: u32,
        len: usize,
        how: Whole,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> (bool, Option<Claimed>) {
        if self.inherited() {
            return (false, None);
        }
        // The ACK an application thread's look deferred, if this message may carry it (`rx`
        // held only then).
        let mut rx = match self.inbound.ack_deferred.load(Ordering::Relaxed) {
            true => self.inbound.rx.try_lock(),
            false => None,
        }
        .filter(|rx| rx.deferred.is_some_and(|a| a.dst.2 == dst_qpn));
        let carry = rx.as_ref().and_then(|rx| rx.deferred.as_ref());
        let send = |p: &Arc<Peer>| p.send_whole(dst_qpn, len, how, carry, fill);
        let (sent, carried, claimed) = self.with_peer(slot_of(dst_qpn), send);
        if carried && let Some(rx) = rx.as_mut() {
            self.inbound.take_deferred(rx);
        }
        if sent && how.carriable {
            self.note_carriable_sent();
        }
        (sent, claimed)
    }

    /// After a request sent for its requester to carry out ([`Whole::placing`], [`claiming`])
    /// and the attempt: unless `placed`, its record, if written claimed, is the peer's to take
    /// in, and the peer's reader, if it naps on its application's looks (which a thread
    /// spinning on memory for the request to land does not make), is rung.
    pub(crate) fn settle(&self, claimed: Claimed, placed: bool) {
        if placed || !claimed.unattended() {
            return;
        }
        self.with_peer(claimed.slot, |p| {
            let mut tx = p.tx.lock();
            let Some(ring) = tx.ring.clone() else { return };
            if let Some(at) = claimed.at {
                ring.give_back(at as usize);
            }
            if claimed.napping && ring.rings(true) {
                ring_bell(&mut tx.sock, &p.path, p.src);
            }
        });
    }

    /// This node has sent another a request it might carry out (what `carry_out_for_lagging`
    /// waits for): stored once, so that later sends only load the word.
    fn note_carriable_sent(&self) {
        if !self.sent_carriable.load(Ordering::Relaxed) {
            self.sent_carriable.store(true, Ordering::Relaxed);
        }
    }

    /// Sends `ack` to the node of its destination QP, in its short form.
    pub(crate) fn send_ack(&self, ack: &wire::Ack) {
        #[cfg(test)]
        self.inbound.acks_sent.fetch_add(1, Ordering::Relaxed);
        self.send_bytes(ack.dst.2, &ack.encode());
    }

    /// Sends `bytes`, a whole message laid out, to the node of our peer QP `dst_qpn`: written
    /// straight into one record where it can be (no fragments laid out), else the general
    /// way, behind what waits.
    pub(crate) fn send_bytes(&self, dst_qpn: u32, bytes: &[u8]) {
        if self.inherited() {
            return;
        }
        let fill = |d: &mut [u8]| {
            d.copy_from_slice(bytes);
            true
        };
        let whole =
            |p: &Arc<Peer>| p.send_whole(dst_qpn, bytes.len(), Whole::default(), None, fill).0;
        if !self.with_peer(slot_of(dst_qpn), whole) {
            self.peer(slot_of(dst_qpn)).send(dst_qpn, &Encoded::bytes(bytes), false);
        }
    }

    /// Whether our QP `qpn` is of a reliable type: its requester's buffers stay untouched
    /// until the responder's ACK, so the responder may read them late.
    fn reliable(&self, qpn: u32) -> bool {
        let qp = self.fabric.upgrade().and_then(|f| f.lookup_qp_any(qpn));
        qp.is_some_and(|q| q.qp_type.is_reliable())
    }

    /// Tells the node of `dest_qpn` that our QP `qpn`, connected to it, was destroyed: after
    /// the packets already sent to it, so it arrives after the last ACKs (the ACKs owed for
    /// what the application saw come were settled before: see [`FabricInner::settle_acks`]).
    pub(crate) fn part(&self, qpn: u32, dest_qpn: u32) {
        if self.inherited() {
            return;
        }
        self.settle_deferred(SETTLE_SPIN);
        let msg = Encoded::control(Control::QpClosed { qpn });
        self.peer(slot_of(dest_qpn)).send(dest_qpn, &msg, false);
    }

    /// Sends a connection manager message to the node in `slot`.
    pub(crate) fn send_cm(&self, slot: u8, body: &[u8]) {
        if self.inherited() {
            return;
        }
        self.settle_deferred(SETTLE_WAIT);
        // To the node that holds the slot now: a peer kept for an earlier holder, whose death
        // its watcher has not seen (the new holder may take the slot's lock first), would
        // lose it, and a connection request lost leaves both sides waiting.
        self.current_peer(slot).send(0, &Encoded::cm(body), false);
    }

    /// Takes the name `name` in the fabric's directory for this node (a port of the
    /// connection manager): `false` if a live node holds it.
    pub(crate) fn claim(&self, name: &str) -> bool {
        let me = self.slot.to_string();
        match self.dir.create_file(name, me.as_bytes()) {
            Ok(true) => true,
            // Two processes binding the same free port at once: the file's creation decides.
            // One that is there already is kept if a live node holds it, else taken over.
            Ok(false) => {
                self.holder(name).is_none() && self.dir.write_file(name, me.as_bytes()).is_ok()
            }
            Err(_) => false,
        }
    }

    /// The live node, other than this one, that holds `name`.
    pub(crate) fn holder(&self, name: &str) -> Option<u8> {
        let held = self.dir.read_file(name).ok()?;
        let slot = std::str::from_utf8(&held).ok()?.lines().next()?.trim().parse::<u8>().ok()?;
        // Only the owner locks it exclusively (a watcher holds it shared).
        let alive = match self.dir.open_file(&lock_name(slot), false) {
            Ok(f) => f.try_lock_shared().is_err(),
            Err(_) => false,
        };
        (slot != self.slot && alive).then_some(slot)
    }

    /// Notes in the file of `name`, which this node holds, that it now listens there (what a
    /// program waiting for a server can look for).
    pub(crate) fn mark_listening(&self, name: &str) {
        let _ = self.dir.write_file(name, format!("{}\nlisten\n", self.slot).as_bytes());
    }

    /// Gives up `name` if this node holds it.
    pub(crate) fn release(&self, name: &str) {
        let mine = self.dir.read_file(name).is_ok_and(|b| {
            b.split(|&c| c == b'\n').next() == Some(self.slot.to_string().as_bytes())
        });
        if mine {
            let _ = self.dir.remove(name);
        }
    }

    /// Sends a control message to every other live node; how many took it.
    pub(crate) fn broadcast(&self, c: Control) -> usize {
        let msg = wire::encode_control(c);
        let d = frame(self.slot, FIRST | LAST, msg.len() as u32, 0, 0, &msg);
        let Ok(sock) = UnixDatagram::unbound() else { return 0 };
        let slots = self.live_slots();
        slots
            .into_iter()
            .filter(|&slot| sock.send_to(&d, self.dir.entry(&sock_name(slot))).is_ok())
            .count()
    }

    /// Records in the fabric's directory that port `port` of device `dev` is down (`up`
    /// false) or up again, before it is broadcast: a cable stays pulled for the processes
    /// that join after (a node binds its socket before it reads the records, so each joiner
    /// hears the broadcast or finds the record).
    pub(crate) fn record_port(&self, dev: u32, port: u8, up: bool) -> io::Result<()> {
        let name = port_down_name(dev, port);
        match up {
            true => self.dir.remove(&name),
            false => self.dir.write_file(&name, b"down\n"),
        }
    }

    /// The ports the fabric's directory records down, as `(device index, port)`.
    pub(crate) fn ports_down(&self) -> Vec<(u32, u8)> {
        let names = self.dir.names().unwrap_or_default();
        names.iter().filter_map(|n| parse_port_down_name(n)).collect()
    }

    /// `f` of the node in `slot` as a destination ([`Node::peer`]), under the table's lock:
    /// a message written straight into its ring so moves no reference count (two locked
    /// instructions). (Nothing under a peer's own lock takes the table's.)
    #[inline(always)]
    fn with_peer<R>(&self, slot: u8, f: impl FnOnce(&Arc<Peer>) -> R) -> R {
        if let Some(p) = self.peers.lock().get(&slot) {
            return f(p);
        }
        f(&self.peer(slot))
    }

    /// The node in `slot`, as a destination; the first use starts watching for its death.
    fn peer(&self, slot: u8) -> Arc<Peer> {
        if let Some(p) = self.peers.lock().get(&slot) {
            return p.clone();
        }
        self.new_peer(slot, self.incarnation(slot))
    }

    /// The peer for the node that holds `slot` now (see [`Node::watch`]).
    fn current_peer(&self, slot: u8) -> Arc<Peer> {
        let now = self.incarnation(slot);
        let known = self.peers.lock().get(&slot).filter(|p| p.incarnation == now).cloned();
        known.unwrap_or_else(|| self.new_peer(slot, now))
    }

    /// Which node holds `slot` now (0 if none said).
    fn incarnation(&self, slot: u8) -> u128 {
        incarnation_in(&self.dir.read_file(&lock_name(slot)).unwrap_or_default())
    }

    /// Makes the node `incarnation` in `slot` a peer (unless a thread just did), and watches
    /// for its death.
    fn new_peer(&self, slot: u8, incarnation: u128) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(&slot).filter(|p| p.incarnation == incarnation) {
            return p.clone();
        }
        let path = self.dir.entry(&sock_name(slot));
        let p = Arc::new(Peer::new(path, self.slot, incarnation));
        if let Some(old) = peers.insert(slot, p.clone()) {
            old.retire();
        }
        drop(peers);
        self.met.store(true, Ordering::Relaxed);
        self.spawn_watcher(slot, incarnation);
        p
    }

    /// Whether the node in `slot` has not taken in all we sent it: what waits in its ring or
    /// our backlog (its threads are not scheduled, or busy), or its process is stopped
    /// (SIGSTOP, a debugger) and takes nothing in until it continues. A NIC would have
    /// acknowledged for it meanwhile.
    pub(crate) fn behind(&self, slot: u8) -> bool {
        let Some(peer) = self.peers.lock().get(&slot).cloned() else { return false };
        let waiting = {
            let tx = peer.tx.lock();
            tx.ring.as_ref().is_some_and(|r| r.unread()) || !tx.backlog.is_empty()
        };
        waiting || peer.stopped()
    }

    /// Makes sure the death of the node in `slot` will be noticed: called as a QP connects to
    /// a QP there. A node that died unnoticed so far (its watcher has not run yet) may have
    /// left the slot to a new one: that is another peer, with rings and a watcher of its
    /// own. Our exports and our ring to it are passed now (see `Peer::offer_ring_early`).
    /// Which node it is (its incarnation): its death fails what connected to it then, and
    /// nothing connected to a newcomer in its slot since (see `peer_died`).
    pub(crate) fn watch(&self, slot: u8) -> u128 {
        let peer = self.current_peer(slot);
        if let Some(e) = &self.exports {
            peer.offer_exports(e);
        }
        peer.offer_ring_early();
        peer.incarnation
    }

    /// A thread that waits for the death of the node `incarnation` in `slot`: for the lock of
    /// its life (see `life_name`), which the kernel releases when that process dies, however
    /// it dies, and which no later node takes. (Waiting for the slot's lock instead, a watcher
    /// that came to it late found a newcomer holding it, and saw the death only at the
    /// newcomer's.) Then every QP connected to it fails (see `peer_died`), so a survivor
    /// waiting for a message that will never come is not left hanging. The slot's lock is
    /// held (shared) until that is done, so that no newcomer takes the slot meanwhile; if one
    /// took it first, what is connected to each is told apart by incarnation.
    fn spawn_watcher(&self, slot: u8, incarnation: u128) {
        let (dir, fabric) = (self.dir.clone(), self.fabric.clone());
        let spawned = crate::sys::spawn(format!("rdma-emu-watch{slot}"), move || {
            #[cfg(test)]
            drop(test::WATCHERS_HELD[0].read());
            let Some((lock, newcomer)) = await_death(&dir, slot, incarnation) else { return };
            #[cfg(test)]
            drop(test::WATCHERS_HELD[1].read());
            let Some(fabric) = fabric.upgrade() else { return };
            if let Some(node) = fabric.node.get() {
                let mut peers = node.peers.lock();
                // The ring we wrote to it, where it says what it owed us as it died.
                let mut to_it = None;
                if peers.get(&slot).is_some_and(|p| !newcomer || p.incarnation == incarnation) {
                    let peer = peers.remove(&slot).expect("looked at");
                    to_it = peer.tx.lock().ring.clone();
                    peer.retire();
                }
                drop(peers);
                // The kernel lets the lock go as the process exits, a moment before a
                // pidfd sees it exited: wait for that, so that its rings and exports count
                // as abandoned below (nothing else would let go of them). (The rings and
                // exports a newcomer in the slot passed are its own: not waited for.)
                let rings: Vec<Arc<Ring>> = (node.inbound.rx.lock().rings.iter())
                    .filter(|(s, _)| *s == slot && !newcomer)
                    .map(|(_, r)| r.clone())
                    .collect();
                for r in rings {
                    r.wait_abandoned(GOING);
                }
                // (A node of this very process, another fabric of it, exits only with us.)
                let process = node.inbound.peer_exports.lock().get(&slot).map(|e| e.1.clone());
                if let Some(p) = process.filter(|p| !newcomer && p.pid() != node.pid) {
                    p.wait_exited(GOING);
                }
                // What it sent before it went (its last ACKs) is queued here: take it in
                // before judging what is still outstanding; then its ring can go.
                let mut rx = node.inbound.rx.lock();
                receive(&node.inbound, &mut rx, &fabric, true);
                // Then the ACK it held back: it took in what the ACK acknowledges (its
                // application may have acted on it), as a NIC would have acknowledged it.
                if let Some(ack) = to_it.and_then(|r| r.owed()).and_then(|b| wire::Ack::peek(&b))
                    && slot_of(ack.src.2) == slot
                    && slot_of(ack.dst.2) == node.slot
                {
                    let mut pkt = Packet::new(Kind::Ack);
                    ack.into_packet(&mut pkt);
                    engine::deliver_late(&fabric, pkt);
                }
                rx.rings.retain(|(s, r)| *s != slot || !r.abandoned());
                node.inbound.has_rings.store(!rx.rings.is_empty(), Ordering::Release);
                node.inbound.gates.lock().retain(|r| !r.abandoned());
                let mut exports = node.inbound.peer_exports.lock();
                if exports.get(&slot).is_some_and(|(_, p)| p.exited()) {
                    exports.remove(&slot);
                }
            }
            peer_died(&fabric, slot, newcomer.then_some(incarnation));
            drop(lock);
        });
        // Without the thread a dead peer is still noticed by the senders' retry timers.
        drop(spawned);
    }
}

/// How long a peer may take nothing from its ring before a flush stops waiting for it: a
/// stopped process (SIGSTOP, a debugger) or a dying one. Long enough for a busy peer that is
/// merely descheduled now and then.
const STALLED: Duration = Duration::from_millis(250);

/// How long [`Node::settle_deferred`] may wait for the thread taking messages in to pay what
/// its batch owes: well past a scheduler's slice on a loaded host.
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// The first part of a settling wait, spent yielding; all of it where the caller may hold a
/// lock the thread it waits for needs.
const SETTLE_SPIN: Duration = Duration::from_micros(200);

/// How long a peer whose lock the kernel released may take to be seen exited (it is between
/// closing its files and exiting: microseconds, unless the machine is starved).
const GOING: Duration = Duration::from_secs(5);

/// What [`Fabric::flush`](crate::Fabric::flush) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Everything this process queued for others left it.
    All,
    /// What was queued for this many peers, which took nothing for a while (stopped or
    /// dying), was left behind; the rest left.
    LeftStalled(u32),
    /// The limit passed first.
    TimedOut,
}

impl Node {
    /// Waits, at most `limit`, until nothing this node sent is still queued in the process
    /// (every backlog pushed to its peer's socket), but not for peers that take nothing for
    /// [`STALLED`]: an exit must not linger on them.
    pub(crate) fn flush(&self, limit: Duration) -> Flushed {
        if self.inherited() {
            // What it queued is the parent's to send.
            return Flushed::All;
        }
        let deadline = Instant::now() + limit;
        // Take in what has arrived, so that it is acknowledged as a NIC would have done
        // before the QPs go (a thread servicing inbound packets holds this lock: its replies
        // are about to be sent).
        let until = Instant::now() + limit.min(STALLED);
        let rx = loop {
            match self.inbound.rx.try_lock() {
                None if Instant::now() < until => std::thread::sleep(Duration::from_micros(100)),
                rx => break rx,
            }
        };
        if let Some(mut rx) = rx {
            // An ACK deferred goes in any case: a node that leaves with its fabric has no
            // fabric to receive with (the peer's SEND failed after its retries).
            self.pay_deferred(&mut rx);
            if let Some(fabric) = self.fabric.upgrade() {
                receive(&self.inbound, &mut rx, &fabric, true);
            }
        }
        let peers: Vec<Arc<Peer>> = self.peers.lock().values().cloned().collect();
        let mut stalled = 0;
        for p in peers {
            // Progress: fragments leaving the backlog.
            let (mut least, mut since) = (usize::MAX, Instant::now());
            loop {
                let tx = p.tx.lock();
                let left = tx.backlog.len() + usize::from(tx.flushing);
                drop(tx);
                let now = Instant::now();
                if left == 0 {
                    break;
                }
                if left < least {
                    (least, since) = (left, now);
                } else if now - since > STALLED {
                    stalled += 1;
                    break;
                }
                if now > deadline {
                    return Flushed::TimedOut;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        if stalled == 0 { Flushed::All } else { Flushed::LeftStalled(stalled) }
    }
}

impl Node {
    /// At the process's exit: takes the node's socket out of the fabric's directory (the
    /// process leaves without dropping the node, so `Drop` never runs). Peers that still send
    /// find no one, as they would a moment later.
    pub(crate) fn leave(&self) {
        if !self.inherited() {
            let _ = self.dir.remove(&sock_name(self.slot));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.inherited() {
            return;
        }
        // What the application handed over before letting go (final ACKs too) still leaves.
        self.flush(Duration::from_secs(1));
        self.inbound.quit.store(true, Ordering::Release);
        // Wake the reader (it sees `quit`), then remove the socket before the lock goes, so
        // the next owner of the slot never finds ours.
        if let Ok(s) = UnixDatagram::unbound() {
            let _ = s.send_to(&[], self.dir.entry(&sock_name(self.slot)));
        }
        let _ = self.dir.remove(&sock_name(self.slot));
        // A watcher that opens it from now on knows we are gone; one that has it waits until
        // our lock goes with the file.
        let _ = self.dir.remove(&life_name(self.incarnation));
        for p in self.peers.lock().values() {
            // Our rings carry nothing more: a node that takes our slot may offer its own.
            p.retire();
        }
    }
}

/// Removes the sockets and the lives of dead nodes (their locks are free): nobody will read
/// them again.
fn sweep(dir: &FabricDir, mine: u8) -> io::Result<()> {
    for name in dir.names()? {
        // The life of a node killed whose slot nobody took since: its lock is free.
        if !name.starts_with('.') && name.ends_with(".life") {
            if dir.open_file(&name, false).is_ok_and(|f| f.try_lock_shared().is_ok()) {
                dir.remove(&name)?;
            }
            continue;
        }
        let slot = name.strip_suffix(".sock").and_then(|n| n.parse::<u8>().ok());
        let Some(slot) = slot.filter(|&s| s != mine) else { continue };
        let dead = match dir.open_file(&lock_name(slot), false) {
            Ok(f) => f.try_lock_shared().is_ok(),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        };
        if dead {
            dir.remove(&sock_name(slot))?;
        }
    }
    Ok(())
}

/// One datagram: the header (magic, source slot, FIRST/LAST flags, the message's total
/// length, this fragment's offset in it, the destination QPN) and the fragment.
pub(super) fn frame(
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
    src: u8,
    dst_qpn: u32,
    msg: &'a Encoded<'a>,
    range: std::ops::Range<usize>,
}

impl Fragment<'_> {
    fn len(&self) -> usize {
        HEADER + self.range.len()
    }

    /// Frames it into `d` (of `len()` bytes); `false` if the payload could not be read.
    fn write(&self, d: &mut [u8]) -> bool {
        let total = self.msg.len();
        let mut flags = if self.range.start == 0 { FIRST } else { 0 };
        if self.range.end == total {
            flags |= LAST;
        }
        let words = [MAGIC, total as u32, self.range.start as u32, self.dst_qpn];
        write_header(d, [self.src, flags], words);
        self.msg.copy_to(self.range.start, &mut d[HEADER..]).is_ok()
    }

    fn to_vec(&self) -> Option<Vec<u8>> {
        let mut d = vec![0; self.len()];
        self.write(&mut d).then_some(d)
    }
}

/// Whether every byte of `pkt`'s payload lies in memory shared with other processes.
fn in_shared(pkt: &Packet) -> bool {
    pkt.payload.ranges().iter().all(|m| m.region.shared_for(m.offset, m.len).is_some())
}

pub(super) fn lock_name(slot: u8) -> String {
    format!("{slot}.lock")
}

/// Says in the lock of a slot just claimed which node holds it: a number no other node of
/// the slot had, before or after (the process and the time it joined, to the nanosecond).
fn write_incarnation(lock: &mut File, incarnation: u128) -> io::Result<()> {
    use std::io::Write;
    lock.set_len(0)?;
    lock.write_all(format!("{incarnation}\n").as_bytes())
}

/// A name for this node that no other node, before or after it, has: its process and the
/// time it joined.
fn new_incarnation() -> u128 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    u128::from(std::process::id()) << 96 | since.as_nanos()
}

/// Which node `text` (a slot lock's contents) names (0 if none).
fn incarnation_in(text: &[u8]) -> u128 {
    std::str::from_utf8(text).unwrap_or_default().trim().parse().unwrap_or(0)
}

/// The file whose presence says port `port` of device `dev` is down on the whole host fabric
/// (`rdma-emu port down`), read by every node as it joins.
fn port_down_name(dev: u32, port: u8) -> String {
    format!("port-{dev}-{port}.down")
}

/// `(device index, port)` of a name [`port_down_name`] made.
fn parse_port_down_name(name: &str) -> Option<(u32, u8)> {
    let (dev, port) = name.strip_prefix("port-")?.strip_suffix(".down")?.split_once('-')?;
    Some((dev.parse().ok()?, port.parse().ok()?))
}

/// The file whose lock node `incarnation` holds (exclusively) for its life: made and locked
/// before anyone can learn its incarnation, removed as it leaves, or by the next node in its
/// slot. Unlike the slot's lock, no other node ever takes it.
fn life_name(incarnation: u128) -> String {
    format!("{incarnation}.life")
}

/// Waits until node `incarnation` in `slot` is dead (an unknown one, 0: until the slot's lock
/// is free). Then the slot's lock, held shared unless another node holds the slot already
/// (a newcomer), and whether one does; `None` if the wait failed.
fn await_death(dir: &FabricDir, slot: u8, incarnation: u128) -> Option<(Option<File>, bool)> {
    let lock = dir.open_file(&lock_name(slot), false).ok();
    if incarnation == 0 {
        let gone = lock.as_ref().is_none_or(|f| f.lock_shared().is_ok());
        return gone.then_some((lock, false));
    }
    let gone = match dir.open_file(&life_name(incarnation), false) {
        Ok(life) => life.lock_shared().is_ok(),
        // Removed as it left, or by the next node in its slot.
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    };
    if !gone {
        return None;
    }
    let Some(f) = lock else { return Some((None, false)) };
    // Its slot's lock goes as its process exits (a moment after its life's, perhaps); a
    // newcomer that takes it first names itself in it at once.
    let since = Instant::now();
    loop {
        if f.try_lock_shared().is_ok() {
            return Some((Some(f), false));
        }
        let now = incarnation_in(&dir.read_file(&lock_name(slot)).unwrap_or_default());
        if now != incarnation || since.elapsed() > GOING {
            return Some((None, true));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(super) fn sock_name(slot: u8) -> String {
    format!("{slot}.sock")
}

/// Waits for messages and services them until the node quits or its fabric is gone.
fn read_loop(inbound: &Inbound, fabric: &Weak<FabricInner>) {
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
fn next_watch(watch: Duration, spun: bool) -> Duration {
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
fn receive(inbound: &Inbound, rx: &mut Rx, fabric: &FabricInner, socket: bool) -> bool {
    receive_as(inbound, rx, fabric, socket, false)
}

/// [`receive`]; `looking`: by an application thread's look, which leaves the ACK owed at its
/// end deferred (see [`Rx::deferred`]).
fn receive_as(
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

/// Runs `send` with the doorbell held (as `hold` says which): a message it sends to a peer
/// whose reader asks for it does not wake the reader yet. Whether one would have; if so,
/// [`release_bell`] must follow (a request its sender carries out at once needs no reader:
/// only accounting for, whenever it next wakes).
pub(crate) fn holding_bell<R>(hold: Hold, send: impl FnOnce() -> R) -> (R, bool) {
    this_thread::hold_bell::set(hold as u64);
    let sent = send();
    this_thread::hold_bell::set(0);
    (sent, HELD_BELL.with_borrow(Option::is_some))
}

/// Which bells [`holding_bell`] holds.
/// (Its value is what `this_thread::hold_bell` holds while it is held; 0 there: none.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Hold {
    /// Every one: a run of WRITEs carried out as they are sent wakes no reader, nor does a
    /// ping-pong's (see `engine::absent_peer::send_placing`).
    All = 1,
    /// Only that of a reader napping on its application's looks (see `Ring::take_bell`); one
    /// asleep is woken as the message is written, as usual, and stays awake for what follows.
    Napping = 2,
}

/// After [`holding_bell`]: rings the held bell if `wake`; else asks for it again (the next
/// message rings it), unless another message waits unbegun in the ring meanwhile.
pub(crate) fn release_bell(wake: bool) {
    if let Some((peer, bell)) = HELD_BELL.take() {
        peer.release_bell(wake, bell);
    }
}

/// Runs `send` (of a request through the packet path) with the record it writes of a request
/// that lands (see `Ring::take_bell`), if it writes it in one, written claimed (see
/// `ring::Marks::claimed`), and returns what [`Node::settle`] must be given for it after
/// the attempt to carry it out: nobody at the peer begins it before. (A request carried out
/// as it is sent then never loses the race to the peer's reader, or to a thread of the peer
/// looking at its rings, which would leave it outstanding, and the next WRITE not alone.)
pub(crate) fn claiming(send: impl FnOnce()) -> Option<Claimed> {
    CLAIM_WRITTEN.set(true);
    send();
    CLAIM_WRITTEN.set(false);
    CLAIMED.take()
}

/// How a message goes written whole (see [`Node::send_whole`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Whole {
    /// A request a lagging peer's requester might carry out (a WRITE or READ: see
    /// `Node::carry_out_for_lagging`).
    pub(crate) carriable: bool,
    /// One whose effect no completion announces to the peer (see `Ring::take_bell`), sent
    /// alone: nothing else of its QP's outstanding (the requester waits for it, or for what
    /// it makes the peer's application send back).
    pub(crate) lands: bool,
    /// A WRITE its requester tries to carry out next: written claimed where the peer's reader
    /// is not at work (asleep, or napping on its application's looks), the napping one's bell
    /// left to [`Node::settle`].
    pub(crate) placing: bool,
}

/// A request sent for its requester to carry out next: what [`Node::settle`] is given after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// The peer's slot.
    slot: u8,
    /// Where its record lies in our ring to the peer, if written claimed (the peer's reader
    /// not at work).
    pub(crate) at: Option<u32>,
    /// The peer's reader napped on its application's looks as the request was sent.
    napping: bool,
}

impl Claimed {
    /// Whether no thread of the peer is at work taking records in as they come: its reader
    /// asleep, or napping on its application's looks.
    pub(crate) fn unattended(&self) -> bool {
        self.at.is_some() || self.napping
    }
}

/// Whether this thread's sends rang a peer's bell (found its reader asleep) since it last
/// asked.
pub(crate) fn rang_bell() -> bool {
    this_thread::rang::replace(0) != 0
}

thread_local! {
    /// See [`claiming`].
    static CLAIM_WRITTEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The record this thread wrote claimed (see [`claiming`]).
    static CLAIMED: std::cell::Cell<Option<Claimed>> = const { std::cell::Cell::new(None) };
    static HELD_BELL: std::cell::RefCell<Option<(Arc<Peer>, u32)>> = const { std::cell::RefCell::new(None) };
}

/// After the reader took records in: gives back the biases it took on the way (see
/// `sync::bias::Bias::disown`), those of the rings' locks and of the QPs it delivered to
/// (their locks and their CQs' producers), so that the application's thread, which polls and
/// posts from then on, owns them. A reader that took them first (the peer's first messages
/// came before the application first polled) kept them, and the application's thread revoked
/// each: `ib_send_lat`'s client then took ~8 more locked instructions per round trip, and
/// `ib_send_bw -q 4`'s two more per message where only the last QP's were given back.
fn give_back_biases(rx: &mut Rx) {
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
fn receive_marked(
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

/// What `receive` took in: a datagram from the socket, or a record of a ring (which can lend
/// its payload in place), with who sent it.
enum Arrived<'a> {
    Datagram(&'a [u8], Source),
    Record(Read<'a>, Source),
}

impl Arrived<'_> {
    /// A record of the ring that the node in `slot` writes.
    fn record(slot: u8, rec: Read<'_>) -> Arrived<'_> {
        let pid = rec.ring().sender().map_or(0, |p| p.pid());
        Arrived::Record(rec, Source { slot, pid })
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Arrived::Datagram(d, _) => d,
            Arrived::Record(r, _) => r.bytes(),
        }
    }

    fn source(&self) -> Source {
        match self {
            Arrived::Datagram(_, s) | Arrived::Record(_, s) => *s,
        }
    }

    /// The process whose memory a payload of this message may be read from: a ring's sender.
    fn process(&self) -> Option<&Arc<PeerProcess>> {
        match self {
            Arrived::Datagram(..) => None,
            Arrived::Record(r, _) => r.ring().sender(),
        }
    }
}

/// The packets one `receive` took in, by how they are delivered.
struct Batch<'a, 'r> {
    /// The QPs whose inboxes it filled, to service. (This list and the next two are
    /// [`Rx`]'s, borrowed: made and dropped with each batch, they cost ~25 instructions a
    /// receive.)
    ready: &'r mut engine::QpList,
    /// Datagrams to a multicast group, for the members here, and Ethernet frames, for the
    /// raw packet QPs steering here picks.
    multicast: &'r mut Vec<Packet>,
    /// SENDs for XRC SRQs here, from target QPs in other processes.
    xrc: &'r mut Vec<Packet>,
    /// Where what cannot be used is counted.
    drops: Option<&'a Drops>,
    /// Anything was taken in.
    took: bool,
    /// The driver of the QPs serviced as their packets were taken in, if any was.
    drv: Option<Driver<'a>>,
    /// The ACK owed for the last SENDs or WRITEs taken in (paid before anything else is taken
    /// in, and at the end).
    owed: Option<OwedAck<'a>>,
    /// The QP the last message was for (see [`Batch::qp`]): [`Rx::last_qp`], kept from one
    /// receive to the next. (This field and the next two are `Rx`'s, borrowed: moved out and
    /// back at each receive, they cost ~55 instructions.)
    last_qp: &'r mut Option<(u32, std::sync::Weak<crate::qp::QpShared>)>,
    /// The node's reader only: the other QPs it delivered to since it last gave their biases
    /// back (see `give_back_biases`), at most [`PASSED`]: [`Rx::passed`].
    passed: &'r mut Vec<std::sync::Weak<crate::qp::QpShared>>,
    /// The records of packets waiting for the batch's delivery that nothing else keeps: not
    /// freed until those are delivered, so that their writer finds them unsettled
    /// (`Ring::all_settled`, `Ring::claim_oldest`) and carries nothing of the same QP out
    /// ahead of them (a UC WRITE landing before the SEND posted ahead of it completed). Its
    /// room is [`Rx::kept`]'s, empty between receives.
    kept: &'r mut Vec<Record>,
}

/// How many QPs besides the last one the reader gives the biases back of, per round.
const PASSED: usize = 16;

impl<'a> Batch<'a, '_> {
    fn dropped(&self, why: Refused) {
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
    fn qp(&mut self, fabric: &FabricInner, qpn: u32) -> Option<Arc<crate::qp::QpShared>> {
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
    fn take<'r>(&mut self, fabric: &'a FabricInner, partial: &mut Partials, a: Arrived<'r>) {
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
    fn end(batch: std::mem::ManuallyDrop<Batch<'_, '_>>) {
        debug_assert!(!batch.holds_any(), "a batch ended undelivered");
        let bare = batch.drv.is_none() && batch.owed.is_none();
        if !bare {
            drop(std::mem::ManuallyDrop::into_inner(batch));
        }
    }

    /// Whether it took in anything to deliver.
    fn holds_any(&self) -> bool {
        !self.ready.is_empty()
            || !self.multicast.is_empty()
            || !self.xrc.is_empty()
            || self.drv.is_some()
    }

    /// Services what it took in (see `holds_any`). Out of line, once per batch that took
    /// something, so that `ci.sh bench` counts it apart from the empty looks around it.
    #[inline(never)]
    fn deliver(&mut self, fabric: &'a FabricInner) {
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
type Partials = FxHashMap<Source, Partial>;

/// A message arriving in fragments from one source (they arrive in order).
#[derive(Debug)]
enum Partial {
    /// Copied together: from datagrams, or too large for its ring to hold whole.
    Copied(Vec<u8>),
    /// Kept where it arrives: the records of its fragments so far, and their bytes.
    Held(Vec<Record>, usize),
    /// A WRITE or SEND placed as it arrives, and its bytes so far.
    Landing(Box<Landing>, usize),
}

impl Partial {
    /// The message's bytes so far.
    fn len(&self) -> usize {
        match self {
            Partial::Copied(v) => v.len(),
            Partial::Held(_, got) | Partial::Landing(_, got) => *got,
        }
    }
}

/// The header of a fragment.
#[derive(Debug, Clone, Copy)]
struct FrameHead {
    flags: u8,
    total: usize,
    offset: usize,
    dst_qpn: u32,
}

/// The largest message a peer may announce: the largest a work request can carry (2 GiB) and
/// its headers. Memory for it is taken only as its fragments arrive.
const MAX_MESSAGE: usize = (1 << 31) + 64 * 1024;

impl FrameHead {
    /// The header of the frame `d`, if it is one (the magic, and a total and offset that fit).
    fn parse(d: &[u8]) -> Option<FrameHead> {
        let head = d.first_chunk::<HEADER>()?;
        let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
        let (flags, total, offset) = (head[5], word(8) as usize, word(12) as usize);
        let fits = total <= MAX_MESSAGE && offset <= total && d.len() - HEADER <= total - offset;
        (word(0) == MAGIC && fits).then_some(FrameHead { flags, total, offset, dst_qpn: word(16) })
    }

    fn whole(&self) -> bool {
        self.flags & (FIRST | LAST) == FIRST | LAST
    }
}

/// Adds one datagram to its source's message; the whole message once its last fragment is in.
/// A fragment that does not continue the message in progress is dropped (its source died
/// mid-message, or the slot changed hands).
fn reassemble<'a>(
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
fn continued(
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
fn hold(
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
fn land(
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

/// Takes down the ports the fabric's directory records down (see [`Node::record_port`]), as
/// a fabric joins: as on a host whose cable was pulled before the program started.
pub(crate) fn take_recorded_ports(fabric: &FabricInner, node: &Node) {
    for (dev, port) in node.ports_down() {
        apply(fabric, Control::PortState { dev, port, up: false }, None);
    }
}

/// Carries out a control message from another node (addressed to our QP `to`, if any), as
/// the local control API would.
fn apply(fabric: &FabricInner, c: Control, to: Option<&crate::qp::QpShared>) {
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
fn peer_died(fabric: &FabricInner, slot: u8, incarnation: Option<u128>) {
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

/// Another node, as a destination.
#[derive(Debug)]
struct Peer {
    path: PathBuf,
    /// Which of the nodes that held its slot it is (see `write_incarnation`).
    incarnation: u128,
    /// Our slot, as the source of what we send.
    src: u8,
    /// (The QP lock's kind: taken for every message sent.)
    tx: crate::sync::lock::Lock<PeerTx>,
    /// The flusher sleeps on `cv` with `wake` held while it finds the backlog empty; a sender
    /// that queued to the backlog takes `wake` to ring it, so the ring cannot come between
    /// the flusher's look and its sleep.
    wake: Mutex<()>,
    cv: Condvar,
    /// The peer (or this node) is gone: its flusher and any sender waiting for room stop.
    shutdown: AtomicBool,
    /// When its process was last seen stopped (see `Node::absent_peer`).
    seen_stopped: Mutex<Option<Instant>>,
}

#[derive(Debug, Default)]
struct PeerTx {
    /// Connected and non-blocking; `None` until first used or after the peer went away.
    sock: Option<UnixDatagram>,
    /// The ring to the peer, once it has its descriptor; without one, datagrams on `sock`.
    ring: Option<Arc<Ring>>,
    ring_tried: bool,
    exports_offered: bool,
    /// The names of our shared memory passed to the peer (see `Peer::offer_shared`).
    shared_offered: Vec<u32>,
    /// The names of the peer's shared memory we asked it for a view of (see
    /// `Peer::want_view`).
    views_wanted: Vec<u32>,
    /// Fragments the peer had no room for, framed, in order.
    backlog: VecDeque<Vec<u8>>,
    /// The flusher took a fragment off the backlog and is sending it: later ones must queue.
    flushing: bool,
    flusher_started: bool,
}

impl PeerTx {
    /// The ring to the peer, for a look through its records under `tx` (the carry-outs'):
    /// none while the flusher writes into it without `tx` (`Peer::flush_loop`), since the
    /// records the reader frees meanwhile may be written again under the look.
    fn ring_at_rest(&self) -> Option<&Arc<Ring>> {
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
    fn new(path: PathBuf, src: u8, incarnation: u128) -> Peer {
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
    fn better_pulled(&self, len: usize, replying: bool, large: bool) -> bool {
        let tx = self.tx.lock();
        let Some(ring) = tx.ring.as_ref().filter(|r| r.reader_may_pull()) else { return false };
        // Records carry headers and may leave a filler at the wrap: ask for twice the bytes.
        large || len > ring.max_held_message() || (replying && ring.room() < 2 * len)
    }

    /// Its process, as its lock file names it (0 if it does not).
    fn pid(&self) -> u32 {
        (self.incarnation >> 96) as u32
    }

    /// Whether its process is stopped (SIGSTOP, a debugger). Seen stopped a moment ago is
    /// taken as stopped still, without looking again: a wait or a request carried out for a
    /// peer that just continued is correct, only slower (whoever begins a request first has it).
    fn stopped(&self) -> bool {
        let pid = self.pid();
        let mut seen = self.seen_stopped.lock();
        if !seen.is_some_and(|t| t.elapsed() < STOPPED_LOOK) {
            let stopped = pid != 0 && pid != std::process::id() && crate::sys::process_stopped(pid);
            *seen = stopped.then(Instant::now);
        }
        seen.is_some()
    }

    /// Closes its ring (nothing more will come through it) and stops its flusher.
    fn retire(&self) {
        if let Some(r) = &self.tx.lock().ring {
            r.close();
        }
        self.shut();
    }

    /// Stops its flusher: the peer (or this node) is gone.
    fn shut(&self) {
        self.shutdown.store(true, Ordering::Release);
        let _w = self.wake.lock();
        self.cv.notify_all();
    }

    /// Makes our ring to the peer, its pages in place, and passes it over, if not done yet: as
    /// a QP connects to the peer (see `Node::watch`), not in the first message, which then
    /// neither waits for it nor faults its pages in one by one (2 MiB of them: ~1.5 ms here,
    /// which `ib_send_bw -s 4096`'s 1,000 SENDs paid on the way, 1.2-1.8 GB/s against
    /// 2.3-3.8 with the ring made ahead).
    fn offer_ring_early(&self) {
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
    fn send(self: &Arc<Self>, dst_qpn: u32, msg: &Encoded<'_>, lands: bool) {
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
    fn send_whole(
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
    fn release_bell(&self, wake: bool, bell: u32) {
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
    fn offer_exports(&self, exports: &Exports) {
        let mut tx = self.tx.lock();
        if !std::mem::replace(&mut tx.exports_offered, true) {
            self.pass(&mut tx.sock, EXPORTS, exports.fd());
        }
    }

    /// Passes the peer our memory moved into `shared`, once, if it proved it may read our
    /// memory anyway (see `Ring::reader_may_pull`: a view shows it no more than it could read
    /// with `process_vm_readv`), and says so in the ring: whichever thread of the peer's
    /// reads the ring next takes the descriptor first (see `receive_marked`).
    fn offer_shared(self: &Arc<Self>, shared: &crate::shared_mem::SharedMem) {
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
    fn want_view(&self, tx: &mut PeerTx, id: u32) {
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
    fn pass(&self, sock: &mut Option<UnixDatagram>, flag: u8, fd: std::os::fd::RawFd) -> bool {
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
                    self.cv.wait(&mut w);
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
fn ring_bell(sock: &mut Option<UnixDatagram>, path: &Path, src: u8) {
    // Laid out in place: a reader that sleeps between messages is rung once per message.
    let mut bell = [0; HEADER];
    write_header(&mut bell, [src, BELL], [MAGIC, 0, 0, 0]);
    // A full socket needs no more waking.
    let _ = try_send(sock, path, &bell);
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
    fn reader_held_asleep(inbound: &Inbound) -> parking_lot::RwLockWriteGuard<'_, ()> {
        until_reader_asleep(inbound);
        inbound.reader_held.write()
    }

    /// Watchers are held one at a time (the tests below would hold each other's).
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::const_mutex(());

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
            let bytes: Vec<u8> =
                (0..LEN).map(|i| (i * 7 + i / 251 + usize::from(nap)) as u8).collect();
            a.mr.write(0, &bytes).unwrap();
            let from = [Sge { addr: a.mr.addr(), length: LEN as u32, lkey: a.mr.lkey() }];
            let wr = SendWr::write(7, &from, b.mr.addr(), b.mr.rkey()).signaled();
            a.qp.post_send(&wr).unwrap();
            let mut got = vec![0u8; LEN];
            b.mr.read(0, &mut got).unwrap();
            assert!(got == bytes, "nap {nap}: landed as posted");
            let wc = a.cq.poll_one().expect("complete as posted");
            assert_eq!((wc.wr_id, wc.status), (7, WcStatus::SUCCESS));
            let left =
                |r: &Ring| (if nap { r.delegated() } else { r.asleep() }, r.nothing_to_read());
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
            for (len, access) in
                [(128 * 1024 + 100, AccessFlags::LOCAL_WRITE), (4096 + 8, writable)]
            {
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
                && [&b2, &b3].iter().all(|e| {
                    crate::sync::lock::bias_nobodys(&e.qp.0.inner) && e.cq.0.producer_bias().0
                })
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
            assert!(
                Instant::now() < deadline,
                "the reader kept a bias of what it took in: {}",
                kept()
            );
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
        let (rw, anon) =
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
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
        let (rw, anon) =
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
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
        let (rw, anon) =
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
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
}

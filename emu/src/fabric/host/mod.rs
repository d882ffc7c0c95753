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
//!
//! # Parts
//! This module holds the node (joining, leaving, sending, the looks of threads that poll)
//! and the directory's files; [`peer`] a destination (its ring, socket, backlog and
//! flusher); [`receive`](mod@receive) the reader thread and what a look takes in, [`batch`]
//! how that is reassembled, decoded and handed to the engine; [`bell`] the doorbell held
//! while a request is carried out by its sender; [`lagging`] the peers whose process takes
//! nothing in now, whose requests we carry out ourselves.

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

use crate::sync::{Condvar, Mutex};
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

mod batch;
mod bell;
mod lagging;
mod peer;
mod receive;
#[cfg(test)]
mod test;

pub(super) use self::peer::frame;
use self::{batch::*, bell::*, lagging::*, peer::*, receive::*};
pub(crate) use self::{
    bell::{Claimed, Hold, Whole, claiming, holding_bell, rang_bell, release_bell},
    lagging::AbsentPeer,
    receive::take_recorded_ports,
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
/// `$RDMA_EMU_RUNTIME_DIR`, `$XDG_RUNTIME_DIR` or `/dev/shm` (`/tmp` where it is missing), then
/// `rdma-emu-<uid>/<name>`.
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
            reader_held: crate::sync::RwLock::new(()),
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

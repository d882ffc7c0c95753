//! The fabric's clock and its deadlines: RNR back-offs, retransmission timeouts, delayed
//! packets and timed faults.
//!
//! In real time one lazily started thread sleeps until the earliest deadline and runs it, so
//! that retries fire even while the application is blocked and calls no verb. In simulation
//! (a seeded fabric) time is virtual: it stands still while the program works and jumps to
//! the next deadline when the program waits (a poll of an empty CQ, see [`Timer::advance`]),
//! so a run depends only on the program and the seed. A program that waits where the
//! emulator cannot see it (poll(2) on a channel's fd) is not left hanging: after
//! [`IDLE_ADVANCE`] of real time without any advance the clock moves on by itself.
//!
//! The engine never reads this clock itself: the driver reads it and passes `now` in.

use std::{
    cmp::Ordering,
    collections::BinaryHeap,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use crate::sync::{Condvar, Mutex};

use super::FabricInner;
use crate::{
    objects::{cq::CqInner, wq::WqInner},
    packet::Packet,
    qp::QpShared,
};

/// In simulation, how long the program may wait unseen before virtual time moves by itself.
const IDLE_ADVANCE: Duration = Duration::from_millis(50);

/// What a deadline does.
#[derive(Debug)]
pub(crate) enum Job {
    /// Services the QP's requester (RNR back-off over, or ACK timeout).
    Qp(Weak<QpShared>),
    /// Delivers a packet that a fault delayed.
    Packet(Box<Packet>),
    /// Delivers a packet held back to be reordered, if no later packet of its flow has
    /// released it yet.
    Unhold { flow: (u32, u32, u32), psn: u32 },
    /// Carries out a timed fault rule (see `faults`), unless the rules were replaced since.
    Fault { generation: u64, rule: usize },
    /// Ends a CQ's event moderation period (see `objects::cq`), unless it was re-armed since.
    CqModeration { cq: Weak<CqInner>, generation: u64 },
    /// Drops the frames whose delay drop wait is over (see `objects::wq`).
    DelayDrop(Weak<WqInner>),
    /// Work of a layer above the fabric (the connection manager's time-wait).
    Later(Later),
}

/// A deadline's work handed in from above, so that the fabric need not know those layers.
pub(crate) struct Later(pub(crate) Box<dyn FnOnce(&FabricInner) + Send>);

impl std::fmt::Debug for Later {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Later")
    }
}

impl Job {
    fn run(self, fabric: &FabricInner) {
        match self {
            Job::Qp(qp) => {
                if let Some(qp) = qp.upgrade() {
                    crate::engine::on_timer(&qp);
                }
            }
            Job::Packet(pkt) => crate::engine::deliver_late(fabric, *pkt),
            Job::Unhold { flow, psn } => {
                if let Some(pkt) = fabric.faults.take_held(flow, psn) {
                    crate::engine::deliver_late(fabric, pkt);
                }
            }
            Job::Fault { generation, rule } => super::faults::fire_timed(fabric, generation, rule),
            Job::CqModeration { cq, generation } => {
                if let Some(cq) = cq.upgrade() {
                    cq.moderation_due(generation);
                }
            }
            Job::DelayDrop(wq) => {
                if let Some(wq) = wq.upgrade() {
                    wq.expire_held(fabric.now());
                }
            }
            Job::Later(Later(work)) => work(fabric),
        }
    }
}

#[derive(Debug)]
struct Entry {
    deadline: u64,
    seq: u64,
    job: Job,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline, self.seq) == (o.deadline, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed, so that the `BinaryHeap` pops the earliest deadline first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.deadline, o.seq).cmp(&(self.deadline, self.seq))
    }
}

#[derive(Debug, Default)]
struct State {
    heap: BinaryHeap<Entry>,
    seq: u64,
    started: bool,
    shutdown: bool,
}

#[derive(Debug)]
struct Shared {
    epoch: Instant,
    /// The wall clock at `epoch` (ns since the Unix epoch): what clock readings are offset by.
    wall_epoch_ns: u64,
    /// Virtual nanoseconds, in simulation.
    virtual_now: Option<AtomicU64>,
    /// Bumped by every advance of virtual time (the idle watcher's sign of life).
    advances: AtomicU64,
    st: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn now(&self) -> u64 {
        match &self.virtual_now {
            Some(v) => v.load(Relaxed),
            None => self.epoch.elapsed().as_nanos() as u64,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Timer {
    shared: Arc<Shared>,
    fabric: Weak<FabricInner>,
}

impl Timer {
    /// A real-time clock, or a virtual one (`simulated`) starting at 0.
    pub(crate) fn new(simulated: bool, fabric: Weak<FabricInner>) -> Timer {
        Timer {
            shared: Arc::new(Shared {
                epoch: Instant::now(),
                wall_epoch_ns: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
                virtual_now: simulated.then(|| AtomicU64::new(0)),
                advances: AtomicU64::new(0),
                st: Mutex::new(State::default()),
                cv: Condvar::new(),
            }),
            fabric,
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.shared.now()
    }

    /// The wall clock (ns since the Unix epoch) when this clock read 0.
    pub(crate) fn wall_epoch_ns(&self) -> u64 {
        self.shared.wall_epoch_ns
    }

    pub(crate) fn simulated(&self) -> bool {
        self.shared.virtual_now.is_some()
    }

    /// Services `qp` once `now() >= deadline`.
    pub(crate) fn arm(&self, deadline: u64, qp: &Arc<QpShared>) {
        self.schedule(deadline, Job::Qp(Arc::downgrade(qp)));
    }

    /// Runs `job` once `now() >= deadline`.
    pub(crate) fn schedule(&self, deadline: u64, job: Job) {
        let mut st = self.shared.st.lock();
        st.seq += 1;
        let seq = st.seq;
        st.heap.push(Entry { deadline, seq, job });
        self.start_locked(&mut st);
        drop(st);
        self.shared.cv.notify_one();
    }

    /// Starts the timer thread now, if it has not started, rather than with the first job:
    /// for a QP connected to another process, whose first message arms a retransmission
    /// timer (a thread starts only once it runs, which takes a scheduler slice on busy cores;
    /// see `FabricInner::watch_peer_of`).
    pub(crate) fn start(&self) {
        self.start_locked(&mut self.shared.st.lock());
    }

    /// Whether the timer thread has started.
    #[cfg(test)]
    pub(crate) fn started(&self) -> bool {
        self.shared.st.lock().started
    }

    fn start_locked(&self, st: &mut State) {
        if st.started {
            return;
        }
        st.started = true;
        let (shared, fabric) = (self.shared.clone(), self.fabric.clone());
        let spawned = crate::sys::spawn("rdma-emu-timer".into(), move || {
            if shared.virtual_now.is_some() {
                watch_idle(&shared, &fabric)
            } else {
                run(&shared, &fabric)
            }
        });
        spawned.expect("spawn the rdma-emu timer thread");
    }

    /// In simulation: moves virtual time to the earliest deadline and runs every job due
    /// then, in the order they were scheduled; whether there was one. In real time: nothing
    /// (at once: a thread spinning on an empty CQ asks on every look).
    #[inline]
    pub(crate) fn advance(&self, fabric: &FabricInner) -> bool {
        self.shared.virtual_now.is_some() && advance(&self.shared, fabric)
    }
}

#[inline(never)]
fn advance(shared: &Shared, fabric: &FabricInner) -> bool {
    let Some(v) = &shared.virtual_now else { return false };
    let due = {
        let mut st = shared.st.lock();
        let Some(first) = st.heap.peek() else { return false };
        let at = first.deadline.max(v.load(Relaxed));
        v.store(at, Relaxed);
        shared.advances.fetch_add(1, Relaxed);
        let mut due = Vec::new();
        while st.heap.peek().is_some_and(|e| e.deadline <= at) {
            due.push(st.heap.pop().expect("peeked").job);
        }
        due
    };
    for job in due {
        job.run(fabric);
    }
    true
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.shared.st.lock().shutdown = true;
        self.shared.cv.notify_one();
    }
}

/// Jobs the timer thread takes out of the heap at a time (the rest on its next look): its list
/// is made once, at this size, so that firing timers allocates nothing however many fall due
/// at once (a thread that woke late found more each time, and grew it then).
const DUE_AT_ONCE: usize = 32;

fn run(shared: &Shared, fabric: &Weak<FabricInner>) {
    let mut due = Vec::with_capacity(DUE_AT_ONCE);
    loop {
        {
            let mut st = shared.st.lock();
            loop {
                if st.shutdown {
                    return;
                }
                let now = shared.now();
                st = match st.heap.peek() {
                    None => shared.cv.wait(st),
                    Some(e) if e.deadline > now => {
                        let wait = Duration::from_nanos(e.deadline - now);
                        shared.cv.wait_timeout(st, wait).0
                    }
                    Some(_) => break,
                };
            }
            let now = shared.now();
            while due.len() < DUE_AT_ONCE && st.heap.peek().is_some_and(|e| e.deadline <= now) {
                due.push(st.heap.pop().expect("peeked").job);
            }
        }
        let Some(fabric) = fabric.upgrade() else { return };
        for job in due.drain(..) {
            job.run(&fabric);
        }
    }
}

/// Simulation's fallback: advances virtual time when deadlines wait and nothing advanced it
/// for [`IDLE_ADVANCE`] of real time (the program waits where the emulator cannot see it).
fn watch_idle(shared: &Shared, fabric: &Weak<FabricInner>) {
    let mut seen = u64::MAX;
    loop {
        // A plain sleep: being woken by each new deadline would shorten the idle period.
        std::thread::sleep(IDLE_ADVANCE);
        if shared.st.lock().shutdown {
            return;
        }
        let now = shared.advances.load(Relaxed);
        if now == seen {
            let Some(fabric) = fabric.upgrade() else { return };
            advance(shared, &fabric);
        }
        seen = shared.advances.load(Relaxed);
    }
}

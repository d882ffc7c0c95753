//! The real-time driver's timer: one lazily started thread that sleeps until the earliest
//! deadline (an RNR back-off or a retransmission timeout) and then services that QP, so that
//! retries fire even while the application is blocked and calls no verb.
//!
//! The engine never reads this clock itself: the driver reads it and passes `now` in.

use std::{
    cmp::Ordering,
    collections::BinaryHeap,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use parking_lot::{Condvar, Mutex};

use crate::qp::QpShared;

#[derive(Debug)]
struct Entry {
    deadline: u64,
    seq: u64,
    qp: Weak<QpShared>,
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
    st: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug)]
pub(crate) struct Timer {
    shared: Arc<Shared>,
}

impl Timer {
    pub(crate) fn new() -> Timer {
        Timer {
            shared: Arc::new(Shared {
                epoch: Instant::now(),
                st: Mutex::new(State::default()),
                cv: Condvar::new(),
            }),
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.shared.epoch.elapsed().as_nanos() as u64
    }

    /// Services `qp` once `now() >= deadline`.
    pub(crate) fn arm(&self, deadline: u64, qp: &Arc<QpShared>) {
        let mut st = self.shared.st.lock();
        st.seq += 1;
        let seq = st.seq;
        st.heap.push(Entry { deadline, seq, qp: Arc::downgrade(qp) });
        if !st.started {
            st.started = true;
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("rdma-emu-timer".into())
                .spawn(move || run(&shared))
                .expect("spawn the rdma-emu timer thread");
        }
        drop(st);
        self.shared.cv.notify_one();
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.shared.st.lock().shutdown = true;
        self.shared.cv.notify_one();
    }
}

fn run(shared: &Shared) {
    let mut due = Vec::new();
    loop {
        {
            let mut st = shared.st.lock();
            loop {
                if st.shutdown {
                    return;
                }
                let now = shared.epoch.elapsed().as_nanos() as u64;
                match st.heap.peek() {
                    None => shared.cv.wait(&mut st),
                    Some(e) if e.deadline > now => {
                        let wait = Duration::from_nanos(e.deadline - now);
                        shared.cv.wait_for(&mut st, wait);
                    }
                    Some(_) => break,
                }
            }
            let now = shared.epoch.elapsed().as_nanos() as u64;
            while st.heap.peek().is_some_and(|e| e.deadline <= now) {
                due.push(st.heap.pop().expect("peeked").qp);
            }
        }
        for qp in due.drain(..) {
            if let Some(qp) = qp.upgrade() {
                crate::engine::on_timer(&qp);
            }
        }
    }
}

//! A QP's inbox: the packets the fabric delivered to it, drained in order by whoever services
//! the QP. Its length is kept beside the queue so that the express path can tell that nothing
//! waits without taking the lock (a shared write per work request otherwise).

use std::{
    collections::VecDeque,
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::{packet::Packet, sync::lock::Lock};

/// Laid out in declaration order (`repr(C)`): the length, which the express path reads, first.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Inbox {
    /// The queue's length, written under its lock.
    len: AtomicUsize,
    /// (The QP lock's kind: one thread pushing and taking, as a polling application that
    /// takes its messages in does, takes no locked instruction.)
    queue: Lock<VecDeque<Packet>>,
}

impl Inbox {
    #[inline]
    pub(crate) fn push(&self, pkt: Packet) {
        let mut q = self.queue.lock();
        q.push_back(pkt);
        self.len.store(q.len(), Ordering::Release);
    }

    /// Whether no packet waits. Exact under the QP's lock for packets delivered before it was
    /// taken: a packet is pushed before its QP is serviced.
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Moves what waits into `batch` (empty). Moved, not swapped: each queue keeps the room it
    /// grew to, where swapping handed the inbox the batch's smaller one, to grow again (an
    /// allocation) the next time packets pile up.
    pub(crate) fn take_into(&self, batch: &mut VecDeque<Packet>) {
        if self.is_empty() {
            return;
        }
        let mut q = self.queue.lock();
        batch.extend(q.drain(..));
        self.len.store(0, Ordering::Release);
    }

    pub(crate) fn clear(&self) {
        let mut q = self.queue.lock();
        q.clear();
        self.len.store(0, Ordering::Release);
    }

    /// Everything waiting, taken out.
    #[cfg(test)]
    pub(crate) fn drain(&self) -> Vec<Packet> {
        let mut q = self.queue.lock();
        self.len.store(0, Ordering::Release);
        q.drain(..).collect()
    }
}

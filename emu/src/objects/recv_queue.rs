//! Receive queues: a receive work request as posted, its WQE as kept, and the fixed-size ring
//! (as a NIC's) whose slots are made on first use and then reused, so posting allocates only
//! while a queue fills deeper than ever before, and a queue created with the device's largest
//! sizes takes memory only as deep as it is used. An SRQ and a WQ keep a [`RecvQueue`]; a QP's
//! own receive queue (`qp::recv_ring`) and its send queue (`qp::queue`) are built of the same
//! parts.

use crate::{
    error::{Errno, Error, Result, einval},
    types::Sge,
};

/// A receive work request (`struct ibv_recv_wr`, one element of the list).
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sg_list: &'a [Sge],
}

/// A receive WQE.
#[derive(Debug, Default)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: Sges,
}

impl RecvWqe {
    /// `wr`, once it passed [`RecvWqe::check`], into this slot (keeping the list's allocation).
    /// Always inlined: out of line, it cost a ping-pong hop's post of a receive ~20
    /// instructions of call and spills around a store or two.
    #[inline(always)]
    pub(crate) fn fill(&mut self, wr: &RecvWr<'_>) {
        self.wr_id = wr.wr_id;
        match (wr.sg_list, &mut self.sges[..]) {
            // The common receive, into a slot that held one before: a store.
            ([new], [old]) => *old = *new,
            (list, _) => {
                self.sges.clear();
                self.sges.extend_from_slice(list);
            }
        }
    }

    /// What every receive queue checks of a receive posted to it that has room: `EINVAL`
    /// when it has more than `max_sge` SGEs.
    pub(crate) fn check(wr: &RecvWr<'_>, max_sge: u32) -> Result<()> {
        if wr.sg_list.len() > max_sge as usize {
            return Err(einval("num_sge above max_sge"));
        }
        Ok(())
    }
}

/// A receive's scatter list: one SGE (the common receive) in the WQE itself, so the thread
/// that delivers into it reads one line the poster wrote, not a second one on the heap.
pub(crate) type Sges = smallvec::SmallVec<[Sge; 1]>;

/// A ring of at least `cap` slots addressed by free-running `u32` counters. The slots are a
/// power of two, so a counter finds its slot by a mask (no division per work request), and
/// consecutive counters stay in distinct slots across the counter's wrap at 2^32 (with
/// `idx % cap`, a `cap` that does not divide 2^32 put the positions either side of the wrap
/// in one slot). Slots are made when first written; one never written reads as a blank one.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Ring<T> {
    slots: Vec<T>,
    mask: u32,
    blank: T,
}

impl<T: Default> Ring<T> {
    pub(crate) fn new(cap: u32) -> Ring<T> {
        let slots = cap.max(1).checked_next_power_of_two().unwrap_or(1 << 31);
        Ring { slots: Vec::new(), mask: slots - 1, blank: T::default() }
    }

    pub(crate) fn at(&self, idx: u32) -> &T {
        self.slots.get((idx & self.mask) as usize).unwrap_or(&self.blank)
    }

    /// The slot of `idx`, made on first use. (Inline, its growth out of line: a call cost a
    /// queued request ~20 instructions each time the queue's slot was looked up.)
    #[inline(always)]
    pub(crate) fn at_mut(&mut self, idx: u32) -> &mut T {
        let i = (idx & self.mask) as usize;
        if i >= self.slots.len() {
            self.grow(i);
        }
        &mut self.slots[i]
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, i: usize) {
        self.slots.resize_with(i + 1, T::default);
    }
}

/// An SRQ's or a WQ's receive queue, under its owner's lock: `tail..head` are posted and
/// unconsumed. (A QP's is a [`RecvRing`](super::recv_ring::RecvRing), posted to without the
/// QP's lock.)
#[derive(Debug)]
#[repr(C)]
pub(crate) struct RecvQueue {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) depth: u32,
    pub(crate) ring: Ring<RecvWqe>,
}

impl RecvQueue {
    pub(crate) fn new(depth: u32) -> RecvQueue {
        RecvQueue { ring: Ring::new(depth), depth, head: 0, tail: 0 }
    }

    pub(crate) fn len(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.tail = 0;
    }

    /// Copies a receive request into the next free slot: `ENOMEM` when the queue is full,
    /// `EINVAL` when it has more than `max_sge` SGEs. `what` names the queue in the error.
    pub(crate) fn post(&mut self, wr: &RecvWr<'_>, max_sge: u32, what: &'static str) -> Result<()> {
        if self.len() >= self.depth {
            return Err(Error::new(Errno::ENOMEM, what));
        }
        RecvWqe::check(wr, max_sge)?;
        let head = self.head;
        self.ring.at_mut(head).fill(wr);
        self.head = head.wrapping_add(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receives_keep_their_slots_across_the_counters_wrap() {
        // A depth that does not divide 2^32, counters just short of the wrap.
        let mut rq = RecvQueue::new(3);
        (rq.head, rq.tail) = (u32::MAX - 1, u32::MAX - 1);
        let sge = [Sge { addr: 0x1000, length: 8, lkey: 1 }];
        for wr_id in 1..=3 {
            rq.post(&RecvWr { wr_id, sg_list: &sge }, 1, "full").unwrap();
        }
        assert_eq!(
            rq.post(&RecvWr { wr_id: 4, sg_list: &sge }, 1, "full").unwrap_err().errno(),
            Errno::ENOMEM
        );
        let mut taken = vec![];
        while rq.len() > 0 {
            taken.push(rq.ring.at(rq.tail).wr_id);
            rq.tail = rq.tail.wrapping_add(1);
        }
        assert_eq!(taken, [1, 2, 3], "each receive read back once, in order");
    }
}

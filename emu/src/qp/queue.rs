//! The send and receive queues: fixed-size rings (as a NIC's) whose WQE slots are made on first
//! use and then reused, so posting allocates only while a queue fills deeper than ever before,
//! and a queue created with the device's largest sizes takes memory only as deep as it is used.

use crate::{
    error::{Errno, Error, Result, einval},
    qp::RecvWr,
    types::{SendFlags, Sge, WcStatus, WrOpcode},
};

/// A UD destination captured at post time: (device, port), QPN, Q_Key, the GRH when the
/// address handle has one, and whether the AH is of another PD than the QP's.
pub(crate) type UdTarget = ((u32, u8), u32, u32, Option<crate::types::Grh>, bool);

/// A send WQE: the posted request plus what the requester recorded when it transmitted it.
/// Its lists grow to what a post needs and keep their capacity for the next.
#[derive(Debug, Default)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) opcode: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) sges: Vec<Sge>,
    pub(crate) inline: Vec<u8>,
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    /// Total message length.
    pub(crate) length: u32,
    /// First and last PSN the message (and, for a READ, its response) occupies.
    pub(crate) first_psn: u32,
    pub(crate) last_psn: u32,
    /// Status to complete with when the WQE is flushed or failed.
    pub(crate) status: WcStatus,
    /// UD: destination (device, port), QPN and Q_Key, captured at post time.
    pub(crate) ud: Option<UdTarget>,
    /// BIND_MW: the bind, executed when the WQE's turn comes.
    pub(crate) bind: crate::objects::mw::BindArgs,
    /// LOCAL_INV / SEND_WITH_INV: the rkey to invalidate.
    pub(crate) inv_rkey: u32,
    /// XRC: the SRQ number the request names.
    pub(crate) xrc_srqn: u32,
    /// TSO: the header put in front of each segment, and the segment size.
    pub(crate) tso_hdr: Vec<u8>,
    pub(crate) mss: u16,
    /// FLUSH: its FETH (placement type in bits 0..3, selectivity level in bits 4..5).
    pub(crate) feth: u8,
    /// Work the device queued itself (see [`Hidden`]); `None` for the application's.
    pub(crate) hidden: Hidden,
}

/// Work a device queues on a QP's send queue by itself, completed to nobody's send CQ: the
/// RDMA READ and the FIN of an mlx5 HCA's rendezvous for a matched tag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Hidden {
    #[default]
    None,
    /// The rendezvous READ into a tag's buffer: when it completes, the tag's second completion
    /// (`IBV_WC_TM_RECV` with `DATA_VALID`, no TMH: the match's carried it) goes to the
    /// receive CQ.
    RndvRead { wr_id: u64 },
    /// The FIN telling the sender its rendezvous is done.
    Fin,
}

impl SendWqe {
    /// Operations the requester executes itself, without a packet.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.opcode, WrOpcode::BIND_MW | WrOpcode::LOCAL_INV)
    }

    pub(crate) fn is_read_or_atomic(&self) -> bool {
        matches!(
            self.opcode,
            WrOpcode::RDMA_READ | WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD
        )
    }
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

    pub(crate) fn at_mut(&mut self, idx: u32) -> &mut T {
        let i = (idx & self.mask) as usize;
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, T::default);
        }
        &mut self.slots[i]
    }
}

/// The send queue. Invariant: `tail <= next <= head` (wrapping counters):
/// `tail..next` were transmitted and await completion, `next..head` wait to be transmitted.
#[derive(Debug)]
pub(crate) struct SendQueue {
    pub(crate) ring: Ring<SendWqe>,
    /// Usable depth (`cap.max_send_wr`).
    pub(crate) depth: u32,
    /// Room beyond `depth` for the WQEs the HCA queues itself (a tag-matching rendezvous's
    /// READ and FIN, see `engine::requester::queue_rndv`), which the application's do not
    /// count against (`requester::post`).
    pub(crate) reserve: u32,
    pub(crate) head: u32,
    pub(crate) next: u32,
    pub(crate) tail: u32,
}

impl SendQueue {
    pub(crate) fn new(depth: u32, reserve: u32) -> SendQueue {
        SendQueue { ring: Ring::new(depth + reserve), depth, reserve, head: 0, next: 0, tail: 0 }
    }

    pub(crate) fn len(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// The HCA's own WQEs among those queued (counted: only asked when the queue looks full,
    /// or as a rendezvous is queued).
    pub(crate) fn hidden(&self) -> u32 {
        let queued = (0..self.len()).map(|i| self.ring.at(self.tail.wrapping_add(i)));
        queued.filter(|w| !matches!(w.hidden, Hidden::None)).count() as u32
    }

    /// Whether the application's WQEs fill `depth`.
    pub(crate) fn full(&self) -> bool {
        self.len() >= self.depth && (self.reserve == 0 || self.len() - self.hidden() >= self.depth)
    }

    /// WQEs transmitted and not yet completed.
    pub(crate) fn in_flight(&self) -> u32 {
        self.next.wrapping_sub(self.tail)
    }

    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.next = 0;
        self.tail = 0;
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

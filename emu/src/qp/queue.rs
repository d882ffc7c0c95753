//! The send queue: a fixed-size ring (as a NIC's, see `objects::recv_queue::Ring`) of send
//! WQEs. (A QP's receive queue is `qp::recv_ring`; an SRQ's or a WQ's `objects::recv_queue`.)

use crate::{
    objects::recv_queue::Ring,
    types::{SendFlags, Sge, WcStatus, WrOpcode},
};

/// A UD destination captured at post time: (device, port), QPN, Q_Key, the GRH when the
/// address handle has one, and whether the request fails as it runs (a local QP operation
/// error): on rxe an AH of another PD than the QP's, or a request built without an address.
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

/// The send queue. Invariant: `tail <= next <= head` (wrapping counters):
/// `tail..next` were transmitted and await completion, `next..head` wait to be transmitted.
///
/// Laid out in declaration order (`repr(C)`): the counters a post reads first, the ring (with
/// its blank slot, a whole WQE) after them.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct SendQueue {
    pub(crate) head: u32,
    pub(crate) next: u32,
    pub(crate) tail: u32,
    /// Usable depth (`cap.max_send_wr`).
    pub(crate) depth: u32,
    /// Room beyond `depth` for the WQEs the HCA queues itself (a tag-matching rendezvous's
    /// READ and FIN, see `engine::requester::queue_rndv`), which the application's do not
    /// count against (`requester::post`).
    pub(crate) reserve: u32,
    pub(crate) ring: Ring<SendWqe>,
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

    /// How many more of the application's WQEs `depth` takes.
    pub(crate) fn room(&self) -> u32 {
        let own = if self.reserve == 0 { self.len() } else { self.len() - self.hidden() };
        self.depth.saturating_sub(own)
    }

    /// Whether the application's WQEs fill `depth`.
    #[inline]
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

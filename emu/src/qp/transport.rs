//! The transport's state a QP holds under its lock: the requester's and the responder's
//! sequence state, the route to the peer, the express lane to it and where a post prefetches.
//! Data, and what reads it alone: the engine's steps change it (`engine::requester`,
//! `engine::responder`, `engine::completer`, `engine::lane`), which is why it lives below them.

use std::{
    collections::VecDeque,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::{QpShared, recv_ring::RecvRing};
use crate::{
    objects::srq::SrqInner,
    packet::Packet,
    sync::prefetch,
    types::{WcStatus, WrOpcode},
};

/// Laid out in declaration order (`repr(C)`): what a post on the express path reads and writes
/// comes first, on one cache line (see `QpInner`).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Requester {
    /// After an RNR NAK: nothing is sent before this time.
    pub(crate) rnr_until: Option<u64>,
    /// When the oldest unacknowledged request times out.
    pub(crate) retrans_at: Option<u64>,
    /// PSN of the next packet to send (`sq_psn`).
    pub(crate) psn: u32,
    /// Retries left after a timeout or PSN-sequence NAK (reset on progress).
    pub(crate) retry_left: u8,
    /// A retry is under way and nothing has completed since: the responses and NAKs still
    /// arriving from before it start no other (as rxe's `comp.started_retry`); a timeout does.
    pub(crate) retry_started: bool,
    /// RNR retries left (7 = infinite).
    pub(crate) rnr_retry_left: u8,
    /// A request completed since `retrans_at` was set, which outlived it (see
    /// [`lazy_deadline`]): its passing is no timeout.
    pub(crate) progressed_since: bool,
    /// READ/atomic WQEs transmitted and not yet completed.
    pub(crate) rd_atomic_in_flight: u32,
    /// The QP's count of arrivals from other processes (`QpShared::heard`) when `retrans_at`
    /// was set.
    pub(crate) heard_at: u64,
    /// The earliest deadline handed to the timer and not yet fired.
    pub(crate) armed: Option<u64>,
    /// SQ_DRAINED was raised for the current SQD episode.
    pub(crate) drained_reported: bool,
    /// A WQE that could not be sent, and its status, while earlier ones were outstanding: it
    /// fails when they have completed (see [`fail_in_turn`]).
    pub(crate) failed: Option<(u32, WcStatus)>,
    /// The last look found the peer's process stopped and carried out requests for it (see
    /// `absent_peer`): the next look comes soon, and requests posted meanwhile are carried
    /// out before they are sent.
    pub(crate) carrying: bool,
    /// Requests carried out for the stopped peer without being sent: it hears of them before
    /// the next request that is sent.
    pub(crate) unsent: Option<Unsent>,
    /// When the QP last looked at placing a WRITE as it was sent, and whether it did (see
    /// `absent_peer::send_placing`).
    pub(crate) placed_at: Option<std::time::Instant>,
    pub(crate) placed_last: bool,
    /// When the QP's last UC WRITE through the packet path left, or was carried out ahead (see
    /// `absent_peer::carry_out_ahead`): one that follows it closer than `PLACE_GAP` is part
    /// of a stream.
    pub(crate) wrote_at: Option<std::time::Instant>,
}

impl Requester {
    pub(crate) fn clear_timers(&mut self) {
        self.rnr_until = None;
        self.retrans_at = None;
    }
}

/// Requests carried out without being sent: PSNs `psn` up to `end`, `messages` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsent {
    pub(crate) psn: u32,
    pub(crate) end: u32,
    pub(crate) messages: u32,
}

/// What a READ request asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadReq {
    pub(crate) psn: u32,
    pub(crate) npkts: u32,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
}

impl ReadReq {
    pub(crate) fn of(pkt: &Packet) -> ReadReq {
        ReadReq { psn: pkt.psn, npkts: pkt.npkts, va: pkt.va, rkey: pkt.rkey, len: pkt.len }
    }
}

/// A READ or atomic already executed, kept to answer a retransmitted duplicate.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Replay {
    Read(ReadReq),
    Atomic { psn: u32, orig: u64 },
}

impl Replay {
    /// The READ of `len` bytes at `(va, rkey)` that occupied `npkts` PSNs from `psn`.
    pub(crate) fn read(psn: u32, npkts: u32, va: u64, rkey: u32, len: u32) -> Replay {
        Replay::Read(ReadReq { psn, npkts, va, rkey, len })
    }
}

/// Laid out in declaration order (`repr(C)`): what every request reads and writes first (see
/// `QpInner`).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Responder {
    /// Expected PSN of the next new request (`rq_psn`).
    pub(crate) epsn: u32,
    /// Message sequence number: messages completed so far.
    pub(crate) msn: u32,
    /// A PSN-sequence NAK was sent and no in-order packet has arrived since.
    pub(crate) nak_seq_sent: bool,
    /// COMM_EST was raised (once per connection).
    pub(crate) comm_est: bool,
    /// XRC target QP: the request handed to another process's SRQ (see `engine::xrc`), whose
    /// answer is awaited; its payload is not kept.
    pub(crate) forwarded: Option<Box<Packet>>,
    /// XRC target QP: the SRQ the request being handled names (its PD checks keys, its CQ
    /// takes the completion).
    pub(crate) xrc: Option<Arc<SrqInner>>,
    /// Recently executed READs and atomics (bounded by `max_dest_rd_atomic`).
    pub(crate) replay: VecDeque<Replay>,
    /// Requests that came while one was forwarded, in order.
    pub(crate) held: VecDeque<Packet>,
    /// A UD QP's datagram gathered before it is scattered into a receive (its allocation
    /// kept from one datagram to the next).
    pub(crate) ud_scratch: Vec<u8>,
}

/// A QP's cached route to its peer: the fabric lookup happens once per connection, later
/// packets only upgrade a `Weak`.
#[derive(Debug, Default)]
pub(crate) struct Route {
    pub(crate) dev: u32,
    pub(crate) qpn: u32,
    pub(crate) qp: std::sync::Weak<QpShared>,
}

/// A QP's connection to its peer QP, proven fit for the express path once (both QPs here, of
/// one type or an XRC initiator and its target, no wire). It holds the peer's memory (no reference count moves
/// per request), not its life: a QP whose last handle is dropped is destroyed at once (see
/// `Drop for Qp`), and lets go of its own lane then, so two peers never keep each other.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) dst: Arc<QpShared>,
    /// The peer's device and port, as the QP's address vector resolved them.
    pub(crate) dest: (u32, u8),
}

impl Lane {
    /// The peer, while it lives (a destroyed peer's number may come back as another QP's).
    #[inline]
    pub(crate) fn peer(&self) -> Option<&Arc<QpShared>> {
        Some(&self.dst).filter(|d| d.life.is_alive())
    }
}

/// Where a post on the QP will go on its lane's peer, for [`sync::prefetch`](prefetch) before
/// the QP's own lock is taken (the lane itself is under that lock): the peer's lock, as an
/// address only, and its receive queue, kept. Measured on the two-thread SEND ping-pong (G4),
/// these prefetches and the CQ's (see `cq_ring::Ring::push_alone`) took ~15% off a round trip.
///
/// Set for the first peer and kept with the QP (a post reads it without any lock); a QP
/// whose lane later leads elsewhere (reconnected) prefetches nothing from then on. It holds
/// no QP, so two peers do not keep each other.
#[derive(Debug, Default)]
pub(crate) struct Hint {
    /// The first peer's lock, prefetched by address (never read through); 0 before the first
    /// lane, and once the lane led elsewhere.
    lock: AtomicUsize,
    /// The first peer's receive queue.
    rq: OnceLock<Arc<RecvRing>>,
}

impl Hint {
    /// The lane leads to `dst` now (as it is proven, under the QP's lock).
    pub(crate) fn point_at(&self, dst: &QpShared) {
        let mut first = false;
        let rq = self.rq.get_or_init(|| {
            first = true;
            dst.rq.clone()
        });
        if first {
            self.lock.store(&dst.inner as *const _ as usize, Ordering::Relaxed);
        } else if !Arc::ptr_eq(rq, &dst.rq) {
            self.lock.store(0, Ordering::Relaxed);
        }
    }

    /// Starts bringing in the peer's lines a post of `opcode` will meet.
    #[inline]
    pub(crate) fn prefetch(&self, opcode: WrOpcode) {
        let lock = self.lock.load(Ordering::Relaxed);
        if lock == 0 {
            return;
        }
        prefetch::for_write(lock as *const u8);
        if matches!(
            opcode,
            WrOpcode::SEND | WrOpcode::SEND_WITH_IMM | WrOpcode::RDMA_WRITE_WITH_IMM
        ) && let Some(rq) = self.rq.get()
        {
            rq.prefetch_next();
        }
    }

    /// The peer's lock the hint points at (its address), if it still leads there.
    #[cfg(test)]
    pub(crate) fn points_at(&self) -> Option<usize> {
        Some(self.lock.load(Ordering::Relaxed)).filter(|&l| l != 0)
    }
}

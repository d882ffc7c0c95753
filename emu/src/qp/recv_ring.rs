//! A QP's receive queue: the application posts without the QP's lock, and whoever delivers a
//! message into the QP (under its lock) learns of a posted WQE from the WQE's own slot.
//!
//! In a ping-pong the poster and the deliverer run on different cores. When both took the QP's
//! lock and met on one pair of indices, every posted receive moved the QP's hottest cache line
//! (the lock, the responder's sequence numbers) to the poster's core and back. Here, as in the
//! completion queue's ring (`objects::cq_ring`), each slot carries a sequence word: the WQE
//! for counter `c` (the `c`-th receive ever posted, in slot `c & mask`) is published by a
//! release store of `c + 1` into the slot's word, after the WQE. The deliverer, the one
//! consumer (it holds the QP's lock), reads the slot at its `tail`; when done with it, it
//! publishes `tail + 1`, which frees the slot. Posters (serialized by a small lock of their
//! own, on a line of its own) read `tail` only when the queue looks full to them.
//!
//! What the poster must not miss: a QP that enters ERR flushes what is posted (under the QP's
//! lock), and a receive posted after that must complete flushed too. The poster publishes its
//! WQE and reads the state's mirror here under the posters' lock; the flusher sets the mirror
//! under that lock too, then flushes what is published. A post either published before (the
//! flush takes it) or reads ERR (the poster then flushes it itself, under the QP's lock). The
//! flusher takes the lock lent (`sync::lock::lock_lent`): the posting thread keeps its bias,
//! and entering ERR costs no process-wide barrier unless another thread owns it (then a
//! revocation's, as every entry into ERR cost when the two sides met by asymmetric fences).
//!
//! Slots are made in chunks as posting first reaches them, so a queue created with the
//! device's largest depth takes memory only as deep as it is used.
#![allow(unsafe_code)]

use std::{
    cell::UnsafeCell,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

use crossbeam_utils::CachePadded;

use crate::objects::recv_queue::{RecvWqe, RecvWr, Sges};
use crate::{
    error::{Errno, Error, Result},
    sync::lock::{Lock, lock_lent},
    types::QpState,
};

/// Slots made at a time.
const CHUNK: u32 = 64;

#[repr(C, align(64))]
struct Slot {
    /// `c + 1` once the WQE of counter `c` is written here (see the module's text).
    seq: AtomicU32,
    wqe: UnsafeCell<RecvWqe>,
}

/// The posters' side: the next counter, and the last `tail` they read.
#[derive(Debug, Default)]
struct Poster {
    head: u32,
    tail_seen: u32,
}

pub(crate) struct RecvRing {
    /// A biased lock: receives are posted by one thread as a rule, which then takes it with
    /// no locked instruction (parking_lot's took two per receive).
    poster: CachePadded<Lock<Poster>>,
    /// The consumer's next counter, published (release) when it is done with a slot.
    tail: CachePadded<AtomicU32>,
    /// The QP's state, as the QP's lock holder last set it (see [`RecvRing::set_state`]).
    state: AtomicU32,
    depth: u32,
    mask: u32,
    /// Slots per chunk, as a power of two (a division by it is a division instruction, whose
    /// latency sat on every post and every take).
    chunk_shift: u32,
    /// A slot's place in its chunk: the counter's bits below `chunk_shift`.
    at_mask: u32,
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
}

// SAFETY: a slot's WQE is written only by the poster that holds `poster` and found it free
// (the consumer published a `tail` past its previous WQE, read with acquire), and read or
// written by the consumer only between seeing it published (acquire load of its word) and
// publishing `tail` past it; `RecvWqe` is plain data owned by the slot.
unsafe impl Sync for RecvRing {}
// SAFETY: as above; the ring owns its slots.
unsafe impl Send for RecvRing {}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("depth", &self.depth)
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RecvRing {
    /// A queue of `depth` receives (at least one slot, a power of two of them).
    pub(crate) fn new(depth: u32) -> RecvRing {
        let slots = depth.max(1).checked_next_power_of_two().unwrap_or(1 << 31);
        let chunks = slots.div_ceil(CHUNK);
        RecvRing {
            poster: CachePadded::new(Lock::new(Poster::default())),
            tail: CachePadded::new(AtomicU32::new(0)),
            state: AtomicU32::new(QpState::RESET.0),
            depth,
            mask: slots - 1,
            chunk_shift: slots.min(CHUNK).trailing_zeros(),
            at_mask: slots.min(CHUNK) - 1,
            chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Where counter `c`'s slot is: its chunk, and its place in the chunk. Both are in
    /// bounds: the chunk below `chunks.len()` (the counter's bits under `mask`, shifted, of
    /// `slots` that fill the chunks), the place below a chunk's `1 << chunk_shift` slots.
    #[inline]
    fn place(&self, c: u32) -> (usize, usize) {
        let i = c & self.mask;
        let place = ((i >> self.chunk_shift) as usize, (i & self.at_mask) as usize);
        debug_assert!(place.0 < self.chunks.len() && place.1 < 1 << self.chunk_shift);
        place
    }

    /// The slot of counter `c`, if posting ever reached it. (Without bounds checks: they cost
    /// ~4 instructions per look, three or four looks per message in a ping-pong.)
    #[inline]
    fn slot(&self, c: u32) -> Option<&Slot> {
        let (chunk, at) = self.place(c);
        // SAFETY: `place` is in bounds (see there), and every chunk made has
        // `1 << chunk_shift` slots (`slot_made`).
        unsafe { Some(self.chunks.get_unchecked(chunk).get()?.get_unchecked(at)) }
    }

    /// The slot of counter `c`, made (with its chunk) if posting never reached it.
    fn slot_made(&self, c: u32) -> &Slot {
        let (chunk, at) = self.place(c);
        // SAFETY: `place` is in bounds (see there).
        let chunk_cell = unsafe { self.chunks.get_unchecked(chunk) };
        let slots = chunk_cell.get_or_init(|| {
            let first = (chunk as u32) << self.chunk_shift;
            // A slot's word starts at its own index: never the `index + 1` that publishes its
            // first WQE.
            let slot = |j: u32| Slot { seq: AtomicU32::new(first + j), wqe: Default::default() };
            (0..1 << self.chunk_shift).map(slot).collect()
        });
        // SAFETY: as above; the chunk has `1 << chunk_shift` slots, made just above or before.
        unsafe { slots.get_unchecked(at) }
    }

    /// The QP's state changed (called under the QP's lock): what posters check. Entering ERR
    /// pairs with [`RecvRing::post`]'s check (see the module's text): call it before flushing.
    pub(crate) fn set_state(&self, state: QpState) {
        if state == QpState::ERR && self.state() != QpState::ERR {
            let _posters = lock_lent(&self.poster);
            self.state.store(state.0, Ordering::Relaxed);
        } else {
            self.state.store(state.0, Ordering::Relaxed);
        }
    }

    /// The state as last set.
    pub(crate) fn state(&self) -> QpState {
        QpState(self.state.load(Ordering::Relaxed))
    }

    /// Posts a receive: `ENOMEM` when the queue is full, `EINVAL` when it has more than
    /// `max_sge` SGEs (`what` names the queue in the error). Whether the QP was in ERR once
    /// the receive was visible to its consumer: the caller must then flush the queue.
    #[inline]
    pub(crate) fn post(&self, wr: &RecvWr<'_>, max_sge: u32, what: &'static str) -> Result<bool> {
        let mut p = self.poster.lock();
        let head = p.head;
        if head.wrapping_sub(p.tail_seen) >= self.depth {
            p.tail_seen = self.tail.load(Ordering::Acquire);
            if head.wrapping_sub(p.tail_seen) >= self.depth {
                return Err(Error::new(Errno::ENOMEM, what));
            }
        }
        RecvWqe::check(wr, max_sge)?;
        let slot = self.slot_made(head);
        // SAFETY: the slot's previous WQE (counter `head - slots`) is behind a `tail` the
        // consumer published and we read with acquire (now or at an earlier look: `tail`
        // only grows), so the consumer is done with it; posters hold `poster`.
        unsafe { (*slot.wqe.get()).fill(wr) };
        slot.seq.store(head.wrapping_add(1), Ordering::Release);
        p.head = head.wrapping_add(1);
        // Under the posters' lock, as `set_state` stores ERR (see the module's text).
        Ok(self.state() == QpState::ERR)
    }

    /// The consumer's next WQE, if posted: its counter. Call under the QP's lock.
    #[inline]
    fn next(&self) -> Option<(u32, &Slot)> {
        let t = self.tail.load(Ordering::Relaxed);
        let slot = self.slot(t)?;
        (slot.seq.load(Ordering::Acquire) == t.wrapping_add(1)).then_some((t, slot))
    }

    /// Starts bringing in the line of the next WQE the consumer will read (without the QP's
    /// lock: the position may be stale, which costs only the hint).
    #[inline]
    pub(crate) fn prefetch_next(&self) {
        if let Some(slot) = self.slot(self.tail.load(Ordering::Relaxed)) {
            crate::sync::prefetch::for_read(slot);
        }
    }

    /// Whether a receive is posted. Call under the QP's lock.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.next().is_none()
    }

    /// Runs `f` on the next WQE and, if it returns `Some`, consumes the WQE. Call under the
    /// QP's lock (there is one consumer).
    #[inline]
    pub(crate) fn take_with<R>(&self, f: impl FnOnce(&RecvWqe) -> Option<R>) -> Option<R> {
        let (t, slot) = self.next()?;
        // SAFETY: published (acquire above) and not yet released: the consumer's alone.
        let r = f(unsafe { &*slot.wqe.get() })?;
        self.tail.store(t.wrapping_add(1), Ordering::Release);
        Some(r)
    }

    /// Takes the next WQE's `wr_id` and SGE list out, its counter with them; the slot stays
    /// the consumer's until [`RecvRing::give_back`] returns the list (keeping its allocation)
    /// and consumes the WQE. Call under the QP's lock, `give_back` before it is released.
    pub(crate) fn take_out(&self) -> Option<(u64, Sges, u32)> {
        let (t, slot) = self.next()?;
        // SAFETY: published (acquire in `next`) and not yet released: the consumer's alone.
        let wqe = unsafe { &mut *slot.wqe.get() };
        Some((wqe.wr_id, std::mem::take(&mut wqe.sges), t))
    }

    /// See [`RecvRing::take_out`].
    pub(crate) fn give_back(&self, sges: Sges, t: u32) {
        debug_assert_eq!(t, self.tail.load(Ordering::Relaxed));
        if let Some(slot) = self.slot(t) {
            // SAFETY: as in `take_out`, until the release store below.
            unsafe { (*slot.wqe.get()).sges = sges };
        }
        self.tail.store(t.wrapping_add(1), Ordering::Release);
    }

    /// The next WQE's SGEs and counter, without consuming it. Call under the QP's lock, and
    /// drop the borrow before anything consumes.
    pub(crate) fn peek(&self) -> Option<(&[crate::Sge], u32)> {
        let (t, slot) = self.next()?;
        // SAFETY: published and not released; consumed only under the QP's lock, which the
        // caller holds for as long as the borrow.
        Some((unsafe { &(*slot.wqe.get()).sges }, t))
    }

    /// Consumes every posted WQE, calling `each` with its `wr_id` (in order). Call under the
    /// QP's lock.
    pub(crate) fn drain(&self, mut each: impl FnMut(u64)) {
        while let Some(wr_id) = self.take_with(|w| Some(w.wr_id)) {
            each(wr_id);
        }
    }

    /// Forgets every posted WQE, without completions (RESET, destroy). Call under the QP's
    /// lock.
    pub(crate) fn clear(&self) {
        // Lent, as in `set_state`: the thread that resets or destroys the QP does not keep
        // the posters' bias from the one that posts.
        let p = lock_lent(&self.poster);
        // Counters go on from where posting is: a slot's old word never matches a new one.
        self.tail.store(p.head, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::types::Sge;

    fn wr(wr_id: u64, sge: &[Sge]) -> RecvWr<'_> {
        RecvWr { wr_id, sg_list: sge }
    }

    #[test]
    fn receives_come_back_once_in_order_and_a_full_queue_refuses() {
        let rq = RecvRing::new(3);
        let sge = [Sge { addr: 0x1000, length: 8, lkey: 1 }];
        for wr_id in 1..=3 {
            assert_eq!(rq.post(&wr(wr_id, &sge), 1, "full"), Ok(false));
        }
        assert_eq!(rq.post(&wr(4, &sge), 1, "full").unwrap_err().errno(), Errno::ENOMEM);
        assert_eq!(rq.post(&wr(4, &[sge[0]; 2]), 1, "full").unwrap_err().errno(), Errno::ENOMEM);
        assert_eq!(rq.take_with(|w| Some(w.wr_id)), Some(1));
        // A WQE the consumer declines stays first.
        assert_eq!(rq.take_with(|_| None::<()>), None);
        let (wr_id, sges, t) = rq.take_out().unwrap();
        assert_eq!((wr_id, &sges[..]), (2, &sge[..]));
        rq.give_back(sges, t);
        assert_eq!(rq.post(&wr(5, &[sge[0]; 2]), 1, "full").unwrap_err().errno(), Errno::EINVAL);
        rq.post(&wr(5, &sge), 1, "full").unwrap();
        let mut rest = vec![];
        rq.drain(|id| rest.push(id));
        assert_eq!(rest, [3, 5]);
        assert!(rq.is_empty());
    }

    #[test]
    fn receives_keep_their_slots_across_the_counters_wrap() {
        // A depth that does not divide 2^32, counters just short of the wrap.
        let rq = RecvRing::new(3);
        rq.poster.lock().head = u32::MAX - 1;
        rq.poster.lock().tail_seen = u32::MAX - 1;
        rq.tail.store(u32::MAX - 1, Ordering::Relaxed);
        let sge = [Sge { addr: 0x1000, length: 8, lkey: 1 }];
        for round in 0..3 {
            for wr_id in 1..=3 {
                rq.post(&wr(wr_id + 10 * round, &sge), 1, "full").unwrap();
            }
            let mut taken = vec![];
            rq.drain(|id| taken.push(id));
            assert_eq!(taken, [1, 2, 3].map(|i| i + 10 * round), "read back once, in order");
        }
    }

    #[test]
    fn a_queue_of_several_chunks_gives_each_receive_its_own_scatter_list() {
        // 200 receives deep: four chunks of 64 slots; each lap reuses every slot with a list
        // of another length than the lap before (one SGE after two, none after one...).
        let rq = RecvRing::new(200);
        let sges: Vec<Sge> =
            (0..3).map(|i| Sge { addr: 0x1000 * (i + 1), length: 8, lkey: 1 }).collect();
        for lap in 0..6u64 {
            for n in 0..200u64 {
                let k = ((n + lap) % 3) as usize;
                rq.post(&wr(lap * 1000 + n, &sges[..k]), 3, "full").unwrap();
            }
            for n in 0..200u64 {
                let k = ((n + lap) % 3) as usize;
                let (wr_id, list, t) = rq.take_out().unwrap();
                assert_eq!((wr_id, &list[..]), (lap * 1000 + n, &sges[..k]));
                rq.give_back(list, t);
            }
            assert!(rq.is_empty());
        }
    }

    #[test]
    fn a_cleared_queue_holds_nothing_and_takes_new_receives() {
        let rq = RecvRing::new(4);
        let sge = [Sge { addr: 0x1000, length: 8, lkey: 1 }];
        for wr_id in 1..=4 {
            rq.post(&wr(wr_id, &sge), 1, "full").unwrap();
        }
        rq.clear();
        assert!(rq.is_empty());
        rq.post(&wr(9, &sge), 1, "full").unwrap();
        assert_eq!(rq.take_with(|w| Some(w.wr_id)), Some(9));
    }

    /// Posters racing a consumer that enters ERR and flushes: every receive comes back exactly
    /// once, taken or flushed, whichever side saw the other (none is left behind).
    #[test]
    fn a_receive_posted_as_the_queue_enters_err_is_flushed_by_one_side() {
        for _ in 0..50 {
            let rq = Arc::new(RecvRing::new(1 << 12));
            rq.set_state(QpState::RTS);
            let lock = Arc::new(crate::sync::Mutex::new(Vec::<u64>::new()));
            let posters: Vec<_> = (0..2u64)
                .map(|p| {
                    let (rq, lock) = (rq.clone(), lock.clone());
                    std::thread::spawn(move || {
                        let sge = [Sge { addr: 0x1000, length: 8, lkey: 1 }];
                        for i in 0..500 {
                            if rq.post(&wr(p << 32 | i, &sge), 1, "full").unwrap() {
                                let mut done = lock.lock();
                                rq.drain(|id| done.push(id));
                            }
                        }
                    })
                })
                .collect();
            {
                // The consumer: takes a few, then enters ERR and flushes.
                let mut done = lock.lock();
                while done.len() < 10 {
                    if let Some(id) = rq.take_with(|w| Some(w.wr_id)) {
                        done.push(id);
                    }
                }
                rq.set_state(QpState::ERR);
                rq.drain(|id| done.push(id));
            }
            posters.into_iter().for_each(|t| t.join().unwrap());
            let mut done = std::mem::take(&mut *lock.lock());
            assert!(rq.is_empty(), "a receive was left behind");
            done.sort_unstable();
            let mut want: Vec<u64> =
                (0..2u64).flat_map(|p| (0..500).map(move |i| p << 32 | i)).collect();
            want.sort_unstable();
            assert_eq!(done, want);
        }
    }

    /// Entering ERR takes the posters' lock lent: no process-wide barrier when the thread that
    /// posts enters it (or nobody has posted); one, the bias's revocation, when another thread
    /// owns the posters' bias. Clearing the queue lends it too.
    #[test]
    fn entering_err_stops_other_threads_only_when_another_thread_posts() {
        use crate::sync::barrier::test::heavy_in;
        let sge = [Sge { addr: 0x1000, length: 8, lkey: 1 }];
        let rq = RecvRing::new(4);
        rq.set_state(QpState::RTS);
        assert_eq!(heavy_in(|| rq.set_state(QpState::ERR)), 0, "nobody posted");
        let rq = RecvRing::new(4);
        rq.set_state(QpState::RTS);
        rq.post(&wr(1, &sge), 1, "full").unwrap();
        assert_eq!(heavy_in(|| rq.set_state(QpState::ERR)), 0, "this thread posts");
        assert!(rq.post(&wr(2, &sge), 1, "full").unwrap(), "a post after ERR sees it");
        let rq = Arc::new(RecvRing::new(4));
        rq.set_state(QpState::RTS);
        let poster = rq.clone();
        std::thread::spawn(move || poster.post(&wr(3, &sge), 1, "full").unwrap()).join().unwrap();
        let expected = u32::from(crate::sync::barrier::asymmetric());
        assert_eq!(heavy_in(|| rq.set_state(QpState::ERR)), expected, "another thread posts");
        // A queue cleared (RESET) by a thread that never posts leaves the bias to the poster.
        let rq = Arc::new(RecvRing::new(4));
        rq.clear();
        let poster = rq.clone();
        let revoked = std::thread::spawn(move || {
            heavy_in(|| {
                poster.post(&wr(4, &sge), 1, "full").unwrap();
            })
        });
        assert_eq!(revoked.join().unwrap(), 0, "the poster takes a bias nobody kept");
    }
}

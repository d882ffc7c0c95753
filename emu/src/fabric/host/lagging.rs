//! Peers whose process takes nothing in now (stopped, or its threads busy elsewhere): the
//! WRITEs and READs waiting in our ring to one are carried out by us, and the looks of
//! polling threads that notice them.

use super::*;

/// A peer node whose process takes nothing in now: stopped, or its threads not scheduled (see
/// [`Node::absent_peer`]). Our QPs may carry out their WRITEs and READs to it themselves.
pub(crate) struct AbsentPeer {
    pub(super) peer: Arc<Peer>,
    pub(super) exports: Arc<PeerExports>,
    pub(super) process: Arc<PeerProcess>,
    /// Where in our ring to it the search for the next request resumes.
    pub(super) from: u64,
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
    pub(super) fn place(&self, tx: &mut PeerTx, ring: &Ring, req: exports::Request<'_>) -> bool {
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
pub(super) fn request_ids(b: &[u8]) -> Option<(u32, u32, u32)> {
    let head = FrameHead::parse(b).filter(FrameHead::whole)?;
    let (kind, src, psn) = wire::packet_ids(&b[HEADER..])?;
    matches!(kind, Kind::Write | Kind::ReadRequest).then_some((head.dst_qpn, src, psn))
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
pub(super) struct Looks {
    locked_out: u32,
    pub(super) taken: u32,
}

impl Looks {
    /// Looks in a row that found the rings taken before the poller yields.
    pub(super) const LOCKED_OUT: u32 = 64;

    /// Runs `f` on the calling thread's looks.
    #[inline(always)]
    pub(super) fn of_this_thread<R>(f: impl FnOnce(&mut Looks) -> R) -> R {
        this_thread::looks::with(|word| {
            let w = word.get();
            let mut looks = Looks { locked_out: w as u32, taken: (w >> 32) as u32 };
            let r = f(&mut looks);
            word.set(u64::from(looks.locked_out) | u64::from(looks.taken) << 32);
            r
        })
    }

    /// Counts a look that found the rings taken: whether to yield now.
    pub(super) fn missed(&mut self) -> bool {
        let n = self.locked_out + 1;
        self.locked_out = if n == Self::LOCKED_OUT { 0 } else { n };
        n == Self::LOCKED_OUT
    }

    /// A look took the rings (or found none to take): the run of misses ends. Whether lagging
    /// peers are due a look (every [`LAG_LOOKS`]).
    pub(super) fn took(&mut self) -> bool {
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
pub(super) struct LagWatch {
    pub(super) peers: smallvec::SmallVec<[Watched; 4]>,
}

/// A peer's ring as [`LagWatch`] last looked at it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Watched {
    pub(super) slot: u8,
    /// How far its reader had freed our ring at the last look at it.
    pub(super) freed: u64,
    /// If records that might be carried out were written beyond that: how far, and since
    /// when.
    pub(super) unfreed: Option<(u64, Instant)>,
}

impl LagWatch {
    /// The peers whose oldest record of ours is unbegun, records of ours that might be
    /// carried out there unfreed for [`LAG`]; each such peer is then given another `LAG`
    /// before it is named again. (Held in place: a slow machine finds peers lagging at every
    /// look.)
    pub(super) fn lagging(
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

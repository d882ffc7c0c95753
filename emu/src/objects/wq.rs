//! Receive work queues (`struct ibv_wq`) and the receive WQ indirection tables
//! (`struct ibv_rwq_ind_table`) that RSS QPs spread incoming frames over.
//!
//! A WQ is a receive queue of its own, with its own CQ and state (RESET, RDY, ERR). It takes
//! frames only through an indirection table of an RSS QP (see `engine::raw`). The rules are a
//! ConnectX's under rdma-core's mlx5 provider: receives posted in RESET are lost when the WQ
//! becomes ready, a WQ in ERR flushes what it holds and what is posted to it.

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use crate::sync::Mutex;

use super::{
    Lifecycle,
    context::{About, Context},
    cq::{Cq, CqInner},
    device::ResourceCounts,
    event::EventCount,
    pd::{Pd, PdInner},
};
use crate::{
    error::{Errno, Error, Result, einval},
    fabric::timer::Job,
    objects::recv_queue::{RecvQueue, RecvWr},
    types::{EventType, Wc, WcOpcode, WcStatus, WqFlags, WqState},
};

/// What `ibv_create_wq` takes for a receive WQ (`IBV_WQT_RQ`).
#[derive(Debug, Clone, Copy)]
pub struct WqInitAttr<'a> {
    /// Receive WRs it holds at once (at least 1).
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
    /// The CQ its completions go to.
    pub cq: &'a Cq,
    /// Receive offloads (`IBV_WQ_INIT_ATTR_FLAGS`).
    pub flags: WqFlags,
}

impl<'a> WqInitAttr<'a> {
    /// A WQ of `max_wr` receives of `max_sge` SGEs completing on `cq`, without offloads.
    pub fn new(max_wr: u32, max_sge: u32, cq: &'a Cq) -> Self {
        WqInitAttr { max_wr, max_sge, cq, flags: WqFlags::empty() }
    }
}

/// How long a frame waits for a receive on a WQ with `IBV_WQ_FLAGS_DELAY_DROP` (mlx5's default
/// delay drop timeout, 100 ms).
pub(crate) const DELAY_DROP_TIMEOUT_NS: u64 = 100_000_000;

/// A frame waiting for a receive (delay drop).
#[derive(Debug)]
struct Held {
    frame: Box<[u8]>,
    tag: u32,
    deadline: u64,
}

#[derive(Debug)]
struct WqQueue {
    state: WqState,
    rq: RecvQueue,
    flags: WqFlags,
    /// Delay drop: frames that came when no receive was posted, oldest first (at most as
    /// many as the ring holds).
    held: VecDeque<Held>,
}

#[derive(Debug)]
pub(crate) struct WqInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) cq: Arc<CqInner>,
    /// `wq_num`: what its completions carry as `qp_num`.
    pub(crate) num: u32,
    max_wr: u32,
    max_sge: u32,
    st: Mutex<WqQueue>,
    /// Dependents: the indirection tables that hold it.
    pub(crate) life: Lifecycle,
    pub(crate) async_events: EventCount,
    user_data: AtomicUsize,
}

impl Drop for WqInner {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.pd.ctx.discard_events(self as *const Self);
            self.release();
        }
    }
}

impl WqInner {
    fn release(&self) {
        self.cq.life.put();
        self.pd.life.put();
        ResourceCounts::give(&self.pd.ctx.device.counts.wq);
    }

    fn completion(&self, wr_id: u64, status: WcStatus) -> Wc {
        Wc { wr_id, status, qp_num: self.num, ..Default::default() }
    }

    /// Completes everything queued with `IBV_WC_WR_FLUSH_ERR`.
    fn flush(&self, q: &mut WqQueue) {
        while q.rq.tail != q.rq.head {
            let wr_id = q.rq.ring.at(q.rq.tail).wr_id;
            let _ = self.cq.push(self.completion(wr_id, WcStatus::WR_FLUSH_ERR), true);
            q.rq.tail = q.rq.tail.wrapping_add(1);
        }
    }

    /// A frame an RSS QP steered here: written into the next receive, completed on the WQ's
    /// CQ. Without a ready WQ the frame is dropped, as a NIC drops it; without a posted
    /// receive too, unless the WQ delays drops (then it waits, see [`WqInner::take_held`]).
    pub(crate) fn deliver(self: &Arc<WqInner>, frame: &[u8], tag: u32) {
        let mut q = self.st.lock();
        if q.state != WqState::RDY {
            return;
        }
        if q.rq.len() > 0 && q.held.is_empty() {
            let ok = self.land(&mut q, frame, tag);
            drop(q);
            if !ok {
                self.fatal();
            }
            return;
        }
        if q.flags.contains(WqFlags::DELAY_DROP) && q.held.len() < q.rq.depth as usize {
            let fabric = &self.pd.ctx.fabric;
            let deadline = fabric.now() + DELAY_DROP_TIMEOUT_NS;
            q.held.push_back(Held { frame: frame.into(), tag, deadline });
            drop(q);
            fabric.timer.schedule(deadline, Job::DelayDrop(Arc::downgrade(self)));
        }
    }

    /// Writes `frame` into the oldest receive; whether the WQ is still sound. A receive that
    /// cannot take it (or a completion lost to a CQ overrun) puts the WQ in ERR.
    fn land(&self, q: &mut WqQueue, frame: &[u8], tag: u32) -> bool {
        let tail = q.rq.tail;
        q.rq.tail = tail.wrapping_add(1);
        let w = q.rq.ring.at(tail);
        let wr_id = w.wr_id;
        match super::sgl::land(q.flags, &self.pd, &w.sges, frame) {
            Ok(l) => {
                let base = Wc {
                    opcode: WcOpcode::RECV,
                    flow_tag: tag,
                    ..self.completion(wr_id, WcStatus::SUCCESS)
                };
                if self.cq.push(l.wc(base), false).is_ok() {
                    return true;
                }
            }
            Err(status) => {
                let _ = self.cq.push(self.completion(wr_id, status), true);
            }
        }
        q.state = WqState::ERR;
        q.held.clear();
        self.flush(q);
        false
    }

    /// Delay drop: gives waiting frames to the receives just posted, oldest first, and drops
    /// those whose time ran out; whether the WQ is still sound.
    fn take_held(&self, q: &mut WqQueue) -> bool {
        let now = self.pd.ctx.fabric.now();
        while q.rq.len() > 0 {
            let Some(h) = q.held.pop_front() else { break };
            if h.deadline > now && !self.land(q, &h.frame, h.tag) {
                return false;
            }
        }
        true
    }

    /// The delay drop timer: frames that waited `DELAY_DROP_TIMEOUT_NS` are dropped.
    pub(crate) fn expire_held(&self, now: u64) {
        let mut q = self.st.lock();
        while q.held.front().is_some_and(|h| h.deadline <= now) {
            q.held.pop_front();
        }
    }

    /// The WQ failed: `IBV_EVENT_WQ_FATAL`.
    fn fatal(self: &Arc<WqInner>) {
        self.pd.ctx.raise(EventType::WQ_FATAL, About::Wq(Arc::downgrade(self)));
    }
}

/// A receive work queue. Cheap to clone; all clones are the same WQ.
#[derive(Clone, Debug)]
pub struct Wq(pub(crate) Arc<WqInner>);

impl Wq {
    /// `ibv_create_wq`: a WQ in RESET. `EOPNOTSUPP` on a device without WQs (rxe); `EINVAL`
    /// for `max_wr` 0 or above `max_qp_wr`, `max_sge` above `max_sge`, or a CQ of another
    /// context.
    pub(crate) fn create(pd: &Pd, init: &WqInitAttr<'_>) -> Result<Wq> {
        let ctx = &pd.0.ctx;
        let a = &ctx.device.attr;
        if !a.has_raw_packet() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no work queues"));
        }
        if init.max_wr == 0 || init.max_wr > a.max_qp_wr || init.max_sge > a.max_sge {
            return Err(einval("max_wr or max_sge out of range"));
        }
        if !Arc::ptr_eq(&init.cq.0.ctx, ctx) {
            return Err(einval("the CQ belongs to another context"));
        }
        if !a.wq_flags().contains(init.flags) {
            return Err(Error::new(Errno::EOPNOTSUPP, "a WQ flag the device does not offer"));
        }
        let counts = &ctx.device.counts;
        ResourceCounts::take(&counts.wq, a.max_wq_type_rq, "too many work queues")?;
        if let Err(e) = pd.0.life.get() {
            ResourceCounts::give(&counts.wq);
            return Err(e);
        }
        if let Err(e) = init.cq.0.life.get() {
            pd.0.life.put();
            ResourceCounts::give(&counts.wq);
            return Err(e);
        }
        // A ConnectX rounds the ring up to a power of two.
        let depth = init.max_wr.next_power_of_two();
        Ok(Wq(Arc::new(WqInner {
            pd: pd.0.clone(),
            cq: init.cq.0.clone(),
            num: ctx.device.next_wqn.fetch_add(1, Ordering::AcqRel) & 0x00ff_ffff,
            max_wr: init.max_wr,
            max_sge: init.max_sge,
            st: Mutex::new(WqQueue {
                state: WqState::RESET,
                rq: RecvQueue::new(depth),
                flags: init.flags,
                held: VecDeque::new(),
            }),
            life: Lifecycle::default(),
            async_events: EventCount::default(),
            user_data: AtomicUsize::new(0),
        })))
    }

    /// `wq_num`.
    pub fn wq_num(&self) -> u32 {
        self.0.num
    }

    /// The sizes asked for at creation (`ibv_create_wq` writes them back unchanged).
    pub fn max_wr(&self) -> u32 {
        self.0.max_wr
    }

    pub fn max_sge(&self) -> u32 {
        self.0.max_sge
    }

    pub fn state(&self) -> WqState {
        self.0.st.lock().state
    }

    pub fn cq(&self) -> Cq {
        Cq(self.0.cq.clone())
    }

    pub fn pd(&self) -> Pd {
        Pd(self.0.pd.clone())
    }

    /// `ibv_modify_wq` with `IBV_WQ_ATTR_STATE` (and `IBV_WQ_ATTR_CURR_STATE` when `cur` is
    /// given, which must be the WQ's state). RESET -> RESET or RDY (receives posted in RESET
    /// are lost), RDY -> RDY, RESET (receives are dropped) or ERR (they are flushed), ERR ->
    /// RESET; anything else is `EINVAL`.
    pub fn modify(&self, next: WqState, cur: Option<WqState>) -> Result<()> {
        self.0.life.check()?;
        let mut q = self.0.st.lock();
        if cur.is_some_and(|c| c != q.state) {
            return Err(einval("curr_wq_state is not the WQ's state"));
        }
        match (q.state, next) {
            (WqState::RDY, WqState::RDY) => {}
            (WqState::RESET | WqState::RDY | WqState::ERR, WqState::RESET)
            | (WqState::RESET, WqState::RDY) => q.rq.clear(),
            (WqState::RDY, WqState::ERR) => self.0.flush(&mut q),
            _ => return Err(einval("invalid WQ state transition")),
        }
        if next != WqState::RDY {
            q.held.clear();
        }
        q.state = next;
        Ok(())
    }

    /// The receive offloads in force.
    pub fn flags(&self) -> WqFlags {
        self.0.st.lock().flags
    }

    /// `ibv_modify_wq` with `IBV_WQ_ATTR_FLAGS`: sets the flags of `mask` to their value in
    /// `flags`. Only C-VLAN stripping can change on a live WQ (as on a ConnectX);
    /// `EOPNOTSUPP` for the others.
    pub fn modify_flags(&self, flags: WqFlags, mask: WqFlags) -> Result<()> {
        self.0.life.check()?;
        if !WqFlags::MODIFIABLE.contains(mask) {
            return Err(Error::new(Errno::EOPNOTSUPP, "only CVLAN stripping changes on a WQ"));
        }
        let mut q = self.0.st.lock();
        q.flags.set(mask, flags.contains(mask));
        Ok(())
    }

    /// `wq->post_recv` of one WR.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.post_recv_list(std::slice::from_ref(wr)).map_err(|(_, e)| e)
    }

    /// `wq->post_recv` of a list: on failure, the index of the first WR not posted and why.
    /// `ENOMEM` when the WQ is full, `EINVAL` for too many SGEs; in ERR the WRs are flushed.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, Error)> {
        self.0.life.check().map_err(|e| (0, e))?;
        let mut q = self.0.st.lock();
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = q.rq.post(wr, self.0.max_sge, "work queue is full") {
                res = Err((i, e));
                break;
            }
        }
        let sound = match q.state {
            WqState::ERR => {
                self.0.flush(&mut q);
                true
            }
            WqState::RDY if !q.held.is_empty() => self.0.take_held(&mut q),
            _ => true,
        };
        drop(q);
        if !sound {
            self.0.fatal();
        }
        res
    }

    /// `ibv_destroy_wq`: `EBUSY` while an indirection table holds it; waits until its async
    /// events are acknowledged. Queued receives are dropped without completions.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.destroy()?;
        let mut q = self.0.st.lock();
        q.rq.clear();
        q.held.clear();
        drop(q);
        self.0.pd.ctx.discard_events(Arc::as_ptr(&self.0));
        self.0.pd.ctx.wait_acked(&self.0.async_events);
        self.0.release();
        Ok(())
    }

    /// The opaque word set by [`Wq::set_user_data`] (0 until set).
    pub fn user_data(&self) -> usize {
        self.0.user_data.load(Ordering::Acquire)
    }

    /// Stores an opaque word with the WQ (the C shim keeps its `ibv_wq` pointer here).
    pub fn set_user_data(&self, v: usize) {
        self.0.user_data.store(v, Ordering::Release);
    }

    /// Whether two handles name the same WQ.
    pub fn same(&self, other: &Wq) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[derive(Debug)]
pub(crate) struct IndTableInner {
    pub(crate) ctx: Arc<super::context::ContextInner>,
    /// `2^log_size` entries; a frame goes to `wqs[hash & (len - 1)]`.
    pub(crate) wqs: Vec<Arc<WqInner>>,
    pub(crate) num: u32,
    /// Dependents: the RSS QPs using it.
    pub(crate) life: Lifecycle,
}

impl IndTableInner {
    fn release(&self) {
        self.wqs.iter().for_each(|w| w.life.put());
        ResourceCounts::give(&self.ctx.device.counts.ind_table);
    }
}

impl Drop for IndTableInner {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.release();
        }
    }
}

/// A receive WQ indirection table (`struct ibv_rwq_ind_table`).
#[derive(Clone, Debug)]
pub struct RwqIndTable(pub(crate) Arc<IndTableInner>);

impl RwqIndTable {
    /// `ibv_create_rwq_ind_table`: `wqs` must hold exactly `2^log_size` WQs of this context
    /// (one may appear several times), `2^log_size` at most the device's
    /// `max_rwq_indirection_table_size`; else `EINVAL`. `EOPNOTSUPP` without RSS (rxe).
    pub(crate) fn create(ctx: &Context, log_size: u32, wqs: &[&Wq]) -> Result<RwqIndTable> {
        let dev = &ctx.0.device;
        let a = &dev.attr;
        if !a.has_raw_packet() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no RSS"));
        }
        if log_size >= 32 || 1u64 << log_size > a.max_rwq_indirection_table_size as u64 {
            return Err(einval("log_ind_tbl_size above the device's table size"));
        }
        if wqs.len() != 1 << log_size {
            return Err(einval("an indirection table holds exactly 2^log_ind_tbl_size WQs"));
        }
        if wqs.iter().any(|w| !Arc::ptr_eq(&w.0.pd.ctx, &ctx.0)) {
            return Err(einval("a WQ belongs to another context"));
        }
        ResourceCounts::take(
            &dev.counts.ind_table,
            a.max_rwq_indirection_tables,
            "too many indirection tables",
        )?;
        for (i, w) in wqs.iter().enumerate() {
            if let Err(e) = w.0.life.get() {
                wqs[..i].iter().for_each(|w| w.0.life.put());
                ResourceCounts::give(&dev.counts.ind_table);
                return Err(e);
            }
        }
        Ok(RwqIndTable(Arc::new(IndTableInner {
            ctx: ctx.0.clone(),
            wqs: wqs.iter().map(|w| w.0.clone()).collect(),
            num: dev.next_wqn.fetch_add(1, Ordering::AcqRel) & 0x00ff_ffff,
            life: Lifecycle::default(),
        })))
    }

    /// `ind_tbl_num`.
    pub fn num(&self) -> u32 {
        self.0.num
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.wqs.len()
    }

    /// Never true: a table has at least one entry.
    pub fn is_empty(&self) -> bool {
        self.0.wqs.is_empty()
    }

    /// `ibv_destroy_rwq_ind_table`: `EBUSY` while an RSS QP uses it.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.destroy()?;
        self.0.release();
        Ok(())
    }

    /// Whether two handles name the same table.
    pub fn same(&self, other: &RwqIndTable) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

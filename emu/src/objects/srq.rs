//! Shared receive queues (`struct ibv_srq`).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use parking_lot::Mutex;

use super::{
    Lifecycle,
    context::{AsyncEvent, EventElement},
    device::ResourceCounts,
    event::EventCount,
    pd::{Pd, PdInner},
};
use crate::{
    error::{Result, einval},
    qp::{RecvWr, queue::RecvQueue},
    types::{EventType, Sge},
};

/// `struct ibv_srq_attr`: sizes and the limit that arms `IBV_EVENT_SRQ_LIMIT_REACHED`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `enum ibv_srq_attr_mask`.
pub mod srq_attr_mask {
    pub const MAX_WR: u32 = 1;
    pub const LIMIT: u32 = 2;
}

#[derive(Debug)]
struct SrqState {
    rq: RecvQueue,
    max_sge: u32,
    /// 0: disarmed.
    limit: u32,
}

/// What an XRC SRQ adds: its domain, and the CQ its receive completions go to.
pub(crate) type XrcPart = (Arc<super::xrcd::XrcdInner>, Arc<super::cq::CqInner>);

#[derive(Debug)]
pub(crate) struct SrqInner {
    pub(crate) pd: Arc<PdInner>,
    /// The SRQ number (`ibv_get_srq_num`), unique on the device.
    pub(crate) num: u32,
    pub(crate) xrc: Option<XrcPart>,
    st: Mutex<SrqState>,
    /// Dependents: QPs using the SRQ.
    pub(crate) life: Lifecycle,
    pub(crate) async_events: EventCount,
    user_data: AtomicUsize,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.release();
        }
    }
}

impl SrqInner {
    fn release(&self) {
        if let Some((xrcd, cq)) = &self.xrc {
            xrcd.forget_srq(self.num);
            cq.life.put();
            xrcd.life.put();
        }
        self.pd.life.put();
        ResourceCounts::give(&self.pd.ctx.device.counts.srq);
    }
}

/// rxe's ring sizing: the smallest `2^n - 1 >= n`.
fn granted(n: u32) -> u32 {
    (n.max(1) + 1).next_power_of_two() - 1
}

impl SrqInner {
    /// Takes the oldest receive WQE, raising `SRQ_LIMIT_REACHED` once when the count falls
    /// below an armed limit (IBA 10.2.9.2).
    pub(crate) fn pop(self: &Arc<SrqInner>) -> Option<(u64, Vec<Sge>)> {
        let mut st = self.st.lock();
        if st.rq.len() == 0 {
            return None;
        }
        let tail = st.rq.tail;
        let w = st.rq.ring.at_mut(tail);
        let taken = (w.wr_id, std::mem::take(&mut w.sges));
        st.rq.tail = tail.wrapping_add(1);
        let fire = st.limit > 0 && st.rq.len() < st.limit;
        if fire {
            st.limit = 0;
        }
        drop(st);
        if fire {
            self.pd.ctx.raise(AsyncEvent {
                event_type: EventType::SRQ_LIMIT_REACHED,
                element: EventElement::Srq(Srq(self.clone())),
            });
        }
        Some(taken)
    }
}

/// A shared receive queue.
#[derive(Clone, Debug)]
pub struct Srq(pub(crate) Arc<SrqInner>);

impl Srq {
    pub(crate) fn create(pd: &Pd, init: &SrqAttr) -> Result<Srq> {
        Srq::create_in(pd, init, None)
    }

    /// Creates a basic SRQ, or with `xrc` an XRC SRQ (the caller holds the references `xrc`
    /// names; they are released with the SRQ).
    pub(crate) fn create_in(pd: &Pd, init: &SrqAttr, xrc: Option<XrcPart>) -> Result<Srq> {
        let a = &pd.0.ctx.device.attr;
        if init.max_wr == 0 || init.max_wr > a.max_srq_wr || init.max_sge > a.max_srq_sge {
            return Err(einval("max_wr or max_sge out of range"));
        }
        let counts = &pd.0.ctx.device.counts;
        ResourceCounts::take(&counts.srq, a.max_srq, "too many shared receive queues")?;
        if let Err(e) = pd.0.life.get() {
            ResourceCounts::give(&counts.srq);
            return Err(e);
        }
        let max_wr = granted(init.max_wr);
        let max_sge = init.max_sge.max(1);
        let ctx = &pd.0.ctx;
        let num = ctx.fabric.srq_number(ctx.device.next_srqn.fetch_add(1, Ordering::AcqRel));
        Ok(Srq(Arc::new(SrqInner {
            pd: pd.0.clone(),
            num,
            xrc,
            st: Mutex::new(SrqState {
                rq: RecvQueue::new(max_wr, max_sge),
                max_sge,
                limit: init.srq_limit,
            }),
            life: Lifecycle::default(),
            async_events: EventCount::default(),
            user_data: AtomicUsize::new(0),
        })))
    }

    /// `ibv_post_srq_recv` of one WR: `ENOMEM` when full, `EINVAL` for too many SGEs.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.0.life.check()?;
        let st = &mut *self.0.st.lock();
        st.rq.post(wr, st.max_sge, "shared receive queue is full")
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> Result<SrqAttr> {
        self.0.life.check()?;
        let st = self.0.st.lock();
        Ok(SrqAttr { max_wr: st.rq.depth, max_sge: st.max_sge, srq_limit: st.limit })
    }

    /// `ibv_modify_srq`: resize (`MAX_WR`, never below the queued count) and/or arm the limit
    /// (`LIMIT`, at most the size).
    pub fn modify(&self, attr: &SrqAttr, mask: u32) -> Result<()> {
        use srq_attr_mask::*;
        self.0.life.check()?;
        if mask & !(MAX_WR | LIMIT) != 0 {
            return Err(einval("unknown SRQ attribute"));
        }
        let max = self.0.pd.ctx.device.attr.max_srq_wr;
        let mut st = self.0.st.lock();
        let new_depth = if mask & MAX_WR != 0 {
            if attr.max_wr == 0 || attr.max_wr > max {
                return Err(einval("max_wr out of range"));
            }
            let d = granted(attr.max_wr);
            if d < st.rq.len() {
                return Err(einval("the new size cannot hold the queued WRs"));
            }
            d
        } else {
            st.rq.depth
        };
        if mask & LIMIT != 0 && attr.srq_limit > new_depth {
            return Err(einval("srq_limit above the queue size"));
        }
        if new_depth != st.rq.depth {
            let mut rq = RecvQueue::new(new_depth, st.max_sge);
            while st.rq.tail != st.rq.head {
                let t = st.rq.tail;
                let w = st.rq.ring.at_mut(t);
                let h = rq.head;
                let n = rq.ring.at_mut(h);
                n.wr_id = w.wr_id;
                n.sges = std::mem::take(&mut w.sges);
                rq.head = h.wrapping_add(1);
                st.rq.tail = t.wrapping_add(1);
            }
            st.rq = rq;
        }
        if mask & LIMIT != 0 {
            st.limit = attr.srq_limit;
        }
        Ok(())
    }

    /// `ibv_destroy_srq`: `EBUSY` while a QP uses it; waits for acknowledged events.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.destroy()?;
        self.0
            .pd
            .ctx
            .discard_events(|e| matches!(e, EventElement::Srq(s) if Arc::ptr_eq(&s.0, &self.0)));
        self.0.pd.ctx.wait_acked(&self.0.async_events);
        self.0.release();
        Ok(())
    }

    /// `ibv_get_srq_num`: the number XRC senders name the SRQ by (`EOPNOTSUPP` on a device
    /// without XRC, as rxe's provider answers).
    pub fn srq_num(&self) -> Result<u32> {
        self.0.life.check()?;
        if !self.0.pd.ctx.device.attr.has_xrc() {
            return Err(crate::Error::new(crate::Errno::EOPNOTSUPP, "the device has no XRC"));
        }
        Ok(self.0.num)
    }

    /// Whether this is an XRC SRQ.
    pub fn is_xrc(&self) -> bool {
        self.0.xrc.is_some()
    }

    /// The opaque word set by [`Srq::set_user_data`].
    pub fn user_data(&self) -> usize {
        self.0.user_data.load(Ordering::Acquire)
    }

    /// Stores an opaque word with the SRQ (for layers that wrap it, such as the C shim).
    pub fn set_user_data(&self, v: usize) {
        self.0.user_data.store(v, Ordering::Release);
    }

    /// Whether two handles name the same SRQ.
    pub fn same(&self, other: &Srq) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

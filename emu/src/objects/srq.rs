//! Shared receive queues (`struct ibv_srq`).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use crate::sync::Mutex;

use super::{
    Lifecycle,
    context::About,
    device::ResourceCounts,
    event::EventCount,
    pd::{Pd, PdInner},
};
use crate::{
    error::{Result, einval},
    objects::recv_queue::{RecvQueue, RecvWr},
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

/// The tag-matching header that starts a message to a tag-matching SRQ (`struct ibv_tmh`).
pub mod tmh {
    pub const NO_TAG: u8 = 0;
    pub const RNDV: u8 = 1;
    pub const FIN: u8 = 2;
    pub const EAGER: u8 = 3;
    /// Its length: opcode, 3 reserved bytes, a 32-bit `app_ctx` and a 64-bit tag (big-endian).
    pub const LEN: usize = 16;
}

/// A tag posted to a tag-matching SRQ (`IBV_WR_TAG_ADD`).
#[derive(Debug)]
pub(crate) struct Tag {
    tag: u64,
    mask: u64,
    wr_id: u64,
    pub(crate) sges: Vec<Sge>,
}

/// A tag-matching SRQ's state: the tags posted, in the order they were added, and the count of
/// unexpected messages against the count the application last synced to; the device matches
/// only while the two agree (as an mlx5 HCA stops matching after an unexpected message until
/// software catches up).
#[derive(Debug)]
pub(crate) struct TagMatching {
    max_tags: u32,
    /// By handle (`ibv_ops_wr.tm.handle`); `None` for a free handle.
    tags: Vec<Option<Tag>>,
    order: std::collections::VecDeque<u32>,
    unexpected: u32,
    synced: u32,
    /// Where the list operations complete (`ibv_srq_init_attr_ex.cq`).
    cq: Arc<super::cq::CqInner>,
}

impl TagMatching {
    /// Takes off the list the first posted tag that a tagged message (`op` EAGER or RNDV)
    /// with `tag` matches (`(tag & mask) == (posted & mask)`), while matching is on (no
    /// unexpected message waits for the application's sync).
    pub(crate) fn take_match(&mut self, op: u8, tag: u64) -> Option<Tag> {
        if (op != tmh::EAGER && op != tmh::RNDV) || self.unexpected != self.synced {
            return None;
        }
        let i = self.order.iter().position(|&h| {
            self.tags[h as usize].as_ref().is_some_and(|t| (t.tag ^ tag) & t.mask == 0)
        })?;
        let h = self.order.remove(i).expect("found above");
        self.tags[h as usize].take()
    }

    /// Counts a tagged message that went to an ordinary receive WQE: matching pauses until
    /// the application syncs to the new count.
    pub(crate) fn unexpected(&mut self) {
        self.unexpected = self.unexpected.wrapping_add(1);
    }
}

impl Tag {
    pub(crate) fn wr_id(&self) -> u64 {
        self.wr_id
    }
}

/// An operation on a tag-matching SRQ's list (`struct ibv_ops_wr`).
#[derive(Debug, Clone, Copy)]
pub struct SrqOp<'a> {
    pub wr_id: u64,
    pub kind: SrqOpKind<'a>,
    /// `IBV_OPS_SIGNALED`: a completion on the SRQ's CQ.
    pub signaled: bool,
    /// `IBV_OPS_TM_SYNC`: the count of unexpected messages the application has handled.
    pub sync: Option<u32>,
}

/// What an [`SrqOp`] does.
#[derive(Debug, Clone, Copy)]
pub enum SrqOpKind<'a> {
    /// `IBV_WR_TAG_ADD`: messages whose tag matches `tag` under `mask` land in `sg_list` and
    /// complete with `recv_wr_id`.
    AddTag { tag: u64, mask: u64, recv_wr_id: u64, sg_list: &'a [Sge] },
    /// `IBV_WR_TAG_DEL`: removes the tag `handle` (completing with `IBV_WC_TM_ERR` if a
    /// message consumed it first).
    DelTag { handle: u32 },
    /// `IBV_WR_TAG_SYNC`: only the sync.
    Sync,
}

#[derive(Debug)]
pub(crate) struct SrqInner {
    pub(crate) pd: Arc<PdInner>,
    /// The SRQ number (`ibv_get_srq_num`), unique on the device.
    pub(crate) num: u32,
    pub(crate) xrc: Option<XrcPart>,
    /// Set for a tag-matching SRQ (`IBV_SRQT_TM`).
    pub(crate) tm: Option<Mutex<TagMatching>>,
    st: Mutex<SrqState>,
    /// Dependents: QPs using the SRQ.
    pub(crate) life: Lifecycle,
    pub(crate) async_events: EventCount,
    user_data: AtomicUsize,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.pd.ctx.discard_events(self as *const Self);
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
        if let Some(tm) = &self.tm {
            tm.lock().cq.life.put();
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
    pub(crate) fn pop(self: &Arc<SrqInner>) -> Option<(u64, super::recv_queue::Sges)> {
        self.pop_with(|w| Some((w.wr_id, std::mem::take(&mut w.sges))))
    }

    /// Takes the oldest receive WQE if `take` returns something for it (it runs under the
    /// SRQ's lock: no other QP can take the WQE meanwhile); `None` leaves it queued.
    pub(crate) fn pop_with<R>(
        self: &Arc<SrqInner>,
        take: impl FnOnce(&mut super::recv_queue::RecvWqe) -> Option<R>,
    ) -> Option<R> {
        let mut st = self.st.lock();
        if st.rq.len() == 0 {
            return None;
        }
        let tail = st.rq.tail;
        let taken = take(st.rq.ring.at_mut(tail))?;
        st.rq.tail = tail.wrapping_add(1);
        let fire = st.limit > 0 && st.rq.len() < st.limit;
        if fire {
            st.limit = 0;
        }
        drop(st);
        if fire {
            self.pd.ctx.raise(EventType::SRQ_LIMIT_REACHED, About::Srq(Arc::downgrade(self)));
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

    /// A tag-matching SRQ (`IBV_SRQT_TM`, full profile) for up to `max_tags` posted tags,
    /// whose list operations complete on `cq`. `EOPNOTSUPP` on a device without tag matching,
    /// `EINVAL` for `max_tags` 0 or past the device's `tm_caps`.
    pub(crate) fn create_tm(
        pd: &Pd,
        init: &SrqAttr,
        max_tags: u32,
        cq: &super::cq::Cq,
    ) -> Result<Srq> {
        let caps = pd.0.ctx.device.attr.tm;
        if caps.max_num_tags == 0 {
            return Err(crate::Error::new(
                crate::Errno::EOPNOTSUPP,
                "the device has no tag matching",
            ));
        }
        if max_tags == 0 || max_tags > caps.max_num_tags || init.max_sge > caps.max_sge.max(1) {
            return Err(einval("tag matching caps out of range"));
        }
        cq.0.life.get()?;
        let made = Srq::create_in(pd, init, None);
        let Ok(srq) = made else {
            cq.0.life.put();
            return made;
        };
        let tm = TagMatching {
            max_tags,
            tags: (0..max_tags).map(|_| None).collect(),
            order: Default::default(),
            unexpected: 0,
            synced: 0,
            cq: cq.0.clone(),
        };
        // The SRQ was just made and is not shared yet.
        let mut inner = Arc::try_unwrap(srq.0).expect("a new SRQ has one handle");
        inner.tm = Some(Mutex::new(tm));
        Ok(Srq(Arc::new(inner)))
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
            tm: None,
            st: Mutex::new(SrqState { rq: RecvQueue::new(max_wr), max_sge, limit: init.srq_limit }),
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
            let mut rq = RecvQueue::new(new_depth);
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
        self.0.pd.ctx.discard_events(Arc::as_ptr(&self.0));
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

    /// `ibv_post_srq_ops`: runs each operation on a tag-matching SRQ's list in order and
    /// returns the handles the added tags got (`ibv_ops_wr.tm.handle`), or the index of the
    /// first operation refused and why: `EINVAL` on an SRQ without tag matching, for too many
    /// SGEs or a handle past the list; `ENOMEM` when every tag slot is taken. Signaled
    /// operations complete on the SRQ's CQ (`IBV_WC_TM_ADD` / `_DEL` / `_SYNC`), with
    /// `IBV_WC_TM_SYNC_REQ` while unexpected messages wait for the application's sync.
    pub fn post_ops(
        &self,
        ops: &[SrqOp<'_>],
    ) -> std::result::Result<Vec<Option<u32>>, (usize, crate::Error)> {
        use crate::{Wc, WcFlags, WcOpcode, WcStatus};
        self.0.life.check().map_err(|e| (0, e))?;
        let Some(tm) = &self.0.tm else {
            return Err((0, einval("the SRQ does not match tags")));
        };
        let max_sge = self.0.st.lock().max_sge;
        let mut handles = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let mut t = tm.lock();
            if let Some(n) = op.sync {
                t.synced = n;
            }
            let (opcode, status, handle) = match op.kind {
                SrqOpKind::AddTag { tag, mask, recv_wr_id, sg_list } => {
                    if sg_list.len() as u32 > max_sge {
                        return Err((i, einval("too many SGEs for the tag")));
                    }
                    let Some(h) = t.tags.iter().position(Option::is_none) else {
                        return Err((
                            i,
                            crate::Error::new(crate::Errno::ENOMEM, "every tag slot is taken"),
                        ));
                    };
                    let posted = Tag { tag, mask, wr_id: recv_wr_id, sges: sg_list.to_vec() };
                    t.tags[h] = Some(posted);
                    t.order.push_back(h as u32);
                    (WcOpcode::TM_ADD, WcStatus::SUCCESS, Some(h as u32))
                }
                SrqOpKind::DelTag { handle } => {
                    if handle >= t.max_tags {
                        return Err((i, einval("no such tag handle")));
                    }
                    let gone = t.tags[handle as usize].take().is_some();
                    t.order.retain(|&h| h != handle);
                    (
                        WcOpcode::TM_DEL,
                        if gone { WcStatus::SUCCESS } else { WcStatus::TM_ERR },
                        None,
                    )
                }
                SrqOpKind::Sync => (WcOpcode::TM_SYNC, WcStatus::SUCCESS, None),
            };
            handles.push(handle);
            if op.signaled {
                let flags =
                    if t.unexpected != t.synced { WcFlags::TM_SYNC_REQ } else { WcFlags::empty() };
                let w =
                    Wc { wr_id: op.wr_id, status, opcode, wc_flags: flags, ..Default::default() };
                let _ = t.cq.push(w, false);
            }
        }
        Ok(handles)
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

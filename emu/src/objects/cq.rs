//! Completion queues.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence},
};

use crate::sync::Mutex;

use super::{
    Lifecycle,
    channel::{ChannelInner, CompChannel},
    context::{About, Context, ContextInner},
    cq_ring::{Refused, Ring, Rings},
    device::ResourceCounts,
    event::EventCount,
};
use crate::{
    error::{Errno, Error, Result, einval},
    fabric::timer::Job,
    sync::barrier,
    types::{EventType, Wc, WcStatus},
};

/// What `ibv_req_notify_cq` armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notify {
    None,
    /// The next completion of any kind.
    Next,
    /// The next solicited or unsuccessful completion.
    Solicited,
}

impl Notify {
    fn of(armed: u8) -> Notify {
        match armed & !EVENTED {
            1 => Notify::Next,
            2 => Notify::Solicited,
            _ => Notify::None,
        }
    }

    fn bits(self) -> u8 {
        match self {
            Notify::None => 0,
            Notify::Next => 1,
            Notify::Solicited => 2,
        }
    }

    /// Whether a completion (`solicited`: solicited or unsuccessful) meets the arming.
    fn met_by(self, solicited: bool) -> bool {
        match self {
            Notify::None => false,
            Notify::Next => true,
            Notify::Solicited => solicited,
        }
    }
}

/// In `CqInner::armed` once the CQ was first armed: from then on producers fence (see
/// [`CqInner::push`]).
const EVENTED: u8 = 4;

/// What changes only when the CQ is armed, fires, is moderated or resized (under `st`).
#[derive(Debug)]
struct CqState {
    notify: Notify,
    moderation: Moderation,
    /// Completions that met the armed condition but whose event moderation holds back.
    held: u32,
    /// Bumped whenever the CQ is armed or its event fires: a moderation timer started for an
    /// older arming does nothing.
    generation: u64,
    /// `pushed` when the last event fired: what came later no event announced yet.
    announced: u64,
    /// Armed at least once ([`EVENTED`] is set in `armed`).
    evented: bool,
}

/// Completion event moderation (`ibv_modify_cq`): an armed CQ's event waits until `count`
/// completions meet the armed condition, or `period_ns` after the first of them, whichever
/// comes first. Off (every completion fires at once) while either is 0, as a ConnectX CQ
/// context takes a 0 in either field.
#[derive(Debug, Clone, Copy, Default)]
struct Moderation {
    count: u16,
    period_ns: u64,
}

impl Moderation {
    fn active(self) -> bool {
        self.count > 1 && self.period_ns > 0
    }
}

/// What `ibv_create_cq_ex` asks of a CQ beyond its size, channel and vector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CqOptions {
    /// Stamp every completion with the device clock (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`,
    /// and its wall-clock form): see [`Wc::timestamp`]. Needs a device with a clock
    /// (`DeviceAttr::has_clock`), else `EOPNOTSUPP`.
    pub timestamps: bool,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) ctx: Arc<ContextInner>,
    channel: Option<Arc<ChannelInner>>,
    comp_vector: u32,
    /// The completions, oldest first: producers push and pollers pop without a lock (see
    /// `cq_ring`).
    rings: Rings,
    /// Entries the CQ holds (what `ibv_cq.cqe` reports): a push beyond them overruns.
    cqe: AtomicU32,
    /// Completions queued before the current ring's position 0 (rewriting a ring restarts its
    /// positions): with the ring's `tail`, the sequence number of the newest completion.
    rebased: AtomicU64,
    /// The sequence number of the newest solicited or unsuccessful completion.
    last_solicited: AtomicU64,
    /// `st.notify`, readable without the lock: a producer learns from it that nobody waits
    /// for an event. Written under `st`; see [`CqInner::push`] for the ordering argument.
    armed: AtomicU8,
    st: Mutex<CqState>,
    /// Set on the first overrun: the CQ is in error and its CQ_ERR event was raised.
    overrun: AtomicBool,
    timestamps: bool,
    /// Dependents: QPs using the CQ.
    pub(crate) life: Lifecycle,
    pub(crate) comp_events: EventCount,
    pub(crate) async_events: EventCount,
    /// An opaque word for the embedding layer (the C shim keeps its `ibv_cq` pointer here).
    user_data: AtomicUsize,
    /// The low bits of [`CqInner::taken`] at the last [`CqInner::polled_since_asked`].
    taken_asked: AtomicU32,
}

/// rxe sizes a CQ ring to a power of two with one slot kept empty, and reports the usable
/// count: the smallest `2^n - 1 >= cqe`.
fn granted_cqe(cqe: u32) -> u32 {
    (cqe + 1).next_power_of_two() - 1
}

/// A completion could not be queued because the CQ is full (or already overrun).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overrun;

impl CqInner {
    /// A fault overruns the CQ now: `IBV_EVENT_CQ_ERR` (once), and the completions that
    /// follow are lost as if it were full.
    pub(crate) fn overrun_now(self: &Arc<CqInner>) {
        if !self.overrun.swap(true, Ordering::AcqRel) {
            self.ctx.raise(EventType::CQ_ERR, About::Cq(Arc::downgrade(self)));
        }
    }

    /// Gives the bias of the CQ's producers back if the calling thread owns it: a thread of
    /// the emulator's own that pushed a completion (see `fabric::host::read_loop`).
    pub(crate) fn disown_producer(&self) {
        self.rings.disown_producer();
    }

    /// See `cq_ring::Rings::producer_bias`.
    #[cfg(test)]
    pub(crate) fn producer_bias(&self) -> (bool, bool) {
        self.rings.producer_bias()
    }

    /// The current ring.
    #[inline]
    fn ring(&self) -> &Ring {
        self.rings.current()
    }

    /// Completions queued now.
    fn len(&self) -> u64 {
        self.ring().len()
    }

    /// The sequence number of the newest completion (completions ever queued).
    pub(crate) fn pushed(&self) -> u64 {
        let ring = self.ring();
        self.rebased.load(Ordering::Acquire) + ring.tail()
    }

    /// The sequence number of the newest completion polled (or taken out by a rewrite): the
    /// application has read the CQ up to [`CqInner::pushed`] as it was once this reaches it.
    pub(crate) fn taken(&self) -> u64 {
        let ring = self.ring();
        self.rebased.load(Ordering::Acquire) + ring.head()
    }

    /// Whether the application polled completions since the last time this was asked (by a
    /// QP sending a WRITE to be carried out: see `engine::absent_peer::holds_bell`).
    pub(crate) fn polled_since_asked(&self) -> bool {
        // The low bits tell a change.
        let taken = self.taken() as u32;
        taken != self.taken_asked.load(Ordering::Relaxed) && {
            self.taken_asked.store(taken, Ordering::Relaxed);
            true
        }
    }

    /// Puts `wc` on the ring; its position there, or `Err` when the ring holds `cqe` already.
    #[inline(always)]
    fn enqueue(&self, wc: impl Fn() -> Wc) -> Result<u64, Overrun> {
        loop {
            let cqe = u64::from(self.cqe.load(Ordering::Relaxed));
            let ring = self.ring();
            match ring.push_with(&wc, cqe) {
                Ok(pos) => return Ok(pos),
                Err(Refused::Full) => return Err(Overrun),
                // Closed meanwhile: check against the size it has when it reopens.
                Err(Refused::Again) => continue,
                Err(Refused::Small) => {
                    let to = (ring.capacity() * 2 - 1).min(cqe) as u32;
                    self.rewrite(|wcs| (wcs, Some(to), ()));
                }
            }
        }
    }

    /// Rewrites the ring: `edit` gets its completions, oldest first, and returns those it
    /// keeps, a size the ring must be able to hold from now on (if it must grow), and its
    /// result.
    fn rewrite<R>(&self, edit: impl FnOnce(Vec<Wc>) -> (Vec<Wc>, Option<u32>, R)) -> R {
        self.rings.rewrite(|wcs, old_tail| {
            let (wcs, grow_to, res) = edit(wcs);
            // Positions restart at 0: what was queued before the kept ones counts as rebased.
            self.rebased.fetch_add(old_tail - wcs.len() as u64, Ordering::Relaxed);
            (wcs, grow_to, res)
        })
    }

    /// Queues a completion. On overrun the completion is lost, the CQ enters the error state
    /// and `IBV_EVENT_CQ_ERR` is raised once (IBA 11.4.2.1); the caller decides what happens
    /// to the QP.
    ///
    /// No lock is taken unless the CQ is armed. Against a concurrent `req_notify` this is
    /// Dekker's protocol: the push is made visible before `armed` is read, the arming stored
    /// before the ring is read; so either this producer sees the arming (and fires under the
    /// lock) or the arming thread sees the completion (and its poll finds it; in the full
    /// profile the arming itself fires). Each side needs a full fence between its store and
    /// its load. A CQ that was never armed (one that is polled: every completion of a
    /// benchmark's or a test's loop) has its producers pay nothing for it: the first arming
    /// pays both fences with a process-wide barrier (`sync::barrier`), after marking the CQ
    /// [`EVENTED`] in `armed`; from then on a producer that reads the mark fences and reads
    /// `armed` again, and an arming fences. A producer that read no mark read `armed` before
    /// the first arming's store, so before its barrier: its push is seen by every arming. The
    /// model test below checks every interleaving of the two, with stores delayed as this
    /// machine's store buffers delay them.
    ///
    /// The common path is short and inlined; the overrun and the armed CQ's event are kept out
    /// of line.
    #[inline(always)]
    pub(crate) fn push(self: &Arc<CqInner>, mut wc: Wc, solicited: bool) -> Result<(), Overrun> {
        if self.timestamps {
            wc.timestamp = self.ctx.fabric.now();
        }
        let queued =
            if self.overrun.load(Ordering::Relaxed) { Err(Overrun) } else { self.enqueue(|| wc) };
        let Ok(pos) = queued else {
            return self.overran();
        };
        let solicited = solicited || wc.status != WcStatus::SUCCESS;
        if solicited {
            // Its number since the CQ was made (an atomic load the compiler would keep even
            // where the number goes unused: only here).
            let seq = self.rebased.load(Ordering::Relaxed) + pos + 1;
            self.last_solicited.fetch_max(seq, Ordering::AcqRel);
        }
        barrier::light();
        let mut armed = self.armed.load(Ordering::Relaxed);
        if armed == 0 {
            // Never armed (a polled CQ): one test, where the two below took three.
            return Ok(());
        }
        if armed & EVENTED != 0 {
            fence(Ordering::SeqCst);
            armed = self.armed.load(Ordering::Relaxed);
        }
        if !Notify::of(armed).met_by(solicited) {
            return Ok(());
        }
        self.pushed_while_armed(solicited);
        Ok(())
    }

    /// Whether producers fence (the CQ was armed, or made where light barriers are fences).
    #[cfg(test)]
    pub(crate) fn fences_always(&self) -> bool {
        self.armed.load(Ordering::Relaxed) & EVENTED != 0
    }

    /// A completion was lost: the CQ is in error, raised once.
    #[cold]
    #[inline(never)]
    fn overran(self: &Arc<CqInner>) -> Result<(), Overrun> {
        if !self.overrun.swap(true, Ordering::AcqRel) {
            self.ctx.raise(EventType::CQ_ERR, About::Cq(Arc::downgrade(self)));
        }
        Err(Overrun)
    }

    /// A completion that met the arming was queued: its event fires (or moderation holds it).
    #[cold]
    #[inline(never)]
    fn pushed_while_armed(self: &Arc<CqInner>, solicited: bool) {
        let mut st = self.st.lock();
        if !st.notify.met_by(solicited) {
            return; // another completion's event came first
        }
        let m = st.moderation;
        if m.active() {
            st.held += 1;
            if st.held < u32::from(m.count) {
                if st.held == 1 {
                    let (now, generation) = (self.ctx.fabric.now(), st.generation);
                    drop(st);
                    let job = Job::CqModeration { cq: Arc::downgrade(self), generation };
                    self.ctx.fabric.timer.schedule(now + m.period_ns, job);
                }
                return;
            }
        }
        self.fire(st);
    }

    /// Sets what is armed (under `st`).
    fn arm(&self, st: &mut CqState, notify: Notify) {
        st.notify = notify;
        let evented = if st.evented { EVENTED } else { 0 };
        self.armed.store(notify.bits() | evented, Ordering::Relaxed);
    }

    /// Whether the ring holds a completion that meets `notify` and no event announced.
    fn holds_unannounced(&self, st: &CqState) -> bool {
        let len = self.len();
        let pushed = self.pushed();
        let oldest = (pushed + 1).saturating_sub(len);
        let newest = match st.notify {
            Notify::None => return false,
            Notify::Next => pushed,
            Notify::Solicited => self.last_solicited.load(Ordering::Acquire),
        };
        len > 0 && newest > st.announced && newest >= oldest
    }

    /// Disarms the CQ and puts its event on the channel.
    fn fire(self: &Arc<CqInner>, mut st: crate::sync::MutexGuard<'_, CqState>) {
        self.arm(&mut st, Notify::None);
        st.held = 0;
        st.generation += 1;
        st.announced = self.pushed();
        drop(st);
        if let Some(ch) = &self.channel {
            self.ctx.fabric.cq_events.fetch_add(1, Ordering::Relaxed);
            ch.queue.push(Arc::downgrade(self));
        }
    }

    /// Takes the completions of QP `qpn` out of the CQ (a QP moved to RESET or destroyed on a
    /// device that cleans its CQs then). The QP, in RESET, makes no more: a CQ that holds
    /// none now holds none of them, and is left as it is (rewriting it revokes its biases).
    pub(crate) fn remove_qp(&self, qpn: u32) {
        if self.len() == 0 {
            return;
        }
        self.rewrite(|mut wcs| {
            wcs.retain(|wc| wc.qp_num != qpn);
            (wcs, None, ())
        });
    }

    /// The moderation period of the arming `generation` ran out: its event fires now, with
    /// the completions held so far.
    pub(crate) fn moderation_due(self: &Arc<CqInner>, generation: u64) {
        let st = self.st.lock();
        if st.generation == generation && st.notify != Notify::None && st.held > 0 {
            self.fire(st);
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.forget_events();
            self.release();
        }
    }
}

impl CqInner {
    /// Drops the CQ's unread channel and async events (it is being destroyed).
    fn forget_events(&self) {
        if let Some(ch) = &self.channel {
            ch.queue.remove_if(|cq| std::ptr::eq(cq.as_ptr(), self));
        }
        self.ctx.discard_events(self as *const Self);
    }

    fn release(&self) {
        if let Some(ch) = &self.channel {
            ch.life.put();
        }
        ResourceCounts::give(&self.ctx.device.counts.cq);
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Clone, Debug)]
pub struct Cq(pub(crate) Arc<CqInner>);

impl Cq {
    pub(crate) fn create(
        ctx: &Context,
        cqe: i32,
        channel: Option<&CompChannel>,
        comp_vector: u32,
        options: CqOptions,
    ) -> Result<Cq> {
        let dev = &ctx.0.device;
        if options.timestamps && !dev.attr.has_clock() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no clock to stamp with"));
        }
        if cqe < 1 || cqe as u32 > dev.attr.max_cqe {
            return Err(einval("cqe out of range"));
        }
        if comp_vector >= dev.attr.num_comp_vectors {
            return Err(einval("no such completion vector"));
        }
        if let Some(ch) = channel
            && !Arc::ptr_eq(&ch.0.ctx, &ctx.0)
        {
            return Err(einval("completion channel belongs to another context"));
        }
        ResourceCounts::take(&dev.counts.cq, dev.attr.max_cq, "too many completion queues")?;
        if let Some(ch) = channel
            && let Err(e) = ch.0.life.get()
        {
            ResourceCounts::give(&dev.counts.cq);
            return Err(e);
        }
        let granted = granted_cqe(cqe as u32);
        // Where a producer's light barrier cannot be bare, producers fence from the start, as
        // once a CQ was armed (see `CqInner::push`).
        let evented = !barrier::asymmetric();
        Ok(Cq(Arc::new(CqInner {
            ctx: ctx.0.clone(),
            channel: channel.map(|c| c.0.clone()),
            comp_vector,
            rings: Rings::new(granted),
            cqe: AtomicU32::new(granted),
            rebased: AtomicU64::new(0),
            last_solicited: AtomicU64::new(0),
            armed: AtomicU8::new(if evented { EVENTED } else { 0 }),
            st: Mutex::new(CqState {
                notify: Notify::None,
                moderation: Moderation::default(),
                held: 0,
                generation: 0,
                announced: 0,
                evented,
            }),
            overrun: AtomicBool::new(false),
            timestamps: options.timestamps,
            life: Lifecycle::default(),
            comp_events: EventCount::default(),
            async_events: EventCount::default(),
            user_data: AtomicUsize::new(0),
            taken_asked: AtomicU32::new(0),
        })))
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`, oldest first; returns how
    /// many.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let take = |out: &mut [Wc]| {
            let mut n = 0;
            while n < out.len()
                && let Some(wc) = self.pop()
            {
                out[n] = wc;
                n += 1;
            }
            n
        };
        match take(out) {
            // On a host fabric an empty poll moves inbound packets itself: the spinning
            // caller may hold the CPU the node's reader thread is waiting for.
            0 if self.0.ctx.fabric.progress() => take(out),
            n => n,
        }
    }

    /// Polls one completion.
    #[inline(always)]
    pub fn poll_one(&self) -> Option<Wc> {
        let mut progressed = false;
        // One look at the ring in the code (inlined whole into the caller), taken again
        // after an empty one moved the fabric, as `poll`.
        loop {
            if let Some(wc) = self.pop() {
                return Some(wc);
            }
            if progressed || !self.0.ctx.fabric.progress() {
                return None;
            }
            progressed = true;
        }
    }

    /// The ring's oldest completion, if any.
    #[inline(always)]
    fn pop(&self) -> Option<Wc> {
        loop {
            match self.0.ring().pop() {
                Ok(got) => return got,
                Err(_) => continue, // closed meanwhile
            }
        }
    }

    /// `ibv_req_notify_cq`: arms the CQ to put an event on its channel at the next completion
    /// (or the next solicited or unsuccessful one).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.0.life.check()?;
        let mut st = self.0.st.lock();
        if st.notify == Notify::None {
            st.held = 0;
            st.generation += 1;
        }
        // An arming for any completion stands until its event: asking for solicited ones only
        // meanwhile does not narrow it (IBA C11-31, C11-32; rxe keeps it too).
        let notify = match (st.notify, solicited_only) {
            (Notify::Next, _) | (_, false) => Notify::Next,
            _ => Notify::Solicited,
        };
        // See `CqInner::push`: the arming is visible before the ring is read.
        if st.evented {
            self.0.arm(&mut st, notify);
            fence(Ordering::SeqCst);
        } else {
            st.evented = true;
            self.0.arm(&mut st, notify);
            barrier::heavy();
        }
        if self.0.ctx.device.profile.arm_announces_waiting() && self.0.holds_unannounced(&st) {
            self.0.fire(st);
            return Ok(());
        }
        drop(st);
        // The caller will sleep on the event: the host fabric's reader must not be napping.
        self.0.ctx.fabric.attend();
        Ok(())
    }

    /// `ibv_modify_cq` with `IBV_CQ_ATTR_MODERATE`: from the next arming on, the completion
    /// event waits for `count` completions that meet the armed condition, or `period_us`
    /// microseconds after the first of them, whichever comes first; a 0 in either turns
    /// moderation off. `EINVAL` past the device's `max_cq_count` / `max_cq_period`;
    /// `EOPNOTSUPP` on a device without moderation (rxe).
    pub fn moderate(&self, count: u16, period_us: u16) -> Result<()> {
        self.0.life.check()?;
        let attr = &self.0.ctx.device.attr;
        if !attr.has_cq_moderation() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device cannot moderate CQ events"));
        }
        if count > attr.max_cq_count || period_us > attr.max_cq_period {
            return Err(einval("moderation beyond the device's cq_mod_caps"));
        }
        let mut st = self.0.st.lock();
        st.moderation = Moderation { count, period_ns: u64::from(period_us) * 1000 };
        Ok(())
    }

    /// Whether completions are stamped with the device clock ([`CqOptions::timestamps`]).
    pub fn records_timestamps(&self) -> bool {
        self.0.timestamps
    }

    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        self.0.comp_events.ack(n as u64);
    }

    /// Number of entries the CQ holds (`ibv_cq.cqe`).
    pub fn cqe(&self) -> u32 {
        self.0.cqe.load(Ordering::Relaxed)
    }

    /// Completion vector given at creation.
    pub fn comp_vector(&self) -> u32 {
        self.0.comp_vector
    }

    /// Whether the CQ overran and is in the error state.
    pub fn is_overrun(&self) -> bool {
        self.0.overrun.load(Ordering::Acquire)
    }

    /// The channel the CQ reports to.
    pub fn channel(&self) -> Option<CompChannel> {
        self.0.channel.clone().map(CompChannel)
    }

    /// `ibv_resize_cq`: fails with `EINVAL` when the new size cannot hold the completions
    /// already queued, or exceeds `max_cqe`.
    pub fn resize(&self, cqe: i32) -> Result<u32> {
        self.0.life.check()?;
        if cqe < 1 || cqe as u32 > self.0.ctx.device.attr.max_cqe {
            return Err(einval("cqe out of range"));
        }
        let granted = granted_cqe(cqe as u32);
        self.0.rewrite(|wcs| {
            if (granted as usize) < wcs.len() {
                return (wcs, None, Err(einval("new size is smaller than the queued completions")));
            }
            // Set while the ring is closed: every push from now on is checked against it (the
            // ring grows as completions pile up, as far as this).
            self.0.cqe.store(granted, Ordering::Relaxed);
            (wcs, None, Ok(granted))
        })
    }

    /// `ibv_destroy_cq`: fails with `EBUSY` while a QP uses the CQ; otherwise discards the
    /// CQ's unread channel events and waits until every event already handed to the
    /// application has been acknowledged.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.destroy()?;
        self.0.forget_events();
        self.0.ctx.wait_acked(&self.0.comp_events);
        self.0.ctx.wait_acked(&self.0.async_events);
        self.0.rewrite(|_| (Vec::new(), None, ()));
        self.0.release();
        Ok(())
    }

    /// The context the CQ belongs to.
    pub fn context(&self) -> Context {
        Context(self.0.ctx.clone())
    }

    /// The opaque word set by [`Cq::set_user_data`] (0 until set).
    pub fn user_data(&self) -> usize {
        self.0.user_data.load(Ordering::Acquire)
    }

    /// Stores an opaque word with the CQ (for layers that wrap it, such as the C shim).
    pub fn set_user_data(&self, v: usize) {
        self.0.user_data.store(v, Ordering::Release);
    }

    /// Whether two handles name the same CQ.
    pub fn same(&self, other: &Cq) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
mod test {
    use std::collections::HashSet;

    use super::granted_cqe;

    /// The arm / produce / poll protocol of [`super::CqInner::push`] and `Cq::req_notify`,
    /// modelled step by step (each step one access, or one critical section of `st`) with the
    /// stores this machine (x86, total store order) may delay: a producer's publication and the
    /// arming's store sit in a store buffer until drained (at any step, by a fence, or for
    /// everyone by the first arming's process-wide barrier). Every interleaving of an
    /// application thread with two producers is explored: the application polled nothing,
    /// arms the CQ, polls once more and sleeps if that found nothing. It must never sleep
    /// without an event to wake it, and no arming may fire twice. (Every state reached is
    /// explored once: interleavings that meet in one state go on alike.)
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    struct Model {
        /// Completions published (visibly) and not polled, positions claimed so far (what
        /// `pushed` counts), completions polled, the `pushed` when the last event fired.
        ring: u32,
        pushed: u32,
        polled: u32,
        announced: u32,
        /// Producers' claims (a plain store by the tail's bias owner) and publications still
        /// in their store buffers (which drain in order).
        claims: [bool; 2],
        publications: [bool; 2],
        /// `armed` and its `EVENTED` mark as others see them, `st.notify` and `st.evented`
        /// (under the lock), whether the arming issues the barrier (else a fence).
        armed: bool,
        marked: bool,
        notify: bool,
        evented: bool,
        barrier: bool,
        events: u32,
        /// Producers' program counters and what each read of `armed`.
        pc: [u8; 2],
        saw: [bool; 2],
        /// The application's program counter and whether its poll found a completion.
        app: u8,
        got: bool,
    }

    fn fire(m: &mut Model) {
        m.notify = false;
        m.armed = false;
        m.announced = m.pushed;
        m.events += 1;
    }

    /// The oldest store in producer `p`'s buffer leaves it.
    fn drain_one(m: &mut Model, p: usize) {
        if m.claims[p] {
            m.claims[p] = false;
            m.pushed += 1;
        } else if m.publications[p] {
            m.publications[p] = false;
            m.ring += 1;
        }
    }

    /// Producer `p`'s buffer empties (a fence, a locked instruction, the barrier).
    fn drain(m: &mut Model, p: usize) {
        drain_one(m, p);
        drain_one(m, p);
    }

    /// Every next state: one step of one thread, or one store leaving a buffer.
    /// `first_barrier`: whether the first arming issues the process-wide barrier (the
    /// protocol) or only a fence (a broken variant the model must catch).
    fn steps(m: Model, announce_waiting: bool, first_barrier: bool) -> Vec<Model> {
        let mut out = Vec::new();
        for p in 0..2 {
            if m.claims[p] || m.publications[p] {
                let mut n = m;
                drain_one(&mut n, p);
                out.push(n);
            }
            let mut n = m;
            match m.pc[p] {
                0 => n.claims[p] = true,       // claim a position (the ring's tail)
                1 => n.publications[p] = true, // publish it (a release store)
                2 => {
                    // Compiler fence, load `armed`; a mark sends the producer to its fence.
                    n.saw[p] = m.armed;
                    n.pc[p] = if m.marked { 3 } else { 4 };
                    out.push(n);
                    continue;
                }
                3 => {
                    drain(&mut n, p); // the fence
                    n.saw[p] = m.armed;
                }
                // With `armed` seen: lock st (not while the application holds it), fire if
                // still armed.
                4 if m.saw[p] && (m.app == 1 || m.app == 2) => continue,
                4 => {
                    if m.saw[p] {
                        drain(&mut n, p); // the lock's compare-and-swap
                        if n.notify {
                            fire(&mut n);
                        }
                    }
                }
                _ => continue,
            }
            n.pc[p] += 1;
            out.push(n);
        }
        let mut n = m;
        match m.app {
            // req_notify: lock st, arm (the store to `armed`, and the mark, buffered).
            0 => {
                n.notify = true;
                n.evented = true;
                n.barrier = !m.evented && first_barrier;
            }
            // The fence, or the first arming's barrier (every thread's buffer drained).
            1 => {
                if m.barrier {
                    drain(&mut n, 0);
                    drain(&mut n, 1);
                }
                n.armed = n.notify;
                n.marked = true;
            }
            2 => {
                // `holds_unannounced` (the ring's length counts claimed positions), unlock.
                if announce_waiting && m.pushed > m.polled && m.pushed > m.announced {
                    fire(&mut n);
                }
            }
            // The poll after arming.
            3 => {
                if m.ring > 0 {
                    n.ring -= 1;
                    n.polled += 1;
                    n.got = true;
                }
            }
            _ => return out,
        }
        n.app += 1;
        out.push(n);
        out
    }

    /// Explores every interleaving from `m` (`seen`: the states reached so far); the first end
    /// that broke a rule.
    fn explore(
        m: Model,
        announce_waiting: bool,
        first_barrier: bool,
        seen: &mut HashSet<Model>,
    ) -> Option<String> {
        if !seen.insert(m) {
            return None;
        }
        let next = steps(m, announce_waiting, first_barrier);
        if next.is_empty() {
            if !m.got && m.events == 0 {
                return Some(format!("the application sleeps with no event: {m:?}"));
            }
            if m.events > 1 {
                return Some(format!("one arming fired twice: {m:?}"));
            }
            return None;
        }
        next.into_iter().find_map(|n| explore(n, announce_waiting, first_barrier, seen))
    }

    #[test]
    fn test_no_interleaving_of_arming_and_producers_loses_a_wake_up() {
        for announce_waiting in [true, false] {
            // The CQ's first arming, and a later one (producers see the mark).
            for marked in [false, true] {
                let start = Model { marked, evented: marked, ..Model::default() };
                let mut seen = HashSet::new();
                if let Some(broken) = explore(start, announce_waiting, true, &mut seen) {
                    panic!("{broken}");
                }
                assert!(seen.len() > 400, "{} states", seen.len());
            }
        }
    }

    /// The model has teeth: a first arming that only fences (producers that saw no mark do
    /// not fence) can lose a wake-up.
    #[test]
    fn test_the_model_catches_a_first_arming_without_the_barrier() {
        let broken = explore(Model::default(), false, false, &mut HashSet::new());
        assert!(broken.is_some_and(|b| b.contains("sleeps with no event")));
    }

    #[test]
    fn test_cqe_rounds_like_rxe() {
        assert_eq!(granted_cqe(1), 1);
        assert_eq!(granted_cqe(2), 3);
        assert_eq!(granted_cqe(10), 15);
        assert_eq!(granted_cqe(15), 15);
        assert_eq!(granted_cqe(16), 31);
        assert_eq!(granted_cqe(32767), 32767);
    }
}

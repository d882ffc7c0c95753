//! A device context (`struct ibv_context`) and its asynchronous event queue.

use std::{
    any::Any,
    os::fd::{AsRawFd, RawFd},
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, Ordering},
    },
};

use super::{
    channel::{ChannelInner, CompChannel},
    cq::{Cq, CqOptions},
    device::{Device, DeviceInner, ResourceCounts},
    dm::Dm,
    event::EventQueue,
    pd::{Pd, PdInner},
};
use crate::{
    error::{Errno, Error, Result},
    fabric::FabricInner,
    profile::{DeviceAttr, PortAttr},
    types::EventType,
};

/// An async event as its queue keeps it: its object by weak reference, so that an unread event
/// keeps neither the object alive nor, through it, the context whose queue holds the event (a
/// cycle that leaked the whole graph of a program that just dropped its handles). An event
/// whose object is gone when it is read is dropped, as destroying an object drops its events.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) event_type: EventType,
    pub(crate) about: About,
}

/// The object of a queued event. A QP is held as any object (the QP is a layer above these),
/// and read back as one where events are handed out (`crate::events`).
#[derive(Debug)]
pub(crate) enum About {
    Qp(Weak<dyn Any + Send + Sync>),
    Cq(Weak<super::cq::CqInner>),
    Srq(Weak<super::srq::SrqInner>),
    Wq(Weak<super::wq::WqInner>),
    Port(u8),
    Device,
}

impl About {
    /// The address of the object (null for a port or the device).
    fn object(&self) -> *const () {
        match self {
            About::Qp(q) => q.as_ptr().cast(),
            About::Cq(c) => c.as_ptr().cast(),
            About::Srq(s) => s.as_ptr().cast(),
            About::Wq(w) => w.as_ptr().cast(),
            About::Port(_) | About::Device => std::ptr::null(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct ContextInner {
    pub(crate) device: Arc<DeviceInner>,
    pub(crate) fabric: Arc<FabricInner>,
    pub(crate) async_q: EventQueue<Queued>,
    /// Set by [`Context::close`]: events handed out can no longer be acknowledged.
    closed: AtomicBool,
}

impl ContextInner {
    /// Waits until every event `count` reported was acknowledged, as a destroy must, unless
    /// the context was closed: its event descriptors are gone with it.
    pub(crate) fn wait_acked(&self, count: &super::event::EventCount) {
        count.wait_all_acked(|| self.closed.load(Ordering::Acquire));
    }

    /// Queues an async event.
    pub(crate) fn raise(&self, event_type: EventType, about: About) {
        self.async_q.push(Queued { event_type, about });
    }

    /// Drops the unread events about the object at `object` (being destroyed: the kernel does
    /// the same). By address: upgrading the events' objects here could drop one's last
    /// reference, and its destroy would come back to this queue.
    pub(crate) fn discard_events<T>(&self, object: *const T) {
        self.async_q.remove_if(|ev| ev.about.object() == object.cast());
    }
}

/// An open device (`struct ibv_context`). Cheap to clone; all clones are the same context.
#[derive(Clone, Debug)]
pub struct Context(pub(crate) Arc<ContextInner>);

impl Context {
    pub(crate) fn open(dev: &Device) -> Result<Context> {
        // An open context is a member of its host fabric (if configured), so that events
        // raised from other processes reach it before it creates any QP. A failure to join
        // is reported by the first QP, which cannot work without it.
        let _ = dev.fabric.joined();
        let c = Arc::new(ContextInner {
            device: dev.inner.clone(),
            fabric: dev.fabric.clone(),
            async_q: EventQueue::new()?,
            closed: AtomicBool::new(false),
        });
        // Closed contexts leave dead entries: dropped when the list is full, so that it does
        // not grow with every open, nor does each open look at every context (the CM opens
        // one for each id).
        let mut contexts = dev.inner.contexts.lock();
        if contexts.len() == contexts.capacity() {
            contexts.retain(|w| w.strong_count() > 0);
        }
        contexts.push(Arc::downgrade(&c));
        drop(contexts);
        Ok(Context(c))
    }

    /// The device this context was opened on.
    pub fn device(&self) -> Device {
        Device { inner: self.0.device.clone(), fabric: self.0.fabric.clone() }
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.0.device.attr.clone()
    }

    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.device().query_port(port)
    }

    /// `ibv_resolve_eth_l2_from_gid`: the MAC address `attr`'s destination GID resolves to
    /// from port `port` (see [`AhAttr`](crate::AhAttr)); `EINVAL` on an InfiniBand port, for
    /// an `sgid_index` with no GID or GIDs of different IP families, `EHOSTUNREACH` when no
    /// port on the fabric has the GID.
    pub fn resolve_eth_l2(&self, port: u8, attr: &crate::AhAttr) -> Result<[u8; 6]> {
        let p = self.0.device.port(port)?;
        super::ah::resolve_eth_l2(&self.0.fabric, p, attr)
    }

    /// `ibv_open_xrcd`; see [`Xrcd`](crate::Xrcd) for how `file` and `oflags` decide between
    /// a new domain and a shared one.
    pub fn open_xrcd(
        &self,
        file: Option<super::xrcd::FileId>,
        oflags: i32,
    ) -> Result<super::xrcd::Xrcd> {
        super::xrcd::Xrcd::open(self, file, oflags)
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let dev = &self.0.device;
        ResourceCounts::take(&dev.counts.pd, dev.attr.max_pd, "too many protection domains")?;
        Ok(Pd(Arc::new(PdInner { ctx: self.0.clone(), life: Default::default() })))
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel(Arc::new(ChannelInner {
            ctx: self.0.clone(),
            queue: EventQueue::new()?,
            life: Default::default(),
        })))
    }

    /// `ibv_create_cq`: a CQ of at least `cqe` entries (the granted size is `Cq::cqe`).
    pub fn create_cq(
        &self,
        cqe: i32,
        channel: Option<&CompChannel>,
        comp_vector: u32,
    ) -> Result<Cq> {
        Cq::create(self, cqe, channel, comp_vector, CqOptions::default())
    }

    /// `ibv_create_cq_ex`: [`Context::create_cq`] with `options`.
    pub fn create_cq_ex(
        &self,
        cqe: i32,
        channel: Option<&CompChannel>,
        comp_vector: u32,
        options: CqOptions,
    ) -> Result<Cq> {
        Cq::create(self, cqe, channel, comp_vector, options)
    }

    /// `ibv_alloc_dm`: `length` bytes of device memory, aligned to `2^log_align_req`.
    /// `EOPNOTSUPP` on a device without device memory (rxe); `EINVAL` for 0 bytes, more than
    /// `max_dm_size`, or an alignment above a page; `ENOMEM` once the device's memory is
    /// taken.
    pub fn alloc_dm(&self, length: u64, log_align_req: u32) -> Result<Dm> {
        Dm::alloc(self, length, log_align_req)
    }

    /// `ibv_create_rwq_ind_table`: an RSS indirection table over `wqs`, which must hold
    /// exactly `2^log_size` WQs (see [`RwqIndTable`](crate::RwqIndTable)).
    pub fn create_rwq_ind_table(
        &self,
        log_size: u32,
        wqs: &[&super::wq::Wq],
    ) -> Result<super::wq::RwqIndTable> {
        super::wq::RwqIndTable::create(self, log_size, wqs)
    }

    /// The device clock now (`ibv_query_rt_values_ex` with `IBV_VALUES_MASK_RAW_CLOCK`), in
    /// the units of [`Wc::timestamp`](crate::Wc::timestamp); `EOPNOTSUPP` on a device
    /// without a clock (rxe).
    pub fn read_clock(&self) -> Result<u64> {
        if !self.0.device.attr.has_clock() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no clock"));
        }
        Ok(self.0.fabric.now())
    }

    /// A device clock reading as wall-clock nanoseconds since the Unix epoch
    /// (`ibv_wc_read_completion_wallclock_ns`).
    pub fn clock_to_wallclock_ns(&self, clock: u64) -> u64 {
        self.0.fabric.timer.wall_epoch_ns() + clock
    }

    /// Sets or clears `O_NONBLOCK` on the async event fd (same as fcntl on `async_fd`).
    pub fn set_async_nonblocking(&self, on: bool) -> Result<()> {
        self.0.async_q.set_nonblocking(on)
    }

    /// The first step of `ibv_close_device`: from now on, destroying an object of this
    /// context does not wait for its events to be acknowledged (no one can acknowledge them
    /// once the context's event descriptors are closed), and the unread async events go (they
    /// hold the objects they are about). The caller then destroys every object the context
    /// owns, as the kernel does when a context's command file is closed; the C library does
    /// exactly that.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.async_q.remove_if(|_| true);
    }

    /// Whether two handles name the same context.
    pub fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl AsRawFd for Context {
    /// The async event fd (`ibv_context.async_fd`).
    fn as_raw_fd(&self) -> RawFd {
        self.0.async_q.as_raw_fd()
    }
}

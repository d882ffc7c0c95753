//! Completion channels (`struct ibv_comp_channel`): an eventfd that becomes readable when an
//! armed CQ gets a completion.

use std::{
    os::fd::{AsRawFd, RawFd},
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use super::{Lifecycle, context::ContextInner, cq::Cq, cq::CqInner, event::EventQueue};
use crate::{error::Result, fabric::FabricInner};

/// How long a blocking [`CompChannel::get_cq_event`] looks for its event before it sleeps:
/// about what a wake-up through the kernel costs (an eventfd round trip between two threads
/// takes ~50 us on this class of machine), so looking never costs more than twice the best.
const LOOK: Duration = Duration::from_micros(50);

/// Watches `ready` for up to [`LOOK`] (or until `deadline`, if sooner), moving inbound packets
/// meanwhile as a thread that polls its CQ does: a peer that answers within that time costs no
/// wake-up at all, neither of this thread nor of the host fabric's reader, and a requester
/// whose peer's reader lags carries its WRITEs out itself. If `ready` is still false, the
/// reader is told this thread will sleep (it may be napping on the strength of these looks).
pub(crate) fn look_before_sleeping(
    fabric: &FabricInner,
    ready: impl Fn() -> bool,
    deadline: Option<Instant>,
) {
    let t0 = Instant::now();
    let end = deadline.map_or(t0 + LOOK, |d| d.min(t0 + LOOK));
    while !ready() && Instant::now() < end {
        if !fabric.progress() {
            std::hint::spin_loop();
        }
    }
    if !ready() {
        fabric.attend();
    }
}

/// The CQ of an event taken from a channel, counted as reported (under the channel's lock:
/// see [`EventQueue::pop_with`]); `None` if the CQ is gone.
fn reported(cq: Weak<CqInner>) -> Option<Arc<CqInner>> {
    let cq = cq.upgrade()?;
    cq.comp_events.reported();
    Some(cq)
}

#[derive(Debug)]
pub(crate) struct ChannelInner {
    pub(crate) ctx: Arc<ContextInner>,
    /// The CQs whose events wait, by weak reference: an unread event must not keep its CQ
    /// alive, nor through it this channel (a cycle). A CQ gone by the time its event is read
    /// has its event dropped, as destroying the CQ drops it.
    pub(crate) queue: EventQueue<Weak<CqInner>>,
    /// Dependents: CQs attached to the channel.
    pub(crate) life: Lifecycle,
}

/// A completion channel. Its file descriptor works with poll/epoll/select; setting
/// `O_NONBLOCK` on it (fcntl, or [`CompChannel::set_nonblocking`]) makes
/// [`CompChannel::get_cq_event`] fail with `EAGAIN` instead of blocking.
#[derive(Clone, Debug)]
pub struct CompChannel(pub(crate) Arc<ChannelInner>);

impl CompChannel {
    /// `ibv_get_cq_event`: waits for the next CQ event and returns the CQ. Each event must be
    /// acknowledged with [`Cq::ack_events`] before the CQ can be destroyed. A signal that
    /// interrupts the wait ends it with `EINTR` (unless its handler has `SA_RESTART`).
    pub fn get_cq_event(&self) -> Result<Cq> {
        let queue = &self.0.queue;
        if !queue.ready() && !queue.is_nonblocking() {
            self.look_before_sleeping();
        }
        queue.pop_with(reported).map(Cq)
    }

    /// The next CQ event if one is queued, without blocking, and without a system call if none
    /// is: for the library's own channels, which it made non-blocking.
    pub(crate) fn queued_cq_event(&self) -> Option<Cq> {
        self.0.queue.try_pop_with(reported).map(Cq)
    }

    /// Whether an event is queued (a look without a system call).
    pub(crate) fn ready(&self) -> bool {
        self.0.queue.ready()
    }

    fn look_before_sleeping(&self) {
        look_before_sleeping(&self.0.ctx.fabric, || self.ready(), None);
    }

    /// Sets or clears `O_NONBLOCK` on the channel's fd.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.0.queue.set_nonblocking(on)
    }

    /// `ibv_destroy_comp_channel`: fails with `EBUSY` while CQs are attached.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.destroy()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.0.queue.as_raw_fd()
    }
}

#[cfg(test)]
mod test {
    use std::{sync::mpsc, time::Duration};

    use super::*;
    use crate::{Fabric, FabricConfig, objects::event::test as hold};

    /// An event read by one thread while another destroys its CQ: it is counted as it is
    /// taken, so the destroy waits for its ack (as the kernel's, whose read of an event and
    /// its count are one step) and the reader gets a CQ that is still there. Counted after
    /// it was taken, the destroy went ahead and the reader got the CQ freed.
    #[test]
    fn an_event_read_as_its_cq_is_destroyed_holds_the_destroy_until_its_ack() {
        let f = Fabric::new(FabricConfig::default());
        let ctx = f.devices()[0].open().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(16, Some(&ch), 0).unwrap();
        // The event an armed CQ's next completion raises.
        ch.0.queue.push(Arc::downgrade(&cq.0));
        let held = hold::HOLD_AFTER_POP.write();
        let reader = {
            let ch = ch.clone();
            std::thread::spawn(move || {
                hold::PAUSE_AFTER_POP.set(true);
                ch.get_cq_event()
            })
        };
        while ch.ready() {
            std::thread::yield_now();
        }
        let (done, destroyed) = mpsc::channel();
        let destroyer = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let r = cq.destroy();
                done.send(()).unwrap();
                r
            })
        };
        // (Bounded: a destroy that wrongly goes ahead is seen; one that rightly waits, never
        // mistaken.)
        let early = destroyed.recv_timeout(Duration::from_millis(200));
        assert!(early.is_err(), "the destroy waits for the ack of the event read");
        drop(held);
        let got = reader.join().unwrap().unwrap();
        assert!(got.same(&cq));
        got.ack_events(1);
        destroyer.join().unwrap().unwrap();
    }
}

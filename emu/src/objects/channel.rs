//! Completion channels (`struct ibv_comp_channel`): an eventfd that becomes readable when an
//! armed CQ gets a completion.

use std::{
    os::fd::{AsRawFd, RawFd},
    sync::Arc,
};

use super::{Lifecycle, context::ContextInner, cq::Cq, cq::CqInner, event::EventQueue};
use crate::error::Result;

#[derive(Debug)]
pub(crate) struct ChannelInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) queue: EventQueue<Arc<CqInner>>,
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
        let cq = self.0.queue.pop()?;
        cq.comp_events.reported();
        Ok(Cq(cq))
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

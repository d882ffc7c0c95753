//! Asynchronous events as the application reads them (`struct ibv_async_event`): what one is
//! about, a QP among the rest, and the context's verbs that hand them out and take their
//! acknowledgements. The queue they wait in is the context's (`objects::context`), which keeps
//! each event's object by weak reference; here, above the QP, that reference becomes the
//! object the application knows.

use std::sync::Arc;

use crate::{
    error::Result,
    objects::{
        context::{About, Context},
        cq::Cq,
        srq::Srq,
        wq::Wq,
    },
    qp::{Qp, QpShared},
    types::EventType,
};

/// What an asynchronous event is about (`ibv_async_event.element`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EventElement {
    Qp(Qp),
    Cq(Cq),
    Srq(Srq),
    Wq(Wq),
    /// A port number.
    Port(u8),
    Device,
}

/// An asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone)]
pub struct AsyncEvent {
    pub event_type: EventType,
    pub element: EventElement,
}

impl EventElement {
    /// The element as the queue keeps it.
    fn about(&self) -> About {
        match self {
            EventElement::Qp(q) => About::Qp(Arc::downgrade(&q.0) as _),
            EventElement::Cq(c) => About::Cq(Arc::downgrade(&c.0)),
            EventElement::Srq(s) => About::Srq(Arc::downgrade(&s.0)),
            EventElement::Wq(w) => About::Wq(Arc::downgrade(&w.0)),
            EventElement::Port(p) => About::Port(*p),
            EventElement::Device => About::Device,
        }
    }

    /// The object `about` names, if it is still there.
    fn of(about: &About) -> Option<EventElement> {
        Some(match about {
            About::Qp(q) => EventElement::Qp(Qp::new(q.upgrade()?.downcast::<QpShared>().ok()?)),
            About::Cq(c) => EventElement::Cq(Cq(c.upgrade()?)),
            About::Srq(s) => EventElement::Srq(Srq(s.upgrade()?)),
            About::Wq(w) => EventElement::Wq(Wq(w.upgrade()?)),
            About::Port(p) => EventElement::Port(*p),
            About::Device => EventElement::Device,
        })
    }
}

impl Context {
    /// `ibv_get_async_event`: blocks until an event arrives unless the async fd was made
    /// non-blocking (then fails with `EAGAIN` when none is pending); `EINTR` when a signal
    /// interrupts the wait (unless its handler has `SA_RESTART`).
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        // Counted as handed out, under the queue's lock (see `EventQueue::pop_with`): the
        // object's destroy waits for this event's ack.
        self.0.async_q.pop_with(|q| {
            let element = EventElement::of(&q.about)?;
            match &element {
                EventElement::Qp(qp) => qp.0.async_events.reported(),
                EventElement::Cq(cq) => cq.0.async_events.reported(),
                EventElement::Srq(s) => s.0.async_events.reported(),
                EventElement::Wq(w) => w.0.async_events.reported(),
                EventElement::Port(_) | EventElement::Device => {}
            }
            Some(AsyncEvent { event_type: q.event_type, element })
        })
    }

    /// `ibv_ack_async_event`.
    pub fn ack_async_event(&self, ev: &AsyncEvent) {
        match &ev.element {
            EventElement::Qp(qp) => qp.0.async_events.ack(1),
            EventElement::Cq(cq) => cq.0.async_events.ack(1),
            EventElement::Srq(s) => s.0.async_events.ack(1),
            EventElement::Wq(w) => w.0.async_events.ack(1),
            EventElement::Port(_) | EventElement::Device => {}
        }
    }

    /// Raises a port or device event as the hardware would (for testing handlers).
    pub fn inject_event(&self, event_type: EventType, element: EventElement) {
        self.0.raise(event_type, element.about());
    }
}

//! Event plumbing shared by completion channels and async-event queues.

use std::{
    collections::VecDeque,
    io,
    os::fd::{AsRawFd, RawFd},
    sync::atomic::{AtomicUsize, Ordering},
};

use parking_lot::{Condvar, Mutex};

use crate::{
    error::{Errno, Error, Result},
    sys::EventFd,
};

/// A queue of events whose readiness is an eventfd: the fd is readable exactly while the queue
/// holds an event (modulo events removed by a destroy, which make one wake-up spurious).
#[derive(Debug)]
pub(crate) struct EventQueue<T> {
    fd: EventFd,
    q: Mutex<VecDeque<T>>,
    /// Number of queued events, readable without the lock (for looking before blocking).
    pending: AtomicUsize,
}

impl<T> EventQueue<T> {
    pub(crate) fn new() -> Result<EventQueue<T>> {
        let fd = EventFd::new().map_err(|e| io_error(&e))?;
        Ok(EventQueue { fd, q: Mutex::new(VecDeque::new()), pending: AtomicUsize::new(0) })
    }

    pub(crate) fn push(&self, ev: T) {
        self.q.lock().push_back(ev);
        self.pending.fetch_add(1, Ordering::Release);
        self.fd.post();
    }

    /// Whether an event is queued (a look that takes no lock and no system call).
    pub(crate) fn ready(&self) -> bool {
        self.pending.load(Ordering::Acquire) != 0
    }

    /// Whether [`EventQueue::pop`] would fail with `EAGAIN` rather than block.
    pub(crate) fn is_nonblocking(&self) -> bool {
        self.fd.is_nonblocking()
    }

    /// Takes the oldest event; blocks unless the fd was made non-blocking (then `EAGAIN`).
    pub(crate) fn pop(&self) -> Result<T> {
        loop {
            self.fd.wait().map_err(|e| io_error(&e))?;
            if let Some(ev) = self.q.lock().pop_front() {
                self.pending.fetch_sub(1, Ordering::Release);
                return Ok(ev);
            }
            // The count belonged to an event that a destroy removed: wait for the next one.
        }
    }

    /// Takes the oldest event if one is queued; `None`, without a system call, if none is. For
    /// the library's own readers of a queue whose descriptor they made non-blocking (one that
    /// looks each time its socket is used must not pay a `read` for nothing).
    pub(crate) fn try_pop(&self) -> Option<T> {
        if !self.ready() {
            return None;
        }
        self.pop().ok()
    }

    /// Takes out every queued event for which `pred` holds (dropped by the caller, after the
    /// queue's lock is released).
    pub(crate) fn remove_if(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut q = self.q.lock();
        let mut taken = Vec::new();
        for e in std::mem::take(&mut *q) {
            if pred(&e) { taken.push(e) } else { q.push_back(e) }
        }
        self.pending.fetch_sub(taken.len(), Ordering::Release);
        taken
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.fd.set_nonblocking(on).map_err(|e| io_error(&e))
    }
}

impl<T> AsRawFd for EventQueue<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn io_error(e: &io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Error::new(Errno::EAGAIN, "no event is pending"),
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            Error::new(Errno(libc::EMFILE), "out of file descriptors")
        }
        Some(n) => Error::new(Errno(n), "event file descriptor failed"),
        None => Error::new(Errno::EIO, "event file descriptor failed"),
    }
}

/// Counts events handed to the application and the acknowledgements it gave back, so that a
/// destroy can wait until every reported event was acknowledged (man ibv_get_cq_event,
/// ibv_get_async_event).
#[derive(Debug, Default)]
pub(crate) struct EventCount {
    counts: Mutex<(u64, u64)>,
    acked: Condvar,
}

impl EventCount {
    pub(crate) fn reported(&self) {
        self.counts.lock().0 += 1;
    }

    pub(crate) fn ack(&self, n: u64) {
        let mut c = self.counts.lock();
        c.1 = (c.1 + n).min(c.0);
        if c.1 == c.0 {
            self.acked.notify_all();
        }
    }

    /// Blocks until every reported event has been acknowledged, unless `give_up` holds.
    pub(crate) fn wait_all_acked(&self, give_up: impl Fn() -> bool) {
        let mut c = self.counts.lock();
        while c.1 < c.0 && !give_up() {
            self.acked.wait(&mut c);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// `try_pop` reads the descriptor only for an event queued: on an empty queue whose
    /// descriptor blocks it returns at once (a read there would block for ever), and an event
    /// it takes leaves the descriptor unreadable (its count taken with it).
    #[test]
    fn try_pop_reads_the_descriptor_only_for_a_queued_event() {
        let q = EventQueue::<u32>::new().unwrap();
        assert!(!q.is_nonblocking());
        assert_eq!(q.try_pop(), None);
        q.push(7);
        q.push(8);
        assert_eq!(q.try_pop(), Some(7));
        assert!(crate::sys::wait_readable(q.as_raw_fd(), Some(Duration::ZERO)).unwrap());
        assert_eq!(q.try_pop(), Some(8));
        assert!(!crate::sys::wait_readable(q.as_raw_fd(), Some(Duration::ZERO)).unwrap());
        assert_eq!(q.try_pop(), None);
    }
}

//! Event plumbing shared by completion channels and async-event queues.

use std::{
    collections::VecDeque,
    io,
    os::fd::{AsRawFd, RawFd},
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::sync::{Condvar, Mutex};

use crate::{
    error::{Errno, Error, Result},
    sys::EventFd,
};

/// A queue of events whose readiness is an eventfd: the fd is readable exactly while the queue
/// holds an event, as the kernel's channels poll (events a destroy removes take their counts
/// with them; a reader that took one first finds its event gone and waits for the next).
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
        self.pop_with(Some)
    }

    /// Takes the oldest event and hands it to `take` under the queue's lock: what `take`
    /// records of it (the count its object's destroy waits on) is done before a destroy's
    /// [`remove_if`](Self::remove_if) can look, so an event is either removed by the destroy
    /// or counted before it, as the kernel's read of an event and its count are one step.
    /// (Taken out first and counted after, an event read while its CQ was destroyed was
    /// handed out with the CQ freed: gloo's event thread used a freed pair.) `take` gives
    /// `None` for an event whose object is gone: then the next event is waited for. Blocks
    /// unless the fd was made non-blocking (then `EAGAIN`).
    pub(crate) fn pop_with<R>(&self, mut take: impl FnMut(T) -> Option<R>) -> Result<R> {
        loop {
            self.fd.wait().map_err(|e| io_error(&e))?;
            let taken = self.q.lock().pop_front().and_then(|ev| {
                self.pending.fetch_sub(1, Ordering::Release);
                take(ev)
            });
            if let Some(r) = taken {
                #[cfg(test)]
                test::pause_after_pop();
                return Ok(r);
            }
            // The count belonged to an event that a destroy removed, or to an object gone:
            // wait for the next one.
        }
    }

    /// Takes the oldest event if one is queued; `None`, without a system call, if none is. For
    /// the library's own readers of a queue whose descriptor they made non-blocking (one that
    /// looks each time its socket is used must not pay a `read` for nothing).
    pub(crate) fn try_pop(&self) -> Option<T> {
        self.try_pop_with(Some)
    }

    /// [`try_pop`](Self::try_pop) through `take`, as [`pop_with`](Self::pop_with).
    pub(crate) fn try_pop_with<R>(&self, take: impl FnMut(T) -> Option<R>) -> Option<R> {
        if !self.ready() {
            return None;
        }
        self.pop_with(take).ok()
    }

    /// Takes out every queued event for which `pred` holds (dropped by the caller, after the
    /// queue's lock is released), and their counts on the fd: a program that polls the fd
    /// must not see it readable for an event gone, then block in a read that finds none
    /// (the kernel's channels drop a destroyed object's events from their list). A count a
    /// reader already took, not yet here for its event, is not there to take: that reader
    /// finds the queue short of it and waits again.
    pub(crate) fn remove_if(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut q = self.q.lock();
        let mut taken = Vec::new();
        for e in std::mem::take(&mut *q) {
            if pred(&e) { taken.push(e) } else { q.push_back(e) }
        }
        self.pending.fetch_sub(taken.len(), Ordering::Release);
        for _ in 0..taken.len() {
            if !self.fd.try_take() {
                break;
            }
        }
        taken
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.fd.set_nonblocking(on).map_err(|e| io_error(&e))
    }

    /// A second descriptor of the queue's eventfd.
    pub(crate) fn duplicate_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.fd.duplicate()
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
            c = self.acked.wait(c);
        }
    }
}

#[cfg(test)]
pub(crate) mod test {
    use std::{cell::Cell, time::Duration};

    use super::*;

    /// Held (written) by a test, this keeps a thread that set [`PAUSE_AFTER_POP`] waiting
    /// just after it took an event: an event read while another thread destroys its object.
    pub(crate) static HOLD_AFTER_POP: crate::sync::RwLock<()> = crate::sync::RwLock::new(());

    thread_local! {
        pub(crate) static PAUSE_AFTER_POP: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) fn pause_after_pop() {
        if PAUSE_AFTER_POP.get() {
            drop(HOLD_AFTER_POP.read());
        }
    }

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

    /// Events a destroy removes take their counts: the descriptor is readable only while an
    /// event is left (it read readable, and a blocking read then waited for ever), and a
    /// reader that took a count before the removal waits for the next event.
    #[test]
    fn removed_events_leave_the_descriptor_readable_only_for_those_left() {
        let readable = |q: &EventQueue<u32>| {
            crate::sys::wait_readable(q.as_raw_fd(), Some(Duration::ZERO)).unwrap()
        };
        let q = EventQueue::<u32>::new().unwrap();
        for ev in [1, 2, 3] {
            q.push(ev);
        }
        assert_eq!(q.remove_if(|&ev| ev != 2), [1, 3]);
        assert!(readable(&q));
        assert_eq!(q.pop().unwrap(), 2);
        assert!(!readable(&q), "no count left for the events removed");

        // A reader holding the count of an event removed meanwhile waits for the next one.
        q.push(4);
        q.fd.wait().unwrap();
        assert_eq!(q.remove_if(|_| true), [4]);
        assert!(!readable(&q));
        std::thread::scope(|s| {
            let reader = s.spawn(|| q.pop().unwrap());
            std::thread::sleep(Duration::from_millis(20));
            q.push(5);
            assert_eq!(reader.join().unwrap(), 5);
        });
        assert!(!readable(&q));
    }
}

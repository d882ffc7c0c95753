//! `rpoll`: waiting on rsockets and ordinary descriptors together.

use std::{
    os::fd::RawFd,
    time::{Duration, Instant},
};

use super::RSocket;
use crate::{
    error::{Errno, Error, Result},
    sys,
};

/// What one entry of a poll watches.
#[derive(Debug, Clone)]
pub enum PollTarget {
    Socket(RSocket),
    /// An ordinary descriptor, polled as poll(2) would (negative: ignored).
    Fd(RawFd),
}

/// One entry of [`poll`] (`struct pollfd`).
#[derive(Debug, Clone)]
pub struct PollEntry {
    pub target: PollTarget,
    pub events: i16,
    pub revents: i16,
}

/// `rpoll`: waits until an entry has one of its events (or `POLLERR`, `POLLHUP`,
/// `POLLNVAL`), at most `timeout` (`None`: no limit); the number of entries with events.
/// `EINTR` when a signal interrupts the wait, as poll(2).
pub fn poll(entries: &mut [PollEntry], timeout: Option<Duration>) -> Result<usize> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let mut ready = 0;
        for e in entries.iter_mut() {
            e.revents = 0;
            if let PollTarget::Socket(s) = &e.target {
                e.revents = s.poll_events(e.events);
                ready += usize::from(e.revents != 0);
            }
        }
        // Ordinary descriptors first, then what the sockets wake on.
        let mut fds: Vec<libc::pollfd> = entries
            .iter()
            .filter_map(|e| match e.target {
                PollTarget::Fd(fd) => Some(libc::pollfd { fd, events: e.events, revents: 0 }),
                PollTarget::Socket(_) => None,
            })
            .collect();
        let ordinary = fds.len();
        let mut wait = Some(Duration::ZERO);
        if ready == 0 {
            for e in entries.iter_mut() {
                if let PollTarget::Socket(s) = &e.target {
                    let wake = s.arm();
                    // An event between the first look and the arming is not slept through.
                    e.revents = s.poll_events(e.events);
                    ready += usize::from(e.revents != 0);
                    fds.extend(wake.into_iter().map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                }
            }
            if ready == 0 {
                wait = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            }
        }
        // Only sockets to sleep on: their events are looked for first (ordinary descriptors
        // cannot be looked at without a system call each).
        let looked = wait != Some(Duration::ZERO) && ordinary == 0 && looked(entries, deadline);
        if !looked {
            // (Nothing to ask the kernel when only sockets are ready: no system call.)
            if !(fds.is_empty() && wait == Some(Duration::ZERO)) {
                sys::poll(&mut fds, wait).map_err(|e| {
                    Error::new(Errno(e.raw_os_error().unwrap_or(libc::EIO)), "poll failed")
                })?;
            }
            let mut woken = fds[..ordinary].iter();
            for e in entries.iter_mut() {
                if let PollTarget::Fd(_) = e.target {
                    e.revents = woken.next().expect("one per descriptor").revents;
                    ready += usize::from(e.revents != 0);
                }
            }
            if ready > 0 || wait == Some(Duration::ZERO) {
                return Ok(ready);
            }
        }
        for e in entries.iter() {
            if let PollTarget::Socket(s) = &e.target {
                s.drain();
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(0);
        }
    }
}

/// Looks for the events the sockets of `entries` (armed) wake on before sleeping, until
/// `deadline` at the latest (see `RSocket::look_before_sleeping`); whether one came.
fn looked(entries: &[PollEntry], deadline: Option<Instant>) -> bool {
    let sockets = || {
        entries.iter().filter_map(|e| match &e.target {
            PollTarget::Socket(s) => Some(s),
            PollTarget::Fd(_) => None,
        })
    };
    let Some(first) = sockets().next() else { return false };
    first.look_before_sleeping(|| sockets().any(RSocket::woken), deadline)
}

//! The operating-system pieces the objects need: an eventfd, the user id.
//!
//! Completion channels and the context's async-event queue are eventfds, so applications can
//! use them with poll/epoll/select and set `O_NONBLOCK` with fcntl, as with a kernel device.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An eventfd in semaphore mode: each `post` adds one, each successful `wait` takes one.
///
/// Semaphore mode makes the counter equal the number of queued events, so the descriptor is
/// readable exactly while an event is waiting. `wait` blocks or fails with `EAGAIN` according
/// to the descriptor's own `O_NONBLOCK` flag, which the application controls.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by eventfd and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Adds one to the counter (makes the descriptor readable).
    pub(crate) fn post(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to a descriptor we own.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // The counter cannot overflow in practice (2^64-2 pending events); a failure here would
        // only mean the fd was closed under us, which ownership rules out.
        debug_assert_eq!(n, 8);
    }

    /// Takes one from the counter; blocks unless the descriptor is non-blocking.
    pub(crate) fn wait(&self) -> io::Result<()> {
        let mut v: u64 = 0;
        loop {
            // SAFETY: reads 8 bytes into a live u64 from a descriptor we own.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            if n == 8 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Whether the descriptor currently has `O_NONBLOCK` set (by us or by the application).
    pub(crate) fn is_nonblocking(&self) -> bool {
        // SAFETY: F_GETFL on a descriptor we own takes no pointers.
        let fl = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
        fl >= 0 && fl & libc::O_NONBLOCK != 0
    }

    /// Sets or clears `O_NONBLOCK`, as an application would with fcntl.
    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own take no pointers.
        unsafe {
            let fl = libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL);
            if fl < 0 {
                return Err(io::Error::last_os_error());
            }
            let nfl = if on { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK };
            if libc::fcntl(self.fd.as_raw_fd(), libc::F_SETFL, nfl) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The real user id of this process (names its host fabric directory).
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid takes no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// Blocks until `fd` is readable (or reports an error or hang-up).
pub(crate) fn wait_readable(fd: RawFd) -> io::Result<()> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: one live pollfd, count 1, no timeout.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

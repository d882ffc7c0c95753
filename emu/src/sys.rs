//! The operating-system pieces the objects need: an eventfd, the user id, and what the host
//! fabric passes between processes (descriptors over Unix sockets, shared-memory files).
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

/// Blocks until `fd` is readable (or reports an error or hang-up), at most `timeout`
/// (`None`: no limit); whether it is.
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    // A nonzero timeout under a millisecond is one: poll(2) would not wait at all.
    let ms = timeout.map_or(-1, |t| {
        if t.is_zero() { 0 } else { t.as_millis().clamp(1, i32::MAX as u128) as i32 }
    });
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: one live pollfd, count 1.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether the process `pid` exists (it may be a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// An anonymous shared-memory file of `len` bytes (close-on-exec), for mapping by this
/// process and, once its descriptor is passed on, by another.
pub(crate) fn memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; the flags are valid.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is a live descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sends the datagram `data` with the descriptor `pass` attached (SCM_RIGHTS) on the
/// connected socket `sock`.
pub(crate) fn send_with_fd(sock: RawFd, data: &[u8], pass: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    let mut space = [0u64; 4];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    // SAFETY: the control buffer (32 bytes, 8-aligned) holds one cmsg with one descriptor
    // (CMSG_SPACE(4) = 24 bytes), so CMSG_FIRSTHDR is non-null and CMSG_DATA has 4 bytes.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), pass);
    }
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Receives one datagram into `buf` without blocking: its length and the descriptor that came
/// with it, if any (close-on-exec; any further ones are closed).
pub(crate) fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut space = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&space);
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut got = None;
    // SAFETY: the kernel filled `msg`'s control buffer; the CMSG_* walk stays within
    // msg_controllen, and each SCM_RIGHTS payload holds whole descriptors, now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    // The first is kept; dropping the others closes them.
                    got.get_or_insert(fd);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, got))
}

//! The operating-system pieces the objects need: an eventfd, the user id, and what the host
//! fabric passes between processes (descriptors over Unix sockets, shared-memory files).
//!
//! Completion channels and the context's async-event queue are eventfds, so applications can
//! use them with poll/epoll/select and set `O_NONBLOCK` with fcntl, as with a kernel device.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// How many forks stand between this process and the one the emulator was loaded in: a
/// child made by `fork` counts one more than its parent did at the fork.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// This process's generation: 0 in the process that loaded the emulator, one more in each
/// child made by `fork` (forks are counted from the first fabric made, or the first fork hook
/// registered, on: see `watch_forks`). A host-fabric node belongs to the generation that
/// joined: a child holds a copy of its parent's, which must not act for it (see
/// `fabric::host::Node::inherited`).
pub fn fork_generation() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// Descriptors a child made by `fork` lets go of: the host fabric's slot locks, which say
/// that their node lives while any process holds them. A child holding its parent's would
/// keep a dead parent alive to its peers (its connections never ended) as long as it lived.
/// Unused entries are -1.
static LET_GO_IN_CHILDREN: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];

/// Has every child made by `fork` from now on let go of `fd` (see [`LET_GO_IN_CHILDREN`]): it
/// finds `/dev/null` there instead, so that the number stays its own to close. Whether `fd`
/// could be listed (64 at most).
pub(crate) fn let_go_in_children(fd: RawFd) -> bool {
    watch_forks();
    let free = LET_GO_IN_CHILDREN
        .iter()
        .find(|e| e.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok());
    free.is_some()
}

/// Undoes [`let_go_in_children`] (before `fd` is closed: its number may then name another).
pub(crate) fn keep_in_children(fd: RawFd) {
    if let Some(e) = LET_GO_IN_CHILDREN.iter().find(|e| e.load(Ordering::Acquire) == fd) {
        e.store(-1, Ordering::Release);
    }
}

/// Starts counting forks (once per process).
pub(crate) fn watch_forks() {
    static WATCHING: std::sync::Once = std::sync::Once::new();
    WATCHING.call_once(|| {
        // SAFETY: registers plain functions that live as long as the process. In the child,
        // before any module's hook, `forked` adds to an atomic and replaces descriptors, all
        // async-signal-safe; the hooks then let go of what their prepare hooks held, as the
        // child's only thread.
        unsafe { libc::pthread_atfork(Some(prepare_fork), Some(forked_parent), Some(forked)) };
    });
}

/// What a module does around `fork`, in the thread that forks: `prepare` before it, then
/// `parent` or `child` after it, in the same thread of the parent or of the child.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForkHooks {
    pub(crate) prepare: fn(),
    pub(crate) parent: fn(),
    pub(crate) child: fn(),
}

/// When a module's [`ForkHooks`] run: prepared in this order, done in the reverse one. Fixed,
/// where `pthread_atfork` orders handlers by when each module first registered: a later stage
/// may hold what an earlier one waits for a thread of ours to let go of.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ForkStage {
    /// The listen service's thread, waited for until it sleeps: it takes the later stages'
    /// locks (an accept registers memory).
    ListenService,
    /// The listen service's slot, which the application's threads take as they listen, accept
    /// and close.
    ListenServiceSlot,
    /// The memory moved into shared files, copied for the child.
    SharedMem,
    /// The thread indexes' list: its holders wait for nothing.
    ThreadIndexes,
}

static FORK_HOOKS: [std::sync::OnceLock<ForkHooks>; 4] = [const { std::sync::OnceLock::new() }; 4];

/// Runs `hooks` around every `fork` from now on, at `stage` (once per stage: a second
/// registration is ignored).
pub(crate) fn on_fork(stage: ForkStage, hooks: ForkHooks) {
    watch_forks();
    let _ = FORK_HOOKS[stage as usize].set(hooks);
}

/// Makes the thread that forks hold the `static` [`Mutex`](crate::sync::Mutex) `$lock` (over a
/// `$T`) across every `fork` from now on, taken at `$stage`'s prepare and let go in the parent
/// and in the child: a thread of ours that held it at the fork would have left it held for ever
/// in the child. Registers once, however often it runs.
macro_rules! hold_across_fork {
    ($stage:expr, $lock:path, $T:ty) => {{
        std::thread_local! {
            static HELD: $crate::sync::plain::HeldGuard<$T> = const { std::cell::RefCell::new(None) };
        }
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        REGISTERED.call_once(|| {
            let let_go = || drop(HELD.with(|h| h.borrow_mut().take()));
            $crate::sys::on_fork(
                $stage,
                $crate::sys::ForkHooks {
                    prepare: || HELD.with(|h| *h.borrow_mut() = Some($lock.lock())),
                    parent: let_go,
                    child: let_go,
                },
            )
        });
    }};
}
pub(crate) use hold_across_fork;

extern "C" fn prepare_fork() {
    FORK_HOOKS.iter().filter_map(|h| h.get()).for_each(|h| (h.prepare)());
}

extern "C" fn forked_parent() {
    FORK_HOOKS.iter().rev().filter_map(|h| h.get()).for_each(|h| (h.parent)());
}

extern "C" fn forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    for e in &LET_GO_IN_CHILDREN {
        let fd = e.load(Ordering::Relaxed);
        if fd < 0 {
            continue;
        }
        // SAFETY: open, dup3 and close are async-signal-safe, as a fork handler needs; `fd`
        // is a descriptor the parent holds open (listed until closed), so the child has it.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, fd, libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }
    FORK_HOOKS.iter().rev().filter_map(|h| h.get()).for_each(|h| (h.child)());
}

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

    /// Takes one from the counter; blocks unless the descriptor is non-blocking. A signal
    /// that interrupts the wait ends it with `EINTR` (unless its handler asked for restarts,
    /// `SA_RESTART`, which the kernel honours), as the read libibverbs and librdmacm make on
    /// their channels: programs end blocking waits with a signal (qperf's `SIGALRM`).
    pub(crate) fn wait(&self) -> io::Result<()> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a descriptor we own.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// Takes one from the counter if it is not zero, without blocking whatever the
    /// descriptor's `O_NONBLOCK` (a read with `RWF_NOWAIT`, which eventfd takes since Linux
    /// 5.12); whether it took one. (On a kernel without it, nothing is taken.)
    pub(crate) fn try_take(&self) -> bool {
        let mut v: u64 = 0;
        let io = libc::iovec { iov_base: (&mut v as *mut u64).cast(), iov_len: 8 };
        // SAFETY: one iovec naming a live u64's 8 bytes, from a descriptor we own; offset -1
        // reads as read(2) does.
        let n = unsafe { libc::preadv2(self.fd.as_raw_fd(), &io, 1, -1, libc::RWF_NOWAIT) };
        n == 8
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

    /// A second descriptor of the same eventfd (its lowest free number, from 3 on).
    pub(crate) fn duplicate(&self) -> io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        self.fd.as_fd().try_clone_to_owned()
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

/// Whether this process may make entries in the directory at `path` (write and search it), as
/// the kernel judges it for the real user.
pub(crate) fn may_make_entries_in(path: &std::ffi::CStr) -> bool {
    // SAFETY: a NUL-terminated path, which access(2) only reads.
    unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
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

/// An anonymous shared-memory file of `len` bytes (close-on-exec), sealed against shrinking,
/// growing and further sealing: a process it is passed to can map it knowing that its size
/// will never change under the mapping (a shrunk file would fault the reader with SIGBUS).
pub(crate) fn memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    let fd = memfd_unsealed(name, len)?;
    // SAFETY: F_ADD_SEALS on a descriptor we own takes an int.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, RING_SEALS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The seals a shared-memory file from another process must carry before we map it.
pub(crate) const RING_SEALS: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// As [`memfd`], without the seals (what a careless or hostile peer could pass).
pub(crate) fn memfd_unsealed(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a valid C string; the flags are valid.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
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

/// The seals of a shared-memory file (`F_GET_SEALS`); an error for a file that has none to
/// give (not a memfd or tmpfs file).
pub(crate) fn seals(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GET_SEALS takes no argument; an fd that is not ours to read fails with EBADF.
    let s = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if s < 0 { Err(io::Error::last_os_error()) } else { Ok(s) }
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

/// Who sent a datagram, as the kernel vouches for it (`SCM_CREDENTIALS`): the process id as
/// seen from this process's PID namespace (0 if it is not visible here) and the real user id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cred {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
}

/// Asks the kernel to attach the sender's credentials to every datagram `sock` receives
/// (`SO_PASSCRED`): a sender cannot forge them (only root may name another process or user).
pub(crate) fn pass_credentials(sock: RawFd) -> io::Result<()> {
    set_int_option(sock, libc::SOL_SOCKET, libc::SO_PASSCRED, 1)
}

/// `setsockopt` of an int-valued option.
fn set_int_option(
    sock: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: i32,
) -> io::Result<()> {
    let value: libc::c_int = value;
    let len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` is a live int of `len` bytes, read by the kernel only.
    let r =
        unsafe { libc::setsockopt(sock, level, name, (&value as *const libc::c_int).cast(), len) };
    if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Gives socket `sock` buffers of `bytes` each way: beyond the system's limit where the
/// process may (`CAP_NET_ADMIN`), else as much as the limit allows.
pub(crate) fn enlarge_buffers(sock: RawFd, bytes: i32) {
    for (forced, plain) in
        [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)]
    {
        if set_int_option(sock, libc::SOL_SOCKET, forced, bytes).is_err() {
            let _ = set_int_option(sock, libc::SOL_SOCKET, plain, bytes);
        }
    }
}

/// One datagram received by [`recv_with_fd`].
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) len: usize,
    /// The first descriptor that came with it (close-on-exec; any others are closed).
    pub(crate) fd: Option<OwnedFd>,
    /// The sender's credentials, on a socket that asked for them ([`pass_credentials`]).
    pub(crate) cred: Option<Cred>,
}

/// Receives one datagram into `buf` without blocking, with the descriptor and credentials
/// that came with it.
pub(crate) fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut space = [0u64; 16];
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
    let (mut fd, mut cred) = (None, None);
    // SAFETY: the kernel filled `msg`'s control buffer; the CMSG_* walk stays within
    // msg_controllen, each SCM_RIGHTS payload holds whole descriptors, now ours, and an
    // SCM_CREDENTIALS payload holds one `ucred`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let payload = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    for i in 0..payload / size_of::<RawFd>() {
                        let got = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                        // The first is kept; dropping the others closes them.
                        fd.get_or_insert(got);
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS)
                    if payload >= size_of::<libc::ucred>() =>
                {
                    let u = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>());
                    cred = Some(Cred { pid: u.pid as u32, uid: u.uid });
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received { len: n as usize, fd, cred })
}

/// A descriptor that stands for the process `pid` for as long as it lives (`pidfd_open`),
/// whatever process the number is given to after it exits.
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    if pid == 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor (close-on-exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sleeps while `word` (in memory other processes may map) holds `expected`, at most
/// `timeout`; woken by [`futex_wake`] on it, a signal, or a change before the sleep began.
/// Shared (not private) futexes: the waker may be another process.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 for the call's duration; `ts` lives on the stack.
    // The kernel only reads both. An error (EAGAIN: the word changed; EINTR; ETIMEDOUT) is a
    // wake-up like any other: the caller looks at the word again.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts);
    }
}

/// Wakes every thread, of any process, sleeping in [`futex_wait`] on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Sleeps while `word` (this process's alone) holds `expected`; woken by
/// [`futex_wake_one_private`] on it, a signal, or a change before the sleep began.
pub(crate) fn futex_wait_private(word: &AtomicU32, expected: u32) {
    // SAFETY: `word` is a live, aligned u32 for the call's duration, which the kernel only
    // reads; no timeout. An error (EAGAIN: the word changed; EINTR) is a wake-up like any
    // other: the caller looks again.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes one thread sleeping in [`futex_wait_private`] on `word`.
pub(crate) fn futex_wake_one_private(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

/// Whether process `pid` is stopped: by a signal (SIGSTOP, SIGTSTP) or by a debugger.
pub(crate) fn process_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may hold anything.
    let Some(close) = stat.iter().rposition(|&b| b == b')') else { return false };
    matches!(stat.get(close + 2), Some(b'T' | b't'))
}

/// Whether the process a pidfd stands for has exited (the pidfd is then readable).
pub(crate) fn pidfd_exited(pidfd: RawFd) -> bool {
    !matches!(wait_readable(pidfd, Some(std::time::Duration::ZERO)), Ok(false))
}

/// A file's owner, mode bits, modification time and inode, by descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    pub(crate) dev: u64,
    pub(crate) uid: u32,
    pub(crate) mode: u32,
    pub(crate) mtime: (i64, i64),
    pub(crate) ino: u64,
    pub(crate) size: u64,
}

pub(crate) fn fstat(fd: RawFd) -> io::Result<Stat> {
    // SAFETY: all-zero is a valid `stat`; fstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live, writable stat.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mtime = (st.st_mtime, st.st_mtime_nsec);
    let (uid, mode, ino, size) = (st.st_uid, st.st_mode, st.st_ino, st.st_size as u64);
    Ok(Stat { dev: st.st_dev, uid, mode, mtime, ino, size })
}

/// Opens the directory `name` in the directory `at` (or the root, for `None`) without
/// following a symbolic link in its place.
pub(crate) fn open_dir_at(at: Option<RawFd>, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `name` is a valid C string; `at` is a live descriptor or AT_FDCWD with an
    // absolute name.
    let fd = unsafe { libc::openat(at.unwrap_or(libc::AT_FDCWD), name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates the directory `name` (mode 0700) in the directory `at`; an existing one is fine.
pub(crate) fn mkdir_at(at: RawFd, name: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `name` is a valid C string and `at` a live directory descriptor.
    if unsafe { libc::mkdirat(at, name.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(e);
        }
    }
    Ok(())
}

/// Opens (creating it, mode 0600, if `create`) the regular file `name` in the directory `at`,
/// for reading and writing, without following a symbolic link in its place.
pub(crate) fn open_file_at(
    at: RawFd,
    name: &std::ffi::CStr,
    create: bool,
) -> io::Result<std::fs::File> {
    let mut flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if create {
        flags |= libc::O_CREAT;
    }
    // SAFETY: `name` is a valid C string, `at` a live directory descriptor; the mode is
    // passed as the variadic argument O_CREAT reads.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Removes the file `name` from the directory `at`; one that is not there is fine.
pub(crate) fn unlink_at(at: RawFd, name: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `name` is a valid C string and `at` a live directory descriptor.
    if unsafe { libc::unlinkat(at, name.as_ptr(), 0) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    Ok(())
}

/// poll(2) on `fds`, at most `timeout` (`None`: no limit); the number with events. A signal
/// ends the wait with `EINTR`, as poll(2) does (event loops rely on it).
pub(crate) fn poll(
    fds: &mut [libc::pollfd],
    timeout: Option<std::time::Duration>,
) -> io::Result<usize> {
    let ms = timeout.map_or(-1, |t| {
        if t.is_zero() { 0 } else { t.as_millis().clamp(1, i32::MAX as u128) as i32 }
    });
    // SAFETY: `fds` is a live slice of pollfds and its length is what is passed.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// The IP addresses of this host's network interfaces (getifaddrs(3)); none if it fails.
pub(crate) fn host_addresses() -> Vec<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut p = list;
    // SAFETY: each node of the list getifaddrs made, until its NULL end; an address is read
    // as the type its family says.
    while let Some(ifa) = unsafe { p.as_ref() } {
        // SAFETY: NULL or the node's address.
        if let Some(sa) = unsafe { ifa.ifa_addr.as_ref() } {
            match libc::c_int::from(sa.sa_family) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let a = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                    out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let a = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                    out.push(IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs made, freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// The calls that change the address space, made straight to the kernel rather than through
/// libc's functions, for what the emulator does to application memory. Programs that keep
/// registration caches watch the address space by patching libc's `mmap`, `munmap`, `mremap`
/// and `madvise` (libfabric's and UCX's memory hooks): a call on memory they cache means to
/// them that the application changed it, and they drop the regions it covers. A NIC changes
/// no mapping to register memory, where the emulator reads it in at registration and may move
/// its pages into shared memory and back (`crate::shared_mem`). The emulator's own fresh
/// mappings (rings, views, files) still go through libc: no cache holds them, and sanitizers
/// see mappings only there (ThreadSanitizer, not told of an unmapping, took a ring mapped
/// where another had been for a race with the old one). Each is as unsafe as the call it
/// makes; errors return as libc's do (`MAP_FAILED` or -1, with `errno` set).
pub(crate) mod mm {
    use libc::{c_int, c_void, off_t, size_t};

    /// `mmap(2)`.
    ///
    /// # Safety
    /// As `mmap`: a fixed address replaces what is mapped there.
    pub(crate) unsafe fn mmap(
        addr: *mut c_void,
        len: size_t,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: off_t,
    ) -> *mut c_void {
        // SAFETY: the caller's contract is mmap's.
        let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
        std::ptr::with_exposed_provenance_mut(r as usize)
    }

    /// `munmap(2)`.
    ///
    /// # Safety
    /// Nothing may use the range afterwards.
    pub(crate) unsafe fn munmap(addr: *mut c_void, len: size_t) -> c_int {
        // SAFETY: the caller's contract is munmap's.
        unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
    }

    /// `mremap(2)` with a new address (meant with `MREMAP_FIXED`).
    ///
    /// # Safety
    /// As `mremap`: the old range moves, and a fixed new address replaces what is mapped there.
    pub(crate) unsafe fn mremap(
        old: *mut c_void,
        old_len: size_t,
        new_len: size_t,
        flags: c_int,
        new: *mut c_void,
    ) -> *mut c_void {
        // SAFETY: the caller's contract is mremap's.
        let r = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) };
        std::ptr::with_exposed_provenance_mut(r as usize)
    }

    /// `madvise(2)`.
    ///
    /// # Safety
    /// As `madvise`: some advice (`MADV_DONTNEED`, `MADV_FREE`) discards contents.
    pub(crate) unsafe fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
        // SAFETY: the caller's contract is madvise's.
        unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int }
    }
}

/// Faults in `addr..addr+len` as the kernel's pinning of a registration does (for writing when
/// `write`) with one `madvise(MADV_POPULATE_*)`; false where part of the range is unmapped or
/// lacks the access, where the kernel fails `ibv_reg_mr` with `EFAULT`. Before Linux 5.14 (no
/// such advice) only the mapping is checked.
pub(crate) fn fault_in(addr: u64, len: usize, write: bool) -> bool {
    static POPULATE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let page = page_size();
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len as u64) else { return false };
    let span = (end - start) as usize;
    let populate = *POPULATE.get_or_init(|| {
        // SAFETY: a private anonymous page of our own, advised and unmapped here.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                page as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return false;
            }
            let ok = libc::madvise(p, page as usize, libc::MADV_POPULATE_WRITE) == 0;
            libc::munmap(p, page as usize);
            ok
        }
    });
    let rc = if populate {
        let advice = if write { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
        // SAFETY: populating changes no contents; it fails (ENOMEM, EINVAL, EFAULT) where the
        // range is unmapped or lacks the access, which is what we ask.
        unsafe { mm::madvise(start as *mut libc::c_void, span, advice) }
    } else {
        let mut vec = vec![0u8; span.div_ceil(page as usize)];
        // SAFETY: `vec` has one byte per page of the range, as mincore writes.
        unsafe { libc::mincore(start as *mut libc::c_void, span, vec.as_mut_ptr()) }
    };
    rc == 0
}

/// `msync(MS_SYNC)` over the pages of `addr..addr+len`: false where part of it is unmapped.
pub(crate) fn write_back(addr: u64, len: usize) -> bool {
    let page = page_size();
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len as u64) else { return false };
    // SAFETY: msync reads no memory of ours; it fails (ENOMEM) where the range is unmapped.
    unsafe { libc::msync(start as *mut libc::c_void, (end - start) as usize, libc::MS_SYNC) == 0 }
}

/// `RLIMIT_MEMLOCK` (the soft limit) in bytes; `None` when unlimited.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `r`, which lives across the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The capability that lifts `RLIMIT_MEMLOCK` for the kernel's memory pinning.
pub(crate) const CAP_IPC_LOCK: u32 = 14;
/// The capability the kernel's verbs ask of raw packet QPs and flow steering rules.
pub(crate) const CAP_NET_RAW: u32 = 13;

/// Whether this process's effective capabilities hold `CAP_IPC_LOCK`.
pub(crate) fn can_lock_memory() -> bool {
    has_capability(CAP_IPC_LOCK)
}

/// Whether this process's effective capabilities hold capability number `cap` (below 32).
pub(crate) fn has_capability(cap: u32) -> bool {
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header { version: CAPABILITY_VERSION_3, pid: 0 };
    let mut d = [Data::default(); 2];
    // SAFETY: capget reads the header and writes two data structs (version 3's layout), all
    // of which live across the call.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    rc == 0 && d[0].effective & (1 << cap) != 0
}

/// Whether the process runs under Valgrind, asked once with its `RUNNING_ON_VALGRIND` client
/// request (valgrind.h's documented sequence: rotations of `rdi` by 128 bits in all and an
/// `xchg` of `rbx` with itself, no-ops on a CPU, that Valgrind recognises; it answers in `rdx`
/// the number of Valgrinds the process runs under, where a CPU leaves the default, 0).
/// Memcheck reports a branch on bytes no one wrote, which a look at application memory may
/// take (`shared_mem`), as an error of the program's.
pub(crate) fn under_valgrind() -> bool {
    static UNDER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *UNDER.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // VG_USERREQ__RUNNING_ON_VALGRIND, and five arguments it ignores.
            let request: [u64; 6] = [0x1001, 0, 0, 0, 0, 0];
            let mut answer: u64 = 0;
            // SAFETY: the sequence changes no register but the flags on a CPU (`rdi` comes back
            // as it was); under Valgrind it reads the six words at `rax` and writes `rdx`.
            unsafe {
                std::arch::asm!(
                    "rol rdi, 3",
                    "rol rdi, 13",
                    "rol rdi, 61",
                    "rol rdi, 51",
                    "xchg rbx, rbx",
                    in("rax") request.as_ptr(),
                    inout("rdx") answer,
                    inout("rdi") 0u64 => _,
                    options(nostack),
                );
            }
            answer != 0
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The host's page size.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf takes no pointers.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
}

/// A shared, writable-or-not mapping of part of a file (the dma-buf or memfd behind an MR
/// from `ibv_reg_dmabuf_mr`), unmapped when dropped.
#[derive(Debug)]
pub(crate) struct FileMapping {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a plain address range owned by this value; it is only unmapped in `drop`.
unsafe impl Send for FileMapping {}
// SAFETY: as above; `&FileMapping` gives access to nothing.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps bytes `offset..offset+len` of `fd` shared and returns the mapping and the address
    /// of byte `offset`. The mapping is writable if the descriptor and the file's seals allow
    /// (so that new rights can be given later), and must be when `write`. `EBADF` for a descriptor that is not open,
    /// `EINVAL` for a range past the end of the file, or a file that cannot be mapped (as the
    /// kernel refuses a descriptor that is no dma-buf).
    pub(crate) fn map(
        fd: RawFd,
        offset: u64,
        len: usize,
        write: bool,
    ) -> Result<(FileMapping, *mut u8), i32> {
        let size = file_size(fd)?;
        let end = offset.checked_add(len as u64).ok_or(libc::EINVAL)?;
        if len == 0 || end > size {
            return Err(libc::EINVAL);
        }
        let page = page_size();
        let lead = (offset % page) as usize;
        let span = lead + len;
        let at = (offset - lead as u64) as libc::off_t;
        let map = |prot| {
            // SAFETY: a new shared mapping chosen by the kernel, aliasing nothing of ours; the
            // file offset is page-aligned as mmap requires.
            unsafe { libc::mmap(std::ptr::null_mut(), span, prot, libc::MAP_SHARED, fd, at) }
        };
        let mut base = map(libc::PROT_READ | libc::PROT_WRITE);
        // EACCES: a read-only descriptor; EPERM: a file sealed against new writable mappings.
        let refused = || {
            matches!(io::Error::last_os_error().raw_os_error(), Some(libc::EACCES | libc::EPERM))
        };
        if base == libc::MAP_FAILED && !write && refused() {
            base = map(libc::PROT_READ);
        }
        if base == libc::MAP_FAILED {
            return Err(match io::Error::last_os_error().raw_os_error() {
                Some(libc::EBADF) => libc::EBADF,
                // A read-only descriptor asked for a writable mapping: the caller's access.
                Some(libc::EACCES) => libc::EACCES,
                _ => libc::EINVAL,
            });
        }
        // SAFETY: `lead < span`, inside the mapping just made.
        let start = unsafe { base.cast::<u8>().add(lead) };
        Ok((FileMapping { base, len: span }, start))
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once, here; nothing refers to it after
        // its owner (the MR's region) is dropped.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The size of the file behind `fd`: `st_size` for a regular file (a memfd), else where
/// `SEEK_END` lands (a dma-buf reports its size that way), the file position restored.
fn file_size(fd: RawFd) -> Result<u64, i32> {
    // SAFETY: `st` is a writable stat buffer; fstat fails cleanly (EBADF) for a bad fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF));
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFREG {
        return Ok(st.st_size as u64);
    }
    // SAFETY: lseek takes no pointers; the position is put back as it was.
    unsafe {
        let at = libc::lseek(fd, 0, libc::SEEK_CUR);
        let end = libc::lseek(fd, 0, libc::SEEK_END);
        if at >= 0 {
            libc::lseek(fd, at, libc::SEEK_SET);
        }
        if at < 0 || end <= 0 { Err(libc::EINVAL) } else { Ok(end as u64) }
    }
}
/// Makes a UDP socket send with DF and IP identification 0 (`IP_PMTUDISC_DO`): a RoCE v2
/// packet's ICRC covers the identification, which the socket's other modes let the kernel
/// choose.
pub(crate) fn set_dont_fragment(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
}

/// Lets the IPv6 UDP socket `fd` take in datagrams whose UDP checksum is 0 (RFC 6935's zero
/// checksum for tunnels, which the kernel otherwise drops).
pub(crate) fn take_zero_udp6_checksums(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::IPPROTO_UDP, libc::UDP_NO_CHECK6_RX, 1)
}

/// Sets the UDP socket option `name` to 1 (tests stand in for peers with it).
#[cfg(test)]
pub(crate) fn set_int_option_for_test(fd: RawFd, name: libc::c_int) {
    set_int_option(fd, libc::IPPROTO_UDP, name, 1).unwrap();
}

/// Shuts reading down on socket `fd`: a thread blocked receiving on it returns at once.
pub(crate) fn shutdown_read(fd: RawFd) {
    // SAFETY: a plain system call on a descriptor; no memory is passed.
    unsafe { libc::shutdown(fd, libc::SHUT_RD) };
}

/// While it lives, the calling thread blocks every signal but those a fault raises in the
/// thread that faulted (SIGSEGV and SIGBUS, which `guarded` catches, SIGILL, SIGFPE, SIGTRAP,
/// SIGSYS); dropped, it restores the thread's mask.
///
/// A real provider starts no threads, so a signal sent to the process (`kill(2)`, a terminal's
/// ^C, a timer's SIGALRM) reaches one of the application's threads, which may block it to
/// read it from a `signalfd` or `sigwaitinfo`. The kernel gives such a signal to any thread
/// that does not block it: to one of ours, whose default action then ended the program (tgtd,
/// the iSCSI target, woken by its disk threads with `kill(getpid(), SIGUSR2)`, died at its
/// first read). The emulator's threads, started under this mask, never take one.
struct OwnSignalsBlocked(libc::sigset_t);

impl OwnSignalsBlocked {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data, filled by sigfillset before any use; the calls
        // only read and write the two sets passed and this thread's own mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for sig in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
                libc::SIGSYS,
            ] {
                libc::sigdelset(&mut set, sig);
            }
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut previous);
            OwnSignalsBlocked(previous)
        }
    }
}

impl Drop for OwnSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `new` saved, on the thread that saved it (the value never
        // leaves `spawn`).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Starts a thread named `name` that runs `f`, and returns once it is running `f`: its stack,
/// its alternate signal stack and its malloc arena are in place by then.
///
/// Some programs rewrite libc's code while they run: libfabric's memory hooks (on by default
/// for its registration cache) patch `mmap`, `munmap`, `madvise` and `brk` in place, thirteen
/// bytes at a time, assuming no other thread is inside them meanwhile — true of a real
/// provider, whose library starts no threads. A thread of ours still starting as the program
/// opened its domain (a starting thread maps and unmaps memory) returned from `munmap` into the
/// half-written patch and crashed `fi_pingpong`. Settled before the call that started it
/// returns, a thread of ours only maps memory as its work needs.
///
/// The thread blocks every signal sent to the process as a whole (see [`OwnSignalsBlocked`]).
pub(crate) fn spawn<F, T>(name: String, f: F) -> io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (started, running) = std::sync::mpsc::sync_channel(1);
    // A new thread starts with its creator's mask: blocked from its first instruction.
    let blocked = OwnSignalsBlocked::new();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        // The first allocation attaches the thread to a malloc arena (mapping one if need be).
        drop(std::hint::black_box(Box::new(0u64)));
        let _ = started.send(());
        f()
    });
    drop(blocked);
    let thread = spawned?;
    // Err only if the thread ended before it ran `f`, which nothing above lets it do.
    let _ = running.recv();
    Ok(thread)
}

#[cfg(test)]
mod test {
    use std::os::fd::AsRawFd;
    use std::os::unix::thread::JoinHandleExt;

    /// On a CPU, Valgrind's client request is a run of no-ops that leaves the default answer
    /// (under Valgrind, Memcheck's run of the C tests depends on the other answer:
    /// `c_programs`' `the_c_tests_run_clean_under_valgrind_memcheck`).
    #[test]
    fn outside_valgrind_the_client_request_answers_no() {
        assert!(!super::under_valgrind());
        assert!(!super::under_valgrind(), "asked again");
    }

    /// The name of the thread `t`, as the kernel has it (read from its own `comm` file: a
    /// listing of `/proc/self/task` skips threads while others end, as other tests' do).
    fn thread_name<T>(t: &std::thread::JoinHandle<T>) -> String {
        let mut name = [0 as libc::c_char; 16];
        // SAFETY: `t` is not joined, so its pthread_t names a live thread; `name` holds the
        // 16 bytes a thread's name may take, NUL included.
        let rc = unsafe { libc::pthread_getname_np(t.as_pthread_t(), name.as_mut_ptr(), 16) };
        assert_eq!(rc, 0);
        // SAFETY: on success the name is NUL-terminated within `name`.
        unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned()
    }

    /// Whether `sig` is blocked in the calling thread.
    fn blocked(sig: libc::c_int) -> bool {
        // SAFETY: reads this thread's mask into a zeroed set, then tests one member.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
            libc::sigismember(&set, sig) == 1
        }
    }

    /// A thread of ours blocks what is sent to the process, not what its own faults raise;
    /// the thread that started it keeps its mask.
    #[test]
    fn a_spawned_thread_takes_no_signal_sent_to_the_process() {
        let own = [libc::SIGINT, libc::SIGTERM, libc::SIGUSR2, libc::SIGALRM, libc::SIGCHLD];
        let faults = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
        let before: Vec<bool> = own.iter().chain(&faults).map(|&s| blocked(s)).collect();
        let t = super::spawn("rdma-emu-masked".into(), move || {
            (own.iter().all(|&s| blocked(s)), faults.iter().any(|&s| blocked(s)))
        })
        .unwrap();
        assert_eq!(t.join().unwrap(), (true, false));
        let after: Vec<bool> = own.iter().chain(&faults).map(|&s| blocked(s)).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn a_spawned_thread_is_running_when_spawn_returns() {
        for i in 0..20 {
            let name = format!("rdma-emu-t{i}");
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let t = super::spawn(name.clone(), move || stopped.recv().is_err()).unwrap();
            // The thread names itself as it starts: named, it has started.
            assert_eq!(thread_name(&t), name, "{name} not started yet");
            drop(stop);
            assert!(t.join().unwrap());
        }
    }

    /// A child made by `fork` lets go of the descriptors listed for it: once the parent has
    /// closed its lock file, nobody holds the lock, though the child lives on.
    #[test]
    fn a_forked_child_lets_go_of_the_locks_listed() {
        let path = std::env::temp_dir().join(format!("rdma-emu-letgo-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        file.try_lock().unwrap();
        assert!(super::let_go_in_children(file.as_raw_fd()));
        let mut ready = [0 as libc::c_int; 2];
        // SAFETY: a two-descriptor array for pipe(2).
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: the child only writes to the pipe and sleeps (async-signal-safe calls) until
        // it is killed; the fork handlers have run once fork returns in it.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above.
            unsafe {
                libc::write(ready[1], [1u8].as_ptr().cast(), 1);
                libc::sleep(60);
                libc::_exit(0);
            }
        }
        assert!(child > 0);
        let mut byte = [0u8];
        // SAFETY: reads one byte into `byte` from the pipe's read end, then closes both ends.
        unsafe {
            assert_eq!(libc::read(ready[0], byte.as_mut_ptr().cast(), 1), 1);
            libc::close(ready[0]);
            libc::close(ready[1]);
        }
        super::keep_in_children(file.as_raw_fd());
        drop(file);
        // Other tests of this binary fork too: a child of theirs made while the file was open
        // and not listed holds the lock until it exits, which they do at once. Ours sleeps on.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let free = loop {
            let free = std::fs::File::open(&path).unwrap().try_lock().is_ok();
            if free || std::time::Instant::now() > deadline {
                break free;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // SAFETY: our own child, killed and reaped.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_file(&path);
        assert!(free, "the child still held the lock it inherited");
    }
}

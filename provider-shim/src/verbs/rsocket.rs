//! librdmacm's rsocket calls (`<rdma/rsocket.h>`) over the emulator's rsockets
//! (`rdma_emu::rsocket`), exported privately like the CM's (see `cm.rs`). Conventions are the
//! socket calls': 0 or a count, or -1 with `errno`; an unknown socket is `EBADF`.

use core::ffi::{c_int, c_void};
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ptr,
    sync::LazyLock,
    time::Duration,
};

use rdma_emu::sync::Mutex;
use rdma_emu::{
    RawMemory,
    rsocket::{PollEntry, PollTarget, RSocket, RecvFlags, Shutdown, poll},
};

use super::sockaddr;
use crate::boundary::{ffi, set_errno};

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;
/// `struct ibv_path_data`: flags, a reserved word, `struct ibv_path_record`.
const PATH_DATA: usize = 72;

/// The `struct ibv_path_data` librdmacm's rsockets give for `path` under `RDMA_ROUTE`.
fn path_data(p: &rdma_emu::cm::PathRecord) -> [u8; PATH_DATA] {
    let mut d = [0u8; PATH_DATA];
    // (flags: the path's preference, 0; service ID 0.)
    let r = &mut d[8..];
    r[8..24].copy_from_slice(&p.dgid.0);
    r[24..40].copy_from_slice(&p.sgid.0);
    r[40..42].copy_from_slice(&p.dlid.to_be_bytes());
    r[42..44].copy_from_slice(&p.slid.to_be_bytes());
    let flow_hop = (p.flow_label << 8) | u32::from(p.hop_limit);
    r[44..48].copy_from_slice(&flow_hop.to_be_bytes());
    r[48] = p.traffic_class;
    // Reversible, one path.
    r[49] = 1 << 7 | 1;
    r[50..52].copy_from_slice(&p.pkey.to_be_bytes());
    r[52..54].copy_from_slice(&u16::from(p.sl).to_be_bytes());
    // Each with the selector "exactly" (2) in its top bits.
    r[54] = p.mtu.0 as u8 | 2 << 6;
    r[55] = p.rate | 2 << 6;
    r[56] = p.packet_life_time | 2 << 6;
    d
}

/// A socket and the descriptor flags `rfcntl` keeps for it.
struct Entry {
    sock: RSocket,
    fd_flags: c_int,
    fl_flags: c_int,
}

/// The live sockets, by number. (Looked up at every call, of programs that call `rrecv` in a
/// loop until data comes too: hashed without SipHash.)
static SOCKETS: LazyLock<Mutex<HashMap<c_int, Entry, rustc_hash::FxBuildHasher>>> =
    LazyLock::new(Default::default);

fn lookup(s: c_int) -> Option<RSocket> {
    SOCKETS.lock().get(&s).map(|e| e.sock.clone())
}

fn fail(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

fn fail_l(errno: c_int) -> isize {
    set_errno(errno);
    -1
}

/// Runs `f` on socket `s` behind the C boundary: `EBADF` for an unknown socket, `EIO` if it
/// panics; `failed` makes the failure's return value (-1 as `int` or as `ssize_t`).
fn on_socket<R>(s: c_int, failed: fn(c_int) -> R, f: impl FnOnce(RSocket) -> R) -> R {
    ffi!(failed(libc::EIO), {
        match lookup(s) {
            Some(sock) => f(sock),
            None => failed(libc::EBADF),
        }
    })
}

fn res(r: rdma_emu::Result<()>) -> c_int {
    r.map_or_else(|e| fail(e.errno().raw()), |()| 0)
}

fn count(r: rdma_emu::Result<usize>) -> isize {
    r.map_or_else(|e| fail_l(e.errno().raw()), |n| n as isize)
}

/// The address C passed, checked against its length.
///
/// # Safety
/// `p` is NULL or readable for `len` bytes.
unsafe fn read_addr(p: *const libc::sockaddr, len: libc::socklen_t) -> Result<SocketAddr, c_int> {
    // SAFETY: by the caller's contract.
    unsafe { sockaddr::from_c(p, Some(len as usize)) }
}

/// Writes no address: zeros of an IPv6 address's size (no family), truncated to `*len`, as
/// librdmacm copies the empty destination of an id neither bound nor connected; `*len`
/// becomes that size.
///
/// # Safety
/// As [`write_sockaddr`].
unsafe fn write_no_addr(p: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { write_sockaddr(p, len, &[0; size_of::<libc::sockaddr_in6>()]) }
}

/// Writes `a` the way the socket's family names it (an IPv6 socket names an IPv4 peer by its
/// IPv4-mapped address), truncated to `*len`; `*len` becomes the full size.
///
/// # Safety
/// As [`write_sockaddr`].
unsafe fn write_addr(
    p: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    a: SocketAddr,
    v6: bool,
) -> c_int {
    let a = match a {
        SocketAddr::V4(v4) if v6 => {
            SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
        }
        other => other,
    };
    let (storage, size) = sockaddr::to_c(a);
    // SAFETY: `to_c` wrote `size` bytes of the storage, which holds at least that many.
    let bytes = unsafe { std::slice::from_raw_parts(ptr::from_ref(&storage).cast::<u8>(), size) };
    // SAFETY: forwarded contract.
    unsafe { write_sockaddr(p, len, bytes) }
}

/// Copies the address `bytes` to the caller's buffer, truncated to `*len`; `*len` becomes
/// their full length (`EFAULT` for a NULL `len`).
///
/// # Safety
/// `p` and `len` are NULL or valid, `p` writable for `*len` bytes.
unsafe fn write_sockaddr(p: *mut libc::sockaddr, len: *mut libc::socklen_t, bytes: &[u8]) -> c_int {
    if len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: `len` is valid by the caller's contract.
    let room = unsafe { *len } as usize;
    if !p.is_null() {
        // SAFETY: `p` is writable for `room` bytes; we copy at most that.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), room.min(bytes.len())) };
    }
    // SAFETY: as above.
    unsafe { *len = bytes.len() as libc::socklen_t };
    0
}

/// `rsocket(domain, type, protocol)`: stream sockets (RC) and datagram sockets (UD) over the
/// emulator.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rsocket(
    domain: c_int,
    ty: c_int,
    protocol: c_int,
) -> c_int {
    ffi!(fail(libc::EIO), {
        let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
        let stream = base == libc::SOCK_STREAM && (protocol == 0 || protocol == libc::IPPROTO_TCP);
        let dgram = base == libc::SOCK_DGRAM && (protocol == 0 || protocol == libc::IPPROTO_UDP);
        if !matches!(domain, libc::AF_INET | libc::AF_INET6) || !(stream || dgram) {
            return fail(libc::EOPNOTSUPP);
        }
        let Some(fabric) = super::device::fabric() else { return fail(libc::ENODEV) };
        let v6 = domain == libc::AF_INET6;
        let made = if stream { RSocket::new(&fabric, v6) } else { RSocket::new_dgram(&fabric, v6) };
        let sock = match made {
            Ok(s) => s,
            Err(e) => return fail(e.errno().raw()),
        };
        let nonblocking = ty & libc::SOCK_NONBLOCK != 0;
        sock.set_nonblocking(nonblocking);
        let n = sock.number();
        let entry = Entry {
            sock,
            fd_flags: if ty & libc::SOCK_CLOEXEC != 0 { libc::FD_CLOEXEC } else { 0 },
            fl_flags: if nonblocking { libc::O_NONBLOCK } else { 0 },
        };
        SOCKETS.lock().insert(n, entry);
        n
    })
}

/// `rbind(socket, addr, addrlen)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rbind(
    s: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        // SAFETY: the caller's address of `len` bytes.
        match unsafe { read_addr(addr, len) } {
            Ok(a) => res(sock.bind(a)),
            Err(e) => fail(e),
        }
    })
}

/// `rlisten(socket, backlog)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rlisten(
    s: c_int,
    backlog: c_int,
) -> c_int {
    on_socket(s, fail, |sock| res(sock.listen(backlog)))
}

/// `raccept(socket, addr, addrlen)`: the new socket's number; the peer's address if asked.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__raccept(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        let new = match sock.accept() {
            Ok(n) => n,
            Err(e) => return fail(e.errno().raw()),
        };
        if !addr.is_null()
            && let Ok(peer) = new.peer_addr()
            // SAFETY: the caller's buffer and length.
            && unsafe { write_addr(addr, len, peer, sock.is_v6()) } != 0
        {
            let _ = new.close();
            return -1;
        }
        let n = new.number();
        let nb = new.is_nonblocking();
        let entry =
            Entry { sock: new, fd_flags: 0, fl_flags: if nb { libc::O_NONBLOCK } else { 0 } };
        SOCKETS.lock().insert(n, entry);
        n
    })
}

/// `rconnect(socket, addr, addrlen)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rconnect(
    s: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        // SAFETY: the caller's address of `len` bytes.
        match unsafe { read_addr(addr, len) } {
            Ok(a) => res(sock.connect(a)),
            Err(e) => fail(e),
        }
    })
}

/// `rshutdown(socket, how)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rshutdown(
    s: c_int,
    how: c_int,
) -> c_int {
    on_socket(s, fail, |sock| {
        let how = match how {
            libc::SHUT_RD => Shutdown::Read,
            libc::SHUT_WR => Shutdown::Write,
            libc::SHUT_RDWR => Shutdown::Both,
            _ => return fail(libc::EINVAL),
        };
        res(sock.shutdown(how))
    })
}

/// `rclose(socket)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rclose(s: c_int) -> c_int {
    ffi!(fail(libc::EIO), {
        let Some(entry) = SOCKETS.lock().remove(&s) else { return fail(libc::EBADF) };
        res(entry.sock.close())
    })
}

fn recv_flags(flags: c_int) -> RecvFlags {
    RecvFlags {
        dont_wait: flags & libc::MSG_DONTWAIT != 0,
        peek: flags & libc::MSG_PEEK != 0,
        wait_all: flags & libc::MSG_WAITALL != 0,
    }
}

/// The caller's buffer as a slice (empty for a zero length; `None` for NULL with a length).
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes for the duration of the call.
unsafe fn buf_mut<'a>(buf: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    // SAFETY: by the caller's contract.
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// # Safety
/// As [`buf_mut`], for reading.
unsafe fn buf_ref<'a>(buf: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: by the caller's contract.
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// `rrecv(socket, buf, len, flags)`: `MSG_DONTWAIT`, `MSG_PEEK` and `MSG_WAITALL` count.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rrecv(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> isize {
    on_socket(s, fail_l, |sock| {
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(out) = (unsafe { buf_mut(buf, len) }) else { return fail_l(libc::EFAULT) };
        count(sock.recv(out, recv_flags(flags)))
    })
}

/// `rrecvfrom(...)`: a stream socket's `rrecv`, with the peer's address if asked.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    srclen: *mut libc::socklen_t,
) -> isize {
    on_socket(s, fail_l, |sock| {
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(out) = (unsafe { buf_mut(buf, len) }) else { return fail_l(libc::EFAULT) };
        let (n, from) = match sock.recv_from(out, recv_flags(flags)) {
            Ok(got) => got,
            Err(e) => return fail_l(e.errno().raw()),
        };
        // A stream's source is its peer.
        let from = from.or_else(|| sock.peer_addr().ok().filter(|_| n > 0));
        if let Some(a) = from.filter(|_| !src.is_null()) {
            // SAFETY: the caller's buffer and length.
            unsafe { write_addr(src, srclen, a, sock.is_v6()) };
        }
        n as isize
    })
}

/// `rread(socket, buf, count)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rread(
    s: c_int,
    buf: *mut c_void,
    len: usize,
) -> isize {
    // SAFETY: forwarded from the caller.
    unsafe { rdma_emu_shim__rdma_emu_cm__rrecv(s, buf, len, 0) }
}

/// The caller's I/O vector.
///
/// # Safety
/// `iov` is NULL or valid for `n` entries, each valid for its length.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> Option<&'a [libc::iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return None;
    }
    if n == 0 {
        return Some(&[]);
    }
    // SAFETY: by the caller's contract.
    (!iov.is_null()).then(|| unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// Receives into a vector: one receive into a staging buffer, then scattered; a datagram's
/// source goes to `name` (a `msg_name` and its `msg_namelen`) if given.
fn recv_vec(
    s: c_int,
    iov: &[libc::iovec],
    flags: c_int,
    name: Option<(*mut libc::sockaddr, *mut libc::socklen_t)>,
) -> isize {
    let Some(sock) = lookup(s) else { return fail_l(libc::EBADF) };
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let (n, from) = match sock.recv_from(&mut tmp, recv_flags(flags)) {
        Ok(got) => got,
        Err(e) => return fail_l(e.errno().raw()),
    };
    if let (Some((p, len)), Some(a)) = (name, from) {
        // SAFETY: the caller's msg_name and its length.
        unsafe { write_addr(p, len, a, sock.is_v6()) };
    }
    let mut at = 0;
    for v in iov {
        let take = v.iov_len.min(n - at);
        if take == 0 {
            break;
        }
        // SAFETY: the caller's vector entries are writable for their lengths.
        unsafe { ptr::copy_nonoverlapping(tmp[at..].as_ptr(), v.iov_base.cast::<u8>(), take) };
        at += take;
    }
    n as isize
}

/// Sends a vector: gathered, then one send (to `to`, a datagram socket's destination, if
/// given).
fn send_vec(s: c_int, iov: &[libc::iovec], flags: c_int, to: Option<SocketAddr>) -> isize {
    let Some(sock) = lookup(s) else { return fail_l(libc::EBADF) };
    let mut tmp = Vec::with_capacity(iov.iter().map(|v| v.iov_len).sum());
    for v in iov {
        // SAFETY: the caller's vector entries are readable for their lengths.
        let Some(part) = (unsafe { buf_ref(v.iov_base, v.iov_len) }) else {
            return fail_l(libc::EFAULT);
        };
        tmp.extend_from_slice(part);
    }
    let dont_wait = flags & libc::MSG_DONTWAIT != 0;
    count(match to {
        Some(to) => sock.send_to(&tmp, to, dont_wait),
        None => sock.send(&tmp, dont_wait),
    })
}

/// `rreadv(socket, iov, iovcnt)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rreadv(
    s: c_int,
    iov: *const libc::iovec,
    n: c_int,
) -> isize {
    ffi!(fail_l(libc::EIO), {
        // SAFETY: the caller's vector.
        let Some(iov) = (unsafe { iovecs(iov, n) }) else { return fail_l(libc::EINVAL) };
        recv_vec(s, iov, 0, None)
    })
}

/// `rrecvmsg(socket, msg, flags)`: the data part (no control messages on a stream).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rrecvmsg(
    s: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
) -> isize {
    ffi!(fail_l(libc::EIO), {
        // SAFETY: the caller's message header.
        let Some(m) = (unsafe { msg.as_mut() }) else { return fail_l(libc::EFAULT) };
        // SAFETY: its vector.
        let Some(iov) = (unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) }) else {
            return fail_l(libc::EINVAL);
        };
        m.msg_controllen = 0;
        m.msg_flags = 0;
        let name = (!m.msg_name.is_null()).then_some((m.msg_name.cast(), &raw mut m.msg_namelen));
        recv_vec(s, iov, flags, name)
    })
}

/// `rsend(socket, buf, len, flags)`: `MSG_DONTWAIT` counts.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rsend(
    s: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    on_socket(s, fail_l, |sock| {
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(data) = (unsafe { buf_ref(buf, len) }) else { return fail_l(libc::EFAULT) };
        count(sock.send(data, flags & libc::MSG_DONTWAIT != 0))
    })
}

/// `rsendto(...)`: a stream socket takes no destination (`EISCONN`, as librdmacm).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rsendto(
    s: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dest: *const libc::sockaddr,
    destlen: libc::socklen_t,
) -> isize {
    if dest.is_null() && destlen == 0 {
        // SAFETY: forwarded from the caller.
        return unsafe { rdma_emu_shim__rdma_emu_cm__rsend(s, buf, len, flags) };
    }
    on_socket(s, fail_l, |sock| {
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(data) = (unsafe { buf_ref(buf, len) }) else { return fail_l(libc::EFAULT) };
        // SAFETY: the caller's address of `destlen` bytes.
        match unsafe { read_addr(dest, destlen) } {
            Ok(to) => count(sock.send_to(data, to, flags & libc::MSG_DONTWAIT != 0)),
            Err(e) => fail_l(e),
        }
    })
}

/// `rwrite(socket, buf, count)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rwrite(
    s: c_int,
    buf: *const c_void,
    len: usize,
) -> isize {
    // SAFETY: forwarded from the caller.
    unsafe { rdma_emu_shim__rdma_emu_cm__rsend(s, buf, len, 0) }
}

/// `rwritev(socket, iov, iovcnt)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rwritev(
    s: c_int,
    iov: *const libc::iovec,
    n: c_int,
) -> isize {
    ffi!(fail_l(libc::EIO), {
        // SAFETY: the caller's vector.
        let Some(iov) = (unsafe { iovecs(iov, n) }) else { return fail_l(libc::EINVAL) };
        send_vec(s, iov, 0, None)
    })
}

/// `rsendmsg(socket, msg, flags)`: the data part; a destination is `EISCONN`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rsendmsg(
    s: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> isize {
    ffi!(fail_l(libc::EIO), {
        // SAFETY: the caller's message header.
        let Some(m) = (unsafe { msg.as_ref() }) else { return fail_l(libc::EFAULT) };
        let to = if m.msg_name.is_null() && m.msg_namelen == 0 {
            None
        } else {
            // SAFETY: the caller's destination of `msg_namelen` bytes.
            match unsafe { read_addr(m.msg_name.cast(), m.msg_namelen) } {
                Ok(a) => Some(a),
                Err(e) => return fail_l(e),
            }
        };
        // SAFETY: its vector.
        let Some(iov) = (unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) }) else {
            return fail_l(libc::EINVAL);
        };
        send_vec(s, iov, flags, to)
    })
}

/// `rpoll(fds, nfds, timeout)`: rsockets and ordinary descriptors together.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    ffi!(fail(libc::EIO), {
        if nfds > 0 && fds.is_null() {
            return fail(libc::EFAULT);
        }
        let fds = if nfds == 0 {
            &mut []
        } else {
            // SAFETY: the caller's array of `nfds` entries.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        let mut entries: Vec<PollEntry> = fds
            .iter()
            .map(|p| PollEntry {
                target: lookup(p.fd).map_or(PollTarget::Fd(p.fd), PollTarget::Socket),
                events: p.events,
                revents: 0,
            })
            .collect();
        let timeout = u64::try_from(timeout).ok().map(Duration::from_millis);
        match poll(&mut entries, timeout) {
            Ok(n) => {
                for (p, e) in fds.iter_mut().zip(&entries) {
                    p.revents = e.revents;
                }
                n as c_int
            }
            Err(e) => fail(e.errno().raw()),
        }
    })
}

/// `rselect(nfds, readfds, writefds, exceptfds, timeout)`: through `rpoll`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    ffi!(fail(libc::EIO), {
        if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
            return fail(libc::EINVAL);
        }
        // SAFETY: each set is NULL or the caller's fd_set.
        let isset =
            |set: *mut libc::fd_set, fd| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
        let mut pfds = Vec::new();
        for fd in 0..nfds {
            let mut events = 0;
            if isset(readfds, fd) {
                events |= libc::POLLIN;
            }
            if isset(writefds, fd) {
                events |= libc::POLLOUT;
            }
            if isset(exceptfds, fd) {
                events |= libc::POLLPRI;
            }
            if events != 0 {
                pfds.push(libc::pollfd { fd, events, revents: 0 });
            }
        }
        // SAFETY: NULL or the caller's timeval.
        let ms = match unsafe { timeout.as_ref() } {
            None => -1,
            Some(t) if t.tv_sec < 0 || t.tv_usec < 0 => return fail(libc::EINVAL),
            Some(t) => (t.tv_sec.saturating_mul(1000).saturating_add((t.tv_usec + 999) / 1000))
                .min(i32::MAX as i64) as c_int,
        };
        // SAFETY: our own array.
        let n =
            unsafe { rdma_emu_shim__rdma_emu_cm__rpoll(pfds.as_mut_ptr(), pfds.len() as _, ms) };
        if n < 0 {
            return n;
        }
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                // SAFETY: the caller's fd_set.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        let mut ready = 0;
        for p in &pfds {
            let set_if = |set: *mut libc::fd_set, yes: bool| {
                if yes && !set.is_null() {
                    // SAFETY: the caller's fd_set; `p.fd` < nfds <= FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    return 1;
                }
                0
            };
            let r = p.revents;
            let (rd, wr, ex) = (
                libc::POLLIN | libc::POLLHUP | libc::POLLERR,
                libc::POLLOUT | libc::POLLERR,
                libc::POLLPRI,
            );
            ready += set_if(readfds, p.events & libc::POLLIN != 0 && r & rd != 0);
            ready += set_if(writefds, p.events & libc::POLLOUT != 0 && r & wr != 0);
            ready += set_if(exceptfds, p.events & libc::POLLPRI != 0 && r & ex != 0);
        }
        ready
    })
}

/// `rgetpeername(socket, addr, addrlen)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rgetpeername(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        if !sock.has_address() {
            // SAFETY: the caller's buffer and length.
            return unsafe { write_no_addr(addr, len) };
        }
        match sock.peer_addr() {
            // SAFETY: the caller's buffer and length.
            Ok(a) => unsafe { write_addr(addr, len, a, sock.is_v6()) },
            Err(e) => fail(e.errno().raw()),
        }
    })
}

/// `rgetsockname(socket, addr, addrlen)`: an unbound socket has the wildcard address.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rgetsockname(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        let v6 = sock.is_v6();
        let any = if v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { Ipv4Addr::UNSPECIFIED.into() };
        let a = sock.local_addr().unwrap_or(SocketAddr::new(any, 0));
        // SAFETY: the caller's buffer and length.
        unsafe { write_addr(addr, len, a, v6) }
    })
}

/// An `int` option value.
///
/// # Safety
/// `val` is NULL or readable for `len` bytes.
unsafe fn int_opt(val: *const c_void, len: libc::socklen_t) -> Result<c_int, c_int> {
    if val.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: readable for an int.
    Ok(unsafe { ptr::read_unaligned(val.cast::<c_int>()) })
}

/// `rsetsockopt(socket, level, name, val, len)`: the socket, TCP, IPv6 and `SOL_RDMA` options
/// rsockets knows; others are `ENOTSUP`, as in librdmacm.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        if (level, name) == (libc::SOL_SOCKET, libc::SO_LINGER) {
            if val.is_null() {
                return fail(libc::EFAULT);
            }
            // librdmacm reads the first word alone, whatever the length (measured on rxe).
            if (len as usize) < size_of::<c_int>() {
                return fail(libc::EINVAL);
            }
            // SAFETY: readable for an int, and for a struct linger when it is that long.
            let l = unsafe {
                match (len as usize) < size_of::<libc::linger>() {
                    true => libc::linger { l_onoff: ptr::read_unaligned(val.cast()), l_linger: 0 },
                    false => ptr::read_unaligned(val.cast::<libc::linger>()),
                }
            };
            return res(sock.set_options(|o| o.linger = (l.l_onoff != 0).then_some(l.l_linger)));
        }
        // SAFETY: the caller's value of `len` bytes.
        let v = match unsafe { int_opt(val, len) } {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        let on = v != 0;
        let size = |v: c_int| (v.max(0) as usize) << 1;
        // Queue and inline sizes are the connection's: fixed once it is begun (librdmacm).
        if level == SOL_RDMA && sock.opened() {
            return fail(libc::EINVAL);
        }
        // librdmacm's largest queue.
        let queue = |v: c_int| (v.max(0) as u32).min(0xfffe);
        let r = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => sock.set_options(|o| o.reuse_addr = on),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => sock.set_options(|o| o.keep_alive = on),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => sock.set_options(|o| o.oob_inline = on),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => sock.set_options(|o| o.send_buffer = size(v)),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => sock.set_options(|o| o.recv_buffer = size(v)),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => sock.set_options(|o| o.no_delay = on),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) if v > 0 => {
                sock.set_options(|o| o.keep_idle = v)
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => sock.set_options(|o| o.v6_only = on),
            (SOL_RDMA, RDMA_SQSIZE) => sock.set_options(|o| o.sq_size = queue(v)),
            (SOL_RDMA, RDMA_RQSIZE) => sock.set_options(|o| o.rq_size = queue(v)),
            (SOL_RDMA, RDMA_INLINE) => sock.set_options(|o| o.inline_size = v.max(0) as u32),
            (SOL_RDMA, RDMA_IOMAPSIZE) => {
                sock.set_options(|o| o.iomap_size = v.clamp(0, 16) as u32)
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => return fail(libc::EINVAL),
            // Taken and let be, as librdmacm does.
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => Ok(()),
            _ => return fail(libc::ENOTSUP),
        };
        res(r)
    })
}

/// `rgetsockopt(socket, level, name, val, len)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    on_socket(s, fail, |sock| {
        if val.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the caller's length.
        let room = unsafe { *len } as usize;
        let o = sock.options();
        if (level, name) == (SOL_RDMA, RDMA_ROUTE) {
            // The connection's path as librdmacm gives it: room for one at least, or EINVAL.
            if room < PATH_DATA {
                return fail(libc::EINVAL);
            }
            let data = sock.path().map(|p| path_data(&p));
            let n = data.as_ref().map_or(0, |d| d.len());
            if let Some(d) = data {
                // SAFETY: `room` >= PATH_DATA writable bytes at `val`.
                unsafe { ptr::copy_nonoverlapping(d.as_ptr(), val.cast::<u8>(), d.len()) };
            }
            // SAFETY: the caller's length.
            unsafe { *len = n as libc::socklen_t };
            return 0;
        }
        if (level, name) == (libc::SOL_SOCKET, libc::SO_LINGER) {
            if room < size_of::<libc::linger>() {
                return fail(libc::EINVAL);
            }
            let l = libc::linger {
                l_onoff: c_int::from(o.linger.is_some()),
                // (librdmacm keeps no time: 0.)
                l_linger: 0,
            };
            // SAFETY: writable for a struct linger; its length updated.
            unsafe {
                ptr::write_unaligned(val.cast::<libc::linger>(), l);
                *len = size_of::<libc::linger>() as libc::socklen_t;
            }
            return 0;
        }
        let v: c_int = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuse_addr.into(),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => o.keep_alive.into(),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => o.oob_inline.into(),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => o.send_buffer as c_int,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => o.recv_buffer as c_int,
            (libc::SOL_SOCKET, libc::SO_ERROR) => sock.take_error().map_or(0, |e| e.raw()),
            // (librdmacm 44 does not know SO_TYPE: EOPNOTSUPP. Programs under librspreload
            // ask it of what they think a kernel socket; the true type serves them better.)
            (libc::SOL_SOCKET, libc::SO_TYPE) if sock.is_datagram() => libc::SOCK_DGRAM,
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => o.no_delay.into(),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => sock.max_segment() as c_int,
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => o.keep_idle,
            // Not kept: librdmacm says 1.
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => o.v6_only.into(),
            (SOL_RDMA, RDMA_SQSIZE) => o.sq_size as c_int,
            (SOL_RDMA, RDMA_RQSIZE) => o.rq_size as c_int,
            (SOL_RDMA, RDMA_INLINE) => o.inline_size as c_int,
            (SOL_RDMA, RDMA_IOMAPSIZE) => o.iomap_size as c_int,
            _ => return fail(libc::ENOTSUP),
        };
        if room < size_of::<c_int>() {
            return fail(libc::EINVAL);
        }
        // SAFETY: writable for an int; its length updated.
        unsafe {
            ptr::write_unaligned(val.cast::<c_int>(), v);
            *len = size_of::<c_int>() as libc::socklen_t;
        }
        0
    })
}

/// `rfcntl(socket, cmd, ...)`: `F_GETFL`/`F_SETFL` (`O_NONBLOCK`), `F_GETFD`/`F_SETFD`;
/// others `ENOTSUP`. The one variadic argument arrives where a third argument would (the
/// x86-64 and AArch64 Linux calling conventions pass both alike).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rfcntl(
    s: c_int,
    cmd: c_int,
    arg: usize,
) -> c_int {
    ffi!(fail(libc::EIO), {
        let mut all = SOCKETS.lock();
        let Some(e) = all.get_mut(&s) else { return fail(libc::EBADF) };
        let arg = arg as c_int;
        match cmd {
            libc::F_GETFL => e.fl_flags,
            libc::F_SETFL => {
                e.sock.set_nonblocking(arg & libc::O_NONBLOCK != 0);
                e.fl_flags = arg;
                0
            }
            libc::F_GETFD => e.fd_flags,
            libc::F_SETFD => {
                e.fd_flags = arg;
                0
            }
            _ => fail(libc::ENOTSUP),
        }
    })
}

/// `riomap(socket, buf, len, prot, flags, offset)`: the offset the peer's `riowrite`s use
/// (`buf`'s address for an offset of -1).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__riomap(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    ffi!(-1, {
        let Some(sock) = lookup(s) else { return fail(libc::EBADF).into() };
        if prot & !libc::PROT_WRITE != 0 || buf.is_null() || len == 0 {
            return fail(libc::EINVAL).into();
        }
        // SAFETY: riomap's contract: the memory stays valid until riounmap (or the close).
        let mem = unsafe { RawMemory::new(buf.cast(), len) };
        let offset = u64::try_from(offset).ok();
        match sock.iomap(mem, buf as u64, offset, prot & libc::PROT_WRITE != 0) {
            Ok(o) => o as libc::off_t,
            Err(e) => fail(e.errno().raw()).into(),
        }
    })
}

/// `riounmap(socket, buf, len)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__riounmap(
    s: c_int,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    on_socket(s, fail, |sock| res(sock.iounmap(buf as u64, len)))
}

/// `riowrite(socket, buf, count, offset, flags)`: into the peer's mapping at `offset`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__riowrite(
    s: c_int,
    buf: *const c_void,
    len: usize,
    offset: libc::off_t,
    flags: c_int,
) -> isize {
    on_socket(s, fail_l, |sock| {
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(data) = (unsafe { buf_ref(buf, len) }) else { return fail_l(libc::EFAULT) };
        let Ok(offset) = u64::try_from(offset) else { return fail_l(libc::EINVAL) };
        count(sock.iowrite(data, offset, flags & libc::MSG_DONTWAIT != 0))
    })
}

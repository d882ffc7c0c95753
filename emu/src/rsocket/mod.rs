//! rsockets (librdmacm's `rsocket(7)`): byte-stream sockets whose data travels over RC
//! connections the [connection manager](crate::cm) makes, so that socket programs (through
//! librdmacm's `r*` calls, or Debian's `librspreload.so` under an unmodified program) run on
//! the emulated fabric.
//!
//! A socket is a CM id in `RDMA_PS_TCP` with a channel of its own (the channel's descriptor
//! is the socket's number, as in librdmacm). Connecting makes an RC QP on the id's device and
//! trades a hello (where each side's receive ring is) in the CM's private data; the data path
//! is in `stream`. Only the accepting of connections runs in the background (a thread of
//! its own, as librdmacm's: see `listen_service`); otherwise every call (and [`poll`]) moves
//! the socket's connection and completions along, and blocking calls wait on the CM channel's
//! and the completion channel's descriptors. A datagram rsocket is a UD QP (see `dgram`).

mod dgram;
mod listen_service;
mod poll;
mod stream;
mod wire;

use std::{
    collections::VecDeque,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, OwnedFd, RawFd},
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use crate::sync::{Mutex, MutexGuard};

pub use self::poll::{PollEntry, PollTarget, poll};
use self::{
    dgram::{Dgram, Queues},
    stream::{Sizes, Stream},
    wire::{Hello, MAX_CREDITS, MAX_RING, MIN_RING},
};
use crate::{
    Fabric,
    cm::{CmChannel, CmEvent, CmEventType, CmId, ConnParam, PortSpace},
    error::{Errno, Error, Result},
    mem::RawMemory,
    sys,
    types::AccessFlags,
};

/// How long a resolution may take (the connection manager answers at once here).
const RESOLVE_MS: u32 = 2000;
/// How long closing waits for what was written to reach the peer.
const LINGER: Duration = Duration::from_secs(5);
/// How many accepted connections wait for `raccept` on a listener before its service accepts
/// no more (later requests wait for an answer, as many as the listener's backlog, and the CM
/// refuses those beyond): librdmacm's service queues each on a socketpair, whose default
/// buffer (`net.core.wmem_default`, 212,992 bytes on Debian 12) takes 278 such writes; it
/// accepts the 279th, and that one's write blocks its thread (every listener of the process's
/// with it) until `raccept` reads.
const ACCEPT_QUEUE: usize = 279;
/// Longest single sleep of a blocking call: a completion event another thread took cannot
/// delay it longer than this.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// The options of a socket (`rsetsockopt` / `rgetsockopt`). Buffer sizes and queue sizes are
/// used by the next connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub reuse_addr: bool,
    pub keep_alive: bool,
    pub no_delay: bool,
    pub oob_inline: bool,
    /// `SO_LINGER`: on (librdmacm's default), and the seconds.
    pub linger: Option<i32>,
    /// `SO_SNDBUF` / `SO_RCVBUF` as the socket reports them (twice what was set, as Linux).
    pub send_buffer: usize,
    pub recv_buffer: usize,
    /// `TCP_KEEPIDLE`, seconds.
    pub keep_idle: i32,
    /// `IPV6_V6ONLY`.
    pub v6_only: bool,
    /// `SOL_RDMA` options: queue sizes, inline size, and how many mappings the peer may
    /// announce to us (`RDMA_IOMAPSIZE`, at most 16; 0 by default).
    pub sq_size: u32,
    pub rq_size: u32,
    pub inline_size: u32,
    pub iomap_size: u32,
}

impl Default for Options {
    /// librdmacm's defaults: 128 KiB buffers, 384-entry queues, 64 bytes inline, no I/O maps,
    /// lingering on, no keepalive time (each read back on rxe).
    fn default() -> Options {
        Options {
            reuse_addr: false,
            keep_alive: false,
            no_delay: false,
            oob_inline: false,
            linger: Some(0),
            send_buffer: 1 << 17,
            recv_buffer: 1 << 17,
            keep_idle: 0,
            v6_only: false,
            sq_size: 384,
            rq_size: 384,
            inline_size: 64,
            iomap_size: 0,
        }
    }
}

impl Options {
    /// What an accepted socket takes of its listener's options: the buffer, queue, inline
    /// and I/O map sizes; the flags start over (librdmacm's `rs_alloc`, measured on rxe).
    fn inherited(&self) -> Options {
        Options {
            send_buffer: self.send_buffer,
            recv_buffer: self.recv_buffer,
            sq_size: self.sq_size,
            rq_size: self.rq_size,
            inline_size: self.inline_size,
            iomap_size: self.iomap_size,
            ..Options::default()
        }
    }

    fn sizes(&self) -> Sizes {
        Sizes {
            ring: self.recv_buffer.clamp(MIN_RING, MAX_RING),
            sbuf: self.send_buffer.clamp(MIN_RING, MAX_RING),
            credits: self.rq_size.clamp(2, u32::from(MAX_CREDITS)) as u16,
            sq: self.sq_size.clamp(16, 1024),
        }
    }
}

/// Which directions [`RSocket::shutdown`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    Read,
    Write,
    Both,
}

/// Flags of a receive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvFlags {
    /// `MSG_DONTWAIT`.
    pub dont_wait: bool,
    /// `MSG_PEEK`: the bytes stay to be read again.
    pub peek: bool,
    /// `MSG_WAITALL`: blocks until the whole buffer is filled (or the stream ends).
    pub wait_all: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Listening,
    /// Active side: the address and route are being resolved.
    Resolving,
    /// Active side: the request is out.
    Connecting,
    /// Passive side: accepted, waiting for the connection to be established.
    Accepting,
    Connected,
    /// The connection could not be made (`error` says why).
    Failed,
    Closed,
}

/// An rsocket. Cheap to clone; [`RSocket::close`] ends it.
#[derive(Debug, Clone)]
pub struct RSocket(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    fabric: Fabric,
    channel: CmChannel,
    st: Mutex<St>,
    /// A datagram socket's state (`st` then only keeps its options and flags).
    dgram: Option<Mutex<Dgram>>,
    /// An accepted socket's number, given as `raccept` takes it (see [`RSocket::renumber`]).
    number: OnceLock<OwnedFd>,
}

#[derive(Debug)]
struct St {
    phase: Phase,
    id: CmId,
    v6: bool,
    nonblocking: bool,
    opts: Options,
    stream: Option<Stream>,
    /// Listener: connection requests not yet accepted.
    requests: VecDeque<CmEvent>,
    /// Listener: the sockets of requests accepted (by the listen service or a `raccept`),
    /// waiting for `raccept` to take them.
    accepted: VecDeque<RSocket>,
    /// Listener: requests taken out of `requests` and being accepted (by the listen service or
    /// a `raccept`), not yet in `accepted`: a poll counts them, so a `raccept` after it waits
    /// for them rather than saying `EAGAIN` (librdmacm's listener is readable only once its
    /// service queued the socket).
    accepting: usize,
    /// Listener: posted once for each socket in `accepted` (taken with it), which a sleep in
    /// `raccept` or `rpoll` wakes on (librdmacm's accept queue is a socketpair).
    backlog_bell: Option<sys::EventFd>,
    /// Why the connection could not be made or broke (`SO_ERROR` reads and clears it).
    error: Option<Errno>,
    /// The CM says the connection ended.
    disconnected: bool,
    shut_rd: bool,
    shut_wr: bool,
}

fn err(errno: i32, why: &'static str) -> Error {
    Error::new(Errno(errno), why)
}

/// The IPv4 address an IPv4-mapped IPv6 address stands for (how a dual-stack socket names
/// an IPv4 peer).
fn unmapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

impl RSocket {
    /// `rsocket(AF_INET or AF_INET6, SOCK_STREAM, 0)` on `fabric`.
    pub fn new(fabric: &Fabric, v6: bool) -> Result<RSocket> {
        let channel = CmChannel::new(fabric)?;
        channel.set_nonblocking(true)?;
        let id = CmId::create(&channel, PortSpace::Tcp)?;
        Ok(RSocket::with(fabric, channel, id, v6, Phase::Open, Options::default()))
    }

    fn with(
        fabric: &Fabric,
        channel: CmChannel,
        id: CmId,
        v6: bool,
        phase: Phase,
        opts: Options,
    ) -> RSocket {
        RSocket(Arc::new(Inner {
            fabric: fabric.clone(),
            dgram: None,
            number: OnceLock::new(),
            channel,
            st: Mutex::new(St {
                phase,
                id,
                v6,
                nonblocking: false,
                opts,
                stream: None,
                requests: VecDeque::new(),
                accepted: VecDeque::new(),
                accepting: 0,
                backlog_bell: None,
                error: None,
                disconnected: false,
                shut_rd: false,
                shut_wr: false,
            }),
        }))
    }

    /// `rsocket(AF_INET or AF_INET6, SOCK_DGRAM, 0)` on `fabric`: a datagram socket over a UD
    /// QP (see `dgram`).
    pub fn new_dgram(fabric: &Fabric, v6: bool) -> Result<RSocket> {
        let channel = CmChannel::new(fabric)?;
        channel.set_nonblocking(true)?;
        let d = Dgram::new(&channel, v6, Queues::of(&Options::default()))?;
        let id = d.id().clone();
        let s = RSocket::with(fabric, channel, id, v6, Phase::Open, Options::default());
        let mut inner = Arc::try_unwrap(s.0).expect("just made");
        inner.dgram = Some(Mutex::new(d));
        Ok(RSocket(Arc::new(inner)))
    }

    /// A datagram socket's state, with its CM events and completions taken in.
    fn dgram(&self) -> Option<MutexGuard<'_, Dgram>> {
        let mut d = self.0.dgram.as_ref()?.lock();
        d.progress(&self.0.channel);
        Some(d)
    }

    /// Sleeps until something may have changed for a datagram socket (a slice at most).
    fn dgram_wait(&self, mut d: MutexGuard<'_, Dgram>) -> Result<()> {
        let mut fds = vec![self.0.channel.as_raw_fd()];
        fds.extend(d.arm());
        if d.progress(&self.0.channel) {
            return Ok(());
        }
        drop(d);
        // As a stream socket's wait: a datagram that comes within the look costs no wake-up
        // (one of each thread a hop, which a ping-pong of datagrams paid both ways).
        if !self.look_before_sleeping(|| self.woken(), None) {
            let mut pfds: Vec<libc::pollfd> = fds
                .iter()
                .map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            sys::poll(&mut pfds, Some(WAIT_SLICE))
                .map_err(|e| err(e.raw_os_error().unwrap_or(libc::EIO), "poll failed"))?;
        }
        if let Some(m) = &self.0.dgram {
            m.lock().drain();
        }
        Ok(())
    }

    /// `rsendto`: a datagram to `dest` (the first to a destination waits while its QP is
    /// found; nobody there: dropped, as UDP). `EISCONN` on a stream socket.
    pub fn send_to(&self, data: &[u8], dest: SocketAddr, dont_wait: bool) -> Result<usize> {
        if self.0.dgram.is_none() {
            return Err(err(libc::EISCONN, "a stream socket takes no destination"));
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(RESOLVE_MS));
        loop {
            let mut d = self.dgram().expect("datagram");
            if d.closed {
                return Err(err(libc::EBADF, "the socket is closed"));
            }
            if (dont_wait || self.is_nonblocking()) && !d.writable() {
                return Err(Error::new(Errno::EAGAIN, "no send slot free"));
            }
            let (fabric, channel) = (&self.0.fabric, &self.0.channel);
            if let Some(n) = d.send_to(fabric, channel, data, unmapped(dest))? {
                return Ok(n);
            }
            if Instant::now() >= deadline {
                return Ok(data.len()); // never answered: dropped, as UDP would
            }
            self.dgram_wait(d)?;
        }
    }

    /// `rrecvfrom`: the next datagram, cut to `out` (its length then `out.len()`), and its
    /// sender; a stream socket's bytes and no address.
    pub fn recv_from(
        &self,
        out: &mut [u8],
        flags: RecvFlags,
    ) -> Result<(usize, Option<SocketAddr>)> {
        if self.0.dgram.is_none() {
            return Ok((self.recv(out, flags)?, None));
        }
        loop {
            let mut d = self.dgram().expect("datagram");
            if d.closed {
                return Err(err(libc::EBADF, "the socket is closed"));
            }
            // Not bound (nor sent from) yet: nothing could come, librdmacm says EINVAL.
            if !d.bound() {
                return Err(err(libc::EINVAL, "the datagram socket is not bound"));
            }
            if let Some((whole, from)) = d.recv_from(out, flags.peek) {
                return Ok((whole.min(out.len()), Some(from)));
            }
            if flags.dont_wait || self.is_nonblocking() {
                return Err(Error::new(Errno::EAGAIN, "no datagram"));
            }
            self.dgram_wait(d)?;
        }
    }

    /// The socket's number: its CM channel's descriptor (unique while the socket lives), or
    /// a second one of it that an accepted socket got in `raccept`.
    pub fn number(&self) -> RawFd {
        self.0.number.get().map_or_else(|| self.0.channel.as_raw_fd(), AsRawFd::as_raw_fd)
    }

    /// Numbers a socket the listen service accepted as `raccept` takes it: the lowest free
    /// descriptor now, as if its channel were made now (as it was when `raccept` accepted).
    /// Debian's librspreload (rdma-core 44) maps `select`'s answer back to the program's
    /// descriptors by scanning them upward for the first whose socket number matches (fixed
    /// in rdma-core 63), so a socket numbered below the descriptor it opened for it before
    /// `raccept` reads as another descriptor's: `select` says ready and the program, finding
    /// its own socket not, spins (socat serving wget and curl did). Without a descriptor to
    /// spare, the channel's own stays the number.
    fn renumber(&self) {
        if let Ok(fd) = self.0.channel.duplicate_fd() {
            let _ = self.0.number.set(fd);
        }
    }

    /// Whether `self` and `other` are the same socket.
    pub fn same(&self, other: &RSocket) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The socket's state, with every CM event and completion taken into account.
    fn lock(&self) -> MutexGuard<'_, St> {
        let mut st = self.0.st.lock();
        let waiting = st.requests.len();
        st.progress(&self.0.channel);
        // A request this call took off a listener's channel was taken from under the listen
        // service's watch (the channel reads empty again): it is told, or the request waited
        // for a `raccept` that a program waiting on its client may never make.
        if st.requests.len() > waiting {
            listen_service::changed();
        }
        st
    }

    /// Sleeps until something may have changed for the socket (an event, a completion), at
    /// most until `deadline`. `EINTR` when a signal interrupts the wait.
    fn wait(&self, mut st: MutexGuard<'_, St>, deadline: Option<Instant>) -> Result<()> {
        if let Some(s) = &st.stream {
            s.arm();
        }
        // A completion between the caller's look and the arming is not lost.
        if st.stream.as_mut().is_some_and(|s| s.process()) {
            return Ok(());
        }
        let fds = st.wake_fds(&self.0.channel);
        drop(st);
        if !self.look_before_sleeping(|| self.woken(), deadline) {
            let slice =
                deadline.map_or(WAIT_SLICE, |d| d.saturating_duration_since(Instant::now()));
            let mut pfds: Vec<libc::pollfd> = fds
                .iter()
                .map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            sys::poll(&mut pfds, Some(slice.min(WAIT_SLICE)))
                .map_err(|e| err(e.raw_os_error().unwrap_or(libc::EIO), "poll failed"))?;
        }
        if let Some(s) = &self.0.st.lock().stream {
            s.drain_events();
        }
        Ok(())
    }

    /// `rbind`.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        if let Some(mut d) = self.dgram() {
            return d.bind(&self.0.fabric, unmapped(addr));
        }
        let st = self.lock();
        if st.phase != Phase::Open {
            return Err(err(libc::EINVAL, "the socket is bound or connected already"));
        }
        st.id.bind_addr(unmapped(addr))
    }

    /// `rlisten`: an unbound socket listens on the wildcard address, on a port picked for it.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        if self.0.dgram.is_some() {
            return Err(Error::new(Errno::EOPNOTSUPP, "a datagram socket does not listen"));
        }
        let mut st = self.lock();
        match st.phase {
            Phase::Listening => return Ok(()),
            Phase::Open => {}
            _ => return Err(err(libc::EINVAL, "the socket is connected")),
        }
        if st.id.local_addr().is_none() {
            let any = if st.v6 {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                Ipv4Addr::UNSPECIFIED.into()
            };
            st.id.bind_addr(SocketAddr::new(any, 0))?;
        }
        let bell = sys::EventFd::new()
            .map_err(|e| err(e.raw_os_error().unwrap_or(libc::EMFILE), "no descriptor"))?;
        st.id.listen(backlog)?;
        st.phase = Phase::Listening;
        st.backlog_bell = Some(bell);
        drop(st);
        listen_service::watch(self);
        Ok(())
    }

    /// `raccept`: the next connection (accepted already by the listen service, or now);
    /// `EAGAIN` when none waits on a non-blocking socket.
    pub fn accept(&self) -> Result<RSocket> {
        if self.0.dgram.is_some() {
            return Err(Error::new(Errno::EOPNOTSUPP, "a datagram socket does not accept"));
        }
        listen_service::ensure();
        let new = loop {
            let mut st = self.lock();
            if st.phase != Phase::Listening {
                // (librdmacm's answer, measured on rxe; TCP's is `EINVAL`.)
                return Err(err(libc::EBADF, "the socket is not listening"));
            }
            let full = !st.accept_queue_room();
            if let Some(new) = st.accepted.pop_front() {
                if let Some(bell) = &st.backlog_bell {
                    bell.try_take();
                }
                if full {
                    // The service watches the listener again.
                    listen_service::changed();
                }
                break new;
            }
            if !st.requests.is_empty() {
                drop(st);
                self.serve();
                continue;
            }
            if st.nonblocking && st.accepting == 0 {
                return Err(Error::new(Errno::EAGAIN, "no connection waits"));
            }
            self.wait(st, None)?;
        };
        new.renumber();
        if !new.is_nonblocking() {
            new.wait_connected()?;
        }
        Ok(new)
    }

    /// A listener's: whether its accept queue has room (`None`: it no longer listens; its
    /// state as it stands, no event taken in).
    fn accept_queue_room(&self) -> Option<bool> {
        let st = self.0.st.lock();
        (st.phase == Phase::Listening).then(|| st.accept_queue_room())
    }

    /// A listener accepts the connection requests that wait, queueing their sockets for
    /// `raccept` (librdmacm's `rs_accept`: the new socket takes the listener's `O_NONBLOCK`
    /// as it is now); a request that cannot be accepted (not an rsocket's, or no resources)
    /// is rejected and forgotten, as there.
    fn serve(&self) {
        loop {
            let (ev, v6, opts, nonblocking) = {
                let mut st = self.lock();
                if st.phase != Phase::Listening {
                    return;
                }
                if !st.accept_queue_room() {
                    return;
                }
                let Some(ev) = st.requests.pop_front() else { return };
                st.accepting += 1;
                (ev, st.v6, st.opts.inherited(), st.nonblocking)
            };
            // (Not under `st`: the accept makes a QP and answers the peer.)
            let new = RSocket::accepted(&self.0.fabric, ev, v6, opts);
            let mut st = self.0.st.lock();
            st.accepting -= 1;
            let Ok(new) = new else { continue };
            new.0.st.lock().nonblocking = nonblocking;
            match (st.phase, &st.backlog_bell) {
                (Phase::Listening, Some(bell)) => {
                    bell.post();
                    st.accepted.push_back(new);
                }
                // Closed meanwhile: as the connections it had accepted.
                _ => {
                    drop(st);
                    let _ = new.close();
                }
            }
        }
    }

    /// The socket of a connection request, accepted (its connection is being established).
    fn accepted(fabric: &Fabric, ev: CmEvent, v6: bool, opts: Options) -> Result<RSocket> {
        let id = ev.id;
        let refuse = |id: &CmId, e: Error| {
            let _ = id.reject(&[]);
            let _ = id.destroy();
            e
        };
        let Some(hello) = Hello::decode(&ev.param.private_data) else {
            return Err(refuse(&id, err(libc::ECONNABORTED, "the peer is not an rsocket")));
        };
        let channel = match CmChannel::new(fabric) {
            Ok(c) => c,
            Err(e) => return Err(refuse(&id, e)),
        };
        let setup = || -> Result<Stream> {
            channel.set_nonblocking(true)?;
            id.migrate(&channel)?;
            let ctx = id.context().ok_or(err(libc::ENODEV, "the id has no device"))?;
            let mut s = Stream::new(&ctx, opts.sizes(), opts.iomap_size as usize)?;
            s.set_peer(hello);
            id.set_qp(&s.qp)?;
            s.post_receives()?;
            id.accept(&conn_param(&s))?;
            Ok(s)
        };
        let stream = setup().map_err(|e| refuse(&id, e))?;
        let sock = RSocket::with(fabric, channel, id, v6, Phase::Accepting, opts);
        sock.0.st.lock().stream = Some(stream);
        Ok(sock)
    }

    /// `rconnect`: connects to `addr`; on a non-blocking socket the connection goes on in the
    /// background of later calls and this says `EINPROGRESS`.
    pub fn connect(&self, addr: SocketAddr) -> Result<()> {
        if let Some(mut d) = self.dgram() {
            // A datagram socket's default destination and only source.
            d.connect(unmapped(addr));
            return Ok(());
        }
        let mut st = self.lock();
        match st.phase {
            Phase::Open => {}
            Phase::Resolving | Phase::Connecting => {
                return Err(err(libc::EALREADY, "a connection is being made"));
            }
            // Connected already: librdmacm's answer is 0.
            Phase::Connected => return Ok(()),
            Phase::Accepting => return Err(err(libc::EISCONN, "the socket is connected")),
            Phase::Failed => return Err(err(libc::ENOTCONN, "the connection failed")),
            _ => return Err(err(libc::EINVAL, "the socket cannot connect")),
        }
        st.id.resolve_addr(None, unmapped(addr), RESOLVE_MS)?;
        st.phase = Phase::Resolving;
        st.progress(&self.0.channel);
        if st.nonblocking {
            // In progress even if a listen service accepted meanwhile (on the in-process
            // fabric, it may have): librdmacm's waits for its peer's answer, never there
            // within the call, and a program may count on it.
            return match st.phase {
                Phase::Failed => {
                    let e = st.error.take().unwrap_or(Errno(libc::ECONNREFUSED));
                    Err(Error::new(e, "connect failed"))
                }
                _ => Err(err(libc::EINPROGRESS, "connecting")),
            };
        }
        drop(st);
        self.wait_connected()
    }

    fn wait_connected(&self) -> Result<()> {
        loop {
            let mut st = self.lock();
            match st.phase {
                Phase::Connected => return Ok(()),
                Phase::Failed => {
                    let e = st.error.take().unwrap_or(Errno(libc::ECONNREFUSED));
                    return Err(Error::new(e, "connect failed"));
                }
                Phase::Resolving | Phase::Connecting | Phase::Accepting => self.wait(st, None)?,
                _ => return Err(err(libc::ENOTCONN, "not connected")),
            }
        }
    }

    /// The error that stops a transfer now, if any.
    fn check(st: &St, writing: bool) -> Result<()> {
        match st.phase {
            Phase::Connected | Phase::Resolving | Phase::Connecting | Phase::Accepting => Ok(()),
            // A failed connection reads as ended and refuses writes as reset, as librdmacm's
            // (measured on rxe after a refused connect).
            Phase::Failed if writing => Err(err(libc::ECONNRESET, "the connection failed")),
            Phase::Failed => Ok(()),
            Phase::Closed => Err(err(libc::EBADF, "the socket is closed")),
            Phase::Open | Phase::Listening => Err(err(libc::ENOTCONN, "not connected")),
        }?;
        if writing && st.shut_wr {
            return Err(err(libc::EPIPE, "the socket was shut down for writing"));
        }
        Ok(())
    }

    /// `rsend`: all of `data` unless the socket is non-blocking (or `dont_wait`), in which
    /// case what fits now (`EAGAIN` when nothing does).
    pub fn send(&self, data: &[u8], dont_wait: bool) -> Result<usize> {
        if let Some(d) = self.dgram() {
            let peer = d.peer.ok_or(err(libc::EDESTADDRREQ, "not connected"))?;
            drop(d);
            return self.send_to(data, peer, dont_wait);
        }
        self.transfer(data.len(), dont_wait, |s, done| Ok(s.send(&data[done..])))
    }

    /// Moves `len` bytes out, `step` taking what it can now (given the stream and how many are
    /// done; it says how many more went): all of them unless the socket is non-blocking (or
    /// `dont_wait`), then what fits now (`EAGAIN` when nothing does). Bytes moved before a
    /// failure are reported, the failure then comes with the next call.
    fn transfer(
        &self,
        len: usize,
        dont_wait: bool,
        mut step: impl FnMut(&mut Stream, usize) -> Result<usize>,
    ) -> Result<usize> {
        let mut done = 0;
        loop {
            let mut st = self.lock();
            let nb = dont_wait || st.nonblocking;
            Self::check(&st, true)?;
            if st.phase == Phase::Connected {
                let disconnected = st.disconnected;
                let s = st.stream.as_mut().expect("connected");
                if let Some(e) = s.error {
                    return partial(done, Error::new(e, "connection broken"));
                }
                if disconnected {
                    return partial(done, err(libc::ECONNRESET, "the peer ended the connection"));
                }
                done += step(s, done)?;
                if done == len {
                    return Ok(done);
                }
            }
            if nb {
                return partial(done, Error::new(Errno::EAGAIN, "no room"));
            }
            self.wait(st, None)?;
        }
    }

    /// `rrecv`: the bytes there are (blocking until some come, unless non-blocking), 0 at the
    /// end of the stream.
    pub fn recv(&self, out: &mut [u8], flags: RecvFlags) -> Result<usize> {
        if self.0.dgram.is_some() {
            return Ok(self.recv_from(out, flags)?.0);
        }
        let mut done = 0;
        loop {
            let mut st = self.lock();
            let nb = flags.dont_wait || st.nonblocking;
            Self::check(&st, false)?;
            if st.phase == Phase::Failed {
                return Ok(done);
            }
            if st.phase == Phase::Connected {
                let ended = st.disconnected || st.shut_rd;
                let s = st.stream.as_mut().expect("connected");
                if s.readable() > 0 && !out.is_empty() {
                    done += s.recv(&mut out[done..], flags.peek);
                    if !flags.wait_all || flags.peek || done == out.len() {
                        return Ok(done);
                    }
                    continue;
                }
                if s.fin_in || ended || out.is_empty() {
                    return Ok(done);
                }
                if let Some(e) = s.error {
                    return partial(done, Error::new(e, "connection broken"));
                }
            }
            if nb {
                return partial(done, Error::new(Errno::EAGAIN, "no data"));
            }
            self.wait(st, None)?;
        }
    }

    /// `rshutdown`.
    pub fn shutdown(&self, how: Shutdown) -> Result<()> {
        if let Some(d) = self.dgram() {
            return d.peer.map(|_| ()).ok_or(err(libc::ENOTCONN, "not connected"));
        }
        let mut st = self.lock();
        if matches!(st.phase, Phase::Failed | Phase::Open | Phase::Listening) {
            // Nothing to end: librdmacm's answer is 0 (measured on rxe; TCP's `ENOTCONN`).
            return Ok(());
        }
        if st.phase != Phase::Connected {
            return Err(err(libc::ENOTCONN, "not connected"));
        }
        if how != Shutdown::Write {
            st.shut_rd = true;
        }
        if how != Shutdown::Read && !st.shut_wr {
            st.shut_wr = true;
            drop(st);
            self.finish_writing()?;
            st = self.lock();
        }
        if how == Shutdown::Both && !st.disconnected {
            let _ = st.id.disconnect();
            st.disconnected = true;
        }
        Ok(())
    }

    /// Sends the FIN after everything written and waits (a while) until all of it is there.
    fn finish_writing(&self) -> Result<()> {
        let deadline = Instant::now() + LINGER;
        loop {
            let mut st = self.lock();
            let dead = st.disconnected || Instant::now() >= deadline;
            let Some(s) = st.stream.as_mut() else { return Ok(()) };
            if s.error.is_some() || dead || (s.send_fin() && s.all_sent()) {
                return Ok(());
            }
            self.wait(st, Some(deadline))?;
        }
    }

    /// `rclose`: a connection still up ends in order (the peer reads everything written, then
    /// the end of the stream); requests waiting on a listener are refused.
    pub fn close(&self) -> Result<()> {
        if let Some(mut d) = self.dgram() {
            if d.closed {
                return Err(err(libc::EBADF, "the socket is closed"));
            }
            d.close();
            return Ok(());
        }
        let phase = self.lock().phase;
        if phase == Phase::Closed {
            return Err(err(libc::EBADF, "the socket is closed"));
        }
        if phase == Phase::Connected && !self.0.st.lock().disconnected {
            let _ = self.shutdown(Shutdown::Both);
        }
        let mut st = self.0.st.lock();
        let listened = st.phase == Phase::Listening;
        st.phase = Phase::Closed;
        for ev in st.requests.drain(..) {
            let _ = ev.id.reject(&[]);
            let _ = ev.id.destroy();
        }
        // Accepted, never taken: ended as a TCP listener's backlog is at its close.
        let accepted: Vec<RSocket> = st.accepted.drain(..).collect();
        st.backlog_bell = None;
        let _ = st.id.destroy();
        if let Some(s) = st.stream.take() {
            s.destroy();
        }
        drop(st);
        for s in accepted {
            let _ = s.close();
        }
        if listened {
            listen_service::changed();
        }
        Ok(())
    }

    /// `rgetsockname`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        if let Some(m) = &self.0.dgram {
            return m.lock().local_addr();
        }
        self.0.st.lock().id.local_addr()
    }

    /// `rgetpeername`: a datagram socket's destination (`ENOTCONN` without one); a stream
    /// socket's peer, the unspecified address of its family before it has one (librdmacm
    /// copies its id's destination whatever the state, measured on rxe; for a socket neither
    /// bound nor connected that is no address at all: see [`RSocket::has_address`]).
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        if let Some(m) = &self.0.dgram {
            return m.lock().peer.ok_or(err(libc::ENOTCONN, "not connected"));
        }
        let st = self.lock();
        let none = match st.v6 {
            true => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
            false => SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)),
        };
        Ok(st.id.peer_addr().unwrap_or(none))
    }

    /// Whether a stream socket's id names an address yet (bound, or connecting): before,
    /// librdmacm's `rgetpeername` copies an id's empty destination, of no family (measured on
    /// rxe). A datagram socket always has.
    pub fn has_address(&self) -> bool {
        if self.0.dgram.is_some() {
            return true;
        }
        let st = self.0.st.lock();
        st.id.local_addr().is_some() || st.id.peer_addr().is_some()
    }

    /// The path of the socket's connection, once it has one (`RDMA_ROUTE`).
    pub fn path(&self) -> Option<crate::cm::PathRecord> {
        if self.0.dgram.is_some() {
            return None;
        }
        self.0.st.lock().id.path()
    }

    /// `TCP_MAXSEG` as librdmacm reads it: the MTU of the connection's path, 2,048 before it
    /// has one.
    pub fn max_segment(&self) -> usize {
        self.path().and_then(|p| p.mtu.bytes()).map_or(2048, |b| b as usize)
    }

    /// Whether the socket is IPv6 (`AF_INET6`).
    pub fn is_v6(&self) -> bool {
        self.0.st.lock().v6
    }

    /// Whether the socket is a datagram one (`SOCK_DGRAM`).
    pub fn is_datagram(&self) -> bool {
        self.0.dgram.is_some()
    }

    /// `O_NONBLOCK`.
    pub fn set_nonblocking(&self, on: bool) {
        self.0.st.lock().nonblocking = on;
    }

    pub fn is_nonblocking(&self) -> bool {
        self.0.st.lock().nonblocking
    }

    pub fn options(&self) -> Options {
        self.0.st.lock().opts
    }

    /// Changes the options; the ones the CM id holds (address reuse, IPv6 only) take effect
    /// if the socket is not bound yet.
    pub fn set_options(&self, f: impl FnOnce(&mut Options)) -> Result<()> {
        let mut st = self.0.st.lock();
        let mut o = st.opts;
        f(&mut o);
        if st.phase == Phase::Open && st.id.local_addr().is_none() {
            if o.reuse_addr != st.opts.reuse_addr {
                st.id.set_reuse_addr(o.reuse_addr)?;
            }
            if o.v6_only != st.opts.v6_only {
                st.id.set_af_only(o.v6_only)?;
            }
        }
        st.opts = o;
        // (Not under `st`: a datagram socket's calls take `st` under `dgram`.)
        drop(st);
        if let Some(d) = &self.0.dgram {
            d.lock().set_queues(Queues::of(&o));
        }
        Ok(())
    }

    /// Whether the socket's connection has begun (`SOL_RDMA` options may no longer change).
    pub fn opened(&self) -> bool {
        self.0.dgram.is_none() && !matches!(self.0.st.lock().phase, Phase::Open | Phase::Listening)
    }

    /// `SO_ERROR`: the pending error, cleared.
    pub fn take_error(&self) -> Option<Errno> {
        if self.0.dgram.is_some() {
            return None;
        }
        let mut st = self.lock();
        let stream_error = st.stream.as_ref().and_then(|s| s.error);
        if st.phase == Phase::Failed {
            return st.error.take();
        }
        st.error.take().or(stream_error)
    }

    /// `riomap`: lets the peer write `mem` (at address `addr`) through `riowrite` at offsets
    /// `offset..` (the memory's own address when `None`); returns the offset. Without `writable` (PROT_NONE)
    /// it is only registered. `ENOMEM` when no mapping slot is free (the peer's
    /// `RDMA_IOMAPSIZE` when connecting: the size of its table of our mappings), `EINVAL`
    /// before the connection is (being) made.
    pub fn iomap(
        &self,
        mem: RawMemory,
        addr: u64,
        offset: Option<u64>,
        writable: bool,
    ) -> Result<u64> {
        let mut st = self.lock();
        let Some(s) = st.stream.as_mut() else {
            return Err(err(libc::EINVAL, "not connected"));
        };
        let mut access = AccessFlags::LOCAL_WRITE;
        if writable {
            access |= AccessFlags::REMOTE_WRITE;
        }
        let mr = s.pd.reg_mr_raw(mem, addr, access)?;
        let offset = offset.unwrap_or(addr);
        if let Err(e) = s.map(mr.clone(), offset, writable) {
            let _ = mr.dereg();
            return Err(e);
        }
        Ok(offset)
    }

    /// `riounmap`: ends the mapping of the `len` bytes at `addr`.
    pub fn iounmap(&self, addr: u64, len: usize) -> Result<()> {
        let mut st = self.lock();
        let s = st.stream.as_mut().ok_or(err(libc::EINVAL, "no mapping of that memory"))?;
        let mr = s.unmap(addr, len)?;
        let _ = mr.dereg();
        Ok(())
    }

    /// `riowrite`: writes `data` into the peer's mapping at `offset` (all of it unless
    /// non-blocking or `dont_wait`).
    pub fn iowrite(&self, data: &[u8], offset: u64, dont_wait: bool) -> Result<usize> {
        self.transfer(data.len(), dont_wait, |s, done| {
            s.iowrite(&data[done..], offset + done as u64)
        })
    }

    /// The `poll` events that hold now, of `events` (plus `POLLERR`/`POLLHUP`, always
    /// reported).
    pub(crate) fn poll_events(&self, events: i16) -> i16 {
        if let Some(d) = self.dgram() {
            let ev = if d.closed {
                libc::POLLNVAL
            } else {
                (if d.readable() { libc::POLLIN } else { 0 })
                    | (if d.writable() { libc::POLLOUT } else { 0 })
            };
            return ev & (events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL);
        }
        let st = self.lock();
        st.events() & (events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL)
    }

    /// Arms the socket's completion events; the descriptors a sleep must watch for it.
    pub(crate) fn arm(&self) -> Vec<RawFd> {
        if let Some(m) = &self.0.dgram {
            let mut fds = vec![self.0.channel.as_raw_fd()];
            fds.extend(m.lock().arm());
            return fds;
        }
        let st = self.0.st.lock();
        if let Some(s) = &st.stream {
            s.arm();
        }
        st.wake_fds(&self.0.channel)
    }

    /// Whether an event that a sleep on the socket wakes on has come (a look without a system
    /// call; its completion events must be armed).
    pub(crate) fn woken(&self) -> bool {
        if self.0.channel.ready() {
            return true;
        }
        if let Some(m) = &self.0.dgram {
            return m.lock().woken();
        }
        let st = self.0.st.lock();
        !st.accepted.is_empty() || st.stream.as_ref().is_some_and(|s| s.comp.ready())
    }

    /// Before a sleep on the socket (and others: `ready`), looks for what it waits for as a
    /// verbs program's wait for a CQ event does (see `objects::channel`): the answer often
    /// comes within the look, which moves it itself (an ACK that frees the send buffer, the
    /// WRITEs of a peer's reader that lags carried out). Whether `ready` came to hold.
    pub(crate) fn look_before_sleeping(
        &self,
        ready: impl Fn() -> bool,
        deadline: Option<Instant>,
    ) -> bool {
        crate::objects::channel::look_before_sleeping(&self.0.fabric.0, &ready, deadline);
        ready()
    }

    /// Takes the completion events that woke a sleep.
    pub(crate) fn drain(&self) {
        if let Some(m) = &self.0.dgram {
            return m.lock().drain();
        }
        if let Some(s) = &self.0.st.lock().stream {
            s.drain_events();
        }
    }
}

/// `done` bytes if any moved, else the error that stopped the transfer.
fn partial(done: usize, e: Error) -> Result<usize> {
    if done > 0 { Ok(done) } else { Err(e) }
}

/// What an rsocket asks of (and offers in) a connection.
fn conn_param(s: &Stream) -> ConnParam {
    ConnParam {
        private_data: s.hello().encode(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

impl St {
    /// What a sleep on the socket watches: its CM channel's descriptor, its completion
    /// channel's, a listener's backlog's.
    fn wake_fds(&self, channel: &CmChannel) -> Vec<RawFd> {
        let mut fds = vec![channel.as_raw_fd()];
        fds.extend(self.stream.as_ref().map(|s| s.comp.as_raw_fd()));
        fds.extend(self.backlog_bell.as_ref().map(|b| b.as_raw_fd()));
        fds
    }

    /// Takes every CM event and completion the socket has.
    fn progress(&mut self, channel: &CmChannel) {
        while let Some(ev) = channel.queued_event() {
            self.on_event(ev);
        }
        if let Some(s) = &mut self.stream {
            s.process();
        }
    }

    fn fail(&mut self, e: i32) {
        self.phase = Phase::Failed;
        self.error = Some(Errno(e));
    }

    fn on_event(&mut self, ev: CmEvent) {
        use CmEventType as E;
        if ev.event == E::ConnectRequest {
            if self.phase == Phase::Listening {
                self.requests.push_back(ev);
            } else {
                let _ = ev.id.reject(&[]);
                let _ = ev.id.destroy();
            }
            return;
        }
        if !ev.id.same(&self.id) {
            return;
        }
        match (self.phase, ev.event) {
            (Phase::Resolving, E::AddrResolved) => {
                if let Err(e) = self.id.resolve_route(RESOLVE_MS) {
                    self.fail(e.errno().raw());
                }
            }
            (Phase::Resolving, E::RouteResolved) => {
                if let Err(e) = self.start_connect() {
                    self.fail(e.errno().raw());
                }
            }
            (Phase::Resolving, E::AddrError | E::RouteError) => self.fail(libc::EHOSTUNREACH),
            (Phase::Connecting, E::Established) => {
                let s = self.stream.as_mut().expect("connecting");
                match Hello::decode(&ev.param.private_data) {
                    Some(h) => {
                        s.set_peer(h);
                        self.phase = Phase::Connected;
                    }
                    None => {
                        let _ = self.id.disconnect();
                        self.fail(libc::ECONNREFUSED);
                    }
                }
            }
            (Phase::Accepting, E::Established) => self.phase = Phase::Connected,
            (Phase::Connecting, E::Rejected) => self.fail(libc::ECONNREFUSED),
            (Phase::Connecting | Phase::Accepting, E::Unreachable | E::ConnectError) => {
                self.fail(libc::ETIMEDOUT)
            }
            (Phase::Accepting, E::Disconnected) => self.fail(libc::ECONNRESET),
            (_, E::Disconnected) => self.disconnected = true,
            _ => {}
        }
    }

    fn start_connect(&mut self) -> Result<()> {
        let ctx = self.id.context().ok_or(err(libc::ENODEV, "the address has no device"))?;
        let s = Stream::new(&ctx, self.opts.sizes(), self.opts.iomap_size as usize)?;
        self.id.set_qp(&s.qp)?;
        s.post_receives()?;
        let p = conn_param(&s);
        self.stream = Some(s);
        self.id.connect(&p)?;
        self.phase = Phase::Connecting;
        Ok(())
    }

    /// A listener's: whether another request may be accepted before `raccept` takes one.
    fn accept_queue_room(&self) -> bool {
        self.accepted.len() + self.accepting < ACCEPT_QUEUE
    }

    /// The poll events of the socket's state.
    fn events(&self) -> i16 {
        use libc::{POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT};
        match self.phase {
            // Nothing yet (librdmacm's, measured on rxe; TCP's is `POLLOUT | POLLHUP`).
            Phase::Open => 0,
            // Always writable, as librdmacm's listener (its accept queue is one end of a
            // socketpair; measured on rxe), unlike a kernel TCP listener.
            Phase::Listening
                if !self.requests.is_empty() || self.accepting > 0 || !self.accepted.is_empty() =>
            {
                POLLIN | POLLOUT
            }
            Phase::Listening => POLLOUT,
            Phase::Resolving | Phase::Connecting | Phase::Accepting => 0,
            // (librdmacm's, measured on rxe after a refused connect.)
            Phase::Failed => POLLIN | POLLOUT | POLLERR,
            Phase::Closed => POLLNVAL,
            Phase::Connected => {
                let s = self.stream.as_ref().expect("connected");
                let mut ev = 0;
                if s.readable() > 0 || s.fin_in || self.disconnected || self.shut_rd {
                    ev |= POLLIN;
                }
                // Whenever a send has room, shut down or not (librdmacm's, measured on rxe; TCP
                // too says `POLLOUT` once its sending side is shut, for the writer to hear
                // `EPIPE`).
                if s.writable() {
                    ev |= POLLOUT;
                }
                // As TCP: hung up once both directions are over, and not while there is still
                // data to read (a poller that treats POLLHUP as the end would lose it).
                let over = self.disconnected || (s.fin_in && self.shut_wr);
                if over && s.readable() == 0 {
                    ev |= POLLHUP;
                }
                if s.error.is_some() {
                    ev |= POLLERR;
                }
                ev
            }
        }
    }
}

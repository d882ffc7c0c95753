//! rsockets: byte streams over RC connections, with the socket calls' blocking, non-blocking
//! and end-of-stream behaviour, and I/O mappings the peer writes without a call of ours.

use std::{
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use rdma_emu::{
    Errno, Fabric, RawMemory,
    rsocket::{PollEntry, PollTarget, RSocket, RecvFlags, Shutdown, poll},
};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A listener on `port` and a connected pair (client, server) through it.
fn pair(f: &Fabric, port: u16) -> (RSocket, RSocket, RSocket) {
    let l = RSocket::new(f, false).unwrap();
    l.bind(addr(&format!("127.0.0.1:{port}"))).unwrap();
    l.listen(4).unwrap();
    let c = RSocket::new(f, false).unwrap();
    let cc = c.clone();
    let t = thread::spawn(move || cc.connect(addr(&format!("127.0.0.1:{port}"))));
    let s = l.accept().unwrap();
    t.join().unwrap().unwrap();
    (l, c, s)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn read_exactly(s: &RSocket, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let got = s.recv(&mut out, RecvFlags { wait_all: true, ..Default::default() }).unwrap();
    assert_eq!(got, n);
    out
}

#[test]
fn a_stream_carries_bytes_both_ways_in_order_then_ends() {
    let f = Fabric::new(Default::default());
    let (l, c, s) = pair(&f, 9001);
    assert_eq!(s.peer_addr().unwrap().ip(), c.local_addr().unwrap().ip());
    assert_eq!(c.peer_addr().unwrap(), addr("127.0.0.1:9001"));
    // Several times the ring: the writer must wait for the reader's credits.
    let data = pattern(3 << 20, 7);
    let writer = {
        let (c, data) = (c.clone(), data.clone());
        thread::spawn(move || c.send(&data, false).unwrap())
    };
    let got = read_exactly(&s, data.len());
    assert_eq!(writer.join().unwrap(), data.len());
    assert!(got == data, "the bytes arrive as written");
    // And back, in small pieces.
    for i in 0..200u8 {
        assert_eq!(s.send(&[i; 3], false).unwrap(), 3);
    }
    let back = read_exactly(&c, 600);
    assert!(back.chunks(3).enumerate().all(|(i, ch)| ch == [i as u8; 3]));
    // Closing ends the stream after what was written.
    s.send(b"last", false).unwrap();
    s.close().unwrap();
    assert_eq!(read_exactly(&c, 4), b"last");
    let mut b = [0u8; 8];
    assert_eq!(c.recv(&mut b, RecvFlags::default()).unwrap(), 0, "end of stream");
    // Readable (the end), hung up, and writable while a send has room, as librdmacm's poll
    // (measured on rxe); the send itself is refused (librdmacm's goes out while its credits
    // last, to nobody).
    let all = libc::POLLIN | libc::POLLOUT;
    let mut e = [PollEntry { target: PollTarget::Socket(c.clone()), events: all, revents: 0 }];
    poll(&mut e, Some(Duration::ZERO)).unwrap();
    assert_eq!(e[0].revents, libc::POLLIN | libc::POLLOUT | libc::POLLHUP);
    assert_eq!(c.send(b"x", false).unwrap_err().errno(), Errno(libc::ECONNRESET));
    c.close().unwrap();
    assert_eq!(c.close().unwrap_err().errno(), Errno(libc::EBADF));
    l.close().unwrap();
}

#[test]
fn non_blocking_calls_say_eagain_and_poll_says_when_to_retry() {
    let f = Fabric::new(Default::default());
    let (l, c, s) = pair(&f, 9002);
    s.set_nonblocking(true);
    let mut b = [0u8; 16];
    assert_eq!(s.recv(&mut b, RecvFlags::default()).unwrap_err().errno(), Errno::EAGAIN);
    let mut entries =
        [PollEntry { target: PollTarget::Socket(s.clone()), events: libc::POLLIN, revents: 0 }];
    assert_eq!(poll(&mut entries, Some(Duration::ZERO)).unwrap(), 0);
    let started = Instant::now();
    assert_eq!(poll(&mut entries, Some(Duration::from_millis(50))).unwrap(), 0);
    assert!(started.elapsed() >= Duration::from_millis(50), "the timeout is waited out");
    let cc = c.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        cc.send(b"wake", false).unwrap()
    });
    assert_eq!(poll(&mut entries, None).unwrap(), 1);
    assert_eq!(entries[0].revents & libc::POLLIN, libc::POLLIN);
    t.join().unwrap();
    // Peeking leaves the bytes; MSG_DONTWAIT on a blocking socket does not wait.
    let peek = RecvFlags { peek: true, ..Default::default() };
    assert_eq!(s.recv(&mut b, peek).unwrap(), 4);
    assert_eq!(s.recv(&mut b, RecvFlags::default()).unwrap(), 4);
    assert_eq!(&b[..4], b"wake");
    let dont = RecvFlags { dont_wait: true, ..Default::default() };
    assert_eq!(c.recv(&mut b, dont).unwrap_err().errno(), Errno::EAGAIN);
    // A non-blocking writer fills the peer's ring, then is told to wait.
    c.set_nonblocking(true);
    let mut sent = 0;
    loop {
        match c.send(&[1u8; 65536], false) {
            Ok(n) => sent += n,
            Err(e) => {
                assert_eq!(e.errno(), Errno::EAGAIN);
                break;
            }
        }
    }
    assert!(sent > 1 << 16, "most of a ring went ({sent})");
    let mut out =
        [PollEntry { target: PollTarget::Socket(c.clone()), events: libc::POLLOUT, revents: 0 }];
    assert_eq!(poll(&mut out, Some(Duration::ZERO)).unwrap(), 0, "full");
    let mut sink = vec![0u8; sent];
    s.set_nonblocking(false);
    assert_eq!(
        s.recv(&mut sink, RecvFlags { wait_all: true, ..Default::default() }).unwrap(),
        sent
    );
    assert_eq!(poll(&mut out, Some(Duration::from_secs(5))).unwrap(), 1, "credits came back");
    for x in [c, s, l] {
        x.close().unwrap();
    }
}

#[test]
fn connecting_to_nobody_is_refused_and_a_non_blocking_connect_completes_later() {
    let f = Fabric::new(Default::default());
    let c = RSocket::new(&f, false).unwrap();
    assert_eq!(c.connect(addr("127.0.0.1:9003")).unwrap_err().errno(), Errno(libc::ECONNREFUSED));
    let far = RSocket::new(&f, false).unwrap();
    let e = far.connect(addr("10.9.9.9:1")).unwrap_err();
    assert_eq!(e.errno(), Errno(libc::EHOSTUNREACH), "no emulated port has that address");
    let l = RSocket::new(&f, true).unwrap();
    l.bind(addr("[::]:9004")).unwrap();
    l.listen(1).unwrap();
    let c = RSocket::new(&f, false).unwrap();
    c.set_nonblocking(true);
    let e = c.connect(addr("127.0.0.1:9004")).unwrap_err();
    assert_eq!(e.errno(), Errno(libc::EINPROGRESS));
    let mut entries = [
        PollEntry { target: PollTarget::Socket(c.clone()), events: libc::POLLOUT, revents: 0 },
        PollEntry { target: PollTarget::Socket(l.clone()), events: libc::POLLIN, revents: 0 },
    ];
    assert!(poll(&mut entries, Some(Duration::from_secs(5))).unwrap() >= 1);
    assert_eq!(entries[1].revents, libc::POLLIN, "the IPv6 wildcard hears IPv4");
    l.set_nonblocking(true);
    let s = l.accept().unwrap();
    assert_eq!(l.accept().unwrap_err().errno(), Errno::EAGAIN);
    assert_eq!(poll(&mut entries[..1], Some(Duration::from_secs(5))).unwrap(), 1);
    assert_eq!(entries[0].revents, libc::POLLOUT);
    assert_eq!(c.take_error(), None);
    // Connected already: 0, as librdmacm answers (measured on rxe).
    c.connect(addr("127.0.0.1:9004")).unwrap();
    c.send(b"hi", false).unwrap();
    s.set_nonblocking(false);
    assert_eq!(read_exactly(&s, 2), b"hi");
    // Calls in the wrong state, answered as librdmacm's (measured on rxe), but for a send or
    // a receive, where librdmacm's crash (SIGSEGV) and the emulator's say ENOTCONN: no
    // address, no poll events, nothing to shut down, EBADF for an accept.
    let fresh = RSocket::new(&f, false).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(
        fresh.recv(&mut b, RecvFlags::default()).unwrap_err().errno(),
        Errno(libc::ENOTCONN)
    );
    assert_eq!(fresh.send(b"x", false).unwrap_err().errno(), Errno(libc::ENOTCONN));
    assert_eq!(fresh.accept().unwrap_err().errno(), Errno(libc::EBADF));
    assert_eq!(s.accept().unwrap_err().errno(), Errno(libc::EBADF));
    fresh.shutdown(Shutdown::Write).unwrap();
    assert!(!fresh.has_address());
    let events = |sock: &RSocket| {
        let all = libc::POLLIN | libc::POLLOUT;
        let mut e =
            [PollEntry { target: PollTarget::Socket(sock.clone()), events: all, revents: 0 }];
        poll(&mut e, Some(Duration::ZERO)).unwrap();
        e[0].revents
    };
    assert_eq!(events(&fresh), 0);
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(s.send(b"x", false).unwrap_err().errno(), Errno(libc::EPIPE));
    // Writable still, as librdmacm's (and TCP's) poll says, for the writer to hear EPIPE.
    assert_eq!(events(&s), libc::POLLOUT);
    c.set_nonblocking(false);
    assert_eq!(c.recv(&mut b, RecvFlags::default()).unwrap(), 0, "FIN");
    c.send(b"y", false).unwrap();
    assert_eq!(read_exactly(&s, 1), b"y", "the other direction still works");
}

#[test]
fn an_io_mapping_takes_the_peers_writes_without_a_call() {
    let f = Fabric::new(Default::default());
    let (l, c, s) = pair(&f, 9005);
    // No mapping slots unless asked before connecting.
    let mut mem = vec![0u8; 4096];
    // SAFETY: `mem` outlives every socket here, and is neither moved nor resized.
    let raw = |m: &mut Vec<u8>| unsafe { RawMemory::new(m.as_mut_ptr(), m.len()) };
    let a = mem.as_mut_ptr() as u64;
    assert_eq!(s.iomap(raw(&mut mem), a, Some(0), true).unwrap_err().errno(), Errno::ENOMEM);
    for x in [c, s, l] {
        x.close().unwrap();
    }

    let l = RSocket::new(&f, false).unwrap();
    l.bind(addr("127.0.0.1:9006")).unwrap();
    l.listen(1).unwrap();
    let c = RSocket::new(&f, false).unwrap();
    // The client keeps a table of one mapping of the server's (the server's table: none).
    c.set_options(|o| o.iomap_size = 1).unwrap();
    let cc = c.clone();
    let t = thread::spawn(move || cc.connect(addr("127.0.0.1:9006")));
    let s = l.accept().unwrap();
    t.join().unwrap().unwrap();
    assert_eq!(s.iomap(raw(&mut mem), a, Some(0), true).unwrap(), 0);
    let mut other = vec![0u8; 64];
    let b = other.as_mut_ptr() as u64;
    assert_eq!(s.iomap(raw(&mut other), b, None, true).unwrap_err().errno(), Errno::ENOMEM);
    assert_eq!(c.iomap(raw(&mut other), b, None, true).unwrap_err().errno(), Errno::ENOMEM);
    assert_eq!(c.iomap(raw(&mut other), b, None, false).unwrap(), b, "PROT_NONE: kept only");
    c.iounmap(b, 64).unwrap();
    s.send(b"go", false).unwrap(); // the mapping is announced before this
    assert_eq!(read_exactly(&c, 2), b"go");
    let data = pattern(4096, 3);
    assert_eq!(c.iowrite(&data, 0, false).unwrap(), 4096);
    let deadline = Instant::now() + Duration::from_secs(5);
    // SAFETY: the peer's writes are done once the last byte shows (RC writes land in order).
    while unsafe { std::ptr::read_volatile(mem.as_ptr().add(4095)) } != data[4095] {
        assert!(Instant::now() < deadline, "the write never landed");
        thread::yield_now();
    }
    assert!(mem == data);
    assert_eq!(c.iowrite(&data, 4096, false).unwrap_err().errno(), Errno::EINVAL, "unmapped");
    s.iounmap(a, 4096).unwrap();
    assert_eq!(s.iounmap(a, 4096).unwrap_err().errno(), Errno::EINVAL);
    s.send(b"!", false).unwrap();
    assert_eq!(read_exactly(&c, 1), b"!");
    assert_eq!(c.iowrite(&data, 0, false).unwrap_err().errno(), Errno::EINVAL, "unmapped now");
    for x in [c, s, l] {
        x.close().unwrap();
    }
}

/// A short first message leaves later ones straddling the ring's end: each is still read whole
/// and in order (iperf3's data connections start with a 37-byte cookie).
#[test]
fn reads_across_the_rings_end_keep_the_order() {
    let f = Fabric::new(Default::default());
    let (_l, c, s) = pair(&f, 9099);
    let data = pattern(1 << 20, 9);
    let w = {
        let (c, data) = (c.clone(), data.clone());
        thread::spawn(move || {
            c.send(&[7u8; 37], false).unwrap();
            for ch in data.chunks(131072) {
                c.send(ch, false).unwrap();
            }
        })
    };
    let mut cookie = [0u8; 37];
    assert_eq!(
        s.recv(&mut cookie, RecvFlags { wait_all: true, ..Default::default() }).unwrap(),
        37
    );
    let mut got = Vec::new();
    let mut buf = vec![0u8; 131072];
    while got.len() < data.len() {
        let n = s.recv(&mut buf, RecvFlags::default()).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    w.join().unwrap();
    let i = got.iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(i, None);
}

/// Datagram rsockets: a bound socket answers the datagrams of an unbound one at the address
/// each carries; a connected socket takes its peer's datagrams only.
#[test]
fn datagrams_go_both_ways_with_their_sources() {
    let f = Fabric::new(Default::default());
    let s = RSocket::new_dgram(&f, true).unwrap();
    let dont = RecvFlags { dont_wait: true, ..Default::default() };
    let mut b = [0u8; 64];
    // Nothing can come before the socket has an address: librdmacm says EINVAL.
    assert_eq!(s.recv(&mut b, dont).unwrap_err().errno(), Errno::EINVAL);
    s.bind(addr("[::]:9101")).unwrap();
    let c = RSocket::new_dgram(&f, false).unwrap();
    let to = addr("127.0.0.1:9101");
    // The first datagram to an address waits for the answer to its lookup, which the server's
    // CM gives though the server is in no call meanwhile (this thread is its only one).
    assert_eq!(c.send_to(b"ping", to, false).unwrap(), 4);
    let mut readable =
        [PollEntry { target: PollTarget::Socket(s.clone()), events: libc::POLLIN, revents: 0 }];
    assert_eq!(poll(&mut readable, Some(Duration::from_secs(30))).unwrap(), 1, "never came");
    let (n, from) = s.recv_from(&mut b, dont).unwrap();
    assert_eq!(&b[..n], b"ping");
    let from = from.unwrap();
    assert_eq!(from.ip(), "127.0.0.1".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(Some(from), c.local_addr().map(|a| std::net::SocketAddr::new(from.ip(), a.port())));
    c.connect(to).unwrap();
    let client = {
        let c = c.clone();
        thread::spawn(move || {
            let mut b = [0u8; 64];
            let (n, back) = c.recv_from(&mut b, RecvFlags::default()).unwrap();
            (b[..n].to_vec(), back)
        })
    };
    assert_eq!(s.send_to(b"pong!", from, false).unwrap(), 5);
    let (got, back) = client.join().unwrap();
    assert_eq!((&got[..], back), (&b"pong!"[..], Some(to)));
    // Cut to the buffer; nothing more waits.
    assert_eq!(c.send(b"0123456789", false).unwrap(), 10);
    let mut small = [0u8; 4];
    assert_eq!(s.recv(&mut small, RecvFlags::default()).unwrap(), 4);
    assert_eq!(&small, b"0123");
    assert_eq!(s.recv(&mut b, dont).unwrap_err().errno(), Errno::EAGAIN);
    // Too big for a datagram; nobody at the address: dropped, as UDP.
    assert_eq!(c.send(&vec![0u8; 1 << 16], false).unwrap_err().errno(), Errno(libc::EMSGSIZE));
    assert_eq!(c.send_to(b"lost", addr("127.0.0.1:9102"), false).unwrap(), 4);
    assert_eq!(s.listen(1).unwrap_err().errno(), Errno::EOPNOTSUPP);
    for x in [c, s] {
        x.close().unwrap();
    }
}

/// Datagram sockets share a port as UDP ones do, both with `SO_REUSEADDR` (iperf3's server
/// binds a new one once its first is connected to a client): a socket connected to a peer
/// gets that peer's datagrams, another on the port everybody else's.
#[test]
fn datagram_sockets_share_a_port_and_a_connected_one_gets_its_peers_datagrams() {
    let f = Fabric::new(Default::default());
    let port = addr("127.0.0.1:9131");
    let reusing = || {
        let s = RSocket::new_dgram(&f, false).unwrap();
        s.set_options(|o| o.reuse_addr = true).unwrap();
        s
    };
    let (a, x, y) = (reusing(), reusing(), reusing());
    a.bind(port).unwrap();
    let dont = RecvFlags { dont_wait: true, ..Default::default() };
    let take = |s: &RSocket| {
        let mut entries =
            [PollEntry { target: PollTarget::Socket(s.clone()), events: libc::POLLIN, revents: 0 }];
        assert_eq!(poll(&mut entries, Some(Duration::from_secs(30))).unwrap(), 1, "nothing came");
        let mut b = [0u8; 16];
        let (n, from) = s.recv_from(&mut b, dont).unwrap();
        (b[..n].to_vec(), from.unwrap())
    };
    x.send_to(b"x1", port, false).unwrap();
    let (got, from_x) = take(&a);
    assert_eq!(got, b"x1");
    a.connect(from_x).unwrap();
    // A socket without the option cannot join them.
    let lone = RSocket::new_dgram(&f, false).unwrap();
    assert_eq!(lone.bind(port).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    let b = reusing();
    b.bind(port).unwrap();
    y.send_to(b"y1", port, false).unwrap();
    assert_eq!(take(&b).0, b"y1");
    x.send_to(b"x2", port, false).unwrap();
    assert_eq!(take(&a).0, b"x2");
    for s in [&a, &b] {
        assert_eq!(s.recv(&mut [0u8; 8], dont).unwrap_err().errno(), Errno::EAGAIN);
    }
    // A sender that looked the port up before `c` connected (iperf 2's parallel streams all
    // start at once) keeps sending to `c`, which passes what is not its peer's on to the
    // socket on the port that takes it, the sender named as before (what came before `c`
    // connected too).
    let (c, z) = (reusing(), reusing());
    let port2 = addr("127.0.0.1:9132");
    c.bind(port2).unwrap();
    x.send_to(b"x3", port2, false).unwrap();
    z.send_to(b"z1", port2, false).unwrap();
    let (got, from_x) = take(&c);
    assert_eq!(got, b"x3");
    c.connect(from_x).unwrap();
    let d = reusing();
    d.bind(port2).unwrap();
    // `c`'s owner reads on (here: looks without waiting), which moves what came for `d`.
    let mut entries =
        [PollEntry { target: PollTarget::Socket(d.clone()), events: libc::POLLIN, revents: 0 }];
    let mut waited = 0;
    while poll(&mut entries, Some(Duration::from_millis(10))).unwrap() == 0 {
        assert_eq!(c.recv(&mut [0u8; 8], dont).unwrap_err().errno(), Errno::EAGAIN);
        waited += 1;
        assert!(waited < 3000, "never passed on");
    }
    let mut b2 = [0u8; 16];
    let (n, from) = d.recv_from(&mut b2, dont).unwrap();
    assert_eq!(
        (&b2[..n], from),
        (&b"z1"[..], z.local_addr().map(|a| addr(&format!("127.0.0.1:{}", a.port()))))
    );
    z.send_to(b"z2", port2, false).unwrap();
    x.send_to(b"x4", port2, false).unwrap();
    assert_eq!(take(&c).0, b"x4");
    assert_eq!(take(&d).0, b"z2");
}

/// A datagram socket keeps as many datagrams unread as librdmacm's would: one per 2 KiB of its
/// receive buffer (64 by default), at most its receive queue's size (384), once bound; more
/// are dropped, as UDP drops what overflows a socket's buffer.
#[test]
fn a_datagram_socket_holds_what_its_receive_buffer_holds() {
    let f = Fabric::new(Default::default());
    for (port, buffer, held) in [(9111u16, None, 64), (9112, Some(1 << 20), 384)] {
        let s = RSocket::new_dgram(&f, false).unwrap();
        if let Some(b) = buffer {
            // `SO_RCVBUF` of 512 KiB, as udpong sets it (reported doubled).
            s.set_options(|o| o.recv_buffer = b).unwrap();
        }
        let to = addr(&format!("127.0.0.1:{port}"));
        s.bind(to).unwrap();
        // Sized when bound: later options change nothing.
        s.set_options(|o| o.recv_buffer = 1 << 17).unwrap();
        let c = RSocket::new_dgram(&f, false).unwrap();
        c.set_options(|o| o.send_buffer = 1 << 20).unwrap();
        c.send_to(b"hello", to, false).unwrap();
        let dont = RecvFlags { dont_wait: true, ..Default::default() };
        let mut readable =
            [PollEntry { target: PollTarget::Socket(s.clone()), events: libc::POLLIN, revents: 0 }];
        assert_eq!(poll(&mut readable, Some(Duration::from_secs(30))).unwrap(), 1);
        assert_eq!(s.recv_from(&mut [0u8; 8], dont).unwrap().0, 5);
        for i in 0..500u32 {
            assert_eq!(c.send_to(&i.to_le_bytes(), to, false).unwrap(), 4);
        }
        let mut b = [0u8; 8];
        let mut got = Vec::new();
        while let Ok((n, _)) = s.recv_from(&mut b, dont) {
            got.push(u32::from_le_bytes(b[..n].try_into().unwrap()));
        }
        // The first ones, in order; the rest were dropped.
        assert_eq!(got, (0..held).collect::<Vec<u32>>(), "buffer {buffer:?}");
        for x in [c, s] {
            x.close().unwrap();
        }
    }
}

#[test]
fn a_listener_accepts_in_the_background_so_one_thread_connects_to_its_own() {
    let f = Fabric::new(Default::default());
    let l = RSocket::new(&f, false).unwrap();
    l.bind(addr("127.0.0.1:9021")).unwrap();
    l.listen(4).unwrap();
    // No raccept under way: the listen service accepts, as librdmacm's does (a listener that
    // accepted only in raccept left this blocking connect waiting for ever).
    let c = RSocket::new(&f, false).unwrap();
    c.connect(addr("127.0.0.1:9021")).unwrap();
    assert_eq!(c.send(b"early", false).unwrap(), 5, "sent before the server took it");
    let mut e =
        [PollEntry { target: PollTarget::Socket(l.clone()), events: libc::POLLIN, revents: 0 }];
    assert_eq!(poll(&mut e, Some(Duration::from_secs(5))).unwrap(), 1, "a connection waits");
    let s = l.accept().unwrap();
    assert_eq!(read_exactly(&s, 5), b"early");
    assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
    s.send(b"back", false).unwrap();
    assert_eq!(read_exactly(&c, 4), b"back");
    // Nothing more waits: a non-blocking accept says so, and the poll sees nothing.
    l.set_nonblocking(true);
    assert_eq!(l.accept().unwrap_err().errno(), Errno::EAGAIN);
    assert_eq!(poll(&mut e, Some(Duration::ZERO)).unwrap(), 0);
    for x in [c, s, l] {
        x.close().unwrap();
    }
}

#[test]
fn connections_queue_on_a_listener_until_accepted_and_its_close_ends_those_left() {
    let f = Fabric::new(Default::default());
    let l = RSocket::new(&f, false).unwrap();
    l.bind(addr("127.0.0.1:9022")).unwrap();
    l.listen(8).unwrap();
    let clients: Vec<RSocket> = (0..3u8)
        .map(|i| {
            let c = RSocket::new(&f, false).unwrap();
            c.connect(addr("127.0.0.1:9022")).unwrap();
            c.send(&[i; 3], false).unwrap();
            c
        })
        .collect();
    // Taken in the order they came, each with what its client sent first.
    for i in 0..2u8 {
        let s = l.accept().unwrap();
        assert_eq!(read_exactly(&s, 3), [i; 3]);
        assert_eq!(s.peer_addr().unwrap(), clients[usize::from(i)].local_addr().unwrap());
        s.close().unwrap();
    }
    // The third, accepted and never taken, ends with the listener.
    l.close().unwrap();
    let mut b = [0u8; 4];
    for (i, c) in clients.iter().enumerate() {
        assert_eq!(c.recv(&mut b, RecvFlags::default()).unwrap(), 0, "client {i}: the end");
        c.close().unwrap();
    }
    // And the port is free again: the service holds no listener of its own.
    let again = RSocket::new(&f, false).unwrap();
    again.bind(addr("127.0.0.1:9022")).unwrap();
    again.listen(1).unwrap();
    drop(again);
    let other = RSocket::new(&f, false).unwrap();
    other.bind(addr("127.0.0.1:9022")).unwrap_or_else(|e| panic!("a dropped listener's port: {e}"));
}

#[test]
fn a_poll_asleep_on_a_listener_wakes_for_a_connection_its_service_accepted() {
    let f = Fabric::new(Default::default());
    let l = RSocket::new(&f, false).unwrap();
    l.bind(addr("127.0.0.1:9023")).unwrap();
    l.listen(4).unwrap();
    let fc = f.clone();
    let client = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        let c = RSocket::new(&fc, false).unwrap();
        c.connect(addr("127.0.0.1:9023")).unwrap();
        c
    });
    // The service takes the request off the listener's channel, which the poll also sleeps
    // on: what wakes it is the listener's backlog (without, it slept to its timeout: 0).
    let mut e =
        [PollEntry { target: PollTarget::Socket(l.clone()), events: libc::POLLIN, revents: 0 }];
    assert_eq!(poll(&mut e, Some(Duration::from_secs(20))).unwrap(), 1);
    assert_eq!(e[0].revents, libc::POLLIN);
    let c = client.join().unwrap();
    let s = l.accept().unwrap();
    assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
    for x in [c, s, l] {
        x.close().unwrap();
    }
}

/// A child made by `fork` while its parent's listen service serves a stream of connection
/// requests (and the parent's threads connect and close) listens and accepts on a fabric of
/// its own, as the C ABI gives a child: it finds free every lock of the service's that a
/// thread of the parent's held (the service waits to be asleep at the fork), and its own
/// service leaves the parent's listener alone. (A child's service that watched the listener
/// it inherited took requests' counts off the parent's channel, which the parent shares: the
/// parent's requests then waited for ever.)
#[test]
fn a_child_made_by_fork_accepts_on_its_own_and_leaves_its_parents_requests_alone() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };
    let f = Fabric::new(Default::default());
    let l = RSocket::new(&f, false).unwrap();
    l.bind(addr("127.0.0.1:7690")).unwrap();
    l.listen(64).unwrap();
    l.set_nonblocking(true);
    let stop = Arc::new(AtomicBool::new(false));
    let connected = Arc::new(AtomicUsize::new(0));
    // Connect and close in a loop: the service takes each request as it comes.
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (f, stop, connected) = (f.clone(), stop.clone(), connected.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let c = RSocket::new(&f, false).unwrap();
                    c.connect(addr("127.0.0.1:7690")).unwrap();
                    connected.fetch_add(1, Ordering::Relaxed);
                    c.close().unwrap();
                }
            })
        })
        .collect();
    // Accepts in a thread of its own (each `raccept` takes the service's slot).
    let acceptor = {
        let (l, stop) = (l.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok(s) => s.close().unwrap(),
                    Err(e) => {
                        assert_eq!(e.errno(), Errno::EAGAIN);
                        thread::sleep(Duration::from_micros(100));
                    }
                }
            }
        })
    };
    for round in 0..100u16 {
        // SAFETY: the child uses a fabric of its own and exits at once, running no handler of
        // the parent's.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let mine = Fabric::new(Default::default());
            let at = addr(&format!("127.0.0.1:{}", 7700 + round));
            let served = (|| {
                let own = RSocket::new(&mine, false)?;
                own.bind(at)?;
                own.listen(1)?;
                let c = RSocket::new(&mine, false)?;
                c.connect(at)?;
                own.accept()?.close()?;
                c.close()?;
                own.close()
            })();
            // SAFETY: as above.
            unsafe { libc::_exit(i32::from(served.is_err())) };
        }
        assert!(child > 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut status = 0;
        // SAFETY: waits for our own child, without blocking.
        while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
            if Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe { libc::kill(child, libc::SIGKILL) };
                panic!("round {round}: the child hung");
            }
            thread::sleep(Duration::from_millis(1));
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "round {round}");
    }
    let before = connected.load(Ordering::Relaxed);
    // The clients go on being served: none waits for ever.
    let deadline = Instant::now() + Duration::from_secs(20);
    while connected.load(Ordering::Relaxed) < before + 100 {
        assert!(Instant::now() < deadline, "a request of the parent's was never accepted");
        thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    clients.into_iter().for_each(|t| t.join().unwrap());
    acceptor.join().unwrap();
}

/// A storm of clients on a listener nobody accepts on takes no more than librdmacm's accept
/// queue holds: its listen service accepts 279 connections (278 fill its socketpair, the
/// 279th's write blocks), the next requests wait for an answer (as many as the backlog), and
/// the CM refuses the rest; each `raccept` makes room for one more. (The service accepted every request, three descriptors each until `raccept`
/// took it: a storm ran the server out of descriptors.)
#[test]
fn a_listener_nobody_accepts_on_holds_what_librdmacms_accept_queue_holds() {
    const QUEUE: usize = 279;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit to fill, then to set as read but for the soft limit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max.min(8192);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(lim.rlim_cur >= 4096, "descriptors for 600 sockets: {} at most", lim.rlim_max);
    let f = Fabric::new(Default::default());
    let at = addr("127.0.0.1:9041");
    let l = RSocket::new(&f, false).unwrap();
    l.bind(at).unwrap();
    l.listen(4).unwrap();
    let mut clients = Vec::new();
    // How a client stands: connected, refused, or waiting for an answer.
    let stands = |c: &RSocket| {
        let mut e = [PollEntry {
            target: PollTarget::Socket(c.clone()),
            events: libc::POLLOUT,
            revents: 0,
        }];
        poll(&mut e, Some(Duration::ZERO)).unwrap();
        match e[0].revents {
            0 => "waiting",
            libc::POLLOUT => "connected",
            r if r & libc::POLLERR != 0 => "refused",
            r => panic!("revents {r:#x}"),
        }
    };
    let settles_as = |i: usize, c: &RSocket, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while stands(c) != want {
            assert!(Instant::now() < deadline, "client {i}: {} ({want} expected)", stands(c));
            thread::sleep(Duration::from_micros(200));
        }
    };
    for i in 0..QUEUE + 4 + 8 {
        let c = RSocket::new(&f, false).unwrap();
        c.set_nonblocking(true);
        let e = c.connect(at).unwrap_err().errno();
        match i {
            _ if i < QUEUE => settles_as(i, &c, "connected"),
            _ if i < QUEUE + 4 => assert_eq!(e, Errno(libc::EINPROGRESS)),
            // (Refused at once here: the in-process CM answers in the call.)
            _ if e == Errno(libc::ECONNREFUSED) => {}
            _ => {
                settles_as(i, &c, "refused");
                assert_eq!(c.take_error(), Some(Errno(libc::ECONNREFUSED)));
            }
        }
        clients.push(c);
    }
    assert!(clients[QUEUE..QUEUE + 4].iter().all(|c| stands(c) == "waiting"));
    // Each taken makes room: the oldest waiting request is accepted.
    let mut served = vec![l.accept().unwrap()];
    settles_as(QUEUE, &clients[QUEUE], "connected");
    assert_eq!(stands(&clients[QUEUE + 1]), "waiting");
    l.set_nonblocking(true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while served.len() < QUEUE + 4 {
        match l.accept() {
            Ok(s) => served.push(s),
            Err(e) => assert_eq!(e.errno(), Errno::EAGAIN),
        }
        assert!(Instant::now() < deadline, "{} accepted", served.len());
    }
    // Those that came first, and nothing more (in the order they came but where `raccept`
    // and the service accepted two at once).
    let peers: std::collections::BTreeSet<_> =
        served.iter().map(|s| s.peer_addr().unwrap()).collect();
    let first: std::collections::BTreeSet<_> =
        clients[..QUEUE + 4].iter().map(|c| c.local_addr().unwrap()).collect();
    assert_eq!(peers, first);
    assert_eq!(l.accept().unwrap_err().errno(), Errno::EAGAIN);
    for s in served.into_iter().chain(clients).chain([l]) {
        s.close().unwrap();
    }
}

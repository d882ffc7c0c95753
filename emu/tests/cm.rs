//! The connection manager: ids that resolve addresses, listen, connect, accept, reject and
//! disconnect, their QPs taken to RTS by the connection, and every step an event.

mod common;
use std::net::SocketAddr;

use common::*;
use rdma_emu::{
    cm::{
        CmChannel, CmEvent, CmEventType as E, CmId, ConnParam, PortSpace, REJ_CONSUMER_DEFINED,
        REJ_INVALID_SERVICE_ID, REJ_PRIVATE_DATA, REJ_VENDOR_OPTION_NOT_SUPPORTED,
        REQ_PRIVATE_DATA, addr::PortAddress,
    },
    *,
};

/// A fabric whose second device answers to 127.0.0.2.
fn fabric(profile: Profile) -> Fabric {
    let addresses = PortAddress::parse_list("127.0.0.2=emu1,192.0.2.77=emu1").unwrap();
    Fabric::new(FabricConfig { profile, addresses, ..Default::default() })
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn next(ch: &CmChannel, want: E) -> CmEvent {
    let ev = ch.get_event().unwrap();
    assert_eq!(ev.event, want, "status {}", ev.status);
    ev
}

/// Whether `ch` stays without an event for 100 ms.
fn quiet(ch: &CmChannel) -> bool {
    let fd = std::os::fd::AsRawFd::as_raw_fd(ch);
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 100) == 0 }
}

/// The verbs objects of one side of a connection, on its id's context.
struct Side {
    pd: Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn side(id: &CmId) -> Side {
    let ctx = id.context().expect("the id has a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(8))).unwrap();
    id.set_qp(&qp).unwrap();
    assert_eq!(qp.state(), QpState::INIT);
    Side { pd, cq, mr, qp }
}

/// An id in `ps` on `ch` whose route to `dst` (from `src`, if given) is resolved.
fn resolved(ch: &CmChannel, ps: PortSpace, src: Option<&str>, dst: &str) -> CmId {
    let id = CmId::create(ch, ps).unwrap();
    id.resolve_addr(src.map(addr), addr(dst), 2000).unwrap();
    next(ch, E::AddrResolved);
    id.resolve_route(2000).unwrap();
    next(ch, E::RouteResolved);
    id
}

/// A listener on 127.0.0.2:7471 and a client that resolved it.
fn listening(f: &Fabric) -> (CmChannel, CmId, CmChannel, CmId) {
    listening_on(f, f, "127.0.0.2:7471", None)
}

/// A listener at `to` on `fs` and a client on `fc` (from `src`, if given) that resolved it.
fn listening_on(
    fs: &Fabric,
    fc: &Fabric,
    to: &str,
    src: Option<&str>,
) -> (CmChannel, CmId, CmChannel, CmId) {
    let (sch, cch) = (CmChannel::new(fs).unwrap(), CmChannel::new(fc).unwrap());
    let server = listener(&sch, to, 4);
    let client = resolved(&cch, PortSpace::Tcp, src, to);
    (sch, server, cch, client)
}

/// An id on `ch` listening at `at` (TCP port space) with `backlog`.
fn listener(ch: &CmChannel, at: &str, backlog: i32) -> CmId {
    let l = CmId::create(ch, PortSpace::Tcp).unwrap();
    l.bind_addr(addr(at)).unwrap();
    l.listen(backlog).unwrap();
    l
}

#[test]
fn a_connection_is_made_used_and_ended_through_events() {
    for profile in [Profile::Full, Profile::Rxe] {
        let f = fabric(profile);
        let (sch, server, cch, client) = listening(&f);
        assert_eq!(client.context().unwrap().device().index(), 1, "127.0.0.2 is emu1");
        let c = side(&client);
        let p = ConnParam {
            private_data: b"hello".to_vec(),
            responder_resources: 4,
            initiator_depth: 2,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
        client.connect(&p).unwrap();
        let req = next(&sch, E::ConnectRequest);
        assert!(req.listen_id.as_ref().unwrap().same(&server));
        let conn = req.id.clone();
        assert_eq!(req.param.private_data.len(), REQ_PRIVATE_DATA);
        assert_eq!(&req.param.private_data[..6], b"hello\0");
        // What the client can take is what the server may send, and the other way round.
        assert_eq!((req.param.responder_resources, req.param.initiator_depth), (2, 4));
        assert_eq!(req.param.qp_num, c.qp.qp_num());
        assert_eq!(conn.peer_addr().unwrap().ip(), client.local_addr().unwrap().ip());
        let s = side(&conn);
        let accept = ConnParam {
            private_data: b"welcome".to_vec(),
            responder_resources: 2,
            initiator_depth: 4,
            rnr_retry_count: 7,
            ..Default::default()
        };
        conn.accept(&accept).unwrap();
        let est = next(&cch, E::Established);
        assert_eq!(&est.param.private_data[..7], b"welcome");
        next(&sch, E::Established);
        assert_eq!((c.qp.state(), s.qp.state()), (QpState::RTS, QpState::RTS));

        // The QPs talk: a SEND and an RDMA READ of what it wrote.
        post_recv(&s.qp, 1, &[sge(&s.mr, 0, 64)]);
        c.mr.write(0, b"over the cm").unwrap();
        c.qp.post_send(&SendWr::send(2, &[sge(&c.mr, 0, 11)]).signaled()).unwrap();
        assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
        assert_eq!(wait1(&s.cq).byte_len, 11);
        let rd = [sge(&c.mr, 100, 11)];
        c.qp.post_send(&SendWr::read(3, &rd, s.mr.addr(), s.mr.rkey()).signaled()).unwrap();
        assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
        let mut got = [0u8; 11];
        c.mr.read(100, &mut got).unwrap();
        assert_eq!(&got, b"over the cm");

        // Either side ends it (a DREQ): its QP goes to error, the other hears at once but its
        // QP is left as it was, as the kernel's CM leaves it, until it disconnects too (its
        // DREP), which the one that ended it hears.
        client.disconnect().unwrap();
        next(&sch, E::Disconnected);
        assert_eq!((c.qp.state(), s.qp.state()), (QpState::ERR, QpState::RTS));
        cch.set_nonblocking(true).unwrap();
        assert_eq!(cch.get_event().unwrap_err().errno(), Errno::EAGAIN, "no DREP yet");
        cch.set_nonblocking(false).unwrap();
        client.disconnect().unwrap();
        conn.disconnect().unwrap();
        assert_eq!(s.qp.state(), QpState::ERR);
        next(&cch, E::Disconnected);
        // Once it is over, disconnecting again is no error, and raises nothing.
        conn.disconnect().unwrap();
        client.disconnect().unwrap();
        // Both stay in time-wait a while (2 s), then hear TIMEWAIT_EXIT, unless destroyed
        // first: the server's id is, and its time-wait (which began first) ends silently.
        conn.destroy().unwrap();
        let start = std::time::Instant::now();
        next(&cch, E::TimewaitExit);
        assert!(start.elapsed() >= std::time::Duration::from_millis(1500));
        sch.set_nonblocking(true).unwrap();
        assert_eq!(sch.get_event().unwrap_err().errno(), Errno::EAGAIN);
        assert_eq!(client.connect(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
        for id in [&client, &server] {
            id.destroy().unwrap();
        }
        drop((s.pd, c.pd));
    }
}

/// A connection made through the listener of [`listening`]: the two channels, the server's
/// id and the client's, and their sides.
fn connected(f: &Fabric) -> (CmChannel, CmId, Side, CmChannel, CmId, Side) {
    let (sch, _server, cch, client) = listening(f);
    let c = side(&client);
    client.connect(&ConnParam { rnr_retry_count: 7, ..Default::default() }).unwrap();
    let conn = next(&sch, E::ConnectRequest).id;
    let s = side(&conn);
    conn.accept(&ConnParam { rnr_retry_count: 7, ..Default::default() }).unwrap();
    next(&cch, E::Established);
    next(&sch, E::Established);
    (sch, conn, s, cch, client, c)
}

/// `rdma_migrate_id` takes the id's unread events to its new channel, in their order, as the
/// kernel's ucma moves them: librpma accepts, then moves the new connection to a channel of
/// its own, where it waits for `Established`; the RTU may come between the two (under load it
/// did: the server waited for ever). A connection request unread moves with its listener.
#[test]
fn migrating_an_id_takes_its_unread_events_along() {
    let f = fabric(Profile::Full);
    let (sch, server, cch, client) = listening(&f);
    let _c = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let conn = next(&sch, E::ConnectRequest).id;
    let _s = side(&conn);
    conn.accept(&ConnParam::default()).unwrap();
    next(&cch, E::Established);
    // A second request waits for the listener, the server's `Established` for `conn`.
    let later = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7471");
    let _l = side(&later);
    later.connect(&ConnParam::default()).unwrap();
    let (own, listeners) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    conn.migrate(&own).unwrap();
    client.disconnect().unwrap();
    server.migrate(&listeners).unwrap();
    for ch in [&sch, &own, &listeners] {
        ch.set_nonblocking(true).unwrap();
    }
    let got = |ch: &CmChannel| ch.get_event().map(|ev| (ev.event, ev.id));
    let (est, dis) = (got(&own).unwrap(), got(&own).unwrap());
    assert_eq!((est.0, dis.0), (E::Established, E::Disconnected), "moved first, then new");
    assert!(est.1.same(&conn) && dis.1.same(&conn));
    let req = listeners.get_event().unwrap();
    assert_eq!(req.event, E::ConnectRequest);
    assert!(req.listen_id.is_some_and(|l| l.same(&server)));
    for ch in [&sch, &own, &listeners] {
        assert_eq!(got(ch).unwrap_err().errno(), Errno::EAGAIN, "nothing left behind or twice");
    }
    // Moving to the channel it is on already moves nothing.
    conn.migrate(&own).unwrap();
    assert_eq!(got(&own).unwrap_err().errno(), Errno::EAGAIN);
}

/// The server's id `conn` disconnects as its side `s` took in a signaled SEND of the client's
/// (`c`), whose completion is left unread: when it did.
fn disconnected_with_a_send_unread(conn: &CmId, s: &Side, c: &Side) -> std::time::Instant {
    post_recv(&s.qp, 1, &[sge(&s.mr, 0, 64)]);
    c.qp.post_send(&SendWr::send(2, &[sge(&c.mr, 0, 3)]).signaled()).unwrap();
    assert_eq!(wait1(&s.cq).byte_len, 3, "the server took the SEND in");
    let t0 = std::time::Instant::now();
    conn.disconnect().unwrap();
    t0
}

/// `Disconnected` waits until the application read what its QP's CQs held as the DREQ came:
/// a program that reads its CQ, then its events, and closes the QP on `Disconnected` (rxm)
/// finds the completion of a SEND its peer received before it disconnected. Unread, it goes
/// after a while all the same (1 ms once a thread waits on the channel for it, 200 ms if none
/// does), and the completions are still there.
///
/// A thread descheduled for longer than the hold finds the event there already: such a try
/// only checks that the hold ran out first, and the test tries again (a loaded machine).
#[test]
fn disconnected_waits_for_the_completions_that_came_before_it_to_be_read() {
    // Read without waiting, well after the DREQ (as rxm reads its channel after a CQ it
    // found empty, kept off its core in between): still held, the SEND's completion unread.
    let held_past_a_descheduling = (0..20).any(|_| {
        let f = fabric(Profile::Full);
        let (_sch, conn, s, cch, _client, c) = connected(&f);
        let t0 = disconnected_with_a_send_unread(&conn, &s, &c);
        cch.set_nonblocking(true).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let late = cch.get_event();
        let wc = c.cq.poll_one().expect("the SEND's completion");
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::SUCCESS));
        match late {
            Ok(ev) => {
                assert_eq!(ev.event, E::Disconnected);
                assert!(t0.elapsed() >= std::time::Duration::from_millis(200), "not held");
                false
            }
            Err(e) => {
                assert_eq!(e.errno(), Errno::EAGAIN, "held: the SEND unread");
                next(&cch, E::Disconnected);
                true
            }
        }
    });
    assert!(held_past_a_descheduling, "never found held after 20 ms");

    // The other way round, the server's receive left unread and its thread blocked on the
    // channel (it waits for the event, not reading its CQ): the event comes after the short
    // hold, not the long one (a try kept off its core for the long one tries again).
    let soon = (0..5).any(|_| {
        let f = fabric(Profile::Full);
        let (sch, _conn, s, _cch, client, c) = connected(&f);
        post_recv(&s.qp, 1, &[sge(&s.mr, 0, 64)]);
        c.qp.post_send(&SendWr::send(2, &[sge(&c.mr, 0, 5)]).signaled()).unwrap();
        assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
        let t0 = std::time::Instant::now();
        client.disconnect().unwrap();
        next(&sch, E::Disconnected);
        let wc = s.cq.poll_one().expect("the receive's completion, still there");
        assert_eq!((wc.wr_id, wc.byte_len), (1, 5));
        t0.elapsed() < std::time::Duration::from_millis(100)
    });
    assert!(soon, "a blocked reader waited out the long hold every time");

    // Held when its device goes: it comes first, as its DREQ came first.
    let f = fabric(Profile::Full);
    let (_sch, conn, s, cch, _client, c) = connected(&f);
    disconnected_with_a_send_unread(&conn, &s, &c);
    f.set_faults(FaultRule::parse("device-removal:dev=emu1").unwrap());
    next(&cch, E::Disconnected);
    next(&cch, E::DeviceRemoval);
}

#[test]
fn refusals_come_back_as_rejected_with_the_reason() {
    let f = fabric(Profile::Full);
    let (sch, server, cch, client) = listening(&f);
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    assert_eq!(
        req.id
            .accept(&ConnParam { private_data: vec![7; 197], ..Default::default() })
            .unwrap_err()
            .errno(),
        Errno::EINVAL
    );
    // As the kernel's rdma_accept (recorded on rxe): its own failure rejects the request,
    // consumer-defined and without private data; the request is then answered.
    let rej = next(&cch, E::Rejected);
    assert_eq!(rej.status, REJ_CONSUMER_DEFINED);
    assert!(rej.param.private_data.iter().all(|&b| b == 0));
    assert_eq!(req.id.reject(b"go away").unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(req.id.accept(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);

    let again = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7471");
    again.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    let long = vec![1; REJ_PRIVATE_DATA + 1];
    assert_eq!(req.id.reject(&long).unwrap_err().errno(), Errno::EINVAL, "the request stands");
    req.id.reject(b"go away").unwrap();
    let rej = next(&cch, E::Rejected);
    assert_eq!(rej.status, REJ_CONSUMER_DEFINED);
    assert_eq!(&rej.param.private_data[..7], b"go away");
    // The rejected id is good for nothing but destroying, as the kernel's: it was made idle
    // again, a bind failing there left it without its local address, and a connect from it
    // then panicked (the CM fuzzer's find).
    let taken = addr("127.0.0.2:7471");
    assert_eq!(req.id.bind_addr(taken).unwrap_err().errno(), Errno::EINVAL);
    let (to, route) = (addr("127.0.0.2:7471"), 2000);
    assert_eq!(req.id.resolve_addr(None, to, route).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(req.id.connect(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
    req.id.destroy().unwrap();

    // Nobody listens on that port: the CM's "invalid service ID".
    let other = CmId::create(&cch, PortSpace::Tcp).unwrap();
    other.resolve_addr(None, addr("127.0.0.1:9"), 2000).unwrap();
    next(&cch, E::AddrResolved);
    other.resolve_route(2000).unwrap();
    next(&cch, E::RouteResolved);
    let too_much = ConnParam { private_data: vec![1; REQ_PRIVATE_DATA + 1], ..Default::default() };
    assert_eq!(other.connect(&too_much).unwrap_err().errno(), Errno::EINVAL);
    other.connect(&ConnParam::default()).unwrap();
    assert_eq!(next(&cch, E::Rejected).status, REJ_INVALID_SERVICE_ID);
    drop(server);
}

/// What is left of both ids of a rejected connection, as on rxe (librdmacm 44, kernel 6.1;
/// docs/rdma-cm.md): the requester's QP goes to the error state with the rejection and its id
/// stays in its connect state, where connecting, resolving or listening again fails; each id
/// takes a disconnection, which has nothing to end (0, nothing sent, its QP to the error
/// state). A disconnection of an id that never connected fails, its QP still moved (librdmacm
/// moves it before it asks the kernel).
#[test]
fn a_rejected_connection_leaves_each_id_a_disconnection_with_nothing_to_end() {
    let f = fabric(Profile::Rxe);
    let (sch, _server, cch, client) = listening(&f);
    let c = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    let s = side(&req.id);
    req.id.reject(&[]).unwrap();
    assert_eq!(s.qp.state(), QpState::INIT, "a rejection leaves the rejecting side's QP");
    req.id.disconnect().unwrap();
    assert_eq!(s.qp.state(), QpState::ERR);
    assert_eq!(req.id.reject(&[]).unwrap_err().errno(), Errno::EINVAL);

    assert_eq!(next(&cch, E::Rejected).status, REJ_CONSUMER_DEFINED);
    assert_eq!(c.qp.state(), QpState::ERR, "librdmacm's move as it reads the rejection");
    let to = addr("127.0.0.2:7471");
    assert_eq!(client.resolve_route(2000).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(client.resolve_addr(None, to, 2000).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(client.connect(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(client.listen(1).unwrap_err().errno(), Errno::EINVAL);
    client.disconnect().unwrap();
    client.disconnect().unwrap();
    assert!(client.path().is_some(), "the route stays");
    cch.set_nonblocking(true).unwrap();
    sch.set_nonblocking(true).unwrap();
    assert_eq!(cch.get_event().unwrap_err().errno(), Errno::EAGAIN, "nothing was ended");
    assert_eq!(sch.get_event().unwrap_err().errno(), Errno::EAGAIN, "nothing was sent");

    let never = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7471");
    let n = side(&never);
    assert_eq!(never.disconnect().unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(n.qp.state(), QpState::ERR);
    req.id.destroy().unwrap();
    client.destroy().unwrap();

    // An id destroyed with its event unread takes the event's readiness along: the channel
    // polled readable for it, and a blocking read then waited for ever.
    cch.set_nonblocking(false).unwrap();
    never.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    req.id.reject(&[]).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&cch);
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, live for the call.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "the rejection arrives");
    never.destroy().unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "readable for an event gone");
    req.id.destroy().unwrap();
}

/// A request not yet answered is left standing by a disconnection at either end, as the
/// kernel's IB CM sends nothing before the connection is established (measured on rxe,
/// `tests/c/cm_states.c`): 0, the QP to the error state, no event; the server can still
/// answer it. The server's `rdma_establish` of a request (librdmacm's accept as an RTU) is
/// `EINVAL` and rejects it, as the kernel's accept does; a listener takes no QP and gives no
/// QP attributes, nor does an id whose connection is over.
#[test]
fn a_request_not_yet_answered_stands_a_disconnection_at_either_end() {
    let f = fabric(Profile::Rxe);
    let (sch, server, cch, client) = listening(&f);
    let c = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    client.disconnect().unwrap();
    assert_eq!(c.qp.state(), QpState::ERR);
    req.id.disconnect().unwrap();
    cch.set_nonblocking(true).unwrap();
    sch.set_nonblocking(true).unwrap();
    assert_eq!(cch.get_event().unwrap_err().errno(), Errno::EAGAIN, "no DISCONNECTED");
    assert_eq!(sch.get_event().unwrap_err().errno(), Errno::EAGAIN, "nothing was sent");
    assert_eq!(req.id.establish().unwrap_err().errno(), Errno::EINVAL);
    cch.set_nonblocking(false).unwrap();
    assert_eq!(next(&cch, E::Rejected).status, REJ_CONSUMER_DEFINED);
    assert_eq!(client.init_qp_attr(QpState::INIT).unwrap_err().errno(), Errno::EINVAL);

    assert_eq!(server.init_qp_attr(QpState::INIT).unwrap_err().errno(), Errno::EINVAL);
    let ctx = server.context().unwrap();
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4, None, 0).unwrap());
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(4))).unwrap();
    assert_eq!(server.set_qp(&qp).unwrap_err().errno(), Errno::EINVAL);
}

/// A client may withdraw its own RC request before the answer (`rdma_reject` of it), as the
/// kernel's IB CM lets it (measured on rxe, `tests/c/cm_states.c`): 0, no event either side,
/// its QP left in INIT. The server's answer, accept or reject, is then ignored, and the id is
/// good for nothing but a disconnection with nothing to end (its QP to the error state) and
/// destroying, as the kernel's code reads (docs/rdma-cm.md says why this part is not
/// recorded). A SIDR request cannot be withdrawn (`EINVAL`, as on rxe).
#[test]
fn a_client_withdraws_its_own_request_and_ignores_the_answer() {
    let f = fabric(Profile::Rxe);
    let (sch, _server, cch, client) = listening(&f);
    let c = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    assert_eq!(client.reject(&[0; 149]).unwrap_err().errno(), Errno::EINVAL, "too long");
    client.reject(b"never mind").unwrap();
    assert_eq!(c.qp.state(), QpState::INIT);
    assert!(quiet(&cch) && quiet(&sch), "nothing heard either side");
    let s = side(&req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    assert!(quiet(&cch), "the answer is ignored");
    assert_eq!(c.qp.state(), QpState::INIT);
    assert_eq!(client.reject(&[]).unwrap_err().errno(), Errno::EINVAL, "withdrawn already");
    assert_eq!(client.connect(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(client.establish().unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(client.init_qp_attr(QpState::INIT).unwrap_err().errno(), Errno::EINVAL);
    client.disconnect().unwrap();
    assert_eq!(c.qp.state(), QpState::ERR);
    assert!(quiet(&cch) && quiet(&sch), "nothing to end");
    drop(s);

    // A rejection that comes after the withdrawal is ignored too.
    let client = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7471");
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    client.reject(&[]).unwrap();
    req.id.reject(b"no").unwrap();
    assert!(quiet(&cch), "no REJECTED");

    let server = CmId::create(&sch, PortSpace::Udp).unwrap();
    server.bind_addr(addr("127.0.0.1:7487")).unwrap();
    server.listen(1).unwrap();
    let client = resolved(&cch, PortSpace::Udp, None, "127.0.0.1:7487");
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    assert_eq!(client.reject(&[]).unwrap_err().errno(), Errno::EINVAL);
    req.id.accept(&ConnParam::default()).unwrap();
    next(&cch, E::Established);
}

/// A request whose requester's id goes before the answer can no longer be answered, as with
/// the kernel's IB CM (its REJ, reason "timeout", as it destroys an id whose request is out;
/// measured on rxe): the server hears nothing, its QP is left as it was, and its accept is
/// `EINVAL`. In one process, and between two fabrics joined as two processes are; the id
/// destroyed, or its device removed (the kernel's CM destroys its IB CM id then too).
#[test]
fn a_request_whose_requester_goes_can_no_longer_be_accepted() {
    let one = fabric(Profile::Rxe);
    let host = Host::new("requester-gone");
    let (fa, fb) = (host.fabric(), host.fabric());
    let cases = [
        (&one, &one, "127.0.0.2:7610", false),
        (&fa, &fb, "127.0.0.2:7611", false),
        (&one, &one, "127.0.0.2:7612", true),
        (&fa, &fb, "127.0.0.2:7613", true),
    ];
    for (fs, fc, to, removed) in cases {
        // The client on emu0 (127.0.0.1), the server on emu1.
        let (sch, _server, cch, client) = listening_on(fs, fc, to, Some("127.0.0.1:0"));
        let c = side(&client);
        client.connect(&ConnParam::default()).unwrap();
        let req = next(&sch, E::ConnectRequest);
        let s = side(&req.id);
        drop(c);
        if removed {
            fc.set_faults(FaultRule::parse("device-removal:dev=emu0").unwrap());
            next(&cch, E::DeviceRemoval);
        } else {
            client.destroy().unwrap();
        }
        // Across processes the word travels: the request's QP attributes, which an id whose
        // connection is over no longer gives, show when it came.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while req.id.init_qp_attr(QpState::INIT).is_ok() {
            assert!(std::time::Instant::now() < deadline, "the request still stands");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let refused = req.id.accept(&ConnParam::default()).unwrap_err();
        assert_eq!(refused.errno(), Errno::EINVAL);
        assert_eq!(s.qp.state(), QpState::INIT);
        assert!(quiet(&sch), "no event");
        req.id.disconnect().unwrap();
    }
}

/// A requester without a QP of its own that hears the reply (`ConnectResponse`) and then
/// rejects it or goes: the server that accepted hears `Rejected` (reason 28, consumer
/// defined, the private data padded to 148 bytes) and its QP goes to the error state; the
/// requester hears nothing more (measured on rxe).
#[test]
fn a_reply_refused_by_its_requester_is_rejected_at_the_server() {
    let one = fabric(Profile::Rxe);
    let host = Host::new("reply-refused");
    let (fa, fb) = (host.fabric(), host.fabric());
    let cases = [
        (&one, &one, "127.0.0.2:7620", true),
        (&one, &one, "127.0.0.2:7621", false),
        (&fa, &fb, "127.0.0.2:7622", false),
    ];
    for (fs, fc, to, rejects) in cases {
        let (sch, _server, cch, client) = listening_on(fs, fc, to, None);
        client.connect(&ConnParam::default()).unwrap();
        let req = next(&sch, E::ConnectRequest);
        let s = side(&req.id);
        req.id.accept(&ConnParam::default()).unwrap();
        next(&cch, E::ConnectResponse);
        if rejects {
            client.reject(b"x").unwrap();
        } else {
            client.destroy().unwrap();
        }
        let rej = next(&sch, E::Rejected);
        assert_eq!(rej.status, REJ_CONSUMER_DEFINED);
        let private = &rej.param.private_data;
        assert_eq!(private.len(), 148);
        assert_eq!(&private[..1], if rejects { &b"x"[..] } else { &[0][..] });
        assert_eq!(s.qp.state(), QpState::ERR);
        if rejects {
            assert!(quiet(&cch), "the requester hears nothing");
            assert_eq!(client.accept(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
        }
    }
}

/// A server that accepts a request its requester withdrew waits for the RTU as the kernel's
/// IB CM does, its REP sent 16 times ~4.3 s apart, then hears `Unreachable` (`ETIMEDOUT`), its
/// QP left as it was (measured on rxe: after 68.3 s). In simulated time.
#[test]
fn an_accepted_request_whose_requester_withdrew_becomes_unreachable() {
    let addresses = PortAddress::parse_list("127.0.0.2=emu1").unwrap();
    let f = Fabric::new(FabricConfig { addresses, seed: Some(9), ..Default::default() });
    let (sch, _server, _cch, client) = listening_on(&f, &f, "127.0.0.2:7623", None);
    let _c = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    let s = side(&req.id);
    client.reject(&[]).unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    let t0 = f.now_ns();
    let gave_up = next(&sch, E::Unreachable);
    assert_eq!(gave_up.status, -libc::ETIMEDOUT);
    let waited = f.now_ns() - t0;
    assert!((68_000_000_000..69_000_000_000).contains(&waited), "after {waited} ns");
    assert_eq!(s.qp.state(), QpState::RTS, "left as it was");
    assert_eq!(req.id.accept(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
}

/// A request sent before its server listens is judged where it arrives, as the kernel's CM
/// judges it: a listener that comes meanwhile gets it (perftest's `-R` makes its data
/// connection's listener while its client connects). In simulated time, where the request's
/// looks wait for virtual time, which moves only once the test waits.
#[test]
fn a_request_meets_the_listener_that_comes_while_it_travels() {
    let addresses = PortAddress::parse_list("127.0.0.2=emu1").unwrap();
    let f = Fabric::new(FabricConfig { addresses, seed: Some(5), ..Default::default() });
    let (sch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let client = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7472");
    client.connect(&ConnParam::default()).unwrap();
    cch.set_nonblocking(true).unwrap();
    let early = cch.get_event().map(|ev| (ev.event, ev.status));
    assert_eq!(early.unwrap_err().errno(), Errno::EAGAIN, "not refused at once");
    cch.set_nonblocking(false).unwrap();
    let server = CmId::create(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(addr("127.0.0.2:7472")).unwrap();
    server.listen(4).unwrap();
    let req = next(&sch, E::ConnectRequest);
    req.id.reject(b"seen").unwrap();
    let rej = next(&cch, E::Rejected);
    assert_eq!(rej.status, REJ_CONSUMER_DEFINED, "the listener's own answer");
    assert_eq!(&rej.param.private_data[..4], b"seen");
}

/// A request that no listener meets on its way is refused as nobody's; one whose id is
/// destroyed on its way reaches nobody.
#[test]
fn a_request_that_meets_no_listener_is_refused_and_a_destroyed_ones_ends() {
    let f = fabric(Profile::Full);
    let (sch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let gone = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7474");
    gone.connect(&ConnParam::default()).unwrap();
    gone.destroy().unwrap();
    let late = CmId::create(&sch, PortSpace::Tcp).unwrap();
    late.bind_addr(addr("127.0.0.2:7474")).unwrap();
    late.listen(4).unwrap();
    // Sent after the destroyed id's, this request is refused after that one has ended.
    let lost = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7475");
    lost.connect(&ConnParam::default()).unwrap();
    let rej = next(&cch, E::Rejected);
    assert!(rej.id.same(&lost));
    assert_eq!(rej.status, REJ_INVALID_SERVICE_ID);
    sch.set_nonblocking(true).unwrap();
    let none = sch.get_event().map(|ev| ev.event);
    assert_eq!(none.unwrap_err().errno(), Errno::EAGAIN, "no request from the destroyed id");
}

#[test]
fn addresses_ports_and_states_are_checked() {
    let f = fabric(Profile::Full);
    let ch = CmChannel::new(&f).unwrap();
    let a = CmId::create(&ch, PortSpace::Tcp).unwrap();
    a.bind_addr(addr("127.0.0.1:5000")).unwrap();
    let b = CmId::create(&ch, PortSpace::Tcp).unwrap();
    // As Linux 6.1 answers (recorded on rxe): a wildcard or loopback address on either side is
    // EADDRNOTAVAIL, the same address twice EADDRINUSE.
    assert_eq!(b.bind_addr(addr("127.0.0.1:5000")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    assert_eq!(b.bind_addr(addr("0.0.0.0:5000")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    let (s1, s2) =
        (CmId::create(&ch, PortSpace::Tcp).unwrap(), CmId::create(&ch, PortSpace::Tcp).unwrap());
    s1.bind_addr(addr("192.0.2.77:5001")).unwrap();
    assert_eq!(s2.bind_addr(addr("192.0.2.77:5001")).unwrap_err().errno(), Errno::EADDRINUSE);
    assert_eq!(s2.bind_addr(addr("0.0.0.0:5001")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    // Another port space, another address's port, or port 0 are free.
    let u = CmId::create(&ch, PortSpace::Udp).unwrap();
    u.bind_addr(addr("127.0.0.1:5000")).unwrap();
    b.bind_addr(addr("127.0.0.2:5000")).unwrap();
    let c = CmId::create(&ch, PortSpace::Tcp).unwrap();
    c.bind_addr(addr("127.0.0.1:0")).unwrap();
    assert!(c.local_addr().unwrap().port() >= 32768);
    assert_eq!(c.port_num(), 1);
    let d = CmId::create(&ch, PortSpace::Tcp).unwrap();
    assert_eq!(d.bind_addr(addr("192.0.2.1:1")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    // Destroying frees the port.
    a.destroy().unwrap();
    d.bind_addr(addr("127.0.0.1:5000")).unwrap();

    // An address no port has: ADDR_ERROR, not a hang.
    let e = CmId::create(&ch, PortSpace::Tcp).unwrap();
    e.resolve_addr(None, addr("192.0.2.1:1"), 100).unwrap();
    assert_eq!(next(&ch, E::AddrError).status, -libc_ehostunreach());
    // Calls in the wrong state.
    assert_eq!(e.resolve_route(10).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(e.connect(&ConnParam::default()).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(e.reject(&[]).unwrap_err().errno(), Errno::EINVAL);
    // The kernel leaves an id whose address failed to resolve bound (ADDR_BOUND), and an
    // unbound one is bound by rdma_listen: it listens either way.
    e.listen(1).unwrap();
    d.listen(1).unwrap();
    assert_eq!(d.listen(1).unwrap_err().errno(), Errno::EINVAL);
    // An id never bound listens on the wildcard and a port of the system's choosing (rxe).
    let l = CmId::create(&ch, PortSpace::Tcp).unwrap();
    l.listen(1).unwrap();
    let at = l.local_addr().unwrap();
    assert!(at.ip().is_unspecified() && at.port() >= 32768, "{at}");
    e.destroy().unwrap();
    assert_eq!(e.destroy().unwrap_err().errno(), Errno::EINVAL);
}

fn libc_ehostunreach() -> i32 {
    113
}

/// Two fabrics on one host fabric: two nodes, exactly as two processes.
struct Host(std::path::PathBuf);

impl Host {
    fn new(tag: &str) -> Host {
        let dir = std::env::temp_dir().join(format!("rdma-emu-cm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Host(dir)
    }

    fn fabric(&self) -> Fabric {
        let addresses = PortAddress::parse_list("127.0.0.2=emu1").unwrap();
        let host = Some(self.0.to_str().unwrap().to_owned());
        Fabric::new(FabricConfig { addresses, host, ..Default::default() })
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two processes binding free ports at once never get the same one: the port's file is
/// created by one of them only (each process counts its free ports from 32768).
#[test]
fn processes_binding_free_ports_at_once_get_different_ones() {
    let host = Host::new("ports");
    let fabrics = [host.fabric(), host.fabric()];
    let ports: Vec<Vec<(u16, CmId)>> = std::thread::scope(|s| {
        let each = fabrics.iter().map(|f| {
            s.spawn(move || {
                let ch = CmChannel::new(f).unwrap();
                (0..40)
                    .map(|_| {
                        let id = CmId::create(&ch, PortSpace::Tcp).unwrap();
                        id.bind_addr(addr("0.0.0.0:0")).unwrap();
                        (id.local_addr().unwrap().port(), id)
                    })
                    .collect()
            })
        });
        each.collect::<Vec<_>>().into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut all: Vec<u16> = ports.iter().flatten().map(|(p, _)| *p).collect();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "a port handed to both processes");
}

/// A port another process holds is refused; its id's destroy gives it back at once (each
/// destroy gives back its own ports alone). One whose id was dropped without a destroy is
/// given back once as many ports were taken since as are bound (64 at least).
#[test]
fn a_port_is_given_back_to_other_processes_by_its_ids_destroy_or_later_by_a_sweep() {
    let host = Host::new("give-back");
    let (fa, fb) = (host.fabric(), host.fabric());
    let (cha, chb) = (CmChannel::new(&fa).unwrap(), CmChannel::new(&fb).unwrap());
    let bind = |ch: &CmChannel, port: u16| {
        let id = CmId::create(ch, PortSpace::Tcp).unwrap();
        let bound = id.bind_addr(SocketAddr::from(([0, 0, 0, 0], port)));
        bound.map(|()| id).map_err(|e| e.errno())
    };
    let held = bind(&cha, 7700).unwrap();
    assert_eq!(bind(&chb, 7700).unwrap_err(), Errno::EADDRNOTAVAIL);
    held.destroy().unwrap();
    bind(&chb, 7700).unwrap().destroy().unwrap();

    drop(bind(&cha, 7701).unwrap());
    assert_eq!(bind(&chb, 7701).unwrap_err(), Errno::EADDRNOTAVAIL, "not swept yet");
    let more: Vec<CmId> = (0..64).map(|_| bind(&cha, 0).unwrap()).collect();
    bind(&chb, 7701).expect("swept").destroy().unwrap();
    for id in more {
        id.destroy().unwrap();
    }
}

#[test]
fn connections_cross_between_processes_and_end_when_one_dies() {
    let host = Host::new("cross");
    let (fa, fb) = (host.fabric(), host.fabric());
    let (sch, cch) = (CmChannel::new(&fa).unwrap(), CmChannel::new(&fb).unwrap());
    let server = CmId::create(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(addr("127.0.0.2:7600")).unwrap();
    server.listen(2).unwrap();
    // The port is taken in the other process too.
    let squatter = CmId::create(&cch, PortSpace::Tcp).unwrap();
    assert_eq!(squatter.bind_addr(addr("0.0.0.0:7600")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);

    let connect = |payload: &[u8]| {
        let client = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7600");
        let c = side(&client);
        let p = ConnParam {
            private_data: payload.to_vec(),
            initiator_depth: 1,
            responder_resources: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
        client.connect(&p).unwrap();
        let req = next(&sch, E::ConnectRequest);
        assert_eq!(&req.param.private_data[..payload.len()], payload);
        let conn = req.id;
        let s = side(&conn);
        conn.accept(&ConnParam {
            initiator_depth: 1,
            responder_resources: 1,
            ..Default::default()
        })
        .unwrap();
        next(&cch, E::Established);
        next(&sch, E::Established);
        (client, c, conn, s)
    };
    let (client, c, conn, s) = connect(b"first");
    post_recv(&s.qp, 1, &[sge(&s.mr, 0, 64)]);
    c.mr.write(0, b"between processes").unwrap();
    c.qp.post_send(&SendWr::send(2, &[sge(&c.mr, 0, 17)]).signaled()).unwrap();
    assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&s.cq).byte_len, 17);
    // The server ends it this time; the client's answer (here by destroying its id) is what
    // the server hears.
    conn.disconnect().unwrap();
    next(&cch, E::Disconnected);
    assert_eq!(c.qp.state(), QpState::RTS, "the peer's DREQ leaves the QP to its owner");
    client.destroy().unwrap();
    next(&sch, E::Disconnected);
    drop((client, c, conn, s));

    // A second connection; then the client's process goes away.
    let (client, c, conn, s) = connect(b"second");
    drop((client, c, cch, squatter));
    drop(fb);
    let ev = next(&sch, E::Disconnected);
    assert!(ev.id.same(&conn));
    assert_eq!(s.qp.state(), QpState::RTS, "as after a DREQ: the owner disconnects it");
    conn.disconnect().unwrap();
    assert_eq!(s.qp.state(), QpState::ERR);

    // Nobody listens on another port, in any process.
    let fc = host.fabric();
    let ch = CmChannel::new(&fc).unwrap();
    let lost = resolved(&ch, PortSpace::Tcp, None, "127.0.0.2:7601");
    lost.connect(&ConnParam::default()).unwrap();
    assert_eq!(next(&ch, E::Rejected).status, REJ_INVALID_SERVICE_ID);
}

/// A UD request is answered by a SIDR REP whose status the requester hears with
/// `Unreachable`, not `Rejected` (measured on rxe): 1 (unsupported) when nobody listens, 2
/// (reject) when the listener's application says no.
#[test]
fn refused_datagram_requests_come_back_as_unreachable_with_the_sidr_status() {
    let f = fabric(Profile::Rxe);
    let (sch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let nobody = resolved(&cch, PortSpace::Udp, None, "127.0.0.1:7485");
    nobody.connect(&ConnParam::default()).unwrap();
    assert_eq!(next(&cch, E::Unreachable).status, cm::SIDR_UNSUPPORTED);

    let server = CmId::create(&sch, PortSpace::Udp).unwrap();
    server.bind_addr(addr("127.0.0.1:7486")).unwrap();
    server.listen(1).unwrap();
    let client = resolved(&cch, PortSpace::Udp, None, "127.0.0.1:7486");
    client.connect(&ConnParam::default()).unwrap();
    next(&sch, E::ConnectRequest).id.reject(b"no").unwrap();
    let refused = next(&cch, E::Unreachable);
    assert_eq!(refused.status, cm::SIDR_REJECT);
    assert_eq!(&refused.param.private_data[..2], b"no");
}

#[test]
fn datagram_ids_learn_each_others_qpn_and_address() {
    let f = fabric(Profile::Full);
    let (sch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let server = CmId::create(&sch, PortSpace::Udp).unwrap();
    server.bind_addr(addr("127.0.0.2:7480")).unwrap();
    server.listen(1).unwrap();
    let client = resolved(&cch, PortSpace::Udp, None, "127.0.0.2:7480");
    let ud_side = |id: &CmId| {
        let ctx = id.context().unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(16, None, 0).unwrap());
        let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::UD, &cq, cap(8))).unwrap();
        id.set_qp(&qp).unwrap();
        assert_eq!(qp.state(), QpState::RTS, "a UD QP is ready at once");
        Side { pd, cq, mr, qp }
    };
    let c = ud_side(&client);
    client.connect(&ConnParam { private_data: b"sidr".to_vec(), ..Default::default() }).unwrap();
    let req = next(&sch, E::ConnectRequest);
    // A SIDR REQ names neither the requester's QP nor its address (as on rxe): the server
    // learns them from the first datagram.
    let nothing = req.ud.expect("a UD request has its param.ud");
    assert_eq!((nothing.qp_num, nothing.qkey, nothing.ah_attr), (0, 0, AhAttr::default()));
    assert_eq!(req.param.private_data.len(), cm::SIDR_REQ_PRIVATE_DATA);
    let s = ud_side(&req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    let est = next(&cch, E::Established);
    let to_server = est.ud.expect("the reply carries the server's address");
    assert_eq!(to_server.qp_num, s.qp.qp_num());
    // The client sends with what it learnt, the server answers with what it was told.
    let ah = c.pd.create_ah(&to_server.ah_attr).unwrap();
    post_recv(&s.qp, 1, &[sge(&s.mr, 0, 256)]);
    c.mr.write(0, b"datagram").unwrap();
    let sg = [sge(&c.mr, 0, 8)];
    let send = SendWr::send_ud(2, &sg, &ah, to_server.qp_num, to_server.qkey);
    c.qp.post_send(&send.signaled()).unwrap();
    assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
    let wc = wait1(&s.cq);
    assert_eq!((wc.status, wc.src_qp), (WcStatus::SUCCESS, c.qp.qp_num()));
    let to_client = AhAttr { dlid: wc.slid, port_num: 1, ..Default::default() };
    let back = s.pd.create_ah(&to_client).unwrap();
    post_recv(&c.qp, 3, &[sge(&c.mr, 1024, 256)]);
    let sg = [sge(&s.mr, 40, 8)];
    let reply = SendWr::send_ud(4, &sg, &back, wc.src_qp, cm::UDP_QKEY);
    s.qp.post_send(&reply.signaled()).unwrap();
    assert_eq!(wait1(&s.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
    let mut got = [0u8; 8];
    c.mr.read(1024 + 40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    // The exchange ended with the reply: destroying either id tells the other nothing (it
    // sent a DREQ, and the client heard `Disconnected`).
    req.id.destroy().unwrap();
    cch.set_nonblocking(true).unwrap();
    assert_eq!(cch.get_event().unwrap_err().errno(), Errno::EAGAIN);
}

#[test]
fn options_share_ports_split_families_and_reach_the_qp() {
    let f = fabric(Profile::Full);
    let ch = CmChannel::new(&f).unwrap();
    let id = || CmId::create(&ch, PortSpace::Tcp).unwrap();
    // REUSEADDR: ids that all say so share a port until one listens.
    let (a, b, c) = (id(), id(), id());
    a.set_reuse_addr(true).unwrap();
    b.set_reuse_addr(true).unwrap();
    a.bind_addr(addr("127.0.0.1:6000")).unwrap();
    b.bind_addr(addr("127.0.0.1:6000")).unwrap();
    assert_eq!(a.set_reuse_addr(true).unwrap_err().errno(), Errno::EINVAL, "bound already");
    assert_eq!(c.bind_addr(addr("127.0.0.1:6000")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    a.listen(1).unwrap();
    let d = id();
    d.set_reuse_addr(true).unwrap();
    assert_eq!(d.bind_addr(addr("127.0.0.1:6000")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    // AFONLY: an IPv6-only wildcard leaves IPv4 addresses of the port free.
    let (v6, v4) = (id(), id());
    v6.set_af_only(true).unwrap();
    v6.bind_addr(addr("[::]:6001")).unwrap();
    v4.bind_addr(addr("127.0.0.1:6001")).unwrap();
    let (w6, w4) = (id(), id());
    w6.bind_addr(addr("[::]:6002")).unwrap();
    assert_eq!(w4.bind_addr(addr("127.0.0.1:6002")).unwrap_err().errno(), Errno::EADDRNOTAVAIL);
    // ACK_TIMEOUT reaches the connected QP; a value past 31 is refused.
    let (sch, server, cch, client) = listening(&f);
    assert_eq!(client.set_ack_timeout(32).unwrap_err().errno(), Errno::EINVAL);
    client.set_ack_timeout(18).unwrap();
    let cs = side(&client);
    client
        .connect(&ConnParam { responder_resources: 1, initiator_depth: 1, ..Default::default() })
        .unwrap();
    let req = next(&sch, E::ConnectRequest);
    let _ss = side(&req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    next(&cch, E::Established);
    assert_eq!(cs.qp.query().unwrap().timeout, 18);
    drop(server);
}

/// `rdma_init_qp_attr`: a server that moves its own QP (never given to the id) through INIT,
/// RTR and RTS with the attributes the CM hands out, and accepts with its QPN, talks to a
/// client whose QP the CM moved.
#[test]
fn init_qp_attr_gives_what_takes_a_qp_of_ones_own_through_the_connection() {
    for profile in [Profile::Full, Profile::Rxe] {
        let f = fabric(profile);
        let fresh = CmId::create(&CmChannel::new(&f).unwrap(), PortSpace::Tcp).unwrap();
        let e = fresh.init_qp_attr(QpState::INIT).unwrap_err();
        assert_eq!(e.errno(), Errno::EINVAL, "no port yet");
        let (sch, server, cch, client) = listening(&f);
        assert_eq!(client.init_qp_attr(QpState::RTR).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(client.init_qp_attr(QpState::SQD).unwrap_err().errno(), Errno::EINVAL);
        let c = side(&client);
        let p = ConnParam {
            responder_resources: 2,
            initiator_depth: 3,
            retry_count: 6,
            rnr_retry_count: 5,
            ..Default::default()
        };
        client.connect(&p).unwrap();
        let conn = next(&sch, E::ConnectRequest).id;
        // The server's own QP, set up by hand from what the CM says.
        let ctx = conn.context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None, 0).unwrap();
        let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(8))).unwrap();
        let (init, mask) = conn.init_qp_attr(QpState::INIT).unwrap();
        // The kernel CM's access: remote writes, and reads and atomics since the client
        // sends some (its initiator depth is not 0); no local write (the MRs' business).
        let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!((init.port_num, init.qp_access_flags), (1, remote | AccessFlags::REMOTE_ATOMIC));
        qp.modify(&init, mask).unwrap();
        let (rtr, mask) = conn.init_qp_attr(QpState::RTR).unwrap();
        assert_eq!(rtr.dest_qp_num, c.qp.qp_num());
        // On RoCE the path goes between the GIDs of the two ends' addresses (both 127.0.0.2
        // here: emu1's), which emu1's GID table holds after its own two; on InfiniBand by LID.
        let gid = Gid::of_ip(addr("127.0.0.2:0").ip());
        let av = rtr.ah_attr;
        if profile == Profile::Rxe {
            let table = ctx.device().gid_table(1).unwrap();
            let at = table.iter().find(|e| e.gid == gid).expect("the address's GID").index;
            assert!(at >= 2, "{table:?}");
            assert!(av.is_global && av.dgid == gid && av.sgid_index as u32 == at, "{av:?}");
            let emu0s = Gid::of_ip(addr("127.0.0.1:0").ip());
            assert!(!table.iter().any(|e| e.gid == emu0s), "emu0's address is not emu1's");
        } else {
            assert!(!av.is_global && av.dlid == ctx.query_port(1).unwrap().lid, "{av:?}");
        }
        assert_eq!(rtr.max_dest_rd_atomic, 3, "what the client's request asks to read at once");
        assert!(mask.contains(QpAttrMask::AV | QpAttrMask::RQ_PSN | QpAttrMask::PATH_MTU));
        qp.modify(&rtr, mask).unwrap();
        let (rts, mask) = conn.init_qp_attr(QpState::RTS).unwrap();
        assert_eq!((rts.max_rd_atomic, rts.retry_cnt, rts.rnr_retry), (2, 6, 5));
        qp.modify(&rts, mask).unwrap();
        let accept = ConnParam { qp_num: qp.qp_num(), rnr_retry_count: 5, ..p.clone() };
        conn.accept(&accept).unwrap();
        next(&cch, E::Established);
        next(&sch, E::Established);
        // The client's RTS, as the CM computed it, is what its QP got.
        let (crts, _) = client.init_qp_attr(QpState::RTS).unwrap();
        assert_eq!(crts.sq_psn, c.qp.query().unwrap().sq_psn);
        post_recv(&qp, 1, &[sge(&mr, 0, 64)]);
        c.mr.write(0, b"own qp").unwrap();
        c.qp.post_send(&SendWr::send(2, &[sge(&c.mr, 0, 6)]).signaled()).unwrap();
        assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
        assert_eq!(wait1(&cq).byte_len, 6);
        for id in [&client, &conn, &server] {
            id.destroy().unwrap();
        }
        let _ = (qp.destroy(), mr.dereg());
    }
}

/// `rdma_notify(COMM_EST)`: an accepted connection whose RTU has not come yet (the client
/// establishes by hand, later) is established by the notification, once.
#[test]
fn a_notification_establishes_before_the_rtu() {
    let f = fabric(Profile::Full);
    let (sch, server, cch, client) = listening(&f);
    // The client connects a QP of its own: it must establish itself after the reply.
    let c = side(&client);
    let other = CmId::create(&cch, PortSpace::Tcp).unwrap();
    other.resolve_addr(None, addr("127.0.0.2:7471"), 2000).unwrap();
    next(&cch, E::AddrResolved);
    other.resolve_route(2000).unwrap();
    next(&cch, E::RouteResolved);
    other.connect(&ConnParam { qp_num: c.qp.qp_num(), ..Default::default() }).unwrap();
    let conn = next(&sch, E::ConnectRequest).id;
    assert_eq!(conn.notify_established().unwrap_err().errno(), Errno::EINVAL, "not accepted");
    let s = side(&conn);
    conn.accept(&ConnParam::default()).unwrap();
    next(&cch, E::ConnectResponse);
    conn.notify_established().unwrap();
    next(&sch, E::Established);
    assert_eq!(conn.notify_established().unwrap_err().errno(), Errno(libc::EISCONN));
    other.establish().unwrap();
    sch.set_nonblocking(true).unwrap();
    assert_eq!(sch.get_event().unwrap_err().errno(), Errno::EAGAIN, "the RTU raises nothing more");
    assert_eq!(s.qp.state(), QpState::RTS);
    for id in [&client, &other, &conn, &server] {
        id.destroy().unwrap();
    }
}

/// Multicast: a datagram id resolves a group's address from loopback's port, joins (the event
/// carries the group's address: its multicast GID, QPN 0xffffff, the CM's Q_Key) and leaves.
#[test]
fn a_datagram_id_joins_and_leaves_a_multicast_group() {
    for (profile, group, gid) in [
        (Profile::Rxe, "239.1.2.3:0", "::ffff:239.1.2.3"),
        (Profile::Full, "239.1.2.3:0", "ff0e::ffff:239.1.2.3"),
        (Profile::Rxe, "[ff05::7]:0", "ff05::7"),
    ] {
        let f = fabric(profile);
        let ch = CmChannel::new(&f).unwrap();
        let id = CmId::create(&ch, PortSpace::Udp).unwrap();
        assert_eq!(id.join_multicast(addr(group)).unwrap_err().errno(), Errno::EINVAL, "no port");
        id.resolve_addr(None, addr(group), 2000).unwrap();
        next(&ch, E::AddrResolved);
        assert_eq!(id.context().unwrap().device().index(), 0, "loopback's port");
        assert_eq!(id.join_multicast(addr("10.0.0.1:0")).unwrap_err().errno(), Errno::EINVAL);
        id.join_multicast(addr(group)).unwrap();
        let ev = next(&ch, E::MulticastJoin);
        assert_eq!(ev.group, Some(addr(group)));
        let ud = ev.ud.unwrap();
        assert_eq!((ud.qp_num, ud.qkey), (0xff_ffff, rdma_emu::cm::UDP_QKEY));
        let want: std::net::Ipv6Addr = gid.parse().unwrap();
        assert!(ud.ah_attr.is_global && ud.ah_attr.dgid.0 == want.octets());
        assert_eq!(id.leave_multicast(addr(group)).unwrap().0, want.octets());
        let e = id.leave_multicast(addr(group)).unwrap_err();
        assert_eq!(e.errno(), Errno::EADDRNOTAVAIL);
        // A connected (RC) id cannot join.
        let rc = CmId::create(&ch, PortSpace::Tcp).unwrap();
        rc.resolve_addr(None, addr(group), 2000).unwrap();
        next(&ch, E::AddrResolved);
        assert_eq!(rc.join_multicast(addr(group)).unwrap_err().errno(), Errno::EINVAL);
        for i in [&id, &rc] {
            i.destroy().unwrap();
        }
    }
}

/// ECE: the options an id offers travel in the REQ, a QP made for the request asks for those
/// (as far as its device has them, none from another vendor), and the REP says what was taken.
#[test]
fn ece_is_offered_in_the_request_and_taken_in_the_reply() {
    const MINE: u32 = 0x00ff_ffff; // the full profile's vendor
    for (profile, offered, taken) in [
        (Profile::Full, Ece { vendor_id: MINE, options: 0x1, comp_mask: 0 }, 0x1),
        // A request from another vendor: the server's QP takes no options.
        (Profile::Full, Ece { vendor_id: 0x02c9, options: 0x3, comp_mask: 0 }, 0),
        // rxe has no ECE at all.
        (Profile::Rxe, Ece { vendor_id: MINE, options: 0x1, comp_mask: 0 }, 0),
    ] {
        let f = fabric(profile);
        let (sch, server, cch, client) = listening(&f);
        let bad = Ece { comp_mask: 1, ..offered };
        assert_eq!(client.set_local_ece(bad).unwrap_err().errno(), Errno::EINVAL);
        let none = Ece { vendor_id: 0, ..offered };
        assert_eq!(client.set_local_ece(none).unwrap_err().errno(), Errno::EINVAL);
        // The client connects a QP of its own and offers `offered` itself.
        client.set_local_ece(offered).unwrap();
        client.connect(&ConnParam { qp_num: 0x77, ..Default::default() }).unwrap();
        let conn = next(&sch, E::ConnectRequest).id;
        assert_eq!(conn.remote_ece().unwrap(), offered, "the REQ carried it");
        let s = side(&conn);
        assert_eq!(conn.remote_ece().unwrap_err().errno(), Errno::EINVAL, "the id has a QP");
        let options = s.qp.query_ece().map(|e| e.options);
        match profile {
            Profile::Rxe => assert_eq!(options.unwrap_err().errno(), Errno::EOPNOTSUPP),
            _ => assert_eq!(options.unwrap(), taken),
        }
        conn.accept(&ConnParam::default()).unwrap();
        next(&cch, E::ConnectResponse);
        let reply = client.remote_ece().unwrap();
        assert_eq!(reply, Ece { vendor_id: offered.vendor_id, options: taken, comp_mask: 0 });
        client.establish().unwrap();
        next(&sch, E::Established);
        for id in [&client, &conn, &server] {
            id.destroy().unwrap();
        }
    }

    // Refusing the options: the client sees the reason.
    let f = fabric(Profile::Full);
    let (sch, server, cch, client) = listening(&f);
    let c = side(&client);
    let e = client.set_local_ece(Ece { vendor_id: MINE, options: 1, comp_mask: 0 }).unwrap_err();
    assert_eq!(e.errno(), Errno::EINVAL, "the id's QP has its own");
    client.connect(&ConnParam::default()).unwrap();
    let req = next(&sch, E::ConnectRequest);
    req.id.reject_ece(b"no").unwrap();
    let rej = next(&cch, E::Rejected);
    assert_eq!(rej.status, REJ_VENDOR_OPTION_NOT_SUPPORTED);
    assert_eq!(&rej.param.private_data[..2], b"no");
    assert_eq!(c.qp.state(), QpState::ERR, "as librdmacm moves it with a rejection");
    drop((server, req));

    // Both sides with QPs the CM connects: the server's takes what the client's offers, the
    // client's what the reply says (all the device has by default, fewer if its QP asked).
    for (asked, want) in [(None, 0x3), (Some(0x2), 0x2)] {
        let (sch, server, cch, client) = listening(&f);
        let ctx = client.context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None, 0).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(8))).unwrap();
        if let Some(options) = asked {
            qp.set_ece(&Ece { vendor_id: MINE, options, comp_mask: 0 }).unwrap();
            let (init, mask) = client.init_qp_attr(QpState::INIT).unwrap();
            qp.modify(&init, mask).unwrap();
        }
        client.set_qp(&qp).unwrap();
        client.connect(&ConnParam::default()).unwrap();
        let conn = next(&sch, E::ConnectRequest).id;
        let s = side(&conn);
        conn.accept(&ConnParam::default()).unwrap();
        next(&cch, E::Established);
        next(&sch, E::Established);
        let options = |q: &Qp| q.query_ece().unwrap().options;
        assert_eq!((options(&qp), options(&s.qp)), (want, want), "asked {asked:?}");
        drop(server);
    }
}

/// A device hot-unplugged (the `device-removal` fault): each id on it hears DEVICE_REMOVAL and
/// can only be destroyed; its connection ends, the peer on another device hearing DISCONNECTED.
#[test]
fn a_removed_device_takes_its_ids_and_their_connections() {
    let f = fabric(Profile::Rxe);
    let (sch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let server = CmId::create(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(addr("127.0.0.2:7480")).unwrap();
    server.listen(1).unwrap();
    let wildcard = CmId::create(&sch, PortSpace::Tcp).unwrap();
    wildcard.bind_addr(addr("0.0.0.0:7481")).unwrap();
    wildcard.listen(1).unwrap();
    // The client on emu0 (127.0.0.1), the server on emu1.
    let client = resolved(&cch, PortSpace::Tcp, Some("127.0.0.1:0"), "127.0.0.2:7480");
    assert_eq!(client.context().unwrap().device().index(), 0);
    let c = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let conn = next(&sch, E::ConnectRequest).id;
    let s = side(&conn);
    conn.accept(&ConnParam::default()).unwrap();
    next(&cch, E::Established);
    next(&sch, E::Established);

    f.set_faults(FaultRule::parse("device-removal:dev=emu1").unwrap());
    let mut removed = [next(&sch, E::DeviceRemoval), next(&sch, E::DeviceRemoval)];
    removed.sort_by_key(|ev| !ev.id.same(&server));
    assert!(removed[0].id.same(&server) && removed[1].id.same(&conn));
    assert!(removed.iter().all(|ev| ev.status == 0));
    sch.set_nonblocking(true).unwrap();
    assert_eq!(sch.get_event().unwrap_err().errno(), Errno::EAGAIN, "the wildcard one is not");
    assert_eq!(next(&cch, E::Disconnected).status, 0);
    assert_eq!(c.qp.state(), QpState::RTS, "the peer's QP is left to its owner");
    // The removed device's QPs fail as the removal runs, which may finish after the peer hears.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.qp.state() != QpState::ERR {
        assert!(std::time::Instant::now() < deadline, "the removed device's QP never failed");
        std::thread::yield_now();
    }
    // All that is left to a removed id is its destruction.
    assert_eq!(conn.disconnect().unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(server.listen(1).unwrap_err().errno(), Errno::EINVAL);
    conn.destroy().unwrap();
    server.destroy().unwrap();
    // The client still answers the end of its connection (the DREP nobody hears).
    client.disconnect().unwrap();
    client.destroy().unwrap();
    wildcard.destroy().unwrap();
}

#[test]
fn a_request_whose_id_goes_unanswered_is_refused() {
    // As the kernel's CM refuses it (REJ "consumer defined") when the id goes: destroyed by
    // the listener's application, or with its process.
    let host = Host::new("unanswered");
    let (fa, fb) = (host.fabric(), host.fabric());
    let (sch, cch) = (CmChannel::new(&fa).unwrap(), CmChannel::new(&fb).unwrap());
    let server = CmId::create(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(addr("127.0.0.2:7610")).unwrap();
    server.listen(2).unwrap();
    let ask = || {
        let client = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7610");
        client.connect(&ConnParam::default()).unwrap();
        (client, next(&sch, E::ConnectRequest))
    };
    let (_first, req) = ask();
    req.id.destroy().unwrap();
    drop(req);
    assert_eq!(next(&cch, E::Rejected).status, REJ_CONSUMER_DEFINED);
    let (_second, req) = ask();
    drop((req, server, sch));
    drop(fa);
    assert_eq!(next(&cch, E::Rejected).status, REJ_CONSUMER_DEFINED);
}

/// A connection sets both QPs up as the kernel's CM does (measured on rxe with the same
/// parameters, `docs/rdma-cm.md`): INIT gives no access before the other side is known, then
/// remote writes, and reads and atomics only toward a side that sends some (a non-zero
/// initiator depth); each QP retries RNR NAKs as often as the other side asked, takes its
/// read depths from the reply, and times out after 2^19 x 4.096 us (the path's packet lifetime
/// 18, plus one); flow control is told to the other side, a reply carries no retry count;
/// the route's path reads as RoCE's made-up one.
#[test]
fn a_connection_sets_its_qps_up_as_the_kernels_cm_does() {
    let f = fabric(Profile::Rxe);
    let ch = CmChannel::new(&f).unwrap();
    let server = listener(&ch, "127.0.0.2:7490", 4);
    let client = resolved(&ch, PortSpace::Tcp, None, "127.0.0.2:7490");
    let path = client.path().expect("a resolved route has a path");
    let gid = Gid::of_ip(addr("127.0.0.2:0").ip());
    assert_eq!((path.sgid, path.dgid, path.hop_limit, path.pkey), (gid, gid, 64, 0xffff));
    assert_eq!((path.mtu, path.packet_life_time, path.rate), (Mtu::MTU_1024, 18, 0));
    let sport = client.local_addr().unwrap().port();
    assert_eq!(path.flow_label, (u32::from(sport) * 31 + 7490) & 0xf_ffff);
    assert_eq!(server.path(), None, "a listener has no path");
    let c = side(&client);
    let access = |qp: &Qp| qp.query().unwrap().qp_access_flags;
    assert_eq!(access(&c.qp), AccessFlags::empty(), "nobody to give access to yet");
    let ask = ConnParam {
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 1,
        retry_count: 1,
        rnr_retry_count: 2,
        ..Default::default()
    };
    client.connect(&ask).unwrap();
    let req = next(&ch, E::ConnectRequest);
    assert_eq!((req.param.flow_control, req.param.rnr_retry_count), (1, 2));
    let conn = req.id;
    assert_eq!(conn.path().map(|p| p.flow_label), Some(path.flow_label), "the request's path");
    let s = side(&conn);
    let writes = AccessFlags::REMOTE_WRITE;
    assert_eq!(access(&s.qp), writes, "the client sends no reads: none are let in");
    let answer = ConnParam {
        responder_resources: 4,
        initiator_depth: 4,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    conn.accept(&answer).unwrap();
    // (The server's first: the client's RTU went before the client heard.)
    assert_eq!(next(&ch, E::Established).id.local_addr(), conn.local_addr());
    let est = next(&ch, E::Established);
    assert_eq!(est.id.local_addr(), client.local_addr());
    let p = &est.param;
    assert_eq!((p.responder_resources, p.initiator_depth), (4, 4));
    assert_eq!((p.flow_control, p.retry_count, p.rnr_retry_count), (1, 0, 7));
    let (ca, sa) = (c.qp.query().unwrap(), s.qp.query().unwrap());
    let reads = writes | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    assert_eq!((ca.qp_access_flags, sa.qp_access_flags), (reads, writes));
    assert_eq!((ca.rnr_retry, sa.rnr_retry), (7, 2), "as the other side asked");
    assert_eq!((ca.retry_cnt, sa.retry_cnt), (1, 1), "the request's");
    assert_eq!((ca.max_rd_atomic, ca.max_dest_rd_atomic), (4, 4), "the reply's");
    assert_eq!((sa.max_rd_atomic, sa.max_dest_rd_atomic), (4, 4));
    assert_eq!((ca.timeout, sa.timeout), (19, 19));
    // The server's QP refuses the client's READ (no remote read), as rxe's does.
    let (src, dst) = ([sge(&c.mr, 0, 8)], s.mr.addr());
    c.qp.post_send(&SendWr::read(1, &src, dst, s.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&c.cq).status, WcStatus::REM_INV_REQ_ERR);
}

/// At most `backlog` requests wait for an answer at once: the next is rejected at once
/// (`REJ_CONSUMER_DEFINED`, as the kernel's when a listener's backlog is spent), and each
/// request answered, by a reject or an accept, makes room for one more.
#[test]
fn a_listeners_backlog_bounds_the_requests_waiting_for_an_answer() {
    let f = fabric(Profile::Rxe);
    let lch = CmChannel::new(&f).unwrap();
    let _l = listener(&lch, "127.0.0.2:7480", 2);
    let cch = CmChannel::new(&f).unwrap();
    let ask = || {
        let c = resolved(&cch, PortSpace::Tcp, None, "127.0.0.2:7480");
        c.connect(&ConnParam::default()).unwrap();
        c
    };
    let refused = |c: &CmId| {
        let ev = next(&cch, E::Rejected);
        assert!(ev.id.same(c));
        assert_eq!(ev.status, REJ_CONSUMER_DEFINED);
    };
    let (a, b) = (ask(), ask());
    let ra = next(&lch, E::ConnectRequest);
    let rb = next(&lch, E::ConnectRequest);
    refused(&ask());
    assert!(quiet(&lch), "nothing more for the listener");
    // Rejected: room for one.
    ra.id.reject(&[]).unwrap();
    refused(&a);
    let d = ask();
    let rd = next(&lch, E::ConnectRequest);
    refused(&ask());
    // Accepted: room for one.
    rb.id.accept(&ConnParam::default()).unwrap();
    let ev = next(&cch, E::ConnectResponse);
    assert!(ev.id.same(&b));
    let e = ask();
    let re = next(&lch, E::ConnectRequest);
    refused(&ask());
    assert!(quiet(&cch) && quiet(&lch));
    drop((d, e, rd, re));
}

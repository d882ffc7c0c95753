//! Objects are freed when their handles go, whatever the application left unread: a counting
//! global allocator follows the bytes alive across rounds that build a fabric with connected
//! QPs, an SRQ, MRs and traffic, raise async events nobody reads, and drop every handle. (One
//! test in this binary, so no other test's thread allocates meanwhile.)

mod common;
use common::{ALL_ACCESS as ACCESS, cap, counting::Counting};
use rdma_emu::*;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One program's life: objects made, used, left with unread events, dropped.
fn round(profile: Profile) {
    let f = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
    let devs = f.devices();
    let side = |d: &Device| {
        let ctx = d.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(64, Some(&ch), 0).unwrap();
        let mr = pd.reg_mr(4096, ACCESS).unwrap();
        let srq = pd.create_srq(&SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(16))).unwrap();
        (ctx, pd, ch, cq, mr, srq, qp)
    };
    let (a, b) = (side(&devs[0]), side(&devs[1]));
    a.6.connect(1, &b.6.endpoint(2), &RcParams::default()).unwrap();
    b.6.connect(2, &a.6.endpoint(1), &RcParams::default()).unwrap();
    let src = [Sge { addr: a.4.addr(), length: 64, lkey: a.4.lkey() }];
    for i in 0..8 {
        let wr = SendWr::write(i, &src, b.4.addr(), b.4.rkey()).signaled();
        a.6.post_send(&wr).unwrap();
    }
    let mut got = 0;
    while got < 8 {
        got += a.3.poll_one().is_some() as usize;
    }
    // And one the other way: each QP's express lane then holds the other.
    let back = [Sge { addr: b.4.addr(), length: 64, lkey: b.4.lkey() }];
    b.6.post_send(&SendWr::write(20, &back, a.4.addr(), a.4.rkey()).signaled()).unwrap();
    while b.3.poll_one().is_none() {}
    // A datagram each way between two UD QPs: each then keeps the other as its last
    // destination.
    let ud = [(&a, &src), (&b, &back)].map(|(s, sg)| {
        let qp = s.1.create_qp(&QpInitAttr::new(QpType::UD, &s.3, cap(4))).unwrap();
        ud_ready(&qp);
        let recv = [Sge { addr: sg[0].addr + 128, length: 40 + 64, lkey: sg[0].lkey }];
        qp.post_recv(&RecvWr { wr_id: 30, sg_list: &recv }).unwrap();
        qp
    });
    for (from, to, cq, sg) in [(0, 1, &a.3, &src), (1, 0, &b.3, &back)] {
        let ep = ud[to].endpoint(0);
        let is_global = profile == Profile::Rxe;
        let attr =
            AhAttr { is_global, dgid: ep.gid, dlid: ep.lid, port_num: 1, ..Default::default() };
        let ah = ud[from].pd().create_ah(&attr).unwrap();
        let wr = SendWr::send_ud(31, sg, &ah, ud[to].qp_num(), UD_QKEY).signaled();
        ud[from].post_send(&wr).unwrap();
        // Its send completion, and the other side's receive.
        let (mut got, other) = (0, if from == 0 { &b.3 } else { &a.3 });
        while got < 2 {
            got += cq.poll_one().is_some() as usize + other.poll_one().is_some() as usize;
        }
    }
    // A completion left in the CQ, an armed CQ, and events nobody reads, about every kind of
    // object that has them.
    a.3.req_notify(false).unwrap();
    a.6.post_send(&SendWr::write(9, &src, b.4.addr(), b.4.rkey()).signaled()).unwrap();
    a.0.inject_event(EventType::QP_FATAL, EventElement::Qp(a.6.clone()));
    a.0.inject_event(EventType::CQ_ERR, EventElement::Cq(a.3.clone()));
    a.0.inject_event(EventType::SRQ_LIMIT_REACHED, EventElement::Srq(a.5.clone()));
    a.0.inject_event(EventType::PORT_ACTIVE, EventElement::Port(1));
    b.0.inject_event(EventType::QP_LAST_WQE_REACHED, EventElement::Qp(b.6.clone()));
}

const UD_QKEY: u32 = 0x11;

/// Takes a UD QP to RTS with [`UD_QKEY`].
fn ud_ready(qp: &Qp) {
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: UD_QKEY, ..Default::default() };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    let rts = QpAttr { qp_state: QpState::RTS, ..Default::default() };
    qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
}

use rdma_emu::cm::{CmChannel, CmEventType, CmId, ConnParam};

/// A fabric with a listener on 127.0.0.2:`port` and a client that resolved it, each on a
/// channel of its own: `(fabric, server's channel, listener, client's channel, client)`.
fn listening(port: u16) -> (Fabric, CmChannel, CmId, CmChannel, CmId) {
    use rdma_emu::cm::{PortSpace, addr::PortAddress};
    let addresses = PortAddress::parse_list("127.0.0.2=emu1").unwrap();
    let f = Fabric::new(FabricConfig { addresses, ..Default::default() });
    let (sch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let server = CmId::create(&sch, PortSpace::Tcp).unwrap();
    let at: std::net::SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    server.bind_addr(at).unwrap();
    server.listen(4).unwrap();
    let client = CmId::create(&cch, PortSpace::Tcp).unwrap();
    client.resolve_addr(None, at, 2000).unwrap();
    assert_eq!(cch.get_event().unwrap().event, CmEventType::AddrResolved);
    client.resolve_route(2000).unwrap();
    assert_eq!(cch.get_event().unwrap().event, CmEventType::RouteResolved);
    (f, sch, server, cch, client)
}

/// An RC QP on `id`'s device, given to the id.
fn qp_on(id: &CmId) -> Qp {
    let ctx = id.context().unwrap();
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(8, None, 0).unwrap());
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(4))).unwrap();
    id.set_qp(&qp).unwrap();
    qp
}

/// A connection request nobody reads, then both ids destroyed (the unread request goes with the
/// listener, its new id with it, as the kernel's ucma drops them), or every handle just
/// dropped (the Rust API's way: the events nobody can read any more go with the channels).
fn cm_round(port: u16) {
    let (_f, sch, server, _cch, client) = listening(port);
    let _qp = qp_on(&client);
    client.connect(&ConnParam::default()).unwrap();
    // Wait until the request is queued on the server's channel (its fd readable), then
    // leave it there.
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd { fd: sch.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll reads and writes one pollfd that lives across the call.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 10_000) }, 1, "no connection request");
    if port.is_multiple_of(2) {
        client.destroy().unwrap();
        server.destroy().unwrap();
    }
}

/// A connection whose channels the application lets go of first, keeping its ids, then ends
/// it: the events raised after (`Disconnected` on both sides) have nobody to read them, and
/// must not keep their ids (which hold the channel, and so the events) once those go too.
fn cm_late_round(port: u16) {
    let (_f, sch, _server, cch, client) = listening(port);
    let next = |ch: &CmChannel, want: CmEventType| {
        let ev = ch.get_event().unwrap();
        assert_eq!(ev.event, want);
        ev
    };
    let _cqp = qp_on(&client);
    client.connect(&ConnParam::default()).unwrap();
    let conn = next(&sch, CmEventType::ConnectRequest).id;
    let _sqp = qp_on(&conn);
    conn.accept(&ConnParam::default()).unwrap();
    next(&cch, CmEventType::Established);
    next(&sch, CmEventType::Established);
    drop((sch, cch));
    // Each side's `Disconnected`, raised on a channel nobody holds.
    client.disconnect().unwrap();
    conn.disconnect().unwrap();
}

#[test]
fn dropping_every_handle_frees_everything_even_with_events_unread() {
    for profile in [Profile::Rxe, Profile::Full] {
        // The first rounds make what lives for the process (lazy statics, thread locals).
        for i in 0..3 {
            round(profile);
            cm_round(7000 + i);
            cm_late_round(7200 + i);
        }
        let before = Counting::live();
        for i in 0..40 {
            round(profile);
            cm_round(7100 + i);
            cm_late_round(7300 + i);
        }
        let grew = Counting::live() - before;
        assert!(grew < 16 << 10, "{profile:?}: {grew} bytes still allocated after 40 rounds");
    }
}

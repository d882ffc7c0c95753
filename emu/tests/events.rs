//! Completion channels and async events: eventfds that work with poll(2), O_NONBLOCK, solicited
//! notification, and destroys that wait for acknowledgements.

mod common;
use std::{
    os::fd::AsRawFd,
    sync::{Arc, atomic::AtomicBool, atomic::Ordering},
    time::Duration,
};

use common::*;
use rdma_emu::*;

/// poll(2) for readability with a timeout in milliseconds; true if readable.
fn readable(fd: &impl AsRawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: `p` is a valid pollfd for the duration of the call; nfds is 1.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    assert!(n >= 0, "poll failed");
    n == 1 && p.revents & libc::POLLIN != 0
}

struct EvNode {
    ch: CompChannel,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn ev_pair() -> (Fabric, EvNode, EvNode) {
    ev_pair_on(FabricConfig::default(), CqOptions::default())
}

/// `ev_pair` on a fabric of `config`, with CQs made with `options`.
fn ev_pair_on(config: FabricConfig, options: CqOptions) -> (Fabric, EvNode, EvNode) {
    let f = Fabric::new(config);
    let devs = f.devices();
    let mk = |d: &Device| {
        let ctx = d.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq_ex(64, Some(&ch), 0, options).unwrap();
        let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
        let qp = new_qp(&pd, &cq, QpType::RC, 16, false);
        EvNode { ch, cq, qp, mr }
    };
    let (a, b) = (mk(&devs[0]), mk(&devs[1]));
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    (f, a, b)
}

#[test]
fn channel_fd_becomes_readable_only_when_an_armed_cq_completes() {
    let (_f, a, b) = ev_pair();
    post_recv(&b.qp, 1, &[sge(&b.mr, 0, 64)]);
    post_recv(&b.qp, 2, &[sge(&b.mr, 0, 64)]);
    // Not armed: a completion arrives but the fd stays quiet.
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
    assert_eq!(wait1(&b.cq).wr_id, 1);
    assert!(!readable(&b.ch, 0));
    // Armed: the next completion makes it readable; get_cq_event returns the CQ.
    b.cq.req_notify(false).unwrap();
    assert!(!readable(&b.ch, 0));
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 8)])).unwrap();
    assert!(readable(&b.ch, 1000));
    let cq = b.ch.get_cq_event().unwrap();
    assert!(cq.same(&b.cq));
    assert!(!readable(&b.ch, 0), "one event per arm");
    assert_eq!(wait1(&cq).wr_id, 2);
    cq.ack_events(1);
}

#[test]
fn solicited_only_arm_ignores_unsolicited_receives() {
    let (_f, a, b) = ev_pair();
    for i in 0..2 {
        post_recv(&b.qp, i, &[sge(&b.mr, 0, 64)]);
    }
    b.cq.req_notify(true).unwrap();
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
    assert!(!readable(&b.ch, 0), "not solicited");
    let mut wr = SendWr::send(2, &[]);
    wr.send_flags = SendFlags::SOLICITED;
    a.qp.post_send(&wr).unwrap();
    assert!(readable(&b.ch, 1000));
    b.ch.get_cq_event().unwrap().ack_events(1);
    // Send-side completions never satisfy a solicited-only arm (rxe).
    a.cq.req_notify(true).unwrap();
    a.qp.post_send(&SendWr::write(3, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey()).signaled())
        .unwrap();
    assert!(!readable(&a.ch, 0));
}

/// IBA C11-31/32: an arming for the next completion stands until its event; a solicited-only
/// arming meanwhile does not narrow it (rxe keeps it too). The other way round widens it.
#[test]
fn a_solicited_only_arming_does_not_narrow_one_for_any_completion() {
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, b) =
            ev_pair_on(FabricConfig { profile, ..Default::default() }, CqOptions::default());
        for i in 0..2 {
            post_recv(&b.qp, i, &[sge(&b.mr, 0, 64)]);
        }
        b.cq.req_notify(false).unwrap();
        b.cq.req_notify(true).unwrap();
        a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
        assert!(readable(&b.ch, 1000), "{profile:?}: still armed for any completion");
        b.ch.get_cq_event().unwrap().ack_events(1);
        assert_eq!(wait1(&b.cq).wr_id, 0);
        b.cq.req_notify(true).unwrap();
        b.cq.req_notify(false).unwrap();
        a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 8)])).unwrap();
        assert!(readable(&b.ch, 1000), "{profile:?}: widened to any completion");
        b.ch.get_cq_event().unwrap().ack_events(1);
    }
}

#[test]
fn nonblocking_channel_gives_eagain_and_blocking_get_waits() {
    let (_f, a, b) = ev_pair();
    b.ch.set_nonblocking(true).unwrap();
    assert_eq!(b.ch.get_cq_event().unwrap_err().errno(), Errno::EAGAIN);
    b.ch.set_nonblocking(false).unwrap();
    b.cq.req_notify(false).unwrap();
    post_recv(&b.qp, 1, &[sge(&b.mr, 0, 64)]);
    let ch = b.ch.clone();
    let got = Arc::new(AtomicBool::new(false));
    let got2 = got.clone();
    let waiter = std::thread::spawn(move || {
        let cq = ch.get_cq_event().unwrap();
        got2.store(true, Ordering::SeqCst);
        cq
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(!got.load(Ordering::SeqCst), "get_cq_event blocks while nothing happened");
    a.qp.post_send(&SendWr::send(1, &[])).unwrap();
    let cq = waiter.join().unwrap();
    assert!(cq.same(&b.cq));
    cq.ack_events(1);
}

#[test]
fn channel_with_cqs_is_busy_and_cq_destroy_waits_for_acks() {
    let f = Fabric::new(FabricConfig::default());
    let ctx = f.devices()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(4, Some(&ch), 0).unwrap();
    assert_eq!(ch.destroy().unwrap_err().errno(), Errno::EBUSY);
    // Produce an event: a loopback QP pair on one device.
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr(64, ALL_ACCESS).unwrap();
    let mk = || new_qp(&pd, &cq, QpType::RC, 4, true);
    let (q1, q2) = (mk(), mk());
    connect(&q1, &q2, &RcParams::default(), &RcParams::default());
    cq.req_notify(false).unwrap();
    q1.post_send(&SendWr::write(1, &[sge(&mr, 0, 8)], mr.addr(), mr.rkey())).unwrap();
    let ev_cq = ch.get_cq_event().unwrap();
    wait1(&cq);
    q1.destroy().unwrap();
    q2.destroy().unwrap();
    // The event was handed out and not acked: destroy blocks until the ack.
    let done = Arc::new(AtomicBool::new(false));
    let (cq2, done2) = (cq.clone(), done.clone());
    let t = std::thread::spawn(move || {
        cq2.destroy().unwrap();
        done2.store(true, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(!done.load(Ordering::SeqCst), "destroy waits for ibv_ack_cq_events");
    ev_cq.ack_events(1);
    t.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    ch.destroy().unwrap();
}

#[test]
fn async_events_wake_poll_and_injected_port_events_arrive() {
    let f = Fabric::new(FabricConfig::default());
    let ctx = f.devices()[0].open().unwrap();
    assert!(!readable(&ctx, 0));
    ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN);
    ctx.inject_event(EventType::PORT_ERR, EventElement::Port(1));
    assert!(readable(&ctx, 1000));
    let ev = ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::PORT_ERR);
    assert!(matches!(ev.element, EventElement::Port(1)));
    ctx.ack_async_event(&ev);
    assert!(!readable(&ctx, 0));
}

#[test]
fn a_closed_context_destroys_without_waiting_and_drops_its_unread_events() {
    let (_f, a, b) = pair(Profile::Full);
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), 0xbad00)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    // One event handed out and never acknowledged, one never read.
    assert_eq!(b.ctx.get_async_event().unwrap().event_type, EventType::QP_ACCESS_ERR);
    b.ctx.inject_event(EventType::PORT_ERR, EventElement::Port(1));
    b.ctx.close();
    b.qp.destroy().unwrap(); // it would wait for the acknowledgement forever
    b.cq.destroy().unwrap();
    b.ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(b.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN);
}

#[test]
fn qp_destroy_waits_for_its_async_events_to_be_acked() {
    let (_f, a, b) = pair(Profile::Full);
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), 0xbad00)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    let ev = b.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::QP_ACCESS_ERR);
    let done = Arc::new(AtomicBool::new(false));
    let (qp, done2) = (b.qp.clone(), done.clone());
    let t = std::thread::spawn(move || {
        qp.destroy().unwrap();
        done2.store(true, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(!done.load(Ordering::SeqCst));
    b.ctx.ack_async_event(&ev);
    t.join().unwrap();
}

#[test]
fn unread_events_of_a_destroyed_qp_are_discarded() {
    let (_f, a, b) = pair(Profile::Full);
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), 0xbad00)).unwrap();
    wait1(&a.cq);
    assert!(readable(&b.ctx, 1000));
    b.qp.destroy().unwrap(); // nothing was handed out: no wait
    // Gone with its count: a program that polls first does not then block in the read.
    assert!(!readable(&b.ctx, 0));
    b.ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(b.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN);
}

/// A CQ destroyed with an event unread on its channel takes the event and its readiness
/// along, as the kernel's channel drops a destroyed CQ's events: the channel polled readable
/// after, and a blocking `ibv_get_cq_event` then waited for ever. Another CQ's event stays.
#[test]
fn a_destroyed_cqs_unread_event_leaves_its_channel_unreadable() {
    let f = Fabric::new(FabricConfig::default());
    let ctx = f.devices()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr(64, ALL_ACCESS).unwrap();
    let event_on = |cq: &Cq| {
        let mk = || new_qp(&pd, cq, QpType::RC, 4, true);
        let (q1, q2) = (mk(), mk());
        connect(&q1, &q2, &RcParams::default(), &RcParams::default());
        cq.req_notify(false).unwrap();
        q1.post_send(&SendWr::write(1, &[sge(&mr, 0, 8)], mr.addr(), mr.rkey())).unwrap();
        wait1(cq);
        q1.destroy().unwrap();
        q2.destroy().unwrap();
    };
    let (gone, kept) =
        (ctx.create_cq(4, Some(&ch), 0).unwrap(), ctx.create_cq(4, Some(&ch), 0).unwrap());
    event_on(&gone);
    assert!(readable(&ch, 1000));
    gone.destroy().unwrap();
    assert!(!readable(&ch, 0), "readable for an event gone");
    event_on(&kept);
    assert!(readable(&ch, 1000));
    let ev = ch.get_cq_event().unwrap();
    assert!(ev.same(&kept));
    ev.ack_events(1);
    assert!(!readable(&ch, 0));
}

#[test]
fn sqd_drains_and_reports_sq_drained_when_asked() {
    let (_f, a, b) = pair(Profile::Full);
    // Make a WR stay in flight: the peer stops answering.
    b.qp.modify(&QpAttr { qp_state: QpState::RESET, ..Default::default() }, QpAttrMask::STATE)
        .unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey())).unwrap();
    let sqd = QpAttr { qp_state: QpState::SQD, en_sqd_async_notify: 1, ..Default::default() };
    a.qp.modify(&sqd, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY).unwrap();
    let q = a.qp.query().unwrap();
    assert_eq!((q.qp_state, q.sq_draining), (QpState::SQD, 1), "still draining");
    a.ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(a.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN, "not drained yet");
    // With nothing in flight, SQD is drained at once and SQ_DRAINED fires.
    let (_g, c, d) = pair(Profile::Full);
    c.qp.modify(&sqd, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY).unwrap();
    let ev = c.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::SQ_DRAINED);
    assert!(matches!(&ev.element, EventElement::Qp(q) if q.same(&c.qp)));
    c.ctx.ack_async_event(&ev);
    assert_eq!(c.qp.query().unwrap().sq_draining, 0);
    // Work posted in SQD waits, and goes out when the QP is back in RTS.
    post_recv(&d.qp, 9, &[sge(&d.mr, 0, 64)]);
    c.qp.post_send(&SendWr::send(3, &[sge(&c.mr, 0, 8)]).signaled()).unwrap();
    assert_empty(&c.cq);
    c.qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, QpAttrMask::STATE)
        .unwrap();
    assert_eq!(wait1(&c.cq).wr_id, 3);
    assert_eq!(wait1(&d.cq).wr_id, 9);
}

#[test]
fn first_packet_at_an_rtr_qp_raises_comm_est_once() {
    let f = Fabric::new(FabricConfig::default());
    let devs = f.devices();
    let a = node_on(&devs[0], 4096);
    let b = node_on(&devs[1], 4096);
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    // Bring B only to RTR.
    use QpAttrMask as M;
    let to =
        |s| QpAttr { qp_state: s, port_num: 1, qp_access_flags: ALL_ACCESS, ..Default::default() };
    b.qp.modify(&to(QpState::RESET), M::STATE).unwrap();
    b.qp.modify(&to(QpState::INIT), M::STATE | M::PORT | M::PKEY_INDEX | M::ACCESS_FLAGS).unwrap();
    let ep = a.qp.endpoint(0x10);
    let rtr = QpAttr {
        qp_state: QpState::RTR,
        path_mtu: Mtu::MTU_1024,
        dest_qp_num: ep.qpn,
        rq_psn: 0x10,
        ah_attr: AhAttr { dlid: ep.lid, port_num: 1, ..Default::default() },
        ..Default::default()
    };
    b.qp.modify(&rtr, RC_RTR_MASK).unwrap();
    for i in 0..2 {
        a.qp.post_send(&SendWr::write(i, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey()).signaled())
            .unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "an RTR QP receives");
    }
    let ev = b.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::COMM_EST);
    b.ctx.ack_async_event(&ev);
    b.ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(b.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN, "once");
}

#[test]
fn port_down_raises_port_err_and_loses_traffic_until_it_comes_back() {
    let p = RcParams { timeout: 1, retry_cnt: 2, ..Default::default() };
    let (f, a, b) = pair_with(Profile::Full, &p, &p);
    let dev1 = f.devices()[1].clone();
    a.ctx.set_async_nonblocking(true).unwrap();
    b.ctx.set_async_nonblocking(true).unwrap();

    dev1.set_port_state(1, PortState::DOWN).unwrap();
    let ev = b.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::PORT_ERR);
    assert!(matches!(ev.element, EventElement::Port(1)));
    b.ctx.ack_async_event(&ev);
    assert_eq!(a.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN, "another device");
    let pa = dev1.query_port(1).unwrap();
    assert_eq!((pa.state, pa.phys_state), (PortState::DOWN, 3));
    dev1.set_port_state(1, PortState::DOWN).unwrap();
    assert_eq!(b.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN, "no change, no event");

    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey())).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RETRY_EXC_ERR, "the peer's link is down");

    dev1.set_port_state(1, PortState::ACTIVE).unwrap();
    assert_eq!(b.ctx.get_async_event().unwrap().event_type, EventType::PORT_ACTIVE);
    assert_eq!(dev1.set_port_state(1, PortState::INIT).unwrap_err().errno(), Errno::EINVAL);
    // A new connection over the restored link works.
    let c = node_on(&f.devices()[0], 4096);
    let d = node_on(&dev1, 4096);
    connect(&c.qp, &d.qp, &RcParams::default(), &RcParams::default());
    c.qp.post_send(&SendWr::write(2, &[sge(&c.mr, 0, 8)], d.mr.addr(), d.mr.rkey()).signaled())
        .unwrap();
    assert_eq!(wait1(&c.cq).status, WcStatus::SUCCESS);
}

/// A pair like `ev_pair` on a simulated fabric (virtual time: it moves only when a program
/// waits, so a moderation period cannot run out in the middle of a test step).
fn ev_pair_simulated(profile: Profile) -> (Fabric, EvNode, EvNode) {
    let config = FabricConfig { profile, seed: Some(7), ..Default::default() };
    ev_pair_on(config, CqOptions { timestamps: profile == Profile::Full })
}

/// `n` SENDs in one post (one call: no virtual time passes between them).
fn send_burst(a: &EvNode, first: u64, n: u64) {
    let wrs: Vec<SendWr<'_>> = (first..first + n).map(|i| SendWr::send(i, &[])).collect();
    a.qp.post_send_list(&wrs).unwrap();
}

#[test]
fn cq_moderation_holds_the_event_until_the_count_or_the_period() {
    let (_f, a, b) = ev_pair_simulated(Profile::Full);
    let ctx = b.cq.context();
    let attr = ctx.query_device();
    assert_eq!((attr.max_cq_count, attr.max_cq_period), (u16::MAX, 4095));
    for i in 0..8 {
        post_recv(&b.qp, i, &[sge(&b.mr, 0, 64)]);
    }
    b.cq.moderate(3, 4000).unwrap();
    // The count: two completions are held, the third fires the event at once.
    b.cq.req_notify(false).unwrap();
    send_burst(&a, 0, 2);
    assert!(!readable(&b.ch, 0), "two of three: held");
    send_burst(&a, 2, 1);
    assert!(readable(&b.ch, 0), "the third completes the count");
    b.ch.get_cq_event().unwrap().ack_events(1);
    let wcs = wait_n(&b.cq, 3);
    // Virtual time stood still through both posts.
    assert!(wcs.iter().all(|w| w.timestamp == wcs[0].timestamp));
    // The period: one completion, and the event comes 4000 us after it (virtual time moves
    // on while the channel is waited on), not before.
    b.cq.req_notify(false).unwrap();
    send_burst(&a, 3, 1);
    assert!(!readable(&b.ch, 0), "one of three, period running: held");
    let cq = b.ch.get_cq_event().unwrap();
    let fired_at = ctx.read_clock().unwrap();
    cq.ack_events(1);
    let w = wait1(&b.cq);
    assert_eq!(w.wr_id, 3);
    assert!(fired_at >= w.timestamp + 4_000_000, "{fired_at} vs {}", w.timestamp);
    // A 0 in either field turns moderation off: every armed completion fires.
    b.cq.moderate(0, 4000).unwrap();
    b.cq.req_notify(false).unwrap();
    send_burst(&a, 4, 1);
    assert!(readable(&b.ch, 0));
    b.ch.get_cq_event().unwrap().ack_events(1);
    wait1(&b.cq);
    // Limits and the rxe profile.
    assert_eq!(b.cq.moderate(1, 4096).unwrap_err().errno(), Errno::EINVAL);
    let (_f, _a, r) = ev_pair_simulated(Profile::Rxe);
    assert_eq!(r.cq.moderate(3, 10).unwrap_err().errno(), Errno::EOPNOTSUPP);
}

#[test]
fn completion_timestamps_follow_the_device_clock() {
    let f = Fabric::new(FabricConfig::default());
    let ctx = f.devices()[0].open().unwrap();
    let attr = ctx.query_device();
    assert_eq!((attr.completion_timestamp_mask, attr.hca_core_clock), (u64::MAX, 1_000_000));
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let opts = CqOptions { timestamps: true };
    let cq = ctx.create_cq_ex(16, None, 0, opts).unwrap();
    let plain = ctx.create_cq(16, None, 0).unwrap();
    assert!(cq.records_timestamps() && !plain.records_timestamps());
    let (a, b) =
        (new_qp(&pd, &cq, QpType::RC, 16, false), new_qp(&pd, &plain, QpType::RC, 16, false));
    connect(&a, &b, &RcParams::default(), &RcParams::default());
    let before = ctx.read_clock().unwrap();
    let write = |id| SendWr::write(id, &[], mr.addr(), mr.rkey()).signaled();
    a.post_send(&write(1)).unwrap();
    let w1 = wait1(&cq);
    std::thread::sleep(Duration::from_millis(2));
    a.post_send(&write(2)).unwrap();
    let w2 = wait1(&cq);
    let after = ctx.read_clock().unwrap();
    assert!(before <= w1.timestamp && w1.timestamp < w2.timestamp && w2.timestamp <= after);
    assert!(w2.timestamp - w1.timestamp >= 2_000_000, "the clock counts nanoseconds");
    // The wall clock of a timestamp is today's.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let wall = ctx.clock_to_wallclock_ns(w2.timestamp);
    assert!(wall.abs_diff(now.as_nanos() as u64) < 60_000_000_000, "{wall} vs {now:?}");
    // A CQ without timestamps reports 0.
    b.post_send(&SendWr::write(3, &[], mr.addr(), mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&plain).timestamp, 0);
    // A device without a clock (rxe) refuses both.
    let rxe = Fabric::new(FabricConfig { profile: Profile::Rxe, ..Default::default() });
    let rctx = rxe.devices()[0].open().unwrap();
    assert_eq!(rctx.read_clock().unwrap_err().errno(), Errno::EOPNOTSUPP);
    let err = rctx.create_cq_ex(16, None, 0, opts).unwrap_err();
    assert_eq!(err.errno(), Errno::EOPNOTSUPP);
}

/// A program that polls after its event and re-arms afterwards (Open MPI's UD connection
/// manager) must hear of a completion that arrived in between: the full profile arms as an
/// HCA does, against what the program consumed, and raises the event at once; rxe waits for
/// the next completion. Re-arming before polling what raised the last event (perftest's `-e`
/// loops) raises nothing on either, and a solicited-only arm ignores an unsolicited one.
#[test]
fn arming_announces_what_came_since_the_last_event_as_an_hca_does() {
    for profile in [Profile::Full, Profile::Rxe] {
        let full = profile == Profile::Full;
        let (_f, a, b) =
            ev_pair_on(FabricConfig { profile, ..Default::default() }, CqOptions::default());
        for i in 0..5 {
            post_recv(&b.qp, i, &[sge(&b.mr, 0, 64)]);
        }
        // The responder completes a receive before it acknowledges it: once the sender's
        // completion is in, the receive's is in the receiver's CQ.
        let send = |id: u64| {
            a.qp.post_send(&SendWr::send(id, &[sge(&a.mr, 0, 8)]).signaled()).unwrap();
            assert_eq!(wait1(&a.cq).wr_id, id);
        };
        let event = || {
            assert!(readable(&b.ch, 1000), "{profile:?}: the event came");
            let cq = b.ch.get_cq_event().unwrap();
            cq.ack_events(1);
        };
        b.cq.req_notify(false).unwrap();
        send(0);
        event();
        assert_eq!(wait1(&b.cq).wr_id, 0);
        // Polled, then a completion arrives while disarmed, then the program re-arms.
        send(1);
        b.cq.req_notify(false).unwrap();
        assert_eq!(readable(&b.ch, 0), full, "{profile:?}: an event at the arming");
        if full {
            event();
        }
        assert_eq!(wait1(&b.cq).wr_id, 1);
        assert!(!readable(&b.ch, 0));
        // Re-armed before polling what raised the event: nothing new, nothing raised.
        b.cq.req_notify(false).unwrap();
        send(2);
        event();
        b.cq.req_notify(false).unwrap();
        assert!(!readable(&b.ch, 0), "{profile:?}: that completion was announced");
        assert_eq!(wait1(&b.cq).wr_id, 2);
        // Still armed: the next one raises it; then an unsolicited one waits unannounced
        // and a solicited-only arming leaves it be.
        send(3);
        event();
        assert_eq!(wait1(&b.cq).wr_id, 3);
        send(4);
        b.cq.req_notify(true).unwrap();
        assert!(!readable(&b.ch, 0), "{profile:?}: not solicited");
        assert_eq!(wait1(&b.cq).wr_id, 4);
    }
}

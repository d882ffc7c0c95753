//! Fault rules on the fabric and the transport's answer to them, in simulation (virtual time:
//! timeouts of hundreds of milliseconds pass instantly, and each run is exactly repeatable).

mod common;
use common::*;
use rdma_emu::*;

/// A simulated fabric with `seed` and `rules`, and two connected nodes on its two devices.
fn sim(seed: u64, rules: &str, pa: &RcParams, pb: &RcParams) -> (Fabric, Node, Node) {
    let fabric = Fabric::new(FabricConfig {
        seed: Some(seed),
        faults: FaultRule::parse(rules).unwrap(),
        ..Default::default()
    });
    let devs = fabric.devices();
    let a = node_on(&devs[0], 1 << 16);
    let b = node_on(&devs[1], 1 << 16);
    connect(&a.qp, &b.qp, pa, pb);
    (fabric, a, b)
}

fn read_u64(mr: &Mr, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

#[test]
fn a_lost_request_is_retransmitted_from_its_psn_and_written_once() {
    let p = RcParams::default();
    let (f, a, b) = sim(1, "drop:op=write,nth=1", &p, &p);
    a.mr.write(0, b"first").unwrap();
    let sg = [sge(&a.mr, 0, 5)];
    a.qp.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    let start = f.now_ns();
    let wc = wait1(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::SUCCESS));
    // It came back only after the local ACK timeout (4.096 us << 14), in virtual time.
    assert!(f.now_ns() - start >= 4096 << 14, "{}", f.now_ns() - start);
    let mut got = [0u8; 5];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"first");
    assert_eq!(f.fault_hits(), [1]);
}

#[test]
fn lost_acks_and_duplicated_requests_never_execute_twice() {
    let p = RcParams::default();
    // The first fetch-and-add's answer is lost: the retransmitted request is a duplicate,
    // answered from the saved result. A duplicated SEND lands in one receive only.
    let (f, a, b) = sim(2, "drop:op=atomic-ack,nth=1; dup:op=send", &p, &p);
    b.mr.write(64, &5u64.to_ne_bytes()).unwrap();
    let sg = [sge(&a.mr, 0, 8)];
    let fa = SendWr::fetch_add(1, &sg, b.mr.addr() + 64, b.mr.rkey(), 10);
    a.qp.post_send(&fa.signaled()).unwrap();
    let wc = wait1(&a.cq);
    assert_eq!(wc.status, WcStatus::SUCCESS);
    assert_eq!(read_u64(&a.mr, 0), 5, "the original value");
    assert_eq!(read_u64(&b.mr, 64), 15, "added once");
    post_recv(&b.qp, 7, &[sge(&b.mr, 128, 16)]);
    post_recv(&b.qp, 8, &[sge(&b.mr, 144, 16)]);
    a.mr.write(8, b"once").unwrap();
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 8, 4)]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (7, WcStatus::SUCCESS, 4));
    assert_empty(&b.cq);
    assert_eq!(f.fault_hits(), [1, 1]);
}

#[test]
fn a_lost_read_response_is_answered_again() {
    let p = RcParams::default();
    let (_f, a, b) = sim(3, "drop:op=read-resp,nth=1", &p, &p);
    b.mr.write(0, b"remote bytes").unwrap();
    let sg = [sge(&a.mr, 100, 12)];
    a.qp.post_send(&SendWr::read(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut got = [0u8; 12];
    a.mr.read(100, &mut got).unwrap();
    assert_eq!(&got, b"remote bytes");
}

#[test]
fn a_dead_link_ends_in_retry_exceeded_then_flushes_the_rest() {
    let p = RcParams { retry_cnt: 3, timeout: 10, ..Default::default() };
    let (f, a, b) = sim(4, "drop:op=request", &p, &p);
    let sg = [sge(&a.mr, 0, 8)];
    for id in 1..=2 {
        a.qp.post_send(&SendWr::write(id, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    }
    let wcs = wait_n(&a.cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RETRY_EXC_ERR));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WR_FLUSH_ERR));
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
    // The first try and retry_cnt retries, each of the two WRITEs in flight.
    assert_eq!(f.fault_hits(), [8]);
}

#[test]
fn an_rnr_storm_is_ridden_out_with_min_rnr_timer_back_off_or_ends_in_rnr_retry_exceeded() {
    let pa = RcParams { rnr_retry: 7, ..Default::default() };
    let pb = RcParams { min_rnr_timer: 14, ..Default::default() }; // 1.28 ms
    // More RNR NAKs than rnr_retry could count: 7 means "retry forever".
    let (f, a, b) = sim(5, "rnr:count=9", &pa, &pb);
    post_recv(&b.qp, 9, &[sge(&b.mr, 0, 64)]);
    let start = f.now_ns();
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 4)]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&b.cq).wr_id, 9);
    let waited = f.now_ns() - start;
    assert!(
        (9 * 1_280_000..10 * 1_280_000).contains(&waited),
        "{waited}: nine back-offs of 1.28 ms"
    );
    assert_eq!(f.fault_hits(), [9]);

    let pa = RcParams { rnr_retry: 2, ..Default::default() };
    let (f, a, b) = sim(5, "rnr", &pa, &pb);
    post_recv(&b.qp, 9, &[sge(&b.mr, 0, 64)]);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 4)]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RNR_RETRY_EXC_ERR);
    assert_eq!(f.fault_hits(), [3], "the first try and two retries");
    assert_empty(&b.cq);
}

#[test]
fn reordered_requests_are_taken_in_psn_order_exactly_once() {
    let p = RcParams::default();
    let (f, a, b) = sim(6, "reorder:op=send,nth=1", &p, &p);
    for i in 0..3u64 {
        post_recv(&b.qp, 10 + i, &[sge(&b.mr, 64 * i as usize, 64)]);
    }
    for i in 0..3u8 {
        a.mr.write(i as usize, &[b'a' + i]).unwrap();
        let sg = [sge(&a.mr, i as usize, 1)];
        a.qp.post_send(&SendWr::send(u64::from(i), &sg).signaled()).unwrap();
    }
    let sent: Vec<_> = wait_n(&a.cq, 3).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sent, [(0, WcStatus::SUCCESS), (1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
    let got: Vec<_> = wait_n(&b.cq, 3).iter().map(|w| w.wr_id).collect();
    assert_eq!(got, [10, 11, 12]);
    for i in 0..3 {
        let mut c = [0u8];
        b.mr.read(64 * i, &mut c).unwrap();
        assert_eq!(c[0], b'a' + i as u8, "message {i} in its own receive, in order");
    }
    assert_empty(&b.cq);
    assert_eq!(f.fault_hits(), [1]);
}

#[test]
fn a_delayed_ack_arrives_late_and_a_corrupted_packet_is_dropped_like_a_lost_one() {
    let p = RcParams::default();
    let (f, a, b) = sim(7, "delay:op=ack,by=5ms,count=1; corrupt:op=write,nth=2", &p, &p);
    let sg = [sge(&a.mr, 0, 8)];
    let start = f.now_ns();
    a.qp.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let waited = f.now_ns() - start;
    assert!((5_000_000..4096 << 14).contains(&waited), "{waited}: the delay, not a timeout");
    a.qp.post_send(&SendWr::write(2, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(f.fault_hits(), [1, 1]);
}

#[test]
fn uc_loses_a_dropped_message_silently_and_takes_the_next() {
    let fabric = Fabric::new(FabricConfig {
        seed: Some(8),
        faults: FaultRule::parse("drop:op=send,nth=1").unwrap(),
        ..Default::default()
    });
    let devs = fabric.devices();
    let (a, b) = (node_on(&devs[0], 4096), node_on(&devs[1], 4096));
    let uc = |n: &Node| new_qp(&n.pd, &n.cq, QpType::UC, 8, true);
    let (qa, qb) = (uc(&a), uc(&b));
    connect(&qa, &qb, &RcParams::default(), &RcParams::default());
    post_recv(&qb, 1, &[sge(&b.mr, 0, 64)]);
    post_recv(&qb, 2, &[sge(&b.mr, 64, 64)]);
    for id in [10, 11] {
        qa.post_send(&SendWr::send(id, &[sge(&a.mr, 0, 4)])).unwrap();
    }
    // The sender completes both (UC has no ACKs); only the second arrives, in the first
    // receive.
    let sent: Vec<_> = wait_n(&a.cq, 2).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sent, [(10, WcStatus::SUCCESS), (11, WcStatus::SUCCESS)]);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status), (1, WcStatus::SUCCESS));
    assert_empty(&b.cq);
    assert_eq!(qb.query().unwrap().qp_state, QpState::RTS);
}

#[test]
fn a_partition_heals_in_time_for_generous_retries_and_not_for_stingy_ones() {
    let generous = RcParams { timeout: 14, retry_cnt: 7, ..Default::default() }; // 67 ms each
    let (_f, a, b) = sim(9, "partition:a=emu0,b=emu1,for=200ms", &generous, &generous);
    let sg = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);

    let stingy = RcParams { timeout: 14, retry_cnt: 1, ..Default::default() };
    let (_f, a, b) = sim(9, "partition:a=emu0,b=emu1,for=200ms", &stingy, &stingy);
    let sg = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RETRY_EXC_ERR);
}

/// The next async event of `ctx` (acknowledged), or `None`.
fn next_event(ctx: &Context) -> Option<EventType> {
    ctx.set_async_nonblocking(true).unwrap();
    let ev = ctx.get_async_event().ok()?;
    ctx.ack_async_event(&ev);
    Some(ev.event_type)
}

#[test]
fn a_port_flap_raises_port_err_then_port_active_and_traffic_recovers() {
    let p = RcParams::default();
    let (f, a, b) = sim(10, "port-down:dev=emu1,port=1,after=1ms,for=100ms", &p, &p);
    // Let virtual time reach the flap: an empty poll advances it to the next deadline.
    while next_event(&b.ctx).is_none() {
        a.cq.poll_one();
    }
    assert_eq!(b.ctx.query_port(1).unwrap().state, PortState::DOWN);
    let sg = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "retried until the port came back");
    assert_eq!(next_event(&b.ctx), Some(EventType::PORT_ACTIVE));
    assert!(f.now_ns() >= 101_000_000);
    assert_eq!(f.fault_hits(), [2]);
}

#[test]
fn device_fatal_flushes_the_devices_qps_and_cq_overrun_raises_cq_err() {
    let p = RcParams::default();
    let (_f, a, b) = sim(11, "device-fatal:dev=emu0,after=1ms", &p, &p);
    post_recv(&a.qp, 5, &[sge(&a.mr, 0, 8)]);
    let wc = wait1(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WR_FLUSH_ERR));
    let events: Vec<_> = std::iter::from_fn(|| next_event(&a.ctx)).collect();
    assert!(events.contains(&EventType::DEVICE_FATAL), "{events:?}");
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
    assert_eq!(b.qp.query().unwrap().qp_state, QpState::RTS, "the other device lives on");

    let (f, a, b) = sim(12, "", &p, &p);
    f.set_faults(FaultRule::parse(&format!("cq-overrun:qp={}", a.qp.qp_num())).unwrap());
    while next_event(&a.ctx).is_none() {
        a.cq.poll_one();
    }
    assert!(a.cq.is_overrun());
    let sg = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    assert_empty(&a.cq);
}

/// Everything a run shows: completions, virtual time, rule hits.
fn lossy_run(seed: u64) -> String {
    let p = RcParams { rnr_retry: 7, ..Default::default() };
    let rules =
        "drop:p=0.2; dup:p=0.1; reorder:op=request,p=0.1; delay:op=ack,p=0.1,by=2ms; rnr:p=0.2";
    let (f, a, b) = sim(seed, rules, &p, &p);
    let mut trace = String::new();
    for i in 0..40u64 {
        post_recv(&b.qp, 100 + i, &[sge(&b.mr, 0, 64)]);
    }
    for i in 0..40u64 {
        let sg = [sge(&a.mr, 8 * (i as usize % 4), 8)];
        let wr = match i % 4 {
            0 => SendWr::send(i, &sg),
            1 => SendWr::write(i, &sg, b.mr.addr() + 512, b.mr.rkey()),
            2 => SendWr::read(i, &sg, b.mr.addr() + 512, b.mr.rkey()),
            _ => SendWr::fetch_add(i, &sg, b.mr.addr() + 1024, b.mr.rkey(), 1),
        };
        a.qp.post_send(&wr.signaled()).unwrap();
        for w in wait_n(&a.cq, 1) {
            trace += &format!("{} {:?} {:?} @{}\n", w.wr_id, w.status, w.opcode, f.now_ns());
        }
    }
    for w in wait_n(&b.cq, 10) {
        trace += &format!("recv {} {:?} {}\n", w.wr_id, w.status, w.byte_len);
    }
    trace += &format!("adds {} hits {:?}\n", read_u64(&b.mr, 1024), f.fault_hits());
    trace
}

#[test]
fn the_same_seed_replays_the_same_faulty_run_and_another_seed_differs() {
    let first = lossy_run(42);
    assert_eq!(first, lossy_run(42));
    assert_ne!(first, lossy_run(43));
    // Exactly-once despite the faults: ten fetch-and-adds added ten.
    assert!(first.contains("adds 10 "), "{first}");
}

#[test]
fn ud_loses_a_dropped_datagram_and_delivers_the_next() {
    let fabric = Fabric::new(FabricConfig {
        seed: Some(13),
        faults: FaultRule::parse("drop:op=send,nth=1").unwrap(),
        ..Default::default()
    });
    let devs = fabric.devices();
    let (a, b) = (node_on(&devs[0], 4096), node_on(&devs[1], 4096));
    let ud = |n: &Node| ud_qp(n, 5, 8);
    let (qa, qb) = (ud(&a), ud(&b));
    let ep = qb.endpoint(0);
    let attr = AhAttr { dlid: ep.lid, port_num: 1, ..Default::default() };
    let ah = a.pd.create_ah(&attr).unwrap();
    post_recv(&qb, 1, &[sge(&b.mr, 0, 100)]);
    post_recv(&qb, 2, &[sge(&b.mr, 100, 100)]);
    for (id, text) in [(10, b"lost"), (11, b"kept")] {
        a.mr.write(0, text).unwrap();
        qa.post_send(&SendWr::send_ud(id, &[sge(&a.mr, 0, 4)], &ah, ep.qpn, 5)).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "UD has no ACKs to miss");
    }
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::SUCCESS, 44));
    let mut got = [0u8; 4];
    b.mr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"kept");
    assert_empty(&b.cq);
    assert_eq!(fabric.fault_hits(), [1]);
}

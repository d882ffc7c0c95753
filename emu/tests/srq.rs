//! Shared receive queues: QPs sharing one SRQ, the limit event, resize, and their errors.

mod common;
use common::*;
use rdma_emu::*;

struct Setup {
    _f: Fabric,
    srq: Srq,
    /// Two senders on device 0, each connected to its own receiver QP on device 1; both
    /// receivers take from `srq`.
    senders: Vec<Node>,
    receivers: Vec<Qp>,
    rx: Node,
}

fn setup(profile: Profile, srq_size: u32, rnr_retry: u8) -> Setup {
    let f = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
    let devs = f.devices();
    let rx = node_on(&devs[1], 4096);
    let srq = rx.pd.create_srq(&SrqAttr { max_wr: srq_size, max_sge: 2, srq_limit: 0 }).unwrap();
    let p = RcParams { rnr_retry, ..Default::default() };
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let s = node_on(&devs[0], 4096);
        let r = rx
            .pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::RC,
                send_cq: &rx.cq,
                recv_cq: &rx.cq,
                cap: cap(8),
                sq_sig_all: false,
                srq: Some(&srq),
                max_tso_header: 0,
                create_flags: QpCreateFlags::empty(),
            })
            .unwrap();
        connect(&s.qp, &r, &p, &p);
        senders.push(s);
        receivers.push(r);
    }
    Setup { _f: f, srq, senders, receivers, rx }
}

fn srq_recv(s: &Setup, wr_id: u64, off: usize) {
    s.srq.post_recv(&RecvWr { wr_id, sg_list: &[sge(&s.rx.mr, off, 64)] }).unwrap();
}

#[test]
fn two_qps_take_receives_from_one_srq_in_order() {
    let s = setup(Profile::Full, 8, 7);
    assert_eq!(s.srq.query().unwrap(), SrqAttr { max_wr: 15, max_sge: 2, srq_limit: 0 });
    for i in 0..3 {
        srq_recv(&s, 10 + i, 64 * i as usize);
    }
    for (i, snd) in [&s.senders[1], &s.senders[0], &s.senders[1]].iter().enumerate() {
        snd.mr.write(0, &[i as u8 + 1; 4]).unwrap();
        snd.qp.post_send(&SendWr::send(i as u64, &[sge(&snd.mr, 0, 4)])).unwrap();
    }
    let wcs = wait_n(&s.rx.cq, 3);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![10, 11, 12]);
    assert_eq!(wcs[0].qp_num, s.receivers[1].qp_num());
    assert_eq!(wcs[1].qp_num, s.receivers[0].qp_num());
    let mut b = [0u8; 4];
    s.rx.mr.read(64, &mut b).unwrap();
    assert_eq!(b, [2; 4]);
    let err = s.receivers[0].post_recv(&RecvWr { wr_id: 1, sg_list: &[] }).unwrap_err();
    assert_eq!(err.errno(), Errno::EINVAL, "receives go to the SRQ");
}

#[test]
fn limit_event_fires_once_when_the_count_drops_below_it() {
    let s = setup(Profile::Full, 8, 7);
    for i in 0..4 {
        srq_recv(&s, i, 0);
    }
    use srq_attr_mask::*;
    s.srq.modify(&SrqAttr { srq_limit: 3, ..Default::default() }, LIMIT).unwrap();
    let snd = &s.senders[0];
    snd.qp.post_send(&SendWr::send(1, &[sge(&snd.mr, 0, 4)])).unwrap();
    wait1(&s.rx.cq);
    s.rx.ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(
        s.rx.ctx.get_async_event().unwrap_err().errno(),
        Errno::EAGAIN,
        "3 left: not below 3"
    );
    snd.qp.post_send(&SendWr::send(2, &[sge(&snd.mr, 0, 4)])).unwrap();
    wait1(&s.rx.cq);
    let ev = s.rx.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::SRQ_LIMIT_REACHED);
    assert!(matches!(&ev.element, EventElement::Srq(x) if x.same(&s.srq)));
    s.rx.ctx.ack_async_event(&ev);
    assert_eq!(s.srq.query().unwrap().srq_limit, 0, "the limit disarms itself");
    snd.qp.post_send(&SendWr::send(3, &[sge(&snd.mr, 0, 4)])).unwrap();
    wait1(&s.rx.cq);
    assert_eq!(s.rx.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN, "only once");
}

#[test]
fn modify_resizes_and_checks_limits() {
    let s = setup(Profile::Full, 4, 7);
    use srq_attr_mask::*;
    for i in 0..6 {
        srq_recv(&s, i, 0);
    }
    let e = |r: Result<()>| r.unwrap_err().errno();
    assert_eq!(
        e(s.srq.modify(&SrqAttr { srq_limit: 8, ..Default::default() }, LIMIT)),
        Errno::EINVAL
    );
    assert_eq!(
        e(s.srq.modify(&SrqAttr { max_wr: 3, ..Default::default() }, MAX_WR)),
        Errno::EINVAL
    );
    assert_eq!(e(s.srq.modify(&SrqAttr::default(), 4)), Errno::EINVAL);
    s.srq.modify(&SrqAttr { max_wr: 20, ..Default::default() }, MAX_WR).unwrap();
    assert_eq!(s.srq.query().unwrap().max_wr, 31);
    let snd = &s.senders[0];
    for i in 0..6 {
        snd.qp.post_send(&SendWr::send(i, &[sge(&snd.mr, 0, 4)])).unwrap();
    }
    let ids: Vec<u64> = wait_n(&s.rx.cq, 6).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..6).collect::<Vec<_>>(), "resize kept every WQE, in order");
}

#[test]
fn empty_srq_means_rnr_and_errored_qps_leave_the_srq_alone() {
    let s = setup(Profile::Full, 4, 0);
    let snd = &s.senders[0];
    snd.qp.post_send(&SendWr::send(1, &[sge(&snd.mr, 0, 4)])).unwrap();
    assert_eq!(wait1(&snd.cq).status, WcStatus::RNR_RETRY_EXC_ERR);
    srq_recv(&s, 7, 0);
    s.receivers[0]
        .modify(&QpAttr { qp_state: QpState::ERR, ..Default::default() }, QpAttrMask::STATE)
        .unwrap();
    assert_empty(&s.rx.cq);
    let ev = s.rx.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::QP_LAST_WQE_REACHED);
    s.rx.ctx.ack_async_event(&ev);
    // The other QP still gets the SRQ's WQE.
    let other = &s.senders[1];
    other.qp.post_send(&SendWr::send(2, &[sge(&other.mr, 0, 4)])).unwrap();
    assert_eq!(wait1(&s.rx.cq).wr_id, 7);
}

#[test]
fn srq_create_limits_and_busy_destroys() {
    let s = setup(Profile::Rxe, 4, 7);
    let pd = &s.rx.pd;
    let e = |a: SrqAttr| pd.create_srq(&a).unwrap_err().errno();
    assert_eq!(e(SrqAttr { max_wr: 0, max_sge: 1, srq_limit: 0 }), Errno::EINVAL);
    assert_eq!(
        e(SrqAttr { max_wr: 4, max_sge: 28, srq_limit: 0 }),
        Errno::EINVAL,
        "rxe: max_srq_sge 27"
    );
    assert_eq!(
        pd.create_srq(&SrqAttr { max_wr: 1, max_sge: 0, srq_limit: 0 })
            .unwrap()
            .query()
            .unwrap()
            .max_sge,
        1
    );
    assert_eq!(s.srq.destroy().unwrap_err().errno(), Errno::EBUSY, "QPs use it");
    for q in &s.receivers {
        q.destroy().unwrap();
    }
    s.srq.destroy().unwrap();
    assert_eq!(
        s.srq.post_recv(&RecvWr { wr_id: 1, sg_list: &[] }).unwrap_err().errno(),
        Errno::EINVAL
    );
}

#[test]
fn srq_receive_buffers_are_checked_against_the_srqs_pd_on_the_full_profile_and_the_qps_on_rxe() {
    for (profile, want) in
        [(Profile::Full, WcStatus::SUCCESS), (Profile::Rxe, WcStatus::LOC_PROT_ERR)]
    {
        let f = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
        let devs = f.devices();
        let (tx, rx) = (node_on(&devs[0], 4096), node_on(&devs[1], 4096));
        // The SRQ and its buffer in one PD, the QP that takes from it in another.
        let srq_pd = rx.ctx.alloc_pd().unwrap();
        let srq = srq_pd.create_srq(&SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
        let buf = srq_pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let qp = rx
            .pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::RC,
                send_cq: &rx.cq,
                recv_cq: &rx.cq,
                cap: cap(4),
                sq_sig_all: false,
                srq: Some(&srq),
                max_tso_header: 0,
                create_flags: QpCreateFlags::empty(),
            })
            .unwrap();
        let p = RcParams::default();
        connect(&tx.qp, &qp, &p, &p);
        srq.post_recv(&RecvWr { wr_id: 9, sg_list: &[sge(&buf, 0, 64)] }).unwrap();
        tx.qp.post_send(&SendWr::send(1, &[sge(&tx.mr, 0, 4)])).unwrap();
        let wc = wait1(&rx.cq);
        assert_eq!((wc.wr_id, wc.status), (9, want), "{profile:?}");
    }
}

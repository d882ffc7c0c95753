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

/// Tag matching (full profile, as an mlx5 HCA matches): tagged messages land in the buffer of
/// the first posted tag they match, without their header; unmatched ones go whole to ordinary
/// receives and pause matching until the application syncs; list operations complete on the
/// SRQ's CQ.
#[test]
fn a_tag_matching_srq_matches_eager_messages_and_syncs() {
    let f = Fabric::new(FabricConfig { devices: 2, ..Default::default() });
    let devs = f.devices();
    let (a, b) = (node_on(&devs[0], 4096), node_on(&devs[1], 4096));
    let tm_cq = b.ctx.create_cq(16, None, 0).unwrap();
    let attr = SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 };
    assert_eq!(b.pd.create_srq_tm(&attr, 0, &tm_cq).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(b.pd.create_srq_tm(&attr, 256, &tm_cq).unwrap_err().errno(), Errno::EINVAL);
    let srq = b.pd.create_srq_tm(&attr, 4, &tm_cq).unwrap();
    let qp = b
        .pd
        .create_qp(&QpInitAttr { srq: Some(&srq), ..QpInitAttr::new(QpType::RC, &b.cq, cap(8)) })
        .unwrap();
    let p = RcParams::default();
    connect(&a.qp, &qp, &p, &p);
    fn op(wr_id: u64, kind: SrqOpKind<'_>, sync: Option<u32>) -> SrqOp<'_> {
        SrqOp { wr_id, kind, signaled: true, sync }
    }
    let add = |wr_id, tag, recv_wr_id, off, sync| {
        let sg = [sge(&b.mr, off, 64)];
        let kind = SrqOpKind::AddTag { tag, mask: u64::MAX, recv_wr_id, sg_list: &sg };
        srq.post_ops(&[op(wr_id, kind, sync)]).unwrap()[0].unwrap()
    };
    // A message with a TMH of `op`, `tag`, app_ctx 9, then `body`.
    let send = |id, tmh_op: u8, tag: u64, body: &[u8]| {
        let mut m = vec![tmh_op, 0, 0, 0, 0, 0, 0, 9];
        m.extend_from_slice(&tag.to_be_bytes());
        m.extend_from_slice(body);
        a.mr.write(0, &m).unwrap();
        a.qp.post_send(&SendWr::send(id, &[sge(&a.mr, 0, m.len())]).signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
        wait1(&b.cq)
    };
    let h = add(1, 0x1234, 77, 0, None);
    let w = wait1(&tm_cq);
    assert_eq!((w.wr_id, w.opcode, w.wc_flags), (1, WcOpcode::TM_ADD, WcFlags::empty()));
    for (wr_id, off) in [(50, 1024), (51, 2048), (52, 3072)] {
        srq.post_recv(&RecvWr { wr_id, sg_list: &[sge(&b.mr, off, 64)] }).unwrap();
    }
    // Expected: the tag's buffer, the body only.
    let w = send(1, tmh::EAGER, 0x1234, b"hello");
    assert_eq!((w.wr_id, w.opcode, w.byte_len), (77, WcOpcode::TM_RECV, 5));
    assert_eq!(w.wc_flags, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID);
    assert_eq!((w.tm_tag, w.tm_priv), (0x1234, 9));
    let mut got = [0u8; 5];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    // Unexpected: an ordinary receive takes it whole, and matching pauses.
    let w = send(2, tmh::EAGER, 0x9999, b"early");
    assert_eq!(
        (w.wr_id, w.opcode, w.byte_len, w.wc_flags),
        (50, WcOpcode::TM_RECV, 21, WcFlags::empty())
    );
    // Its TMH is in the buffer, not in the completion (mlx5's: rdma-core's tests read it so).
    assert_eq!((w.tm_tag, w.tm_priv), (0, 0));
    b.mr.read(1024 + 16, &mut got).unwrap();
    assert_eq!(&got, b"early");
    add(3, 0x9999, 78, 64, None);
    let w = wait1(&tm_cq);
    assert_eq!((w.opcode, w.wc_flags), (WcOpcode::TM_ADD, WcFlags::TM_SYNC_REQ));
    let w = send(3, tmh::EAGER, 0x9999, b"again");
    assert_eq!((w.wr_id, w.opcode), (51, WcOpcode::TM_RECV), "no matching before the sync");
    // The application handled both unexpected messages: matching resumes.
    srq.post_ops(&[op(4, SrqOpKind::Sync, Some(2))]).unwrap();
    let w = wait1(&tm_cq);
    assert_eq!((w.wr_id, w.opcode, w.wc_flags), (4, WcOpcode::TM_SYNC, WcFlags::empty()));
    let w = send(4, tmh::EAGER, 0x9999, b"match");
    assert_eq!((w.wr_id, w.wc_flags), (78, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID));
    // A message without a tag.
    let w = send(5, tmh::NO_TAG, 0, b"plain");
    assert_eq!((w.wr_id, w.opcode), (52, WcOpcode::TM_NO_TAG));
    // Rendezvous, as the HCA runs it: the match completes, the HCA reads the sender's buffer
    // (the RVH names it) into the tag's, completes the data, and sends the sender a FIN.
    add(6, 0x5555, 79, 512, None);
    wait1(&tm_cq);
    for (wr_id, off) in [(53, 3072), (54, 3200)] {
        srq.post_recv(&RecvWr { wr_id, sg_list: &[sge(&b.mr, off, 64)] }).unwrap();
    }
    a.mr.write(2048, &[0xab; 32]).unwrap();
    a.qp.post_recv(&RecvWr { wr_id: 90, sg_list: &[sge(&a.mr, 3072, 64)] }).unwrap();
    let rvh = |len: u32| {
        let mut r = (a.mr.addr() + 2048).to_be_bytes().to_vec();
        r.extend_from_slice(&a.mr.rkey().to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r
    };
    let w = send(6, tmh::RNDV, 0x5555, &rvh(32));
    assert_eq!((w.wr_id, w.opcode, w.wc_flags), (79, WcOpcode::TM_RECV, WcFlags::TM_MATCH));
    let w = wait1(&b.cq);
    assert_eq!((w.wr_id, w.status, w.byte_len), (79, WcStatus::SUCCESS, 32));
    // (No TMH with the data: the match's completion carried it, as on mlx5.)
    assert_eq!((w.wc_flags, w.tm_tag, w.tm_priv), (WcFlags::TM_DATA_VALID, 0, 0));
    let mut data = [0u8; 32];
    b.mr.read(512, &mut data).unwrap();
    assert_eq!(data, [0xab; 32]);
    let fin = wait1(&a.cq);
    assert_eq!((fin.wr_id, fin.opcode, fin.byte_len), (90, WcOpcode::RECV, 16));
    let mut fin_tmh = [0u8; 16];
    a.mr.read(3072, &mut fin_tmh).unwrap();
    let expect: (u8, &[u8], &[u8]) = (tmh::FIN, &[0, 0, 0, 9], &0x5555u64.to_be_bytes());
    assert_eq!((fin_tmh[0], &fin_tmh[4..8], &fin_tmh[8..16]), expect);
    // Longer than the tag's buffer: left to software (IBV_WC_TM_RNDV_INCOMPLETE, RVH delivered).
    add(7, 0x6666, 80, 1024, None);
    wait1(&tm_cq);
    let w = send(7, tmh::RNDV, 0x6666, &rvh(100));
    assert_eq!((w.wr_id, w.status), (80, WcStatus::TM_RNDV_INCOMPLETE));
    assert_eq!(w.wc_flags, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID);
    // Removing a consumed tag reports TM_ERR; a handle past the list is refused; the list is
    // four tags long.
    srq.post_ops(&[op(5, SrqOpKind::DelTag { handle: h }, None)]).unwrap();
    let w = wait1(&tm_cq);
    assert_eq!((w.opcode, w.status), (WcOpcode::TM_DEL, WcStatus::TM_ERR));
    let e = srq.post_ops(&[op(6, SrqOpKind::DelTag { handle: 99 }, None)]).unwrap_err();
    assert_eq!((e.0, e.1.errno()), (0, Errno::EINVAL));
    for i in 0..4 {
        add(10 + i, 0x100 + i, 0, 0, None);
    }
    let sg = [sge(&b.mr, 0, 8)];
    let kind = SrqOpKind::AddTag { tag: 1, mask: 1, recv_wr_id: 0, sg_list: &sg };
    let e = srq.post_ops(&[op(20, kind, None)]).unwrap_err();
    assert_eq!(e.1.errno(), Errno::ENOMEM);
    // The rxe profile (Linux 6.1) has no tag matching.
    let rxe = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let r = node_on(&rxe.devices()[0], 64);
    assert_eq!(r.pd.create_srq_tm(&attr, 4, &r.cq).unwrap_err().errno(), Errno::EOPNOTSUPP);
}

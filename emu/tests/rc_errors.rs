//! Every RC error status, provoked through real traffic, with the state each side ends in.

mod common;
use common::*;
use rdma_emu::*;

fn expect_flushed(cq: &Cq, wr_ids: &[u64]) {
    let wcs = wait_n(cq, wr_ids.len());
    for (wc, id) in wcs.iter().zip(wr_ids) {
        assert_eq!((wc.wr_id, wc.status), (*id, WcStatus::WR_FLUSH_ERR), "{wc:?}");
        assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::SEND, 0), "rxe reports 0 for both");
    }
}

#[test]
fn bad_rkey_gives_rem_access_err_flushes_and_raises_access_event() {
    let (_f, a, b) = pair(Profile::Full);
    let src = [sge(&a.mr, 0, 8)];
    let wrs = [
        SendWr::write(1, &src, b.mr.addr(), b.mr.rkey() ^ 0x100),
        SendWr::write(2, &src, b.mr.addr(), b.mr.rkey()),
    ];
    a.qp.post_send_list(&wrs).unwrap();
    let e = wait1(&a.cq);
    assert_eq!(
        (e.wr_id, e.status),
        (1, WcStatus::REM_ACCESS_ERR),
        "errors complete even unsignaled"
    );
    assert_eq!((e.opcode, e.byte_len), (WcOpcode::SEND, 0));
    expect_flushed(&a.cq, &[2]);
    assert_eq!(a.qp.state(), QpState::ERR);
    assert_eq!(b.qp.state(), QpState::ERR, "the responder's QP goes to ERR too");
    let ev = b.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::QP_ACCESS_ERR);
    assert!(matches!(&ev.element, EventElement::Qp(q) if q.same(&b.qp)));
    b.ctx.ack_async_event(&ev);
}

#[test]
fn rxe_profile_raises_no_qp_error_events() {
    let (_f, a, b) = pair(Profile::Rxe);
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), 0x4242)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    b.ctx.set_async_nonblocking(true).unwrap();
    assert_eq!(b.ctx.get_async_event().unwrap_err().errno(), Errno::EAGAIN);
}

#[test]
fn remote_access_checks_range_and_rights() {
    // Beyond the MR, WRITE to an MR without REMOTE_WRITE, READ without REMOTE_READ, atomic
    // without REMOTE_ATOMIC: each is a remote access error.
    type Case = fn(&Mr) -> SendWr<'static>;
    let cases: [(&str, AccessFlags, Case); 4] = [
        ("write past the end", ALL_ACCESS, |mr| {
            SendWr::write(1, &[], mr.addr() + mr.length() as u64 - 4, mr.rkey())
        }),
        ("write without REMOTE_WRITE", AccessFlags::REMOTE_READ, |mr| {
            SendWr::write(1, &[], mr.addr(), mr.rkey())
        }),
        ("read without REMOTE_READ", AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE, |mr| {
            SendWr::read(1, &[], mr.addr(), mr.rkey())
        }),
        ("atomic without REMOTE_ATOMIC", AccessFlags::REMOTE_READ, |mr| {
            SendWr::fetch_add(1, &[], mr.addr(), mr.rkey(), 1)
        }),
    ];
    for (what, access, make) in cases {
        let (_f, a, b) = pair(Profile::Full);
        let target = b.pd.reg_mr(4096, access).unwrap();
        let sg = [sge(&a.mr, 0, 8)];
        let mut wr = make(&target);
        wr.sg_list = &sg;
        a.qp.post_send(&wr).unwrap();
        let wc = wait1(&a.cq);
        assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR, "{what}");
    }
}

#[test]
fn qp_without_remote_rights_gives_rem_inv_req_err() {
    let pb = RcParams { access: AccessFlags::LOCAL_WRITE, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &RcParams::default(), &pb);
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey())).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_INV_REQ_ERR);
    assert_eq!(b.qp.state(), QpState::ERR);
    let ev = b.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::QP_REQ_ERR);
    b.ctx.ack_async_event(&ev);
}

#[test]
fn send_longer_than_receive_buffer_is_loc_len_err_and_rem_inv_req_err() {
    let (_f, a, b) = pair(Profile::Full);
    post_recv(&b.qp, 10, &[sge(&b.mr, 0, 16)]);
    post_recv(&b.qp, 11, &[sge(&b.mr, 0, 16)]);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 17)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_INV_REQ_ERR);
    let r = wait_n(&b.cq, 2);
    assert_eq!((r[0].wr_id, r[0].status), (10, WcStatus::LOC_LEN_ERR));
    assert_eq!((r[1].wr_id, r[1].status), (11, WcStatus::WR_FLUSH_ERR));
}

#[test]
fn bad_local_lkey_is_loc_prot_err() {
    let (_f, a, b) = pair(Profile::Full);
    let bad = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() + 0x100 }];
    a.qp.post_send(&SendWr::write(1, &bad, b.mr.addr(), b.mr.rkey())).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::LOC_PROT_ERR);
    assert_eq!(a.qp.state(), QpState::ERR);
    // The responder saw nothing and is still fine.
    assert_eq!(b.qp.state(), QpState::RTS);

    // READ into an MR without LOCAL_WRITE.
    let (_f, a, b) = pair(Profile::Full);
    let ro = a.pd.reg_mr(64, AccessFlags::empty()).unwrap();
    assert_eq!(ro.rkey(), ro.lkey(), "the full profile's rkey is the lkey, as mlx5's");
    a.qp.post_send(&SendWr::read(2, &[sge(&ro, 0, 8)], b.mr.addr(), b.mr.rkey())).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::LOC_PROT_ERR);

    // Both keys bad: the local buffer is only touched when the data comes back, so the
    // responder's refusal is what the READ reports (as rxe).
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, b) = pair(profile);
        let bad = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() ^ 0x100 }];
        a.qp.post_send(&SendWr::read(3, &bad, b.mr.addr(), b.mr.rkey() ^ 0x100)).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR, "{profile:?}");
    }
}

#[test]
fn an_atomic_whose_result_buffer_is_not_writable_is_loc_prot_err() {
    // Its result buffer is checked when the result comes back, after the responder executed
    // it (as rxe's completer does): the remote word moved, the local buffer did not. The same
    // whether the express path or the packet path carries it.
    for express in [true, false] {
        let (f, a, b) = pair(Profile::Full);
        f.set_express(express);
        b.mr.write(0, &5u64.to_ne_bytes()).unwrap();
        let ro = a.pd.reg_mr(64, AccessFlags::empty()).unwrap();
        let res = [sge(&ro, 0, 8)];
        a.qp.post_send(&SendWr::fetch_add(1, &res, b.mr.addr(), b.mr.rkey(), 3)).unwrap();
        let wc = wait1(&a.cq);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LOC_PROT_ERR), "express {express}");
        assert_eq!(a.qp.state(), QpState::ERR);
        let (mut word, mut kept) = ([0u8; 8], [0u8; 8]);
        b.mr.read(0, &mut word).unwrap();
        ro.read(0, &mut kept).unwrap();
        assert_eq!((u64::from_ne_bytes(word), kept), (8, [0; 8]), "express {express}");
    }
}

#[test]
fn bad_receive_sge_is_loc_prot_err_there_and_rem_op_err_here() {
    let (_f, a, b) = pair(Profile::Full);
    post_recv(&b.qp, 3, &[Sge { addr: b.mr.addr(), length: 64, lkey: 0x7700 }]);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_OP_ERR);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status), (3, WcStatus::LOC_PROT_ERR));
}

#[test]
fn misaligned_atomics_fail_at_the_post_on_rxe_and_at_the_responder_on_the_full_profile() {
    let (_f, a, b) = pair(Profile::Rxe);
    let res = [sge(&a.mr, 0, 8)];
    let err =
        a.qp.post_send(&SendWr::fetch_add(1, &res, b.mr.addr() + 4, b.mr.rkey(), 1)).unwrap_err();
    assert_eq!(err.errno(), Errno::EINVAL, "rxe's provider checks the alignment");
    let (_f, a, b) = pair(Profile::Full);
    a.qp.post_send(&SendWr::fetch_add(1, &res, b.mr.addr() + 4, b.mr.rkey(), 1)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_INV_REQ_ERR, "mlx5 takes it; the peer refuses");
    let (_f, a, b) = pair(Profile::Full);
    let short = [sge(&a.mr, 0, 4)];
    let err =
        a.qp.post_send(&SendWr::fetch_add(1, &short, b.mr.addr(), b.mr.rkey(), 1)).unwrap_err();
    assert_eq!(err.errno(), Errno::EINVAL);
}

#[test]
fn rnr_retry_zero_fails_at_the_first_rnr_nak() {
    let p = RcParams { rnr_retry: 0, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &p, &p);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 8)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RNR_RETRY_EXC_ERR);
    expect_flushed(&a.cq, &[2]);
    assert_eq!(b.qp.state(), QpState::RTS, "an RNR NAK does not hurt the responder");
}

#[test]
fn rnr_retries_are_counted_and_timed_by_the_timer() {
    // 10 us RNR timer, 3 retries: four attempts, then RNR_RETRY_EXC_ERR, with nothing polled
    // in between (the timer thread drives the retries).
    let pa = RcParams { rnr_retry: 3, ..Default::default() };
    let pb = RcParams { min_rnr_timer: 1, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &pa, &pb);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RNR_RETRY_EXC_ERR);
    assert_empty(&b.cq);
}

#[test]
fn rnr_then_receive_posted_completes_successfully() {
    let pb = RcParams { min_rnr_timer: 1, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &RcParams::default(), &pb);
    a.mr.write(0, b"late").unwrap();
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 4)]).signaled()).unwrap();
    assert_empty(&a.cq);
    std::thread::sleep(std::time::Duration::from_millis(5));
    post_recv(&b.qp, 2, &[sge(&b.mr, 0, 64)]);
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&b.cq).byte_len, 4);
    let mut got = [0u8; 4];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"late");
}

#[test]
fn unreachable_peer_exhausts_retries_with_retry_exc_err() {
    let pa = RcParams { timeout: 1, retry_cnt: 2, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &pa, &RcParams::default());
    b.qp.modify(&QpAttr { qp_state: QpState::RESET, ..Default::default() }, QpAttrMask::STATE)
        .unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey())).unwrap();
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 8)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RETRY_EXC_ERR);
    expect_flushed(&a.cq, &[2]);
    assert_eq!(a.qp.state(), QpState::ERR);
}

#[test]
fn modify_to_err_flushes_both_queues_and_later_posts_flush_at_once() {
    let (_f, a, _b) = pair(Profile::Full);
    post_recv(&a.qp, 100, &[sge(&a.mr, 0, 8)]);
    post_recv(&a.qp, 101, &[sge(&a.mr, 0, 8)]);
    a.qp.modify(&QpAttr { qp_state: QpState::ERR, ..Default::default() }, QpAttrMask::STATE)
        .unwrap();
    expect_flushed(&a.cq, &[100, 101]);
    a.qp.post_send(&SendWr::send(7, &[sge(&a.mr, 0, 8)])).unwrap();
    expect_flushed(&a.cq, &[7]);
    post_recv(&a.qp, 8, &[]);
    expect_flushed(&a.cq, &[8]);
}

/// A QP moved to RESET leaves no completions of its own behind in the full profile, as mlx5
/// and mlx4 clean its CQs then (a program restating its QPs sees no stale flushes); rxe leaves
/// them. The other QP's completions in the same CQ stay.
#[test]
fn reset_takes_the_qps_completions_out_of_its_cqs_on_the_full_profile_only() {
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, _b) = pair(profile);
        let shared = a.pd.create_qp(&QpInitAttr::new(QpType::UD, &a.cq, cap(4))).unwrap();
        let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: 7, ..Default::default() };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        shared.modify(&init, mask).unwrap();
        post_recv(&a.qp, 100, &[sge(&a.mr, 0, 8)]);
        post_recv(&a.qp, 101, &[sge(&a.mr, 0, 8)]);
        post_recv(&shared, 200, &[sge(&a.mr, 0, 8)]);
        let to = |s| QpAttr { qp_state: s, ..Default::default() };
        a.qp.modify(&to(QpState::ERR), QpAttrMask::STATE).unwrap();
        shared.modify(&to(QpState::ERR), QpAttrMask::STATE).unwrap();
        a.qp.modify(&to(QpState::RESET), QpAttrMask::STATE).unwrap();
        let left: Vec<u64> = std::iter::from_fn(|| a.cq.poll_one()).map(|wc| wc.wr_id).collect();
        let want: &[u64] = if profile == Profile::Full { &[200] } else { &[100, 101, 200] };
        assert_eq!(left, want, "{profile:?}");
    }
}

/// Destroying a QP takes its completions out of its CQs in the full profile, successful ones
/// too, as mlx5's `ibv_destroy_qp` cleans its CQs (libfabric's rxm closes a connection's QP,
/// then reads its CQ to the end, and reposts a receive it finds there on the QP it closed);
/// rxe leaves them. The other QP's completions in the same CQ stay.
#[test]
fn destroy_takes_the_qps_completions_out_of_its_cqs_on_the_full_profile_only() {
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, b) = pair(profile);
        let other = b.pd.create_qp(&QpInitAttr::new(QpType::UD, &b.cq, cap(4))).unwrap();
        let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: 7, ..Default::default() };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        other.modify(&init, mask).unwrap();
        post_recv(&b.qp, 100, &[sge(&b.mr, 0, 8)]);
        post_recv(&other, 200, &[sge(&b.mr, 0, 8)]);
        a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)]).signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
        let src = [sge(&b.mr, 0, 8)];
        b.qp.post_send(&SendWr::write(300, &src, a.mr.addr(), a.mr.rkey()).signaled()).unwrap();
        // In one process a WR's completions are queued by the time its post returns.
        other
            .modify(&QpAttr { qp_state: QpState::ERR, ..Default::default() }, QpAttrMask::STATE)
            .unwrap();
        b.qp.destroy().unwrap();
        let left: Vec<u64> = std::iter::from_fn(|| b.cq.poll_one()).map(|wc| wc.wr_id).collect();
        let want: &[u64] = if profile == Profile::Full { &[200] } else { &[100, 300, 200] };
        assert_eq!(left, want, "{profile:?}");
    }
}

/// Posting before the QP is ready: rxe refuses a send in RESET, INIT or RTR; mlx5 (rdma-core
/// 40 on, IBA C10-22/25/29) a send until the QP reached RTS since its last RESET, so also in
/// ERR reached from INIT. Both refuse a receive in RESET. Nothing refused is queued: once the
/// QPs connect, only what was posted after shows.
#[test]
fn posting_before_the_qp_is_ready_is_einval_as_rxe_and_mlx5_each_refuse_it() {
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() };
    let init_mask =
        QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS;
    let err = QpAttr { qp_state: QpState::ERR, ..Default::default() };
    for profile in [Profile::Rxe, Profile::Full] {
        let full = profile == Profile::Full;
        let fabric = Fabric::new(FabricConfig { profile, ..Default::default() });
        let n = node_on(&fabric.devices()[0], 4096);
        let s = [sge(&n.mr, 0, 8)];
        let send = |id| n.qp.post_send(&SendWr::send(id, &s).signaled());
        let recv = |id| n.qp.post_recv(&RecvWr { wr_id: id, sg_list: &s });
        assert_eq!(send(1).unwrap_err().errno(), Errno::EINVAL, "{profile:?} RESET");
        assert_eq!(recv(1).unwrap_err().errno(), Errno::EINVAL, "{profile:?} RESET");
        n.qp.modify(&init, init_mask).unwrap();
        assert_eq!(send(3).unwrap_err().errno(), Errno::EINVAL, "{profile:?} INIT");
        recv(3).unwrap();
        // ERR from INIT: the send queue never reached RTS.
        n.qp.modify(&err, QpAttrMask::STATE).unwrap();
        assert_eq!(send(4).is_err(), full, "{profile:?} ERR from INIT");
        let flushed: Vec<u64> = std::iter::from_fn(|| n.cq.poll_one()).map(|wc| wc.wr_id).collect();
        let want: &[u64] = if full { &[3] } else { &[3, 4] };
        assert_eq!(flushed, want, "{profile:?}");
    }

    // Refused, not queued: a pair connected after a refused SEND carries only the one posted
    // once the QPs are ready.
    let fabric = Fabric::new(FabricConfig::default());
    let (a, b) = (node_on(&fabric.devices()[0], 4096), node_on(&fabric.devices()[1], 4096));
    a.mr.write(0, b"early").unwrap();
    let early = a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 5)]).signaled());
    assert_eq!(early.unwrap_err().errno(), Errno::EINVAL);
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: &[sge(&b.mr, 0, 64)] }).unwrap();
    a.mr.write(0, b"ready").unwrap();
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 5)]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).wr_id, 2);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.byte_len), (9, 5));
    let mut got = [0u8; 5];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"ready");
    assert_empty(&a.cq);
    assert_empty(&b.cq);
}

#[test]
fn queue_limits_and_bad_wr_index() {
    let (_f, a, b) = pair(Profile::Full);
    let cap = a.qp.cap();
    assert_eq!(cap.max_send_wr, 127, "64 rounds up to 2^7 - 1");
    let s = [sge(&a.mr, 0, 8)];
    let too_many = [s[0]; 5];
    let mut wr = SendWr::send(1, &too_many);
    assert_eq!(a.qp.post_send(&wr).unwrap_err().errno(), Errno::EINVAL, "5 SGEs > max 4");
    wr.sg_list = &s;
    wr.send_flags = SendFlags::INLINE;
    let big = vec![0u8; cap.max_inline_data as usize + 1];
    wr.inline_data = &big;
    assert_eq!(a.qp.post_send(&wr).unwrap_err().errno(), Errno::EINVAL, "inline too long");
    let bad_op = SendWr { opcode: WrOpcode(77), ..SendWr::send(1, &s) };
    assert_eq!(a.qp.post_send(&bad_op).unwrap_err().errno(), Errno::EINVAL);
    // Fill the SQ with RNR-stalled SENDs (no receive at B): the 128th post is ENOMEM.
    let wrs: Vec<SendWr<'_>> =
        (0..cap.max_send_wr as u64 + 1).map(|i| SendWr::send(i, &s)).collect();
    let (bad, err) = a.qp.post_send_list(&wrs).unwrap_err();
    assert_eq!((bad, err.errno()), (cap.max_send_wr as usize, Errno::ENOMEM));
    // B's receives would be consumed by A's RNR-stalled SENDs, so fill a fresh QP's RQ.
    let rwrs: Vec<RecvWr<'_>> = (0..8).map(|i| RecvWr { wr_id: i, sg_list: &[] }).collect();
    let q = new_qp(&b.pd, &b.cq, QpType::RC, 4, false);
    q.modify(
        &QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() },
        QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let (bad, err) = q.post_recv_list(&rwrs).unwrap_err();
    assert_eq!((bad, err.errno()), (7, Errno::ENOMEM), "depth 4 rounds to 7");
}

/// Two nodes, and an RC QP of A's that completes into a CQ of `cqe` entries of its own,
/// connected to B's QP.
fn qp_on_own_cq(cqe: i32) -> (Fabric, Node, Node, Cq, Qp) {
    let fabric = Fabric::new(FabricConfig::default());
    let devs = fabric.devices();
    let a = node_on(&devs[0], 4096);
    let b = node_on(&devs[1], 4096);
    let cq = a.ctx.create_cq(cqe, None, 0).unwrap();
    let qp = new_qp(&a.pd, &cq, QpType::RC, 8, true);
    connect(&qp, &b.qp, &RcParams::default(), &RcParams::default());
    (fabric, a, b, cq, qp)
}

#[test]
fn cq_overrun_loses_the_completion_and_raises_cq_err() {
    let (_f, a, b, small, qp) = qp_on_own_cq(1);
    assert_eq!(small.cqe(), 1);
    let s = [sge(&a.mr, 0, 8)];
    qp.post_send(&SendWr::write(1, &s, b.mr.addr(), b.mr.rkey())).unwrap();
    qp.post_send(&SendWr::write(2, &s, b.mr.addr(), b.mr.rkey())).unwrap();
    let ev = a.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::CQ_ERR);
    assert!(matches!(&ev.element, EventElement::Cq(c) if c.same(&small)));
    a.ctx.ack_async_event(&ev);
    assert!(small.is_overrun());
    assert_eq!(small.poll_one().map(|w| w.wr_id), Some(1));
    assert_eq!(small.poll_one(), None, "the second completion was lost");
    assert_eq!(qp.state(), QpState::RTS, "a lost send completion does not stop the QP (rxe)");
}

/// A CQ larger than its first ring (which holds 4,095) grows its ring as completions pile up
/// unpolled, keeps them in order, and overruns exactly at its size, as a small one does; after
/// a resize, at the new size.
#[test]
fn a_large_cq_holds_exactly_its_size_and_overruns_past_it() {
    let (_f, a, b, big, qp) = qp_on_own_cq(10_000);
    assert_eq!(big.cqe(), 16_383);
    let s = [sge(&a.mr, 0, 8)];
    let write = |id| qp.post_send(&SendWr::write(id, &s, b.mr.addr(), b.mr.rkey())).unwrap();
    let drain = |n: u64| {
        for id in 0..n {
            assert_eq!(big.poll_one().map(|w| (w.wr_id, w.status)), Some((id, WcStatus::SUCCESS)));
        }
        assert_eq!(big.poll_one(), None);
    };
    for id in 0..16_383 {
        write(id);
    }
    assert!(!big.is_overrun(), "16,383 completions fit");
    drain(16_383);
    // Smaller now: a resize takes effect for the ring grown before it too.
    assert_eq!(big.resize(5_000).unwrap(), 8_191);
    for id in 0..8_192 {
        write(id);
    }
    assert!(big.is_overrun());
    let ev = a.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::CQ_ERR);
    a.ctx.ack_async_event(&ev);
    drain(8_191);
}

/// A WR that fails locally while earlier ones are still unacknowledged fails in its turn: the
/// earlier ones complete first (successfully, once their ACKs arrive), then it with its error,
/// then the rest are flushed; no completion is lost. (The packet path only: the express path
/// completes the WRITE at its post, before the bad SEND is looked at.)
#[test]
fn a_local_error_behind_outstanding_wrs_fails_after_them_and_loses_none() {
    for profile in [Profile::Rxe, Profile::Full] {
        let (f, a, b) = pair(profile);
        f.set_express(false);
        let src = [sge(&a.mr, 0, 8)];
        let bad = [Sge { lkey: a.mr.lkey() ^ 0x100, ..sge(&a.mr, 0, 8) }];
        let wrs = [
            SendWr::write(1, &src, b.mr.addr(), b.mr.rkey()).signaled(),
            SendWr::write(2, &src, b.mr.addr() + 8, b.mr.rkey()).signaled(),
            SendWr::send(3, &bad).signaled(),
            SendWr::write(4, &src, b.mr.addr() + 16, b.mr.rkey()).signaled(),
        ];
        a.qp.post_send_list(&wrs).unwrap();
        let got: Vec<_> = wait_n(&a.cq, 4).iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            got,
            [
                (1, WcStatus::SUCCESS),
                (2, WcStatus::SUCCESS),
                (3, WcStatus::LOC_PROT_ERR),
                (4, WcStatus::WR_FLUSH_ERR)
            ],
            "{profile:?}"
        );
        assert_empty(&a.cq);
        assert_eq!(a.qp.state(), QpState::ERR);
    }
}

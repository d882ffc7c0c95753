//! UC: no ACKs, no retries, no RNR; a WR completes once sent; errors drop the message.

mod common;
use common::*;
use rdma_emu::*;

fn uc_pair() -> (Fabric, Node, Node) {
    let f = Fabric::new(FabricConfig::default());
    let devs = f.devices();
    let mk = |d: &Device| {
        let n = node_on(d, 4096);
        let qp = new_qp(&n.pd, &n.cq, QpType::UC, 16, true);
        Node { qp, ..n }
    };
    let (a, b) = (mk(&devs[0]), mk(&devs[1]));
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    (f, a, b)
}

#[test]
fn uc_send_and_write_with_imm_deliver() {
    let (_f, a, b) = uc_pair();
    assert_eq!((a.qp.qp_type(), a.qp.state()), (QpType::UC, QpState::RTS));
    a.mr.write(0, b"uc data").unwrap();
    post_recv(&b.qp, 1, &[sge(&b.mr, 100, 64)]);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 7)])).unwrap();
    assert_eq!((wait1(&a.cq).opcode, wait1(&b.cq).byte_len), (WcOpcode::SEND, 7));
    post_recv(&b.qp, 2, &[]);
    a.qp.post_send(
        &SendWr::write(2, &[sge(&a.mr, 0, 7)], b.mr.addr() + 200, b.mr.rkey()).with_imm(5),
    )
    .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let r = wait1(&b.cq);
    assert_eq!((r.opcode, r.imm_data, r.byte_len), (WcOpcode::RECV_RDMA_WITH_IMM, 5, 7));
    let mut got = [0u8; 7];
    b.mr.read(200, &mut got).unwrap();
    assert_eq!(&got, b"uc data");
}

#[test]
fn uc_fails_read_atomics_and_atomic_write_with_a_local_qp_operation_error() {
    // As rxe (conformance scenario uc_refuses_read_and_atomics): the post takes them, the
    // first fails with LOC_QP_OP_ERR, the QP goes to ERR and the rest flush.
    let (_f, a, b) = uc_pair();
    let s = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::read(1, &s, b.mr.addr(), b.mr.rkey())).unwrap();
    a.qp.post_send(&SendWr::fetch_add(2, &s, b.mr.addr(), b.mr.rkey(), 1)).unwrap();
    a.qp.post_send(&SendWr::atomic_write(3, &s, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
    let wcs = wait_n(&a.cq, 3);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let flushed = WcStatus::WR_FLUSH_ERR;
    assert_eq!(got, [(1, WcStatus::LOC_QP_OP_ERR), (2, flushed), (3, flushed)]);
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
}

#[test]
fn uc_without_a_receive_drops_the_message_and_carries_on() {
    let (_f, a, b) = uc_pair();
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 4)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "no RNR on UC: the sender just completes");
    assert_empty(&b.cq);
    post_recv(&b.qp, 9, &[sge(&b.mr, 0, 64)]);
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 4)])).unwrap();
    wait1(&a.cq);
    assert_eq!(wait1(&b.cq).wr_id, 9, "the next message arrives");
}

#[test]
fn uc_bad_rkey_is_dropped_silently() {
    let (_f, a, b) = uc_pair();
    b.mr.write(0, &[7; 8]).unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 100, 8)], b.mr.addr(), b.mr.rkey() ^ 0x100))
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::RTS, QpState::RTS));
    assert_eq!(b.mr.read_u64(0).unwrap(), u64::from_ne_bytes([7; 8]));
}

#[test]
fn uc_write_with_imm_of_a_bad_rkey_leaves_the_receive_for_the_next_message() {
    // Class E, as rxe (a live run against it once found the receive lost instead): the message
    // is dropped, the receive stays posted, both QPs go on.
    let (_f, a, b) = uc_pair();
    post_recv(&b.qp, 7, &[sge(&b.mr, 0, 64)]);
    let to = (b.mr.addr(), b.mr.rkey() ^ 0x100);
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], to.0, to.1).with_imm(3)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_empty(&b.cq);
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 4)])).unwrap();
    wait1(&a.cq);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode), (7, WcStatus::SUCCESS, WcOpcode::RECV));
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::RTS, QpState::RTS));
}

#[test]
fn uc_write_with_imm_of_a_bad_rkey_completes_an_srq_receive_in_error() {
    // Class D, as rxe: the receive taken off the SRQ completes with a remote access error, the
    // QP goes on and takes the next message.
    let f = Fabric::new(FabricConfig { devices: 2, profile: Profile::Rxe, ..Default::default() });
    let devs = f.devices();
    let a = node_on(&devs[0], 4096);
    let b = node_on(&devs[1], 4096);
    let srq = b.pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
    let qa = new_qp(&a.pd, &a.cq, QpType::UC, 16, true);
    let qb = b
        .pd
        .create_qp(&QpInitAttr { srq: Some(&srq), ..QpInitAttr::new(QpType::UC, &b.cq, cap(16)) })
        .unwrap();
    connect(&qa, &qb, &RcParams::default(), &RcParams::default());
    for id in [7, 8] {
        srq.post_recv(&RecvWr { wr_id: id, sg_list: &[sge(&b.mr, 0, 64)] }).unwrap();
    }
    let to = (b.mr.addr(), b.mr.rkey() ^ 0x100);
    qa.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], to.0, to.1).with_imm(3)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status), (7, WcStatus::REM_ACCESS_ERR));
    qa.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 4)])).unwrap();
    wait1(&a.cq);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (8, WcStatus::SUCCESS, 4));
    assert_eq!(qb.state(), QpState::RTS);
}

#[test]
fn uc_write_the_qp_does_not_enable_is_dropped_and_the_qp_goes_on() {
    // As rxe (a live run against it found the responder put in error instead): a WRITE, with
    // immediate or not, to a QP without REMOTE_WRITE is dropped before it takes a receive.
    let (_f, a, b) = uc_pair();
    let none = QpAttr { qp_state: QpState::RTS, ..Default::default() };
    b.qp.modify(&none, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS).unwrap();
    post_recv(&b.qp, 7, &[sge(&b.mr, 64, 64)]);
    a.mr.write(0, b"written!").unwrap();
    let to = (b.mr.addr(), b.mr.rkey());
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], to.0, to.1)).unwrap();
    a.qp.post_send(&SendWr::write(2, &[sge(&a.mr, 0, 8)], to.0, to.1).with_imm(3)).unwrap();
    let sent = wait_n(&a.cq, 2);
    assert!(sent.iter().all(|w| w.status == WcStatus::SUCCESS), "{sent:?}");
    assert_empty(&b.cq);
    let mut got = [0u8; 8];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 8], "nothing landed");
    // The receive is still posted, and the responder still sends.
    a.qp.post_send(&SendWr::send(3, &[sge(&a.mr, 0, 4)])).unwrap();
    wait1(&a.cq);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode), (7, WcStatus::SUCCESS, WcOpcode::RECV));
    post_recv(&a.qp, 9, &[sge(&a.mr, 64, 64)]);
    b.qp.post_send(&SendWr::send(4, &[sge(&b.mr, 0, 4)])).unwrap();
    assert_eq!((wait1(&b.cq).wr_id, wait1(&a.cq).wr_id), (4, 9));
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::RTS, QpState::RTS));
}

#[test]
fn uc_too_long_send_fails_the_receive_and_errors_the_receiver() {
    let (_f, a, b) = uc_pair();
    post_recv(&b.qp, 3, &[sge(&b.mr, 0, 4)]);
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status), (3, WcStatus::LOC_LEN_ERR));
    assert_eq!(b.qp.state(), QpState::ERR);
}

#[test]
fn uc_to_an_unreachable_peer_completes_without_retries() {
    let (_f, a, b) = uc_pair();
    b.qp.modify(&QpAttr { qp_state: QpState::RESET, ..Default::default() }, QpAttrMask::STATE)
        .unwrap();
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 4)])).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(a.qp.state(), QpState::RTS);
}

#[test]
fn uc_transitions_refuse_rc_only_attributes() {
    let (_f, a, _b) = uc_pair();
    let m = QpAttrMask::CUR_STATE | QpAttrMask::MIN_RNR_TIMER;
    let attr = QpAttr { cur_qp_state: QpState::RTS, ..Default::default() };
    assert_eq!(a.qp.modify(&attr, m).unwrap_err().errno(), Errno::EINVAL);
}

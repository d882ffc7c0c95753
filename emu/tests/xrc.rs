//! XRC: domains shared by file, XRC SRQs named by number, initiator QPs that send to any SRQ
//! of the target's domain, target QPs with no PD or CQ, `open_qp`, and the error paths.

mod common;
use common::*;
use rdma_emu::*;

struct Target {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    xrcd: Xrcd,
    mr: Mr,
}

fn target_on(dev: &Device) -> Target {
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, 0).unwrap();
    let xrcd = ctx.open_xrcd(None, xrcd_oflags::CREAT).unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    Target { ctx, pd, cq, xrcd, mr }
}

fn srq(t: &Target) -> Srq {
    t.xrcd.create_srq(&t.pd, &t.cq, &SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }).unwrap()
}

/// An initiator on `a` connected to a new target QP of `t`.
fn xrc_pair(a: &Node, t: &Target) -> (Qp, Qp) {
    let ini = new_qp(&a.pd, &a.cq, QpType::XRC_SEND, 16, false);
    let tgt = t.xrcd.create_recv_qp().unwrap();
    connect(&ini, &tgt, &RcParams::default(), &RcParams::default());
    (ini, tgt)
}

fn setup() -> (Fabric, Node, Target) {
    let f = Fabric::new(FabricConfig { devices: 2, ..Default::default() });
    let devs = f.devices();
    let a = node_on(&devs[0], 4096);
    let t = target_on(&devs[1]);
    (f, a, t)
}

#[test]
fn sends_land_in_the_named_srq_with_the_target_qp_number() {
    let (_f, a, t) = setup();
    let (s1, s2) = (srq(&t), srq(&t));
    let (n1, n2) = (s1.srq_num().unwrap(), s2.srq_num().unwrap());
    assert_ne!(n1, n2);
    for (i, s) in [&s1, &s2].into_iter().enumerate() {
        s.post_recv(&RecvWr { wr_id: 10 + i as u64, sg_list: &[sge(&t.mr, 64 * i, 64)] }).unwrap();
    }
    let (ini, tgt) = xrc_pair(&a, &t);
    a.mr.write(0, b"to-two").unwrap();
    ini.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 6)]).to_srq(n2).signaled()).unwrap();
    let s = wait1(&a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (1, WcStatus::SUCCESS, WcOpcode::SEND));
    let r = wait1(&t.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (11, WcStatus::SUCCESS, 6), "the SRQ named");
    assert_eq!(r.qp_num, tgt.qp_num(), "wc.qp_num is the target QP");
    let mut got = [0u8; 6];
    t.mr.read(64, &mut got).unwrap();
    assert_eq!(&got, b"to-two");
    // RDMA and atomics are checked against the named SRQ's PD.
    ini.post_send(
        &SendWr::write(2, &[sge(&a.mr, 0, 6)], t.mr.addr() + 512, t.mr.rkey()).to_srq(n1),
    )
    .unwrap();
    t.mr.write_u64(1024, 37).unwrap();
    ini.post_send(
        &SendWr::fetch_add(3, &[sge(&a.mr, 8, 8)], t.mr.addr() + 1024, t.mr.rkey(), 5)
            .to_srq(n1)
            .signaled(),
    )
    .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!((a.mr.read_u64(8).unwrap(), t.mr.read_u64(1024).unwrap()), (37, 42));
    t.mr.read(512, &mut got).unwrap();
    assert_eq!(&got, b"to-two");
    assert_empty(&t.cq);
}

#[test]
fn one_initiator_reaches_every_srq_and_srqs_hear_many_initiators() {
    let (f, a, t) = setup();
    let s = srq(&t);
    let n = s.srq_num().unwrap();
    for i in 0..4 {
        s.post_recv(&RecvWr { wr_id: i, sg_list: &[sge(&t.mr, 64 * i as usize, 64)] }).unwrap();
    }
    let a2 = node_on(&f.devices()[0], 4096);
    let (i1, t1) = xrc_pair(&a, &t);
    let (i2, t2) = xrc_pair(&a2, &t);
    i1.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)]).to_srq(n)).unwrap();
    i2.post_send(&SendWr::send(2, &[sge(&a2.mr, 0, 8)]).to_srq(n)).unwrap();
    let got: Vec<u32> = wait_n(&t.cq, 2).iter().map(|w| w.qp_num).collect();
    assert_eq!(got, vec![t1.qp_num(), t2.qp_num()]);
}

#[test]
fn an_srq_of_another_domain_or_no_srq_is_a_remote_access_error() {
    let (_f, a, t) = setup();
    let other = t.ctx.open_xrcd(None, 0).unwrap();
    let foreign =
        other.create_srq(&t.pd, &t.cq, &SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    foreign.post_recv(&RecvWr { wr_id: 1, sg_list: &[sge(&t.mr, 0, 64)] }).unwrap();
    let (ini, tgt) = xrc_pair(&a, &t);
    ini.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)]).to_srq(foreign.srq_num().unwrap()))
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    assert_eq!(tgt.state(), QpState::ERR);
    assert_empty(&t.cq);
}

#[test]
fn an_empty_srq_gets_rnr_naks_until_a_receive_is_posted() {
    let (_f, a, t) = setup();
    let s = srq(&t);
    let p = RcParams { rnr_retry: 7, min_rnr_timer: 1, ..RcParams::default() };
    let ini = new_qp(&a.pd, &a.cq, QpType::XRC_SEND, 16, false);
    let tgt = t.xrcd.create_recv_qp().unwrap();
    connect(&ini, &tgt, &p, &p);
    ini.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 8)]).to_srq(s.srq_num().unwrap()).signaled())
        .unwrap();
    assert_empty(&a.cq);
    s.post_recv(&RecvWr { wr_id: 9, sg_list: &[sge(&t.mr, 0, 64)] }).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&t.cq).wr_id, 9);
}

#[test]
fn xrc_qps_refuse_receives_and_target_qps_refuse_sends() {
    let (_f, a, t) = setup();
    let (ini, tgt) = xrc_pair(&a, &t);
    let wr = RecvWr { wr_id: 1, sg_list: &[] };
    assert_eq!(ini.post_recv(&wr).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(tgt.post_recv(&wr).unwrap_err().errno(), Errno::EINVAL);
    let e = tgt.post_send(&SendWr::send(1, &[])).unwrap_err();
    assert_eq!(e.errno(), Errno::EINVAL);
    assert_eq!(ini.cap().max_recv_wr, 0);
}

#[test]
fn domains_are_shared_by_file_and_closed_when_unused() {
    let (_f, _a, t) = setup();
    let file = Some((7, 4242));
    let e = |r: Result<Xrcd>| r.unwrap_err().errno();
    assert_eq!(e(t.ctx.open_xrcd(file, 0)), Errno::EAGAIN, "no domain and no O_CREAT");
    let x1 = t.ctx.open_xrcd(file, xrcd_oflags::CREAT).unwrap();
    let x2 = t.ctx.open_xrcd(file, 0).unwrap();
    assert!(x1.same(&x2));
    assert_eq!(e(t.ctx.open_xrcd(file, xrcd_oflags::CREAT | xrcd_oflags::EXCL)), Errno::EINVAL);
    let s = x1.create_srq(&t.pd, &t.cq, &SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    let qp = x2.create_recv_qp().unwrap();
    // open_qp gives another handle; the QP lives until the last one is destroyed.
    let again = x1.open_qp(qp.qp_num()).unwrap();
    assert_eq!(x1.open_qp(0x00ab_cdef).unwrap_err().errno(), Errno::EINVAL);
    qp.destroy().unwrap();
    assert_eq!(again.state(), QpState::RESET);
    x2.close().unwrap(); // one of two opens
    assert_eq!(x1.close().unwrap_err().errno(), Errno::EBUSY, "the SRQ and the QP use it");
    again.destroy().unwrap();
    s.destroy().unwrap();
    x1.close().unwrap();
    let fresh = t.ctx.open_xrcd(file, xrcd_oflags::CREAT | xrcd_oflags::EXCL).unwrap();
    assert!(!fresh.same(&x1), "the file's domain went with its last close");
}

#[test]
fn rxe_profile_has_no_xrc() {
    let f = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let n = node_on(&f.devices()[0], 64);
    assert_eq!(n.ctx.open_xrcd(None, 0).unwrap_err().errno(), Errno::EOPNOTSUPP);
    let attr = QpInitAttr {
        qp_type: QpType::XRC_SEND,
        send_cq: &n.cq,
        recv_cq: &n.cq,
        cap: cap(4),
        sq_sig_all: false,
        srq: None,
        max_tso_header: 0,
        create_flags: QpCreateFlags::empty(),
    };
    assert_eq!(n.pd.create_qp(&attr).unwrap_err().errno(), Errno::EOPNOTSUPP);
    let s = n.pd.create_srq(&SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    assert_eq!(s.srq_num().unwrap_err().errno(), Errno::EOPNOTSUPP);
}

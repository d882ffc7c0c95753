//! The express path allocates nothing per work request in steady state: a counting global
//! allocator watches WRITEs, WRITEs with immediate, SENDs (receives reposted from a QP's own
//! queue and from an SRQ), READs, atomics, UD datagrams and an XRC initiator's SENDs and
//! WRITEs into its target's XRC SRQ and memory, each posted and polled on one
//! thread after a warm-up. (One test in this binary, so no other test's thread allocates meanwhile.)

mod common;
use common::{ALL_ACCESS as ACCESS, counting::Counting};
use rdma_emu::*;

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Side {
    _ctx: Context,
    cq: Cq,
    mr: Mr,
    qp: Qp,
    srq_qp: Qp,
    srq: Srq,
    ud: Qp,
    /// To the other side's port.
    ah: Option<Ah>,
}

const QKEY: u32 = 0x1234;

/// An XRC initiator on side a connected to a target QP on side b, whose domain's XRC SRQ
/// takes the receives (on b's PD and CQ).
struct Xrc {
    ini: Qp,
    tgt: Qp,
    srq: Srq,
    _xrcd: Xrcd,
}

fn xrc(a: &Side, b: &Side) -> Xrc {
    let xrcd = b._ctx.open_xrcd(None, xrcd_oflags::CREAT).unwrap();
    let srq_attr = SrqAttr { max_wr: 16, max_sge: 2, srq_limit: 0 };
    let srq = xrcd.create_srq(&b.mr.pd(), &b.cq, &srq_attr).unwrap();
    let cap = QpCap { max_send_wr: 16, max_send_sge: 2, max_inline_data: 64, ..QpCap::default() };
    let ini = a.mr.pd().create_qp(&QpInitAttr::new(QpType::XRC_SEND, &a.cq, cap)).unwrap();
    let tgt = xrcd.create_recv_qp().unwrap();
    let p = RcParams::default();
    ini.connect(3, &tgt.endpoint(4), &p).unwrap();
    tgt.connect(4, &ini.endpoint(3), &p).unwrap();
    Xrc { ini, tgt, srq, _xrcd: xrcd }
}

fn side(d: &Device) -> Side {
    let ctx = d.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None, 0).unwrap();
    let mr = pd.reg_mr(4096, ACCESS).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap();
    let srq = pd.create_srq(&SrqAttr { max_wr: 16, max_sge: 2, srq_limit: 0 }).unwrap();
    let mut attr = QpInitAttr::new(QpType::RC, &cq, cap);
    attr.srq = Some(&srq);
    let srq_qp = pd.create_qp(&attr).unwrap();
    let ud = pd.create_qp(&QpInitAttr::new(QpType::UD, &cq, cap)).unwrap();
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: QKEY, ..Default::default() };
    ud.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    ud.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    ud.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE | M::SQ_PSN)
        .unwrap();
    Side { _ctx: ctx, cq, mr, qp, srq_qp, srq, ud, ah: None }
}

fn sge(mr: &Mr, off: usize, len: u32) -> Sge {
    Sge { addr: mr.addr() + off as u64, length: len, lkey: mr.lkey() }
}

fn poll(cq: &Cq, n: usize) {
    let mut got = 0;
    while got < n {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
            got += 1;
        }
    }
}

/// One round of every kind of WR, each completed before the next.
fn round(a: &Side, b: &Side, x: &Xrc) {
    let (src, res) = ([sge(&a.mr, 0, 8)], [sge(&a.mr, 64, 8)]);
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let wrs = [
        SendWr::write(1, &src, raddr, rkey).signaled(),
        SendWr::read(2, &res, raddr + 8, rkey).signaled(),
        SendWr::fetch_add(3, &res, raddr + 16, rkey, 1).signaled(),
        SendWr::cmp_swap(4, &res, raddr + 16, rkey, 0, 1).signaled(),
    ];
    for wr in &wrs {
        a.qp.post_send(wr).unwrap();
        poll(&a.cq, 1);
    }
    let recv = [sge(&b.mr, 1024, 64)];
    // A SEND and a WRITE with immediate into a QP's own receive queue, then into an SRQ.
    for (qp, peer) in [(&a.qp, &b.qp), (&a.srq_qp, &b.srq_qp)] {
        for wr in [
            SendWr::send(5, &src).signaled(),
            SendWr::write(6, &src, raddr, rkey).signaled().with_imm(9),
        ] {
            let r = RecvWr { wr_id: 7, sg_list: &recv };
            if std::ptr::eq(peer, &b.qp) {
                peer.post_recv(&r).unwrap();
            } else {
                b.srq.post_recv(&r).unwrap();
            }
            qp.post_send(&wr).unwrap();
            poll(&a.cq, 1);
            poll(&b.cq, 1);
        }
    }
    // A datagram, into a receive with room for its GRH area.
    let recv = [sge(&b.mr, 2048, 40 + 8)];
    b.ud.post_recv(&RecvWr { wr_id: 8, sg_list: &recv }).unwrap();
    let ah = a.ah.as_ref().unwrap();
    a.ud.post_send(&SendWr::send_ud(9, &src, ah, b.ud.qp_num(), QKEY).signaled()).unwrap();
    poll(&a.cq, 1);
    poll(&b.cq, 1);
    // An XRC SEND into the target's XRC SRQ, and a WRITE through it.
    let srqn = x.srq.srq_num().unwrap();
    let recv = [sge(&b.mr, 3072, 64)];
    x.srq.post_recv(&RecvWr { wr_id: 10, sg_list: &recv }).unwrap();
    x.ini.post_send(&SendWr::send(11, &src).to_srq(srqn).signaled()).unwrap();
    poll(&a.cq, 1);
    poll(&b.cq, 1);
    x.ini.post_send(&SendWr::write(12, &src, raddr + 32, rkey).to_srq(srqn).signaled()).unwrap();
    poll(&a.cq, 1);
}

#[test]
fn steady_state_work_requests_allocate_nothing() {
    let f = Fabric::new(FabricConfig::default());
    let devs = f.devices();
    let (mut a, b) = (side(&devs[0]), side(&devs[1]));
    let to = b.ud.endpoint(0);
    let attr = AhAttr { dgid: to.gid, dlid: to.lid, port_num: 1, ..Default::default() };
    a.ah = Some(a.ud.pd().create_ah(&attr).unwrap());
    let p = RcParams::default();
    for (x, y) in [(&a.qp, &b.qp), (&a.srq_qp, &b.srq_qp)] {
        x.connect(1, &y.endpoint(2), &p).unwrap();
        y.connect(2, &x.endpoint(1), &p).unwrap();
    }
    let x = xrc(&a, &b);
    assert_eq!(x.tgt.qp_type(), QpType::XRC_RECV);
    for _ in 0..100 {
        round(&a, &b, &x);
    }
    // The fewest of three windows: an allocation per WR shows in every one (8,000 or more);
    // a one-off of the machine's doing (seen once in a full suite on a loaded machine: 4) in
    // one window only.
    let window = || {
        let before = Counting::allocs();
        for _ in 0..1000 {
            round(&a, &b, &x);
        }
        Counting::allocs() - before
    };
    let allocs = (0..3).map(|_| window()).min().unwrap();
    assert_eq!(allocs, 0, "{allocs} allocations in 1,000 rounds of 11 WRs");
}

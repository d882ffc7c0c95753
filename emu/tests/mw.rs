//! Memory windows: type 1 bound by `bind_mw`, type 2 bound by BIND_MW requests and invalidated
//! locally or by SEND_WITH_INV; remote access through valid, stale, out-of-range and
//! invalidated windows.

mod common;
use common::*;
use rdma_emu::*;

const BINDABLE: AccessFlags = ALL_ACCESS.union(AccessFlags::MW_BIND);

/// A connected pair whose responder side (`b`) has an MR windows can be bound to.
fn setup(profile: Profile) -> (Fabric, Node, Node, Mr) {
    let (f, a, b) = pair(profile);
    let target = b.pd.reg_mr(4096, BINDABLE).unwrap();
    (f, a, b, target)
}

fn info(mr: &Mr, off: u64, len: u64, access: AccessFlags) -> MwBindInfo<'_> {
    MwBindInfo { mr: Some(mr), addr: mr.addr() + off, length: len, access }
}

/// Writes `data` from `a` to `rkey`/`va`; returns the send completion's status.
fn remote_write(a: &Node, va: u64, rkey: u32, data: &[u8]) -> WcStatus {
    a.mr.write(0, data).unwrap();
    a.qp.post_send(&SendWr::write(7, &[sge(&a.mr, 0, data.len())], va, rkey).signaled()).unwrap();
    wait1(&a.cq).status
}

fn type2_bind<'a>(mw: &'a Mw, mr: &'a Mr, off: u64, len: u64, access: AccessFlags) -> MwBind<'a> {
    let rkey = (mw.rkey() & !0xff) | (mw.rkey().wrapping_add(1) & 0xff);
    MwBind { mw, rkey, info: info(mr, off, len, access), mw_rkey: None }
}

#[test]
fn type1_bind_grants_exactly_the_window() {
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, b, target) = setup(profile);
        let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
        let old = mw.rkey();
        assert_eq!(remote_write(&a, target.addr(), old, b"x"), WcStatus::REM_ACCESS_ERR);
        // The failed write took both QPs to ERR; start over with a fresh pair.
        let (_f, a, b, target) = setup(profile);
        let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
        let old = mw.rkey();
        let rkey =
            b.qp.bind_mw(
                &mw,
                5,
                SendFlags::SIGNALED,
                &info(&target, 256, 512, AccessFlags::REMOTE_WRITE),
            )
            .unwrap();
        assert_eq!((rkey >> 8, rkey & 0xff), (old >> 8, (old + 1) & 0xff), "ibv_inc_rkey");
        assert_eq!(mw.rkey(), rkey);
        let wc = wait1(&b.cq);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (5, WcStatus::SUCCESS, WcOpcode::BIND_MW));
        assert!(mw.is_bound());
        assert_eq!(remote_write(&a, target.addr() + 256, rkey, b"window"), WcStatus::SUCCESS);
        let mut got = [0u8; 6];
        target.read(256, &mut got).unwrap();
        assert_eq!(&got, b"window");
        // One byte past the window (still inside the MR) is a remote access error.
        assert_eq!(
            remote_write(&a, target.addr() + 256 + 511, rkey, b"ab"),
            WcStatus::REM_ACCESS_ERR,
            "{profile:?}"
        );
    }
}

#[test]
fn type1_rebind_retires_the_old_rkey_and_unbind_frees_the_mr() {
    let (_f, a, b, target) = setup(Profile::Full);
    let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    let first =
        b.qp.bind_mw(&mw, 1, SendFlags::empty(), &info(&target, 0, 64, AccessFlags::REMOTE_READ))
            .unwrap();
    assert_eq!(target.dereg().unwrap_err().errno(), Errno::EINVAL, "a window is bound to it");
    let second =
        b.qp.bind_mw(&mw, 2, SendFlags::empty(), &info(&target, 0, 64, AccessFlags::REMOTE_WRITE))
            .unwrap();
    assert_ne!(first, second);
    assert_empty(&b.cq); // unsignaled binds complete silently
    assert_eq!(remote_write(&a, target.addr(), second, b"ok"), WcStatus::SUCCESS);
    // A zero-length bind without an MR unbinds the window.
    let unbind = MwBindInfo { mr: None, addr: 0, length: 0, access: AccessFlags::empty() };
    b.qp.bind_mw(&mw, 3, SendFlags::SIGNALED, &unbind).unwrap();
    assert_eq!(wait1(&b.cq).status, WcStatus::SUCCESS);
    assert!(!mw.is_bound());
    target.dereg().unwrap();
    assert_eq!(remote_write(&a, 0, first, b"x"), WcStatus::REM_ACCESS_ERR, "stale rkey");
}

#[test]
fn bind_mw_refuses_bad_requests_at_post_time() {
    let (_f, _a, b, target) = setup(Profile::Full);
    let t1 = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    let t2 = b.pd.alloc_mw(MwType::TYPE_2).unwrap();
    let ok = info(&target, 0, 8, AccessFlags::REMOTE_READ);
    let flags = SendFlags::SIGNALED;
    let e = |r: Result<u32>| r.unwrap_err().errno();
    assert_eq!(e(b.qp.bind_mw(&t2, 1, flags, &ok)), Errno::EINVAL, "type 2 via bind_mw");
    let zb = MwBindInfo { access: AccessFlags::REMOTE_READ | AccessFlags::ZERO_BASED, ..ok };
    assert_eq!(e(b.qp.bind_mw(&t1, 1, flags, &zb)), Errno::EINVAL, "zero-based type 1");
    let no_mr = MwBindInfo { mr: None, ..ok };
    assert_eq!(e(b.qp.bind_mw(&t1, 1, flags, &no_mr)), Errno::EINVAL, "range without MR");
    let other_pd = b.ctx.alloc_pd().unwrap();
    let foreign = other_pd.reg_mr(64, BINDABLE).unwrap();
    let foreign_info = info(&foreign, 0, 8, AccessFlags::REMOTE_READ);
    assert_eq!(e(b.qp.bind_mw(&t1, 1, flags, &foreign_info)), Errno::EPERM);
    assert_empty(&b.cq);
    assert_eq!(b.qp.state(), QpState::RTS);
}

#[test]
fn bind_to_an_mr_without_mw_bind_access_fails_with_mw_bind_err() {
    let (_f, _a, b, _target) = setup(Profile::Full);
    let plain = b.pd.reg_mr(64, ALL_ACCESS).unwrap();
    let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    let before = mw.rkey();
    b.qp.bind_mw(&mw, 9, SendFlags::empty(), &info(&plain, 0, 8, AccessFlags::REMOTE_READ))
        .unwrap();
    let wc = wait1(&b.cq);
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::MW_BIND_ERR), "errors complete unsignaled");
    assert_eq!(b.qp.state(), QpState::ERR);
    assert!(!mw.is_bound());
    assert_ne!(mw.rkey(), before, "as with rdma-core, the application undoes the rkey");
    plain.dereg().unwrap();
}

#[test]
fn type2_window_belongs_to_the_qp_that_bound_it() {
    let (f, a, b, target) = setup(Profile::Full);
    let mw = b.pd.alloc_mw(MwType::TYPE_2).unwrap();
    let bind =
        type2_bind(&mw, &target, 0, 128, AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
    let rkey = bind.rkey;
    b.qp.post_send(&SendWr::bind_mw(4, bind).signaled()).unwrap();
    let wc = wait1(&b.cq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::SUCCESS, WcOpcode::BIND_MW));
    assert_eq!(mw.rkey(), rkey, "the window takes the posted bind's rkey");
    assert_eq!(remote_write(&a, target.addr() + 8, rkey, b"mine"), WcStatus::SUCCESS);
    // A second QP pair between the same PDs: the window is not bound to b's other QP.
    let a2 = new_qp(&a.pd, &a.cq, QpType::RC, 8, false);
    let b2 = new_qp(&b.pd, &b.cq, QpType::RC, 8, false);
    connect(&a2, &b2, &RcParams::default(), &RcParams::default());
    a.mr.write(0, b"x").unwrap();
    a2.post_send(&SendWr::write(8, &[sge(&a.mr, 0, 1)], target.addr(), rkey).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    // Binding an already bound type 2 window fails.
    let again = type2_bind(&mw, &target, 0, 8, AccessFlags::REMOTE_READ);
    b.qp.post_send(&SendWr::bind_mw(5, again)).unwrap();
    assert_eq!(wait1(&b.cq).status, WcStatus::MW_BIND_ERR);
    drop(f);
}

#[test]
fn type2_local_invalidate_closes_the_window() {
    let (_f, a, b, target) = setup(Profile::Rxe);
    let mw = b.pd.alloc_mw(MwType::TYPE_2).unwrap();
    let bind = type2_bind(&mw, &target, 64, 64, AccessFlags::REMOTE_WRITE);
    let rkey = bind.rkey;
    b.qp.post_send(&SendWr::bind_mw(1, bind)).unwrap();
    assert_eq!(remote_write(&a, target.addr() + 64, rkey, b"in"), WcStatus::SUCCESS);
    b.qp.post_send(&SendWr::local_inv(2, rkey).signaled()).unwrap();
    let wc = wait1(&b.cq);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (2, WcStatus::SUCCESS, WcOpcode::LOCAL_INV));
    assert!(!mw.is_bound());
    target.dereg().unwrap(); // nothing is bound to it any more
    assert_eq!(remote_write(&a, target.addr() + 64, rkey, b"out"), WcStatus::REM_ACCESS_ERR);
}

#[test]
fn local_invalidate_of_an_mr_or_a_type1_window_fails() {
    let (_f, _a, b, target) = setup(Profile::Full);
    let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    b.qp.post_send(&SendWr::local_inv(1, target.rkey())).unwrap();
    assert_eq!(wait1(&b.cq).status, WcStatus::LOC_QP_OP_ERR, "user MRs are not invalidated");
    assert_eq!(b.qp.state(), QpState::ERR);
    let (_f, _a, b, _t) = setup(Profile::Full);
    let _ = mw;
    let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    b.qp.post_send(&SendWr::local_inv(1, mw.rkey())).unwrap();
    assert_eq!(wait1(&b.cq).status, WcStatus::LOC_QP_OP_ERR);
}

#[test]
fn send_with_invalidate_invalidates_the_responders_window() {
    let (_f, a, b, target) = setup(Profile::Full);
    let mw = b.pd.alloc_mw(MwType::TYPE_2).unwrap();
    let bind = type2_bind(&mw, &target, 0, 64, AccessFlags::REMOTE_WRITE);
    let rkey = bind.rkey;
    b.qp.post_send(&SendWr::bind_mw(1, bind)).unwrap();
    post_recv(&b.qp, 30, &[sge(&b.mr, 0, 64)]);
    a.mr.write(0, b"bye").unwrap();
    a.qp.post_send(&SendWr::send_inv(40, &[sge(&a.mr, 0, 3)], rkey).signaled()).unwrap();
    let s = wait1(&a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (40, WcStatus::SUCCESS, WcOpcode::SEND));
    let r = wait1(&b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (30, WcStatus::SUCCESS, WcOpcode::RECV, 3)
    );
    assert!(r.wc_flags.contains(WcFlags::WITH_INV) && !r.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(r.imm_data, rkey, "invalidated_rkey");
    assert!(!mw.is_bound());
    assert_eq!(remote_write(&a, target.addr(), rkey, b"late"), WcStatus::REM_ACCESS_ERR);
}

#[test]
fn send_with_invalidate_of_an_rkey_it_cannot_invalidate_fails_the_receive_without_a_nak() {
    // IBA 9.9.6.3 responder class J, as rxe: the SEND is acknowledged; the receive fails.
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, b, target) = setup(profile);
        post_recv(&b.qp, 30, &[sge(&b.mr, 0, 64)]);
        let s = [sge(&a.mr, 0, 3)];
        a.qp.post_send(&SendWr::send_inv(40, &s, target.rkey()).signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "{profile:?}");
        assert_eq!(wait1(&b.cq).status, WcStatus::REM_INV_REQ_ERR);
        assert_eq!(b.qp.state(), QpState::ERR);
    }
}

#[test]
fn zero_based_type2_window_counts_addresses_from_zero() {
    let (_f, a, b, target) = setup(Profile::Full);
    let mw = b.pd.alloc_mw(MwType::TYPE_2).unwrap();
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::ZERO_BASED;
    let bind = type2_bind(&mw, &target, 1024, 100, access);
    let rkey = bind.rkey;
    b.qp.post_send(&SendWr::bind_mw(1, bind)).unwrap();
    assert_eq!(remote_write(&a, 10, rkey, b"zb"), WcStatus::SUCCESS);
    let mut got = [0u8; 2];
    target.read(1024 + 10, &mut got).unwrap();
    assert_eq!(&got, b"zb");
    assert_eq!(remote_write(&a, 99, rkey, b"zb"), WcStatus::REM_ACCESS_ERR, "past the end");
}

#[test]
fn deallocated_window_grants_nothing_and_ud_qps_cannot_bind() {
    let (_f, a, b, target) = setup(Profile::Full);
    let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    let rkey =
        b.qp.bind_mw(&mw, 1, SendFlags::empty(), &info(&target, 0, 64, AccessFlags::REMOTE_WRITE))
            .unwrap();
    assert_eq!(b.pd.dealloc().unwrap_err().errno(), Errno::EBUSY, "the window uses the PD");
    mw.dealloc().unwrap();
    assert_eq!(mw.dealloc().unwrap_err().errno(), Errno::EINVAL);
    target.dereg().unwrap();
    assert_eq!(remote_write(&a, target.addr(), rkey, b"x"), WcStatus::REM_ACCESS_ERR);
    let ud = new_qp(&b.pd, &b.cq, QpType::UD, 4, false);
    assert_eq!(b.pd.alloc_mw(MwType(3)).unwrap_err().errno(), Errno::EINVAL);
    let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
    let unbind = MwBindInfo { mr: None, addr: 0, length: 0, access: AccessFlags::empty() };
    ud.modify(
        &QpAttr { qp_state: QpState::INIT, qkey: 1, port_num: 1, ..Default::default() },
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    ud.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, QpAttrMask::STATE).unwrap();
    ud.modify(
        &QpAttr { qp_state: QpState::RTS, ..Default::default() },
        QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    )
    .unwrap();
    assert_eq!(ud.bind_mw(&mw, 1, SendFlags::empty(), &unbind).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn on_the_full_profile_only_the_windows_pd_binds_it_and_only_its_qp_invalidates_it() {
    for profile in [Profile::Full, Profile::Rxe] {
        let full = profile == Profile::Full;
        let (_f, _a, b, target) = setup(profile);
        // A type 1 window of b's PD, bound through a QP of another PD.
        let mw = b.pd.alloc_mw(MwType::TYPE_1).unwrap();
        let other_pd = b.ctx.alloc_pd().unwrap();
        let stranger = new_qp(&other_pd, &b.cq, QpType::RC, 4, true);
        let peer = new_qp(&other_pd, &b.cq, QpType::RC, 4, true);
        connect(&stranger, &peer, &RcParams::default(), &RcParams::default());
        let flags = SendFlags::SIGNALED;
        stranger.bind_mw(&mw, 1, flags, &info(&target, 0, 64, AccessFlags::REMOTE_READ)).unwrap();
        let want = if full { WcStatus::MW_BIND_ERR } else { WcStatus::SUCCESS };
        assert_eq!(wait1(&b.cq).status, want, "{profile:?}: type 1 bind from another PD");

        // A type 2 window bound to b.qp, invalidated by another QP of its PD.
        let (_f, _a, b, target) = setup(profile);
        let mw = b.pd.alloc_mw(MwType::TYPE_2).unwrap();
        let bind = type2_bind(&mw, &target, 0, 64, AccessFlags::REMOTE_WRITE);
        let rkey = bind.rkey;
        b.qp.post_send(&SendWr::bind_mw(1, bind).signaled()).unwrap();
        assert_eq!(wait1(&b.cq).status, WcStatus::SUCCESS);
        let other = new_qp(&b.pd, &b.cq, QpType::RC, 4, true);
        let peer = new_qp(&b.pd, &b.cq, QpType::RC, 4, true);
        connect(&other, &peer, &RcParams::default(), &RcParams::default());
        other.post_send(&SendWr::local_inv(2, rkey).signaled()).unwrap();
        let want = if full { WcStatus::LOC_QP_OP_ERR } else { WcStatus::SUCCESS };
        assert_eq!(wait1(&b.cq).status, want, "{profile:?}: LOCAL_INV from another QP");
        assert_eq!(mw.is_bound(), full);
    }
}

#[test]
fn a_write_with_immediate_that_fails_its_rkey_completes_the_receive_as_each_device_does() {
    for (profile, want) in
        [(Profile::Full, WcStatus::LOC_ACCESS_ERR), (Profile::Rxe, WcStatus::REM_ACCESS_ERR)]
    {
        let (_f, a, b, target) = setup(profile);
        post_recv(&b.qp, 9, &[sge(&b.mr, 0, 64)]);
        let s = [sge(&a.mr, 0, 4)];
        let w = SendWr::write(1, &s, target.addr(), target.rkey() ^ 0x80).with_imm(5);
        a.qp.post_send(&w.signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
        let r = wait1(&b.cq);
        assert_eq!((r.wr_id, r.status), (9, want), "{profile:?}");
    }
}

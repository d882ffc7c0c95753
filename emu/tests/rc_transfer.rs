//! RC data transfer: every opcode, its completion fields, and the memory it leaves behind.

mod common;
use common::*;
use rdma_emu::*;

#[test]
fn send_recv_delivers_bytes_and_exact_completions() {
    let (_f, a, b) = pair(Profile::Full);
    a.mr.write(0, b"hello, rdma").unwrap();
    post_recv(&b.qp, 77, &[sge(&b.mr, 100, 64)]);
    a.qp.post_send(&SendWr::send(5, &[sge(&a.mr, 0, 11)]).signaled()).unwrap();
    let s = wait1(&a.cq);
    assert_eq!(
        s,
        Wc {
            wr_id: 5,
            status: WcStatus::SUCCESS,
            opcode: WcOpcode::SEND,
            byte_len: 11,
            qp_num: a.qp.qp_num(),
            ..Default::default()
        }
    );
    let r = wait1(&b.cq);
    assert_eq!(r.wr_id, 77);
    assert_eq!(r.status, WcStatus::SUCCESS);
    assert_eq!(r.opcode, WcOpcode::RECV);
    assert_eq!(r.byte_len, 11);
    assert_eq!(r.qp_num, b.qp.qp_num());
    assert_eq!(r.src_qp, 0, "rxe reports src_qp only for UD");
    assert_eq!(r.wc_flags, WcFlags::empty(), "InfiniBand link layer: no GRH flag on RC");
    assert_eq!(r.slid, 1, "slid is the sender's LID");
    let mut got = [0u8; 11];
    b.mr.read(100, &mut got).unwrap();
    assert_eq!(&got, b"hello, rdma");
}

#[test]
fn send_with_imm_and_roce_grh_flag() {
    let (_f, a, b) = pair(Profile::Rxe);
    post_recv(&b.qp, 1, &[sge(&b.mr, 0, 64)]);
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 8)]).with_imm(0xdead_beef).signaled()).unwrap();
    let s = wait1(&a.cq);
    assert_eq!((s.opcode, s.wc_flags), (WcOpcode::SEND, WcFlags::WITH_IMM));
    let r = wait1(&b.cq);
    assert_eq!(r.opcode, WcOpcode::RECV);
    assert_eq!(r.imm_data, 0xdead_beef);
    assert_eq!(r.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM, "rxe sets GRH on every RoCE receive");
    assert_eq!(r.slid, 0);

    // mlx5 (the full profile) says a GRH came only on UD receives.
    let cfg = FabricConfig { link_layer: LinkLayer::ETHERNET, ..Default::default() };
    let f = Fabric::new(cfg);
    let (a, b) = (node_on(&f.devices()[0], 4096), node_on(&f.devices()[1], 4096));
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    post_recv(&b.qp, 1, &[sge(&b.mr, 0, 64)]);
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 8)]).with_imm(7)).unwrap();
    assert_eq!(wait1(&b.cq).wc_flags, WcFlags::WITH_IMM);
}

#[test]
fn unsignaled_sends_complete_silently_and_sq_sig_all_overrides() {
    let (_f, a, b) = pair(Profile::Full);
    for i in 0..3 {
        post_recv(&b.qp, i, &[sge(&b.mr, 0, 64)]);
    }
    a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 4)])).unwrap();
    assert_empty(&a.cq);
    assert_eq!(wait1(&b.cq).wr_id, 0);

    let cq = a.ctx.create_cq(16, None, 0).unwrap();
    let qp = new_qp(&a.pd, &cq, QpType::RC, 8, true);
    let qp_b = new_qp(&b.pd, &b.cq, QpType::RC, 8, false);
    connect(&qp, &qp_b, &RcParams::default(), &RcParams::default());
    post_recv(&qp_b, 9, &[sge(&b.mr, 0, 64)]);
    qp.post_send(&SendWr::send(3, &[sge(&a.mr, 0, 4)])).unwrap();
    assert_eq!(wait1(&cq).wr_id, 3, "sq_sig_all signals every WR");
}

#[test]
fn rdma_write_and_write_with_imm() {
    let (_f, a, b) = pair(Profile::Full);
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    a.mr.write(0, &data).unwrap();
    a.qp.post_send(
        &SendWr::write(1, &[sge(&a.mr, 0, 5000)], b.mr.addr() + 10, b.mr.rkey()).signaled(),
    )
    .unwrap();
    let w = wait1(&a.cq);
    assert_eq!((w.status, w.opcode, w.byte_len), (WcStatus::SUCCESS, WcOpcode::RDMA_WRITE, 5000));
    assert_empty(&b.cq);
    let mut got = vec![0u8; 5000];
    b.mr.read(10, &mut got).unwrap();
    assert_eq!(got, data);

    post_recv(&b.qp, 42, &[]);
    a.qp.post_send(
        &SendWr::write(2, &[sge(&a.mr, 0, 300)], b.mr.addr(), b.mr.rkey()).with_imm(7).signaled(),
    )
    .unwrap();
    let w = wait1(&a.cq);
    assert_eq!((w.opcode, w.wc_flags), (WcOpcode::RDMA_WRITE, WcFlags::WITH_IMM));
    let r = wait1(&b.cq);
    assert_eq!(r.wr_id, 42);
    assert_eq!(r.opcode, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(r.byte_len, 300, "byte_len of WRITE_WITH_IMM is the written length");
    assert_eq!(r.imm_data, 7);
    assert_eq!(r.wc_flags, WcFlags::WITH_IMM);
}

#[test]
fn rdma_read_gathers_into_several_sges() {
    let (_f, a, b) = pair(Profile::Full);
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    b.mr.write(1000, &data).unwrap();
    let dst = [sge(&a.mr, 0, 1000), sge(&a.mr, 5000, 0), sge(&a.mr, 8000, 2000)];
    a.qp.post_send(&SendWr::read(9, &dst, b.mr.addr() + 1000, b.mr.rkey()).signaled()).unwrap();
    let w = wait1(&a.cq);
    assert_eq!((w.status, w.opcode, w.byte_len), (WcStatus::SUCCESS, WcOpcode::RDMA_READ, 3000));
    let mut first = vec![0u8; 1000];
    let mut second = vec![0u8; 2000];
    a.mr.read(0, &mut first).unwrap();
    a.mr.read(8000, &mut second).unwrap();
    assert_eq!(first, data[..1000]);
    assert_eq!(second, data[1000..]);
}

#[test]
fn atomics_fetch_add_and_compare_swap() {
    let (_f, a, b) = pair(Profile::Full);
    b.mr.write_u64(64, 40).unwrap();
    let res = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::fetch_add(1, &res, b.mr.addr() + 64, b.mr.rkey(), 2).signaled())
        .unwrap();
    let w = wait1(&a.cq);
    assert_eq!((w.status, w.opcode, w.byte_len), (WcStatus::SUCCESS, WcOpcode::FETCH_ADD, 8));
    assert_eq!(a.mr.read_u64(0).unwrap(), 40);
    assert_eq!(b.mr.read_u64(64).unwrap(), 42);

    // A failing compare leaves memory alone and returns the current value.
    a.qp.post_send(&SendWr::cmp_swap(2, &res, b.mr.addr() + 64, b.mr.rkey(), 1, 99).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).opcode, WcOpcode::COMP_SWAP);
    assert_eq!((a.mr.read_u64(0).unwrap(), b.mr.read_u64(64).unwrap()), (42, 42));
    a.qp.post_send(&SendWr::cmp_swap(3, &res, b.mr.addr() + 64, b.mr.rkey(), 42, 99).signaled())
        .unwrap();
    wait1(&a.cq);
    assert_eq!((a.mr.read_u64(0).unwrap(), b.mr.read_u64(64).unwrap()), (42, 99));
}

/// `ibv_post_send` refuses an atomic whose result buffer holds less than 8 bytes, and (rxe)
/// one at a misaligned word; built with the `ibv_wr_*` calls (`post_send_built`), as rxe's
/// builders take it, it goes out and fails as it runs: the responder carries out the atomic and
/// the requester cannot place the original value (`LOC_PROT_ERR`), or the responder refuses the
/// misaligned word (`REM_INV_REQ_ERR`) and memory is left alone.
#[test]
fn an_atomic_built_with_the_wr_calls_is_checked_as_it_runs_not_at_the_post() {
    let (_f, a, b) = pair(Profile::Rxe);
    b.mr.write_u64(64, 40).unwrap();
    let short = [sge(&a.mr, 0, 4)];
    let faa = |res| SendWr::fetch_add(1, res, b.mr.addr() + 64, b.mr.rkey(), 2).signaled();
    assert_eq!(a.qp.post_send(&faa(&short)).unwrap_err().errno(), Errno::EINVAL);
    a.qp.post_send_built(&[faa(&short)]).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::LOC_PROT_ERR);
    assert_eq!(b.mr.read_u64(64).unwrap(), 42, "the responder carried it out");
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);

    let (_f, a, b) = pair(Profile::Rxe);
    b.mr.write_u64(64, 40).unwrap();
    let res = [sge(&a.mr, 0, 8)];
    let faa = SendWr::fetch_add(2, &res, b.mr.addr() + 68, b.mr.rkey(), 2).signaled();
    assert_eq!(a.qp.post_send(&faa).unwrap_err().errno(), Errno::EINVAL);
    a.qp.post_send_built(std::slice::from_ref(&faa)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_INV_REQ_ERR);
    assert_eq!(b.mr.read_u64(64).unwrap(), 40, "a misaligned word is left alone");

    // The rkey is checked before the word's alignment (rxe's responder order).
    let (_f, a, b) = pair(Profile::Rxe);
    let res = [sge(&a.mr, 0, 8)];
    let bad_rkey = SendWr::fetch_add(3, &res, b.mr.addr() + 68, b.mr.rkey() ^ 0x100, 2).signaled();
    a.qp.post_send_built(std::slice::from_ref(&bad_rkey)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
}

#[test]
fn inline_data_needs_no_lkey() {
    let (_f, a, b) = pair(Profile::Full);
    post_recv(&b.qp, 1, &[sge(&b.mr, 0, 64)]);
    let wr = SendWr {
        wr_id: 4,
        opcode: WrOpcode::SEND,
        send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
        inline_data: b"inline!",
        ..Default::default()
    };
    a.qp.post_send(&wr).unwrap();
    assert_eq!(wait1(&a.cq).byte_len, 7);
    assert_eq!(wait1(&b.cq).byte_len, 7);
    let mut got = [0u8; 7];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"inline!");
}

#[test]
fn multi_packet_messages_advance_psns_by_packet_count() {
    let (_f, a, b) = pair(Profile::Full); // path MTU 1024
    let before = a.qp.query().unwrap().sq_psn;
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 4097)], b.mr.addr(), b.mr.rkey())).unwrap();
    assert_eq!(a.qp.query().unwrap().sq_psn, before + 5);
    assert_eq!(b.qp.query().unwrap().rq_psn, before + 5);
    // A READ of 2048 bytes reserves two response PSNs.
    a.qp.post_send(&SendWr::read(2, &[sge(&a.mr, 0, 2048)], b.mr.addr(), b.mr.rkey()).signaled())
        .unwrap();
    wait1(&a.cq);
    assert_eq!(a.qp.query().unwrap().sq_psn, before + 7);
}

#[test]
fn loopback_between_two_qps_of_one_device() {
    let fabric =
        Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let dev = &fabric.devices()[0];
    let a = node_on(dev, 4096);
    let b = node_on(dev, 4096);
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    a.mr.write(0, b"loop").unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 4)], b.mr.addr(), b.mr.rkey()).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut got = [0u8; 4];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"loop");
}

#[test]
fn fence_waits_for_outstanding_reads_and_order_is_kept() {
    let (_f, a, b) = pair(Profile::Full);
    b.mr.write_u64(0, 1).unwrap();
    let wrs =
        [SendWr::read(1, &[], 0, 0), SendWr::fetch_add(2, &[], 0, 0, 0), SendWr::send(3, &[])];
    let r = [sge(&a.mr, 0, 8)];
    let f = [sge(&a.mr, 8, 8)];
    let mut wrs = wrs;
    wrs[0] = SendWr::read(1, &r, b.mr.addr(), b.mr.rkey()).signaled();
    wrs[1] = SendWr::fetch_add(2, &f, b.mr.addr(), b.mr.rkey(), 5).signaled();
    wrs[2] = SendWr::write(3, &r, b.mr.addr() + 64, b.mr.rkey()).signaled();
    wrs[2].send_flags |= SendFlags::FENCE;
    a.qp.post_send_list(&wrs).unwrap();
    let wcs = wait_n(&a.cq, 3);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(a.mr.read_u64(0).unwrap(), 1, "READ saw memory before the atomic");
    assert_eq!(a.mr.read_u64(8).unwrap(), 1);
    assert_eq!(b.mr.read_u64(64).unwrap(), 1, "fenced WRITE used the READ's result");
}

#[test]
fn max_rd_atomic_limits_reads_in_flight_but_all_complete() {
    let params = RcParams { max_rd_atomic: 1, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &params, &params);
    let dst: Vec<[Sge; 1]> = (0..8).map(|i| [sge(&a.mr, i * 8, 8)]).collect();
    let wrs: Vec<SendWr<'_>> = dst
        .iter()
        .enumerate()
        .map(|(i, d)| SendWr::read(i as u64, d, b.mr.addr(), b.mr.rkey()).signaled())
        .collect();
    a.qp.post_send_list(&wrs).unwrap();
    let wcs = wait_n(&a.cq, 8);
    assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS));
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
}

#[test]
fn max_rd_atomic_zero_never_issues_reads() {
    // rxe: with max_rd_atomic 0 the requester never sends a READ; nothing completes.
    let params = RcParams { max_rd_atomic: 0, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &params, &params);
    a.qp.post_send(&SendWr::read(1, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey()).signaled())
        .unwrap();
    assert_empty(&a.cq);
    assert_eq!(a.qp.query().unwrap().sq_psn, 0x10, "no PSN was consumed");
}

#[test]
fn zero_length_send_and_write() {
    let (_f, a, b) = pair(Profile::Full);
    post_recv(&b.qp, 1, &[]);
    a.qp.post_send(&SendWr::send(1, &[]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).byte_len, 0);
    assert_eq!((wait1(&b.cq).byte_len, b.cq.poll_one()), (0, None));
    // Zero-length WRITE: the rkey is not checked (IBA 9.7.4.1.4).
    a.qp.post_send(&SendWr::write(2, &[], 0, 0xdead).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
}

#[test]
fn atomic_write_lands_eight_bytes_as_one_on_rc() {
    let (_f, a, b) = pair(Profile::Full);
    a.mr.write_u64(0, 0x1122_3344_5566_7788).unwrap();
    let s = [sge(&a.mr, 0, 8)];
    let aw = SendWr::atomic_write(1, &s, b.mr.addr() + 16, b.mr.rkey());
    a.qp.post_send(&aw.signaled()).unwrap();
    let c = wait1(&a.cq);
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::SUCCESS, WcOpcode::ATOMIC_WRITE, 8));
    assert_eq!(b.mr.read_u64(16).unwrap(), 0x1122_3344_5566_7788);
    // The post's rule: exactly 8 bytes.
    let short = [sge(&a.mr, 0, 4)];
    let e = |wr: SendWr<'_>| a.qp.post_send(&wr).unwrap_err().errno();
    assert_eq!(e(SendWr::atomic_write(2, &short, b.mr.addr(), b.mr.rkey())), Errno::EINVAL);
    // A target without remote write access refuses it.
    let ro = b.pd.reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    let denied = SendWr::atomic_write(4, &s, ro.addr(), ro.rkey());
    a.qp.post_send(&denied.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
    // A misaligned address is taken by the post, as mlx5 does, and refused by the responder.
    let (_f, a, b) = pair(Profile::Full);
    let s = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::atomic_write(3, &s, b.mr.addr() + 4, b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_INV_REQ_ERR);
}

#[test]
fn atomic_write_on_the_rxe_profile_fails_at_execution_as_rxe() {
    // Linux 6.1's rxe: the post takes it, the kernel does not know it.
    let (_f, a, b) = pair(Profile::Rxe);
    let s = [sge(&a.mr, 0, 8)];
    let aw = SendWr::atomic_write(1, &s, b.mr.addr(), b.mr.rkey());
    a.qp.post_send(&aw.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::LOC_QP_OP_ERR);
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
}

/// RDMA FLUSH (full profile): acknowledged once the range (or the whole MR) is made visible or
/// persistent; the QP's and the memory's FLUSH rights are checked; the rxe profile has none.
#[test]
fn flush_completes_and_checks_the_rights_it_needs() {
    let flush_rights = AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
    let p = RcParams { access: RcParams::default().access | flush_rights, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &p, &p);
    let mr = b.pd.reg_mr(4096, ALL_ACCESS | flush_rights).unwrap();
    let global_only = b.pd.reg_mr(4096, ALL_ACCESS | AccessFlags::FLUSH_GLOBAL).unwrap();
    let flush = |id, mr: &Mr, off: u64, len, ty, level| {
        a.qp.post_send(&SendWr::flush(id, mr.addr() + off, mr.rkey(), len, ty, level).signaled())
            .unwrap();
        wait1(&a.cq)
    };
    // A WRITE, then a FLUSH of its range: both done, the FLUSH completing as FLUSH.
    a.mr.write_u64(0, 42).unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], mr.addr(), mr.rkey())).unwrap();
    let wc = flush(2, &mr, 0, 8, FlushType::GLOBAL | FlushType::PERSISTENT, FlushLevel::RANGE);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (2, WcStatus::SUCCESS, WcOpcode::FLUSH));
    assert_eq!(mr.read_u64(0).unwrap(), 42);
    // The whole MR (its length ignored), and an empty range of memory the rkey grants.
    let wc = flush(3, &global_only, 0, 0, FlushType::GLOBAL, FlushLevel::MR);
    assert_eq!(wc.status, WcStatus::SUCCESS);
    let wc = flush(4, &mr, 4096, 0, FlushType::PERSISTENT, FlushLevel::RANGE);
    assert_eq!(wc.status, WcStatus::SUCCESS, "at the MR's end");
    // Memory without the persistent right: a remote access error.
    let wc = flush(5, &global_only, 0, 8, FlushType::PERSISTENT, FlushLevel::RANGE);
    assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR);
    // A range past the MR: the same.
    let (_f, a2, b2) = pair_with(Profile::Full, &p, &p);
    let mr2 = b2.pd.reg_mr(64, ALL_ACCESS | flush_rights).unwrap();
    let far =
        SendWr::flush(6, mr2.addr() + 32, mr2.rkey(), 64, FlushType::GLOBAL, FlushLevel::RANGE);
    a2.qp.post_send(&far.signaled()).unwrap();
    assert_eq!(wait1(&a2.cq).status, WcStatus::REM_ACCESS_ERR);
    // A responder QP without the FLUSH rights refuses the request (an invalid request).
    let (_f, a3, b3) = pair(Profile::Full);
    let mr3 = b3.pd.reg_mr(64, ALL_ACCESS | flush_rights).unwrap();
    let req = SendWr::flush(7, mr3.addr(), mr3.rkey(), 8, FlushType::GLOBAL, FlushLevel::RANGE);
    a3.qp.post_send(&req.signaled()).unwrap();
    assert_eq!(wait1(&a3.cq).status, WcStatus::REM_INV_REQ_ERR);
    // Bad arguments at the post.
    let none = SendWr::flush(8, 0, 0, 8, FlushType::empty(), FlushLevel::RANGE);
    assert_eq!(a3.qp.post_send(&none).unwrap_err().errno(), Errno::EINVAL);
    let level = SendWr::flush(8, 0, 0, 8, FlushType::GLOBAL, FlushLevel(2));
    assert_eq!(a3.qp.post_send(&level).unwrap_err().errno(), Errno::EINVAL);
    // The rxe profile (Linux 6.1): no FLUSH, and the FLUSH rights are unknown access bits.
    let (_f, r, rb) = pair(Profile::Rxe);
    let req = SendWr::flush(9, 0, 0, 8, FlushType::GLOBAL, FlushLevel::RANGE);
    assert_eq!(r.qp.post_send(&req).unwrap_err().errno(), Errno::EOPNOTSUPP);
    let refused = rb.pd.reg_mr(64, ALL_ACCESS | AccessFlags::FLUSH_GLOBAL).unwrap_err();
    assert_eq!(refused.errno(), Errno::EINVAL);
}

/// A persistent FLUSH writes the range back to the file an MR maps (a memfd here).
#[test]
fn persistent_flush_over_a_file_backed_mr() {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    // SAFETY: a NUL-terminated name; a non-negative result is a descriptor we own.
    let fd = unsafe { libc::memfd_create(c"emu-flush".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    std::fs::File::from(fd.try_clone().unwrap()).set_len(4096).unwrap();
    let rights = AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
    let p = RcParams { access: RcParams::default().access | rights, ..Default::default() };
    let (_f, a, b) = pair_with(Profile::Full, &p, &p);
    let mr = b.pd.reg_dmabuf_mr(fd.as_fd(), 0, 4096, 0x40_0000, ALL_ACCESS | rights).unwrap();
    a.mr.write_u64(0, 7).unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], 0x40_0000 + 64, mr.rkey())).unwrap();
    let f = SendWr::flush(2, 0x40_0000, mr.rkey(), 0, FlushType::PERSISTENT, FlushLevel::MR);
    a.qp.post_send(&f.signaled()).unwrap();
    let wc = wait1(&a.cq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::SUCCESS, WcOpcode::FLUSH));
    let mut word = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::from(fd), &mut word, 64).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 7);
}

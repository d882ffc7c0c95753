//! The engine's cost per work request, in instructions: runs `N` (default 100,000) 8-byte RDMA
//! WRITEs, each posted and polled one at a time on one thread, inside `measured_loop`, so that
//!
//!     valgrind --tool=callgrind --toggle-collect='*measured_loop*' \
//!         target/release/wr_cost 100000
//!
//! counts the instructions of exactly those work requests (divide by `N`). `--op fetch_add`
//! measures an 8-byte FETCH_ADD instead, `--op read` an 8-byte READ; `--op send` one hop of a ping-pong: a receive posted,
//! an unsignaled 8-byte SEND into it, the receive completion polled; `--op write_imm` the same
//! with an 8-byte WRITE with immediate; `--op ud_send` the SEND's hop between two UD QPs (the
//! datagram's receive buffer 40 bytes longer, for its GRH area). `--host` puts the two QPs
//! on two fabrics joined by a host fabric (as two processes are, through shared-memory rings):
//! each WR is then polled to its completion on the requester's CQ (which the ACK from the
//! other fabric brings) and a SEND's receive completion on the responder's too; the fabrics'
//! own threads then vary the number of empty polls, so `./ci.sh bench` counts only the work
//! functions (`--toggle-collect` on the posts and on `host::receive::receive_marked`, each
//! receive that found something, whole) over all `1,000 + N` rounds, warm-up included.
//! `--pairs P` posts the WRITEs round-robin over P connected pairs sharing the two CQs (SC's
//! shape on one thread) and prints the time per WR; callgrind with `--cache-sim=yes
//! --toggle-collect='*measured_loop_pairs*'` counts the cache lines a WR to a QP gone cold
//! misses on (docs/benchmarks.md, session 81). Never used as a test.

use std::hint::black_box;

use rdma_emu::*;

/// The rounds callgrind counts.
#[inline(never)]
fn measured_loop(qp: &Qp, cq: &Cq, wr: &SendWr<'_>, recv: Option<(&Qp, &RecvWr<'_>)>, n: usize) {
    rounds(qp, cq, wr, recv, n)
}

/// [`measured_loop`] over several QPs in turn (`--pairs`).
#[inline(never)]
fn measured_loop_pairs(qps: &[Qp], cq: &Cq, wr: &SendWr<'_>, n: usize) {
    for k in 0..n {
        qps[k % qps.len()].post_send(wr).unwrap();
        poll1(cq);
    }
}

/// Per round: `recv` posted on `rq` (if any), `wr` posted on `qp`, one completion polled.
#[inline(always)]
fn rounds(qp: &Qp, cq: &Cq, wr: &SendWr<'_>, recv: Option<(&Qp, &RecvWr<'_>)>, n: usize) {
    for _ in 0..n {
        if let Some((rq, r)) = recv {
            rq.post_recv(r).unwrap();
        }
        qp.post_send(wr).unwrap();
        poll1(cq);
    }
}

fn poll1(cq: &Cq) {
    loop {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::SUCCESS);
            // By reference: the completion laid out once (by value it was copied twice).
            black_box(&wc);
            break;
        }
    }
}

/// Rounds across a host fabric: `wr` (signaled) posted on `qp` and its completion polled on
/// `cq`, the responder's CQ `rcq` polled meanwhile (an empty poll is what moves the responder's
/// fabric when its own threads are asleep, as an application's does), a receive completion
/// there awaited if `recv` is posted.
fn host_rounds(
    qp: &Qp,
    cq: &Cq,
    wr: &SendWr<'_>,
    rcq: &Cq,
    recv: Option<(&Qp, &RecvWr<'_>)>,
    n: usize,
) {
    for _ in 0..n {
        if let Some((rq, r)) = recv {
            rq.post_recv(r).unwrap();
        }
        qp.post_send(wr).unwrap();
        let (mut sent, mut received) = (false, recv.is_none());
        while !(sent && received) {
            if let Some(wc) = rcq.poll_one() {
                assert_eq!(wc.status, WcStatus::SUCCESS);
                received = true;
            }
            if let Some(wc) = cq.poll_one() {
                assert_eq!(wc.status, WcStatus::SUCCESS);
                sent = true;
            }
        }
    }
}

const UD_QKEY: u32 = 0x5eed;

/// A UD QP taken to RTS with [`UD_QKEY`].
fn ud_ready(qp: &Qp) {
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: UD_QKEY, ..Default::default() };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE | M::SQ_PSN)
        .unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let op = args.iter().position(|a| a == "--op").and_then(|i| args.get(i + 1)).cloned();
    let host = args.iter().any(|a| a == "--host");
    let pairs: usize = args
        .iter()
        .position(|a| a == "--pairs")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(1);
    let dir = std::env::temp_dir().join(format!("rdma-emu-wr-cost-{}", std::process::id()));
    let cfg = || FabricConfig {
        host: host.then(|| dir.to_str().unwrap().to_owned()),
        ..FabricConfig::default()
    };
    let f = Fabric::new(cfg());
    // Across the host fabric, the responder's own fabric (as another process's).
    let g = host.then(|| Fabric::new(cfg()));
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let devs = f.devices();
    let peer_dev = match &g {
        Some(g) => g.devices()[0].clone(),
        None => devs[1].clone(),
    };
    let ud = op.as_deref() == Some("ud_send");
    let qp_type = if ud { QpType::UD } else { QpType::RC };
    let side = |d: &Device| {
        let ctx = d.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4096, None, 0).unwrap();
        let mr = pd.reg_mr(4096, access).unwrap();
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..Default::default()
        };
        let qp = pd.create_qp(&QpInitAttr::new(qp_type, &cq, cap)).unwrap();
        (ctx, pd, cq, mr, qp)
    };
    let (a, b) = (side(&devs[0]), side(&peer_dev));
    if ud {
        for q in [&a.4, &b.4] {
            ud_ready(q);
        }
    } else {
        let p = RcParams::default();
        a.4.connect(1, &b.4.endpoint(2), &p).unwrap();
        b.4.connect(2, &a.4.endpoint(1), &p).unwrap();
    }
    let src = [Sge { addr: a.3.addr(), length: 8, lkey: a.3.lkey() }];
    let res = [Sge { addr: a.3.addr() + 64, length: 8, lkey: a.3.lkey() }];
    let dst = [Sge { addr: b.3.addr() + 256, length: 8, lkey: b.3.lkey() }];
    let recv = RecvWr { wr_id: 7, sg_list: &dst };
    let dst_ud = [Sge { addr: b.3.addr() + 256, length: 40 + 8, lkey: b.3.lkey() }];
    let recv_ud = RecvWr { wr_id: 7, sg_list: &dst_ud };
    let ah = b.4.endpoint(0);
    let ah = ud.then(|| {
        let attr = AhAttr { dgid: ah.gid, dlid: ah.lid, port_num: 1, ..Default::default() };
        a.1.create_ah(&attr).unwrap()
    });
    let (wr, recv, cq) = match op.as_deref() {
        Some("fetch_add") => {
            let wr = SendWr::fetch_add(0, &res, b.3.addr() + 128, b.3.rkey(), 1);
            (wr.signaled(), None, &a.2)
        }
        Some("read") => {
            let wr = SendWr::read(0, &res, b.3.addr() + 128, b.3.rkey());
            (wr.signaled(), None, &a.2)
        }
        Some("send") => (SendWr::send(0, &src), Some((&b.4, &recv)), &b.2),
        Some("ud_send") => {
            let wr = SendWr::send_ud(0, &src, ah.as_ref().unwrap(), b.4.qp_num(), UD_QKEY);
            (wr, Some((&b.4, &recv_ud)), &b.2)
        }
        Some("write_imm") => {
            let wr = SendWr::write(0, &src, b.3.addr(), b.3.rkey()).with_imm(5);
            (wr, Some((&b.4, &recv)), &b.2)
        }
        _ => (SendWr::write(0, &src, b.3.addr(), b.3.rkey()).signaled(), None, &a.2),
    };
    // Warm up (first-use allocations of queues and tables are not per-WR costs).
    if host {
        let wr = wr.signaled();
        host_rounds(&a.4, &a.2, &wr, &b.2, recv, 1000 + n);
        drop((a, b, f, g));
        let _ = std::fs::remove_dir_all(&dir);
    } else if pairs > 1 && op.is_none() {
        // The first pair is `a.4`/`b.4`; the others on the same PDs, CQs and MRs.
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..Default::default()
        };
        let p = RcParams::default();
        let (mut qps, mut peers) = (vec![a.4.clone()], Vec::new());
        for _ in 1..pairs {
            let x = a.1.create_qp(&QpInitAttr::new(QpType::RC, &a.2, cap)).unwrap();
            let y = b.1.create_qp(&QpInitAttr::new(QpType::RC, &b.2, cap)).unwrap();
            x.connect(1, &y.endpoint(2), &p).unwrap();
            y.connect(2, &x.endpoint(1), &p).unwrap();
            qps.push(x);
            peers.push(y);
        }
        measured_loop_pairs(&qps, cq, &wr, 2 * pairs);
        let t0 = std::time::Instant::now();
        measured_loop_pairs(&qps, cq, &wr, n);
        println!(
            "{:.1} ns per WRITE + poll over {pairs} pairs",
            t0.elapsed().as_nanos() as f64 / n as f64
        );
    } else {
        rounds(&a.4, cq, &wr, recv, 1000);
        measured_loop(&a.4, cq, &wr, recv, n);
    }
}

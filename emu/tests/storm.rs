//! A thread storm: threads posting and polling on QPs that share their CQs and an SRQ while
//! other threads create and destroy QPs, CQs, MRs and memory windows beside them. Every
//! message must complete exactly once on each side, in order per QP as each poller sees it,
//! with its bytes intact; nothing may deadlock; the file descriptors come back to where they
//! started. (One test in this binary: it counts the process's descriptors.)

use std::{
    collections::HashMap,
    sync::{
        Barrier, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

mod common;
use rdma_emu::*;

const ACCESS: AccessFlags =
    AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE).union(AccessFlags::REMOTE_READ);
const SENDERS: usize = 3;
const WINDOW: u64 = 24;
const SLOT: usize = 16;
const RECVS: u64 = 128;
/// Far beyond what the storm takes: only a deadlock reaches it.
const LIMIT: Duration = Duration::from_secs(120);

/// Messages per sender: 5,000, or `RDMA_EMU_STORM_MESSAGES` for a longer storm
/// (`RDMA_EMU_STORM_MESSAGES=1000000 cargo test --release -p rdma-emu --test storm`).
fn messages() -> u64 {
    std::env::var("RDMA_EMU_STORM_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A poller's view: per QP number, the sequence numbers it took, in the order it took them.
type Seen = HashMap<u32, Vec<u64>>;

fn check_in_order(who: &str, seen: &Seen) {
    for (qpn, seqs) in seen {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{who}: QP {qpn} out of order: {seqs:?}");
    }
}

fn storm(profile: Profile) {
    let f = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
    let devs = f.devices();
    let (ca, cb) = (devs[0].open().unwrap(), devs[1].open().unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let send_cq = ca.create_cq(4096, None, 0).unwrap();
    let recv_cq = cb.create_cq(4096, None, 0).unwrap();
    let srq = pb.create_srq(&SrqAttr { max_wr: RECVS as u32, max_sge: 1, srq_limit: 0 }).unwrap();
    let src = pa.reg_mr(SENDERS * WINDOW as usize * SLOT, ACCESS).unwrap();
    let dst = pb.reg_mr(RECVS as usize * SLOT, ACCESS).unwrap();
    let cap = common::cap(64);
    let params = RcParams { rnr_retry: 7, min_rnr_timer: 1, ..Default::default() };
    let mut pairs = Vec::new();
    for i in 0..SENDERS {
        let a = pa.create_qp(&QpInitAttr::new(QpType::RC, &send_cq, cap)).unwrap();
        let attr = QpInitAttr { srq: Some(&srq), ..QpInitAttr::new(QpType::RC, &recv_cq, cap) };
        let b = pb.create_qp(&attr).unwrap();
        a.connect(i as u32 * 2 + 1, &b.endpoint(i as u32 * 2 + 2), &params).unwrap();
        b.connect(i as u32 * 2 + 2, &a.endpoint(i as u32 * 2 + 1), &params).unwrap();
        pairs.push((a, b));
    }
    let recv = |slot: u64| {
        let sge =
            [Sge { addr: dst.addr() + slot * SLOT as u64, length: SLOT as u32, lkey: dst.lkey() }];
        srq.post_recv(&RecvWr { wr_id: slot, sg_list: &sge }).unwrap();
    };
    for slot in 0..RECVS {
        recv(slot);
    }
    let t0 = Instant::now();
    let stop = AtomicBool::new(false);
    let completed: Vec<AtomicU64> = (0..SENDERS).map(|_| AtomicU64::new(0)).collect();
    let received = AtomicU64::new(0);
    let sent_seen = Mutex::new(Vec::<(u32, u64)>::new());
    let recv_seen = Mutex::new(Vec::<(u32, u64)>::new());
    let go = Barrier::new(SENDERS + 4);
    let qpn_index: HashMap<u32, usize> =
        pairs.iter().enumerate().map(|(i, (a, _))| (a.qp_num(), i)).collect();
    std::thread::scope(|s| {
        // Senders: each its own QP, all sharing the send CQ, each polling it for everyone.
        for (i, (qp, _)) in pairs.iter().enumerate() {
            let (go, completed, sent_seen, src, send_cq, qpn_index) =
                (&go, &completed, &sent_seen, &src, &send_cq, &qpn_index);
            s.spawn(move || {
                let mut seen = Seen::new();
                let take = |seen: &mut Seen| {
                    while let Some(wc) = send_cq.poll_one() {
                        assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
                        seen.entry(wc.qp_num).or_default().push(wc.wr_id);
                        completed[qpn_index[&wc.qp_num]].fetch_add(1, Ordering::AcqRel);
                    }
                };
                go.wait();
                for seq in 0..messages() {
                    while seq - completed[i].load(Ordering::Acquire) >= WINDOW {
                        assert!(t0.elapsed() < LIMIT, "sender {i} stalled at {seq}");
                        take(&mut seen);
                    }
                    let off = (i * WINDOW as usize + (seq % WINDOW) as usize) * SLOT;
                    let mut msg = [0u8; SLOT];
                    msg[..4].copy_from_slice(&(i as u32).to_le_bytes());
                    msg[4..12].copy_from_slice(&seq.to_le_bytes());
                    src.write(off, &msg).unwrap();
                    let sge = [Sge {
                        addr: src.addr() + off as u64,
                        length: SLOT as u32,
                        lkey: src.lkey(),
                    }];
                    qp.post_send(&SendWr::send(seq, &sge).signaled()).unwrap();
                }
                while completed[i].load(Ordering::Acquire) < messages() {
                    assert!(t0.elapsed() < LIMIT, "sender {i} never saw its last completions");
                    take(&mut seen);
                }
                let mut all = sent_seen.lock().unwrap();
                all.extend(seen.iter().flat_map(|(q, v)| v.iter().map(|s| (*q, *s))));
                check_in_order("send CQ", &seen);
            });
        }
        // Two receivers share the receive CQ and repost to the SRQ.
        for r in 0..2 {
            let (go, stop, received, recv_seen, recv_cq, dst, recv) =
                (&go, &stop, &received, &recv_seen, &recv_cq, &dst, &recv);
            s.spawn(move || {
                let mut seen = Seen::new();
                go.wait();
                while !stop.load(Ordering::Acquire) {
                    assert!(t0.elapsed() < LIMIT, "receiver {r} stalled");
                    let Some(wc) = recv_cq.poll_one() else { continue };
                    assert_eq!((wc.status, wc.byte_len), (WcStatus::SUCCESS, SLOT as u32));
                    let mut msg = [0u8; SLOT];
                    dst.read(wc.wr_id as usize * SLOT, &mut msg).unwrap();
                    let sender = u32::from_le_bytes(msg[..4].try_into().unwrap());
                    let seq = u64::from_le_bytes(msg[4..12].try_into().unwrap());
                    seen.entry(wc.qp_num).or_default().push(seq);
                    recv_seen.lock().unwrap().push((sender, seq));
                    recv(wc.wr_id);
                    received.fetch_add(1, Ordering::AcqRel);
                }
                check_in_order("receive CQ", &seen);
            });
        }
        // Churn beside them: QPs, CQs, MRs and windows made and destroyed on the same PDs.
        {
            let (go, stop, ca, pa, pb) = (&go, &stop, &ca, &pa, &pb);
            s.spawn(move || {
                go.wait();
                let mut rounds = 0u64;
                while !stop.load(Ordering::Acquire) || rounds < 50 {
                    let cq = ca.create_cq(16, None, 0).unwrap();
                    let qp = pa.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap();
                    let mr = pa.reg_mr(4096, ACCESS).unwrap();
                    let mw = pb.alloc_mw(MwType::TYPE_2).unwrap();
                    let qp2 = pb.create_qp(&QpInitAttr::new(QpType::UC, &recv_cq_dummy(pb), cap));
                    drop(qp2);
                    mw.dealloc().unwrap();
                    mr.dereg().unwrap();
                    qp.destroy().unwrap();
                    cq.destroy().unwrap();
                    rounds += 1;
                }
            });
        }
        go.wait();
        while received.load(Ordering::Acquire) < SENDERS as u64 * messages() {
            assert!(
                t0.elapsed() < LIMIT,
                "receives stalled at {}",
                received.load(Ordering::Acquire)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Release);
    });
    // Exactly once, each side.
    for (what, seen) in
        [("sent", sent_seen.into_inner().unwrap()), ("received", recv_seen.into_inner().unwrap())]
    {
        let mut seen = seen;
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            (n, seen.len()),
            (SENDERS * messages() as usize, SENDERS * messages() as usize),
            "{what}"
        );
    }
}

/// A CQ made and dropped with the QP that uses it.
fn recv_cq_dummy(pd: &Pd) -> Cq {
    pd.context().create_cq(4, None, 0).unwrap()
}

#[test]
fn a_thread_storm_completes_everything_once_in_order_and_leaves_no_descriptor() {
    let before = fds();
    for profile in [Profile::Rxe, Profile::Full] {
        storm(profile);
    }
    assert_eq!(fds(), before, "file descriptors left behind");
}

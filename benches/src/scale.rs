//! Scale: the message rate with many connected QP pairs (SC), and what creating many QPs and
//! MRs costs (objects).

use std::{
    sync::{Arc, Barrier},
    time::Instant,
};

use rdma_emu::*;

use crate::{Opts, Row, pin};

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

/// `n` connected RC pairs between two devices; all of side A's QPs complete to one CQ, all of
/// side B's to another.
struct Pairs {
    _f: Fabric,
    _ctx: [Context; 2],
    cq: Cq,
    _peer_cq: Cq,
    mr: [Mr; 2],
    qps: Vec<Qp>,
    _peers: Vec<Qp>,
}

fn pairs(n: usize) -> Pairs {
    let f = Fabric::new(FabricConfig::default());
    let devs = f.devices();
    let ctx = [devs[0].open().unwrap(), devs[1].open().unwrap()];
    let pd = [ctx[0].alloc_pd().unwrap(), ctx[1].alloc_pd().unwrap()];
    let cq = [ctx[0].create_cq(4096, None, 0).unwrap(), ctx[1].create_cq(4096, None, 0).unwrap()];
    let mr = [pd[0].reg_mr(4096, ACCESS).unwrap(), pd[1].reg_mr(4096, ACCESS).unwrap()];
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let p = RcParams::default();
    let (mut qps, mut peers) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let a = pd[0].create_qp(&QpInitAttr::new(QpType::RC, &cq[0], cap)).unwrap();
        let b = pd[1].create_qp(&QpInitAttr::new(QpType::RC, &cq[1], cap)).unwrap();
        a.connect(1, &b.endpoint(2), &p).unwrap();
        b.connect(2, &a.endpoint(1), &p).unwrap();
        qps.push(a);
        peers.push(b);
    }
    let [c0, c1] = cq;
    Pairs { _f: f, _ctx: ctx, cq: c0, _peer_cq: c1, mr, qps, _peers: peers }
}

/// 8-byte WRITEs in Mops/s: two threads, each posting round-robin over its half of the QPs
/// (a single pair: both on it), each polling one completion of the shared CQ per post.
fn rate(p: &Arc<Pairs>, iters: usize) -> f64 {
    let start = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (p, start) = (p.clone(), start.clone());
            std::thread::spawn(move || {
                pin(t);
                let src = [Sge { addr: p.mr[0].addr(), length: 8, lkey: p.mr[0].lkey() }];
                let wr = SendWr::write(0, &src, p.mr[1].addr() + 64 * t as u64, p.mr[1].rkey())
                    .signaled();
                let mine: Vec<&Qp> = if p.qps.len() == 1 {
                    vec![&p.qps[0]]
                } else {
                    p.qps.iter().skip(t).step_by(2).collect()
                };
                start.wait();
                for k in 0..iters {
                    // A WR that meets its QP busy in the other thread queues behind it: keep
                    // to the queue depth by polling before posting.
                    mine[k % mine.len()].post_send(&wr).unwrap();
                    while p.cq.poll_one().is_none() {
                        std::hint::spin_loop();
                    }
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for t in threads {
        t.join().unwrap();
    }
    (2 * iters) as f64 / t0.elapsed().as_secs_f64() / 1e6
}

/// SC: the message rate with 16, 256 and 4,096 QP pairs against one pair.
pub(crate) fn sc(o: &Opts) -> Vec<Row> {
    let iters = if o.quick { 100_000 } else { 400_000 };
    let one = Arc::new(pairs(1));
    let mut rows = Vec::new();
    for n in [16usize, 256, 4096] {
        let many = Arc::new(pairs(n));
        let mut row = Row {
            goal: "SC",
            what: format!("8 B WRITE rate, {n} QP pairs, 2 threads sharing CQs (baseline: 1 pair)"),
            unit: "Mops/s",
            higher_better: true,
            target: ">= 0.5x",
            emu: vec![],
            base: vec![],
        };
        for _ in 0..o.samples {
            row.base.push(rate(&one, iters));
            row.emu.push(rate(&many, iters));
        }
        rows.push(row);
    }
    pin(0);
    rows
}

/// Resident memory of this process in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Prints a row of the objects table: `n` objects created since `start` (resident memory, time).
fn report(what: &str, n: usize, start: (u64, Instant)) {
    let (dt, dm) = (start.1.elapsed(), rss().saturating_sub(start.0));
    let (us, kib) = (dt.as_secs_f64() * 1e6 / n as f64, dm as f64 / 1024.0 / n as f64);
    println!("| {what} | {n} | {us:.2} us | {kib:.2} KiB |");
}

/// Creating 10,000 QPs and 100,000 MRs: time and resident memory per object.
pub(crate) fn objects() {
    let f = Fabric::new(FabricConfig::default());
    let ctx = f.devices()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096, None, 0).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    println!("\n| objects | created | time per object | resident memory per object |");
    println!("|---|---|---|---|");
    let (m0, t0) = (rss(), Instant::now());
    let qps: Vec<Qp> = (0..10_000)
        .map(|_| pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap())
        .collect();
    report("RC QPs (16 send + 16 receive WRs)", qps.len(), (m0, t0));
    // Registering memory the MR does not own: what ibv_reg_mr costs beyond the buffer.
    let buf = vec![0u8; 4096];
    let (m0, t0) = (rss(), Instant::now());
    let mrs: Vec<Mr> = (0..100_000)
        .map(|_| {
            // SAFETY: `buf` outlives every MR (they are dropped first, below).
            let raw = unsafe { RawMemory::new(buf.as_ptr() as *mut u8, buf.len()) };
            pd.reg_mr_raw(raw, buf.as_ptr() as u64, ACCESS).unwrap()
        })
        .collect();
    report("MRs of 4 KiB over one buffer", mrs.len(), (m0, t0));
    // (The objects above kept meanwhile: memory they freed would be counted again.)
    cm_connections();
    host_mrs();
    churn();
    drop(mrs);
    drop(qps);
}

/// A CQ, an MR and an RC QP made and destroyed 5,000 times through the C ABI (the shim) while
/// another thread of the process polls: each barrier a creation or destruction issues across
/// the process's threads interrupts that thread and waits for it.
fn churn() {
    const ROUNDS: usize = 5_000;
    let what = "CQ + MR + RC QP made and destroyed, C ABI, another thread polling (per round)";
    match crate::cabi_churn(ROUNDS) {
        Ok(us) => println!("| {what} | {ROUNDS} | {us:.2} us | |"),
        Err(e) => println!("| {what} | failed: {} | | |", e.trim()),
    }
}

/// 100,000 MRs of a page each, with remote write access, on a host fabric (as every process
/// under the shim is): the first 64 move into shared memory, the rest stay where they are.
fn host_mrs() {
    const N: usize = 100_000;
    let dir = std::env::temp_dir().join(format!("rdma-emu-bench-mrs-{}", std::process::id()));
    let host = Some(dir.to_str().unwrap().to_owned());
    let f = Fabric::new(FabricConfig { host, ..Default::default() });
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    let (rw, private) =
        (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: a fresh anonymous mapping of N pages, unmapped below after every MR is dropped.
    let pages = unsafe { libc::mmap(std::ptr::null_mut(), N * 4096, rw, private, -1, 0) };
    assert_ne!(pages, libc::MAP_FAILED);
    let pages = pages.cast::<u8>();
    // Touched first: the pages' own memory is not the MRs'.
    // SAFETY: the mapping is N pages long.
    unsafe { pages.write_bytes(1, N * 4096) };
    let (m0, t0) = (rss(), Instant::now());
    let mrs: Vec<Mr> = (0..N)
        .map(|i| {
            // SAFETY: page `i` of the mapping, which outlives every MR.
            let (at, raw) =
                unsafe { (pages.add(i * 4096), RawMemory::new(pages.add(i * 4096), 4096)) };
            pd.reg_mr_raw(raw, at as u64, ACCESS).unwrap()
        })
        .collect();
    report("MRs of a page each on a host fabric", mrs.len(), (m0, t0));
    for mr in mrs {
        mr.dereg().unwrap();
    }
    // SAFETY: our mapping, no MR over it any more.
    unsafe { libc::munmap(pages.cast(), N * 4096) };
    let _ = std::fs::remove_dir_all(&dir);
}

/// Connections made through the connection manager (ids without QPs, in one process): the
/// first 1,000, then 1,000 more once 5,000 are up (a connection's cost must not grow with the
/// connections it does not touch).
fn cm_connections() {
    use rdma_emu::cm::{CmChannel, CmEventType as E, CmId, ConnParam, PortSpace};
    let f = Fabric::new(FabricConfig::default());
    let at: std::net::SocketAddr = "127.0.0.1:7471".parse().unwrap();
    let (lch, cch) = (CmChannel::new(&f).unwrap(), CmChannel::new(&f).unwrap());
    let l = CmId::create(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(at).unwrap();
    l.listen(0).unwrap();
    let next = |ch: &CmChannel, want| {
        let ev = ch.get_event().unwrap();
        assert_eq!(ev.event, want, "status {}", ev.status);
        ev
    };
    let connect = || {
        let c = CmId::create(&cch, PortSpace::Tcp).unwrap();
        c.resolve_addr(None, at, 2000).unwrap();
        next(&cch, E::AddrResolved);
        c.resolve_route(2000).unwrap();
        next(&cch, E::RouteResolved);
        c.connect(&ConnParam::default()).unwrap();
        let req = next(&lch, E::ConnectRequest);
        req.id.accept(&ConnParam::default()).unwrap();
        next(&cch, E::ConnectResponse);
        c.establish().unwrap();
        next(&lch, E::Established);
        (c, req.id)
    };
    let (m0, t0) = (rss(), Instant::now());
    let mut up: Vec<_> = (0..1_000).map(|_| connect()).collect();
    report("CM connections, the first 1,000 (two ids each)", 1_000, (m0, t0));
    up.extend((0..4_000).map(|_| connect()));
    let (m0, t0) = (rss(), Instant::now());
    up.extend((0..1_000).map(|_| connect()));
    report("CM connections, 1,000 more with 5,000 up", 1_000, (m0, t0));
    let (m0, t0) = (rss(), Instant::now());
    for (c, s) in up.drain(..1_000) {
        c.destroy().unwrap();
        s.destroy().unwrap();
    }
    report("CM connections destroyed, 1,000 of 6,000 up (both ids)", 1_000, (m0, t0));
}

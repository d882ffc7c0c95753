//! Ratio benchmarks: each goal of shared/design/performance.md measures its baseline in the same
//! process, right next to the emulator figure, and reports emulator / baseline.
//!
//!     cargo run --release -p rdma-emu-benches --bin ratios [-- --quick] [-- --only G3] [-- --svg F]
//!
//! and writes the chart of the ratios against their goals to F (default target/benchmarks.svg).
//!
//! Threads are pinned (core 0 and core 1). Each goal takes 7 samples (3 with `--quick`); the
//! table gives the median ratio and the min..max of the ratios. Never used as a test.

use std::{
    hint::black_box,
    os::fd::AsRawFd,
    sync::{
        Arc, Barrier,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use rdma_emu::*;

mod baseline;
mod listen;
mod pair;
mod perftest;
mod scale;
mod svg;

/// Every row printed so far, for the chart.
static BARS: std::sync::Mutex<Vec<svg::Bar>> = std::sync::Mutex::new(Vec::new());
use pair::{Pair, Side, pair, pin, sge};
use perftest::Ready;

struct Opts {
    samples: usize,
    quick: bool,
    only: Option<String>,
}

/// One goal's result: samples of (emulator, baseline) figures in the goal's unit.
struct Row {
    goal: &'static str,
    what: String,
    unit: &'static str,
    /// Whether a bigger figure is better (bandwidth, rate) or worse (latency).
    higher_better: bool,
    target: &'static str,
    emu: Vec<f64>,
    base: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

impl Row {
    fn ratios(&self) -> Vec<f64> {
        self.emu.iter().zip(&self.base).map(|(e, b)| e / b).collect()
    }

    fn print(&self) {
        let r = self.ratios();
        let (lo, hi) = r.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        println!(
            "| {} | {} | {:.3} {} | {:.3} {} | **{:.3}x** | {:.3}..{:.3} | {} |",
            self.goal,
            self.what,
            median(&self.emu),
            self.unit,
            median(&self.base),
            self.unit,
            median(&r),
            lo,
            hi,
            self.target
        );
        let _ = self.higher_better;
        BARS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(svg::Bar {
            label: format!("{} {}", self.goal, self.what),
            ratio: median(&r),
            target: self.target.to_string(),
        });
    }
}

fn spin_poll(cq: &Cq) -> Wc {
    loop {
        if let Some(wc) = cq.poll_one() {
            debug_assert_eq!(wc.status, WcStatus::SUCCESS);
            return wc;
        }
        std::hint::spin_loop();
    }
}

/// G1 / G1b: WRITE bandwidth in GB/s at `size`, against memcpy of the same size.
fn write_bw(o: &Opts, goal: &'static str, size: usize, target: &'static str) -> Row {
    let p = pair(size);
    let total: usize = if o.quick { 256 << 20 } else { 1 << 30 };
    let iters = (total / size).max(4);
    let src = [sge(&p.a.mr, 0, size)];
    let wr = SendWr::write(0, &src, p.b.mr.addr(), p.b.mr.rkey()).signaled();
    // The baseline copies between the very buffers the WRITE copies between (an owned MR's
    // iova is its host address), so alignment and page placement are the same for both.
    let (from, to) = (p.a.mr.addr() as *const u8, p.b.mr.addr() as *mut u8);
    // Touch every page of both sides before timing (zeroed memory faults on first use).
    p.a.mr.write(0, &vec![1u8; size]).unwrap();
    p.a.qp.post_send(&wr).unwrap();
    spin_poll(&p.a.cq);
    let mut row = Row {
        goal,
        what: format!("RDMA WRITE {} KiB, 1 QP", size / 1024),
        unit: "GB/s",
        higher_better: true,
        target,
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        // SAFETY: both MRs are live, owned by this function's pair, `size` bytes long, and
        // nothing else touches them while the baseline runs.
        row.base.push(unsafe { baseline::memcpy_gbps(from, to, size, iters) });
        let t = Instant::now();
        for _ in 0..iters {
            p.a.qp.post_send(&wr).unwrap();
            spin_poll(&p.a.cq);
        }
        row.emu.push((iters * size) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    row
}

/// G3: 8-byte WRITE, post one + poll one, one thread, in Mops/s.
fn msg_rate(o: &Opts, p: &Pair, wr: &SendWr<'_>, iters: usize) -> f64 {
    let _ = o;
    let t = Instant::now();
    for _ in 0..iters {
        p.a.qp.post_send(wr).unwrap();
        // By reference: the completion is laid out in memory once, as the model's copy is.
        black_box(&spin_poll(&p.a.cq));
    }
    iters as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn g3_and_g7(o: &Opts) -> Vec<Row> {
    let p = pair(4096);
    let iters = if o.quick { 200_000 } else { 1_000_000 };
    let src = [sge(&p.a.mr, 0, 8)];
    let res = [sge(&p.a.mr, 64, 8)];
    let write = SendWr::write(0, &src, p.b.mr.addr(), p.b.mr.rkey()).signaled();
    let fadd = SendWr::fetch_add(0, &res, p.b.mr.addr() + 128, p.b.mr.rkey(), 1).signaled();
    let cswp = SendWr::cmp_swap(0, &res, p.b.mr.addr() + 128, p.b.mr.rkey(), 0, 0).signaled();
    let mk = |goal, what: &str, target| Row {
        goal,
        what: what.to_string(),
        unit: "Mops/s",
        higher_better: true,
        target,
        emu: vec![],
        base: vec![],
    };
    let mut g3 = mk("G3", "8 B WRITE, post 1 + poll 1, Rust API", ">= 0.25x");
    let mut g7f = mk("G7", "8 B FETCH_ADD rate (baseline: G3)", ">= 0.5x");
    let mut g7c = mk("G7", "8 B CMP_SWP rate (baseline: G3)", ">= 0.5x");
    for _ in 0..o.samples {
        g3.base.push(baseline::lockfree_model_mops(iters));
        let w = msg_rate(o, &p, &write, iters);
        g3.emu.push(w);
        g7f.base.push(w);
        g7c.base.push(w);
        g7f.emu.push(msg_rate(o, &p, &fadd, iters));
        g7c.emu.push(msg_rate(o, &p, &cswp, iters));
    }
    vec![g3, g7f, g7c]
}

/// G4: polled SEND ping-pong round trip in microseconds, two threads on two cores.
fn g4(o: &Opts) -> Row {
    let iters = if o.quick { 50_000 } else { 200_000 };
    let mut row = Row {
        goal: "G4",
        what: "polled SEND ping-pong RTT, 2 threads".into(),
        unit: "us",
        higher_better: false,
        target: "<= 2.0x",
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        row.base.push(baseline::spin_pingpong_us(iters));
        row.emu.push(pingpong_us(iters, false));
    }
    row
}

/// G5: the same ping-pong, each side blocking in `get_cq_event` instead of spinning on the CQ.
fn g5(o: &Opts) -> Row {
    let iters = if o.quick { 5_000 } else { 20_000 };
    let mut row = Row {
        goal: "G5",
        what: "event-driven RTT (req_notify + get_cq_event + ack + poll)".into(),
        unit: "us",
        higher_better: false,
        target: "<= 1.3x",
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        row.base.push(baseline::eventfd_rtt_us(iters));
        row.emu.push(pingpong_us(iters, true));
    }
    row
}

fn pingpong_us(iters: usize, events: bool) -> f64 {
    let p = Arc::new(pair(4096));
    let go = Arc::new(Barrier::new(2));
    let wait = move |s: &Side| {
        if events {
            // Arm, then look once more: a completion that raced the arm is already queued.
            s.cq.req_notify(false).unwrap();
            if let Some(wc) = s.cq.poll_one() {
                return wc;
            }
            let cq = s.ch.get_cq_event().unwrap();
            cq.ack_events(1);
            spin_poll(&cq)
        } else {
            spin_poll(&s.cq)
        }
    };
    let peer = {
        let (p, go) = (p.clone(), go.clone());
        std::thread::spawn(move || {
            pin(1);
            let b = &p.b;
            let s = [sge(&b.mr, 0, 8)];
            let r = [sge(&b.mr, 64, 8)];
            for _ in 0..4 {
                b.qp.post_recv(&RecvWr { wr_id: 0, sg_list: &r }).unwrap();
            }
            go.wait();
            for _ in 0..iters {
                wait(b);
                b.qp.post_recv(&RecvWr { wr_id: 0, sg_list: &r }).unwrap();
                b.qp.post_send(&SendWr::send(0, &s)).unwrap();
            }
        })
    };
    pin(0);
    let a = &p.a;
    let s = [sge(&a.mr, 0, 8)];
    let r = [sge(&a.mr, 64, 8)];
    for _ in 0..4 {
        a.qp.post_recv(&RecvWr { wr_id: 0, sg_list: &r }).unwrap();
    }
    go.wait();
    let t = Instant::now();
    for _ in 0..iters {
        a.qp.post_send(&SendWr::send(0, &s)).unwrap();
        wait(a);
        a.qp.post_recv(&RecvWr { wr_id: 0, sg_list: &r }).unwrap();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    peer.join().unwrap();
    let _ = (&p.a.ctx, p.a.ch.as_raw_fd());
    us
}

/// Compiles `benches/c/cabi.c` against the system headers and runs it on the shim built next to
/// this binary; returns (8-byte WRITE Mops/s, ping-pong RTT in us) through the C ABI.
fn cabi(rate_iters: usize, rtt_iters: usize) -> Result<(f64, f64), String> {
    let text = cabi_run(&[rate_iters, rtt_iters])?;
    Ok((cabi_value(&text, "mops")?, cabi_value(&text, "rtt_us")?))
}

/// The C program's microseconds per round of a CQ, an MR and a QP made and destroyed while
/// another thread polls (`rounds` rounds).
pub(crate) fn cabi_churn(rounds: usize) -> Result<f64, String> {
    cabi_value(&cabi_run(&[0, 0, 0, rounds])?, "churn_us")
}

/// `key`'s value in the C program's output.
fn cabi_value(text: &str, key: &str) -> Result<f64, String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse::<f64>().ok()))
        .ok_or(format!("no {key} in {text}"))
}

/// Compiles `benches/c/cabi.c` and runs it on the shim with `args`; its output.
fn cabi_run(args: &[usize]) -> Result<String, String> {
    let exe_dir =
        std::env::current_exe().map_err(|e| e.to_string())?.parent().unwrap().to_path_buf();
    let lib = exe_dir.join("libibverbs.so");
    if !lib.exists() {
        return Err(format!("{} missing: cargo build --release -p rdma-emu-shim", lib.display()));
    }
    let shim = exe_dir.join("shim");
    std::fs::create_dir_all(&shim).map_err(|e| e.to_string())?;
    let link = shim.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).map_err(|e| e.to_string())?;
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("c/cabi.c");
    let bin = exe_dir.join("cabi-bench");
    let cc = std::process::Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .map_err(|e| e.to_string())?;
    if !cc.status.success() {
        return Err(String::from_utf8_lossy(&cc.stderr).into_owned());
    }
    let out = std::process::Command::new(&bin)
        .args(args.iter().map(usize::to_string))
        .env("LD_LIBRARY_PATH", &shim)
        .output()
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// G3b (C-ABI message rate against the lock-free model) and G6 (C-ABI ping-pong RTT against the
/// Rust API's, both measured here).
fn g3b_and_g6(o: &Opts) -> Result<Vec<Row>, String> {
    let (rate_iters, rtt_iters) = if o.quick { (200_000, 20_000) } else { (1_000_000, 100_000) };
    let mk = |goal, what: &str, unit, higher_better, target| Row {
        goal,
        what: what.to_string(),
        unit,
        higher_better,
        target,
        emu: vec![],
        base: vec![],
    };
    let mut g3b = mk("G3b", "8 B WRITE, post 1 + poll 1, C ABI", "Mops/s", true, ">= 0.12x");
    let mut g6 = mk("G6", "ping-pong RTT, C ABI (baseline: Rust API)", "us", false, "<= 1.15x");
    for _ in 0..o.samples {
        g3b.base.push(baseline::lockfree_model_mops(rate_iters));
        let (mops, rtt) = cabi(rate_iters, rtt_iters)?;
        g3b.emu.push(mops);
        g6.emu.push(rtt);
        g6.base.push(pingpong_us(rtt_iters, false));
    }
    Ok(vec![g3b, g6])
}

/// G2: `ib_write_bw -s 1048576` between two processes on the shim, against memcpy of 1 MiB.
fn g2(o: &Opts) -> Result<Row, String> {
    let iters = if o.quick { 500 } else { 2000 };
    write_bw_across(o, "G2", 1 << 20, iters, ">= 0.55x")
}

/// MB: G2's measure for a message of a few KiB (an MPI eager message, a UCX bounce buffer),
/// which no goal names: where the copies are a small part of a message's cost.
fn mb(o: &Opts) -> Result<Vec<Row>, String> {
    let iters = if o.quick { 20_000 } else { 100_000 };
    [4096, 16384].iter().map(|&size| write_bw_across(o, "MB", size, iters, "(none)")).collect()
}

/// `ib_write_bw -s size` between two processes on the shim, against memcpy of `size` bytes.
fn write_bw_across(
    o: &Opts,
    goal: &'static str,
    size: usize,
    iters: usize,
    target: &'static str,
) -> Result<Row, String> {
    let mut row = Row {
        goal,
        what: format!("cross-process `ib_write_bw -s {size}` (perftest, shim)"),
        unit: "GB/s",
        higher_better: true,
        target,
        emu: vec![],
        base: vec![],
    };
    let (src, mut dst) = (vec![1u8; size], vec![0u8; size]);
    let (s, n) = (size.to_string(), iters.to_string());
    for _ in 0..o.samples {
        // SAFETY: two live, distinct heap buffers of `size` bytes.
        let copy = unsafe { baseline::memcpy_gbps(src.as_ptr(), dst.as_mut_ptr(), size, 500) };
        row.base.push(copy);
        let out = perftest::run("ib_write_bw", &["-s", &s, "-n", &n])?;
        // BW average, in MB/s of 2^20 bytes.
        row.emu.push(perftest::result(&out, 3)? * (1 << 20) as f64 / 1e9);
    }
    Ok(row)
}

/// G4b: `ib_send_lat` between two processes (it reports half the round trip), against the spin
/// ping-pong's round trip.
fn g4b(o: &Opts) -> Result<Row, String> {
    let iters = if o.quick { "2000" } else { "10000" };
    let mut row = Row {
        goal: "G4b",
        what: "cross-process `ib_send_lat` RTT (2 x t_typical)".into(),
        unit: "us",
        higher_better: false,
        target: "<= 2.5x",
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        row.base.push(baseline::spin_pingpong_us(200_000));
        let out = perftest::run("ib_send_lat", &["-n", iters])?;
        row.emu.push(2.0 * perftest::result(&out, 4)?);
    }
    Ok(row)
}

/// WL1: `ib_write_lat` between two processes against `ib_send_lat`, in the same run. Each side
/// waits for the other's WRITE by spinning on its buffer, entering no verb, so it is the
/// writer, polling its CQ, that carries the WRITE out when the peer's reader thread is not
/// scheduled (see `fabric::host::LAG`).
fn wl1(o: &Opts) -> Result<Row, String> {
    let what = "cross-process `ib_write_lat` RTT (baseline: `ib_send_lat`)";
    against_send_lat(o, "WL1", what, "(none)", |iters| {
        perftest::run("ib_write_lat", &["-n", iters])
    })
}

/// CM1: `ib_send_lat -R` (QPs connected by the connection manager, parameters exchanged over
/// it) against plain `ib_send_lat` (TCP exchange), both between two processes, in the same run.
///
/// perftest races itself here: after the handshake on its first connection the client connects
/// its data connection while the server is still making the listening id for it
/// (`create_rdma_cm_connection`); a request that wins is rejected, "invalid service ID" (reason
/// 8), as the kernel's CM rejects it, and perftest 4.5-0.17 (Debian 12) cannot retry (its retry
/// reuses the ids it has just destroyed). About one run in fifteen here: such a sample runs
/// again, three times at most, as the rdmacm tests do.
fn cm1(o: &Opts) -> Result<Row, String> {
    let what = "cross-process `ib_send_lat -R` RTT (baseline: without `-R`)";
    against_send_lat(o, "CM1", what, "<= 1.1x", |iters| {
        let args = ["-R", "-n", iters];
        let run =
            || perftest::run_with("ib_send_lat", &args, &[], "-p", Ready::Cm, Some("127.0.0.1"));
        let lost_race = |r: &Result<String, String>| {
            r.as_ref().is_err_and(|e| e.contains("RDMA_CM_EVENT_REJECTED; error: 8."))
        };
        let mut out = run();
        for _ in 1..3 {
            if !lost_race(&out) {
                break;
            }
            out = run();
        }
        out
    })
}

/// A round trip between two processes that `run` reports (perftest's latency output, given the
/// iterations), against plain `ib_send_lat`'s, sample by sample in the same run.
fn against_send_lat(
    o: &Opts,
    goal: &'static str,
    what: &str,
    target: &'static str,
    run: impl Fn(&str) -> Result<String, String>,
) -> Result<Row, String> {
    let iters = if o.quick { "2000" } else { "10000" };
    let mut row = Row {
        goal,
        what: what.into(),
        unit: "us",
        higher_better: false,
        target,
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        let out = perftest::run("ib_send_lat", &["-n", iters])?;
        row.base.push(2.0 * perftest::result(&out, 4)?);
        row.emu.push(2.0 * perftest::result(&run(iters)?, 4)?);
    }
    Ok(row)
}

/// CM2: connection setup through the connection manager (cmtime's `connect` step, 100
/// connections per sample) against a TCP connection on loopback (connect + accept).
fn cm2(o: &Opts) -> Result<Row, String> {
    let mut row = Row {
        goal: "CM2",
        what: "rdma_connect to ESTABLISHED per connection, `cmtime -c 100` (baseline: TCP connect)"
            .into(),
        unit: "us",
        higher_better: false,
        target: "(none)",
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        row.base.push(baseline::tcp_connect_us(100));
        let client = ["-s", "127.0.0.1", "-c", "100"];
        let out = perftest::run_with("cmtime", &[], &client, "-p", Ready::CmForever, None)?;
        row.emu.push(perftest::cmtime_step_us(&out, "connect")?);
    }
    Ok(row)
}

/// RS1: iperf3 over rsockets (Debian's librspreload on the shim, default 128 KiB buffers)
/// against iperf3 over the kernel's TCP on loopback, in the same run.
fn rs1(o: &Opts) -> Result<Row, String> {
    let mut row = Row {
        goal: "RS1",
        what: "`iperf3 -t 2` over rsockets via librspreload (baseline: over TCP loopback)".into(),
        unit: "Gb/s",
        higher_better: true,
        target: "(none)",
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        row.base.push(perftest::iperf3_gbps(false)?);
        row.emu.push(perftest::iperf3_gbps(true)?);
    }
    Ok(row)
}

/// EV1: `ibv_rc_pingpong -e` (each side sleeps on its completion channel) against the polled
/// `ibv_rc_pingpong`, both between two processes, in the same run: what waking a process
/// blocked on its channel costs.
fn ev1(o: &Opts) -> Result<Row, String> {
    let iters = if o.quick { "2000" } else { "10000" };
    let mut row = Row {
        goal: "EV1",
        what: "cross-process `ibv_rc_pingpong -e` time per iteration (baseline: polled)".into(),
        unit: "us",
        higher_better: false,
        target: "<= 3x",
        emu: vec![],
        base: vec![],
    };
    for _ in 0..o.samples {
        let out = perftest::run("ibv_rc_pingpong", &["-n", iters])?;
        row.base.push(perftest::usec_per_iter(&out)?);
        let out = perftest::run("ibv_rc_pingpong", &["-e", "-n", iters])?;
        row.emu.push(perftest::usec_per_iter(&out)?);
    }
    Ok(row)
}

/// RD1: `ib_read_bw -s 4194304` between two processes against `ib_write_bw` of the same size,
/// in the same run: whether READs, whose responses the target's fabric reader sends, move as
/// fast as WRITEs.
fn rd1(o: &Opts) -> Result<Row, String> {
    let iters = if o.quick { "200" } else { "1000" };
    let mut row = Row {
        goal: "RD1",
        what: "cross-process `ib_read_bw -s 4194304` (baseline: `ib_write_bw`)".into(),
        unit: "GB/s",
        higher_better: true,
        target: ">= 0.9x",
        emu: vec![],
        base: vec![],
    };
    let gbps = |out: &str| perftest::result(out, 3).map(|mb| mb * (1 << 20) as f64 / 1e9);
    for _ in 0..o.samples {
        row.base.push(gbps(&perftest::run("ib_write_bw", &["-s", "4194304", "-n", iters])?)?);
        row.emu.push(gbps(&perftest::run("ib_read_bw", &["-s", "4194304", "-n", iters])?)?);
    }
    Ok(row)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1).cloned());
    let chart = args
        .iter()
        .position(|a| a == "--svg")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "target/benchmarks.svg".into());
    let o = Opts { samples: if quick { 3 } else { 7 }, quick, only };
    pin(0);
    let want = |g: &str| o.only.as_deref().is_none_or(|x| x.eq_ignore_ascii_case(g));
    println!(
        "| goal | what | emulator (median) | baseline (median) | ratio (median) | ratio min..max | goal |"
    );
    println!("|---|---|---|---|---|---|---|");
    if want("G1") {
        let sizes: &[usize] =
            if o.quick { &[64 << 10, 1 << 20] } else { &[64 << 10, 1 << 20, 64 << 20] };
        for &s in sizes {
            write_bw(&o, "G1", s, ">= 0.90x").print();
        }
    }
    if want("G1b") {
        write_bw(&o, "G1b", 4096, ">= 0.5x").print();
    }
    if want("G3") || want("G7") {
        for r in g3_and_g7(&o) {
            r.print();
        }
    }
    if want("G4") {
        g4(&o).print();
    }
    if want("G5") {
        g5(&o).print();
    }
    if want("G3b") || want("G6") {
        match g3b_and_g6(&o) {
            Ok(rows) => rows.iter().for_each(Row::print),
            Err(e) => eprintln!("G3b/G6 skipped: {e}"),
        }
    }
    if want("G2") {
        match g2(&o) {
            Ok(r) => r.print(),
            Err(e) => eprintln!("G2 skipped: {e}"),
        }
    }
    if want("MB") {
        match mb(&o) {
            Ok(rows) => rows.iter().for_each(Row::print),
            Err(e) => eprintln!("MB skipped: {e}"),
        }
    }
    if want("G4b") {
        match g4b(&o) {
            Ok(r) => r.print(),
            Err(e) => eprintln!("G4b skipped: {e}"),
        }
    }
    let cross = [
        ("WL1", wl1 as fn(&Opts) -> Result<Row, String>),
        ("CM1", cm1),
        ("CM2", cm2),
        ("RS1", rs1),
    ];
    let more = [("EV1", ev1 as fn(&Opts) -> Result<Row, String>), ("RD1", rd1)];
    for (goal, f) in cross.into_iter().chain(more) {
        if want(goal) {
            match f(&o) {
                Ok(r) => r.print(),
                Err(e) => eprintln!("{goal} skipped: {e}"),
            }
        }
    }
    if want("SC") {
        scale::sc(&o).iter().for_each(Row::print);
    }
    if want("objects") {
        scale::objects();
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\nsamples per goal: {}; load average at the end: {}", o.samples, load.trim());
    let bars = BARS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let title = format!("rdma-emu ratios, {} samples per goal", o.samples);
    match std::fs::write(&chart, svg::chart(&title, &bars)) {
        Ok(()) => println!("chart: {chart}"),
        Err(e) => eprintln!("chart {chart} not written: {e}"),
    }
    let _ = AtomicU64::new(0).load(Ordering::Relaxed);
}

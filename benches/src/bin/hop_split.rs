//! Where a polled SEND ping-pong's round trip goes (the G4 ping-pong, two threads pinned to
//! cores 0 and 1): each side's `post_send`, `post_recv` and wait for its receive completion,
//! timed by the time-stamp counter and given in nanoseconds per round trip, beside the same
//! three calls made in one thread (where no cache line moves between cores).
//!
//!     cargo build --release -p rdma-emu-benches && ./target/release/hop_split [ROUNDS]
//!
//! The ratio G4 reports says how far a round trip is from the machine's limit; this says which
//! step holds the difference: a post that takes longer here than in one thread waits for lines
//! the other core wrote last. The spin ping-pong G4 measures against ends the table, run
//! right after, and the same ping-pong with each side making, before it answers, a hop of the
//! same three calls on a pair of its own: the round trip the emulator's work would give if it
//! moved no line between the cores (what G4's is above it is the cost of the lines its hops
//! share). Timings, so an aid to reading G4, never a test. x86-64 only.

use std::{
    sync::{Arc, Barrier},
    time::Instant,
};

use rdma_emu::*;

#[path = "../baseline.rs"]
#[allow(dead_code)]
mod baseline;
#[path = "../pair.rs"]
#[allow(dead_code)]
mod pair;

use pair::{Pair, Side, pair, pin, sge};

/// The time-stamp counter.
#[inline(always)]
fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` reads a counter; it touches no memory.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Receives posted ahead, as the G4 ping-pong keeps them.
fn prime(s: &Side) {
    for _ in 0..4 {
        s.qp.post_recv(&RecvWr { wr_id: 0, sg_list: &[sge(&s.mr, 64, 8)] }).unwrap();
    }
}

fn wait(cq: &Cq) {
    while cq.poll_one().is_none() {
        std::hint::spin_loop();
    }
}

/// Counter ticks spent in each step, summed over the rounds.
#[derive(Debug, Default, Clone, Copy)]
struct Steps {
    send: u64,
    wait: u64,
    recv: u64,
}

/// One side's rounds: `send_first` posts its SEND and then waits (the ping-pong's initiator);
/// otherwise it waits first (its peer). Each step timed.
fn rounds(s: &Side, n: usize, send_first: bool) -> Steps {
    let (sg, rg) = ([sge(&s.mr, 0, 8)], [sge(&s.mr, 64, 8)]);
    let (wr, rwr) = (SendWr::send(0, &sg), RecvWr { wr_id: 0, sg_list: &rg });
    let mut t = Steps::default();
    let timed = |acc: &mut u64, f: &mut dyn FnMut()| {
        let t0 = tsc();
        f();
        *acc += tsc() - t0;
    };
    for _ in 0..n {
        if send_first {
            timed(&mut t.send, &mut || s.qp.post_send(&wr).unwrap());
        }
        timed(&mut t.wait, &mut || wait(&s.cq));
        timed(&mut t.recv, &mut || s.qp.post_recv(&rwr).unwrap());
        if !send_first {
            timed(&mut t.send, &mut || s.qp.post_send(&wr).unwrap());
        }
    }
    t
}

/// One hop of G4's ping-pong on `p` alone, in the calling thread: A's SEND, B's poll that
/// finds its completion, B's receive posted again.
fn hop_alone(p: &Pair) {
    let (sg, rg) = ([sge(&p.a.mr, 0, 8)], [sge(&p.b.mr, 64, 8)]);
    p.a.qp.post_send(&SendWr::send(0, &sg)).unwrap();
    wait(&p.b.cq);
    p.b.qp.post_recv(&RecvWr { wr_id: 0, sg_list: &rg }).unwrap();
}

/// G4's pair, its receives posted ahead.
fn connected() -> Pair {
    let p = pair(4096);
    prime(&p.a);
    prime(&p.b);
    p
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    // Counter ticks per nanosecond, measured against the clock.
    let (c0, i0) = (tsc(), Instant::now());
    std::thread::sleep(std::time::Duration::from_millis(100));
    let per_ns = (tsc() - c0) as f64 / i0.elapsed().as_nanos() as f64;
    let ns = |ticks: u64| ticks as f64 / per_ns / n as f64;

    // One thread: A's SEND, B's receive completion and its receive again, then B's SEND back
    // and A's: the same calls, every line in this core's cache.
    let p = connected();
    let (a, b) = (&p.a, &p.b);
    pin(0);
    let (mut one_a, mut one_b) = (Steps::default(), Steps::default());
    let (sa, ra) = ([sge(&a.mr, 0, 8)], [sge(&a.mr, 64, 8)]);
    let (sb, rb) = ([sge(&b.mr, 0, 8)], [sge(&b.mr, 64, 8)]);
    let (wa, wb) = (SendWr::send(0, &sa), SendWr::send(0, &sb));
    let (rwa, rwb) = (RecvWr { wr_id: 0, sg_list: &ra }, RecvWr { wr_id: 0, sg_list: &rb });
    for _ in 0..n {
        let t0 = tsc();
        a.qp.post_send(&wa).unwrap();
        let t1 = tsc();
        wait(&b.cq);
        let t2 = tsc();
        b.qp.post_recv(&rwb).unwrap();
        let t3 = tsc();
        b.qp.post_send(&wb).unwrap();
        let t4 = tsc();
        wait(&a.cq);
        let t5 = tsc();
        a.qp.post_recv(&rwa).unwrap();
        let t6 = tsc();
        one_a.send += t1 - t0;
        one_b.wait += t2 - t1;
        one_b.recv += t3 - t2;
        one_b.send += t4 - t3;
        one_a.wait += t5 - t4;
        one_a.recv += t6 - t5;
    }
    drop(p);

    // Two threads, as G4 runs it.
    let pair = Arc::new(connected());
    let go = Arc::new(Barrier::new(2));
    let peer = {
        let (pair, go) = (pair.clone(), go.clone());
        std::thread::spawn(move || {
            pin(1);
            go.wait();
            rounds(&pair.b, n, false)
        })
    };
    pin(0);
    go.wait();
    let start = Instant::now();
    let two_a = rounds(&pair.a, n, true);
    let rtt = start.elapsed().as_nanos() as f64 / n as f64;
    let two_b = peer.join().unwrap();
    drop(pair);
    let spin = baseline::spin_pingpong_us(n) * 1e3;
    // The round trip G4's would be if its hops moved no line between the cores: each side,
    // before it answers, makes a hop of the same three calls on a pair of its own.
    let own = |p: Pair| move |_: u64| hop_alone(&p);
    let floor = baseline::spin_pingpong_with_us(n, [own(connected()), own(connected())]) * 1e3;

    println!("ns per round trip ({n} rounds; the counter at {per_ns:.3} ticks/ns)");
    println!("| step | one thread | two threads |");
    println!("|---|---|---|");
    let row =
        |what: &str, one: u64, two: u64| println!("| {what} | {:.1} | {:.1} |", ns(one), ns(two));
    row("A post_send", one_a.send, two_a.send);
    row("B waits for A's SEND", one_b.wait, two_b.wait);
    row("B post_recv", one_b.recv, two_b.recv);
    row("B post_send", one_b.send, two_b.send);
    row("A waits for B's SEND", one_a.wait, two_a.wait);
    row("A post_recv", one_a.recv, two_a.recv);
    println!("| round trip | | {rtt:.1} |");
    println!("| the spin ping-pong's round trip (G4's baseline) | | {spin:.1} |");
    println!(
        "| the spin ping-pong, each side first making a hop on a pair of its own (no line shared) | | {floor:.1} |"
    );
}

//! The machine's own limits, measured in the same run as the emulator figures.

use std::{
    hint::black_box,
    sync::{
        Arc, Barrier,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Instant,
};

/// memcpy bandwidth in GB/s, copying `src` into `dst` `iters` times (what one RDMA WRITE of
/// the same size must do at the least).
pub fn memcpy_gbps(src: &[u8], dst: &mut [u8], iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(black_box(src));
        black_box(&mut *dst);
    }
    (iters * src.len()) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// A minimal lock-free model of post_send -> copy -> poll_cq for an 8-byte WRITE, one thread:
/// a WQE ring published with a release store, an "engine" that consumes it, copies 8 bytes and
/// publishes a CQE, and a poll that consumes the CQE. Returns Mops/s.
pub fn lockfree_model_mops(iters: usize) -> f64 {
    const N: usize = 64;
    #[derive(Clone, Copy, Default)]
    struct Wqe {
        wr_id: u64,
        src: usize,
        dst: usize,
    }
    #[derive(Clone, Copy, Default)]
    struct Cqe {
        wr_id: u64,
        status: u32,
    }
    let mut sq = [Wqe::default(); N];
    let mut cq = [Cqe::default(); N];
    let (sq_head, sq_tail, cq_head, cq_tail) =
        (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
    let mut mem = [0u64; 16];
    let t = Instant::now();
    for i in 0..iters {
        // post
        let h = sq_head.load(Ordering::Relaxed);
        sq[h as usize % N] = Wqe { wr_id: i as u64, src: i % 8, dst: 8 + i % 8 };
        sq_head.store(h + 1, Ordering::Release);
        // engine
        let tl = sq_tail.load(Ordering::Relaxed);
        if sq_head.load(Ordering::Acquire) != tl {
            let w = sq[tl as usize % N];
            mem[w.dst] = black_box(mem[w.src]);
            let ch = cq_head.load(Ordering::Relaxed);
            cq[ch as usize % N] = Cqe { wr_id: w.wr_id, status: 0 };
            cq_head.store(ch + 1, Ordering::Release);
            sq_tail.store(tl + 1, Ordering::Release);
        }
        // poll
        let ct = cq_tail.load(Ordering::Relaxed);
        if cq_head.load(Ordering::Acquire) != ct {
            black_box(cq[ct as usize % N].wr_id + cq[ct as usize % N].status as u64);
            cq_tail.store(ct + 1, Ordering::Release);
        }
    }
    black_box(&mem);
    iters as f64 / t.elapsed().as_secs_f64() / 1e6
}

#[repr(align(128))]
struct Line(AtomicU64);

/// Round trip of a spin ping-pong over two cache lines between cores 0 and 1, in us.
pub fn spin_pingpong_us(iters: usize) -> f64 {
    let lines = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let go = Arc::new(Barrier::new(2));
    let peer = {
        let (lines, go) = (lines.clone(), go.clone());
        std::thread::spawn(move || {
            super::pin(1);
            go.wait();
            for i in 1..=iters as u64 {
                while lines.0.0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                lines.1.0.store(i, Ordering::Release);
            }
        })
    };
    super::pin(0);
    go.wait();
    let t = Instant::now();
    for i in 1..=iters as u64 {
        lines.0.0.store(i, Ordering::Release);
        while lines.1.0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    peer.join().unwrap();
    us
}

struct Efd(i32);

impl Efd {
    fn new() -> Efd {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        Efd(fd)
    }
    fn post(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64.
        let n = unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
        assert_eq!(n, 8);
    }
    fn wait(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64; blocks until the counter is non-zero.
        let n = unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
        assert_eq!(n, 8);
    }
}

impl Drop for Efd {
    fn drop(&mut self) {
        // SAFETY: closes a descriptor this value owns.
        unsafe { libc::close(self.0) };
    }
}

/// Round trip of two threads waking each other through blocking eventfd reads, in us.
pub fn eventfd_rtt_us(iters: usize) -> f64 {
    let fds = Arc::new((Efd::new(), Efd::new()));
    let peer = {
        let fds = fds.clone();
        std::thread::spawn(move || {
            super::pin(1);
            for _ in 0..iters {
                fds.0.wait();
                fds.1.post();
            }
        })
    };
    super::pin(0);
    let t = Instant::now();
    for _ in 0..iters {
        fds.0.post();
        fds.1.wait();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    peer.join().unwrap();
    us
}

//! The machine's own limits, measured in the same run as the emulator figures.

use std::{
    hint::black_box,
    sync::{
        Arc, Barrier,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Instant,
};

/// memcpy bandwidth in GB/s, copying `len` bytes from `src` to `dst` `iters` times (what one
/// RDMA WRITE of the same size must do at the least).
///
/// # Safety
/// `src` and `dst` must be valid for `len` bytes and must not overlap.
pub unsafe fn memcpy_gbps(src: *const u8, dst: *mut u8, len: usize, iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: guaranteed by the caller.
        unsafe { std::ptr::copy_nonoverlapping(black_box(src), black_box(dst), len) };
    }
    (iters * len) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// A minimal lock-free model of post_send -> copy -> poll_cq for an 8-byte WRITE, one thread,
/// shaped like a real provider: heap rings of 64-byte WQEs (wr_id, opcode, flags, one SGE,
/// remote address, rkey) and 48-byte CQEs (the size of `ibv_wc`), indices published with release
/// stores and read with acquire loads, the copy done through the WQE's addresses. Mops/s.
pub fn lockfree_model_mops(iters: usize) -> f64 {
    const N: usize = 256;
    #[derive(Clone, Copy, Default)]
    #[repr(C, align(64))]
    struct Wqe {
        wr_id: u64,
        opcode: u32,
        flags: u32,
        addr: u64,
        length: u32,
        lkey: u32,
        remote_addr: u64,
        rkey: u32,
        _pad: [u32; 5],
    }
    #[derive(Clone, Copy, Default)]
    #[repr(C)]
    struct Cqe {
        wr_id: u64,
        status: u32,
        opcode: u32,
        vendor_err: u32,
        byte_len: u32,
        imm: u32,
        qp_num: u32,
        src_qp: u32,
        wc_flags: u32,
        misc: u64,
    }
    struct Rings {
        sq: Vec<Wqe>,
        cq: Vec<Cqe>,
        sq_head: AtomicU32,
        sq_tail: AtomicU32,
        cq_head: AtomicU32,
        cq_tail: AtomicU32,
        mem: Vec<u64>,
    }
    let mut r = Box::new(Rings {
        sq: vec![Wqe::default(); N],
        cq: vec![Cqe::default(); N],
        sq_head: AtomicU32::new(0),
        sq_tail: AtomicU32::new(0),
        cq_head: AtomicU32::new(0),
        cq_tail: AtomicU32::new(0),
        mem: vec![0u64; 1024],
    });
    let r: &mut Rings = black_box(&mut r);
    let base = r.mem.as_mut_ptr() as u64;
    let t = Instant::now();
    for i in 0..iters {
        // post_send
        let h = r.sq_head.load(Ordering::Relaxed);
        r.sq[h as usize % N] = Wqe {
            wr_id: i as u64,
            opcode: 0,
            flags: 2,
            addr: base,
            length: 8,
            lkey: 1,
            remote_addr: base + 8 * (1 + (i % 512) as u64),
            rkey: 1,
            _pad: [0; 5],
        };
        r.sq_head.store(h + 1, Ordering::Release);
        // the engine
        let tl = r.sq_tail.load(Ordering::Relaxed);
        if r.sq_head.load(Ordering::Acquire) != tl {
            let w = r.sq[tl as usize % N];
            // SAFETY: both addresses point into `r.mem` (8-byte words inside its length).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    w.addr as *const u8,
                    w.remote_addr as *mut u8,
                    w.length as usize,
                )
            };
            let ch = r.cq_head.load(Ordering::Relaxed);
            r.cq[ch as usize % N] = Cqe {
                wr_id: w.wr_id,
                byte_len: w.length,
                opcode: 1,
                qp_num: 17,
                ..Default::default()
            };
            r.cq_head.store(ch + 1, Ordering::Release);
            r.sq_tail.store(tl + 1, Ordering::Release);
        }
        // poll_cq
        let ct = r.cq_tail.load(Ordering::Relaxed);
        if r.cq_head.load(Ordering::Acquire) != ct {
            black_box(r.cq[ct as usize % N]);
            r.cq_tail.store(ct + 1, Ordering::Release);
        }
    }
    black_box(&r.mem);
    iters as f64 / t.elapsed().as_secs_f64() / 1e6
}

#[repr(align(128))]
struct Line(AtomicU64);

/// Round trip of a spin ping-pong over two cache lines between cores 0 and 1, in us.
pub fn spin_pingpong_us(iters: usize) -> f64 {
    let none = |_: u64| {};
    spin_pingpong_with_us(iters, [none, none])
}

/// [`spin_pingpong_us`] with each side calling its `work` (the first on core 0, the second on
/// core 1) with the round's number before it answers.
pub fn spin_pingpong_with_us<W: FnMut(u64) + Send + 'static>(iters: usize, work: [W; 2]) -> f64 {
    let [mut mine, mut theirs] = work;
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
                theirs(i);
                lines.1.0.store(i, Ordering::Release);
            }
        })
    };
    super::pin(0);
    go.wait();
    let t = Instant::now();
    for i in 1..=iters as u64 {
        mine(i);
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

/// A TCP connection on loopback, connect until accepted, in us (the cost a socket program pays
/// per connection on this machine).
pub fn tcp_connect_us(iters: usize) -> f64 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    // Both ends stay open until the end: closing as we go would measure TIME_WAIT and RST
    // handling, not the connection.
    let acceptor =
        std::thread::spawn(move || (0..iters).map(|_| l.accept().unwrap()).collect::<Vec<_>>());
    let t = Instant::now();
    let mut kept = Vec::with_capacity(iters);
    for _ in 0..iters {
        let s = std::net::TcpStream::connect(at).unwrap();
        s.set_nodelay(true).unwrap();
        kept.push(s);
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    drop(acceptor.join().unwrap());
    us
}

//! Resource limits: what objects created at the device's largest sizes cost, and that they
//! work. (One test per binary: it measures the process's resident memory.)

mod common;
use common::*;
use rdma_emu::*;

/// Resident bytes of this process.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// A QP, an SRQ and a CQ created with the largest sizes each profile reports take memory as
/// they are filled, not at creation (an HCA's queues are fixed memory; a program probing the
/// limits must not take the machine's RAM): a few MiB for all of them, and they carry traffic.
#[test]
fn queues_at_the_largest_sizes_take_memory_as_they_fill() {
    const BOUND: u64 = 48 << 20;
    for profile in [Profile::Rxe, Profile::Full] {
        let f = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
        let devs = f.devices();
        let a = devs[0].attr();
        let (b, far) = (node_on(&devs[0], 1 << 16), node_on(&devs[1], 1 << 16));
        let before = rss();
        let cq = b.ctx.create_cq(a.max_cqe as i32, None, 0).unwrap();
        let cap = QpCap {
            max_send_wr: a.max_qp_wr,
            max_recv_wr: a.max_qp_wr,
            max_send_sge: a.max_sge,
            max_recv_sge: a.max_sge,
            max_inline_data: a.max_inline_data,
        };
        let qp = b.pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap();
        let srq_attr = SrqAttr { max_wr: a.max_srq_wr, max_sge: a.max_srq_sge, srq_limit: 0 };
        let srq = b.pd.create_srq(&srq_attr).unwrap();
        let grew = rss().saturating_sub(before);
        assert!(grew < BOUND, "{profile:?}: {} MiB at creation", grew >> 20);
        assert!(qp.cap().max_send_wr >= a.max_qp_wr, "{:?}", qp.cap());

        // They work: 64 SENDs from the far side land in receives posted on the big QP.
        connect(&qp, &far.qp, &RcParams::default(), &RcParams::default());
        for i in 0..64 {
            post_recv(&qp, i, &[sge(&b.mr, 64 * i as usize, 64)]);
        }
        for i in 0..64u64 {
            far.mr.write(i as usize * 8, &i.to_le_bytes()).unwrap();
            let src = [sge(&far.mr, i as usize * 8, 8)];
            far.qp.post_send(&SendWr::send(i, &src)).unwrap();
        }
        let got = wait_n(&cq, 64);
        assert!(got.iter().all(|w| w.status == WcStatus::SUCCESS), "{got:?}");
        let mut word = [0u8; 8];
        b.mr.read(64 * 63, &mut word).unwrap();
        assert_eq!(u64::from_le_bytes(word), 63);
        drop((qp, srq, cq));
    }
}

/// Runs `case` of [`registration_is_charged_to_rlimit_memlock`] in a child process of this
/// test binary (it lowers its own limits); whether it passed.
fn in_child(case: &str) -> bool {
    let exe = std::env::current_exe().unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // Root's child runs without CAP_IPC_LOCK unless the case wants it: util-linux's setpriv
    // takes it out of the bounding set, so the program it starts never gets it. Another
    // user's child has no capabilities to begin with.
    let mut cmd = if root && case != "capable" {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--bounding-set", "-ipc_lock", "--"]).arg(exe);
        c
    } else {
        std::process::Command::new(exe)
    };
    let out = cmd
        .args(["--exact", "memlock_child", "--nocapture", "--test-threads=1"])
        .env("MEMLOCK_CASE", case)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("1 passed"), "case {case}:\n{text}");
    out.status.success()
}

/// Registrations of application memory are charged to `RLIMIT_MEMLOCK` as the kernel charges
/// them (by pages spanned, per process, given back at deregistration), `ENOMEM` past it for a
/// process without `CAP_IPC_LOCK`; with the capability, or `RDMA_EMU_MEMLOCK=off`, there is
/// no limit.
#[test]
fn registration_is_charged_to_rlimit_memlock() {
    assert!(in_child("limited"));
    assert!(in_child("off"));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(in_child("capable"));
    } else {
        eprintln!("not root: the CAP_IPC_LOCK case is skipped");
    }
}

/// The child's side of [`registration_is_charged_to_rlimit_memlock`] (does nothing unless
/// `MEMLOCK_CASE` says which case to run).
#[test]
fn memlock_child() {
    let Ok(case) = std::env::var("MEMLOCK_CASE") else { return };
    const PAGE: usize = 4096;
    const LIMIT: usize = 16 * PAGE;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit take one rlimit that lives across the calls (lowering
    // the soft limit is always allowed).
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim), 0);
        lim.rlim_cur = LIMIT as u64;
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
    }
    let f = Fabric::new(FabricConfig { memlock: case != "off", ..Default::default() });
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    // Page-aligned memory, four times the limit.
    let layout = std::alloc::Layout::from_size_align(4 * LIMIT, PAGE).unwrap();
    // SAFETY: a non-zero size.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buf.is_null());
    let reg = |off: usize, len: usize| {
        // SAFETY: `buf` is allocated for 4 * LIMIT bytes until the end of this function,
        // after every MR is dropped.
        let mem = unsafe { RawMemory::new(buf.add(off), len) };
        pd.reg_mr_raw(mem, buf as u64 + off as u64, AccessFlags::LOCAL_WRITE)
    };
    if case == "limited" {
        // 15 pages, then a 2-byte range across a page boundary (2 pages) is one too many,
        // while 1 byte in one page fits exactly.
        let a = reg(0, LIMIT - PAGE).unwrap();
        let e = reg(LIMIT + PAGE - 1, 2).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOMEM, "{e}");
        let hint = e.hint().expect("a registration past the limit explains itself");
        assert!(hint.contains("RLIMIT_MEMLOCK (64 KiB)"), "{hint}");
        let b = reg(LIMIT + 8, 1).unwrap();
        // The same pages registered again are charged again, as the kernel charges them.
        assert_eq!(reg(0, PAGE).unwrap_err().errno(), Errno::ENOMEM);
        // Deregistration gives the pages back.
        a.dereg().unwrap();
        let c = reg(0, LIMIT - PAGE).unwrap();
        drop((b, c));
        // Dropping the last handle does too: the whole limit is free again.
        let d = reg(2 * LIMIT, LIMIT).unwrap();
        drop(d);
    } else {
        // No limit: four times it.
        let a = reg(0, 4 * LIMIT).unwrap();
        let b = reg(0, 4 * LIMIT).unwrap();
        drop((a, b));
    }
    drop(pd);
    // SAFETY: allocated above with this layout; every MR over it is gone.
    unsafe { std::alloc::dealloc(buf, layout) };
}

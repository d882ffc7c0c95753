//! Helpers shared by the integration tests: connected RC pairs and bounded waits.
#![allow(dead_code)]

pub mod counting;
pub mod raw;

use std::time::{Duration, Instant};

use rdma_emu::*;

pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

pub struct Node {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr,
}

pub fn cap(depth: u32) -> QpCap {
    QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// How many random cases a property test runs: `default` (what CI runs), or proptest's own
/// `PROPTEST_CASES` for a longer run by hand (docs/reliability.md lists them).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The attributes an RC QP must be given on its way to RTR (IBA 11.2.4.2, as rdma-core checks).
pub const RC_RTR_MASK: QpAttrMask = QpAttrMask::STATE
    .union(QpAttrMask::AV)
    .union(QpAttrMask::PATH_MTU)
    .union(QpAttrMask::DEST_QPN)
    .union(QpAttrMask::RQ_PSN)
    .union(QpAttrMask::MAX_DEST_RD_ATOMIC)
    .union(QpAttrMask::MIN_RNR_TIMER);

/// A QP on `pd` whose send and receive completions go to `cq`, with `depth` WRs each way.
pub fn new_qp(pd: &Pd, cq: &Cq, qp_type: QpType, depth: u32, sq_sig_all: bool) -> Qp {
    let attr = QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        cap: cap(depth),
        sq_sig_all,
        srq: None,
        max_tso_header: 0,
        create_flags: QpCreateFlags::empty(),
    };
    pd.create_qp(&attr).unwrap()
}

/// A UD QP of `n` with Q_Key `qkey` and `depth` WRs each way, taken to RTS.
pub fn ud_qp(n: &Node, qkey: u32, depth: u32) -> Qp {
    let qp = new_qp(&n.pd, &n.cq, QpType::UD, depth, true);
    use QpAttrMask as M;
    let a = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey, ..Default::default() };
    qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    let rts = QpAttr { qp_state: QpState::RTS, sq_psn: 7, ..Default::default() };
    qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
    qp
}

pub fn node_on(dev: &Device, mr_len: usize) -> Node {
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None, 0).unwrap();
    let mr = pd.reg_mr(mr_len, ALL_ACCESS).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(64))).unwrap();
    Node { ctx, pd, cq, qp, mr }
}

pub fn connect(a: &Qp, b: &Qp, pa: &RcParams, pb: &RcParams) {
    a.connect(0x10, &b.endpoint(0x20), pa).unwrap();
    b.connect(0x20, &a.endpoint(0x10), pb).unwrap();
}

/// Two nodes on two devices of one fabric, connected with default parameters.
pub fn pair(profile: Profile) -> (Fabric, Node, Node) {
    pair_with(profile, &RcParams::default(), &RcParams::default())
}

pub fn pair_with(profile: Profile, pa: &RcParams, pb: &RcParams) -> (Fabric, Node, Node) {
    let fabric = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
    let devs = fabric.devices();
    let a = node_on(&devs[0], 1 << 16);
    let b = node_on(&devs[1], 1 << 16);
    connect(&a.qp, &b.qp, pa, pb);
    (fabric, a, b)
}

pub fn sge(mr: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: mr.addr() + off as u64, length: len as u32, lkey: mr.lkey() }
}

/// Polls until `n` completions arrived. Gives up after 20 s so that a bug fails the test
/// instead of hanging it (a guard, not a timing assertion).
pub fn wait_n(cq: &Cq, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < n {
        if let Some(wc) = cq.poll_one() {
            out.push(wc);
        } else {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {n} completions, got {out:?}"
            );
            std::thread::yield_now();
        }
    }
    out
}

pub fn wait1(cq: &Cq) -> Wc {
    wait_n(cq, 1).pop().unwrap()
}

/// Asserts that no completion is queued.
pub fn assert_empty(cq: &Cq) {
    assert_eq!(cq.poll_one(), None);
}

pub fn post_recv(qp: &Qp, wr_id: u64, sges: &[Sge]) {
    qp.post_recv(&RecvWr { wr_id, sg_list: sges }).unwrap();
}

/// Whether the page at `p` is mapped from one of the files registered memory moves into on a
/// host fabric.
pub fn moved(p: *const u8) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let hex = |h| u64::from_str_radix(h, 16).unwrap();
    maps.lines().any(|l| {
        let (start, end) = l.split(' ').next().unwrap().split_once('-').unwrap();
        (hex(start)..hex(end)).contains(&(p as u64)) && l.contains("/memfd:rdma-emu-mr")
    })
}

/// A fabric joined to a host fabric in a directory of the test's own (`tag` and the process's
/// id name it; the caller removes it), as two processes' fabrics are.
pub fn host_fabric(tag: &str) -> (Fabric, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("rdma-emu-{tag}-{}", std::process::id()));
    let host = Some(dir.to_str().unwrap().to_owned());
    (Fabric::new(FabricConfig { host, ..Default::default() }), dir)
}

/// A fresh private anonymous mapping of `len` bytes with protection `prot`.
pub fn mapped(len: usize, prot: libc::c_int) -> *mut u8 {
    // SAFETY: a fresh mapping the kernel places, aliasing nothing.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

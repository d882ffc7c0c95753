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

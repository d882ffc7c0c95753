//! The connected RC pair the in-process goals run on (and `hop_split`, which breaks G4's round
//! trip down on the very same pair), and the pinning of their threads.

use rdma_emu::*;

/// Pins the calling thread to `cpu`.
pub(crate) fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; the call reads
    // it for the current thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A connected RC pair on two devices of one fabric, with one MR each of `len` bytes.
pub(crate) struct Pair {
    pub(crate) _f: Fabric,
    pub(crate) a: Side,
    pub(crate) b: Side,
}

pub(crate) struct Side {
    pub(crate) ctx: Context,
    pub(crate) cq: Cq,
    pub(crate) qp: Qp,
    pub(crate) mr: Mr,
    pub(crate) ch: CompChannel,
}

pub(crate) fn pair(len: usize) -> Pair {
    let f = Fabric::new(FabricConfig { devices: 2, profile: Profile::Full, ..Default::default() });
    let devs = f.devices();
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mk = |d: &Device| {
        let ctx = d.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(4096, Some(&ch), 0).unwrap();
        let mr = pd.reg_mr(len, access).unwrap();
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap();
        Side { ctx, cq, qp, mr, ch }
    };
    let (a, b) = (mk(&devs[0]), mk(&devs[1]));
    let p = RcParams::default();
    a.qp.connect(1, &b.qp.endpoint(2), &p).unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), &p).unwrap();
    Pair { _f: f, a, b }
}

pub(crate) fn sge(mr: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: mr.addr() + off as u64, length: len as u32, lkey: mr.lkey() }
}

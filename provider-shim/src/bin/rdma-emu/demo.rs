//! `rdma-emu demo`: the emulator end to end. Two devices on the in-process fabric, two
//! connected RC QPs, a SEND/RECV ping-pong, RDMA WRITE and READ with verification, and both
//! atomics; prints what happened and the rates it saw.

use std::time::Instant;

use rdma_emu::*;

struct Node {
    name: String,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

const BUF: usize = 1 << 20;

fn node(dev: &Device) -> Result<Node> {
    let ctx = dev.open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(256, None, 0)?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(BUF, access)?;
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap))?;
    Ok(Node { name: dev.name().to_string(), cq, qp, mr })
}

fn wait(cq: &Cq) -> Wc {
    loop {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::SUCCESS, "completion failed: {wc:?}");
            return wc;
        }
        std::hint::spin_loop();
    }
}

fn sge(mr: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: mr.addr() + off as u64, length: len as u32, lkey: mr.lkey() }
}

pub fn run() -> Result<()> {
    let fabric =
        Fabric::new(FabricConfig { devices: 2, profile: Profile::Full, ..Default::default() });
    let devs = fabric.devices();
    for d in &devs {
        let p = d.query_port(1)?;
        println!(
            "device {}  guid {:016x}  port 1: {:?} lid {} mtu {:?} link {:?}",
            d.name(),
            d.guid(),
            p.state,
            p.lid,
            p.active_mtu,
            p.link_layer
        );
    }
    let a = node(&devs[0])?;
    let b = node(&devs[1])?;
    let params = RcParams::default();
    a.qp.connect(0x100, &b.qp.endpoint(0x200), &params)?;
    b.qp.connect(0x200, &a.qp.endpoint(0x100), &params)?;
    println!(
        "connected RC QP {:#x} on {} <-> QP {:#x} on {} ({:?} / {:?})",
        a.qp.qp_num(),
        a.name,
        b.qp.qp_num(),
        b.name,
        a.qp.state(),
        b.qp.state()
    );

    // Ping-pong: 8-byte SENDs, each side waits for the other's message before replying.
    let iters = 100_000u32;
    let (sa, sb) = ([sge(&a.mr, 0, 8)], [sge(&b.mr, 0, 8)]);
    let (ra, rb) = ([sge(&a.mr, 64, 8)], [sge(&b.mr, 64, 8)]);
    b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: &rb })?;
    a.qp.post_recv(&RecvWr { wr_id: 1, sg_list: &ra })?;
    let t = Instant::now();
    for i in 0..iters {
        a.mr.write_u64(0, i as u64)?;
        a.qp.post_send(&SendWr::send(i as u64, &sa))?;
        let wc = wait(&b.cq);
        assert_eq!(wc.opcode, WcOpcode::RECV);
        assert_eq!(b.mr.read_u64(64)?, i as u64);
        b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: &rb })?;
        b.qp.post_send(&SendWr::send(i as u64, &sb))?;
        wait(&a.cq);
        a.qp.post_recv(&RecvWr { wr_id: 1, sg_list: &ra })?;
    }
    let rtt = t.elapsed().as_nanos() as f64 / iters as f64;
    println!("ping-pong: {iters} round trips of 8-byte SEND/RECV, {rtt:.0} ns per round trip");

    // RDMA WRITE 1 MiB (minus the header area), then READ it back into another place.
    let len = BUF / 2;
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write(BUF / 2, &pattern)?;
    let reps = 200;
    let t = Instant::now();
    for i in 0..reps {
        let src = [sge(&a.mr, BUF / 2, len)];
        a.qp.post_send(&SendWr::write(i, &src, b.mr.addr(), b.mr.rkey()).signaled())?;
        assert_eq!(wait(&a.cq).opcode, WcOpcode::RDMA_WRITE);
    }
    let secs = t.elapsed().as_secs_f64();
    let mut got = vec![0u8; len];
    b.mr.read(0, &mut got)?;
    assert_eq!(got, pattern, "RDMA WRITE data differs");
    println!(
        "RDMA WRITE: {reps} x {} KiB verified, {:.2} GB/s",
        len / 1024,
        (reps as usize * len) as f64 / secs / 1e9
    );
    b.mr.write(0, &[0u8; 64])?;
    let dst = [sge(&b.mr, 0, 4096)];
    b.qp.post_send(&SendWr::read(7, &dst, a.mr.addr() + (BUF / 2) as u64, a.mr.rkey()).signaled())?;
    let wc = wait(&b.cq);
    let mut back = vec![0u8; 4096];
    b.mr.read(0, &mut back)?;
    assert_eq!(back, pattern[..4096], "RDMA READ data differs");
    println!("RDMA READ: {} bytes read back and verified (opcode {:?})", wc.byte_len, wc.opcode);

    // Atomics on a counter in B's memory.
    let counter = b.mr.addr() + 4096;
    b.mr.write_u64(4096, 0)?;
    let n = 100_000u64;
    let res = [sge(&a.mr, 128, 8)];
    let t = Instant::now();
    for i in 0..n {
        a.qp.post_send(&SendWr::fetch_add(i, &res, counter, b.mr.rkey(), 1).signaled())?;
        wait(&a.cq);
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(b.mr.read_u64(4096)?, n);
    assert_eq!(a.mr.read_u64(128)?, n - 1);
    a.qp.post_send(&SendWr::cmp_swap(0, &res, counter, b.mr.rkey(), n, 42).signaled())?;
    wait(&a.cq);
    assert_eq!(a.mr.read_u64(128)?, n);
    assert_eq!(b.mr.read_u64(4096)?, 42);
    println!(
        "atomics: {n} FETCH_ADDs -> counter {n} ({:.2} Mops/s), CMP_SWAP {n} -> 42 ok",
        n as f64 / secs / 1e6
    );
    println!("demo ok");
    Ok(())
}

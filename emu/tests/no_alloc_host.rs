//! Across the host fabric (two fabrics joined as two processes are, through shared-memory
//! rings), a small SEND allocates nothing in steady state: not its request, not its ACK, not
//! their delivery. A counting global allocator watches SENDs with and without immediate data,
//! each posted, taken in and polled on one thread after a warm-up. (One test in this binary,
//! so no other test's thread allocates meanwhile.)
//!
//! What still allocates once per request: a payload of 23 bytes to 2 KiB, copied out of the
//! ring to free its record at once (larger ones are read in place); a WRITE or READ, whose
//! ring record is kept, shared, until its responder begins it (see `ipc::ring::Ticket`).

mod common;
use common::{Node, connect, counting::Counting, node_on, sge};
use rdma_emu::*;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Polls both CQs until the SEND's completion (which its ACK brings) and its receive's are
/// in: an empty poll of a CQ moves its fabric's rings, as an application's does.
fn complete(a: &Node, b: &Node, len: u32) {
    let (mut sent, mut received) = (false, false);
    while !(sent && received) {
        if let Some(wc) = b.cq.poll_one() {
            assert_eq!((wc.status, wc.byte_len), (WcStatus::SUCCESS, len), "{wc:?}");
            received = true;
        }
        if let Some(wc) = a.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
            sent = true;
        }
    }
}

/// A SEND of `len` bytes and one with immediate data, each completed before the next.
fn round(a: &Node, b: &Node, len: u32) {
    let recv = [sge(&b.mr, 1024, 256)];
    let src = [sge(&a.mr, 0, len as usize)];
    for wr in [SendWr::send(5, &src).signaled(), SendWr::send(6, &src).signaled().with_imm(9)] {
        b.qp.post_recv(&RecvWr { wr_id: 7, sg_list: &recv }).unwrap();
        a.qp.post_send(&wr).unwrap();
        complete(a, b, len);
    }
}

/// The fewest allocations of three windows of 1,000 rounds of `len`-byte SENDs: one per SEND
/// shows in every window (2,000 or more); a one-off of a fabric's own threads (a reader
/// waking) in one window only.
fn allocs_in_rounds(a: &Node, b: &Node, len: u32) -> u64 {
    let window = || {
        let before = Counting::allocs();
        for _ in 0..1000 {
            round(a, b, len);
        }
        Counting::allocs() - before
    };
    (0..3).map(|_| window()).min().unwrap()
}

#[test]
fn steady_state_sends_across_the_host_fabric_allocate_nothing() {
    let dir = std::env::temp_dir().join(format!("rdma-emu-no-alloc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg =
        || FabricConfig { host: Some(dir.to_str().unwrap().to_owned()), ..Default::default() };
    let (fa, fb) = (Fabric::new(cfg()), Fabric::new(cfg()));
    let (a, b) = (node_on(&fa.devices()[0], 4096), node_on(&fb.devices()[0], 4096));
    connect(&a.qp, &b.qp, &RcParams::default(), &RcParams::default());
    let mut payload = [0u8; 200];
    payload.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
    a.mr.write(0, &payload).unwrap();
    for len in [8, 200] {
        for _ in 0..100 {
            round(&a, &b, len);
        }
    }
    let mut got = [0u8; 200];
    b.mr.read(1024, &mut got).unwrap();
    assert_eq!(got, payload, "the SENDs landed");
    let small = allocs_in_rounds(&a, &b, 8);
    assert_eq!(small, 0, "{small} allocations in 2,000 SENDs of 8 bytes");
    let larger = allocs_in_rounds(&a, &b, 200);
    assert!(larger <= 2000, "{larger} allocations in 2,000 SENDs of 200 bytes");
    drop((a, b, fa, fb));
    let _ = std::fs::remove_dir_all(&dir);
}

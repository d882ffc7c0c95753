//! Device memory: allocation limits, word-granular copies, zero-based MRs that RDMA reaches,
//! and the busy / freed rules.

mod common;
use common::*;
use rdma_emu::*;

const DM_ACCESS: AccessFlags = ALL_ACCESS.union(AccessFlags::ZERO_BASED);

fn errno<T: std::fmt::Debug>(r: Result<T>) -> Errno {
    r.unwrap_err().errno()
}

#[test]
fn allocations_are_bounded_by_the_device_memory() {
    let (_f, a, _b) = pair(Profile::Full);
    let max = a.ctx.query_device().max_dm_size;
    assert_eq!(max, 256 * 1024);
    assert_eq!(errno(a.ctx.alloc_dm(0, 0)), Errno::EINVAL);
    assert_eq!(errno(a.ctx.alloc_dm(max + 1, 0)), Errno::EINVAL);
    assert_eq!(errno(a.ctx.alloc_dm(64, 13)), Errno::EINVAL);
    let big = a.ctx.alloc_dm(max - 64, 12).unwrap();
    let small = a.ctx.alloc_dm(64, 0).unwrap();
    assert_eq!(errno(a.ctx.alloc_dm(4, 0)), Errno::ENOMEM, "the device's memory is all taken");
    // The memory is the device's, not the context's: another context sees it taken too.
    let other = a.ctx.device().open().unwrap();
    assert_eq!(errno(other.alloc_dm(4, 0)), Errno::ENOMEM);
    small.free().unwrap();
    assert_eq!(errno(small.free()), Errno::EINVAL);
    drop(small);
    let again = other.alloc_dm(64, 6).unwrap();
    assert_eq!((again.length(), big.length()), (64, max - 64));
    // rxe has none.
    let (_f, r, _rb) = pair(Profile::Rxe);
    assert_eq!(r.ctx.query_device().max_dm_size, 0);
    assert_eq!(errno(r.ctx.alloc_dm(64, 0)), Errno::EOPNOTSUPP);
}

#[test]
fn copies_move_whole_words_inside_the_allocation() {
    let (_f, a, _b) = pair(Profile::Full);
    let dm = a.ctx.alloc_dm(64, 0).unwrap();
    let mut back = [0u8; 8];
    dm.copy_from(0, &mut back).unwrap();
    assert_eq!(back, [0; 8], "new device memory reads as zeros");
    dm.copy_to(56, b"lastword").unwrap();
    dm.copy_from(56, &mut back).unwrap();
    assert_eq!(&back, b"lastword");
    assert_eq!(errno(dm.copy_to(60, b"12345678")), Errno::EFAULT, "past the end");
    assert_eq!(errno(dm.copy_from(u64::MAX - 3, &mut back)), Errno::EFAULT);
    assert_eq!(errno(dm.copy_to(2, b"1234")), Errno::EINVAL, "offset not a word");
    assert_eq!(errno(dm.copy_from(0, &mut back[..6])), Errno::EINVAL, "length not words");
    dm.free().unwrap();
    assert_eq!(errno(dm.copy_to(0, b"1234")), Errno::EINVAL, "freed");
}

#[test]
fn a_zero_based_mr_over_device_memory_takes_rdma_and_keeps_it_busy() {
    let (_f, a, b) = pair(Profile::Full);
    let dm = b.ctx.alloc_dm(4096, 0).unwrap();
    // The MR rules: zero-based, data access only, inside the allocation, same device.
    assert_eq!(errno(dm.reg_mr(&b.pd, 0, 64, ALL_ACCESS)), Errno::EINVAL);
    let bind = DM_ACCESS | AccessFlags::MW_BIND;
    assert_eq!(errno(dm.reg_mr(&b.pd, 0, 64, bind)), Errno::EINVAL);
    assert_eq!(errno(dm.reg_mr(&b.pd, 4000, 128, DM_ACCESS)), Errno::EINVAL);
    assert_eq!(errno(dm.reg_mr(&a.pd, 0, 64, DM_ACCESS)), Errno::EINVAL);
    let mr = dm.reg_mr(&b.pd, 1024, 1024, DM_ACCESS).unwrap();
    assert_eq!((mr.addr(), mr.length()), (0, 1024));
    assert_ne!(mr.rkey(), 0);

    // A WRITE lands at the MR's address 8, which is byte 1032 of the device memory.
    a.mr.write(0, b"to device memory").unwrap();
    let (sg, sg8a, sg8b) = ([sge(&a.mr, 0, 16)], [sge(&a.mr, 128, 8)], [sge(&a.mr, 256, 8)]);
    let w = SendWr::write(1, &sg, 8, mr.rkey());
    a.qp.post_send(&w.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut got = [0u8; 16];
    dm.copy_from(1032, &mut got).unwrap();
    assert_eq!(&got, b"to device memory");
    // An atomic on it, and a READ back.
    dm.copy_to(1024 + 64, &5u64.to_ne_bytes()).unwrap();
    let fa = SendWr::fetch_add(2, &sg8a, 64, mr.rkey(), 10);
    a.qp.post_send(&fa.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(a.mr.read_u64(128).unwrap(), 5);
    let rd = SendWr::read(3, &sg8b, 64, mr.rkey());
    a.qp.post_send(&rd.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(a.mr.read_u64(256).unwrap(), 15);
    // Past the MR (not past the device memory) is a remote access error.
    let past = SendWr::write(4, &sg, 1020, mr.rkey());
    a.qp.post_send(&past.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);

    // The MR keeps the memory busy; once it is gone the memory can be freed.
    assert_eq!(errno(dm.free()), Errno::EBUSY);
    mr.dereg().unwrap();
    dm.free().unwrap();
}

#[test]
fn device_memory_is_a_local_sge_too() {
    let (_f, a, b) = pair(Profile::Full);
    let dm = a.ctx.alloc_dm(256, 0).unwrap();
    let mr = dm.reg_mr(&a.pd, 0, 256, DM_ACCESS).unwrap();
    dm.copy_to(0, b"sent from device memory!").unwrap();
    post_recv(&b.qp, 7, &[sge(&b.mr, 0, 64)]);
    let s = Sge { addr: 0, length: 24, lkey: mr.lkey() };
    a.qp.post_send(&SendWr::send(1, &[s]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&b.cq).byte_len, 24);
    let mut got = [0u8; 24];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"sent from device memory!");
}

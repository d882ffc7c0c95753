//! Registering memory the application never touched on a fabric whose MRs move into shared
//! memory. (One test per binary: it reads the process's peak of resident memory.)

mod common;

use common::{host_fabric, mapped, moved};
use rdma_emu::*;

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

/// A field of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// 64 MiB the application never touched, registered writable: it moves without a page of it
/// allocated on the way (the peak of resident memory stays put; pinning it for writing
/// before the move allocated all 64 MiB), and the MR reads zeros and takes writes. Memory
/// that cannot be pinned for writing still fails with `EFAULT`, where only the partial pages
/// at the region's ends are read-only too, and the pages that had moved come back with
/// their bytes.
#[test]
fn memory_never_touched_is_registered_without_allocating_it() {
    let (f, dir) = host_fabric("untouched");
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;

    let n = 64 * MIB;
    let p = mapped(n, libc::PROT_READ | libc::PROT_WRITE);
    // The peak is reset to what is resident now.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = status_bytes("VmRSS:");
    // SAFETY: our mapping, `n` bytes, deregistered before it is unmapped.
    let mr = pd.reg_mr_raw(unsafe { RawMemory::new(p, n) }, p as u64, access).unwrap();
    let grew = status_bytes("VmHWM:").saturating_sub(before);
    assert!(moved(p), "the memory moved into shared memory");
    assert!(grew < 8 * MIB, "{} MiB allocated registering 64 MiB never touched", grew / MIB);
    let mut got = [1u8; 8];
    mr.read(n / 2, &mut got).unwrap();
    assert_eq!(got, [0; 8]);
    mr.write(n / 2, b"written!").unwrap();
    // SAFETY: inside our mapping, which the MR's write went to.
    assert_eq!(unsafe { std::slice::from_raw_parts(p.add(n / 2), 8) }, b"written!");
    mr.dereg().unwrap();
    // SAFETY: our mapping.
    unsafe { libc::munmap(p.cast(), n) };

    // Pages of which only the first and the last are read-only, registered from inside the
    // first to inside the last: the writable pages between move, the ends fail the pin.
    let m = 16 * MIB;
    let q = mapped(m, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: inside our mapping.
    unsafe { q.add(PAGE + 5).write(7) };
    // SAFETY: the mapping's first and last pages, ours.
    unsafe {
        assert_eq!(libc::mprotect(q.cast(), PAGE, libc::PROT_READ), 0);
        assert_eq!(libc::mprotect(q.add(m - PAGE).cast(), PAGE, libc::PROT_READ), 0);
    }
    let (from, len) = (PAGE / 2, m - PAGE);
    // SAFETY: inside our mapping; the registration fails.
    let mem = unsafe { RawMemory::new(q.add(from), len) };
    let Err(e) = pd.reg_mr_raw(mem, q as u64 + from as u64, access) else {
        panic!("registered writable with read-only pages at its ends");
    };
    assert_eq!(e.errno(), Errno::EFAULT, "{e}");
    assert!(!moved(q.wrapping_add(PAGE)), "the writable pages came back");
    // SAFETY: inside our mapping.
    assert_eq!(unsafe { q.add(PAGE + 5).read() }, 7, "with their bytes");
    // Read-only rights need no write: the same range registers.
    // SAFETY: as above; deregistered before the mapping goes.
    let mem = unsafe { RawMemory::new(q.add(from), len) };
    let mr = pd.reg_mr_raw(mem, q as u64 + from as u64, AccessFlags::REMOTE_READ).unwrap();
    mr.dereg().unwrap();
    // SAFETY: our mapping.
    unsafe { libc::munmap(q.cast(), m) };
    let _ = std::fs::remove_dir_all(&dir);
}

//! Registered memory moved into shared memory on a host fabric, at the limit of ranges moved
//! at once. (One test per binary: the limit is the process's.)

mod common;

use common::{host_fabric, mapped, moved};
use rdma_emu::*;

const PAGE: usize = 4096;
/// Ranges moved at once at most (`shared_mem::MAX_LIVE`).
const MAX_LIVE: usize = 64;
/// How often a registration that finds them all in use looks for one the application
/// unmapped (`shared_mem::FULL_LOOKS`).
const FULL_LOOKS: usize = 64;

fn anon_page() -> *mut u8 {
    mapped(PAGE, libc::PROT_READ | libc::PROT_WRITE)
}

/// With every range in use, the memory of a new MR stays where it is; once the application
/// unmaps the memory of an MR it never deregistered, a registration finds that range gone
/// (registrations look for such ranges only now and then, reading the process's mappings) and
/// moves its own memory in its place. The bytes of each MR stay what the application wrote.
#[test]
fn an_unmapped_leaked_range_gives_its_place_among_the_moved_back() {
    let (f, dir) = host_fabric("moved");
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let pages: Vec<*mut u8> = (0..MAX_LIVE + 1 + FULL_LOOKS).map(|_| anon_page()).collect();
    let reg = |i: usize| {
        // SAFETY: page `i` is ours and mapped (the one unmapped below is never registered
        // again).
        unsafe { pages[i].write_bytes(i as u8, PAGE) };
        // SAFETY: as above; the MR is deregistered before the test ends.
        let mem = unsafe { RawMemory::new(pages[i], PAGE) };
        pd.reg_mr_raw(mem, pages[i] as u64, access).unwrap()
    };
    let mut mrs: Vec<_> = (0..MAX_LIVE).map(reg).collect();
    assert!(pages[..MAX_LIVE].iter().all(|&p| moved(p)), "each of the first {MAX_LIVE} moved");
    mrs.push(reg(MAX_LIVE));
    assert!(!moved(pages[MAX_LIVE]), "every range in use: left where it is");
    // The application unmaps the memory under the first MR, never deregistered (a leak).
    // SAFETY: our mapping, not touched again.
    assert_eq!(unsafe { libc::munmap(pages[0].cast(), PAGE) }, 0);
    let moved_again = (MAX_LIVE + 1..pages.len()).any(|i| {
        mrs.push(reg(i));
        moved(pages[i])
    });
    assert!(moved_again, "none of {FULL_LOOKS} later MRs took the place of the range gone");
    for (i, &p) in pages.iter().enumerate().skip(1).take(mrs.len() - 1) {
        // SAFETY: still mapped: only page 0 was unmapped.
        let bytes = unsafe { std::slice::from_raw_parts(p, PAGE) };
        assert!(bytes.iter().all(|&b| b == i as u8), "page {i}'s bytes");
    }
    for mr in mrs {
        mr.dereg().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

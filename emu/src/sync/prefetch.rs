//! Cache-line prefetches: hints that start bringing a line another core wrote into this
//! core's cache before the instruction that needs it.
//!
//! In a ping-pong between two threads, each hop's post meets lines the other core wrote last
//! (its own QP's lock, which the peer's post took as its target's; the peer QP's lock; the
//! receive the peer posted), and the locks are taken by compare-and-swap, which lets no later
//! load start before it completes: taken in turn, the transfers add up. Prefetched before the
//! first lock, they overlap. A prefetch never faults and changes nothing the program sees:
//! an address gone stale costs only the hint.
#![allow(unsafe_code)]

/// Starts bringing the line at `p` in, to be read.
#[inline(always)]
pub(crate) fn for_read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` reads nothing the program sees and cannot fault, whatever `p` is.
    unsafe {
        std::arch::asm!("prefetcht0 [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Starts bringing the line at `p` in, to be written: owned by this core, so that the store
/// to come needs no second transfer (`prefetchw`; processors without it take it as a no-op).
#[inline(always)]
pub(crate) fn for_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `for_read`.
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

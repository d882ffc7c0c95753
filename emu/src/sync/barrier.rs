//! Asymmetric fences: [`light`] on the frequent side, [`heavy`]
//! on the rare one; together they order like two sequentially consistent fences.
//!
//! Linux's `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every thread of the process
//! that is running pass a full barrier before it returns (and a thread not running passed one
//! when it was switched out), so the light side is a compiler fence. Where the kernel lacks it
//! (or a tool such as valgrind does not pass the call through), and in ThreadSanitizer builds
//! (it cannot see the barrier), both sides are real fences.
//! (The `membarrier` crate does this too, but it depends on the Windows API crates on every
//! target, and those fail to link here.)

use std::sync::atomic::{AtomicU8, Ordering, compiler_fence, fence};

/// From linux/membarrier.h.
const QUERY: libc::c_int = 0;
const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

const UNKNOWN: u8 = 0;
const SYSCALL: u8 = 1;
const FENCES: u8 = 2;
static HOW: AtomicU8 = AtomicU8::new(UNKNOWN);

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0) }
}

/// How barriers are made, decided once (before any light barrier relies on it).
#[cold]
fn decide() -> u8 {
    let supported = membarrier(QUERY);
    let how = if cfg!(not(feature = "tsan"))
        && supported >= 0
        && supported & libc::c_long::from(PRIVATE_EXPEDITED) != 0
        && membarrier(REGISTER_PRIVATE_EXPEDITED) == 0
    {
        SYSCALL
    } else {
        FENCES
    };
    // Racing deciders decide alike.
    HOW.store(how, Ordering::SeqCst);
    how
}

#[inline]
fn how() -> u8 {
    match HOW.load(Ordering::Acquire) {
        UNKNOWN => decide(),
        how => how,
    }
}

/// The frequent side: one load and one compare where the system call is used (a work request
/// passes a dozen of these, a cross-process message three dozen).
#[inline]
pub(crate) fn light() {
    if HOW.load(Ordering::Acquire) == SYSCALL {
        compiler_fence(Ordering::SeqCst);
    } else {
        light_undecided_or_fenced();
    }
}

#[cold]
#[inline(never)]
fn light_undecided_or_fenced() {
    if how() == SYSCALL {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The rare side.
pub(crate) fn heavy() {
    if how() != SYSCALL {
        fence(Ordering::SeqCst);
        return;
    }
    // A child of `fork` may have to register again (its memory is a new mm).
    let done = membarrier(PRIVATE_EXPEDITED) == 0
        || membarrier(REGISTER_PRIVATE_EXPEDITED) == 0 && membarrier(PRIVATE_EXPEDITED) == 0;
    if !done {
        // Light barriers rely on it: without it they would order nothing.
        std::process::abort();
    }
}

//! Asymmetric fences: [`light`] on the frequent side, [`heavy`]
//! on the rare one; together they order like two sequentially consistent fences.
//!
//! Linux's `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every thread of the process
//! that is running pass a full barrier before it returns (and a thread not running passed one
//! when it was switched out), so the light side is a compiler fence: no load or compare either
//! (a work request passes a dozen light sides, a cross-process message three dozen). Where the
//! kernel lacks the call (or a tool such as valgrind does not pass it through), the heavy side
//! is a fence and [`asymmetric`] says so: the objects whose ways rely on a bare light side
//! then take their symmetric ways from their first use (a bias is never granted, a reader
//! takes a shared count, a CQ fences as if armed), and the few sites both ways pass use
//! [`light_any`]. In ThreadSanitizer builds (it cannot see the barrier) both sides are
//! fences.
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
    // The test of the symmetric ways decides, in a process of its own, as a kernel without the
    // call would.
    #[cfg(test)]
    if std::env::var_os(test::WITHOUT_MEMBARRIER).is_some() {
        HOW.store(FENCES, Ordering::SeqCst);
        return FENCES;
    }
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

/// Decides at load, while the process most likely has one thread: the kernel registers a
/// process of one thread at once, and one of several only after an RCU grace period
/// (`synchronize_rcu`, ~15 ms on this VM), which the first object's creation paid, in every
/// process (`cmtime`'s first `create qp` 15.8 ms, its second 8 us).
#[used]
#[unsafe(link_section = ".init_array")]
static DECIDE_AT_LOAD: extern "C" fn() = decide_at_load;

extern "C" fn decide_at_load() {
    how();
}

#[inline]
fn how() -> u8 {
    match HOW.load(Ordering::Acquire) {
        UNKNOWN => decide(),
        how => how,
    }
}

/// Whether the light side alone is a fence (ThreadSanitizer builds).
const LIGHT_IS_FENCE: bool = cfg!(feature = "tsan");

/// Whether the ways that rely on a bare [`light`] side may be taken: the heavy side is the
/// kernel's barrier (or the light side a fence). Decided once, as the library loads.
#[inline]
pub(crate) fn asymmetric() -> bool {
    LIGHT_IS_FENCE || how() == SYSCALL
}

/// The frequent side, where only objects on their asymmetric ways pass (see [`asymmetric`]):
/// a compiler fence.
#[inline(always)]
pub(crate) fn light() {
    if LIGHT_IS_FENCE {
        fence(Ordering::SeqCst);
    } else {
        compiler_fence(Ordering::SeqCst);
    }
}

/// The frequent side at a site that objects on either way pass: a compiler fence after one
/// load and compare where the kernel's barrier is used, a fence where it is not.
#[inline]
pub(crate) fn light_any() {
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
    #[cfg(test)]
    test::HEAVY.with(|n| n.set(n.get() + 1));
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

#[cfg(test)]
pub(crate) mod test {
    use std::sync::Arc;

    use crate::{
        engine::testkit,
        sync::{ReadMostly, lock::Lock},
        *,
    };

    std::thread_local! {
        /// The heavy barriers this thread issued.
        pub(crate) static HEAVY: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    /// How many heavy barriers `f` issued on this thread.
    pub(crate) fn heavy_in(f: impl FnOnce()) -> u32 {
        let before = HEAVY.get();
        f();
        HEAVY.get() - before
    }

    /// Set in the process the test below runs itself in.
    pub(super) const WITHOUT_MEMBARRIER: &str = "RDMA_EMU_TEST_WITHOUT_MEMBARRIER";

    /// Set in the process the test below runs itself in.
    const FRESH: &str = "RDMA_EMU_TEST_FRESH_PROCESS";

    /// Runs the test `name` of this binary again, alone, in a process of its own with `var`
    /// set (where the way is decided anew), and asserts that it passed there.
    #[cfg(not(feature = "tsan"))]
    fn passes_in_a_process_of_its_own(name: &str, var: &str) {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--exact", name, "--test-threads=1"])
            .env(var, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    /// A program that links the library (a Rust one, as this test binary) is registered for
    /// the kernel's barrier as it is loaded, before anything of the library is used: in a
    /// process of its own, where nothing made an object yet, a barrier is allowed at once (the
    /// kernel refuses it, EPERM, to a process not registered).
    #[cfg(not(feature = "tsan"))]
    #[test]
    fn the_process_is_registered_for_the_barrier_at_load() {
        const NAME: &str = "sync::barrier::test::the_process_is_registered_for_the_barrier_at_load";
        if std::env::var_os(FRESH).is_none() {
            passes_in_a_process_of_its_own(NAME, FRESH);
            return;
        }
        let supported = super::membarrier(super::QUERY);
        assert!(supported >= 0 && supported & libc::c_long::from(super::PRIVATE_EXPEDITED) != 0);
        assert_eq!(super::membarrier(super::PRIVATE_EXPEDITED), 0, "registered at load");
    }

    /// Where the kernel lacks the process-wide barrier, no object takes a way whose light side
    /// is a bare compiler fence: a lock's bias is never granted (its first user revokes it),
    /// readers take shared counts, CQs fence from their creation; and they still exclude,
    /// count and complete as they must, two threads at a time. (The way is decided once per
    /// process: the test runs itself again in a child that decides it. ThreadSanitizer builds
    /// fence on both sides and keep the asymmetric ways.)
    #[cfg(not(feature = "tsan"))]
    #[test]
    fn without_the_kernels_barrier_objects_take_their_symmetric_ways() {
        const NAME: &str =
            "sync::barrier::test::without_the_kernels_barrier_objects_take_their_symmetric_ways";
        if std::env::var_os(WITHOUT_MEMBARRIER).is_none() {
            passes_in_a_process_of_its_own(NAME, WITHOUT_MEMBARRIER);
            return;
        }
        assert!(!super::asymmetric());

        let lock = Arc::new(Lock::new(0u64));
        drop(lock.lock());
        // SAFETY: only to look at how it was taken.
        assert!(!unsafe { lock.raw() }.by_its_bias(), "the first user owns no bias");
        let rm = Arc::new(ReadMostly::new((0u64, 0u64)));
        assert!(!rm.read().by_slot(), "a reader counts itself on a shared count");

        // Two threads: increments under the lock are not lost; a reader never sees a write
        // half made.
        let (l2, r2) = (lock.clone(), rm.clone());
        let other = std::thread::spawn(move || {
            for i in 0..50_000u64 {
                *l2.lock() += 1;
                let mut w = r2.write();
                *w = (i, i);
            }
        });
        for _ in 0..50_000 {
            *lock.lock() += 1;
            let v = *rm.read();
            assert_eq!(v.0, v.1);
        }
        other.join().unwrap();
        assert_eq!(*lock.lock(), 100_000);

        let (_f, a, b) = testkit::pair();
        assert!(a.cq.0.fences_always(), "a CQ's producers fence from its creation");
        let src = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        let wr = SendWr::write(7, &src, b.mr.addr(), b.mr.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        let wc = a.cq.poll_one().unwrap();
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::SUCCESS));
    }
}

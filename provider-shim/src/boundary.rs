//! The C boundary: errno, and catching panics so that nothing unwinds into C.

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an exported body; a panic becomes `EIO` and the given failure value instead of
/// unwinding into C.
macro_rules! ffi {
    ($fail:expr, $body:block) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $body)) {
            Ok(v) => v,
            Err(_) => {
                $crate::boundary::set_errno(libc::EIO);
                $fail
            }
        }
    };
}
pub(crate) use ffi;

/// Says once per process why a registration failed with `ENOMEM` past `RLIMIT_MEMLOCK`, or
/// a raw packet QP or flow rule with `EPERM` for want of `CAP_NET_RAW`: the program (UCX,
/// libfabric, perftest) reports only the errno, or asks for an unlimited `ulimit -l`, which a
/// user without root cannot give; the emulator can be told to let them.
fn explain(e: &rdma_emu::Error) {
    static MEMLOCK: std::sync::Once = std::sync::Once::new();
    static NET_RAW: std::sync::Once = std::sync::Once::new();
    if *e == rdma_emu::Error::MEMLOCK {
        MEMLOCK.call_once(|| {
            eprintln!(
                "rdma-emu: a memory registration was refused (ENOMEM): it would lock more \
                 than RLIMIT_MEMLOCK ({} KiB) allows, as the kernel refuses a process without \
                 CAP_IPC_LOCK; raise `ulimit -l`, or set RDMA_EMU_MEMLOCK=off",
                memlock_kib()
            )
        });
    } else if *e == rdma_emu::Error::NET_RAW {
        NET_RAW.call_once(|| {
            eprintln!(
                "rdma-emu: a raw packet QP or flow rule was refused (EPERM): the kernel's \
                 verbs ask for CAP_NET_RAW; run with it, or set RDMA_EMU_NET_RAW=anyone"
            )
        });
    }
}

/// The soft `RLIMIT_MEMLOCK` in KiB, as `ulimit -l` shows it.
fn memlock_kib() -> String {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a live, writable rlimit.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    match ok.then_some(r.rlim_cur) {
        Some(libc::RLIM_INFINITY) => "unlimited".into(),
        Some(bytes) => (bytes / 1024).to_string(),
        None => "?".into(),
    }
}

/// For create verbs: NULL with `errno` set from the error.
pub(crate) fn null_with<T>(e: rdma_emu::Error) -> *mut T {
    explain(&e);
    set_errno(e.errno().raw());
    std::ptr::null_mut()
}

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

/// Says once per process, on stderr, why a registration failed with `ENOMEM` past
/// `RLIMIT_MEMLOCK`, or a raw packet QP or flow rule with `EPERM` for want of `CAP_NET_RAW`
/// ([`rdma_emu::Error::hint`]): the program (UCX, libfabric, perftest) reports only the errno,
/// or asks for an unlimited `ulimit -l`, which a user without root cannot give.
fn explain(e: &rdma_emu::Error) {
    static MEMLOCK: std::sync::Once = std::sync::Once::new();
    static NET_RAW: std::sync::Once = std::sync::Once::new();
    let once = match *e {
        rdma_emu::Error::MEMLOCK => &MEMLOCK,
        rdma_emu::Error::NET_RAW => &NET_RAW,
        _ => return,
    };
    if let Some(hint) = e.hint() {
        once.call_once(|| eprintln!("rdma-emu: {hint}"));
    }
}

/// For create verbs: NULL with `errno` set from the error.
pub(crate) fn null_with<T>(e: rdma_emu::Error) -> *mut T {
    explain(&e);
    set_errno(e.errno().raw());
    std::ptr::null_mut()
}

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
    // The errors explained so far (the emulator's `hint` says which have a line).
    static SAID: std::sync::Mutex<Vec<rdma_emu::Error>> = std::sync::Mutex::new(Vec::new());
    let Some(hint) = e.hint() else { return };
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.contains(e) {
        said.push(*e);
        eprintln!("rdma-emu: {hint}");
    }
}

/// For create verbs: NULL with `errno` set from the error.
pub(crate) fn null_with<T>(e: rdma_emu::Error) -> *mut T {
    explain(&e);
    set_errno(e.errno().raw());
    std::ptr::null_mut()
}

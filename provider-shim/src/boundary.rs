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

/// For create verbs: NULL with `errno` set from the error.
pub(crate) fn null_with<T>(e: rdma_emu::Error) -> *mut T {
    set_errno(e.errno().raw());
    std::ptr::null_mut()
}

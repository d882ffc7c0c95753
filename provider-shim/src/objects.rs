//! The objects handed to C: each embeds its `ibv_*` struct first (`#[repr(C)]`), so the
//! pointer C holds is also the pointer to the whole object, and keeps the emulator handle.

use std::mem::offset_of;

use crate::abi::*;

#[repr(C)]
pub(crate) struct ShimDevice {
    pub(crate) dev: ibv_device,
    pub(crate) emu: rdma_emu::Device,
}

// SAFETY: the device is immutable after creation (its C struct holds only NULL `_ops` pointers
// and strings), and rdma_emu::Device is Send + Sync.
unsafe impl Send for ShimDevice {}
// SAFETY: as above.
unsafe impl Sync for ShimDevice {}

#[repr(C)]
pub(crate) struct ShimContext {
    /// `vctx.context` is the `ibv_context` C sees; `verbs_context` precedes it.
    pub(crate) vctx: verbs_context,
    pub(crate) emu: rdma_emu::Context,
}

#[repr(C)]
pub(crate) struct ShimPd {
    pub(crate) pd: ibv_pd,
    pub(crate) emu: rdma_emu::Pd,
}

#[repr(C)]
pub(crate) struct ShimMr {
    pub(crate) mr: ibv_mr,
    pub(crate) emu: rdma_emu::Mr,
}

#[repr(C)]
pub(crate) struct ShimChannel {
    pub(crate) ch: ibv_comp_channel,
    pub(crate) emu: rdma_emu::CompChannel,
}

/// Every CQ is an `ibv_cq_ex` (which starts with `ibv_cq`), so both APIs work on it.
#[repr(C)]
pub(crate) struct ShimCq {
    pub(crate) cq: ibv_cq_ex,
    pub(crate) emu: rdma_emu::Cq,
    /// The completion `start_poll`/`next_poll` made current, for the `read_*` functions. Only
    /// the thread inside a start/end poll pair touches it (the verbs contract).
    pub(crate) cur: std::cell::Cell<rdma_emu::Wc>,
}

/// Every QP is an `ibv_qp_ex` (which starts with `ibv_qp`).
#[repr(C)]
pub(crate) struct ShimQp {
    pub(crate) qp: ibv_qp_ex,
    pub(crate) emu: rdma_emu::Qp,
    /// Created through `ibv_create_qp_ex` with send ops: `ibv_qp_to_qp_ex` returns it.
    pub(crate) extended: bool,
    /// The `ibv_wr_*` batch being built between `wr_start` and `wr_complete`.
    pub(crate) batch: parking_lot::Mutex<crate::verbs::wr::Batch>,
}

/// Recovers the object behind a C pointer.
///
/// # Safety
/// `p` must be NULL or a pointer this library handed out for an object of type `S` that was
/// not destroyed yet (the verbs contract).
pub(crate) unsafe fn obj<'a, C, S>(p: *mut C) -> Option<&'a S> {
    // SAFETY: every S here is #[repr(C)] with its C struct first, so the addresses coincide.
    unsafe { (p as *const S).as_ref() }
}

/// Recovers the context object from `struct ibv_context *`.
///
/// # Safety
/// As [`obj`]: `p` is NULL or a context this library opened and has not closed.
pub(crate) unsafe fn ctx<'a>(p: *mut ibv_context) -> Option<&'a ShimContext> {
    if p.is_null() {
        return None;
    }
    let off = offset_of!(ShimContext, vctx) + offset_of!(verbs_context, context);
    // SAFETY: `p` points at `vctx.context` inside a live ShimContext, `off` bytes in.
    unsafe { (p.byte_sub(off) as *const ShimContext).as_ref() }
}

/// Boxes an object and returns the pointer C will hold.
pub(crate) fn leak<S>(s: S) -> *mut S {
    Box::into_raw(Box::new(s))
}

/// Frees an object created by [`leak`].
///
/// # Safety
/// `p` came from `leak::<S>` and is not used afterwards.
pub(crate) unsafe fn free<S>(p: *const S) {
    // SAFETY: by the caller's contract `p` is a live Box<S> allocation.
    drop(unsafe { Box::from_raw(p as *mut S) });
}

/// Initialises a pthread mutex and condition variable embedded in a C object.
pub(crate) fn init_sync(m: *mut libc::pthread_mutex_t, c: *mut libc::pthread_cond_t) {
    // SAFETY: both point into an object we own and have not shared yet.
    unsafe {
        libc::pthread_mutex_init(m, std::ptr::null());
        if !c.is_null() {
            libc::pthread_cond_init(c, std::ptr::null());
        }
    }
}

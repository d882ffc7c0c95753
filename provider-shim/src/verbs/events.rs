//! Asynchronous events.

use core::ffi::c_int;

use rdma_emu::{AsyncEvent, EventElement, EventType};

use crate::{
    abi::*,
    boundary::{ffi, set_errno},
    objects::*,
};

/// `ibv_get_async_event(context, event)`: 0, or -1 with `errno` (`EAGAIN` on a non-blocking
/// `async_fd` with nothing pending).
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_get_async_event(
    c: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context; `ev` NULL or writable.
        let (Some(s), Some(ev)) = (unsafe { ctx(c) }, unsafe { ev.as_mut() }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        match s.emu().get_async_event() {
            Ok(e) => {
                ev.event_type = e.event_type.0;
                ev.element = match &e.element {
                    EventElement::Qp(q) => q.user_data() as *mut _,
                    EventElement::Cq(q) => q.user_data() as *mut _,
                    EventElement::Srq(q) => q.user_data() as *mut _,
                    EventElement::Wq(q) => q.user_data() as *mut _,
                    EventElement::Port(p) => *p as usize as *mut _,
                    _ => std::ptr::null_mut(),
                };
                0
            }
            Err(e) => {
                set_errno(e.errno().raw());
                -1
            }
        }
    })
}

/// `ibv_ack_async_event(event)`: the event type tells what the element is; a QP's or CQ's
/// destroy waits for this acknowledgement.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_ack_async_event(ev: *mut ibv_async_event) {
    ffi!((), {
        // SAFETY: NULL or an event filled by ibv_get_async_event.
        let Some(ev) = (unsafe { ev.as_ref() }) else { return };
        let t = EventType(ev.event_type);
        let (context, element) = match t {
            EventType::QP_FATAL
            | EventType::QP_REQ_ERR
            | EventType::QP_ACCESS_ERR
            | EventType::COMM_EST
            | EventType::SQ_DRAINED
            | EventType::PATH_MIG
            | EventType::PATH_MIG_ERR
            | EventType::QP_LAST_WQE_REACHED => {
                // SAFETY: for QP events the element is a live QP of ours (not destroyed: its
                // destroy waits for this ack).
                let Some(q) = (unsafe { obj::<_, ShimQp>(ev.element as *mut ibv_qp) }) else {
                    return;
                };
                (q.qp.qp_base.context, EventElement::Qp(q.emu.clone()))
            }
            EventType::SRQ_ERR | EventType::SRQ_LIMIT_REACHED => {
                // SAFETY: as above, for an SRQ.
                let Some(q) = (unsafe { obj::<_, ShimSrq>(ev.element as *mut ibv_srq) }) else {
                    return;
                };
                (q.srq.context, EventElement::Srq(q.emu.clone()))
            }
            EventType::WQ_FATAL => {
                // SAFETY: as above, for a WQ.
                let Some(q) = (unsafe { obj::<_, super::wq::ShimWq>(ev.element as *mut ibv_wq) })
                else {
                    return;
                };
                (q.wq.context, EventElement::Wq(q.emu.clone()))
            }
            EventType::CQ_ERR => {
                // SAFETY: as above, for a CQ.
                let Some(q) = (unsafe { obj::<_, ShimCq>(ev.element as *mut ibv_cq) }) else {
                    return;
                };
                (q.cq.context, EventElement::Cq(q.emu.clone()))
            }
            // Port and device events have nothing waiting on their acknowledgement.
            _ => return,
        };
        // SAFETY: the object's context outlives it.
        if let Some(s) = unsafe { ctx(context) } {
            s.emu().ack_async_event(&AsyncEvent { event_type: t, element });
        }
    })
}

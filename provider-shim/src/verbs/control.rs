//! The emulator's own control functions (version node `RDMA_EMU_1.0`, declared in
//! `include/rdma_emu.h`): what a test needs to provoke port and device events.

use core::ffi::c_int;

use rdma_emu::{EventType, PortState};

use crate::{abi::*, boundary::ffi, objects::*};

/// `rdma_emu_set_port_state(context, port_num, state)`: `IBV_PORT_ACTIVE` or `IBV_PORT_DOWN`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_set_port_state(
    c: *mut ibv_context,
    port: u8,
    state: u32,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        s.emu
            .device()
            .set_port_state(port, PortState(state))
            .map_or_else(|e| e.errno().raw(), |()| 0)
    })
}

/// `rdma_emu_raise_event(context, event, port_num)`: a port event on `port_num`, or
/// `IBV_EVENT_DEVICE_FATAL` (port ignored), on every open context of the device.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_raise_event(
    c: *mut ibv_context,
    event: u32,
    port: u8,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        let ev = EventType(event);
        let port = (ev != EventType::DEVICE_FATAL).then_some(port);
        s.emu.device().raise_event(ev, port).map_or_else(|e| e.errno().raw(), |()| 0)
    })
}

//! The emulator's own control functions (version node `RDMA_EMU_1.0`, declared in
//! `include/rdma_emu.h`): what a test needs to provoke port and device events, and faults.

use core::ffi::{c_char, c_int};

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
        s.emu()
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
        s.emu().device().raise_event(ev, port).map_or_else(|e| e.errno().raw(), |()| 0)
    })
}

/// `rdma_emu_set_faults(context, rules)`: replaces the fault rules of the context's fabric
/// (NULL or "" clears them); `EINVAL`, with the reason on stderr, for malformed rules.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_set_faults(
    c: *mut ibv_context,
    rules: *const c_char,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return libc::EINVAL };
        let text = if rules.is_null() {
            String::new()
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(rules) }.to_string_lossy().into_owned()
        };
        match rdma_emu::FaultRule::parse(&text) {
            Ok(r) => {
                s.emu().device().fabric().set_faults(r);
                0
            }
            Err(e) => {
                eprintln!("rdma-emu: {e}");
                libc::EINVAL
            }
        }
    })
}

/// `rdma_emu_fault_hits(context, hits, n)`: copies how often each of the first `n` rules hit
/// into `hits`; the number of rules, or -1 for a NULL context.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_fault_hits(
    c: *mut ibv_context,
    hits: *mut u64,
    n: c_int,
) -> c_int {
    ffi!(-1, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return -1 };
        let all = s.emu().device().fabric().fault_hits();
        if !hits.is_null() {
            for (i, h) in all.iter().take(n.max(0) as usize).enumerate() {
                // SAFETY: the caller gives room for `n` counts.
                unsafe { hits.add(i).write(*h) };
            }
        }
        all.len() as c_int
    })
}

/// `rdma_emu_seed(context)`: the seed of the context's fabric (0 for a NULL context).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_seed(c: *mut ibv_context) -> u64 {
    ffi!(0, {
        // SAFETY: NULL or a live context.
        let Some(s) = (unsafe { ctx(c) }) else { return 0 };
        s.emu().device().fabric().seed()
    })
}

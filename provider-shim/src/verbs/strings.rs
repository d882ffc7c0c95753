//! The `*_str` helpers, with rdma-core's exact strings (a test compares them with the real
//! library's over the whole input range).

use core::ffi::c_char;

/// A NUL-terminated static string for C.
macro_rules! cstr {
    ($s:literal) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

/// `ibv_wc_status_str(status)`.
pub(crate) extern "C" fn rdma_emu_shim__ibv_wc_status_str(status: u32) -> *const c_char {
    match status {
        0 => cstr!("success"),
        1 => cstr!("local length error"),
        2 => cstr!("local QP operation error"),
        3 => cstr!("local EE context operation error"),
        4 => cstr!("local protection error"),
        5 => cstr!("Work Request Flushed Error"),
        6 => cstr!("memory management operation error"),
        7 => cstr!("bad response error"),
        8 => cstr!("local access error"),
        9 => cstr!("remote invalid request error"),
        10 => cstr!("remote access error"),
        11 => cstr!("remote operation error"),
        12 => cstr!("transport retry counter exceeded"),
        13 => cstr!("RNR retry counter exceeded"),
        14 => cstr!("local RDD violation error"),
        15 => cstr!("remote invalid RD request"),
        16 => cstr!("aborted error"),
        17 => cstr!("invalid EE context number"),
        18 => cstr!("invalid EE context state"),
        19 => cstr!("fatal error"),
        20 => cstr!("response timeout error"),
        21 => cstr!("general error"),
        22 => cstr!("TM error"),
        23 => cstr!("TM software rendezvous"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_node_type_str(node_type)`.
pub(crate) extern "C" fn rdma_emu_shim__ibv_node_type_str(t: i32) -> *const c_char {
    match t {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_port_state_str(port_state)`.
pub(crate) extern "C" fn rdma_emu_shim__ibv_port_state_str(s: u32) -> *const c_char {
    match s {
        0 => cstr!("no state change (NOP)"),
        1 => cstr!("down"),
        2 => cstr!("init"),
        3 => cstr!("armed"),
        4 => cstr!("active"),
        5 => cstr!("active defer"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_event_type_str(event)`.
pub(crate) extern "C" fn rdma_emu_shim__ibv_event_type_str(e: u32) -> *const c_char {
    match e {
        0 => cstr!("CQ error"),
        1 => cstr!("local work queue catastrophic error"),
        2 => cstr!("invalid request local work queue error"),
        3 => cstr!("local access violation work queue error"),
        4 => cstr!("communication established"),
        5 => cstr!("send queue drained"),
        6 => cstr!("path migrated"),
        7 => cstr!("path migration request error"),
        8 => cstr!("local catastrophic error"),
        9 => cstr!("port active"),
        10 => cstr!("port error"),
        11 => cstr!("LID change"),
        12 => cstr!("P_Key change"),
        13 => cstr!("SM change"),
        14 => cstr!("SRQ catastrophic error"),
        15 => cstr!("SRQ limit reached"),
        16 => cstr!("last WQE reached"),
        17 => cstr!("client reregistration"),
        18 => cstr!("GID table change"),
        19 => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

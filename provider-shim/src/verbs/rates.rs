//! `ibv_rate` conversions (pure functions; equal to rdma-core's, as a test checks).

use core::ffi::c_int;

/// (enum ibv_rate, multiple of 2.5 Gb/s or -1, Mb/s).
const RATES: [(c_int, c_int, c_int); 24] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
    (0, -1, -1),
];

/// `ibv_rate_to_mult(rate)`.
pub(crate) extern "C" fn rdma_emu_shim__ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate && rate != 0).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate(mult)`: `IBV_RATE_MAX` (0) for an unknown multiple.
pub(crate) extern "C" fn rdma_emu_shim__mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps(rate)`.
pub(crate) extern "C" fn rdma_emu_shim__ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate && rate != 0).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate(mbps)`: `IBV_RATE_MAX` (0) for an unknown speed.
pub(crate) extern "C" fn rdma_emu_shim__mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps && mbps > 0).map_or(0, |r| r.0)
}

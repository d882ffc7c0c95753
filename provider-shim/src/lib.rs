//! `libibverbs.so.1` backed by the rdma-emu emulator.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case, non_upper_case_globals)]
// In the unit-test build the exports are not bound (no version script), so they look unused.
#![cfg_attr(test, allow(dead_code))]

pub mod abi;
mod boundary;
mod objects;
mod sysfs;
mod verbs;

#[allow(unused_imports)]
use verbs::*;

include!(concat!(env!("OUT_DIR"), "/exports.rs"));

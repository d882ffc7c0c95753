//! `librdmacm.so.1` for programs on the rdma-emu emulator.
//!
//! The connection manager lives in the emulator's `libibverbs.so.1`, so that the verbs and the
//! CM of a process share one emulator (its devices, QPs and host-fabric node). This library
//! only gives it librdmacm's face: each of rdma-core 44's 68 exports, with its symbol version
//! (RDMACM_1.0 to 1.3), is a one-instruction trampoline that jumps to `rdma_emu_cm__<name>`
//! in `libibverbs.so.1` (see `build.rs` and `docs/rdma-cm.md`).

include!(concat!(env!("OUT_DIR"), "/trampolines.rs"));

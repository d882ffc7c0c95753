//! The conformance suite: verb programs, run through the real libibverbs C ABI by the trace
//! runner (`runner/runner.c`) on the kernel's rxe and on the emulator, compared trace by trace.
//!
//! - [`catalogue`]: every call of the runner's language; `docs/conformance-catalogue.md`.
//! - [`generate`]: proptest strategies for valid and deliberately invalid programs.
//! - [`runner`]: builds the runner and runs programs on the emulator or the system's device.
//! - [`trace`], [`compare`], [`deviations`]: traces, their comparison, documented differences.
//! - [`suite`]: the committed golden traces and the commands over them (record, report, live).
//!
//! `docs/conformance.md` explains how to read and extend it.

pub mod catalogue;
pub mod compare;
pub mod deviations;
pub mod generate;
pub mod program;
pub mod runner;
pub mod suite;
pub mod trace;

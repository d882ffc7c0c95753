//! Fuzzing the C ABI (`tests/fuzz/verbs_fuzz.c`): random verb programs with hostile arguments,
//! each in a forked child, must neither crash, hang, panic nor accept a hostile handle.
//!
//! CI runs a bounded number of programs from a fixed seed; for a longer run:
//! `RDMA_EMU_FUZZ_CASES=100000 RDMA_EMU_FUZZ_SEED=$RANDOM cargo test --release -p rdma-emu-shim --test fuzz`.

mod common;
use std::process::Command;

/// The fuzzer, compiled once per test binary.
fn build() -> std::path::PathBuf {
    static EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(compile).clone()
}

fn compile() -> std::path::PathBuf {
    let flags = ["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"];
    common::compile(
        "cc",
        &flags,
        "fuzz/verbs_fuzz.c",
        &["-libverbs"],
        "verbs_fuzz",
        "libibverbs-dev",
    )
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `cases` programs from `seed`; the fuzzer's report and whether every program passed.
fn fuzz(seed: u64, cases: u64, fabric: Option<&str>, self_test: bool) -> (String, bool) {
    common::cdylib();
    let mut cmd = Command::new(build());
    // Every program writes the devices' sysfs tree; a child ended with _exit (or a crash)
    // leaves its own behind. One tree, rewritten by each program in turn, leaves one.
    let sysfs = common::profile_dir()
        .join("c-tests")
        .join(format!("fuzz-sysfs-{}-{self_test}", fabric.unwrap_or("host")));
    cmd.arg(seed.to_string())
        .arg(cases.to_string())
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .env("RDMA_EMU_SYSFS", &sysfs);
    if let Some(f) = fabric {
        cmd.env("RDMA_EMU_FABRIC", f);
    }
    if self_test {
        cmd.env("VERBS_FUZZ_SELF_TEST", "1");
    }
    let out = cmd.output().expect("run verbs_fuzz");
    let _ = std::fs::remove_dir_all(&sysfs);
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.success())
}

#[test]
fn hostile_verb_programs_in_one_process_neither_crash_hang_panic_nor_accept_bad_handles() {
    let (report, ok) = fuzz(
        env_or("RDMA_EMU_FUZZ_SEED", 1),
        env_or("RDMA_EMU_FUZZ_CASES", 2000),
        Some("none"),
        false,
    );
    assert!(ok, "{report}");
    assert!(report.contains(" 0 failed"), "{report}");
}

#[test]
fn hostile_verb_programs_on_the_host_fabric_neither_crash_hang_panic_nor_accept_bad_handles() {
    let cases = env_or("RDMA_EMU_FUZZ_CASES", 2000) / 4;
    let (report, ok) = fuzz(env_or("RDMA_EMU_FUZZ_SEED", 1) + 1, cases, None, false);
    assert!(ok, "{report}");
    assert!(report.contains(" 0 failed"), "{report}");
}

/// The fuzzer itself: with programs that poll a CQ made to crash, it must report them and
/// minimise each to the one call that matters.
#[test]
fn the_fuzzer_finds_a_crash_and_minimises_it_to_its_cause() {
    let (report, ok) = fuzz(1, 40, Some("none"), true);
    assert!(!ok, "{report}");
    let found: Vec<&str> = report.lines().filter(|l| l.starts_with("FAILED")).collect();
    assert!(!found.is_empty(), "{report}");
    for line in &found {
        assert!(line.contains(": crashed; minimised to 1 of"), "{line}\n{report}");
    }
    let calls: Vec<&str> =
        report.split("FAILED").skip(1).map(|case| case.lines().nth(1).unwrap_or("")).collect();
    assert!(calls.iter().all(|c| c.starts_with("poll_cq")), "{calls:?}\n{report}");
}

//! Fuzzing the C ABI: random programs with hostile arguments, each in a forked child, must
//! neither crash, hang, panic nor accept a hostile handle: of verbs (`tests/fuzz/verbs_fuzz.c`)
//! and of librdmacm, the connection manager and rsockets (`tests/fuzz/cm_fuzz.c`), on the
//! machinery they share (`tests/fuzz/harness.h`).
//!
//! CI runs a bounded number of programs from a fixed seed; for a longer run:
//! `RDMA_EMU_FUZZ_CASES=100000 RDMA_EMU_FUZZ_SEED=$RANDOM cargo test --release -p rdma-emu-shim --test fuzz`.

mod common;
use std::process::Command;

/// A fuzzer of `tests/fuzz/`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fuzzer {
    Verbs,
    Cm,
}

impl Fuzzer {
    fn name(self) -> &'static str {
        match self {
            Fuzzer::Verbs => "verbs_fuzz",
            Fuzzer::Cm => "cm_fuzz",
        }
    }

    /// The prefix of its variables (`_SELF_TEST`, `_FIRST`).
    fn env(self) -> &'static str {
        match self {
            Fuzzer::Verbs => "VERBS_FUZZ",
            Fuzzer::Cm => "CM_FUZZ",
        }
    }

    /// The fuzzer, compiled once per test binary.
    fn build(self) -> std::path::PathBuf {
        static EXES: [std::sync::OnceLock<std::path::PathBuf>; 2] =
            [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
        EXES[self as usize].get_or_init(|| self.compile()).clone()
    }

    fn compile(self) -> std::path::PathBuf {
        let flags = ["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"];
        let (libs, pkg): (&[&str], _) = match self {
            Fuzzer::Verbs => (&["-libverbs"], "libibverbs-dev"),
            Fuzzer::Cm => (&["-lrdmacm", "-libverbs"], "librdmacm-dev"),
        };
        let source = format!("fuzz/{}.c", self.name());
        common::compile("cc", &flags, &source, libs, self.name(), pkg)
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `cases` programs of `fuzzer` from `seed`; its report and whether every program passed.
fn fuzz(
    fuzzer: Fuzzer,
    seed: u64,
    cases: u64,
    fabric: Option<&str>,
    self_test: bool,
) -> (String, bool) {
    common::cdylib();
    let mut cmd = Command::new(fuzzer.build());
    // Every program writes the devices' sysfs tree; a child ended with _exit (or a crash)
    // leaves its own behind. One tree, rewritten by each program in turn, leaves one.
    let sysfs = common::profile_dir().join("c-tests").join(format!(
        "fuzz-sysfs-{}-{}-{self_test}",
        fuzzer.name(),
        fabric.unwrap_or("host")
    ));
    cmd.arg(seed.to_string())
        .arg(cases.to_string())
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .env("RDMA_EMU_SYSFS", &sysfs);
    if let Some(f) = fabric {
        cmd.env("RDMA_EMU_FABRIC", f);
    }
    if self_test {
        cmd.env(format!("{}_SELF_TEST", fuzzer.env()), "1");
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("run {}: {e}", fuzzer.name()));
    let _ = std::fs::remove_dir_all(&sysfs);
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.success())
}

#[test]
fn hostile_verb_programs_in_one_process_neither_crash_hang_panic_nor_accept_bad_handles() {
    let (report, ok) = fuzz(
        Fuzzer::Verbs,
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
    let (report, ok) = fuzz(Fuzzer::Verbs, env_or("RDMA_EMU_FUZZ_SEED", 1) + 1, cases, None, false);
    assert!(ok, "{report}");
    assert!(report.contains(" 0 failed"), "{report}");
}

/// The fuzzer itself: with programs that poll a CQ made to crash, it must report them and
/// minimise each to the one call that matters.
#[test]
fn the_fuzzer_finds_a_crash_and_minimises_it_to_its_cause() {
    finds_and_minimises(Fuzzer::Verbs, 40, "poll_cq");
}

/// Runs `cases` programs of `fuzzer` whose calls named `call` crash (its self test): each
/// program found must be minimised to that one call.
fn finds_and_minimises(fuzzer: Fuzzer, cases: u64, call: &str) {
    let (report, ok) = fuzz(fuzzer, 1, cases, Some("none"), true);
    assert!(!ok, "{report}");
    let found: Vec<&str> = report.lines().filter(|l| l.starts_with("FAILED")).collect();
    assert!(!found.is_empty(), "{report}");
    for line in &found {
        assert!(line.contains(": crashed; minimised to 1 of"), "{line}\n{report}");
    }
    let calls: Vec<&str> =
        report.split("FAILED").skip(1).map(|case| case.lines().nth(1).unwrap_or("")).collect();
    assert!(calls.iter().all(|c| c.starts_with(call)), "{calls:?}\n{report}");
}

/// The connection manager's and rsockets' calls (librdmacm), hostile handles (ids, channels,
/// events, PDs, descriptors) and values, in one process; a quarter as many on a host fabric.
#[test]
fn hostile_cm_and_rsocket_programs_neither_crash_hang_panic_nor_accept_bad_handles() {
    let (seed, cases) = (env_or("RDMA_EMU_FUZZ_SEED", 1), env_or("RDMA_EMU_FUZZ_CASES", 2000));
    for (seed, cases, fabric) in [(seed, cases, "none"), (seed + 1, cases / 4, "cm-fuzz")] {
        let (report, ok) = fuzz(Fuzzer::Cm, seed, cases, Some(fabric), false);
        assert!(ok && report.contains(" 0 failed"), "{fabric}: {report}");
    }
}

/// The CM fuzzer itself finds and minimises a crash (every program that reads an event made
/// to crash) to that call.
#[test]
fn the_cm_fuzzer_finds_a_crash_and_minimises_it_to_its_cause() {
    finds_and_minimises(Fuzzer::Cm, 20, "get_cm_event");
}

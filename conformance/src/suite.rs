//! The suite on disk and the commands over it.
//!
//! - `conformance/scenarios/*.verbs`: the curated scenarios.
//! - `conformance/golden/rxe/{scenarios,generated}.trace`: their traces and those of the
//!   generated programs, recorded on rxe (a trace echoes its calls, so it holds its program).
//! - `conformance/golden/rxe/unstable.txt`: generated programs rxe answered differently in two
//!   runs of one recording (timing-dependent on rxe); they are left out of the golden set.
//! - `conformance/deviations.txt`: the documented differences.

use crate::compare::{self, Outcome, Score};
use crate::deviations::{self, Deviation};
use crate::generate;
use crate::program::{self, Program};
use crate::runner::{self, Device};
use crate::trace::{self, Trace};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The generated set: this seed, this many programs.
pub const GENERATED_SEED: u64 = 1;
pub const GENERATED_COUNT: usize = 1200;
/// How long the runner waits for late completions and events: the emulator delivers within
/// microseconds; rxe in the VM runs on a software CPU.
pub const EMU_SETTLE_MS: u32 = 1;
pub const RXE_SETTLE_MS: u32 = 30;
/// How long `poll CQ N` and `poll CQ` wait on rxe for what is owed (2 s elsewhere). Kernel 6.1's
/// rxe never completes a receive posted to a QP already in ERR, which a poll waits for.
pub const RXE_TIMEOUT_MS: &str = "300";
/// Runner processes side by side in the VM.
const VM_SHARDS: usize = 8;
/// The two golden sets.
pub const SETS: [&str; 2] = ["scenarios", "generated"];

fn dir() -> PathBuf {
    runner::repo_root().join("conformance")
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every curated scenario, from the `.verbs` files in name order.
pub fn scenarios() -> Result<Vec<Program>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join("scenarios"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "verbs"))
        .collect();
    files.sort();
    let mut all: Vec<Program> = Vec::new();
    for f in files {
        for p in program::parse(&read(&f)?).map_err(|e| format!("{}: {e}", f.display()))? {
            if all.iter().any(|q| q.name == p.name) {
                return Err(format!("{}: a second scenario named {}", f.display(), p.name));
            }
            all.push(p);
        }
    }
    Ok(all)
}

/// The programs of a set as they are to be recorded now.
pub fn programs(set: &str) -> Result<Vec<Program>, String> {
    match set {
        "scenarios" => scenarios(),
        _ => Ok(generate::generate(GENERATED_SEED, GENERATED_COUNT)),
    }
}

/// The committed rxe traces of a set.
pub fn golden(set: &str) -> Result<Vec<Trace>, String> {
    trace::parse(&read(&dir().join(format!("golden/rxe/{set}.trace")))?)
}

pub fn deviations() -> Result<Vec<Deviation>, String> {
    deviations::parse(&read(&dir().join("deviations.txt"))?)
}

/// One set's comparison.
#[derive(Debug, Default)]
pub struct SetReport {
    pub set: String,
    pub score: Score,
    /// Deviation id -> how many programs it explained.
    pub explained: Vec<(String, usize)>,
    pub failures: Vec<String>,
}

/// Compares `emu`'s traces with rxe's, program by program.
pub fn compare_set(set: &str, rxe: &[Trace], emu: &[Trace], devs: &[Deviation]) -> SetReport {
    let mut report = SetReport { set: set.to_string(), ..SetReport::default() };
    for (i, r) in rxe.iter().enumerate() {
        let missing = Trace { program: r.program.clone(), blocks: Vec::new() };
        let e = emu.get(i).filter(|e| e.program == r.program).unwrap_or(&missing);
        let outcome = compare::compare(r, e, devs);
        report.score.add(&outcome);
        match &outcome {
            Outcome::Explained(id) => match report.explained.iter_mut().find(|(d, _)| d == id) {
                Some((_, n)) => *n += 1,
                None => report.explained.push((id.clone(), 1)),
            },
            Outcome::Differs { .. } => report.failures.push(compare::describe(r, &outcome)),
            Outcome::Equal => {}
        }
    }
    report
}

/// Runs every golden program on the emulator and compares; `only` limits it to one set.
pub fn report(runner_exe: &Path, only: Option<&str>) -> Result<Vec<SetReport>, String> {
    let devs = deviations()?;
    let mut out = Vec::new();
    for set in SETS.iter().filter(|s| only.is_none_or(|o| o == **s)) {
        let rxe = golden(set)?;
        let programs: Vec<Program> = rxe.iter().map(Trace::program).collect();
        let emu = runner::run(runner_exe, &Device::Emulator, &programs, EMU_SETTLE_MS)?;
        out.push(compare_set(set, &rxe, &emu, &devs));
    }
    Ok(out)
}

/// The score as the report command prints it.
pub fn render(reports: &[SetReport], verbose: bool) -> String {
    let mut s = String::new();
    for r in reports {
        s.push_str(&format!(
            "{:<10} compared {:>5}  equal {:>5}  documented deviations {:>3}  failures {:>3}\n",
            r.set, r.score.compared, r.score.equal, r.score.explained, r.score.failed
        ));
        for (id, n) in &r.explained {
            s.push_str(&format!("           deviation {id}: {n}\n"));
        }
    }
    for r in reports {
        let shown = if verbose { r.failures.len() } else { r.failures.len().min(5) };
        for f in &r.failures[..shown] {
            s.push_str(&format!("\n[{}] {f}", r.set));
        }
        if shown < r.failures.len() {
            s.push_str(&format!(
                "\n[{}] ... and {} more (--verbose shows all)\n",
                r.set,
                r.failures.len() - shown
            ));
        }
    }
    s
}

/// Runs `programs` on this machine's device (rxe) with rxe's waits.
pub fn rxe_run(exe: &Path, programs: &[Program]) -> Result<Vec<Trace>, String> {
    runner::run_with(
        exe,
        &Device::System,
        programs,
        RXE_SETTLE_MS,
        &[("RUNNER_TIMEOUT_MS", RXE_TIMEOUT_MS)],
    )
}

/// Where rxe runs for a recording or a live comparison.
#[derive(Clone, Debug)]
pub enum Rxe {
    /// The VM of `shared/rxe-vm`, one boot for the whole job.
    Vm { run_sh: PathBuf },
    /// This machine's own rxe device (the first libibverbs lists).
    Host,
}

impl Rxe {
    /// The VM next to the repository (`../shared/rxe-vm/run.sh`), or `$RXE_VM_RUN`.
    pub fn vm() -> Rxe {
        let run_sh = std::env::var_os("RXE_VM_RUN")
            .map(PathBuf::from)
            .unwrap_or_else(|| runner::repo_root().join("../shared/rxe-vm/run.sh"));
        Rxe::Vm { run_sh }
    }

    /// Runs the runner twice over `programs` on rxe (one VM boot) and returns both outputs.
    fn run_twice(&self, exe: &Path, programs: &[Program]) -> Result<[Vec<Trace>; 2], String> {
        match self {
            Rxe::Host => Ok([rxe_run(exe, programs)?, rxe_run(exe, programs)?]),
            Rxe::Vm { run_sh } => {
                // The runner mostly sleeps (settle times), so shards run side by side, each
                // its own process on rxe0; the two runs go one after the other.
                let work = exe.parent().expect("the runner's directory").to_path_buf();
                let shards =
                    programs.chunks(programs.len().div_ceil(VM_SHARDS).max(1)).collect::<Vec<_>>();
                let mut inputs = Vec::new();
                for (k, shard) in shards.iter().enumerate() {
                    let input = work.join(format!("record-in-{k}.verbs"));
                    std::fs::write(&input, runner::input_text(shard)).map_err(|e| e.to_string())?;
                    inputs.push(input);
                }
                let mut cmd = String::new();
                for run in 1..=2 {
                    for (k, input) in inputs.iter().enumerate() {
                        cmd.push_str(&format!(
                            "RUNNER_SETTLE_MS={RXE_SETTLE_MS} RUNNER_TIMEOUT_MS={RXE_TIMEOUT_MS} {} < {} > {} & ",
                            exe.display(),
                            input.display(),
                            work.join(format!("record-out-{run}-{k}.trace")).display()
                        ));
                    }
                    cmd.push_str("wait; ");
                }
                let status = run_in_vm(run_sh, &cmd)?;
                if !status.success() {
                    return Err(format!("the VM run failed ({status}): {cmd}"));
                }
                let collect = |run: usize| -> Result<Vec<Trace>, String> {
                    let mut all = Vec::new();
                    for k in 0..shards.len() {
                        let path = work.join(format!("record-out-{run}-{k}.trace"));
                        all.extend(read(&path).and_then(|t| runner::parse_output(&t))?);
                    }
                    Ok(all)
                };
                Ok([collect(1)?, collect(2)?])
            }
        }
    }
}

/// Boots the VM once and runs `cmd` there from the repository's root (shared at the same path),
/// allowing it 90 minutes unless `RXE_VM_TIMEOUT` says otherwise.
pub fn run_in_vm(run_sh: &Path, cmd: &str) -> Result<std::process::ExitStatus, String> {
    Command::new("bash")
        .arg(run_sh)
        .arg(cmd)
        .env("RXE_VM_TIMEOUT", std::env::var("RXE_VM_TIMEOUT").unwrap_or_else(|_| "5400".into()))
        .current_dir(runner::repo_root())
        .status()
        .map_err(|e| format!("{}: {e}", run_sh.display()))
}

/// Records both sets on rxe (`only`: one of them, the other's files left as they are); returns
/// a summary. Scenarios must be stable (the same in both runs); generated programs that are not
/// go to `unstable.txt`.
pub fn record(exe: &Path, rxe: &Rxe, only: Option<&str>) -> Result<String, String> {
    let wanted = |set: &str| only.is_none_or(|o| o == set);
    if let Some(o) = only.filter(|o| !SETS.contains(o)) {
        return Err(format!("no set {o}: {SETS:?}"));
    }
    let scenarios = if wanted("scenarios") { programs("scenarios")? } else { Vec::new() };
    let generated = if wanted("generated") { programs("generated")? } else { Vec::new() };
    let all: Vec<Program> = scenarios.iter().chain(&generated).cloned().collect();
    let [one, two] = rxe.run_twice(exe, &all)?;
    if one.len() != all.len()
        || two.len() != all.len()
        || one.iter().chain(&two).any(|t| !t.complete())
    {
        return Err(format!(
            "rxe did not run every program to its end ({} / {} of {})",
            one.len(),
            two.len(),
            all.len()
        ));
    }
    let mut unstable = String::new();
    let (mut scen, mut gen_) = (Vec::new(), Vec::new());
    for (i, (a, b)) in one.into_iter().zip(two).enumerate() {
        let scenario = i < scenarios.len();
        if a != b {
            let Outcome::Differs { block, rxe: r, emu: e } = compare::compare(&a, &b, &[]) else {
                unreachable!()
            };
            let what = format!("{} at call {}: {:?} / {:?}\n", a.program, block + 1, r, e);
            if scenario {
                return Err(format!("scenario unstable on rxe: {what}"));
            }
            unstable.push_str(&what);
            continue;
        }
        if scenario { scen.push(a) } else { gen_.push(a) }
    }
    let golden = dir().join("golden/rxe");
    let write = |name: &str, text: &str| {
        std::fs::write(golden.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    let mut summary = String::new();
    if wanted("scenarios") {
        write("scenarios.trace", &trace::text_of(&scen))?;
        summary.push_str(&format!("recorded {} scenarios\n", scen.len()));
    }
    if wanted("generated") {
        write("generated.trace", &trace::text_of(&gen_))?;
        write("unstable.txt", &unstable)?;
        summary.push_str(&format!(
            "recorded {} of {} generated programs ({} unstable on rxe)\n",
            gen_.len(),
            generated.len(),
            generated.len() - gen_.len()
        ));
    }
    Ok(summary)
}

/// Generates `count` programs from `seed`, runs each on rxe (this machine's device) and on the
/// emulator, and shrinks the first unexplained difference to a minimal program. Meant to run
/// where rxe is: inside the VM (`conformance live --vm` boots it), or on a host with rxe.
/// With `ex`, each program's QPs, CQs or both (drawn with the plan) are the extended kinds
/// ([`generate::extended`]).
pub fn live(exe: &Path, seed: u64, count: u32, ex: bool) -> Result<String, String> {
    use proptest::strategy::{Just, Strategy};
    use proptest::test_runner::{
        Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
    };
    let devs = deviations()?;
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: count,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let score = std::cell::RefCell::new(Score::default());
    // Without `ex`, a kind that draws nothing: the same seed makes the programs it made before.
    let kinds = if ex { (1u8..4).boxed() } else { Just(0u8).boxed() };
    let result = runner.run(&(generate::plans(), kinds), |(plan, kinds)| {
        let name = if ex { generate::LIVE_EX } else { generate::LIVE };
        let program = generate::extended(plan.program(name), kinds);
        let rxe = rxe_run(exe, std::slice::from_ref(&program)).map_err(TestCaseError::fail)?;
        let emu =
            runner::run(exe, &Device::Emulator, std::slice::from_ref(&program), EMU_SETTLE_MS)
                .map_err(TestCaseError::fail)?;
        let (Some(r), Some(e)) = (rxe.first(), emu.first()) else {
            return Err(TestCaseError::fail("a runner printed no trace"));
        };
        let outcome = compare::compare(r, e, &devs);
        score.borrow_mut().add(&outcome);
        match outcome {
            Outcome::Differs { .. } => Err(TestCaseError::fail(compare::describe(r, &outcome))),
            _ => Ok(()),
        }
    });
    let s = score.into_inner();
    let head = format!(
        "live: {} programs compared, {} equal, {} documented deviations\n",
        s.compared, s.equal, s.explained
    );
    match result {
        Ok(()) => Ok(head),
        Err(TestError::Fail(why, (plan, kinds))) => Err(format!(
            "{head}a difference, shrunk to this program:\n{}\n{why}",
            generate::extended(plan.program("minimal"), kinds).text()
        )),
        Err(TestError::Abort(why)) => Err(format!("{head}aborted: {why}")),
    }
}

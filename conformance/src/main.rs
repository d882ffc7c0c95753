//! `conformance`: the suite's command line (see `docs/conformance.md`).

use rdma_emu_conformance::{catalogue, generate, program, runner, suite, trace};
use std::process::ExitCode;

const USAGE: &str = "usage: conformance COMMAND
  report [--set scenarios|generated] [--verbose]
                     run every golden program on the emulator, compare with rxe, print the score
  record [--host] [--set scenarios|generated]
                     re-record the golden rxe traces (in the VM of ../shared/rxe-vm, one boot;
                     --host: on this machine's own rxe device; --set: that set only)
  live [--vm] [--seed S] [--count N] [--ex]
                     generate programs, run each on rxe and on the emulator, shrink the first
                     unexplained difference (--vm: boot the VM and run there; --ex: on
                     extended QPs and CQs, posted to with ibv_wr_* and polled with
                     ibv_start_poll)
  run [--rxe] FILE   run the programs of FILE (.verbs or .trace) on the emulator (--rxe: on
                     this machine's device) and print the traces
  generate [--seed S] [--count N]
                     print generated programs
  catalogue          print the verb catalogue (docs/conformance-catalogue.md)";

fn value(args: &[String], flag: &str) -> Option<String> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned()
}

fn number(args: &[String], flag: &str, default: u64) -> Result<u64, String> {
    value(args, flag)
        .map_or(Ok(default), |v| v.parse().map_err(|_| format!("{flag}: not a number: {v}")))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("conformance: {e}");
            ExitCode::from(2)
        }
    }
}

/// Ok(false): the command ran and found differences.
fn run(args: &[String]) -> Result<bool, String> {
    let has = |f: &str| args.iter().any(|a| a == f);
    match args.first().map(String::as_str) {
        Some("catalogue") => print!("{}", catalogue::render()),
        Some("generate") => {
            let programs = generate::generate(
                number(args, "--seed", 1)?,
                number(args, "--count", 10)? as usize,
            );
            print!("{}", program::text_of(&programs));
        }
        Some("report") => {
            let exe = runner::build()?;
            let set = value(args, "--set");
            let reports = suite::report(&exe, set.as_deref())?;
            print!("{}", suite::render(&reports, has("--verbose")));
            return Ok(reports.iter().all(|r| r.failures.is_empty()));
        }
        Some("record") => {
            let exe = runner::build()?;
            let rxe = if has("--host") { suite::Rxe::Host } else { suite::Rxe::vm() };
            print!("{}", suite::record(&exe, &rxe, value(args, "--set").as_deref())?);
        }
        Some("live") if has("--vm") => {
            // The same command inside the VM; this binary and the runner are on the 9p share.
            runner::build()?;
            let me = std::env::current_exe().map_err(|e| e.to_string())?;
            let rest: Vec<&str> =
                args[1..].iter().map(String::as_str).filter(|a| *a != "--vm").collect();
            let suite::Rxe::Vm { run_sh } = suite::Rxe::vm() else { unreachable!() };
            let status =
                suite::run_in_vm(&run_sh, &format!("{} live {}", me.display(), rest.join(" ")))?;
            return Ok(status.success());
        }
        Some("live") => {
            let exe = runner::build()?;
            let count = number(args, "--count", 100)? as u32;
            match suite::live(&exe, number(args, "--seed", 1)?, count, has("--ex")) {
                Ok(s) => print!("{s}"),
                Err(s) => {
                    print!("{s}");
                    return Ok(false);
                }
            }
        }
        Some("run") => {
            let file = args.iter().skip(1).find(|a| !a.starts_with("--")).ok_or(USAGE)?;
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            let programs = if file.ends_with(".trace") {
                trace::parse(&text)?.iter().map(trace::Trace::program).collect()
            } else {
                program::parse(&text)?
            };
            let exe = runner::build()?;
            let traces = if has("--rxe") {
                suite::rxe_run(&exe, &programs)?
            } else {
                runner::run(&exe, &runner::Device::Emulator, &programs, suite::EMU_SETTLE_MS)?
            };
            print!("{}", trace::text_of(&traces));
        }
        _ => return Err(USAGE.into()),
    }
    Ok(true)
}

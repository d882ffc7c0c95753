//! The emulator against the committed rxe traces (no VM needed), and the suite's own parts kept
//! consistent: the scenario files, the generator, the catalogue, its rendering, the runner.

use rdma_emu_conformance::{catalogue, generate, runner, suite, trace::Trace};
use std::path::PathBuf;
use std::sync::OnceLock;

fn runner_exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| runner::build().expect("build the trace runner"))
}

#[test]
fn the_emulator_matches_rxe_on_every_golden_program() {
    let reports = suite::report(runner_exe(), None).expect("run the suite");
    let text = suite::render(&reports, true);
    println!("{text}");
    assert_eq!(reports.len(), 2);
    assert!(reports.iter().all(|r| r.failures.is_empty()), "{text}");
    let generated = &reports[1];
    assert!(
        generated.score.compared >= 1000,
        "only {} generated programs",
        generated.score.compared
    );
    // A deviation that explains nothing is stale: it must go, or its scenario come back.
    for d in suite::deviations().unwrap() {
        assert!(
            reports.iter().any(|r| r.explained.iter().any(|(id, _)| *id == d.id)),
            "deviation {} explains no program",
            d.id
        );
    }
}

/// The express path is observably the packet path: with it off (every WR through packets),
/// every golden program still matches rxe's trace, and leaves exactly the trace it leaves
/// with it on.
#[test]
fn the_packet_path_alone_matches_rxe_and_the_express_path() {
    let devs = suite::deviations().unwrap();
    for set in suite::SETS {
        let rxe = suite::golden(set).unwrap();
        let programs: Vec<_> = rxe.iter().map(Trace::program).collect();
        let run = |env: &[(&str, &str)]| {
            let (exe, dev) = (runner_exe(), &runner::Device::Emulator);
            runner::run_with(exe, dev, &programs, suite::EMU_SETTLE_MS, env).unwrap()
        };
        let (packets, express) = (run(&[("RDMA_EMU_EXPRESS", "0")]), run(&[]));
        let report = suite::compare_set(set, &rxe, &packets, &devs);
        assert!(report.failures.is_empty(), "{}", suite::render(&[report], true));
        for (p, e) in packets.iter().zip(&express) {
            assert_eq!(p, e, "the two paths differ on\n{}", p.program().text());
        }
    }
}

#[test]
fn a_broken_emulator_fails_the_comparison() {
    // Every packet lost: RC work ends in RETRY_EXC_ERR, UD and UC receives never complete.
    let rxe = suite::golden("scenarios").unwrap();
    let programs: Vec<_> = rxe.iter().map(Trace::program).collect();
    let emu = runner::run_with(
        runner_exe(),
        &runner::Device::Emulator,
        &programs,
        suite::EMU_SETTLE_MS,
        &[("RDMA_EMU_FAULTS", "drop")],
    )
    .unwrap();
    let report = suite::compare_set("scenarios", &rxe, &emu, &suite::deviations().unwrap());
    assert!(report.score.failed >= 10, "{}", suite::render(&[report], false));
}

#[test]
fn golden_scenarios_are_the_scenario_files() {
    let golden: Vec<_> = suite::golden("scenarios").unwrap().iter().map(Trace::program).collect();
    assert_eq!(
        golden,
        suite::scenarios().unwrap(),
        "a scenario changed: re-record (docs/conformance.md)"
    );
    assert!(suite::golden("scenarios").unwrap().iter().all(Trace::complete));
}

#[test]
fn golden_generated_programs_are_what_the_generator_makes() {
    let golden: Vec<_> = suite::golden("generated").unwrap().iter().map(Trace::program).collect();
    let made = generate::generate(suite::GENERATED_SEED, suite::GENERATED_COUNT);
    let unstable =
        std::fs::read_to_string(runner::repo_root().join("conformance/golden/rxe/unstable.txt"))
            .unwrap();
    // The golden set is the generator's output minus what rxe answered two ways.
    let mut it = golden.iter().peekable();
    for p in &made {
        if it.peek().is_some_and(|g| *g == p) {
            it.next();
        } else {
            assert!(
                unstable.lines().any(|l| l.starts_with(&format!("{} ", p.name))),
                "{} is neither in the golden set nor unstable: the generator changed; re-record",
                p.name
            );
        }
    }
    assert!(it.next().is_none(), "golden programs the generator no longer makes: re-record");
}

#[test]
fn the_catalogue_document_is_rendered_from_the_code() {
    let doc =
        std::fs::read_to_string(runner::repo_root().join("docs/conformance-catalogue.md")).unwrap();
    assert!(
        doc == catalogue::render(),
        "run: cargo run -p rdma-emu-conformance -- catalogue > docs/conformance-catalogue.md"
    );
}

#[test]
fn the_runner_speaks_exactly_the_catalogue() {
    let src =
        std::fs::read_to_string(runner::repo_root().join("conformance/runner/runner.c")).unwrap();
    let in_runner: Vec<&str> =
        src.split("V(\"").skip(1).filter_map(|s| s.split('"').next()).collect();
    for v in catalogue::VERBS {
        assert!(in_runner.contains(&v.name), "{} is catalogued but the runner lacks it", v.name);
    }
    for name in in_runner {
        assert!(catalogue::verb(name).is_some(), "the runner has {name}, the catalogue does not");
    }
}

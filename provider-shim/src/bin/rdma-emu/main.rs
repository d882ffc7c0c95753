//! `rdma-emu`: run programs on the emulator, list its devices, or run the demo.
//!
//! ```text
//! rdma-emu run [--devices N] [--profile rxe|full] [--ports N] [--fabric NAME] -- PROGRAM [ARGS...]
//! rdma-emu devices [--devices N] [--profile rxe|full] [--ports N]
//! rdma-emu demo
//! ```
//!
//! `run` executes PROGRAM with the emulator's `libibverbs.so.1` first on `LD_LIBRARY_PATH`
//! (found next to this executable, or named by `RDMA_EMU_LIB`) and the options passed on as the
//! environment variables the library reads: `RDMA_EMU_DEVICES`, `RDMA_EMU_PROFILE`,
//! `RDMA_EMU_PORTS`, `RDMA_EMU_FABRIC` (programs run this way meet on the host fabric of that
//! name, `default` unless given; `none` keeps each process to itself).

mod demo;

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use rdma_emu::{Fabric, FabricConfig, Profile};

const USAGE: &str = "usage:
  rdma-emu run [--devices N] [--profile rxe|full] [--ports N] [--fabric NAME] -- PROGRAM [ARGS...]
  rdma-emu devices [--devices N] [--profile rxe|full] [--ports N]
  rdma-emu demo";

/// Options shared by `run` and `devices`, as environment variables for the library.
#[derive(Default)]
struct Opts {
    env: Vec<(&'static str, String)>,
}

fn parse_opts(args: &mut std::slice::Iter<'_, String>) -> Result<(Opts, Vec<String>), String> {
    let mut o = Opts::default();
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().cloned().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--devices" => {
                let v = value("--devices")?;
                v.parse::<u32>().map_err(|_| format!("--devices: not a number: {v}"))?;
                o.env.push(("RDMA_EMU_DEVICES", v));
            }
            "--ports" => {
                let v = value("--ports")?;
                v.parse::<u8>().map_err(|_| format!("--ports: not a number: {v}"))?;
                o.env.push(("RDMA_EMU_PORTS", v));
            }
            "--profile" => {
                let v = value("--profile")?;
                Profile::from_name(&v).ok_or(format!("--profile: rxe or full, not {v}"))?;
                o.env.push(("RDMA_EMU_PROFILE", v));
            }
            "--fabric" => o.env.push(("RDMA_EMU_FABRIC", value("--fabric")?)),
            "--" => return Ok((o, args.cloned().collect())),
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            other => {
                let mut rest = vec![other.to_string()];
                rest.extend(args.cloned());
                return Ok((o, rest));
            }
        }
    }
    Ok((o, Vec::new()))
}

/// The directory holding `libibverbs.so.1`: `RDMA_EMU_LIB` (the library file), or the
/// `libibverbs.so` cargo built next to this executable.
fn lib_dir() -> Result<PathBuf, String> {
    let lib = match std::env::var_os("RDMA_EMU_LIB") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            exe.parent().unwrap_or(Path::new(".")).join("libibverbs.so")
        }
    };
    if !lib.exists() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p rdma-emu-shim` or set RDMA_EMU_LIB",
            lib.display()
        ));
    }
    let lib = lib.canonicalize().map_err(|e| e.to_string())?;
    let dir = lib.parent().unwrap_or(Path::new(".")).join("shim");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let link = dir.join("libibverbs.so.1");
    if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
        let tmp = dir.join(format!(".libibverbs.so.1.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&lib, &tmp).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &link).map_err(|e| e.to_string())?;
    }
    Ok(dir)
}

fn run(opts: Opts, argv: Vec<String>) -> Result<ExitCode, String> {
    let Some((prog, args)) = argv.split_first() else { return Err("run: no PROGRAM given".into()) };
    let dir = lib_dir()?;
    let path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut p = dir.into_os_string();
            p.push(":");
            p.push(old);
            p
        }
        _ => dir.into_os_string(),
    };
    let err = Command::new(prog).args(args).envs(opts.env).env("LD_LIBRARY_PATH", path).exec();
    Err(format!("{prog}: {err}"))
}

fn devices(opts: Opts) -> Result<ExitCode, String> {
    let get = |k: &str| {
        opts.env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).or(std::env::var(k).ok())
    };
    // Listing devices creates no QP, so it never joins the host fabric.
    let cfg = FabricConfig::from_vars(get);
    println!("    {:<16}\t   node GUID\t\tprofile\tports", "device");
    println!("    {:<16}\t----------------\t-------\t-----", "------");
    for d in Fabric::new(cfg).devices() {
        let a = d.attr();
        println!(
            "    {:<16}\t{:016x}\t{}\t{}",
            d.name(),
            d.guid(),
            d.profile().name(),
            a.phys_port_cnt
        );
        for p in 1..=a.phys_port_cnt {
            let pa = d.query_port(p).map_err(|e| e.to_string())?;
            let gids = d.gid_table(p).map_err(|e| e.to_string())?;
            let gids: Vec<String> = gids.iter().map(|g| format!("{:?}", g.gid)).collect();
            println!(
                "        port {p}: {:?} {:?} lid {} mtu {:?} gids {}",
                pa.state,
                pa.link_layer,
                pa.lid,
                pa.active_mtu,
                gids.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    let result = match it.next().map(String::as_str) {
        Some("run") => parse_opts(&mut it).and_then(|(o, rest)| run(o, rest)),
        Some("devices") => parse_opts(&mut it).and_then(|(o, rest)| {
            if rest.is_empty() { devices(o) } else { Err(format!("devices: unexpected {rest:?}")) }
        }),
        Some("demo") => {
            demo::run().map(|()| ExitCode::SUCCESS).map_err(|e| format!("demo failed: {e}"))
        }
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(USAGE.to_string()),
    };
    result.unwrap_or_else(|e| {
        eprintln!("rdma-emu: {e}");
        ExitCode::from(2)
    })
}

//! `rdma-emu`: run programs on the emulator, list its devices, or run the demo.
//!
//! ```text
//! rdma-emu run [--devices N] [--profile rxe|full] [--ports N] [--link-layer ib|eth] [--mtu BYTES]
//!              [--fabric NAME] [--seed S] [--faults RULES] [--pcap FILE] -- PROGRAM [ARGS...]
//! rdma-emu devices [--devices N] [--profile rxe|full] [--ports N] [--link-layer ib|eth]
//! rdma-emu event [--fabric NAME] [--device DEV] [--port N] EVENT
//! rdma-emu port [--fabric NAME] [--device DEV] [--port N] up|down
//! rdma-emu demo
//! ```
//!
//! `run` executes PROGRAM with the emulator's `libibverbs.so.1` first on `LD_LIBRARY_PATH`
//! (found next to this executable, or named by `RDMA_EMU_LIB`) and the options passed on as the
//! environment variables the library reads: `RDMA_EMU_DEVICES`, `RDMA_EMU_PROFILE`,
//! `RDMA_EMU_PORTS`, `RDMA_EMU_LINK_LAYER`, `RDMA_EMU_MTU` (the netdev MTU under Ethernet
//! ports, which their active MTU follows), `RDMA_EMU_FABRIC` (programs run this way meet on the host fabric of that
//! name, `default` unless given; `none` keeps each process to itself), `RDMA_EMU_SEED`
//! (simulation: virtual time, seeded choices), `RDMA_EMU_FAULTS` (fault rules, see
//! `docs/faults.md`) and `RDMA_EMU_PCAP` (a packet trace).
//!
//! `event` and `port` reach every process on the host fabric that has the device open: a port
//! or device event to test handlers with (`ibv_asyncwatch` prints it), or a port going down.

mod demo;
// The library's own sysfs writer (it is a module of the cdylib, which a binary cannot link):
// `run` writes the tree before the program starts. Only `write_tree` and `sweep` are used
// here.
#[allow(dead_code)]
#[path = "../../sysfs.rs"]
mod sysfs;
mod view;

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use rdma_emu::{Fabric, FabricConfig, Profile};

const USAGE: &str = "usage:
  rdma-emu run [--devices N] [--profile rxe|full] [--ports N] [--link-layer ib|eth] [--mtu BYTES]
               [--fabric NAME] [--seed S] [--faults RULES] [--pcap FILE] [--wire IP[=DEV[:PORT]]]
               -- PROGRAM [ARGS...]
  rdma-emu devices [--devices N] [--profile rxe|full] [--ports N] [--link-layer ib|eth]
  rdma-emu event [--fabric NAME] [--device DEV] [--port N] EVENT   (e.g. PORT_ERR, DEVICE_FATAL)
  rdma-emu port [--fabric NAME] [--device DEV] [--port N] up|down
  rdma-emu demo";

/// Options: the fabric's, as environment variables for the library; `--device`/`--port` name
/// the target of `event` and `port`.
#[derive(Default)]
struct Opts {
    env: Vec<(&'static str, String)>,
    device: Option<String>,
    port: Option<u8>,
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
            "--link-layer" => {
                let v = match value("--link-layer")?.as_str() {
                    "eth" | "ethernet" => "ethernet",
                    "ib" | "infiniband" => "infiniband",
                    v => return Err(format!("--link-layer: ib or eth, not {v}")),
                };
                o.env.push(("RDMA_EMU_LINK_LAYER", v.to_owned()));
            }
            "--mtu" => {
                let v = value("--mtu")?;
                FabricConfig::parse_netdev_mtu(&v).map_err(|e| format!("--mtu: {e}"))?;
                o.env.push(("RDMA_EMU_MTU", v));
            }
            "--profile" => {
                let v = value("--profile")?;
                Profile::from_name(&v).ok_or(format!("--profile: rxe or full, not {v}"))?;
                o.env.push(("RDMA_EMU_PROFILE", v));
            }
            "--fabric" => o.env.push(("RDMA_EMU_FABRIC", value("--fabric")?)),
            "--wire" => {
                let v = value("--wire")?;
                rdma_emu::cm::addr::PortAddress::parse_wire_list(&v)
                    .map_err(|e| format!("--wire: {e}"))?;
                o.env.push(("RDMA_EMU_WIRE", v));
            }
            "--seed" => {
                let v = value("--seed")?;
                v.parse::<u64>().map_err(|_| format!("--seed: not a number: {v}"))?;
                o.env.push(("RDMA_EMU_SEED", v));
            }
            "--faults" => {
                let v = value("--faults")?;
                rdma_emu::FaultRule::parse(&v).map_err(|e| format!("--faults: {e}"))?;
                o.env.push(("RDMA_EMU_FAULTS", v));
            }
            "--pcap" => {
                let v = value("--pcap")?;
                // The program may change directory: hand it an absolute path.
                let abs = std::path::absolute(&v).map_err(|e| format!("--pcap {v}: {e}"))?;
                o.env.push(("RDMA_EMU_PCAP", abs.to_string_lossy().into_owned()));
            }
            "--device" => o.device = Some(value("--device")?),
            "--port" => {
                let v = value("--port")?;
                o.port = Some(v.parse().map_err(|_| format!("--port: not a port number: {v}"))?);
            }
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
    link_into(&dir, "libibverbs.so.1", &lib)?;
    // The connection manager's face, built next to it (`cargo build -p rdmacm-shim`).
    let cm = lib.with_file_name("librdmacm.so");
    if cm.exists() {
        link_into(&dir, "librdmacm.so.1", &cm)?;
    }
    Ok(dir)
}

/// Makes `dir/name` a link to `target` (canonical), replacing another link atomically; one
/// that already leads there (the relative link the build leaves) is kept.
fn link_into(dir: &Path, name: &str, target: &Path) -> Result<(), String> {
    let link = dir.join(name);
    if link.canonicalize().ok().as_deref() != Some(target) {
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &link).map_err(|e| e.to_string())?;
    }
    Ok(())
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
    let mut cmd = Command::new(prog);
    cmd.args(args).env("LD_LIBRARY_PATH", path);
    // The devices' kernel-facing files, in the program's own view of /sys and /dev; the tree
    // is named after this process, which becomes the program.
    let tree = rdma_emu::private_dir(&format!("sysfs-{}", std::process::id()))
        .map_err(|e| format!("the devices' sysfs tree: {e}"))?;
    if let Some(parent) = tree.parent() {
        sysfs::sweep(parent, None);
    }
    cmd.env("RDMA_EMU_SYSFS", &tree);
    // Written now, so that a step that looks before any verbs program has run (`ls
    // /sys/class/infiniband`) finds the devices; the library rewrites it when it lists them.
    let cfg = fabric_config(&opts);
    let (devices, cfg_host) = (cfg.devices, cfg.host.clone());
    // (No packet trace, faults or wire sockets: this fabric only describes the devices; a
    // wire port's address is in its GID table.)
    let mut addresses = cfg.addresses.clone();
    if let Some((_, w)) = opts.env.iter().find(|(n, _)| *n == "RDMA_EMU_WIRE") {
        addresses.extend(rdma_emu::cm::addr::PortAddress::parse_wire_list(w).unwrap_or_default());
    }
    let describe = FabricConfig { pcap: None, faults: Vec::new(), addresses, ..cfg };
    let fabric = Fabric::try_new(describe).map_err(|e| format!("the devices: {e}"))?;
    sysfs::write_tree(&tree, &fabric.devices())
        .map_err(|e| format!("the devices' sysfs tree: {e}"))?;
    drop(fabric);
    let wanted = std::env::var("RDMA_EMU_NAMESPACE").map_or(true, |v| v != "0");
    // Inside a user namespace, root's directories on the way to the host fabric show as the
    // overflow id: say which they are while their owner can still be seen.
    if wanted && let Some(name) = &cfg_host {
        let dirs = rdma_emu::root_dirs_on_the_way(name)
            .map_err(|e| format!("the host fabric's directory: {e}"))?;
        cmd.env(rdma_emu::ROOT_DIRS_VAR, dirs);
    }
    if wanted && view::enter(&tree, devices).map_err(|e| format!("the devices' view: {e}"))? {
        cmd.env("RDMA_EMU_SYSFS_MOUNTED", "1");
    }
    let err = cmd.envs(opts.env).exec();
    Err(format!("{prog}: {err}"))
}

/// The fabric the options and the environment describe (options win).
fn fabric_config(opts: &Opts) -> FabricConfig {
    FabricConfig::from_vars(|k: &str| {
        opts.env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).or(std::env::var(k).ok())
    })
}

/// `event` and `port`: the device and port named by the options (`emu0`, port 1 by default),
/// on a fabric that joins the host fabric to reach the other processes.
fn target(opts: &Opts) -> Result<(rdma_emu::Device, u8), String> {
    let cfg = fabric_config(opts);
    if cfg.host.is_none() {
        return Err("RDMA_EMU_FABRIC=none: there are no other processes to reach".into());
    }
    let name = opts.device.as_deref().unwrap_or("emu0");
    let dev = Fabric::new(cfg).device(name).ok_or(format!("no device {name}"))?;
    Ok((dev, opts.port.unwrap_or(1)))
}

/// `rdma-emu event [--device D] [--port N] EVENT`: raises a port or device event in every
/// process on the host fabric that has the device open.
fn event(opts: Opts, rest: &[String]) -> Result<ExitCode, String> {
    let [name] = rest else { return Err("event: give one event name, e.g. PORT_ERR".into()) };
    let ev = (0..=19)
        .map(rdma_emu::EventType)
        .find(|e| e.name() == Some(name.trim_start_matches("IBV_EVENT_")))
        .ok_or(format!("event: unknown event {name}"))?;
    let (dev, port) = target(&opts)?;
    let port = (ev != rdma_emu::EventType::DEVICE_FATAL).then_some(port);
    let n = dev.raise_event_host_wide(ev, port).map_err(|e| format!("event {name}: {e}"))?;
    println!("raised {ev:?} on {} in {n} other process(es)", dev.name());
    Ok(ExitCode::SUCCESS)
}

/// `rdma-emu port [--device D] [--port N] up|down`: a cable pull (or plug) seen by every
/// process on the host fabric.
fn port(opts: Opts, rest: &[String]) -> Result<ExitCode, String> {
    let state = match rest {
        [s] if s == "up" => rdma_emu::PortState::ACTIVE,
        [s] if s == "down" => rdma_emu::PortState::DOWN,
        _ => return Err("port: give up or down".into()),
    };
    let (dev, port) = target(&opts)?;
    let n = dev.set_port_state_host_wide(port, state).map_err(|e| format!("port: {e}"))?;
    println!("port {port} of {} is {state:?} in {n} other process(es)", dev.name());
    Ok(ExitCode::SUCCESS)
}

fn devices(opts: Opts) -> Result<ExitCode, String> {
    // Listing devices opens no context, so it never joins the host fabric.
    let cfg = fabric_config(&opts);
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
        Some("event") => parse_opts(&mut it).and_then(|(o, rest)| event(o, &rest)),
        Some("port") => parse_opts(&mut it).and_then(|(o, rest)| port(o, &rest)),
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

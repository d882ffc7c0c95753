//! Building the C trace runner (`conformance/runner/runner.c`) and running programs through it,
//! on the emulator (the shim's `libibverbs.so.1`, `rxe` profile) or on the system's own device.

use crate::program::{self, Program};
use crate::trace::{self, Trace};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The repository's root (this crate lives in `conformance/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// `target/<profile>/`: the nearest ancestor of the running executable that holds the shim.
pub fn profile_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    exe.ancestors().find(|d| d.join("libibverbs.so").exists()).map(Path::to_path_buf).ok_or_else(
        || {
            format!(
                "no libibverbs.so beside {}: run cargo build --workspace --release",
                exe.display()
            )
        },
    )
}

/// Compiles the runner against the system's verbs header into `<profile>/conformance-work/runner`.
pub fn build() -> Result<PathBuf, String> {
    let out_dir = profile_dir()?.join("conformance-work");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let exe = out_dir.join("runner");
    let src = repo_root().join("conformance/runner/runner.c");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if mtime(&exe).is_some() && mtime(&exe) >= mtime(&src) {
        // Up to date; inside the VM, which has no compiler, this is the host's build.
        return Ok(exe);
    }
    let out = Command::new("cc")
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .map_err(|e| format!("running cc: {e} (install gcc and libibverbs-dev)"))?;
    if !out.status.success() {
        return Err(format!(
            "compiling {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// Where the programs run.
#[derive(Clone, Debug)]
pub enum Device {
    /// The emulator through the shim, `rxe` profile.
    Emulator,
    /// Whatever libibverbs finds first on this machine (rxe0 in the VM).
    System,
}

/// A directory with `libibverbs.so.1` linked to the built shim, for `LD_LIBRARY_PATH`.
fn shim_dir() -> Result<PathBuf, String> {
    let profile = profile_dir()?;
    let dir = profile.join("conformance-work/shim");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let link = dir.join("libibverbs.so.1");
    let target = profile.join("libibverbs.so");
    if std::fs::read_link(&link).ok() != Some(target.clone()) {
        // Several test threads may get here at once: make the link privately, then rename.
        let tmp =
            dir.join(format!(".link.{}.{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &link).map_err(|e| e.to_string())?;
    }
    Ok(dir)
}

/// The runner's first program, whose trace is dropped: an async event queued before the first
/// program opened its device (rxe's PORT_ACTIVE while the VM boots) lands here, not in a trace.
const WARMUP: &str = "program warmup\nevents\nend\n";

/// Runs `programs` in one runner process on `device`; `settle_ms` is how long the runner waits
/// for late completions and events (the VM's software CPU needs more than the emulator).
pub fn run(
    exe: &Path,
    device: &Device,
    programs: &[Program],
    settle_ms: u32,
) -> Result<Vec<Trace>, String> {
    run_with(exe, device, programs, settle_ms, &[])
}

/// [`run`] with extra environment variables (set after the emulator's own are cleared).
pub fn run_with(
    exe: &Path,
    device: &Device,
    programs: &[Program],
    settle_ms: u32,
    env: &[(&str, &str)],
) -> Result<Vec<Trace>, String> {
    let mut cmd = Command::new(exe);
    cmd.env("RUNNER_SETTLE_MS", settle_ms.to_string())
        .env("RXE_GID_INDEX", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Device::Emulator = device {
        cmd.env("LD_LIBRARY_PATH", shim_dir()?).env("RDMA_EMU_PROFILE", "rxe");
        for var in [
            "RDMA_EMU_FAULTS",
            "RDMA_EMU_SEED",
            "RDMA_EMU_PCAP",
            "RDMA_EMU_DEVICES",
            "RDMA_EMU_HOST",
        ] {
            cmd.env_remove(var);
        }
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().map_err(|e| format!("running {}: {e}", exe.display()))?;
    let input = input_text(programs);
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Feed the programs from a thread: the runner's output would otherwise fill its pipe.
    let feeder =
        std::thread::spawn(move || std::io::Write::write_all(&mut stdin, input.as_bytes()));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let _ = feeder.join();
    let traces = parse_output(&String::from_utf8_lossy(&out.stdout))?;
    if !out.status.success() && traces.len() < programs.len() {
        return Err(format!(
            "the runner failed ({}) after {} of {} programs:\n{}",
            out.status,
            traces.len(),
            programs.len(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(traces)
}

/// What the runner reads to run `programs`: the warm-up program, then theirs.
pub fn input_text(programs: &[Program]) -> String {
    format!("{WARMUP}{}", program::text_of(programs))
}

/// The traces in the runner's output, without the warm-up's.
pub fn parse_output(stdout: &str) -> Result<Vec<Trace>, String> {
    let mut traces = trace::parse(stdout)?;
    if traces.first().is_some_and(|t| t.program == "warmup") {
        traces.remove(0);
    }
    Ok(traces)
}

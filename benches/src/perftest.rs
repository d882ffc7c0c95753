//! G2 and G4b: Debian's unmodified perftest as server and client processes on the shim, meeting
//! on a host fabric of their own, next to the baseline measured in the same run.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// `rdma-emu`, built next to this binary.
fn rdma_emu() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = exe.parent().unwrap().join("rdma-emu");
    p.exists().then_some(p).ok_or("rdma-emu missing: cargo build --release --workspace".into())
}

/// Runs `prog args` as server and client (one fresh host fabric, one free TCP port); the
/// client's output.
pub fn run(prog: &str, args: &[&str]) -> Result<String, String> {
    let emu = rdma_emu()?;
    let fabric = format!("bench-{}", std::process::id());
    let port_num = crate::listen::free_port().map_err(|e| e.to_string())?;
    let port = port_num.to_string();
    // Each program on a core of its own (the server on the last, the client on the first),
    // as the in-process goals pin their two threads; with one core, both share it.
    let online =
        std::fs::read_to_string("/sys/devices/system/cpu/online").map_err(|e| e.to_string())?;
    let last = online.trim().rsplit(['-', ',']).next().unwrap_or("0").to_owned();
    let cmd = |cpu: &str| {
        let mut c = Command::new("taskset");
        c.args(["-c", cpu]).arg(&emu);
        c.args(["run", "--fabric", &fabric, "--", prog]).args(args).args(["-p", &port]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let server = cmd(&last).spawn().map_err(|e| format!("{prog}: {e}"))?;
    // perftest's client does not retry its TCP connection: give the server time to listen.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !crate::listen::listening(port_num) {
        if Instant::now() > deadline {
            return Err(format!("{prog} server did not listen"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = cmd("0").arg("127.0.0.1").output().map_err(|e| e.to_string())?;
    let server = server.wait_with_output().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(rdma_emu::fabric_dir(&fabric));
    if !client.status.success() || !server.status.success() {
        return Err(format!(
            "{prog} failed:\n{}{}",
            String::from_utf8_lossy(&client.stdout),
            String::from_utf8_lossy(&client.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&client.stdout).into_owned())
}

/// Column `col` of perftest's first result row (the line that starts with the size).
pub fn result(out: &str, col: usize) -> Result<f64, String> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() > col && w[0].parse::<u64>().is_ok() && w[1].parse::<u64>().is_ok())
        .and_then(|w| w[col].parse().ok())
        .ok_or(format!("no result row in:\n{out}"))
}

//! G2, G4b, CM1 and CM2: Debian's unmodified perftest and cmtime as server and client
//! processes on the shim, meeting on a host fabric of their own, next to the baseline measured
//! in the same run.

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

/// How a server shows it is ready for its client, and whether it ends by itself.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// It listens on its TCP port (perftest's own exchange).
    Tcp,
    /// It listens on its port through the connection manager (`RDMA_PS_TCP`).
    Cm,
    /// As `Cm`, and it serves until stopped (cmtime): it is killed once the client is done.
    CmForever,
}

/// Runs `prog args` as server and client (one fresh host fabric, one free port, given with
/// `port_flag`; `client_args` only to the client, before the server's address `to`); the
/// client's output.
pub fn run(prog: &str, args: &[&str]) -> Result<String, String> {
    run_with(prog, args, &[], "-p", Ready::Tcp, Some("127.0.0.1"))
}

pub fn run_with(
    prog: &str,
    args: &[&str],
    client_args: &[&str],
    port_flag: &str,
    ready: Ready,
    to: Option<&str>,
) -> Result<String, String> {
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
        c.args(["run", "--fabric", &fabric, "--", prog]).args(args).args([port_flag, &port]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let server = cmd(&last).spawn().map_err(|e| format!("{prog}: {e}"))?;
    // perftest's client does not retry its TCP connection: give the server time to listen.
    let deadline = Instant::now() + Duration::from_secs(10);
    let listening = || match ready {
        Ready::Tcp => crate::listen::listening(port_num),
        Ready::Cm | Ready::CmForever => cm_listening(&fabric, port_num),
    };
    while !listening() {
        if Instant::now() > deadline {
            return Err(format!("{prog} server did not listen"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = cmd("0").args(client_args).args(to).output().map_err(|e| e.to_string())?;
    let mut server = server;
    // A client that failed (its connection refused, say) leaves a server that waits for it
    // forever: the failure is reported, not waited for.
    if ready == Ready::CmForever || !client.status.success() {
        let _ = server.kill();
    }
    let server = server.wait_with_output().map_err(|e| e.to_string())?;
    let server_ok = server.status.success() || ready == Ready::CmForever;
    let _ = std::fs::remove_dir_all(rdma_emu::fabric_dir(&fabric));
    if !client.status.success() || !server_ok {
        return Err(format!(
            "{prog} failed:\n{}{}",
            String::from_utf8_lossy(&client.stdout),
            String::from_utf8_lossy(&client.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&client.stdout).into_owned())
}

/// Whether a process of `fabric` listens on CM port `port` (its port file says so).
fn cm_listening(fabric: &str, port: u16) -> bool {
    let file = rdma_emu::fabric_dir(fabric).join(format!("cm-106-{port}"));
    std::fs::read_to_string(file).is_ok_and(|t| t.contains("listen"))
}

/// The pingpong examples' `N iters in S seconds = U usec/iter`: U.
pub fn usec_per_iter(out: &str) -> Result<f64, String> {
    out.lines()
        .find(|l| l.ends_with("usec/iter"))
        .and_then(|l| l.split_whitespace().rev().nth(1)?.parse().ok())
        .ok_or_else(|| format!("no usec/iter in:\n{out}"))
}

/// cmtime's average microseconds per connection of `step` (its table's last column).
pub fn cmtime_step_us(out: &str, step: &str) -> Result<f64, String> {
    out.lines()
        .find(|l| l.split_once(':').is_some_and(|(name, _)| name.trim() == step))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .ok_or(format!("no '{step}' row in:\n{out}"))
}

/// Column `col` of perftest's first result row (the line that starts with the size).
pub fn result(out: &str, col: usize) -> Result<f64, String> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() > col && w[0].parse::<u64>().is_ok() && w[1].parse::<u64>().is_ok())
        .and_then(|w| w[col].parse().ok())
        .ok_or(format!("no result row in:\n{out}"))
}

/// Debian's `librspreload.so`: a program's TCP sockets become rsockets.
const RSPRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// iperf3's sender rate in Gb/s for a 2-second run between two processes: over rsockets on
/// the emulator (librspreload under `rdma-emu run`), or over the kernel's TCP on loopback.
pub fn iperf3_gbps(over_rsockets: bool) -> Result<f64, String> {
    let emu = rdma_emu()?;
    let fabric = format!("bench-iperf-{}", std::process::id());
    let port_num = crate::listen::free_port().map_err(|e| e.to_string())?;
    let port = port_num.to_string();
    let cmd = |args: &[&str]| {
        let mut c = if over_rsockets {
            let mut c = Command::new(&emu);
            c.args(["run", "--fabric", &fabric, "--", "env"]);
            c.arg(format!("LD_PRELOAD={RSPRELOAD}")).arg("iperf3");
            c
        } else {
            Command::new("iperf3")
        };
        c.args(args).args(["-p", &port]).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let server = cmd(&["-s", "-1"]).spawn().map_err(|e| format!("iperf3: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let listening = || match over_rsockets {
        true => cm_listening(&fabric, port_num),
        false => crate::listen::listening(port_num),
    };
    while !listening() {
        if Instant::now() > deadline {
            return Err("iperf3 server did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = cmd(&["-c", "127.0.0.1", "-t", "2"]).output().map_err(|e| e.to_string())?;
    let _ = server.wait_with_output();
    let _ = std::fs::remove_dir_all(rdma_emu::fabric_dir(&fabric));
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    let sender = out.lines().find(|l| l.trim_end().ends_with("sender")).unwrap_or_default();
    let w: Vec<&str> = sender.split_whitespace().collect();
    let rate = w.iter().position(|u| u.ends_with("bits/sec")).and_then(|i| {
        let scale = match w[i].chars().next() {
            Some('G') => 1.0,
            Some('M') => 1e-3,
            Some('K') => 1e-6,
            _ => 1e-9,
        };
        w.get(i - 1)?.parse::<f64>().ok().map(|v| v * scale)
    });
    rate.ok_or(format!("iperf3 failed:\n{out}{}", String::from_utf8_lossy(&client.stderr)))
}

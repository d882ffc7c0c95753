//! Real RDMA stacks, unmodified from Debian, under `rdma-emu run`: UCX finds the emulated
//! devices where it looks for them (`/dev/infiniband/uverbsN`, `/sys/class/infiniband`) and
//! carries traffic over them between two processes.

mod common;
use std::{
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

/// A host fabric name used by one test only, removed afterwards.
struct Fabric(String);

impl Fabric {
    fn new() -> Fabric {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Fabric(format!("stacks-{}-{n}", std::process::id()))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(rdma_emu::fabric_dir(&self.0));
    }
}

fn program(fabric: &Fabric, profile: &str, prog: &str, args: &[&str]) -> Command {
    let path = format!("/usr/bin/{prog}");
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: install Debian's ucx-utils (./ci.sh does)"
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdma-emu"));
    c.env("RDMA_EMU_LIB", common::cdylib()).env_remove("LD_LIBRARY_PATH");
    c.args(["run", "--profile", profile, "--fabric", &fabric.0, "--", &path]).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits for `child` within `limit` (a guard against hangs, not a timing assertion).
fn finish(child: Child, limit: Duration) -> (bool, String) {
    common::finish(child, limit, "the program")
}

#[test]
fn ucx_lists_rc_and_ud_verbs_on_every_emulated_port() {
    for profile in ["full", "rxe"] {
        let fabric = Fabric::new();
        let mut c = program(&fabric, profile, "ucx_info", &["-d"]);
        c.env("RDMA_EMU_DEVICES", "2");
        let (ok, out) = finish(c.spawn().unwrap(), Duration::from_secs(60));
        assert!(ok, "{profile}: {out}");
        for dev in ["emu0:1", "emu1:1"] {
            for tl in ["rc_verbs", "ud_verbs"] {
                let listed = out.split("#      Transport: ").any(|block| {
                    block.starts_with(tl) && block.contains(&format!("Device: {dev}\n"))
                });
                assert!(listed, "{profile}: no {tl} on {dev} in:\n{out}");
            }
        }
    }
}

#[test]
fn ucx_perftest_runs_over_rc_and_ud_verbs_between_two_processes() {
    let tests =
        [("tag_lat", "13371"), ("tag_bw", "13372"), ("ucp_put_bw", "13373"), ("ucp_get", "13374")];
    for (test, port) in tests {
        let fabric = Fabric::new();
        let with_tls = |mut c: Command| {
            c.env("UCX_TLS", "rc_verbs,ud_verbs").env("UCX_NET_DEVICES", "emu0:1");
            c
        };
        let mut server = with_tls(program(&fabric, "full", "ucx_perftest", &["-p", port]));
        let s = server.spawn().unwrap();
        // Its TCP listener for the address exchange comes up in well under a second.
        std::thread::sleep(Duration::from_secs(1));
        let args = ["-p", port, "-t", test, "-s", "4096", "-n", "2000", "127.0.0.1"];
        let mut client = with_tls(program(&fabric, "full", "ucx_perftest", &args));
        let (c_ok, c_out) = finish(client.spawn().unwrap(), Duration::from_secs(90));
        let (s_ok, s_out) = finish(s, Duration::from_secs(30));
        assert!(c_ok && s_ok, "{test}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        assert!(c_out.contains("Final:"), "{test}: {c_out}");
    }
}

//! Unmodified binaries from Debian's packages (`ibverbs-utils`, `perftest`) run as server and
//! client, two processes meeting on the host fabric under `rdma-emu run`, and must report
//! success: every program and option combination the programs themselves accept.

mod common;
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A TCP port nobody listens on right now, for the programs' own connection setup.
#[path = "../../benches/src/listen.rs"]
mod listen;
use listen::listening;

fn free_port() -> u16 {
    listen::free_port().unwrap()
}

/// `prog args` under `rdma-emu run`; `profile` is the profile's name, optionally followed by
/// more `rdma-emu run` options.
fn program(fabric: &Fabric, profile: &str, prog: &str, args: &[&str], port: u16) -> Command {
    assert!(
        Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .output()
            .unwrap()
            .status
            .success(),
        "{prog} is not installed (Debian packages ibverbs-utils, perftest and valgrind; ./ci.sh installs them)"
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdma-emu"));
    c.env("RDMA_EMU_LIB", common::cdylib()).env_remove("LD_LIBRARY_PATH");
    c.args(["run", "--profile"]).args(profile.split_whitespace());
    c.args(["--fabric", &fabric.0, "--", prog]);
    c.args(args).args(["-p", &port.to_string()]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

use common::{Fabric, Killed, finish, finish_or_dump, result_rows};

/// Starts `prog args` as the server and waits until it listens on `port`.
fn start_server(fabric: &Fabric, profile: &str, prog: &str, args: &[&str], port: u16) -> Child {
    spawn_listening(&mut program(fabric, profile, prog, args, port), prog, port)
}

/// Spawns `server` (`prog`) and waits until it listens on TCP `port`.
fn spawn_listening(server: &mut Command, prog: &str, port: u16) -> Child {
    let server = server.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listening(port) {
        assert!(Instant::now() < deadline, "{prog} server never listened on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
    server
}

/// Runs `prog args` as server, then as client of it; both must succeed. The client's output.
fn server_and_client(profile: &str, prog: &str, args: &[&str]) -> String {
    let run = || {
        let (fabric, port) = (Fabric::new("legacy"), free_port());
        let server = start_server(&fabric, profile, prog, args, port);
        let client = program(&fabric, profile, prog, args, port).arg("localhost").spawn().unwrap();
        let (c_ok, c_out) = finish_or_dump(client, Duration::from_secs(120), "client", &[&server]);
        let (s_ok, s_out) = finish(server, Duration::from_secs(20), "server");
        (c_ok && s_ok, c_out, s_out, sockets(&fabric))
    };
    let (mut ok, mut c_out, mut s_out, mut left) = run();
    // perftest times its report with the CPU's cycle counter, whose rate it samples first; on
    // a loaded machine the samples can scatter ("Correlation coefficient r^2 < 0.9"), and it
    // gives up ("Can't produce a report") whatever the transfer did. Such a run is tried once
    // more; any other failure, or a second one, fails.
    let unsampled = |out: &str| out.contains("Correlation coefficient r^2");
    if !ok && (unsampled(&c_out) || unsampled(&s_out)) {
        (ok, c_out, s_out, left) = run();
    }
    assert!(ok, "{prog} {args:?}\n--- client:\n{c_out}\n--- server:\n{s_out}");
    // Both left the fabric's directory as they found it.
    assert!(left.is_empty(), "{prog} {args:?}: sockets left behind: {left:?}");
    c_out
}

/// The sockets left in a fabric's directory.
fn sockets(fabric: &Fabric) -> Vec<String> {
    let names = std::fs::read_dir(fabric.dir()).into_iter().flatten().flatten();
    names
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock"))
        .collect()
}

/// Kills the server with SIGKILL while it transfers: the client must not hang, and must fail.
fn kill_server_mid_transfer(prog: &str, args: &[&str]) -> String {
    let (fabric, port) = (Fabric::new("legacy"), free_port());
    let mut server = start_server(&fabric, "full", prog, args, port);
    let client = program(&fabric, "full", prog, args, port).arg("localhost").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    server.kill().unwrap();
    server.wait().unwrap();
    let (ok, out) = finish(client, Duration::from_secs(30), "client");
    assert!(!ok, "{prog}: the client cannot succeed without its server\n{out}");
    assert!(!out.contains("did not finish"), "{prog}: the client hung\n{out}");
    assert!(out.contains("remote address"), "{prog}: killed before connecting\n{out}");
    out
}

#[test]
fn a_pingpong_server_killed_mid_transfer_leaves_the_client_with_error_completions() {
    let out = kill_server_mid_transfer("ibv_rc_pingpong", &["-n", "100000000"]);
    // The client's outstanding work requests complete in error (flushed once its peer's
    // death is noticed, or out of retries).
    assert!(out.contains("Failed status"), "{out}");
}

#[test]
fn a_perftest_server_killed_mid_transfer_does_not_hang_the_client() {
    kill_server_mid_transfer("ib_write_bw", &["-D", "60"]);
}

/// `ib_write_bw` whose server is stopped mid-run (SIGSTOP, as at a debugger's breakpoint) for
/// three times the client's whole retry budget (perftest's timeout 14 with 7 retries: about
/// 0.5 s): once the server continues, the run ends as if nothing happened. (The WRITEs
/// complete only then: divergences #16.)
#[test]
fn a_perftest_pair_outlives_its_server_stopped_mid_run() {
    let (fabric, port) = (Fabric::new("legacy"), free_port());
    let args = ["-D", "4"];
    let server = start_server(&fabric, "full", "ib_write_bw", &args, port);
    let client = program(&fabric, "full", "ib_write_bw", &args, port).arg("localhost").spawn();
    let client = client.unwrap();
    // Mid-run: the client, which sleeps until connected, has spun on its CQ a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cpu_ticks(client.id()) < 30 {
        assert!(Instant::now() < deadline, "the client never started its run");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signals a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGCONT) }, 0);
    let (c_ok, c_out) = finish_or_dump(client, Duration::from_secs(60), "client", &[&server]);
    let (s_ok, s_out) = finish(server, Duration::from_secs(20), "server");
    assert!(c_ok && s_ok && c_out.contains("BW average"), "{c_out}\n--- server:\n{s_out}");
}

/// The CPU time process `pid` has used, in clock ticks (hundredths of a second).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // utime and stime: the 12th and 13th fields after the parenthesised command name.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum()
}

fn pingpong(prog: &str, extra: &[&str]) {
    for profile in ["full", "rxe"] {
        let mut args = vec!["-n", "20"];
        if profile == "rxe" {
            args.extend(["-g", "0"]); // RoCE: addressed by GID
        }
        args.extend(extra);
        let out = server_and_client(profile, prog, &args);
        assert!(out.contains("20 iters in"), "{prog} {args:?}: {out}");
    }
}

/// `ibv_xsrq_pingpong`: XRC, so the full profile only (rxe has no XRC; see below). Its
/// default single client; the server sends first, the client answers, both print "success".
fn xsrq(prog: &str, extra: &[&str]) {
    let mut args = vec!["-n", "20"];
    args.extend(extra);
    let out = server_and_client("full", prog, &args);
    assert!(out.lines().any(|l| l == "success"), "{prog} {args:?}: {out}");
}

/// `ibv_xsrq_pingpong -c 3`: one server, three client processes. Every process opens
/// `/tmp/xrc_domain`, so all four hold one XRC domain, and the server sends to each client
/// round robin over the other clients' connections: a target QP in one client process
/// delivers into another client's SRQ.
#[test]
fn xsrq_pingpong_with_three_clients_shares_the_xrc_domain_between_processes() {
    let (fabric, port) = (Fabric::new("legacy"), free_port());
    let args = ["-n", "20"];
    let server_args = ["-n", "20", "-c", "3"];
    let server = start_server(&fabric, "full", "ibv_xsrq_pingpong", &server_args, port);
    let clients: Vec<Child> = (0..3)
        .map(|_| {
            let mut c = program(&fabric, "full", "ibv_xsrq_pingpong", &args, port);
            c.arg("localhost").spawn().unwrap()
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let (ok, out) = finish(c, Duration::from_secs(60), "client");
        assert!(ok && out.lines().any(|l| l == "success"), "client {i}: {out}");
    }
    let (ok, out) = finish(server, Duration::from_secs(20), "server");
    assert!(ok && out.lines().any(|l| l == "success"), "server: {out}");
    assert_eq!(out.matches("remote:").count(), 3, "{out}");
}

#[test]
fn xsrq_pingpong_on_the_rxe_profile_fails_cleanly_without_xrc() {
    let (fabric, port) = (Fabric::new("legacy"), free_port());
    let server = program(&fabric, "rxe", "ibv_xsrq_pingpong", &[], port).spawn().unwrap();
    let (ok, out) = finish(server, Duration::from_secs(20), "server");
    assert!(!ok && out.contains("Couldn't Open the XRC Domain 95"), "{out}"); // EOPNOTSUPP
}

/// A perftest program with `extra` options; with `-a`, one result row per size from 2 bytes
/// to 8 MiB.
fn perftest(prog: &str, extra: &[&str]) {
    let mut args = vec!["-n", "10"];
    args.extend(extra);
    let out = server_and_client("full", prog, &args);
    let rows = result_rows(&out);
    let want = if extra.contains(&"-a") { 23 } else { 1 };
    assert_eq!(rows, want, "{prog} {args:?}: {out}");
}

/// The same under the rxe profile: RoCE, so perftest addresses its peer by GID.
fn perftest_rxe(prog: &str, extra: &[&str]) {
    let mut args = vec!["-n", "10"];
    args.extend(extra);
    let out = server_and_client("rxe", prog, &args);
    assert_eq!(result_rows(&out), 1, "{prog} {args:?}: {out}");
}

/// `ib_write_lat` with each process on a core of its own, its reader sharing it with the
/// application spinning on its buffer: the WRITEs are carried out as they are sent, thousands
/// in a row, their records (more than a ring holds) only to be accounted for by a reader left
/// asleep, and woken in time.
#[test]
fn write_lat_pinned_to_a_core_per_process_runs_to_the_end() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return;
    }
    for transport in ["RC", "UC"] {
        let args = ["-c", transport, "-s", "4096", "-n", "3000"];
        let (fabric, port) = (Fabric::new("legacy"), free_port());
        let pinned = |core: &'static str| {
            let mut a = vec!["-c", core, "ib_write_lat"];
            a.extend(args);
            a
        };
        let server = start_server(&fabric, "full", "taskset", &pinned("1"), port);
        let mut client = program(&fabric, "full", "taskset", &pinned("0"), port);
        let client = client.arg("localhost").spawn().unwrap();
        let (c_ok, c_out) = finish_or_dump(client, Duration::from_secs(60), "client", &[&server]);
        let (s_ok, s_out) = finish(server, Duration::from_secs(20), "server");
        assert!(c_ok && s_ok, "{transport}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        assert_eq!(result_rows(&c_out), 1, "{transport}: {c_out}");
    }
}

#[test]
fn jumbo_frame_ud_messages_run_on_the_rxe_profile_over_a_jumbo_netdev_only() {
    let args = ["-n", "10", "-c", "UD", "-s", "4096", "-m", "4096"];
    let out = server_and_client("rxe --mtu 9000", "ib_send_bw", &args);
    assert_eq!(result_rows(&out), 1, "{out}");
    // Over the default 1500-byte netdev the port's MTU is 1024, as rxe's: perftest refuses.
    let (fabric, port) = (Fabric::new("legacy"), free_port());
    let server = start_server(&fabric, "rxe", "ib_send_bw", &args, port);
    let client = program(&fabric, "rxe", "ib_send_bw", &args, port).arg("localhost").spawn();
    let (ok, out) = finish(client.unwrap(), Duration::from_secs(60), "client");
    assert!(!ok && out.contains("Max message size in UD cannot be greater than MTU"), "{out}");
    finish(server, Duration::from_secs(20), "server");
}

macro_rules! legacy_tests {
    ($runner:ident: $($name:ident => $prog:literal [$($opt:literal),*];)*) => {$(
        #[test]
        fn $name() {
            $runner($prog, &[$($opt),*]);
        }
    )*};
}

legacy_tests! { pingpong:
    rc_pingpong => "ibv_rc_pingpong" [];
    rc_pingpong_events => "ibv_rc_pingpong" ["-e"];
    uc_pingpong => "ibv_uc_pingpong" [];
    uc_pingpong_events => "ibv_uc_pingpong" ["-e"];
    ud_pingpong => "ibv_ud_pingpong" [];
    ud_pingpong_events => "ibv_ud_pingpong" ["-e"];
    srq_pingpong => "ibv_srq_pingpong" [];
    srq_pingpong_events => "ibv_srq_pingpong" ["-e"];
}

legacy_tests! { xsrq:
    xsrq_pingpong => "ibv_xsrq_pingpong" [];
    xsrq_pingpong_events => "ibv_xsrq_pingpong" ["-e"];
    xsrq_pingpong_large => "ibv_xsrq_pingpong" ["-s", "65536", "-m", "4096"];
}

legacy_tests! { perftest:
    write_bw => "ib_write_bw" [];
    write_bw_all_sizes => "ib_write_bw" ["-a"];
    write_bw_4_qps => "ib_write_bw" ["-q", "4"];
    write_bw_bidirectional => "ib_write_bw" ["-b"];
    write_bw_old_post_send => "ib_write_bw" ["--use_old_post_send"];
    write_bw_uc => "ib_write_bw" ["-c", "UC"];
    write_lat => "ib_write_lat" [];
    write_lat_all_sizes => "ib_write_lat" ["-a"];
    write_lat_old_post_send => "ib_write_lat" ["--use_old_post_send"];
    write_lat_uc => "ib_write_lat" ["-c", "UC"];
    read_bw => "ib_read_bw" [];
    read_bw_all_sizes => "ib_read_bw" ["-a"];
    read_bw_4_qps => "ib_read_bw" ["-q", "4"];
    read_bw_bidirectional => "ib_read_bw" ["-b"];
    read_bw_events => "ib_read_bw" ["-e"];
    read_bw_old_post_send => "ib_read_bw" ["--use_old_post_send"];
    read_lat => "ib_read_lat" [];
    read_lat_all_sizes => "ib_read_lat" ["-a"];
    read_lat_events => "ib_read_lat" ["-e"];
    read_lat_old_post_send => "ib_read_lat" ["--use_old_post_send"];
    send_bw => "ib_send_bw" [];
    send_bw_all_sizes => "ib_send_bw" ["-a"];
    send_bw_4_qps => "ib_send_bw" ["-q", "4"];
    send_bw_bidirectional => "ib_send_bw" ["-b"];
    send_bw_events => "ib_send_bw" ["-e"];
    send_bw_old_post_send => "ib_send_bw" ["--use_old_post_send"];
    send_bw_uc => "ib_send_bw" ["-c", "UC"];
    send_bw_ud => "ib_send_bw" ["-c", "UD"];
    send_lat => "ib_send_lat" [];
    send_lat_all_sizes => "ib_send_lat" ["-a"];
    send_lat_events => "ib_send_lat" ["-e"];
    send_lat_old_post_send => "ib_send_lat" ["--use_old_post_send"];
    send_lat_uc => "ib_send_lat" ["-c", "UC"];
    send_lat_ud => "ib_send_lat" ["-c", "UD"];
    atomic_bw => "ib_atomic_bw" [];
    atomic_bw_4_qps => "ib_atomic_bw" ["-q", "4"];
    atomic_bw_bidirectional => "ib_atomic_bw" ["-b"];
    atomic_bw_events => "ib_atomic_bw" ["-e"];
    atomic_bw_old_post_send => "ib_atomic_bw" ["--use_old_post_send"];
    atomic_lat => "ib_atomic_lat" [];
    atomic_lat_events => "ib_atomic_lat" ["-e"];
    atomic_lat_old_post_send => "ib_atomic_lat" ["--use_old_post_send"];
}

legacy_tests! { perftest_rxe:
    write_bw_rxe => "ib_write_bw" [];
    read_lat_rxe => "ib_read_lat" [];
    send_bw_ud_rxe => "ib_send_bw" ["-c", "UD"];
    send_lat_rxe => "ib_send_lat" [];
    atomic_bw_rxe => "ib_atomic_bw" [];
}

/// perftest's raw Ethernet latency test between two processes on the full profile's Ethernet
/// ports: a raw packet QP each, a flow rule steering the frames for its MAC (and UDP/IP
/// addresses and ports) to it, 10,000 64-byte frames each way in a ping-pong that stalls for
/// good on the first frame lost (raw Ethernet has no retry). Both sides report the run.
#[test]
fn raw_ethernet_lat_pingpongs_every_frame_between_two_processes() {
    let fabric = Fabric::new("raweth");
    let dir = common::profile_dir().join(format!("raweth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // MACs are each side's own and its peer's; addresses and ports, the client's destination
    // (the server's) and source on both sides, as perftest wants them.
    let side = |role: &str, me: &str, peer: &str| {
        // Line-buffered, so that the server's table head shows it is ready for the first frame.
        let mut c = Command::new(env!("CARGO_BIN_EXE_rdma-emu"));
        c.env("RDMA_EMU_LIB", common::cdylib()).env_remove("LD_LIBRARY_PATH");
        c.args(["run", "--profile", "full", "--link-layer", "eth", "--fabric", &fabric.0]);
        c.args(["--", "stdbuf", "-oL", "raw_ethernet_lat", "-d", "emu0", role, "-n", "10000"]);
        c.args(["-B", me, "-E", peer, "-J", "10.0.0.1", "-j", "10.0.0.2", "-K", "7001"]);
        c.args(["-k", "7002"]);
        c
    };
    let (a, b) = ("02:00:00:00:00:0a", "02:00:00:00:00:0b");
    let log = dir.join("server.out");
    let server = side("--server", a, b)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Killed(Some(server));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log).unwrap().contains("#bytes") {
        assert!(Instant::now() < deadline, "raw_ethernet_lat's server never got ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let client =
        side("--client", b, a).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (c_ok, c_out) = finish_or_dump(client, Duration::from_secs(60), "client", &[]);
    let (s_ok, _) = finish(server.take(), Duration::from_secs(20), "server");
    let s_out = std::fs::read_to_string(&log).unwrap();
    let what = format!("--- client:\n{c_out}\n--- server:\n{s_out}");
    assert!(c_ok && s_ok, "{what}");
    // The result row: 64 bytes, 10,000 iterations.
    let row = |out: &str| out.lines().any(|l| l.split_whitespace().take(2).eq(["64", "10000"]));
    assert!(row(&c_out) && row(&s_out), "{what}");
}

/// Memcheck: Debian's `ibv_rc_pingpong` as server and client, both under Valgrind, between two
/// processes on the shim: no invalid read or write and no use of uninitialised memory in
/// either (`--error-exitcode`). Leaks are LeakSanitizer's business (`./ci.sh sanitize`); the
/// program's own unfreed buffers are not ours.
#[test]
fn the_pingpong_pair_runs_clean_under_valgrind_memcheck() {
    let args = ["-q", "--error-exitcode=9", "--leak-check=no", "ibv_rc_pingpong", "-n", "200"];
    let out = server_and_client("full", "valgrind", &args);
    assert!(out.contains("200 iters in"), "{out}");
}

/// Memcheck of perftest: `ib_write_bw` and `ib_read_lat`, server and client both under
/// Valgrind, as the pingpong pair above. perftest's own uses of stack variables it never
/// initialised (traced to allocations in its binary) are suppressed, nothing else
/// (`tests/valgrind/perftest.supp`).
#[test]
fn perftest_pairs_run_clean_under_valgrind_memcheck() {
    let supp =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/valgrind/perftest.supp");
    let supp = format!("--suppressions={}", supp.display());
    let vg = ["-q", "--error-exitcode=9", "--leak-check=no", &supp];
    for (prog, done) in [("ib_write_bw", "BW average"), ("ib_read_lat", "t_typical")] {
        // An ACK timeout of ~4 s (`-u 20`) instead of perftest's 67 ms: both processes run
        // some 50 times slower under Valgrind, and beside the suite's other tests a peer
        // stalled past 8 of perftest's timeouts once (ib_read_lat, RETRY_EXC_ERR); what this
        // test checks is memory, not timing.
        let run = [prog, "-n", "200", "-u", "20"];
        let args: Vec<&str> = vg.iter().copied().chain(run).collect();
        let out = server_and_client("full", "valgrind", &args);
        assert!(out.contains(done), "{prog}: {out}");
    }
}

/// A process storm: pingpong pairs on one fabric killed with SIGKILL mid-transfer, round after
/// round (the server, the client, or both), beside a third process killed each round too;
/// then a pair that runs to the end works, and the fabric's directory keeps no socket of any
/// of them (the dead ones are swept by the next process that joins, even in slots nobody
/// takes again; the living remove their own at exit).
#[test]
fn pairs_killed_mid_transfer_round_after_round_leave_a_working_fabric_and_no_sockets() {
    let fabric = Fabric::new("storm");
    for round in 0..12 {
        // pingpong and perftest pairs in turn, running far longer than the round.
        let (prog, args): (&str, &[&str]) = match round % 2 {
            0 => ("ibv_rc_pingpong", &["-n", "100000000"]),
            _ => (["ib_write_bw", "ib_send_bw", "ib_read_bw"][round / 2 % 3], &["-D", "60"]),
        };
        let port = free_port();
        let mut idle = start_server(&fabric, "full", "ibv_rc_pingpong", &["-n", "9"], free_port());
        let mut server = start_server(&fabric, "full", prog, args, port);
        let mut client =
            program(&fabric, "full", prog, args, port).arg("localhost").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let victims: &mut [&mut Child] = match round % 3 {
            0 => &mut [&mut server],
            1 => &mut [&mut client],
            _ => &mut [&mut server, &mut client],
        };
        for v in victims.iter_mut() {
            // Every fourth round the victims are stopped first (SIGSTOP, as a debugger does),
            // left stopped a while, and killed stopped.
            if round % 4 == 3 {
                // SAFETY: signals a child process this test started and still owns.
                assert_eq!(unsafe { libc::kill(v.id() as i32, libc::SIGSTOP) }, 0);
            }
        }
        if round % 4 == 3 {
            std::thread::sleep(Duration::from_millis(200));
        }
        for v in victims.iter_mut() {
            v.kill().unwrap();
        }
        idle.kill().unwrap();
        idle.wait().unwrap();
        // The survivor (if any) fails on its own; it must not hang.
        for (who, child) in [("server", server), ("client", client)] {
            let (_, out) = finish(child, Duration::from_secs(30), who);
            assert!(!out.contains("did not finish"), "round {round}: the {who} hung\n{out}");
        }
    }
    let port = free_port();
    let server = start_server(&fabric, "full", "ibv_rc_pingpong", &["-n", "50"], port);
    let client =
        program(&fabric, "full", "ibv_rc_pingpong", &["-n", "50"], port).arg("localhost").spawn();
    let client = client.unwrap();
    let (c_ok, c_out) = finish_or_dump(client, Duration::from_secs(60), "client", &[&server]);
    let (s_ok, s_out) = finish(server, Duration::from_secs(20), "server");
    assert!(c_ok && s_ok && c_out.contains("50 iters in"), "{c_out}\n{s_out}");
    assert_eq!(sockets(&fabric), Vec::<String>::new(), "sockets left behind");
}

/// A user other than root, as `rdma-emu run` meets one: the program runs in a user namespace
/// of its own (only the user's own id mapped), where root's directories on the way to the
/// host fabric (`/`, `/tmp`) show as the overflow id, as another user's would; the fabric must
/// still be joined. Two such processes, each in a namespace of its own (so neither may read
/// the other's memory by system call), must still move and check every byte:
/// `ibv_rc_pingpong --chk` with 100,000-byte messages in memory that is not page-aligned
/// (its client under a second `rdma-emu run` inside the first), and rping's verified pings
/// through the connection manager; a registration past its `RLIMIT_MEMLOCK`, and a raw packet
/// QP without `CAP_NET_RAW`, fail as in the kernel with a word on how to let them. Run as root
/// (as CI is), the programs run as an unprivileged id (through `setpriv`), from copies of the
/// binaries in a directory of that id's.
#[test]
fn a_user_other_than_root_meets_its_peers_on_the_host_fabric_from_its_namespace() {
    use std::os::unix::fs::{PermissionsExt, chown};
    const LIMIT: Duration = Duration::from_secs(60);
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    let uid = if me == 0 { 64_321 } else { me };
    struct Home(std::path::PathBuf);
    impl Drop for Home {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let home = Home(std::env::temp_dir().join(format!("rdma-emu-user-{}", std::process::id())));
    std::fs::create_dir_all(&home.0).unwrap();
    std::fs::set_permissions(&home.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (exe, lib) = if me == 0 {
        let lib = common::cdylib();
        let built = [env!("CARGO_BIN_EXE_rdma-emu").into(), lib.clone(), common::rdmacm_lib()];
        for from in &built {
            let to = home.0.join(from.file_name().unwrap());
            std::fs::copy(from, &to).unwrap();
            chown(&to, Some(uid), Some(uid)).unwrap();
        }
        (home.0.join("rdma-emu"), home.0.join(lib.file_name().unwrap()))
    } else {
        (env!("CARGO_BIN_EXE_rdma-emu").into(), common::cdylib())
    };
    chown(&home.0, Some(uid), Some(uid)).unwrap();
    let fabric = home.0.join("fabric");
    // `prog` as that user: as itself, or through setpriv when this test is root.
    let as_user = |prog: &std::ffi::OsStr| {
        let mut c = Command::new(if me == 0 { "setpriv".as_ref() } else { prog });
        if me == 0 {
            c.args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into()]);
            c.arg(prog);
        }
        c
    };
    let run = |args: &[&str]| {
        let mut c = as_user(exe.as_os_str());
        c.env("RDMA_EMU_LIB", &lib).env("RDMA_EMU_RUNTIME_DIR", &home.0);
        c.env_remove("LD_LIBRARY_PATH").env_remove("XDG_RUNTIME_DIR");
        c.args(["run", "--fabric", fabric.to_str().unwrap(), "--"]).args(args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    // Where this machine lets the user make namespaces, the program must have run in one.
    let unshare = as_user("unshare".as_ref()).args(["--user", "true"]).output().unwrap();
    let namespaces = unshare.status.success();
    let (ok, view) = finish(run(&["ls", "/dev/infiniband"]).spawn().unwrap(), LIMIT, "ls");
    assert!(ok, "{view}");
    if namespaces {
        assert!(view.contains("uverbs0"), "the program runs in the devices' view: {view}");
    } else {
        eprintln!("user namespaces are not allowed here: the programs ran without one");
    }

    let port = free_port();
    let p = port.to_string();
    let args = ["-c", "-s", "100000", "-n", "200", "-p", &p];
    let mut server = run(&[&["ibv_rc_pingpong"], &args[..]].concat());
    let server = spawn_listening(&mut server, "ibv_rc_pingpong", port);
    // The client under an `rdma-emu run` of its own inside the first (as a script run under
    // it would start it): in a user namespace nested in another.
    let exe_s = exe.to_str().unwrap();
    let nested = [exe_s, "run", "--fabric", fabric.to_str().unwrap(), "--", "ibv_rc_pingpong"];
    let client = run(&[&nested[..], &args[..], &["localhost"]].concat()).spawn();
    let (c_ok, c_out) = finish_or_dump(client.unwrap(), LIMIT, "client", &[&server]);
    let (s_ok, s_out) = finish(server, LIMIT, "server");
    assert!(c_ok && s_ok && c_out.contains("200 iters in"), "{c_out}\n--- server:\n{s_out}");

    // Without CAP_IPC_LOCK, a registration past RLIMIT_MEMLOCK fails as the kernel fails it,
    // and the library says once how to lift the limit (the program reports only the errno).
    let p = free_port().to_string();
    let big = ["prlimit", "--memlock=8388608", "ibv_rc_pingpong", "-s", "16777216", "-p", &p];
    let (ok, out) = finish(run(&big).spawn().unwrap(), LIMIT, "pingpong past the limit");
    assert!(!ok && out.contains("Couldn't register MR"), "{out}");
    assert_eq!(out.matches("RDMA_EMU_MEMLOCK=off").count(), 1, "{out}");

    // Raw packet QPs and flow rules take CAP_NET_RAW, as the kernel's verbs require: the
    // library says once how to let anyone make them, and then they work.
    let mut raw = common::c_test("raw");
    if me == 0 {
        let to = home.0.join("raw");
        std::fs::copy(&raw, &to).unwrap();
        chown(&to, Some(uid), Some(uid)).unwrap();
        raw = to;
    }
    let raw_run = |anyone: bool| {
        let mut c = run(&[raw.to_str().unwrap()]);
        c.env("RDMA_EMU_PROFILE", "full").env("RDMA_EMU_LINK_LAYER", "ethernet");
        if anyone {
            c.env("RDMA_EMU_NET_RAW", "anyone");
        }
        finish(c.spawn().unwrap(), LIMIT, "raw")
    };
    let (ok, out) = raw_run(false);
    assert!(!ok && out.matches("RDMA_EMU_NET_RAW=anyone").count() == 1, "{out}");
    let (ok, out) = raw_run(true);
    assert!(ok && out.contains("raw ok"), "{out}");

    let port = free_port();
    let p = port.to_string();
    let args = ["-a", "127.0.0.1", "-p", &p, "-C", "20", "-V", "-S", "100"];
    let server = run(&[&["rping", "-s"], &args[..]].concat()).spawn().unwrap();
    // Listening once its port's file in the fabric's directory says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    let cm_file = fabric.join(format!("cm-106-{port}"));
    while !std::fs::read_to_string(&cm_file).is_ok_and(|t| t.contains("listen")) {
        assert!(Instant::now() < deadline, "rping's server never listened on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = run(&[&["rping", "-c", "-v"], &args[..]].concat()).spawn().unwrap();
    let (c_ok, c_out) = finish(client, LIMIT, "rping client");
    let (s_ok, s_out) = finish(server, LIMIT, "rping server");
    assert!(
        common::rping_pair_done((c_ok, &c_out), (s_ok, &s_out)),
        "--- client:\n{c_out}\n--- server:\n{s_out}"
    );
    assert_eq!(c_out.matches("ping data: rdma-ping-").count(), 20, "{c_out}");
}

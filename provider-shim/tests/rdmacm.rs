//! The drop-in `librdmacm.so.1`: exactly rdma-core 44's exports, and Debian's unmodified
//! rdmacm-utils connecting through it, as two processes on the host fabric.

mod common;
use common::Fabric;
use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

fn readelf(args: &[&str]) -> String {
    let out =
        Command::new("readelf").args(args).arg(common::rdmacm_lib()).output().expect("run readelf");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn exports_are_exactly_rdma_core_44s_librdmacm() {
    let got = common::defined_symbols(&common::rdmacm_lib());
    let mut want: Vec<String> = include_str!("../abi/rdmacm_exports.txt")
        .lines()
        .filter(|l| l.contains("@@"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(got.len(), 68);
    let text = readelf(&["-d", "-V", "-W"]);
    assert!(text.contains("Library soname: [librdmacm.so.1]"));
    for node in ["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"] {
        assert!(text.contains(&format!("Name: {node}\n")), "version node {node} missing");
    }
}

fn program(fabric: &Fabric, profile: &str, prog: &str, args: &[&str]) -> Command {
    common::rdmacm_lib();
    common::debian_program(fabric, profile, prog, args, "rdmacm-utils")
}

/// Waits for `child` within `limit` (a guard against hangs, not a timing assertion).
fn finish(child: Child, limit: Duration) -> (bool, String) {
    common::finish(child, limit, "the program")
}

/// Waits until a process of `fabric` listens on CM port `port` (RDMA_PS_TCP).
fn wait_listening(fabric: &Fabric, port: u16) {
    fabric.wait_cm_listener(Some("106"), Some(port));
}

#[test]
fn rping_verifies_its_data_between_two_processes() {
    for (profile, port) in [("full", 7701u16), ("rxe", 7702)] {
        let fabric = Fabric::new("rdmacm");
        let p = port.to_string();
        let common = ["-a", "127.0.0.1", "-p", &p, "-C", "100", "-V", "-S", "100"];
        let server = program(&fabric, profile, "rping", &["-s"]).args(common).spawn().unwrap();
        wait_listening(&fabric, port);
        let client =
            program(&fabric, profile, "rping", &["-c", "-v"]).args(common).spawn().unwrap();
        let (c_ok, c_out) = finish(client, Duration::from_secs(60));
        let (s_ok, s_out) = finish(server, Duration::from_secs(20));
        assert!(
            common::rping_pair_done((c_ok, &c_out), (s_ok, &s_out)),
            "{profile}\n--- client:\n{c_out}\n--- server:\n{s_out}"
        );
        // -V makes both sides compare every ping with what it must be.
        assert_eq!(c_out.matches("ping data: rdma-ping-").count(), 100, "{c_out}");
        assert!(c_out.contains("rdma-ping-99: "), "{c_out}");
    }
}

/// Runs `prog` as the server (listening on CM port `port`) and as its client, both under
/// `profile`; both must succeed. The client's output.
fn server_and_client(
    profile: &str,
    prog: &str,
    server: &[&str],
    client: &[&str],
    port: u16,
) -> String {
    let fabric = Fabric::new("rdmacm");
    let s = program(&fabric, profile, prog, server).spawn().unwrap();
    wait_listening(&fabric, port);
    let c = program(&fabric, profile, prog, client).spawn().unwrap();
    let (c_ok, c_out) = finish(c, Duration::from_secs(60));
    let (s_ok, s_out) = finish(s, Duration::from_secs(20));
    assert!(c_ok && s_ok, "{prog} {profile}\n--- client:\n{c_out}\n--- server:\n{s_out}");
    c_out
}

#[test]
fn ucmatose_connects_several_ids_and_moves_data() {
    for profile in ["full", "rxe"] {
        let args = ["-c", "4", "-C", "10", "-p", "7710"];
        let client = [&args[..], &["-s", "127.0.0.1"]].concat();
        let out = server_and_client(profile, "ucmatose", &args, &client, 7710);
        assert!(
            out.contains("data transfers complete") && out.contains("return status 0"),
            "{out}"
        );
    }
}

#[test]
fn perftest_connects_through_rdma_cm() {
    for (prog, profile, port) in [
        ("ib_write_bw", "full", 7720u16),
        ("ib_read_lat", "rxe", 7721),
        ("ib_send_bw", "rxe", 7722),
        ("ib_send_lat", "full", 7723),
    ] {
        let p = port.to_string();
        let args = ["-R", "-n", "200", "-p", &p];
        let client = [&args[..], &["127.0.0.1"]].concat();
        // perftest races itself: after a handshake on its first connection, the client
        // resolves and connects its data connection while the server makes a new listening
        // id for it (create_rdma_cm_connection in perftest_communication.c). A request looks
        // for its listener for as long as it could be on its way (20 ms, `REQ_TRANSIT_NS` in
        // the CM), but a server slowed past that by a loaded machine still loses: its client
        // is rejected as the kernel's CM rejects it, "invalid service ID" (reason 8), and
        // perftest gives up. Such a run is tried again on a fresh fabric, five times at most;
        // any other failure fails.
        let run = || {
            let fabric = Fabric::new("rdmacm");
            let s = program(&fabric, profile, prog, &args).spawn().unwrap();
            wait_listening(&fabric, port);
            let c = program(&fabric, profile, prog, &client).spawn().unwrap();
            let (c_ok, c_out) = finish(c, Duration::from_secs(60));
            let lost_race = !c_ok && c_out.contains("RDMA_CM_EVENT_REJECTED; error: 8");
            // Its server waits for the data connection for ever: not for long here.
            let (s_ok, s_out) = finish(s, Duration::from_secs(if lost_race { 2 } else { 20 }));
            (c_ok && s_ok, lost_race, c_out, s_out)
        };
        let (mut ok, mut lost_race, mut out, mut s_out) = run();
        for _ in 1..5 {
            if !lost_race {
                break;
            }
            (ok, lost_race, out, s_out) = run();
        }
        assert!(ok, "{prog} {profile}\n--- client:\n{out}\n--- server:\n{s_out}");
        assert!(out.contains("Data ex. method : rdma_cm"), "{prog}: {out}");
        assert!(out.contains("remote address: LID"), "{prog}: {out}");
    }
}

#[test]
fn the_synchronous_examples_run_through_create_ep_and_get_request() {
    // rdma_server/rdma_client: rdma_create_ep, rdma_get_request, the rdma_verbs.h helpers
    // (rdma_reg_msgs, rdma_post_recv, rdma_get_recv_comp) over the CQs rdma_create_qp made.
    // rdma_xserver/rdma_xclient: RC, or with -c x XRC (the server's XRC receive QP from
    // rdma_get_request, an XRC SRQ from rdma_create_srq whose number goes back in the reply's
    // private data, and the client's XRC send QP sending to it); rxe has no XRC.
    for (prog, client_prog, profile, port, mode) in [
        ("rdma_server", "rdma_client", "full", 7730u16, None),
        ("rdma_server", "rdma_client", "rxe", 7731, None),
        ("rdma_xserver", "rdma_xclient", "full", 7732, Some("r")),
        ("rdma_xserver", "rdma_xclient", "rxe", 7733, Some("r")),
        ("rdma_xserver", "rdma_xclient", "full", 7734, Some("x")),
    ] {
        let fabric = Fabric::new("rdmacm");
        let p = port.to_string();
        let mode = mode.map_or(vec![], |m| vec!["-c", m]);
        let s =
            program(&fabric, profile, prog, &[&["-p", &p][..], &mode].concat()).spawn().unwrap();
        fabric.wait_cm_listener(None, Some(port)); // XRC goes in RDMA_PS_IB
        let args = [&["-s", "127.0.0.1", "-p", &p][..], &mode].concat();
        let c = program(&fabric, profile, client_prog, &args).spawn().unwrap();
        let (c_ok, c_out) = finish(c, Duration::from_secs(60));
        let (s_ok, s_out) = finish(s, Duration::from_secs(20));
        assert!(c_ok && s_ok, "{prog} {profile}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        assert!(c_out.contains(&format!("{client_prog}: end 0")), "{c_out}");
        assert!(s_out.contains(&format!("{prog}: end 0")), "{s_out}");
    }
}

#[test]
fn udaddy_resolves_datagram_peers_and_moves_data() {
    for profile in ["full", "rxe"] {
        let fabric = Fabric::new("rdmacm");
        // udaddy's port is fixed (7174); its -p names the port space.
        let s = program(&fabric, profile, "udaddy", &["-C", "10"]).spawn().unwrap();
        fabric.wait_cm_listener(Some("111"), Some(7174));
        let c =
            program(&fabric, profile, "udaddy", &["-s", "127.0.0.1", "-C", "10"]).spawn().unwrap();
        let (c_ok, c_out) = finish(c, Duration::from_secs(60));
        let (s_ok, s_out) = finish(s, Duration::from_secs(20));
        assert!(c_ok && s_ok, "{profile}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        for out in [&c_out, &s_out] {
            assert!(
                out.contains("data transfers complete") && out.contains("return status 0"),
                "{out}"
            );
        }
    }
}

/// perftest's UD test over the CM. Its client makes its UD "connection" right after the two
/// sides' handshake, while the server may still be creating the listener for it: when the
/// server is not there within the time its request looks for it (see the test above), the
/// request finds nobody (`UNREACHABLE`, as on rxe), and perftest 4.5-0.17 (Debian 12) retries
/// with the ids it just destroyed and gives up. That race is the program's, on rxe as here; a
/// run that lost it is run again (five times at most: a loaded machine slows the server more
/// than the client).
#[test]
fn perftest_ud_connects_through_rdma_cm() {
    for (profile, port) in [("full", 7740u16), ("rxe", 7741)] {
        let p = port.to_string();
        let args = ["-R", "-c", "UD", "-n", "200", "-p", &p];
        let client = [&args[..], &["127.0.0.1"]].concat();
        for attempt in 1.. {
            let fabric = Fabric::new("rdmacm");
            let s = program(&fabric, profile, "ib_send_lat", &args).spawn().unwrap();
            fabric.wait_cm_listener(None, Some(port));
            let c = program(&fabric, profile, "ib_send_lat", &client).spawn().unwrap();
            let (c_ok, c_out) = finish(c, Duration::from_secs(60));
            let lost_race = !c_ok && c_out.contains("Event: RDMA_CM_EVENT_UNREACHABLE; error: 1.");
            // A server whose client lost the race waits for it for ever: not for long here.
            let server_limit = Duration::from_secs(if lost_race { 2 } else { 20 });
            let (s_ok, s_out) = finish(s, server_limit);
            if lost_race && attempt < 5 {
                continue;
            }
            assert!(c_ok && s_ok, "{profile}\n--- client:\n{c_out}\n--- server:\n{s_out}");
            let ran = c_out.contains("Connection type : UD") && c_out.contains("t_typical");
            assert!(ran, "{c_out}");
            break;
        }
    }
}

#[test]
fn cmtime_times_a_hundred_connections() {
    let fabric = Fabric::new("rdmacm");
    // Debian's cmtime server serves until it is stopped.
    let mut server = program(&fabric, "full", "cmtime", &["-p", "7750"]).spawn().unwrap();
    wait_listening(&fabric, 7750);
    let client =
        program(&fabric, "full", "cmtime", &["-s", "127.0.0.1", "-p", "7750", "-c", "100"])
            .spawn()
            .unwrap();
    let (ok, out) = finish(client, Duration::from_secs(60));
    let _ = server.kill();
    let _ = server.wait();
    assert!(ok, "{out}");
    for step in ["resolve addr", "resolve route", "create qp", "connect", "disconnect"] {
        assert!(out.lines().any(|l| l.starts_with(step) && l.contains(':')), "{step}: {out}");
    }
}

/// rping under LD_PRELOAD, both sides (either may end in rping's own end-of-run race: see
/// `common::rping_pair_done`).
#[test]
fn both_libraries_work_as_ld_preload() {
    let (c_out, s_out, ok) = rping_preloaded();
    assert!(ok, "--- client:\n{c_out}\n--- server:\n{s_out}");
    assert_eq!(c_out.matches("ping data: rdma-ping-").count(), 10, "{c_out}");
}

/// rping's server and client (10 verified pings) preloaded on the two libraries: their
/// output, and whether both did their work.
fn rping_preloaded() -> (String, String, bool) {
    let fabric = Fabric::new("rdmacm");
    let preload = format!("{} {}", common::cdylib().display(), common::rdmacm_lib().display());
    let rping = |args: &[&str]| {
        let mut c = Command::new("/usr/bin/rping");
        c.args(args).args(["-a", "127.0.0.1", "-p", "7760", "-C", "10", "-V"]);
        c.env("LD_PRELOAD", &preload)
            .env("RDMA_EMU_FABRIC", &fabric.0)
            .env_remove("LD_LIBRARY_PATH");
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let server = rping(&["-s"]);
    wait_listening(&fabric, 7760);
    let (c_ok, c_out) = finish(rping(&["-c", "-v"]), Duration::from_secs(60));
    let (s_ok, s_out) = finish(server, Duration::from_secs(20));
    let ok = common::rping_pair_done((c_ok, &c_out), (s_ok, &s_out));
    (c_out, s_out, ok)
}

/// rstream runs unmodified over rsockets between two processes, verifying its data (`-T v`),
/// blocking, asynchronous (rpoll) and non-blocking.
#[test]
fn rstream_moves_verified_data_over_rsockets() {
    for (profile, port, mode) in [("full", 7770u16, "b"), ("rxe", 7771, "a"), ("full", 7772, "n")] {
        let fabric = Fabric::new("rdmacm");
        let p = port.to_string();
        // Odd sizes: messages straddle the receive ring's end.
        let args = ["-p", &p, "-T", mode, "-T", "v", "-S", "100037", "-C", "30"];
        let s = program(&fabric, profile, "rstream", &args).spawn().unwrap();
        wait_listening(&fabric, port);
        let client = [&args[..], &["-s", "127.0.0.1"]].concat();
        let (c_ok, c_out) = finish(
            program(&fabric, profile, "rstream", &client).spawn().unwrap(),
            Duration::from_secs(60),
        );
        let (s_ok, s_out) = finish(s, Duration::from_secs(20));
        assert!(c_ok && s_ok, "{profile} -T {mode}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        for out in [&c_out, &s_out] {
            assert!(out.contains("custom    97k") && !out.contains("verification"), "{out}");
        }
    }
}

/// riostream: the receiver maps its buffer (riomap) and spins on its last byte while the
/// sender's riowrite fills it; both sides verify the data.
#[test]
fn riostream_writes_into_the_peers_mapped_memory() {
    for (profile, port, size, count, iters) in
        [("full", 7775u16, "4096", "10", "50"), ("rxe", 7776, "100000", "3", "5")]
    {
        let fabric = Fabric::new("rdmacm");
        let p = port.to_string();
        let args = ["-p", &p, "-S", size, "-C", count, "-I", iters, "-T", "v"];
        let s = program(&fabric, profile, "riostream", &args).spawn().unwrap();
        wait_listening(&fabric, port);
        let client = [&args[..], &["-s", "127.0.0.1"]].concat();
        let c = program(&fabric, profile, "riostream", &client).spawn().unwrap();
        let (c_ok, c_out) = finish(c, Duration::from_secs(60));
        let (s_ok, s_out) = finish(s, Duration::from_secs(20));
        assert!(c_ok && s_ok, "{profile}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        for out in [&c_out, &s_out] {
            assert!(out.contains("custom") && !out.contains("verification failed"), "{out}");
        }
    }
}

/// Debian's `librspreload.so`, which turns a program's TCP sockets into rsockets.
const RSPRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// `prog` under `rdma-emu run` with Debian's librspreload on top: its TCP and UDP go over
/// rsockets.
fn over_rsockets(fabric: &Fabric, prog: &str, args: &[&str]) -> Command {
    let path = format!("/usr/bin/{prog}");
    for p in [RSPRELOAD, &path] {
        assert!(
            std::path::Path::new(p).exists(),
            "{p} is missing: install Debian's librdmacm1, netcat-openbsd, socat, iperf3, iperf, curl, wget, sockperf \
             (./ci.sh does)"
        );
    }
    common::rdmacm_lib();
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdma-emu"));
    c.env("RDMA_EMU_LIB", common::cdylib()).env_remove("LD_LIBRARY_PATH");
    c.args(["run", "--fabric", &fabric.0, "--", "/usr/bin/env"]);
    c.arg(format!("LD_PRELOAD={RSPRELOAD}")).arg(&path).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Ordinary TCP programs over rsockets: socat listens (its socket is an rsocket: the port is
/// the CM's, and no TCP socket listens there, so the client cannot have fallen back to TCP),
/// nc sends it 2 MiB that arrive intact. (Debian's nc cannot be the server: it accepts with
/// accept4, which Debian's librspreload does not intercept.)
#[test]
fn nc_and_socat_talk_over_rsockets_through_librspreload() {
    let fabric = Fabric::new("rdmacm");
    let dir = common::profile_dir().join(format!("rsockets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
    let data: Vec<u8> =
        (0..2u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    let _ = std::fs::remove_file(&output);
    let create = format!("CREATE:{}", output.display());
    let s = over_rsockets(&fabric, "socat", &["-u", "TCP4-LISTEN:7780,bind=127.0.0.1", &create])
        .spawn()
        .unwrap();
    wait_listening(&fabric, 7780);
    let mut nc = over_rsockets(&fabric, "nc", &["-N", "127.0.0.1", "7780"]);
    nc.stdin(std::fs::File::open(&input).unwrap());
    let (c_ok, c_out) = finish(nc.spawn().unwrap(), Duration::from_secs(60));
    let (s_ok, s_out) = finish(s, Duration::from_secs(20));
    assert!(c_ok && s_ok, "--- nc:\n{c_out}\n--- socat:\n{s_out}");
    let got = std::fs::read(&output).unwrap();
    assert!(got == data, "{} of {} bytes arrived, not all as sent", got.len(), data.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Datagrams through librspreload: `nc -u` sends lines to socat's `UDP4-RECV`, each line a
/// datagram over the emulator's datagram rsockets (the port is the CM's `RDMA_PS_UDP` one, no
/// kernel UDP socket is bound there), and the file socat writes is the lines, in order.
#[test]
fn nc_sends_datagrams_to_socat_over_rsockets_through_librspreload() {
    let fabric = Fabric::new("rdmacm");
    let dir = common::profile_dir().join(format!("rsockets-udp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = dir.join("out.txt");
    let _ = std::fs::remove_file(&output);
    let create = format!("CREATE:{}", output.display());
    let recv = ["-u", "UDP4-RECV:7784,bind=127.0.0.1", &create];
    let mut s = over_rsockets(&fabric, "socat", &recv).spawn().unwrap();
    fabric.wait_cm_listener(Some("111"), Some(7784));
    let mut nc = over_rsockets(&fabric, "nc", &["-u", "-w", "1", "127.0.0.1", "7784"]);
    let mut nc = nc.stdin(Stdio::piped()).spawn().unwrap();
    let lines: Vec<String> =
        (0..20).map(|i| format!("datagram {i} {}\n", "x".repeat(i * 7))).collect();
    {
        use std::io::Write;
        let mut stdin = nc.stdin.take().unwrap();
        for l in &lines {
            stdin.write_all(l.as_bytes()).unwrap();
            // One read, and so one datagram, a line: nc sends what each read gives.
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    let (c_ok, c_out) = finish(nc, Duration::from_secs(30));
    let want = lines.concat();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&output).unwrap_or_default().len() < want.len()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = s.kill();
    let (_, s_out) = finish(s, Duration::from_secs(10));
    let got = std::fs::read_to_string(&output).unwrap_or_default();
    assert!(c_ok && got == want, "got {got:?}\n--- nc:\n{c_out}\n--- socat:\n{s_out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// HTTP clients over rsockets: curl and wget each fetch a 3 MB file from socat, which serves a
/// canned HTTP response from a file (`-U`: from its right address to its left, the client),
/// and the body each saved is the file, byte for byte. curl waits in poll() (librspreload's
/// rpoll) with non-blocking rsockets, wget in select().
#[test]
fn curl_and_wget_fetch_a_file_over_rsockets() {
    let dir = common::profile_dir().join(format!("http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body: Vec<u8> =
        (0..3_000_000u32).map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8).collect();
    let head =
        format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let response = dir.join("response");
    std::fs::write(&response, [head.as_bytes(), &body].concat()).unwrap();
    let serve = format!("FILE:{}", response.display());
    for (client, port) in [("curl", 7782u16), ("wget", 7783)] {
        let fabric = Fabric::new("rdmacm");
        let listen = format!("TCP4-LISTEN:{port},bind=127.0.0.1");
        let s = over_rsockets(&fabric, "socat", &["-U", &listen, &serve]).spawn().unwrap();
        wait_listening(&fabric, port);
        let saved = dir.join(format!("{client}.out"));
        let (url, out) = (format!("http://127.0.0.1:{port}/file"), saved.display().to_string());
        let args = match client {
            "curl" => ["-sS", "-o", &out, &url],
            _ => ["-q", "-O", &out, &url],
        };
        let (c_ok, c_out) =
            finish(over_rsockets(&fabric, client, &args).spawn().unwrap(), Duration::from_secs(60));
        let (s_ok, s_out) = finish(s, Duration::from_secs(20));
        assert!(c_ok && s_ok, "--- {client}:\n{c_out}\n--- socat:\n{s_out}");
        let got = std::fs::read(&saved).unwrap();
        assert!(got == body, "{client}: {} of {} bytes, not as served", got.len(), body.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// iperf3 measures over rsockets: its control connection and its data connection are both
/// rsockets, driven by select() (librspreload's rselect).
#[test]
fn iperf3_runs_over_rsockets_through_librspreload() {
    let fabric = Fabric::new("rdmacm");
    let s = over_rsockets(&fabric, "iperf3", &["-s", "-1", "-p", "7781"]).spawn().unwrap();
    wait_listening(&fabric, 7781);
    let mut c = over_rsockets(&fabric, "iperf3", &["-c", "127.0.0.1", "-p", "7781", "-n", "64M"]);
    let (c_ok, c_out) = finish(c.spawn().unwrap(), Duration::from_secs(60));
    let (s_ok, s_out) = finish(s, Duration::from_secs(20));
    assert!(c_ok && s_ok, "--- client:\n{c_out}\n--- server:\n{s_out}");
    assert!(c_out.contains("iperf Done."), "{c_out}");
    // iperf3 3.12 checks `-n` before each send of its multisend rounds but the last: when the
    // count is reached right before that one (a send that found the socket full moves where
    // it falls), one more block (128 KiB) goes, as over TCP ("64.1 MBytes").
    let sent = mbytes(c_out.lines().find(|l| l.ends_with("sender")).unwrap_or_default());
    assert!((64.0..=64.2).contains(&sent), "the client sent {sent} MB: {c_out}");
    // The receiver's count stops at the client's end-of-test message, which may overtake the
    // last bytes (as over TCP); most of the 64 MiB must be in it.
    let received = mbytes(s_out.lines().find(|l| l.contains("receiver")).unwrap_or_default());
    assert!(received >= 60.0, "the server received {received} MB: {s_out}");
}

/// iperf3's UDP test over datagram rsockets, three streams: each stream's datagrams go to the
/// server's socket connected to that stream (each socket took the shared port with
/// `SO_REUSEADDR`, as iperf3's server replaces its listener once a stream connects), and the
/// server counts each stream's datagrams by their sequence numbers (lost, out of order).
#[test]
fn iperf3_udp_streams_run_over_rsockets_through_librspreload() {
    let fabric = Fabric::new("rdmacm");
    let s = over_rsockets(&fabric, "iperf3", &["-s", "-1", "-p", "7789"]).spawn().unwrap();
    wait_listening(&fabric, 7789);
    let args =
        ["-u", "-c", "127.0.0.1", "-p", "7789", "-b", "20M", "-t", "1", "-l", "1400", "-P", "3"];
    let (c_ok, c_out) =
        finish(over_rsockets(&fabric, "iperf3", &args).spawn().unwrap(), Duration::from_secs(60));
    let (s_ok, s_out) = finish(s, Duration::from_secs(20));
    assert!(
        c_ok && s_ok && c_out.contains("iperf Done."),
        "--- client:\n{c_out}\n--- server:\n{s_out}"
    );
    // Each stream's line on the server: `lost/total`; none empty, most of each arrived
    // (datagrams may be dropped, as UDP's, only when the server falls behind).
    let streams: Vec<(u64, u64)> = s_out
        .lines()
        .filter(|l| l.ends_with("receiver") && !l.starts_with("[SUM]"))
        .filter_map(lost_of_total)
        .collect();
    assert_eq!(streams.len(), 3, "{s_out}");
    for (lost, total) in streams {
        assert!(total > 100 && lost * 2 < total, "{lost} of {total} lost: {s_out}");
    }
}

/// iperf 2's UDP test, two streams started at once: both look the server's port up before its
/// socket connects to the first, so the second's datagrams come to that socket, which passes
/// them on to the socket iperf binds next; the server reports both streams.
#[test]
fn iperf2_parallel_udp_streams_both_arrive_over_rsockets() {
    let fabric = Fabric::new("rdmacm");
    let s = over_rsockets(&fabric, "iperf", &["-s", "-u", "-p", "7806"]).spawn().unwrap();
    fabric.wait_cm_listener(Some("111"), Some(7806));
    let args = ["-c", "127.0.0.1", "-u", "-b", "20M", "-p", "7806", "-t", "1", "-P", "2"];
    let (c_ok, c_out) =
        finish(over_rsockets(&fabric, "iperf", &args).spawn().unwrap(), Duration::from_secs(60));
    // iperf 2's server serves until it is stopped.
    std::thread::sleep(Duration::from_millis(500));
    let mut s = s;
    let _ = s.kill();
    let (_, s_out) = finish(s, Duration::from_secs(10));
    assert!(c_ok, "--- client:\n{c_out}\n--- server:\n{s_out}");
    // The client's copy of each stream's server report: `lost/total`, most of each arrived.
    let reports: Vec<(u64, u64)> = c_out
        .lines()
        .filter(|l| l.contains(" ms ") && l.contains('%'))
        .filter_map(lost_of_total)
        .collect();
    assert_eq!(reports.len(), 2, "both streams' server reports: {c_out}");
    for (lost, total) in reports {
        assert!(total > 100 && lost * 2 < total, "{lost} of {total} lost: {c_out}");
    }
}

/// sockperf (Mellanox's socket benchmark, made to be run over socket acceleration libraries)
/// through librspreload: its UDP ping-pong, blocked in `recvfrom`, with messages of random
/// sizes whose every byte it checks on return (`--data-integrity`), counting none dropped,
/// duplicated or out of order. (Its `--tcp` ping-pong sends with a destination on a connected
/// socket, which librdmacm's `rsendto` refuses with `EISCONN`, as the emulator's.)
#[test]
fn sockperf_udp_ping_pong_checks_every_byte_over_rsockets() {
    let fabric = Fabric::new("rdmacm");
    let mut s = over_rsockets(&fabric, "sockperf", &["sr", "-i", "127.0.0.1", "-p", "7799"])
        .spawn()
        .unwrap();
    fabric.wait_cm_listener(Some("111"), Some(7799));
    let args = ["pp", "-i", "127.0.0.1", "-p", "7799", "-t", "1", "-m", "1000", "-r", "900"];
    let mut c = over_rsockets(&fabric, "sockperf", &args);
    c.arg("--data-integrity");
    let (c_ok, c_out) = finish(c.spawn().unwrap(), Duration::from_secs(60));
    let _ = s.kill();
    let (_, s_out) = finish(s, Duration::from_secs(10));
    let clean = !c_out.contains("ERROR") && !c_out.contains("integrity test failed");
    assert!(
        c_ok && clean && c_out.contains("Summary: Latency is"),
        "--- client:\n{c_out}\n--- server:\n{s_out}"
    );
    let counts = "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0";
    assert!(c_out.contains(counts), "{c_out}");
}

/// The `lost/total` datagrams of an iperf (2 or 3) UDP report line.
fn lost_of_total(line: &str) -> Option<(u64, u64)> {
    line.split_whitespace().find_map(|w| {
        let (lost, total) = w.split_once('/')?;
        Some((lost.parse().ok()?, total.parse().ok()?))
    })
}

/// The MBytes of an iperf3 report line (0 if it has none).
fn mbytes(line: &str) -> f64 {
    let words = line.split_whitespace();
    words
        .clone()
        .zip(words.skip(1))
        .find(|(_, unit)| *unit == "MBytes")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0.0)
}

/// fio's rdma engine (Debian's fio) between two processes: its server takes the connection
/// through the CM, its client RDMA-WRITEs, then RDMA-READs, 64 KiB blocks, 16 at a time, into
/// and from the server's buffers (registered where `malloc` put them, not on page boundaries),
/// both waiting on completion channels: every I/O completes, without error, on the full and rxe
/// profiles. (fio's engine cannot check those bytes; the `send` verb fails with "RNR retry
/// counter exceeded", as on the kernel's rxe: fio connects with an RNR retry count of 0 and
/// leaves its server half a second to post its receives.)
#[test]
fn fio_rdma_engine_writes_and_reads_between_two_processes() {
    for (verb, profile, port) in [("write", "full", 7750u16), ("read", "rxe", 7751)] {
        let fabric = Fabric::new("fio");
        let common = ["--ioengine=rdma", "--bs=64k", "--size=32m", "--iodepth=16"];
        let port_arg = format!("--port={port}");
        let verb_arg = format!("--verb={verb}");
        let server = [&common[..], &[&port_arg, "--name=srv", "--rw=read"]].concat();
        let client = [&common[..], &[&port_arg, "--name=cli", "--rw=write", &verb_arg]].concat();
        let client = [&client[..], &["--hostname=127.0.0.1"]].concat();
        common::rdmacm_lib();
        let s = common::debian_program(&fabric, profile, "fio", &server, "fio").spawn().unwrap();
        wait_listening(&fabric, port);
        let c = common::debian_program(&fabric, profile, "fio", &client, "fio").spawn().unwrap();
        let (c_ok, out) = finish(c, Duration::from_secs(60));
        let (s_ok, s_out) = finish(s, Duration::from_secs(20));
        let all = format!("--- client:\n{out}\n--- server:\n{s_out}");
        assert!(c_ok && s_ok, "{verb} {profile}\n{all}");
        // 32 MiB in 64 KiB blocks, all issued and none in error.
        assert!(out.contains("cli: (groupid=0, jobs=1): err= 0"), "{verb} {profile}\n{all}");
        assert!(out.contains("issued rwts: total=0,512,0,0 short=0,0,0,0"), "{verb}\n{all}");
    }
}

/// mckey: receivers join a multicast group (their UD QPs attached by the library when the join
/// completes), a sender joins it send-only and sends; every receiver takes every message
/// (mckey waits for all of them). Under both profiles (an InfiniBand multicast GID and LID, a
/// RoCE v2 IPv4-mapped one), with an IPv4 and an IPv6 group, between three processes.
#[test]
fn mckey_delivers_to_every_member_of_a_multicast_group() {
    for (profile, group) in [("full", "239.1.2.3"), ("rxe", "ff05::7")] {
        let fabric = Fabric::new("rdmacm");
        let args = ["-m", group, "-C", "20"];
        let receivers: Vec<Child> =
            (0..2).map(|_| program(&fabric, profile, "mckey", &args).spawn().unwrap()).collect();
        // mckey's sender waits 3 s after joining before it sends: the receivers, started
        // first, are joined long before.
        let sender =
            program(&fabric, profile, "mckey", &[&args[..], &["-s"]].concat()).spawn().unwrap();
        let (s_ok, s_out) = finish(sender, Duration::from_secs(30));
        assert!(s_ok && s_out.contains("data transfers complete"), "{profile} sender:\n{s_out}");
        for r in receivers {
            let (ok, out) = finish(r, Duration::from_secs(30));
            assert!(ok, "{profile} receiver:\n{out}");
            assert!(
                out.contains("mckey: joined dgid:") && out.contains("data transfers complete"),
                "{out}"
            );
        }
    }
}

/// The host's own address names the first device's port, as loopback does: rping between two
/// processes through the address `hostname -I` gives first.
#[test]
fn the_hosts_own_address_reaches_the_emulated_port() {
    let out = Command::new("hostname").arg("-I").output().expect("run hostname -I");
    let text = String::from_utf8_lossy(&out.stdout);
    let host = text.split_whitespace().find(|a| a.parse::<std::net::Ipv4Addr>().is_ok());
    let host = host.expect("this host has an IPv4 address of its own (hostname -I)");
    let fabric = Fabric::new("rdmacm");
    let common = ["-a", host, "-p", "7790", "-C", "10", "-V"];
    let server = program(&fabric, "rxe", "rping", &["-s"]).args(common).spawn().unwrap();
    wait_listening(&fabric, 7790);
    let client = program(&fabric, "rxe", "rping", &["-c", "-v"]).args(common).spawn().unwrap();
    let (c_ok, c_out) = finish(client, Duration::from_secs(60));
    let (s_ok, s_out) = finish(server, Duration::from_secs(20));
    let ok = common::rping_pair_done((c_ok, &c_out), (s_ok, &s_out));
    assert!(ok, "{host}\n--- client:\n{c_out}\n--- server:\n{s_out}");
    assert_eq!(c_out.matches("ping data: rdma-ping-").count(), 10, "{c_out}");
}

/// udpong: datagram rsockets between two processes, under both profiles: the client logs in
/// and has every one of its datagrams echoed (it waits for each echo, matching its sequence
/// number, and resends what was lost).
///
/// udpong's client has a flaw that load can show: when 1 ms passes without an echo it resends,
/// and an echo then comes late, overwriting its message with an older sequence number that it
/// resends from then on. Each late echo keeps one more datagram in flight for good; should they
/// overflow a socket's posted receives, the echo it waits for may be the one dropped, and the
/// client resends stale numbers forever. With udpong's 512 KiB buffers the sockets post 384
/// receives, as librdmacm's do (it was 64, whatever the options, when this test hung in about
/// 3 runs in 8 of the whole binary).
#[test]
fn udpong_echoes_datagrams_over_rsockets() {
    for (profile, port) in [("full", 7795u16), ("rxe", 7796)] {
        let fabric = Fabric::new("rdmacm");
        let p = port.to_string();
        // udpong's server serves until it is stopped.
        let mut server =
            program(&fabric, profile, "udpong", &["-p", &p, "-T", "e"]).spawn().unwrap();
        fabric.wait_cm_listener(Some("111"), Some(port));
        let args = ["-s", "127.0.0.1", "-p", &p, "-S", "1000", "-C", "500", "-T", "e"];
        let client = program(&fabric, profile, "udpong", &args).spawn().unwrap();
        let (ok, out) =
            common::finish_or_dump(client, Duration::from_secs(60), "the client", &[&server]);
        let _ = server.kill();
        let _ = server.wait();
        assert!(ok, "{profile}: {out}");
        let row = out.lines().find(|l| l.starts_with("custom")).unwrap_or_default();
        assert!(row.split_whitespace().nth(2) == Some("1k"), "every datagram echoed: {out}");
    }
}

/// rcopy: a file copied over rsockets between two processes, under both profiles; its server
/// receives the bytes straight into the destination file, which it maps. The copy is the file,
/// byte for byte (an odd length: the last message is short).
#[test]
fn rcopy_copies_a_file_over_rsockets() {
    let dir = std::env::temp_dir().join(format!("rdma-emu-rcopy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("src.bin");
    // Bytes that differ from one position to the next (a stuck or shifted block shows).
    let mut x = 0x9e37_79b9_u32;
    let data: Vec<u8> = (0..3_000_037)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    std::fs::write(&src, &data).unwrap();
    for (profile, port) in [("full", 7786u16), ("rxe", 7787)] {
        let fabric = Fabric::new("rdmacm");
        let p = port.to_string();
        let dst = dir.join(format!("dst-{profile}.bin"));
        // rcopy's server serves until it is stopped.
        let mut server = program(&fabric, profile, "rcopy", &["-p", &p]).spawn().unwrap();
        wait_listening(&fabric, port);
        let to = format!("127.0.0.1:{}", dst.display());
        let args = [src.to_str().unwrap(), &to, "-p", &p];
        let (ok, out) = finish(
            program(&fabric, profile, "rcopy", &args).spawn().unwrap(),
            Duration::from_secs(60),
        );
        let _ = server.kill();
        let _ = server.wait();
        assert!(ok && out.contains("3000037 bytes in"), "{profile}: {out}");
        let copied = std::fs::read(&dst).unwrap_or_default();
        assert!(copied == data, "{profile}: {} bytes copied, not the file's", copied.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

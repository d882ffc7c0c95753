//! Debian's unmodified pingpongs and perftest between two processes whose emulated devices
//! have no host fabric in common (`--fabric none`): each has a wire port (`--wire IP`), and
//! everything between them is RoCE v2 over UDP 4791. First on two loopback addresses, then
//! (as root, with iproute2) from two network namespaces joined by a veth pair, standing in for
//! two hosts.

mod common;
use std::{
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU8, Ordering},
    time::{Duration, Instant},
};

use common::{finish, result_rows};

/// Where the two processes run: each side's wire address, and its network namespace if any;
/// the address the client reaches the server's TCP port at (the programs' own exchange of
/// QP numbers and GIDs, over IPv4 only).
#[derive(Clone)]
struct Ends {
    server: (String, Option<String>),
    client: (String, Option<String>),
    connect: String,
}

/// Two loopback addresses of their own for one test (tests run in parallel).
fn loopback_ends() -> Ends {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let server = format!("127.0.1.{n}");
    Ends {
        connect: server.clone(),
        server: (server, None),
        client: (format!("127.0.1.{}", n + 1), None),
    }
}

/// `prog args` on a wire port at `ip` (in namespace `ns`), nothing else in common with the
/// other side. The wire address is the only one configured, so its GID index is 2 (after the
/// link-local GID and the device's own address). The netdevs have jumbo frames (loopback's
/// 64 KiB, the veth pair's 9000), so the ports' MTU is 4096.
fn program(side: &(String, Option<String>), prog: &str, gid: &str, args: &[&str]) -> Command {
    let mut c = wrapped(side, prog);
    c.args(["-d", "emu0", gid, "2"]).args(args);
    c
}

/// `prog` (its arguments to follow) under `rdma-emu run` on a wire port at `ip` (in namespace
/// `ns`), nothing else in common with the other side.
fn wrapped(side: &(String, Option<String>), prog: &str) -> Command {
    let (ip, ns) = side;
    let rdma_emu = env!("CARGO_BIN_EXE_rdma-emu");
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, rdma_emu]);
            c
        }
        None => Command::new(rdma_emu),
    };
    c.env("RDMA_EMU_LIB", common::cdylib()).env_remove("LD_LIBRARY_PATH");
    c.args(["run", "--profile", "rxe", "--fabric", "none", "--mtu", "9000", "--wire", ip]);
    c.args(["--", prog]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Whether process `pid` (in whatever network namespace) has a socket listening on `port`:
/// one of its own (the namespace's table lists every process's sockets, and another test's
/// program may listen on the same port number meanwhile), found by the inodes of its fds.
fn listening_in(pid: u32, port: u16) -> bool {
    let own: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    ["tcp", "tcp6"].iter().any(|f| {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default();
        table.lines().skip(1).any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 9
                && cols[3] == "0A"
                && cols[1].ends_with(&format!(":{port:04X}"))
                && own.iter().any(|i| i == cols[9])
        })
    })
}

/// Runs `prog` as server at one end and client at the other; both must succeed. The
/// client's output.
fn server_and_client(ends: &Ends, prog: &str, gid: &str, args: &[&str]) -> String {
    // A port nobody listens on here (the kernel's pick, released at once); free in a
    // namespace of its own too.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    drop(listener);
    let mut args = args.to_vec();
    args.extend(["-p", &port]);
    let server: Child = program(&ends.server, prog, gid, &args).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listening_in(server.id(), port.parse().unwrap()) {
        assert!(Instant::now() < deadline, "{prog} server never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = program(&ends.client, prog, gid, &args).arg(&ends.connect).spawn().unwrap();
    let (c_ok, c_out) = finish(client, Duration::from_secs(120), "client");
    let (s_ok, s_out) = finish(server, Duration::from_secs(20), "server");
    assert!(c_ok && s_ok, "{prog} {args:?}\n--- client:\n{c_out}\n--- server:\n{s_out}");
    c_out
}

/// Runs `prog` (`-p PORT` added, but to udaddy, whose port is fixed) as server at one end and then as client at the other with
/// `client_args`, both through rdma_cm (the IB CM's MADs over the wire); both must succeed.
/// The client's output. A request sent before the server's wire port is up is sent again by
/// the CM itself; one that comes while nobody listens on the port is refused (REJ, "invalid
/// service ID"), as the kernel's CM refuses it. A client may be that quick (perftest's second
/// connection can be, as it is with the kernel's CM): then both run again, on another port,
/// the server started a little earlier each time, up to ten times (a head start does not help
/// perftest's second connection, which races the server's second listen: the full suite's
/// load once made ib_write_bw lose that race five times in a row).
fn connected_by_rdma_cm(
    ends: &Ends,
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
) -> String {
    for attempt in 1.. {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port().to_string();
        drop(listener);
        let port: &[&str] = if prog == "udaddy" { &[] } else { &["-p", &port] };
        let mut server: Child =
            wrapped(&ends.server, prog).args(server_args).args(port).spawn().unwrap();
        // After a refusal the server gets a head start, longer each time.
        std::thread::sleep(Duration::from_millis(300 * (attempt - 1)));
        let client = wrapped(&ends.client, prog).args(client_args).args(port).spawn();
        let (c_ok, c_out) = finish(client.unwrap(), Duration::from_secs(60), "client");
        // rping and ucmatose report the REJECTED event, perftest the event's number (8),
        // udaddy (a SIDR request) UNREACHABLE with status 1, "unsupported".
        let refused = c_out.contains("RDMA_CM_EVENT_REJECTED")
            || c_out.contains("CM event bl blka 8")
            || c_out.contains("RDMA_CM_EVENT_UNREACHABLE, error: 1");
        if !c_ok && refused && attempt < 10 {
            let _ = server.kill();
            let _ = server.wait();
            continue;
        }
        if prog == "cmtime" {
            // Debian's cmtime server serves until it is stopped.
            let _ = server.kill();
            let (_, s_out) = finish(server, Duration::from_secs(20), "server");
            assert!(c_ok, "{prog}\n--- client:\n{c_out}\n--- server:\n{s_out}");
            return c_out;
        }
        let (s_ok, s_out) = finish(server, Duration::from_secs(20), "server");
        let ok = match prog {
            "rping" => common::rping_pair_done((c_ok, &c_out), (s_ok, &s_out)),
            _ => c_ok && s_ok,
        };
        assert!(ok, "{prog}\n--- client:\n{c_out}\n--- server:\n{s_out}");
        return c_out;
    }
    unreachable!()
}

/// rping (every ping's bytes checked: `-V`), ucmatose (two RC connections), udaddy (two UD
/// QPs addressed through SIDR), cmtime (50 connections at once) and perftest's `-R` (its QPs
/// connected through rdma_cm) between `ends`, the server on its wire address `server_ip`.
fn rdma_cm_programs(ends: &Ends, server_ip: &str, perftest: bool) {
    let ping = ["-C", "50", "-S", "500", "-V", "-v"];
    let server: Vec<&str> = ["-s", "-a", server_ip].iter().chain(&ping).copied().collect();
    let client: Vec<&str> = ["-c", "-a", server_ip].iter().chain(&ping).copied().collect();
    let out = connected_by_rdma_cm(ends, "rping", &server, &client);
    assert!(out.contains("rdma-ping-49: "), "{out}");
    for prog in ["ucmatose", "udaddy"] {
        let args = ["-c", "2", "-C", "50", "-S", "512"];
        let server: Vec<&str> = ["-b", server_ip].iter().chain(&args).copied().collect();
        let client_ip = &ends.client.0;
        let client: Vec<&str> =
            ["-s", server_ip, "-b", client_ip].iter().chain(&args).copied().collect();
        let out = connected_by_rdma_cm(ends, prog, &server, &client);
        assert!(out.contains("test complete") && out.contains("return status 0"), "{prog}: {out}");
    }
    // 50 connections made at once and ended (cmtime times each step).
    let client: Vec<&str> = vec!["-s", server_ip, "-b", &ends.client.0, "-c", "50"];
    let out = connected_by_rdma_cm(ends, "cmtime", &["-b", server_ip, "-c", "50"], &client);
    assert!(out.lines().any(|l| l.starts_with("connect") && l.contains(':')), "{out}");
    if perftest {
        for prog in ["ib_write_bw", "ib_send_lat"] {
            let args = ["-R", "-n", "200", "-s", "4096"];
            let client: Vec<&str> = args.iter().copied().chain([server_ip]).collect();
            let out = connected_by_rdma_cm(ends, prog, &args, &client);
            assert_eq!(result_rows(&out), 1, "{prog} -R: {out}");
        }
    }
}

/// Every program over the wire between `ends`: the pingpongs check the bytes they receive
/// (`-c`), perftest must report its row.
fn every_program(ends: &Ends) {
    let pingpongs: [(&str, &[&str]); 4] = [
        ("ibv_rc_pingpong", &["-n", "50", "-s", "10000", "-m", "1024", "-c"]),
        ("ibv_rc_pingpong", &["-n", "20", "-s", "65536", "-m", "4096", "-c"]),
        ("ibv_uc_pingpong", &["-n", "50", "-s", "1024", "-m", "1024", "-c"]),
        ("ibv_ud_pingpong", &["-n", "50", "-s", "512", "-c"]),
    ];
    for (prog, args) in pingpongs {
        let out = server_and_client(ends, prog, "-g", args);
        let iters = args[1];
        assert!(out.contains(&format!("{iters} iters in")), "{prog} {args:?}: {out}");
    }
    let perftests: [(&str, &[&str]); 4] = [
        ("ib_write_bw", &["-n", "200", "-s", "65536"]),
        ("ib_read_bw", &["-n", "200", "-s", "16384"]),
        ("ib_send_lat", &["-n", "200", "-s", "64"]),
        ("ib_atomic_bw", &["-n", "200"]),
    ];
    for (prog, args) in perftests {
        let out = server_and_client(ends, prog, "-x", args);
        assert_eq!(result_rows(&out), 1, "{prog} {args:?}: {out}");
    }
}

#[test]
fn pingpongs_and_perftest_run_between_two_wire_ports_on_loopback() {
    every_program(&loopback_ends());
}

#[test]
fn rping_and_perftest_connect_through_rdma_cm_between_two_wire_ports_on_loopback() {
    let ends = loopback_ends();
    rdma_cm_programs(&ends, &ends.server.0.clone(), true);
}

/// Two network namespaces joined by a veth pair, made (and removed) by the test.
struct Namespaces(String, String);

impl Namespaces {
    /// `None` when this process may not make them (not root, no `ip`).
    fn make() -> Option<Namespaces> {
        let tag = std::process::id() % 100_000;
        let ns = Namespaces(format!("emu-a-{tag}"), format!("emu-b-{tag}"));
        let ip = |args: &[&str]| Command::new("ip").args(args).status().is_ok_and(|s| s.success());
        let (va, vb) = (format!("ewa{tag}"), format!("ewb{tag}"));
        let made = ip(&["netns", "add", &ns.0])
            && ip(&["netns", "add", &ns.1])
            && ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
            && ip(&["link", "set", &va, "netns", &ns.0])
            && ip(&["link", "set", &vb, "netns", &ns.1]);
        let inside = |n: &str, args: &[&str]| {
            let mut all = vec!["netns", "exec", n, "ip"];
            all.extend(args);
            ip(&all)
        };
        let up = made
            && inside(&ns.0, &["addr", "add", "10.77.0.1/24", "dev", &va])
            && inside(&ns.1, &["addr", "add", "10.77.0.2/24", "dev", &vb])
            && inside(&ns.0, &["addr", "add", "fd77::1/64", "dev", &va, "nodad"])
            && inside(&ns.1, &["addr", "add", "fd77::2/64", "dev", &vb, "nodad"])
            && [(&ns.0, &va), (&ns.1, &vb)].iter().all(|(n, v)| {
                inside(n, &["link", "set", v, "mtu", "9000", "up"])
                    && inside(n, &["link", "set", "lo", "up"])
            });
        up.then_some(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Removing a namespace removes its end of the veth pair, and so the pair.
        for n in [&self.0, &self.1] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

#[test]
fn pingpongs_and_perftest_run_between_two_network_namespaces_over_a_veth_pair() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: making network namespaces needs root (CI runs as root)");
        return;
    }
    let ns = Namespaces::make()
        .expect("root could not make two network namespaces and a veth pair (iproute2 installed?)");
    let ends = Ends {
        server: ("10.77.0.1".into(), Some(ns.0.clone())),
        client: ("10.77.0.2".into(), Some(ns.1.clone())),
        connect: "10.77.0.1".into(),
    };
    every_program(&ends);
    rdma_cm_programs(&ends, "10.77.0.1", true);
    // The same wire over IPv6: GIDs that are the addresses themselves, the ICRC over an
    // IPv6 header.
    let ends = Ends {
        server: ("fd77::1".into(), Some(ns.0.clone())),
        client: ("fd77::2".into(), Some(ns.1.clone())),
        connect: "10.77.0.1".into(),
    };
    let args = ["-n", "50", "-s", "10000", "-m", "1024", "-c"];
    let out = server_and_client(&ends, "ibv_rc_pingpong", "-g", &args);
    assert!(out.contains("50 iters in") && out.contains("GID fd77::2"), "{out}");
    let out = server_and_client(&ends, "ib_read_bw", "-x", &["-n", "200", "-s", "16384"]);
    assert_eq!(result_rows(&out), 1, "{out}");
    rdma_cm_programs(&ends, "fd77::1", false);
}

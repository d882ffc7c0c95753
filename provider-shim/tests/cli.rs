//! The `rdma-emu` command: `run` puts the shim under an unmodified program, `devices` lists the
//! emulated devices, bad usage exits 2.

mod common;
use std::process::Command;

fn rdma_emu() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdma-emu"));
    c.env("RDMA_EMU_LIB", common::cdylib()).env_remove("LD_LIBRARY_PATH");
    c
}

#[test]
fn run_puts_the_shim_under_an_unmodified_program() {
    let out = rdma_emu()
        .args(["run", "--devices", "3", "--profile", "rxe", "--", "ibv_devinfo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.matches("hca_id:").count(), 3, "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
}

#[test]
fn run_hands_seed_faults_and_packet_trace_to_the_program() {
    let env = rdma_emu()
        .args(["run", "--seed", "5", "--faults", "drop:op=ack,p=0.5", "--pcap", "t.pcap", "--"])
        .args(["sh", "-c", "echo $RDMA_EMU_SEED/$RDMA_EMU_FAULTS/$RDMA_EMU_PCAP"])
        .output()
        .unwrap();
    let cwd = std::env::current_dir().unwrap();
    let expected = format!("5/drop:op=ack,p=0.5/{}\n", cwd.join("t.pcap").display());
    assert_eq!(String::from_utf8_lossy(&env.stdout), expected);
    // The library reports the seed of a simulated run, so that it can be replayed.
    let out = rdma_emu().args(["run", "--seed", "5", "--", "ibv_devices"]).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rdma-emu: seed 5 (simulation); replay with RDMA_EMU_SEED=5"), "{err}");
}

/// The devices' sysfs tree is there before the program loads the library (a CI step that
/// lists `/sys/class/infiniband` first finds the devices).
#[test]
fn run_writes_the_sysfs_tree_before_the_program_starts() {
    let script = "ls $RDMA_EMU_SYSFS/class/infiniband; cat $RDMA_EMU_SYSFS/class/infiniband/emu1/ports/1/gids/1";
    let out =
        rdma_emu().args(["run", "--profile", "rxe", "--", "sh", "-c", script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["emu0", "emu1"], "{text}");
    assert!(
        lines[2].starts_with("0000:0000:0000:0000:0000:ffff:"),
        "an IPv4 GID at index 1: {text}"
    );
}

#[test]
fn run_passes_the_exit_status_through() {
    let out = rdma_emu().args(["run", "--", "sh", "-c", "exit 7"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7));
}

#[test]
fn devices_lists_ports_and_gids() {
    let out = rdma_emu().args(["devices", "--devices", "2", "--ports", "2"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("emu1") && text.contains("000000fffe000002"), "{text}");
    assert_eq!(text.matches("port 2:").count(), 2, "{text}");
}

/// Debian's infiniband-diags (`ibstat`, `ibstatus`: libibumad reading the sysfs tree) report
/// each device and port as `ibv_devinfo` (libibverbs) reports it: identity, state, LID, rate,
/// link layer and first GID, on both profiles.
#[test]
fn infiniband_diags_report_what_ibv_devinfo_reports() {
    for (profile, link, rate) in
        [("rxe", "Ethernet", "2.5 Gb/sec (1X SDR)"), ("full", "InfiniBand", "100 Gb/sec (4X EDR)")]
    {
        let sep = "=====";
        let script = format!("ibstat; echo {sep}; ibstatus; echo {sep}; ibv_devinfo -v");
        let out = rdma_emu()
            .args(["run", "--devices", "2", "--profile", profile, "--", "sh", "-c", &script])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let parts: Vec<&str> = text.split(&format!("{sep}\n")).collect();
        let [ibstat, ibstatus, devinfo] = parts[..] else { panic!("{text}") };
        // The value after `key` in the block of `dev` (a block starts with a line naming it).
        let field = |block: &str, key: &str| -> String {
            let line = block.lines().find(|l| l.trim_start().starts_with(key));
            line.unwrap_or_else(|| panic!("no {key} in {block}")).trim_start()[key.len()..]
                .trim()
                .to_string()
        };
        let block = |out: &str, head: &str| -> String {
            let from = out.find(head).unwrap_or_else(|| panic!("no {head} in {out}"));
            let rest = &out[from + head.len()..];
            let end = ["CA '", "Infiniband device '", "hca_id:"]
                .iter()
                .filter_map(|h| rest.find(h))
                .min()
                .unwrap_or(rest.len());
            rest[..end].to_string()
        };
        for dev in ["emu0", "emu1"] {
            let (st, sts, di) = (
                block(ibstat, &format!("CA '{dev}'")),
                block(ibstatus, &format!("Infiniband device '{dev}' port 1")),
                block(devinfo, &format!("hca_id:\t{dev}")),
            );
            // 0000:00ff:fe00:0001 (ibv_devinfo) is 0x000000fffe000001 (ibstat).
            let guid = format!("0x{}", field(&di, "node_guid:").replace(':', ""));
            assert_eq!(field(&st, "Node GUID:"), guid, "{dev} ({profile})");
            assert_eq!(field(&st, "Port GUID:"), guid, "{dev} ({profile})");
            assert_eq!(field(&di, "state:"), "PORT_ACTIVE (4)", "{dev} ({profile})");
            assert_eq!(field(&st, "State:"), "Active");
            assert_eq!(field(&st, "Physical state:"), "LinkUp");
            assert_eq!(field(&sts, "state:"), "4: ACTIVE");
            assert_eq!(
                (field(&st, "Link layer:"), field(&di, "link_layer:")),
                (link.into(), link.into())
            );
            let lid = field(&di, "port_lid:").parse::<u16>().unwrap();
            assert_eq!(field(&st, "Base lid:"), lid.to_string(), "{dev} ({profile})");
            assert_eq!(field(&sts, "base lid:"), format!("{lid:#x}"), "{dev} ({profile})");
            assert_eq!(field(&sts, "rate:"), rate, "{dev} ({profile})");
            // ibstatus writes the GID in full, ibv_devinfo (over RoCE) in IPv6's short form.
            let gid = |s: &str| s.split(',').next().unwrap().parse::<std::net::Ipv6Addr>();
            let first = field(&di, "GID[  0]:");
            assert_eq!(gid(&field(&sts, "default gid:")), gid(&first), "{dev} ({profile})");
            assert!(gid(&first).is_ok(), "{first}");
        }
    }
}

#[test]
fn link_layer_ethernet_makes_the_full_profile_roce() {
    let out = rdma_emu()
        .args(["run", "--link-layer", "eth", "--", "ibv_devinfo", "-d", "emu0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
}

#[test]
fn mtu_sets_the_netdev_mtu_the_active_mtu_follows() {
    for (profile, mtu, active) in [
        ("rxe", None, "1024 (3)"),
        ("rxe", Some("9000"), "4096 (5)"),
        ("rxe", Some("1500"), "1024 (3)"),
    ] {
        let mut cmd = rdma_emu();
        cmd.args(["run", "--profile", profile]);
        if let Some(m) = mtu {
            cmd.args(["--mtu", m]);
        }
        let out = cmd.args(["--", "ibv_devinfo", "-d", "emu0"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains(&format!("active_mtu:\t\t{active}")), "{mtu:?}: {text}");
        assert!(text.contains("max_mtu:\t\t4096 (5)"), "{text}");
    }
}

#[test]
fn bad_usage_exits_2_with_a_message() {
    for args in [
        &["run", "--profile", "mlx5", "--", "true"][..],
        &["run"],
        &["frobnicate"],
        &["run", "--devices"],
        &["run", "--seed", "x", "--", "true"],
        &["run", "--faults", "drop:p=9", "--", "true"],
        &["run", "--link-layer", "fddi", "--", "true"],
        &["run", "--mtu", "20", "--", "true"],
        &["run", "--mtu", "jumbo", "--", "true"],
        &["run", "--wire", "bogus", "--", "true"],
        &["run", "--wire", "127.0.0.1=emux", "--", "true"],
    ] {
        let out = rdma_emu().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("rdma-emu:"), "{args:?}");
    }
}

/// A wire port that cannot be had leaves the program with no devices and says why: an
/// address this host does not have, or a port that is not Ethernet.
#[test]
fn a_wire_port_that_cannot_be_bound_says_why() {
    for (args, why) in [
        (&["--profile", "rxe", "--wire", "192.0.2.77"][..], "cannot bind a wire port's UDP socket"),
        (&["--profile", "full", "--wire", "127.0.0.1"][..], "a wire port needs Ethernet ports"),
    ] {
        let out = rdma_emu()
            .arg("run")
            .args(args)
            .args(["--fabric", "none", "--", "ibv_devices"])
            .output()
            .unwrap();
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(stderr.contains(why) && stderr.contains("no devices"), "{args:?}: {stderr}");
        assert!(!stdout.contains("emu0"), "{args:?}: {stdout}");
    }
}

/// A host fabric directory for one test, removed afterwards.
struct HostDir(std::path::PathBuf);

impl HostDir {
    fn new(tag: &str) -> HostDir {
        let d = std::env::temp_dir().join(format!("rdma-emu-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        HostDir(d)
    }
    fn name(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits (bounded: a guard, not a timing assertion) until `f` holds.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn event_and_port_reach_ibv_asyncwatch_in_another_process() {
    let dir = HostDir::new("asyncwatch");
    let log = dir.0.with_extension("log");
    let mut watch = rdma_emu()
        .args(["run", "--fabric", dir.name(), "--", "stdbuf", "-oL", "ibv_asyncwatch"])
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // It has the device open once its node's socket exists.
    wait_until("ibv_asyncwatch to join", || dir.0.join("1.sock").exists());
    for args in
        [&["event", "LID_CHANGE"][..], &["event", "IBV_EVENT_DEVICE_FATAL"], &["port", "down"]]
    {
        let mut c = rdma_emu();
        let out = c.args(&args[..1]).args(["--fabric", dir.name()]).args(&args[1..]).output();
        let out = out.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("in 1 other process"), "{args:?}: {text}");
    }
    let want = [
        "event_type IBV_EVENT_LID_CHANGE (11), port 1",
        "event_type IBV_EVENT_DEVICE_FATAL (8), port 0",
        "event_type IBV_EVENT_PORT_ERR (10), port 1",
    ];
    wait_until("the events", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        want.iter().all(|w| text.contains(w))
    });
    watch.kill().unwrap();
    watch.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let order: Vec<usize> = want.iter().map(|w| text.find(w).unwrap()).collect();
    assert!(order.windows(2).all(|p| p[0] < p[1]), "in the order raised: {text}");
    let _ = std::fs::remove_file(&log);

    // The cable stays pulled for a program started afterwards, until it is plugged back.
    let port_state = || {
        let out = rdma_emu()
            .args(["run", "--fabric", dir.name(), "--", "ibv_devinfo", "-d", "emu0"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.trim_start().starts_with("state:"));
        line.unwrap_or_else(|| panic!("no port state: {text}")).to_owned()
    };
    assert!(port_state().contains("PORT_DOWN"), "{}", port_state());
    let up = rdma_emu().args(["port", "--fabric", dir.name(), "up"]).output().unwrap();
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    assert!(port_state().contains("PORT_ACTIVE"), "{}", port_state());
}

#[test]
fn event_refuses_unknown_events_traffic_events_and_foreign_fabrics() {
    let dir = HostDir::new("refuse");
    let run = |args: &[&str]| {
        let mut c = rdma_emu();
        let out = c.args(&args[..1]).args(["--fabric", dir.name()]).args(&args[1..]).output();
        let out = out.unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["event", "NOT_AN_EVENT"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown event"), "{err}");
    let (code, err) = run(&["event", "QP_FATAL"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("not a port or device event"), "{err}");
    // A fabric directory others may write to is refused with a reason, never joined.
    std::fs::create_dir_all(&dir.0).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, err) = run(&["port", "down"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("other users may write to it"), "{err}");
}

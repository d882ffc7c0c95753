//! C programs compiled against the system's <infiniband/verbs.h>, linked with -libverbs, and
//! run on the shim; and Debian's unmodified ibverbs-utils run on it (needs libibverbs-dev and
//! ibverbs-utils, which ci.sh installs).

mod common;
use std::{path::Path, process::Command};

/// Runs `cmd` on the shim through LD_LIBRARY_PATH; returns stdout, asserting success.
fn run_on_shim(cmd: &mut Command) -> String {
    let out = cmd.env("LD_LIBRARY_PATH", common::lib_dir()).output().expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Builds `tests/c/<name>.c` and runs it under each of `profiles`; it must print "<name> ok".
fn c_program(name: &str, profiles: &[&str]) {
    let exe = common::c_test(name);
    for profile in profiles {
        let out = run_on_shim(Command::new(&exe).env("RDMA_EMU_PROFILE", profile));
        assert!(out.contains(&format!("{name} ok")), "{profile}: {out}");
    }
}

#[test]
fn rc_basic_c_program_runs_on_the_shim() {
    c_program("rc_basic", &["full", "rxe"]);
}

/// The library registers the process for the kernel's barrier at load, before `main` and
/// any verb: a barrier asked for first thing is allowed (the registration, made at the first
/// QP, cost that QP ~15 ms once the process had threads).
#[test]
fn the_process_is_registered_for_the_barrier_at_load() {
    c_program("barrier_at_load", &["rxe"]);
}

/// A program that loads the verbs library only through `dlopen` of a library that links it
/// (as UCX, Open MPI and Python load theirs) runs verbs in a thread started before the load:
/// `rc_basic` built as that library. Twice: with the loader's default reserve of static TLS,
/// where the library's thread-local words are placed in it, and with the reserve cut down
/// (`glibc.rtld.optional_static_tls=0`, one namespace), where they are reached through the
/// loader's dynamic TLS descriptors, set up in that thread at its first use.
#[test]
fn verbs_run_in_a_library_loaded_by_dlopen() {
    let plugin = common::compile(
        "cc",
        &["-std=gnu11", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-Dmain=rc_basic_main"],
        "c/rc_basic.c",
        &["-lrdmacm", "-libverbs"],
        "librc_basic_plugin.so",
        "libibverbs-dev",
    );
    let host = common::compile(
        "cc",
        &["-std=gnu11", "-O1", "-Wall", "-Werror", "-pthread"],
        "c/dlopen_host.c",
        &["-ldl"],
        "dlopen_host",
        "gcc",
    );
    for tunables in [None, Some("glibc.rtld.nns=1:glibc.rtld.optional_static_tls=0")] {
        let mut cmd = Command::new(&host);
        cmd.arg(&plugin).arg("rc_basic_main");
        if let Some(t) = tunables {
            cmd.env("GLIBC_TUNABLES", t);
        }
        let out = run_on_shim(&mut cmd);
        assert!(out.contains("rc_basic ok"), "{tunables:?}: {out}");
        assert!(out.contains("dlopen_host: rc_basic_main returned 0"), "{tunables:?}: {out}");
    }
}

fn util(name: &str) -> String {
    let path = format!("/usr/bin/{name}");
    assert!(Path::new(&path).exists(), "{path} is missing: install Debian's ibverbs-utils");
    path
}

#[test]
fn debian_ibv_devices_lists_the_emulated_devices() {
    let out = run_on_shim(Command::new(util("ibv_devices")).env("RDMA_EMU_DEVICES", "3"));
    for (name, guid) in
        [("emu0", "000000fffe000001"), ("emu1", "000000fffe000002"), ("emu2", "000000fffe000003")]
    {
        assert!(
            out.lines().any(|l| l.contains(name) && l.contains(guid)),
            "{name} missing:\n{out}"
        );
    }
}

/// A killed process leaves its sysfs tree; each process that writes its own takes up to 8 such
/// trees away, so they never pile up. (Its own tree goes at its exit.)
#[test]
fn each_process_sweeps_a_few_trees_that_killed_processes_left() {
    let runtime = std::env::temp_dir().join(format!("sysfs-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime);
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .unwrap();
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&runtime).unwrap());
    let base = runtime.join(format!("rdma-emu-{uid}"));
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // Trees of processes that are gone (reaped), and one of this live process.
    for _ in 0..20 {
        let mut gone = Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        std::fs::create_dir_all(base.join(format!("sysfs-{pid}/class/infiniband"))).unwrap();
    }
    let live = base.join(format!("sysfs-{}", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    let trees = || {
        std::fs::read_dir(&base)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("sysfs-"))
            .count()
    };
    for left in [13, 5, 1] {
        run_on_shim(
            Command::new(util("ibv_devices"))
                .env("RDMA_EMU_RUNTIME_DIR", &runtime)
                .env_remove("XDG_RUNTIME_DIR")
                .env_remove("RDMA_EMU_SYSFS"),
        );
        assert_eq!(trees(), left, "8 gone trees fewer each run, the live one kept");
    }
    assert!(live.exists());
    std::fs::remove_dir_all(&runtime).unwrap();
}

#[test]
fn debian_ibv_devinfo_verbose_prints_the_rxe_profile() {
    let out = run_on_shim(
        Command::new(util("ibv_devinfo"))
            .arg("-v")
            .env("RDMA_EMU_PROFILE", "rxe")
            .env("RDMA_EMU_DEVICES", "1"),
    );
    for want in [
        "hca_id:\temu0",
        // On the host fabric (the default) a process can create 65,535 QPs: its node's QPNs.
        "max_qp:\t\t\t\t65535",
        "max_cqe:\t\t\t32767",
        "device_cap_flags:\t\t0x01223c76",
        "device_cap_flags_ex:\t\t0x1223C76",
        "state:\t\t\tPORT_ACTIVE (4)",
        "active_mtu:\t\t1024 (3)",
        "link_layer:\t\tEthernet",
        "gid_tbl_len:\t\t1024",
        "GID[  1]:",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
}

/// `ibv_devinfo -v` on the rxe profile prints what it prints on the kernel's rxe
/// (conformance/golden/rxe), line for line: only the device's identity (name, GUIDs, GID
/// addresses, and so how many GIDs: one per address of the port) may differ. In one process,
/// where as many QPs as rxe reports can be created (on a host fabric `max_qp` is smaller).
#[test]
fn rxe_profile_devinfo_matches_the_golden_rxe_output() {
    let golden_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/golden/rxe/ibv_devinfo-v.txt");
    let golden = std::fs::read_to_string(&golden_path).unwrap();
    let ours = run_on_shim(
        Command::new(util("ibv_devinfo"))
            .arg("-v")
            .env("RDMA_EMU_PROFILE", "rxe")
            .env("RDMA_EMU_DEVICES", "1")
            .env("RDMA_EMU_FABRIC", "none"),
    );
    // The identity of a device is its own; the value after the key is not compared.
    const IDENTITY: [&str; 3] = ["hca_id:", "node_guid:", "sys_image_guid:"];
    let normalize = |l: &str| match IDENTITY.iter().find(|k| l.trim_start().starts_with(*k)) {
        Some(k) => format!("{}{k}", &l[..l.len() - l.trim_start().len()]),
        None => l.to_string(),
    };
    // The GID lines, apart: as many as the port has addresses, each a RoCE v2 GID.
    let is_gid = |l: &&str| l.trim_start().starts_with("GID[");
    let gid_kinds = |s: &str| -> Vec<String> {
        s.lines().filter(is_gid).map(|l| l.rsplit(", ").next().unwrap().to_string()).collect()
    };
    let (golden_gids, our_gids) = (gid_kinds(&golden), gid_kinds(&ours));
    assert!(our_gids.len() >= golden_gids.len(), "{ours}");
    assert!(our_gids.iter().all(|k| k == &golden_gids[0]), "{ours}");
    let expected: Vec<String> = golden.lines().filter(|l| !is_gid(l)).map(normalize).collect();
    let got: Vec<String> = ours.lines().filter(|l| !is_gid(l)).map(normalize).collect();
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(e, g, "line {} differs from rxe; ours:\n{ours}", i + 1);
    }
    assert_eq!(expected.len(), got.len(), "line count differs from rxe; ours:\n{ours}");
}

#[test]
fn works_as_ld_preload_over_the_real_libibverbs() {
    let out = Command::new(util("ibv_devices"))
        .env("LD_PRELOAD", common::cdylib())
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("emu0"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pure_helpers_equal_rdma_cores() {
    let exe = common::c_test("pure_functions");
    let real = Command::new(&exe).env_remove("LD_LIBRARY_PATH").output().unwrap();
    assert!(real.status.success());
    let ours = run_on_shim(&mut Command::new(&exe));
    let real = String::from_utf8_lossy(&real.stdout);
    let diff: Vec<_> = real.lines().zip(ours.lines()).filter(|(a, b)| a != b).collect();
    assert!(
        diff.is_empty() && real.lines().count() == ours.lines().count(),
        "real vs shim: {diff:#?}"
    );
}

#[test]
fn extended_cq_and_qp_api_runs_on_the_shim() {
    c_program("extended", &["full"]);
}

#[test]
fn device_clock_timestamps_and_cq_moderation_through_the_c_abi() {
    let exe = common::c_test("clock");
    for profile in ["full", "rxe"] {
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_SEED", "5");
        let out = run_on_shim(cmd.env("RDMA_EMU_FABRIC", "none"));
        assert!(out.contains("clock ok"), "{profile}: {out}");
    }
}

#[test]
fn raw_packet_qps_flows_wqs_rss_and_tso_through_the_c_abi() {
    // InfiniBand ports refuse raw packet QPs; the rxe profile has none of the family.
    c_program("raw", &["full", "rxe"]);
    let exe = common::c_test("raw");
    let mut cmd = Command::new(&exe);
    cmd.env("RDMA_EMU_PROFILE", "full").env("RDMA_EMU_LINK_LAYER", "ethernet");
    assert!(run_on_shim(&mut cmd).contains("raw ok"));
}

#[test]
fn memory_registration_pins_and_rereg_answers_as_libibverbs_and_the_providers() {
    c_program("mr", &["full", "rxe"]);
}

/// Registration, use, fork and deregistration on the host fabric (where registered memory
/// moves into shared memory) make no call to libc's `mmap`, `munmap`, `mremap` or `madvise`
/// on the registered pages, which memory hooks (libfabric's, UCX's) would take for the
/// application's.
#[test]
fn registration_changes_no_mapping_that_memory_hooks_watch() {
    let exe = common::c_test("memhooks");
    let fabric = common::Fabric::new("hooks");
    let out = run_on_shim(Command::new(&exe).env("RDMA_EMU_FABRIC", &fabric.0));
    assert!(out.contains("memhooks ok"), "{out}");
}

#[test]
fn device_memory_through_the_c_abi() {
    c_program("dm", &["full", "rxe"]);
}

#[test]
fn ece_through_the_c_abi() {
    c_program("ece", &["full", "rxe"]);
}

#[test]
fn contexts_share_objects_by_import_through_the_c_abi() {
    c_program("import", &["full", "rxe"]);
}

#[test]
fn objects_whose_kernel_handle_or_context_was_changed_are_refused_and_stay_alive() {
    c_program("handles", &["full", "rxe"]);
    let out = run_on_shim(
        Command::new(common::c_test("handles"))
            .env("RDMA_EMU_PROFILE", "full")
            .env("RDMA_EMU_LINK_LAYER", "ethernet"),
    );
    assert!(out.contains("handles ok"), "{out}");
}

#[test]
fn tag_matching_through_the_c_abi() {
    c_program("tm", &["full", "rxe"]);
}

#[test]
fn thread_and_parent_domains_with_custom_allocators() {
    c_program("parent", &["full", "rxe"]);
}

#[test]
fn rdma_flush_through_ibv_wr_flush() {
    c_program("flush", &["full", "rxe"]);
}

#[test]
fn null_destroyed_and_foreign_handles_get_errnos() {
    c_program("bad_input", &["full"]);
}

/// [`c_program`] for the connection manager's tests: no host fabric, so the ports a test
/// binds are its process's alone.
fn cm_c_program(name: &str) {
    let exe = common::c_test(name);
    for profile in ["full", "rxe"] {
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", "none");
        let out = run_on_shim(&mut cmd);
        assert!(out.contains(&format!("{name} ok")), "{profile}: {out}");
    }
}

#[test]
fn the_connection_manager_in_one_process_and_its_bad_input() {
    cm_c_program("cm");
}

/// `rdma_destroy_id`, `rdma_migrate_id` and `rdma_leave_multicast` wait, as librdmacm's do,
/// until another thread acknowledged the events it took for the id (a connection request
/// counting for its listener); the same program passes against the kernel's rxe (in the VM,
/// with `CM_ACKS_HOST` its port's address and a multicast route).
#[test]
fn the_connection_manager_waits_for_every_event_of_an_id_to_be_acknowledged() {
    cm_c_program("cm_acks");
}

/// Every connection manager call on an id in each of its states (before and after
/// connecting, refused, disconnected either way, listening, each side; RC, and UD's SIDR
/// exchange) answers as on the kernel's rxe: the same return and errno, the QP left in the
/// same state, the same events at both ends. `tests/c/cm_states.rxe` and `cm_states_ud.rxe`
/// are the program's output recorded in the VM; a line that differs is a deviation
/// (docs/rdma-cm.md).
#[test]
fn each_call_in_each_state_of_an_id_answers_as_on_rxe() {
    let exe = common::c_test("cm_states");
    let runs = [
        ("full", false, include_str!("c/cm_states.rxe")),
        ("rxe", false, include_str!("c/cm_states.rxe")),
        ("rxe", true, include_str!("c/cm_states_ud.rxe")),
    ];
    for (profile, ud, recorded) in runs {
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", "none");
        if ud {
            cmd.env("CM_STATES_UD", "1");
        }
        same_as_recorded(&run_on_shim(&mut cmd), recorded, &format!("{profile}, UD {ud}"));
    }
}

/// Each rsocket call on a stream socket in each of its states (fresh, bound, listening,
/// connected, accepted, shut down either way, the peer closed or shut down) answers as
/// librdmacm's on the kernel's rxe: the same return and errno, the same address, option and
/// poll events (`tests/c/rs_states.rxe`, the program's output recorded in the VM).
#[test]
fn each_rsocket_call_in_each_state_answers_as_librdmacm_on_rxe() {
    let exe = common::c_test("rs_states");
    for profile in ["full", "rxe"] {
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", "none");
        same_as_recorded(&run_on_shim(&mut cmd), include_str!("c/rs_states.rxe"), profile);
    }
}

/// A listener accepts in the background, as librdmacm's listen service: a client's blocking
/// `rconnect` completes (and its first bytes go) before the server calls `raccept`, in one
/// thread connecting to its own listener and across processes with the server outside any
/// rsocket call; connections are taken in the order they came (`tests/c/rs_backlog.c`, each
/// line as recorded on the kernel's rxe), in one process and on a host fabric.
#[test]
fn a_listener_accepts_before_raccept_as_librdmacms_listen_service() {
    let exe = common::c_test("rs_backlog");
    let recorded = include_str!("c/rs_backlog.rxe");
    let in_one: String =
        recorded.lines().filter(|l| !l.starts_with("across")).map(|l| format!("{l}\n")).collect();
    for profile in ["full", "rxe"] {
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", "none");
        same_as_recorded(&run_on_shim(&mut cmd), &in_one, &format!("{profile}, one process"));
        let fabric = common::Fabric::new("rs_backlog");
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile)
            .env("RDMA_EMU_FABRIC", &fabric.0)
            .env("RS_BACKLOG_ACROSS", "1");
        same_as_recorded(&run_on_shim(&mut cmd), recorded, &format!("{profile}, two processes"));
    }
}

/// `out`, line for line, is `recorded`; each line that differs is shown with its recording.
fn same_as_recorded(out: &str, recorded: &str, what: &str) {
    let differ: Vec<String> = recorded
        .lines()
        .zip(out.lines())
        .filter(|(rxe, emu)| rxe != emu)
        .map(|(rxe, emu)| format!("rxe: {rxe}\nemu: {emu}"))
        .collect();
    assert!(differ.is_empty(), "{what}: {}", differ.join("\n"));
    assert_eq!(out.lines().count(), recorded.lines().count(), "{what}: {out}");
}

/// librdmacm's synchronous mode, `rdma_getaddrinfo`'s results and errors, and a synchronous
/// `rdma_disconnect` that waits for the other side's answer, as on the kernel's rxe (the
/// program passes there too, with `CM_SYNC_HOST` its port's address).
#[test]
fn the_synchronous_mode_waits_for_each_event_as_librdmacm() {
    cm_c_program("cm_sync");
}

/// Children of a process that opened a device use the verbs and the CM on their own, and
/// leave their parent reachable when they exit (see `tests/c/fork.c`).
#[test]
fn forked_children_are_processes_of_their_own_on_the_host_fabric() {
    forking_c_program("fork");
}

/// [`c_program`] for a program whose processes fork (its children processes of their own):
/// on a host fabric of its own under each profile.
fn forking_c_program(name: &str) {
    let exe = common::c_test(name);
    for profile in ["full", "rxe"] {
        let fabric = common::Fabric::new(name);
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", &fabric.0);
        let out = run_on_shim(&mut cmd);
        assert!(out.contains(&format!("{name} ok")), "{profile}: {out}");
    }
}

#[test]
fn rsockets_in_one_process_and_their_bad_input() {
    let exe = common::c_test("rsocket");
    for profile in ["full", "rxe"] {
        let mut cmd = Command::new(&exe);
        cmd.env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", "none");
        let out = run_on_shim(&mut cmd);
        assert!(out.contains("rsocket ok"), "{profile}: {out}");
    }
}

/// A process that exits with a QP connected to another process's leaves its peer as the
/// kernel's destruction of its QPs does (receive posted, a SEND out of retries); one that
/// dies without exiting fails the peer's QP at once (see `tests/c/exit.c`).
#[test]
fn a_peer_that_exits_connected_leaves_the_qp_as_hardware_does_one_that_dies_fails_it() {
    forking_c_program("exit");
}

#[test]
fn closing_a_context_destroys_what_it_owns() {
    c_program("close", &["full", "rxe"]);
}

#[test]
fn ud_datagrams_through_the_c_abi() {
    c_program("ud", &["full", "rxe"]);
    // The full profile over RoCE, as mlx5.
    let out = run_on_shim(
        Command::new(common::c_test("ud"))
            .env("RDMA_EMU_PROFILE", "full")
            .env("RDMA_EMU_LINK_LAYER", "ethernet"),
    );
    assert!(out.contains("ud ok"), "{out}");
}

#[test]
fn srq_through_the_c_abi() {
    c_program("srq", &["full"]);
}

#[test]
fn memory_windows_through_the_c_abi() {
    c_program("mw", &["full", "rxe"]);
}

#[test]
fn xrc_through_the_c_abi() {
    c_program("xrc", &["full"]);
}

#[test]
fn control_functions_raise_port_and_device_events() {
    c_program("control", &["full"]);
}

/// Runs `exe` on the shim with `envs`, in a fabric of its own; its stdout and stderr,
/// asserting success.
fn run_with(exe: &Path, profile: &str, envs: &[(&str, &str)]) -> (String, String) {
    // Without address space randomization: the buffers' addresses travel in the packets
    // (RETH), and one program should give one trace.
    let out = Command::new("setarch")
        .arg("-R")
        .arg(exe)
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .env("RDMA_EMU_PROFILE", profile)
        .env("RDMA_EMU_FABRIC", "none")
        .envs(envs.iter().copied())
        .output()
        .expect("run the program");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{exe:?} ({profile}) failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn faults_from_c_in_simulation_and_the_same_seed_gives_the_same_packet_trace() {
    let exe = common::c_test("faults");
    let dir = common::profile_dir().join("c-tests");
    for profile in ["full", "rxe"] {
        let mut traces = Vec::new();
        for run in 0..2 {
            let pcap = dir.join(format!("faults-{profile}-{run}.pcap"));
            let (out, err) = run_with(
                &exe,
                profile,
                &[
                    ("RDMA_EMU_SEED", "7"),
                    ("RDMA_EMU_FAULTS", "drop:op=write,nth=1"),
                    ("RDMA_EMU_PCAP", pcap.to_str().unwrap()),
                ],
            );
            assert!(out.contains("faults ok"), "{out}");
            assert!(err.contains("rdma-emu: seed 7 (simulation); replay with RDMA_EMU_SEED=7"));
            traces.push(std::fs::read(&pcap).unwrap());
        }
        assert!(traces[0].len() > 1000, "{profile}: a trace of every packet");
        assert!(traces[0] == traces[1], "{profile}: one seed, one trace, byte for byte");
    }
}

#[test]
fn malformed_fault_rules_or_seed_leave_the_program_without_devices_and_say_why() {
    let exe = common::c_test("rc_basic");
    for (var, value, why) in [
        ("RDMA_EMU_FAULTS", "drop:p=3", "fault rule \"drop:p=3\": p= is a probability"),
        ("RDMA_EMU_SEED", "soon", "RDMA_EMU_SEED=\"soon\" is not a number"),
    ] {
        let out = Command::new(&exe)
            .env("LD_LIBRARY_PATH", common::lib_dir())
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(&format!("rdma-emu: {why}")), "{err}");
    }
}

/// `tshark`'s reading of `pcap`: one line per frame, the fields `fields` separated by tabs.
fn tshark(pcap: &Path, fields: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"]).arg(pcap).args(["-T", "fields"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("tshark is missing: install Debian's tshark package");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn tshark_decodes_the_packet_trace_as_roce_v2_with_opcodes_and_psns() {
    let exe = common::c_test("rc_basic");
    // Both profiles address by GID index 0, a link-local IPv6 address.
    for (profile, ip) in [("full", "ipv6"), ("rxe", "ipv6")] {
        let pcap = common::profile_dir().join("c-tests").join(format!("rc_basic-{profile}.pcap"));
        let (out, _) = run_with(&exe, profile, &[("RDMA_EMU_PCAP", pcap.to_str().unwrap())]);
        assert!(out.contains("rc_basic ok"));
        let fields = ["frame.protocols", "infiniband.bth.opcode", "infiniband.bth.psn"];
        let frames = tshark(&pcap, &[fields[0], fields[1], fields[2], "infiniband.bth.destqp"]);
        assert!(frames.len() > 10, "{frames:?}");
        let mut opcodes = std::collections::BTreeSet::new();
        let mut request_psns: std::collections::HashMap<String, Vec<u32>> = Default::default();
        for f in &frames {
            let cols: Vec<&str> = f.split('\t').collect();
            assert_eq!(cols.len(), 4, "{f}");
            assert!(cols[0].starts_with(&format!("eth:ethertype:{ip}:udp:infiniband")), "{f}");
            let (op, psn): (u32, u32) = (cols[1].parse().unwrap(), cols[2].parse().unwrap());
            opcodes.insert(op);
            if !(0x0d..=0x12).contains(&op) {
                request_psns.entry(cols[3].to_owned()).or_default().push(psn);
            }
        }
        // Without faults, each QP's requests start at its first PSN (0) and move forward.
        for (qp, psns) in &request_psns {
            assert_eq!(psns[0], 0, "{profile}: requests to QP {qp}: {psns:?}");
            assert!(psns.windows(2).all(|w| w[0] < w[1]), "{profile}: to {qp}: {psns:?}");
        }
        // SEND ONLY, RDMA WRITE ONLY, READ REQUEST, READ RESPONSE ONLY, ACK, ATOMIC ACK,
        // COMPARE SWAP, FETCH ADD: rc_basic does each.
        for op in [0x04, 0x0a, 0x0c, 0x10, 0x11, 0x12, 0x13, 0x14] {
            assert!(opcodes.contains(&op), "{profile}: no opcode {op:#x} in {opcodes:?}");
        }
    }
}

#[test]
fn a_signal_ends_blocking_waits_with_eintr_unless_restarted() {
    c_program("signals", &["full", "rxe"]);
}

/// The devices' sysfs tree agrees with the verbs, in this process's own tree (LD_LIBRARY_PATH)
/// and as /sys with /dev/infiniband nodes under `rdma-emu run`; nothing outside the program's
/// view changes.
#[test]
fn the_sysfs_tree_and_device_nodes_agree_with_the_verbs() {
    let exe = common::c_test("sysfs");
    for profile in ["full", "rxe"] {
        let out = run_on_shim(Command::new(&exe).env("RDMA_EMU_PROFILE", profile));
        assert!(out.contains("sysfs ok"), "{profile}: {out}");
        let out = Command::new(env!("CARGO_BIN_EXE_rdma-emu"))
            .env("RDMA_EMU_LIB", common::cdylib())
            .args(["run", "--profile", profile, "--"])
            .arg(&exe)
            .arg("view")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("sysfs ok"),
            "{profile}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        !Path::new("/dev/infiniband/uverbs0").exists()
            || Path::new("/sys/class/infiniband").exists()
    );
}

/// Memcheck over the C tests: each under Valgrind on the shim (full profile) reports no invalid
/// read or write and no use of uninitialised memory (`--error-exitcode`). Not here: `mr`, whose
/// accesses to memory unmapped under a live MR are invalid on purpose (the emulator recovers
/// their faults: memcheck reports them first); `close`, whose thousand context cycles take
/// minutes under Valgrind (run it by hand); `faults` and `sysfs`, which need the settings their
/// own tests give them. Leaks are AddressSanitizer's business (`./ci.sh sanitize`).
#[test]
fn the_c_tests_run_clean_under_valgrind_memcheck() {
    let valgrind = Path::new("/usr/bin/valgrind");
    assert!(valgrind.exists(), "valgrind is missing (./ci.sh installs it)");
    let names = [
        "rc_basic",
        "bad_input",
        "handles",
        "srq",
        "ud",
        "mw",
        "extended",
        "flush",
        "control",
        "xrc",
        "dm",
        "import",
        "parent",
        "cm",
        "cm_acks",
        "cm_sync",
        "pure_functions",
        "raw",
        "tm",
        "ece",
        "clock",
        "rsocket",
        "signals",
    ];
    for name in names {
        let exe = common::c_test(name);
        let mut cmd = Command::new(valgrind);
        cmd.args(["-q", "--error-exitcode=9", "--leak-check=no"])
            .arg(&exe)
            .env("RDMA_EMU_PROFILE", "full");
        if name == "clock" {
            // Its moderation checks count on virtual time, as its own test runs it: on real
            // time a slow run (Valgrind's) can end a period between two of its steps.
            cmd.env("RDMA_EMU_SEED", "5").env("RDMA_EMU_FABRIC", "none");
        }
        let out = run_on_shim(&mut cmd);
        // (pure_functions prints a table and no verdict: its exit status is the verdict.)
        assert!(name == "pure_functions" || out.contains(&format!("{name} ok")), "{name}: {out}");
    }
}

/// `ibv_fork_init` answers as libibverbs does under both profiles: 0 when called before any
/// memory is registered (by the program, or by the first device list when `RDMAV_FORK_SAFE`
/// is set) and ever after; `EINVAL` when memory was registered first (as on rxe, recorded).
#[test]
fn fork_init_is_refused_once_memory_was_registered_first() {
    let exe = common::c_test("fork_init");
    for profile in ["full", "rxe"] {
        for when in ["early", "late", "env"] {
            let mut cmd = Command::new(&exe);
            cmd.arg(when).env("RDMA_EMU_PROFILE", profile).env("RDMA_EMU_FABRIC", "none");
            if when == "env" {
                cmd.env("RDMAV_FORK_SAFE", "1");
            }
            let out = run_on_shim(&mut cmd);
            assert!(out.contains(&format!("fork_init {when} ok")), "{profile}: {out}");
        }
    }
}

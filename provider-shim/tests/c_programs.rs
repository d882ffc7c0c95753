//! C programs compiled against the system's <infiniband/verbs.h>, linked with -libverbs, and
//! run on the shim; and Debian's unmodified ibverbs-utils run on it (needs libibverbs-dev and
//! ibverbs-utils, which ci.sh installs).

mod common;
use std::{path::Path, process::Command};

/// Compiles `tests/c/<name>.c` and returns the executable's path.
fn build(name: &str) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
    let out_dir = common::profile_dir().join("c-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
    let cc = Command::new("cc")
        .args(["-std=gnu11", "-O1", "-Wall", "-Werror"])
        .arg(format!("-I{}", Path::new(env!("CARGO_MANIFEST_DIR")).join("include").display()))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "compiling {name}.c failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

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
    let exe = build(name);
    for profile in profiles {
        let out = run_on_shim(Command::new(&exe).env("RDMA_EMU_PROFILE", profile));
        assert!(out.contains(&format!("{name} ok")), "{profile}: {out}");
    }
}

#[test]
fn rc_basic_c_program_runs_on_the_shim() {
    c_program("rc_basic", &["full", "rxe"]);
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
        "max_qp:\t\t\t\t1048560",
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
/// addresses) may differ.
#[test]
fn rxe_profile_devinfo_matches_the_golden_rxe_output() {
    let golden_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/golden/rxe/ibv_devinfo-v.txt");
    let golden = std::fs::read_to_string(&golden_path).unwrap();
    let ours = run_on_shim(
        Command::new(util("ibv_devinfo"))
            .arg("-v")
            .env("RDMA_EMU_PROFILE", "rxe")
            .env("RDMA_EMU_DEVICES", "1"),
    );
    // The identity of a device is its own; the value after the key is not compared.
    const IDENTITY: [&str; 4] = ["hca_id:", "node_guid:", "sys_image_guid:", "GID["];
    let normalize = |l: &str| match IDENTITY.iter().find(|k| l.trim_start().starts_with(*k)) {
        Some(k) => format!("{}{k}", &l[..l.len() - l.trim_start().len()]),
        None => l.to_string(),
    };
    let expected: Vec<String> = golden.lines().map(normalize).collect();
    let got: Vec<String> = ours.lines().map(normalize).collect();
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
    let exe = build("pure_functions");
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
fn null_destroyed_and_foreign_handles_get_errnos() {
    c_program("bad_input", &["full"]);
}

#[test]
fn ud_datagrams_through_the_c_abi() {
    c_program("ud", &["full", "rxe"]);
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

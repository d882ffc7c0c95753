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

#[test]
fn bad_usage_exits_2_with_a_message() {
    for args in [
        &["run", "--profile", "mlx5", "--", "true"][..],
        &["run"],
        &["frobnicate"],
        &["run", "--devices"],
    ] {
        let out = rdma_emu().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("rdma-emu:"), "{args:?}");
    }
}

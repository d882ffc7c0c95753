//! The built library exports exactly the versioned symbols of rdma-core 44's libibverbs.so.1
//! (abi/ibverbs_exports.txt): every name, every version node; the only other exports are the
//! emulator's control functions in their own node, RDMA_EMU_1.0 (abi/rdma_emu_exports.txt), and
//! librdmacm's functions for librdmacm.so.1 in theirs, RDMA_EMU_CM_1.0.

mod common;
use std::process::Command;

fn dynamic_symbols() -> Vec<String> {
    common::defined_symbols(&common::cdylib())
}

#[test]
fn dynamic_symbol_table_is_exactly_rdma_core_44s() {
    let want = include_str!("../abi/ibverbs_exports.txt");
    let mut want: Vec<String> =
        want.lines().filter(|l| l.contains('@')).map(str::to_string).collect();
    want.sort();
    let (ours, got): (Vec<String>, Vec<String>) = dynamic_symbols()
        .into_iter()
        .filter(|s| !s.ends_with("@@RDMA_EMU_CM_1.0"))
        .partition(|s| s.ends_with("@@RDMA_EMU_1.0"));
    let missing: Vec<_> = want.iter().filter(|s| !got.contains(s)).collect();
    let extra: Vec<_> = got.iter().filter(|s| !want.contains(s)).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing: {missing:?}\nextra: {extra:?}");
    assert_eq!(got.len(), 180);
    let mut control: Vec<String> =
        include_str!("../abi/rdma_emu_exports.txt").lines().map(str::to_string).collect();
    control.sort();
    assert_eq!(ours, control, "the RDMA_EMU_1.0 node holds exactly the control functions");
    // librdmacm's functions, privately, for librdmacm.so.1's trampolines: one per export.
    let mut cm: Vec<String> = dynamic_symbols()
        .into_iter()
        .filter_map(|s| s.strip_suffix("@@RDMA_EMU_CM_1.0").map(str::to_string))
        .collect();
    cm.sort();
    let mut want: Vec<String> = include_str!("../abi/rdmacm_exports.txt")
        .lines()
        .filter(|l| l.contains("@@"))
        .map(|l| format!("rdma_emu_cm__{}", l.split_once("@@").unwrap().0))
        .collect();
    want.sort();
    assert_eq!(cm, want);
}

#[test]
fn soname_and_version_nodes() {
    let out =
        Command::new("readelf").args(["-d", "-V", "-W"]).arg(common::cdylib()).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Library soname: [libibverbs.so.1]"));
    // The version nodes are the export table's header lines (every line without an '@'
    // except the column title).
    let nodes = include_str!("../abi/ibverbs_exports.txt")
        .lines()
        .filter(|l| !l.contains('@') && *l != "Name");
    assert_eq!(nodes.clone().count(), 13, "IBVERBS_1.0 .. 1.14 (twelve) and IBVERBS_PRIVATE_34");
    for node in nodes.chain(["RDMA_EMU_1.0"]) {
        assert!(text.contains(&format!("Name: {node}\n")), "version node {node} missing");
    }
}

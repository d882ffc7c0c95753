//! docs/verbs.md lists every export once, and its "not implemented" rows are exactly the
//! exports the library still answers with a generated stub.

use std::collections::BTreeSet;

#[test]
fn verbs_table_matches_the_library() {
    // The exports table ends where the section on the emulator's own functions begins.
    let doc = include_str!("../../docs/verbs.md")
        .split("## The emulator's own control functions")
        .next()
        .unwrap();
    let stubs: BTreeSet<&str> =
        include_str!(concat!(env!("OUT_DIR"), "/stubs.txt")).lines().collect();
    let exports: BTreeSet<&str> = include_str!("../abi/ibverbs_exports.txt")
        .lines()
        .filter_map(|l| l.split('@').next().filter(|_| l.contains('@')))
        .collect();
    let mut seen = BTreeSet::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let mut cells = line.split('|').map(str::trim).filter(|c| !c.is_empty());
        let name = cells.next().unwrap().trim_matches('`');
        let status = cells.next().unwrap_or("");
        assert!(seen.insert(name), "{name} is listed twice");
        assert!(exports.contains(name), "{name} is not an export");
        let says_stub = status.starts_with("`EOPNOTSUPP`")
            || status.starts_with("no-op (provider")
            || status.starts_with("no-op (not");
        let is_data = status.starts_with("data object");
        if !is_data {
            assert_eq!(says_stub, stubs.contains(name), "{name}: table says {status:?}");
        }
    }
    assert_eq!(
        seen.len(),
        exports.len(),
        "missing: {:?}",
        exports.difference(&seen).collect::<Vec<_>>()
    );
}

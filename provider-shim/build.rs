//! Generates the export machinery of libibverbs.so.1 from `abi/ibverbs_exports.txt` (the export
//! table of rdma-core 44's library) and `abi/ibverbs_kinds.txt` (each export's return kind):
//!
//! * a version script with rdma-core's version nodes (IBVERBS_1.0 <- 1.1 <- ... <- 1.14, and
//!   IBVERBS_PRIVATE_34);
//! * for every export, a one-instruction trampoline (`jmp` to the implementation
//!   `rdma_emu_shim__<name>`, an ordinary mangled Rust function named through a `sym` operand)
//!   bound by `.symver` to `<name>@@<version>`, or `<name>@<version>` for the compatibility
//!   twins; the trampolines' own names stay local, so only versioned names are exported;
//! * a stub for every export the crate does not implement yet, failing the way rdma-core does
//!   for an unsupported verb (`EOPNOTSUPP`; NULL plus errno for pointer-returning verbs).
//!
//! An implementation is recognised by its name: `fn rdma_emu_shim__<name>` in `src/`.

use std::{collections::BTreeMap, collections::BTreeSet, env, fs, path::Path};

/// The default-version chain of rdma-core's libibverbs.map.in.
const CHAIN: [&str; 12] = [
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];

fn implemented(dir: &Path, out: &mut BTreeSet<String>) {
    for e in fs::read_dir(dir).expect("src dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            implemented(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let s = fs::read_to_string(&p).expect("source");
            // A definition is the name right after `fn` or `static` (calls elsewhere in the
            // file, before or after it, are not).
            let mut before = "";
            for part in s.split("rdma_emu_shim__") {
                let name: String =
                    part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let tail = before.trim_end();
                let defined = tail.ends_with("fn")
                    || tail.ends_with("static")
                    || tail.ends_with("static mut");
                if defined && !name.is_empty() {
                    out.insert(name);
                }
                before = part;
            }
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=abi/ibverbs_exports.txt");
    println!("cargo:rerun-if-changed=abi/ibverbs_kinds.txt");
    println!("cargo:rerun-if-changed=abi/rdma_emu_exports.txt");
    println!("cargo:rerun-if-changed=abi/rdmacm_exports.txt");
    println!("cargo:rerun-if-changed=src");
    // rdma-core's exports, then the emulator's own control functions in their private node.
    // librdmacm's functions, exported privately for librdmacm.so.1's trampolines.
    let rdmacm = fs::read_to_string("abi/rdmacm_exports.txt").expect("rdmacm export table");
    let rdmacm: Vec<(String, String)> = rdmacm
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("@@"))
        .map(|l| {
            let (export, kind) = l.split_once(' ').expect("name@@version kind");
            let name = export.split_once("@@").expect("name@@version").0;
            (format!("rdma_emu_cm__{name}"), kind.trim().to_string())
        })
        .collect();
    let private: String = rdmacm.iter().map(|(n, _)| format!("{n}@@RDMA_EMU_CM_1.0\n")).collect();
    let exports = fs::read_to_string("abi/ibverbs_exports.txt").expect("export table")
        + &fs::read_to_string("abi/rdma_emu_exports.txt").expect("control export table")
        + &private;
    let mut kinds: BTreeMap<String, String> = fs::read_to_string("abi/ibverbs_kinds.txt")
        .expect("kinds table")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            (it.next().unwrap().to_string(), it.next().unwrap().to_string())
        })
        .collect();
    kinds.extend(rdmacm);
    let mut done = BTreeSet::new();
    implemented(Path::new("src"), &mut done);

    let mut nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut asm = Vec::new();
    let mut names = BTreeSet::new();
    for line in exports.lines().filter(|l| l.contains('@')) {
        let (name, rest) = line.split_once('@').expect("name@version");
        let (default, version) = match rest.strip_prefix('@') {
            Some(v) => (true, v),
            None => (false, rest),
        };
        names.insert(name.to_string());
        nodes.entry(version.to_string()).or_default().push(name.to_string());
        let imp = format!("rdma_emu_shim__{name}");
        let alias = format!("{imp}__{}", version.replace('.', "_"));
        let at = if default { "@@" } else { "@" };
        let kind = kinds.get(name).map(String::as_str).unwrap_or("int");
        asm.push(if kind == "data" {
            // A one-byte data object (`verbs_allow_disassociate_destroy`), defined in place.
            format!(
                "core::arch::global_asm!(\".pushsection .data\", \".globl {alias}\", \".type {alias},@object\", \".size {alias},1\", \"{alias}:\", \".byte 0\", \".popsection\", \".symver {alias}, {name}{at}{version}\");"
            )
        } else {
            // A jump to the implementation, defined here so that the versioned name is always
            // bound to a symbol of this object, whichever codegen unit holds the function.
            format!(
                "core::arch::global_asm!(\".globl {alias}\", \".type {alias},@function\", \"{alias}:\", \"jmp {{0}}\", \".symver {alias}, {name}{at}{version}\", sym {imp});"
            )
        });
    }

    let mut code = String::from("// @generated by build.rs from abi/ibverbs_exports.txt\n");
    let mut stubs = String::new();
    for name in &names {
        if done.contains(name) {
            continue;
        }
        stubs.push_str(name);
        stubs.push('\n');
        let kind =
            kinds.get(name).map(String::as_str).unwrap_or_else(|| panic!("no kind for {name}"));
        let imp = format!("rdma_emu_shim__{name}");
        code.push_str(&match kind {
            "ptr" => format!(
                "/// `{name}`: not implemented; NULL with errno `EOPNOTSUPP`.\nextern \"C\" fn {imp}() -> *mut core::ffi::c_void {{ crate::boundary::set_errno(libc::EOPNOTSUPP); core::ptr::null_mut() }}\n"
            ),
            "int" => format!(
                "/// `{name}`: not implemented; returns `EOPNOTSUPP`.\nextern \"C\" fn {imp}() -> core::ffi::c_int {{ crate::boundary::set_errno(libc::EOPNOTSUPP); libc::EOPNOTSUPP }}\n"
            ),
            "void" => format!("/// `{name}`: not implemented; does nothing.\nextern \"C\" fn {imp}() {{}}\n"),
            // librdmacm's conventions: -1 (as int, or as ssize_t/off_t) with errno.
            "neg" => format!(
                "/// `{name}`: not implemented; -1 with errno `EOPNOTSUPP`.\nextern \"C\" fn {imp}() -> core::ffi::c_int {{ crate::boundary::set_errno(libc::EOPNOTSUPP); -1 }}\n"
            ),
            "negl" => format!(
                "/// `{name}`: not implemented; -1 with errno `EOPNOTSUPP`.\nextern \"C\" fn {imp}() -> isize {{ crate::boundary::set_errno(libc::EOPNOTSUPP); -1 }}\n"
            ),
            "port" => format!("/// `{name}`: not implemented; port 0.\nextern \"C\" fn {imp}() -> u16 {{ 0 }}\n"),
            "data" => String::new(),
            other => panic!("unknown kind {other} for {name}"),
        });
    }
    for a in &asm {
        code.push_str("#[cfg(not(test))]\n");
        code.push_str(a);
        code.push('\n');
    }

    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for v in CHAIN {
        let syms = nodes.get(v).cloned().unwrap_or_default();
        let body: String = syms.iter().map(|s| format!("    {s};\n")).collect();
        let local = if prev.is_none() { "  local: *;\n" } else { "" };
        map.push_str(&format!(
            "{v} {{\n  global:\n{body}{local}}}{};\n",
            prev.map(|p| format!(" {p}")).unwrap_or_default()
        ));
        prev = Some(v);
    }
    let private: String =
        nodes["IBVERBS_PRIVATE_34"].iter().map(|s| format!("    {s};\n")).collect();
    map.push_str(&format!("IBVERBS_PRIVATE_34 {{\n  global:\n{private}}};\n"));
    let control: String = nodes["RDMA_EMU_1.0"].iter().map(|s| format!("    {s};\n")).collect();
    map.push_str(&format!("RDMA_EMU_1.0 {{\n  global:\n{control}}};\n"));
    let cm: String = nodes["RDMA_EMU_CM_1.0"].iter().map(|s| format!("    {s};\n")).collect();
    map.push_str(&format!("RDMA_EMU_CM_1.0 {{\n  global:\n{cm}}};\n"));

    let out = env::var("OUT_DIR").expect("OUT_DIR");
    fs::write(Path::new(&out).join("exports.rs"), code).expect("write exports.rs");
    // The exports still answered by a generated stub (docs/verbs.md is checked against it).
    fs::write(Path::new(&out).join("stubs.txt"), stubs).expect("write stubs.txt");
    let map_path = Path::new(&out).join("libibverbs.map");
    fs::write(&map_path, map).expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map_path.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    shim_dir(Path::new(&out));
}

/// Leaves `<profile dir>/shim/` holding `libibverbs.so.1` and `librdmacm.so.1` as links to the
/// libraries cargo builds beside them (`../libibverbs.so`, `../librdmacm.so`), so that
/// `LD_LIBRARY_PATH=target/release/shim` works right after `cargo build --release`. The links
/// are relative and made before the libraries exist (this script runs before the link step);
/// the directory is the only thing written outside `OUT_DIR`, inside cargo's own target
/// directory, where `cargo clean` removes it.
fn shim_dir(out: &Path) {
    // OUT_DIR is <profile dir>/build/<package>-<hash>/out.
    let Some(profile) = out.ancestors().nth(3) else { return };
    let dir = profile.join("shim");
    if fs::create_dir_all(&dir).is_err() {
        return;
    }
    for (name, lib) in [("libibverbs.so.1", "libibverbs.so"), ("librdmacm.so.1", "librdmacm.so")] {
        let link = dir.join(name);
        let target = Path::new("..").join(lib);
        if fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            let _ = fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(&target, &link);
        }
    }
}

//! Locating the built `libibverbs.so.1` from an integration test, and what several tests
//! need around it: the symbols a library defines, a bounded wait for a program.
#![allow(dead_code)]

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

/// `target/<profile>/`: the test binary lives in `target/<profile>/deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf()
}

/// The cdylib as cargo builds it. `cargo test` does not rebuild a cdylib-only crate, so this
/// refuses a library older than the shim's or the emulator's sources (run `cargo build` first;
/// `./ci.sh test` does).
pub fn cdylib() -> PathBuf {
    let p = profile_dir().join("libibverbs.so");
    assert!(p.exists(), "{} was not built: run cargo build -p rdma-emu-shim first", p.display());
    let built = std::fs::metadata(&p).and_then(|m| m.modified()).expect("library mtime");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in [root.join("src"), root.join("../emu/src")] {
        if let Some(newer) = newest(&dir).filter(|(t, _)| *t > built) {
            panic!(
                "{} is older than {}: run cargo build -p rdma-emu-shim first",
                p.display(),
                newer.1.display()
            );
        }
    }
    p
}

fn newest(dir: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let cand = if p.is_dir() {
            newest(&p)
        } else {
            e.metadata().ok()?.modified().ok().map(|t| (t, p))
        };
        if let Some(c) = cand
            && best.as_ref().is_none_or(|b| c.0 > b.0)
        {
            best = Some(c);
        }
    }
    best
}

/// `target/<profile>/shim/`, for `LD_LIBRARY_PATH`: the build leaves it holding
/// `libibverbs.so.1` and `librdmacm.so.1`, links to the libraries beside it.
pub fn lib_dir() -> PathBuf {
    let dir = profile_dir().join("shim");
    for (name, lib) in [("libibverbs.so.1", cdylib()), ("librdmacm.so.1", rdmacm_lib())] {
        let linked = dir.join(name).canonicalize().ok();
        assert_eq!(linked, lib.canonicalize().ok(), "the build leaves {name} in {}", dir.display());
    }
    dir
}

/// A test program of `tests/` compiled by `cc` (a C or C++ compiler, or an MPI wrapper) into
/// the profile's `c-tests` folder as `exe`; its path. Compiled under a name of its own and
/// renamed into place at once: tests running in parallel (or another run of them) may be
/// running the program already, and must find it neither half-written nor missing. `package`
/// is the Debian package that provides the compiler or the libraries.
pub fn compile(
    cc: &str,
    flags: &[&str],
    source: &str,
    libs: &[&str],
    exe: &str,
    package: &str,
) -> PathBuf {
    static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_dir = profile_dir().join("c-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let (path, built) =
        (out_dir.join(exe), out_dir.join(format!("{exe}.{}.{n}", std::process::id())));
    let out = Command::new(cc)
        .args(flags)
        .arg(format!("-I{}", Path::new(env!("CARGO_MANIFEST_DIR")).join("include").display()))
        .arg("-o")
        .arg(&built)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(source))
        .args(libs)
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e}: install Debian's {package} (./ci.sh does)"));
    assert!(
        out.status.success(),
        "compiling {source} with {cc} failed (install Debian's {package}: ./ci.sh does):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&built, &path).unwrap();
    path
}

/// `tests/c/<name>.c` compiled against the system's verbs and CM headers (see [`compile`]).
pub fn c_test(name: &str) -> PathBuf {
    let flags = ["-std=gnu11", "-O1", "-Wall", "-Werror"];
    let libs = ["-lrdmacm", "-libverbs"];
    compile("cc", &flags, &format!("c/{name}.c"), &libs, name, "libibverbs-dev")
}

/// The connection manager's library as cargo builds it (`cargo build --workspace`).
pub fn rdmacm_lib() -> PathBuf {
    let p = profile_dir().join("librdmacm.so");
    assert!(p.exists(), "{} was not built: run cargo build --workspace first", p.display());
    p
}

/// The versioned names (`name@@VERSION`) a shared library defines, sorted.
pub fn defined_symbols(lib: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(lib)
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut syms: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (f.len() >= 8 && f[6] != "UND" && f[0].trim_end_matches(':').parse::<u32>().is_ok())
                .then(|| f[7].to_string())
        })
        .collect();
    syms.sort();
    syms
}

/// Waits for `child` to exit within `limit` (a guard against hangs, not a timing assertion);
/// whether it succeeded, and its combined output (`who` names it if it had to be killed,
/// with the stacks of its threads: see [`finish_or_dump`]).
pub fn finish(child: Child, limit: Duration, who: &str) -> (bool, String) {
    finish_or_dump(child, limit, who, &[])
}

/// [`finish`], and if `child` has to be killed, the stacks of the threads of `also` (its peers,
/// still running) as well as its own, taken before it is killed: a hang seen once in a CI run
/// is then explained by its log, not left to be reproduced.
pub fn finish_or_dump(
    mut child: Child,
    limit: Duration,
    who: &str,
    also: &[&Child],
) -> (bool, String) {
    let deadline = Instant::now() + limit;
    let mut stacks = String::new();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            for (name, pid) in
                std::iter::once((who, child.id())).chain(also.iter().map(|c| ("its peer", c.id())))
            {
                stacks += &format!("--- stacks of {name} (pid {pid}):\n{}", thread_stacks(pid));
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // (Bytes: a program may print some that are not UTF-8, as dapltest does. A stream not
    // piped, sent to a file, say, is not read here.)
    let mut bytes = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_end(&mut bytes).unwrap();
    }
    if let Some(mut err) = child.stderr.take() {
        err.read_to_end(&mut bytes).unwrap();
    }
    let out = String::from_utf8_lossy(&bytes).into_owned();
    match status {
        Some(s) => (s.success(), out),
        None => (false, format!("{who} did not finish within {limit:?}\n{out}\n{stacks}")),
    }
}

/// The backtraces of every thread of process `pid`, by gdb (`./ci.sh` installs it), or why
/// there are none.
pub fn thread_stacks(pid: u32) -> String {
    let out = Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set print thread-events off", "-ex", "thread apply all bt 40"])
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            // gdb's chatter about loading symbols says nothing about the hang, nor do the
            // frames of a thread's start, and a frame's generic arguments are long.
            let plumbing = ["std::thread::", "catch_unwind", "call_once", "short_backtrace"];
            text.lines()
                .filter(|l| l.starts_with("Thread ") || l.starts_with('#'))
                .filter(|l| !plumbing.iter().any(|p| l.contains(p)))
                .map(|l| format!("{}\n", l.chars().take(180).collect::<String>()))
                .collect()
        }
        Err(e) => format!("(gdb did not run: {e})\n"),
    }
}

/// A host fabric name used by one test only (`<prefix>-<pid>-<n>`), its directory removed
/// afterwards.
pub struct Fabric(pub String);

impl Fabric {
    pub fn new(prefix: &str) -> Fabric {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Fabric(format!("{prefix}-{}-{n}", std::process::id()))
    }

    pub fn dir(&self) -> PathBuf {
        rdma_emu::fabric_dir(&self.0)
    }

    /// Waits until a process of this fabric listens through the connection manager, in the
    /// port space `ps` (hex, as `106` for RDMA_PS_TCP) on `port`, each `None` for any: the
    /// port's file in the fabric's directory (`cm-<ps>-<port>`) says `listen`.
    pub fn wait_cm_listener(&self, ps: Option<&str>, port: Option<u16>) {
        let dir = self.dir();
        let port = port.map(|p| p.to_string());
        let held = || {
            let names = std::fs::read_dir(&dir).into_iter().flatten().flatten();
            names.filter_map(|e| e.file_name().into_string().ok()).any(|n| {
                let ours =
                    n.strip_prefix("cm-").and_then(|r| r.split_once('-')).is_some_and(|(s, p)| {
                        ps.is_none_or(|ps| s == ps) && port.as_ref().is_none_or(|q| p == q)
                    });
                ours && std::fs::read_to_string(dir.join(&n)).is_ok_and(|t| t.contains("listen"))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !held() {
            assert!(Instant::now() < deadline, "nobody listened ({ps:?}, {port:?})");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.dir());
    }
}

/// Debian's `/usr/bin/<prog>` (or `prog`, a path) under `rdma-emu run` on the host fabric
/// `fabric` with `profile`, its output captured; `package` names what to install when it is
/// missing.
pub fn debian_program(
    fabric: &Fabric,
    profile: &str,
    prog: &str,
    args: &[&str],
    package: &str,
) -> Command {
    let path = match prog.starts_with('/') {
        true => prog.to_owned(),
        false => format!("/usr/bin/{prog}"),
    };
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: install Debian's {package} (./ci.sh does)"
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdma-emu"));
    c.env("RDMA_EMU_LIB", cdylib()).env_remove("LD_LIBRARY_PATH");
    c.args(["run", "--profile", profile, "--fabric", &fabric.0, "--", &path]).args(args);
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    c
}

/// The data rows of perftest's result table (lines that start with a message size).
pub fn result_rows(out: &str) -> usize {
    out.lines()
        .filter(|l| {
            let mut w = l.split_whitespace();
            w.next().is_some_and(|a| a.parse::<u64>().is_ok())
                && w.next().is_some_and(|b| b.parse::<u64>().is_ok())
        })
        .count()
}

/// Whether an rping side did its work: it succeeded, or its only failure is the end-of-run
/// race of Debian's rping (rdma-core 44), whose CM thread is never stopped: the main thread
/// destroys the event channel once it is done, and if the DISCONNECTED event came just before
/// (the server's on the client's DREQ, the client's on the server's DREP), the CM thread gets
/// back to rdma_get_cm_event only after that and the call fails (EINVAL here, EBADF with
/// librdmacm, whose channel's descriptor is closed): the thread exits(-1). Under load that
/// happens now and then, on either side. (The client's stderr ends its output.)
fn rping_done(ok: bool, out: &str, server: bool) -> bool {
    let before = match server {
        true => "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n",
        false => "client DISCONNECT EVENT...\n",
    };
    ok || out
        .trim_end()
        .strip_suffix("rdma_get_cm_event: Invalid argument")
        .is_some_and(|o| o.ends_with(before))
}

/// Whether an rping client and its server each did their work (see [`rping_done`]), from
/// whether each succeeded and its output.
pub fn rping_pair_done((c_ok, c_out): (bool, &str), (s_ok, s_out): (bool, &str)) -> bool {
    rping_done(c_ok, c_out, false) && rping_done(s_ok, s_out, true)
}

/// A child process killed if the test ends (a failed assertion too) before it took it back.
pub struct Killed(pub Option<Child>);

impl Killed {
    pub fn take(mut self) -> Child {
        self.0.take().expect("not taken yet")
    }

    pub fn exited(&mut self) -> bool {
        self.0.as_mut().is_some_and(|c| c.try_wait().unwrap().is_some())
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

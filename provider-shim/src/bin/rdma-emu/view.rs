//! The program's view of the machine under `rdma-emu run`: where programs look for RDMA
//! devices besides the verbs (UCX checks `/dev/infiniband/uverbsN`, UCX and Open MPI read
//! `/sys/class/infiniband`), the emulated devices are there.
//!
//! The program runs in a mount namespace of its own (inside a user namespace of its own when
//! not root, its user and group ids mapped to themselves), so that nothing changes outside its
//! view: `/sys/class` and `/dev` are each covered by a tmpfs holding the same entries (bound
//! from the originals) plus `infiniband` and `infiniband_verbs` (bound from the tree the
//! emulator library writes, `$RDMA_EMU_SYSFS`) and `infiniband/uverbsN` (character devices
//! that read and write: `/dev/null` bound there). Where namespaces are not allowed (a
//! container without them), the program runs without that view, and `ibv_get_sysfs_path()`
//! still names the tree.

use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

/// Makes `tree` (the directory the library fills) and mounts the view over `/sys/class` and
/// `/dev` with `devices` uverbs nodes. `Ok(false)` when namespaces are not available here.
pub(crate) fn enter(tree: &Path, devices: u32) -> io::Result<bool> {
    for d in ["class/infiniband", "class/infiniband_verbs"] {
        std::fs::create_dir_all(tree.join(d))?;
    }
    if !unshare_mounts()? {
        return Ok(false);
    }
    // Nothing mounted from here on reaches the parent namespace.
    mount(None::<&Path>, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE)?;
    let class = tree.join("class");
    cover(
        Path::new("/sys/class"),
        &tree.join("stage-class"),
        &[
            ("infiniband", Extra::Dir(class.join("infiniband"))),
            ("infiniband_verbs", Extra::Dir(class.join("infiniband_verbs"))),
        ],
    )?;
    let nodes: Vec<String> = (0..devices).map(|i| format!("uverbs{i}")).collect();
    cover(Path::new("/dev"), &tree.join("stage-dev"), &[("infiniband", Extra::Nodes(&nodes))])?;
    Ok(true)
}

/// What a covering adds to the original entries.
enum Extra<'a> {
    /// A directory bound from elsewhere.
    Dir(PathBuf),
    /// A directory of character devices that read and write (`/dev/null` bound on each).
    Nodes(&'a [String]),
}

/// Enters new mount (and, unless root, user) namespaces; `false` if this machine refuses.
fn unshare_mounts() -> io::Result<bool> {
    // SAFETY: getuid/getgid take no arguments and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let flags = if uid == 0 { libc::CLONE_NEWNS } else { libc::CLONE_NEWUSER | libc::CLONE_NEWNS };
    // SAFETY: unshare takes flags only; this process is single-threaded here.
    if unsafe { libc::unshare(flags) } != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EPERM | libc::EINVAL | libc::ENOSPC | libc::EUSERS) => Ok(false),
            _ => Err(e),
        };
    }
    if uid != 0 {
        // The program keeps its own ids; it gains nothing outside the namespace.
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    Ok(true)
}

/// Covers `target` with a tmpfs (made at `stage`, then moved there) holding each of its
/// entries (directories and files bound from the originals, links copied) and `extras`.
fn cover(target: &Path, stage: &Path, extras: &[(&str, Extra<'_>)]) -> io::Result<()> {
    std::fs::create_dir_all(stage)?;
    mount(Some("tmpfs"), stage, Some("tmpfs"), 0)?;
    std::fs::set_permissions(stage, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    for entry in std::fs::read_dir(target)? {
        let entry = entry?;
        let (name, from) = (entry.file_name(), entry.path());
        let to = stage.join(&name);
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            continue;
        }
        if kind.is_dir() {
            std::fs::create_dir(&to)?;
        } else {
            std::fs::File::create(&to)?;
        }
        // An entry that cannot be bound (one the kernel hides) is left out of the view.
        if mount(Some(&from), &to, None, libc::MS_BIND | libc::MS_REC).is_err() {
            let _ =
                if kind.is_dir() { std::fs::remove_dir(&to) } else { std::fs::remove_file(&to) };
        }
    }
    for (name, extra) in extras {
        let to = stage.join(name);
        std::fs::create_dir_all(&to)?;
        match extra {
            Extra::Dir(from) => mount(Some(from), &to, None, libc::MS_BIND)?,
            Extra::Nodes(nodes) => {
                for n in *nodes {
                    std::fs::File::create(to.join(n))?;
                    mount(Some(Path::new("/dev/null")), &to.join(n), None, libc::MS_BIND)?;
                }
            }
        }
    }
    mount(Some(stage), target, None, libc::MS_MOVE)
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

/// mount(2), with `source` a path (or a file system's name) and `fstype` when one is made.
fn mount(
    source: Option<&(impl AsRef<Path> + ?Sized)>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> io::Result<()> {
    let src = source.map(|s| cstr(s.as_ref())).transpose()?;
    let fs = fstype.map(|f| CString::new(f).expect("no NUL"));
    let tgt = cstr(target)?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: NUL-terminated strings (or NULL) alive for the call; no data argument.
    let rc = unsafe { libc::mount(ptr(&src), tgt.as_ptr(), ptr(&fs), flags, std::ptr::null()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

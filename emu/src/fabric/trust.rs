//! Who may join a host fabric: the directory it lives in, and the processes a node takes
//! messages from.
//!
//! A process on the host fabric lets its peers write into its rings, hand it shared memory
//! and make it read their memory, so a peer must be what this process would trust anyway: a
//! process of the same user, which could attach to it with ptrace. Two locks keep others out.
//!
//! - **The directory.** Every directory on the way to the fabric's (`/tmp`,
//!   `rdma-emu-<uid>`, the fabric's own) is opened one component at a time without following
//!   symbolic links, and must belong to root or to this user and be writable by nobody else
//!   unless it is sticky (as `/tmp` is: others may then add entries but not rename or remove
//!   ours); the fabric's directory must be this user's and writable only by them. A
//!   directory that another user created first, or a symbolic link in the way, is refused.
//!   From then on, every file of the fabric is reached through the directory's descriptor, so
//!   a rename of a parent afterwards does not redirect us. A program that `rdma-emu run` put
//!   in a user namespace of its own (a user other than root: only their own id is mapped
//!   there) sees root's directories as the overflow id, as it would any other user's; for
//!   those, the launcher vouches ([`ROOT_DIRS_VAR`]).
//! - **The peers.** A node's socket asks the kernel for each sender's credentials
//!   (`SO_PASSCRED`); a datagram from another user is dropped and counted, whatever it says.
//!   The process id that comes with a ring names the only process a payload of that ring may
//!   be read from (see [`PeerProcess`](crate::mem::PeerProcess)).

use std::{
    ffi::{CString, OsStr},
    fs::File,
    io,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
    time::{Duration, SystemTime},
};

use crate::sys;

/// A host fabric's directory, held open: every file in it is reached through this descriptor.
#[derive(Debug)]
pub(crate) struct FabricDir {
    fd: OwnedFd,
    /// Its path as given, for messages.
    shown: PathBuf,
    /// How to name an entry by path (sockets have no `*at` calls): through this process's
    /// `/proc/self/fd/N`, which resolves to the directory we hold; the checked path where
    /// `/proc` is not mounted.
    via: PathBuf,
}

/// Where a host fabric lives: a base directory that the user or the system chose, whose
/// symbolic links are followed, and the directories under it that belong to the fabric (each
/// opened without following a link), created as needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    base: PathBuf,
    under: Vec<String>,
}

impl Location {
    /// The fabric called `name`: an absolute path as given (its last component the fabric's
    /// own), else `$RDMA_EMU_RUNTIME_DIR`, `$XDG_RUNTIME_DIR` or [`default_base`], then
    /// `rdma-emu-<uid>/<name>`.
    pub(crate) fn of(name: &str) -> Location {
        let path = Path::new(name);
        if path.is_absolute() {
            let base = path.parent().unwrap_or(Path::new("/")).to_owned();
            let under = path.file_name().map(|n| n.to_string_lossy().into_owned());
            return Location { base, under: under.into_iter().collect() };
        }
        let base = ["RDMA_EMU_RUNTIME_DIR", "XDG_RUNTIME_DIR"]
            .iter()
            .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
            .map_or_else(default_base, PathBuf::from);
        let mut under = vec![format!("rdma-emu-{}", sys::uid())];
        under.extend(name.split('/').filter(|c| !c.is_empty()).map(str::to_owned));
        Location { base, under }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.under.iter().fold(self.base.clone(), |p, c| p.join(c))
    }
}

/// The base directory when the environment names none: `/dev/shm` where this process may make
/// directories there, else `/tmp`. A fabric's directory sees a file made and removed for each
/// port a connection binds: on a disk's file system (ext4, where `/tmp` often is) making one
/// cost 100-500 us (`cmtime -c 1000`, two processes: 0.68-0.74 s in `/tmp`, 0.35-0.38 s in
/// `/dev/shm`), on tmpfs a few. Every process of a user asks the same question, so all find
/// the same place.
fn default_base() -> PathBuf {
    let usable = Path::new("/dev/shm").is_dir() && sys::may_make_entries_in(c"/dev/shm");
    PathBuf::from(if usable { "/dev/shm" } else { "/tmp" })
}

impl FabricDir {
    /// Opens the fabric's directory, creating what is missing of it (mode 0700), after
    /// checking every directory on the way (see the module documentation).
    pub(crate) fn open(loc: &Location) -> io::Result<FabricDir> {
        let me = sys::uid();
        let base = std::path::absolute(&loc.base)?;
        let (exists, missing) = split_existing(&base);
        // Links in the part of the base that exists are resolved once, here; the walk below
        // opens each component of the result without following links, so a link put in the
        // way later, or one that led into a directory others control, is refused.
        let canon = std::fs::canonicalize(&exists)?;
        let created = missing.len() + loc.under.len();
        let names: Vec<&OsStr> = canon
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .chain(missing)
            .chain(loc.under.iter().map(OsStr::new))
            .collect();
        let mut fd = sys::open_dir_at(None, c"/")?;
        check(&fd, Path::new("/"), me, Rule::OnTheWay)?;
        let mut at = PathBuf::from("/");
        for (i, name) in names.iter().enumerate() {
            let c = CString::new(name.as_bytes())?;
            at.push(name);
            if i >= names.len() - created {
                sys::mkdir_at(fd.as_raw_fd(), &c)?;
            }
            fd = sys::open_dir_at(Some(fd.as_raw_fd()), &c).map_err(|e| {
                if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
                    refused(&at, "it is a symbolic link or not a directory".into())
                } else {
                    e
                }
            })?;
            let rule = if i + 1 == names.len() { Rule::Fabric } else { Rule::OnTheWay };
            check(&fd, &at, me, rule)?;
        }
        let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let via = if via.is_dir() { via } else { at };
        Ok(FabricDir { fd, shown: loc.path(), via })
    }

    /// The path it was opened by.
    pub(crate) fn shown(&self) -> &Path {
        &self.shown
    }

    /// A path naming the entry `name` of this very directory, for calls that take only paths.
    pub(crate) fn entry(&self, name: &str) -> PathBuf {
        self.via.join(name)
    }

    /// Opens (creating it if `create`) the regular file `name` here.
    pub(crate) fn open_file(&self, name: &str, create: bool) -> io::Result<File> {
        sys::open_file_at(self.fd.as_raw_fd(), &CString::new(name)?, create)
    }

    /// Makes `bytes` the whole of the file `name` (mode 0600) at once: written aside, then
    /// renamed over it, so a reader sees the old contents or the new, never a part.
    pub(crate) fn write_file(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let aside = self.write_aside(name, bytes)?;
        std::fs::rename(self.entry(&aside), self.entry(name)).inspect_err(|_| {
            let _ = self.remove(&aside);
        })
    }

    /// Makes `bytes` the file `name` (mode 0600) only if there is no such file yet: written
    /// aside, then linked in place, which fails if the name exists (one of several processes
    /// creating it at once wins); whether it was created.
    pub(crate) fn create_file(&self, name: &str, bytes: &[u8]) -> io::Result<bool> {
        let aside = self.write_aside(name, bytes)?;
        let linked = std::fs::hard_link(self.entry(&aside), self.entry(name));
        let _ = self.remove(&aside);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `bytes` to a file of this thread's own beside `name`, to be moved in place;
    /// its name.
    fn write_aside(&self, name: &str, bytes: &[u8]) -> io::Result<String> {
        use std::io::Write;
        let aside = format!(".{name}.{}.{:?}", std::process::id(), std::thread::current().id());
        let mut f = self.open_file(&aside, true)?;
        f.set_len(0)?;
        f.write_all(bytes)?;
        Ok(aside)
    }

    /// The contents of the file `name` (at most a page).
    pub(crate) fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut v = Vec::new();
        self.open_file(name, false)?.take(4096).read_to_end(&mut v)?;
        Ok(v)
    }

    /// Removes the entry `name`, if it is there.
    pub(crate) fn remove(&self, name: &str) -> io::Result<()> {
        sys::unlink_at(self.fd.as_raw_fd(), &CString::new(name)?)
    }

    /// The names of its entries.
    pub(crate) fn names(&self) -> io::Result<Vec<String>> {
        let entries = std::fs::read_dir(&self.via)?;
        Ok(entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
    }

    /// When an entry was last added or removed.
    pub(crate) fn mtime(&self) -> io::Result<SystemTime> {
        let (s, ns) = sys::fstat(self.fd.as_raw_fd())?.mtime;
        let since = Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
        Ok(SystemTime::UNIX_EPOCH + since)
    }
}

/// What a directory must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// A directory on the way: root's or ours, and writable by nobody else unless sticky.
    OnTheWay,
    /// The fabric's own: ours, and writable by nobody else.
    Fabric,
}

fn check(fd: &OwnedFd, path: &Path, me: u32, rule: Rule) -> io::Result<()> {
    let st = sys::fstat(fd.as_raw_fd())?;
    let others_write = st.mode & 0o022 != 0;
    let sticky = st.mode & libc::S_ISVTX != 0;
    let root = st.uid == 0 || vouched(st.dev, st.ino, st.uid);
    let owner_ok = st.uid == me || (rule == Rule::OnTheWay && root);
    if !owner_ok {
        let whose = if rule == Rule::Fabric { "this user" } else { "root or this user" };
        return Err(refused(
            path,
            format!("it belongs to uid {}, not to {whose} (uid {me})", st.uid),
        ));
    }
    if others_write && (rule == Rule::Fabric || !sticky) {
        let why = "other users may write to it (it must not be group- or world-writable)";
        return Err(refused(path, why.into()));
    }
    Ok(())
}

/// The variable in which `rdma-emu run`, before it enters a user namespace for the program it
/// runs, names the directories on the way to the host fabric that belong to root, as
/// `dev:ino` pairs (comma-separated), as it saw them outside. Inside, where only the user's
/// own id is mapped, root's directories show as the overflow id, as any other user's would,
/// and the walk could not tell `/` or `/tmp` from a directory another user controls. The
/// pairs stay true: another user can neither remove a directory of root's (so that its
/// number names a directory of theirs) nor change its owner.
pub const ROOT_DIRS_VAR: &str = "RDMA_EMU_ROOT_DIRS";

/// Whether the directory `dev:ino`, owned by `uid` as this process sees it, shows the
/// overflow id and is one [`ROOT_DIRS_VAR`] says is root's.
fn vouched(dev: u64, ino: u64, uid: u32) -> bool {
    let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65534);
    let me = format!("{dev}:{ino}");
    uid == overflow
        && std::env::var(ROOT_DIRS_VAR).is_ok_and(|v| v.split(',').any(|pair| pair == me))
}

/// The directories on the way to `loc` that exist and belong to root, as [`ROOT_DIRS_VAR`]
/// lists them: those this process sees as root's, and, inside a user namespace already (an
/// `rdma-emu run` under another), those its own launcher vouched for.
pub(crate) fn root_dirs(loc: &Location) -> io::Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let base = std::path::absolute(&loc.base)?;
    let canon = std::fs::canonicalize(split_existing(&base).0)?;
    let mut pairs = Vec::new();
    for dir in canon.ancestors() {
        let m = std::fs::symlink_metadata(dir)?;
        if m.is_dir() && (m.uid() == 0 || vouched(m.dev(), m.ino(), m.uid())) {
            pairs.push(format!("{}:{}", m.dev(), m.ino()));
        }
    }
    Ok(pairs)
}

fn refused(path: &Path, why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{} is refused: {why}", path.display()))
}

/// The longest prefix of `abs` that exists, and the names after it.
fn split_existing(abs: &Path) -> (PathBuf, Vec<&OsStr>) {
    let mut missing = Vec::new();
    let mut p = abs;
    while std::fs::symlink_metadata(p).is_err() {
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                p = parent;
            }
            _ => break,
        }
    }
    missing.reverse();
    (p.to_owned(), missing)
}

#[cfg(test)]
mod test {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-emu-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn open(p: &Path) -> io::Result<FabricDir> {
        FabricDir::open(&Location::of(p.to_str().unwrap()))
    }

    fn mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn test_a_name_lives_under_the_users_directory_and_an_absolute_path_as_given() {
        let loc = Location::of("/x/y");
        assert_eq!((loc.base.as_path(), &loc.under[..]), (Path::new("/x"), &["y".to_string()][..]));
        let loc = Location::of("blue");
        assert_eq!(loc.under, [format!("rdma-emu-{}", sys::uid()), "blue".into()]);
    }

    /// With neither variable set, fabrics live in tmpfs where the machine has `/dev/shm` (as
    /// Linux machines do), and a fabric can be made there.
    #[test]
    fn test_the_default_base_is_dev_shm_where_a_fabric_can_be_made_there() {
        let base = default_base();
        let shm_usable = std::fs::metadata("/dev/shm").is_ok_and(|m| m.is_dir())
            && tempfile_in(Path::new("/dev/shm"));
        assert_eq!(base, Path::new(if shm_usable { "/dev/shm" } else { "/tmp" }));
        assert!(tempfile_in(&base), "a directory this process may make entries in");
    }

    /// Whether a file can be made (and is removed) in `dir`.
    fn tempfile_in(dir: &Path) -> bool {
        let p = dir.join(format!("rdma-emu-trust-probe-{}", std::process::id()));
        let made = std::fs::write(&p, b"").is_ok();
        let _ = std::fs::remove_file(&p);
        made
    }

    #[test]
    fn test_a_missing_chain_is_created_private_and_entries_are_reached_through_it() {
        let top = scratch("create");
        let d = open(&top.join("a/b")).unwrap();
        let meta = std::fs::metadata(top.join("a/b")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        d.open_file("1.lock", true).unwrap();
        assert!(top.join("a/b/1.lock").exists());
        assert_eq!(d.names().unwrap(), vec!["1.lock".to_string()]);
        // Renaming a parent away does not redirect the held directory.
        std::fs::rename(top.join("a"), top.join("moved")).unwrap();
        d.open_file("2.lock", true).unwrap();
        assert!(top.join("moved/b/2.lock").exists());
        d.remove("2.lock").unwrap();
        d.remove("2.lock").unwrap();
        std::fs::remove_dir_all(&top).unwrap();
    }

    #[test]
    fn test_roots_directories_on_the_way_are_named_by_device_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let pair = |p: &str| {
            let m = std::fs::metadata(p).unwrap();
            format!("{}:{}", m.dev(), m.ino())
        };
        // The part of the way that exists (`/tmp`, `/`), not what is missing beyond.
        let named = root_dirs(&Location::of("/tmp/rdma-emu-no-such-dir/fab")).unwrap();
        assert_eq!(named, [pair("/tmp"), pair("/")], "root's /tmp and /, nearest first");
    }

    #[test]
    fn test_writable_by_others_or_a_link_in_the_way_is_refused() {
        let top = scratch("refuse");
        open(&top.join("f")).unwrap();
        mode(&top.join("f"), 0o777);
        let e = open(&top.join("f")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // On the way, world-writable is fine only when sticky (as /tmp).
        assert!(open(&top.join("f/g")).is_err());
        mode(&top.join("f"), 0o1777);
        open(&top.join("f/g")).unwrap();
        // A link in place of the fabric's own directory is refused; a link in the base the
        // user named is followed.
        std::fs::create_dir(top.join("real")).unwrap();
        std::os::unix::fs::symlink(top.join("real"), top.join("link")).unwrap();
        let e = open(&top.join("link")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        open(&top.join("link/x")).unwrap();
        assert!(top.join("real/x").is_dir());
        std::fs::remove_dir_all(&top).unwrap();
    }
}

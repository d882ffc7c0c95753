//! Errors as a C caller of libibverbs would see them.
//!
//! Every fallible verb returns [`Error`], which always carries the errno that rdma-core's
//! providers return for the same failure (`EINVAL`, `ENOMEM`, `EBUSY`, ...) plus a short static
//! reason that names what was wrong, so both a C shim and a Rust user get something precise.

use std::fmt;

/// An errno value. Open on purpose: any value the kernel or a provider could return fits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EADDRINUSE: Errno = Errno(libc::EADDRINUSE);
    pub const EADDRNOTAVAIL: Errno = Errno(libc::EADDRNOTAVAIL);
    pub const EHOSTUNREACH: Errno = Errno(libc::EHOSTUNREACH);
    pub const EBADF: Errno = Errno(libc::EBADF);

    /// The raw (positive) value.
    pub fn raw(self) -> i32 {
        self.0
    }

    fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::EIO => "EIO",
            libc::EAGAIN => "EAGAIN",
            libc::ENOMEM => "ENOMEM",
            libc::EACCES => "EACCES",
            libc::EFAULT => "EFAULT",
            libc::EBUSY => "EBUSY",
            libc::EADDRINUSE => "EADDRINUSE",
            libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
            libc::EEXIST => "EEXIST",
            libc::ENODEV => "ENODEV",
            libc::EINVAL => "EINVAL",
            libc::ENOSPC => "ENOSPC",
            libc::ENOSYS => "ENOSYS",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            libc::ETIMEDOUT => "ETIMEDOUT",
            libc::ENODATA => "ENODATA",
            libc::EHOSTUNREACH => "EHOSTUNREACH",
            libc::EBADF => "EBADF",
            _ => return None,
        })
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A failed verb: the errno a C caller would get, and why.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error {
    errno: Errno,
    reason: &'static str,
}

impl Error {
    /// A registration refused because it would lock more memory than `RLIMIT_MEMLOCK` allows,
    /// as the kernel refuses it to a process without `CAP_IPC_LOCK` (`ENOMEM`).
    pub const MEMLOCK: Error = Error::new(
        Errno::ENOMEM,
        "registration past RLIMIT_MEMLOCK (the process lacks CAP_IPC_LOCK): raise `ulimit -l`, \
         or set RDMA_EMU_MEMLOCK=off",
    );

    /// A raw packet QP or a flow steering rule asked for by a process without `CAP_NET_RAW`,
    /// which the kernel's verbs refuse (`EPERM`).
    pub const NET_RAW: Error = Error::new(
        Errno::EPERM,
        "raw packet QPs and flow rules take CAP_NET_RAW, as in the kernel: run with it, or set \
         RDMA_EMU_NET_RAW=anyone",
    );

    /// An error with `errno` and a static explanation.
    pub const fn new(errno: Errno, reason: &'static str) -> Error {
        Error { errno, reason }
    }

    /// The errno rdma-core would report for this failure.
    pub fn errno(&self) -> Errno {
        self.errno
    }

    /// What was wrong, in a few words.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// For a person, a line on what happened and how to let it, for the errors a program
    /// reports by their errno alone, which misleads ([`MEMLOCK`](Self::MEMLOCK), with the
    /// limit in force, and [`NET_RAW`](Self::NET_RAW)); `None` for the others.
    pub fn hint(&self) -> Option<String> {
        if *self == Error::MEMLOCK {
            let limit = crate::sys::memlock_limit()
                .map_or_else(|| "unlimited".to_string(), |bytes| format!("{} KiB", bytes / 1024));
            Some(format!(
                "a memory registration was refused (ENOMEM): it would lock more than \
                 RLIMIT_MEMLOCK ({limit}) allows, as the kernel refuses a process without \
                 CAP_IPC_LOCK; raise `ulimit -l`, or set RDMA_EMU_MEMLOCK=off"
            ))
        } else if *self == Error::NET_RAW {
            Some(
                "a raw packet QP or flow rule was refused (EPERM): the kernel's verbs ask for \
                 CAP_NET_RAW; run with it, or set RDMA_EMU_NET_RAW=anyone"
                    .to_string(),
            )
        } else {
            None
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.errno, self.reason)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.reason, self.errno)
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::from_raw_os_error(e.errno.0)
    }
}

/// A configuration that cannot be used (a malformed fault rule, `RDMA_EMU_SEED` that is not
/// a number), with what is wrong in it. As a verb error it is `EINVAL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for Error {
    fn from(_: ConfigError) -> Error {
        Error::new(Errno::EINVAL, "malformed configuration (fault rules or seed)")
    }
}

/// Result of a verb.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand constructors used throughout the crate.
pub(crate) fn einval(reason: &'static str) -> Error {
    Error::new(Errno::EINVAL, reason)
}
pub(crate) fn ebusy(reason: &'static str) -> Error {
    Error::new(Errno::EBUSY, reason)
}

//! Locating the built `libibverbs.so.1` from an integration test.
#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>/`: the test binary lives in `target/<profile>/deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf()
}

/// The cdylib as cargo builds it.
pub fn cdylib() -> PathBuf {
    let p = profile_dir().join("libibverbs.so");
    assert!(p.exists(), "{} was not built", p.display());
    p
}

/// A directory holding `libibverbs.so.1` (a link to the cdylib), for `LD_LIBRARY_PATH`.
pub fn lib_dir() -> PathBuf {
    let dir = profile_dir().join("shim");
    std::fs::create_dir_all(&dir).expect("create the shim directory");
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(cdylib(), &link).expect("link libibverbs.so.1");
    dir
}

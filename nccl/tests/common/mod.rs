//! What the library's tests share: where the built library is.

use std::path::PathBuf;

/// This crate's cdylib, built beside the test binary.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("libpeerlink_nccl.so"),
        deps.parent().unwrap().join("libpeerlink_nccl.so"),
    ]
    .into_iter()
    .find(|path| path.is_file())
    .expect("libpeerlink_nccl.so is built with the tests")
}

//! Helpers shared by the CLI tests.

// Each test binary compiles this module and uses only its own part of it.
#![allow(dead_code)]

use assert_cmd::Command;
use serde_json::Value;

/// The peerlink binary under test.
pub fn peerlink() -> Command {
    Command::cargo_bin("peerlink").unwrap()
}

/// Runs peerlink with `args`, expecting success, and parses stdout as exactly one JSON document.
#[allow(dead_code)] // each test binary compiles this module; the golden test does not use it
pub fn json_of(args: &[&str]) -> Value {
    let out = peerlink().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is exactly one JSON document")
}

/// Runs `command`, expecting success (else fails with its stderr): what it printed.
pub fn succeeds(command: &mut Command) -> std::process::Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

//! The command line under hostile conditions: readers that go away, bad inputs (issue 13's catalog
//! grows here).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// `peerlink … | head -1`: the reader closes the pipe after one line while peerlink still has far
/// more than a pipe's buffer (64 KiB) to write. peerlink must end quietly, not panic (exit 101).
#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(["--sim", "dgx-h100", "bench", "--tests", "ce-write"])
        .args(["--sizes", "4B..1MiB", "--csv"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("peerlink starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut first)
        .expect("one line arrives");
    assert!(first.starts_with("kind,test,"), "{first}");
    // The reader is gone now (dropped above); peerlink meets a closed pipe on its next write.
    let out = child.wait_with_output().expect("peerlink ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

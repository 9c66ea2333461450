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

/// A `bench --json` document made `pct` percent faster: every bandwidth times 1 + pct/100, every
/// time times 1 − pct/100, in its cells, matrices and per-GPU values alike (what
/// `scripts/faster-baseline.py` does on the GPU host). A healthy host checked against it fails.
pub fn made_faster(doc: &mut Value, pct: f64) {
    for test in doc["tests"].as_array_mut().expect("a bench document") {
        let factor = if test["unit"] == "GB/s" {
            1.0 + pct / 100.0
        } else {
            1.0 - pct / 100.0
        };
        let scale = |v: &mut Value| {
            if let Some(x) = v.as_f64() {
                *v = (x * factor).into();
            }
        };
        // get_mut, not indexing: indexing a missing key mutably would add it as null.
        for cell in test["cells"].as_array_mut().into_iter().flatten() {
            for key in ["value", "total"] {
                if let Some(v) = cell.get_mut(key) {
                    scale(v);
                }
            }
        }
        for key in ["matrix", "total_matrix"] {
            let rows = test.get_mut(key).and_then(Value::as_array_mut);
            for row in rows.into_iter().flatten() {
                row.as_array_mut().into_iter().flatten().for_each(scale);
            }
        }
        let values = test.get_mut("values").and_then(Value::as_array_mut);
        values.into_iter().flatten().for_each(scale);
    }
}

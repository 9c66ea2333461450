//! Runs too large for memory are refused before they start (issue 13, point 1): exit 2 and one
//! sentence saying what is needed and what is free, never an abort. On the simulator the limit is
//! the host's memory, which holds every simulated GPU's; on a GPU it is the GPU's free memory.

use peerlink::backend::host_memory;
use peerlink::backend::sim::Preset;
use std::process::Command;

/// Runs peerlink and returns its exit code and its whole stderr.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .output()
        .expect("peerlink runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn assert_refused(args: &[&str], says: &[&str]) {
    let (code, stderr) = run(args);
    assert_eq!(code, Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
    for part in says {
        assert!(stderr.contains(part), "{args:?}: no `{part}` in: {stderr}");
    }
}

/// More than a simulated GPU of the stock presets holds: refused against the GPU.
#[test]
fn a_run_larger_than_a_simulated_gpu_is_refused_naming_the_gpu() {
    assert_refused(
        &[
            "--sim", "dgx-h100", "bench", "--tests", "local", "--size", "70GiB",
        ],
        &[
            "test `local` at 70 GiB (GPU 0) needs 140 GiB on GPU 0, which has",
            "free: choose a smaller --size",
        ],
    );
    assert_refused(
        &[
            "--sim", "dgx-h100", "explain", "--src", "0", "--dst", "1", "--size", "70GiB",
        ],
        &["explaining 70 GiB needs", "on GPU 0, which has"],
    );
}

/// More than the host has free, on GPUs large enough to hold it: refused against the host, for
/// every verb that allocates by size.
#[test]
fn a_run_larger_than_the_host_can_back_is_refused_naming_the_host() {
    let Some(free) = host_memory::free() else {
        return; // not Linux: nothing to check against
    };
    let mut preset = Preset::load("dgx-h100").unwrap();
    preset.name = "huge-gpus".into();
    // The most a preset may give a GPU (16 TiB): far more than any host running the tests has.
    preset.gpu.memory_mib = 1 << 24;
    for device in &mut preset.devices {
        device.memory_mib = None;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge-gpus.json");
    std::fs::write(&path, serde_json::to_string(&preset).unwrap()).unwrap();
    let sim = path.to_str().unwrap();
    let size = format!("{}MiB", (free >> 20) + 1024);
    let sizes = format!("1MiB,{size}");
    let messages = ((free >> 26) + 16).to_string(); // of 64 MiB each
    let host = [
        "of host memory (",
        "the simulated GPUs' memory",
        "and the host has",
    ];
    for args in [
        vec!["bench", "--tests", "ce-write", "--size", &size],
        vec!["bench", "--tests", "h2d", "--size", &size],
        vec!["bench", "--tests", "ce-write", "--sizes", &sizes],
        vec!["explain", "--src", "0", "--dst", "1", "--size", &size],
        vec![
            "plan", "--src", "0", "--dst", "1", "--size", &size, "--prove",
        ],
        vec!["plan", "--concurrent", "shift", "--size", &size],
        vec![
            "plan",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            "64MiB",
            "--messages",
            &messages,
            "--prove",
        ],
    ] {
        let mut all = vec!["--sim", sim];
        all.extend(args);
        assert_refused(&all, &host);
    }
}

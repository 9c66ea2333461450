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

/// Runs peerlink with `args` and returns its exit code and the first line of stderr.
fn refusal(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .output()
        .expect("peerlink runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let first = stderr.lines().next().unwrap_or_default().to_string();
    (out.status.code(), first)
}

/// Files the user names that cannot be read are bad input (exit 2), each in one sentence that says
/// what is wrong with it; an output path that cannot be written is refused before measuring.
#[test]
fn unreadable_inputs_and_unwritable_outputs_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let missing = format!("{d}/missing.json");
    let binary = format!("{d}/binary.json");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    let same = format!("{d}/same.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["compare", &missing, &missing], "does not exist"),
        (vec!["compare", d, d], "is a directory"),
        (vec!["compare", &binary, &binary], "not UTF-8"),
        (vec!["--sim", d, "topo"], "is a directory"),
        (vec!["--sim", &missing, "topo"], "does not exist"),
        (
            vec!["--sim", "dgx-h100", "plan", "--src", "0", "--dst", "1"]
                .into_iter()
                .chain(["--size", "4K", "--profile", d])
                .collect(),
            "is a directory",
        ),
        (
            vec!["--sim", "dgx-h100", "tune", "--quick", "--out", d],
            "is a directory",
        ),
        (
            vec!["--sim", "dgx-h100", "tune", "--quick", "--out", &same]
                .into_iter()
                .chain(["--export-sim", &same])
                .collect(),
            "both name",
        ),
    ];
    for (args, says) in cases {
        let (code, first) = refusal(&args);
        assert_eq!(code, Some(2), "{args:?}: {first}");
        assert!(first.contains(says), "{args:?}: {first}");
    }
    assert!(
        !std::path::Path::new(&same).exists(),
        "nothing measured, nothing written"
    );
}

/// Runs peerlink with `args`, killed if it has not ended within `seconds`; its exit code (None when
/// killed) and the first line of stderr.
fn refusal_within(args: &[&str], seconds: u64) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("peerlink runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().expect("kills its own child");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("peerlink ends");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    (
        out.status.code(),
        stderr.lines().next().unwrap_or_default().to_string(),
    )
}

/// A command line of each option that reads a file the user names (`{file}`).
const READERS: [&str; 6] = [
    "--sim {file} topo",
    "--sim pcie-2gpu-switch plan --src 0 --dst 1 --size 4K --profile {file}",
    "--sim pcie-2gpu-switch check --baseline {file}",
    "--sim pcie-2gpu-switch topo --nccl-xml {file}",
    "compare {file} {file}",
    "report {file} -o {out}",
];

/// Every option that reads a file the user names refuses, at once and with exit 2, what is not a
/// regular file — a FIFO nothing writes to (which would block a plain open), a device that never
/// ends (`/dev/zero`), a directory — and a file over the 64 MiB input cap (issue 34, class 3).
#[test]
fn inputs_that_are_not_regular_files_or_too_large_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("in.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(peerlink::files::MAX_INPUT_BYTES + 1)
        .unwrap();
    let out = dir.path().join("out.html");
    let (fifo, big, d, out) = (
        fifo.to_str().unwrap(),
        big.to_str().unwrap(),
        dir.path().to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let inputs = [
        (fifo, "is a named pipe (FIFO), not a regular file"),
        ("/dev/zero", "is a character device, not a regular file"),
        (d, "is a directory"),
        (
            big,
            "more than the 64 MiB peerlink reads from an input file",
        ),
    ];
    for command in READERS {
        for (input, says) in inputs {
            let line = command.replace("{file}", input).replace("{out}", out);
            let args: Vec<&str> = line.split(' ').collect();
            let start = std::time::Instant::now();
            let (code, first) = refusal_within(&args, 20);
            assert_eq!(code, Some(2), "{args:?}: {first}");
            assert!(first.contains(says), "{args:?}: {first}");
            assert!(first.contains(input), "{args:?} names the file: {first}");
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "{args:?} took {:?}",
                start.elapsed()
            );
        }
    }
    assert!(!std::path::Path::new(out).exists(), "nothing written");
}

/// `compare` refuses figures no measurement gives (negative, zero, absurdly large) instead of
/// printing ratios of −1, inf or 300 digits.
#[test]
fn compare_refuses_figures_no_measurement_gives() {
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(["--sim", "pcie-2gpu-switch", "bench", "--tests", "ce-write"])
        .args(["--size", "1MiB", "--json"])
        .output()
        .unwrap();
    let mut doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, doc.to_string()).unwrap();
    for bad in [-1.0, 0.0, 1e308] {
        doc["tests"][0]["cells"][0]["value"] = serde_json::json!(bad);
        let edited = dir.path().join("edited.json");
        std::fs::write(&edited, doc.to_string()).unwrap();
        let (code, first) = refusal(&["compare", good.to_str().unwrap(), edited.to_str().unwrap()]);
        assert_eq!(code, Some(2), "{bad}: {first}");
        assert!(first.contains("which no measurement gives"), "{first}");
    }
}

/// `topo` stays near-linear in the number of pairs: 500 GPUs (249,500 pairs) print in seconds. Each
/// table cell once searched every pair and every selected GPU (minutes at this size).
#[test]
fn topo_of_a_500_gpu_host_takes_seconds() {
    let mut preset: serde_json::Value = serde_json::from_str(include_str!(
        "../src/topology/presets/pcie-4gpu-2socket.json"
    ))
    .unwrap();
    let gpus = 500;
    preset["name"] = serde_json::json!("gpus500");
    preset["devices"] = (0..gpus)
        .map(|i| serde_json::json!({ "numa_node": i % 2 }))
        .collect();
    preset["links"] = serde_json::json!([]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpus500.json");
    std::fs::write(&path, preset.to_string()).unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(["--sim", path.to_str().unwrap(), "topo"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("GPU499"));
    assert!(took.as_secs() < 20, "topo on 500 GPUs took {took:?}");
}

/// Ctrl-C in the middle of a sweep: peerlink stops at once, prints what it
/// measured as a document marked partial, and exits 130.
#[test]
fn an_interrupted_sweep_keeps_what_it_measured_and_exits_130() {
    let child = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(["--sim", "dgx-h100", "bench", "--tests", "ce-write"])
        .args(["--sizes", "4B..256MiB", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Long enough to measure a pair or more (the whole sweep takes far longer).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let signalled = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("stopping now, keeping what was measured"),
        "{stderr}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a whole document");
    assert_eq!(doc["partial"], true);
    let sweeps = doc["sweeps"].as_array().unwrap();
    assert!(!sweeps.is_empty(), "something was measured before the stop");
    assert!(sweeps.len() < 56, "the run stopped before all 56 pairs");
}

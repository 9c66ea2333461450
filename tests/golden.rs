//! Golden outputs: every verb on two simulator presets, and what several hosts add on a third, text
//! and JSON, compared byte for byte with the files under `tests/golden/`.
//!
//! The simulator's clock is virtual and deterministic, so a change that moves a figure, a column or
//! a word shows up here. When a change is meant to alter an output, regenerate the files with
//! `PEERLINK_BLESS=1 cargo test --release --test golden` and say why in CHANGELOG.md.
//!
//! What varies from run to run by nature (temporary paths, the time, the host's name, peerlink's
//! own version and commit) is replaced by a placeholder before comparing.

mod common;

use common::peerlink;
use std::path::{Path, PathBuf};

/// The two presets: an NVLink mesh where some pairs have no P2P (relays, splits, staging), and a
/// PCIe pair under one switch.
const PRESETS: [&str; 2] = ["dgx1-v100", "pcie-2gpu-switch"];

/// One command per verb and mode, run on each preset (`{sim}`), with `--json` and without.
/// Device sets are small so the suite stays quick; `{dir}` is a scratch directory.
const CASES: &[(&str, &[&str])] = &[
    ("topo", &["topo"]),
    ("doctor", &["doctor"]),
    ("bench", &["bench", "--devices", "0,1", "--size", "1MiB"]),
    (
        "bench-more",
        &[
            "bench",
            "--devices",
            "0,1",
            "--size",
            "256KiB",
            "--tests",
            "sm-write,sm-read,ce-bidir-read,sm-bidir-write,staged,staged-bidir,all-to-one,one-to-all",
        ],
    ),
    (
        "sweep",
        &[
            "bench",
            "--devices",
            "0,1",
            "--sizes",
            "4B..1MiB",
            "--tests",
            "ce-write,sm-write,staged",
        ],
    ),
    (
        "explain",
        &["explain", "--src", "0", "--dst", "1", "--size", "64KiB"],
    ),
    ("plan", &["plan", "--src", "0", "--dst", "1", "--size", "64MiB"]),
    (
        "plan-prove",
        &["plan", "--src", "0", "--dst", "1", "--size", "4MiB", "--prove"],
    ),
    (
        "plan-batch",
        &[
            "plan",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            "4KiB",
            "--messages",
            "100",
            "--prove",
        ],
    ),
    (
        "plan-sweep",
        &["plan", "--src", "0", "--dst", "1", "--sizes", "4B,64KiB,16MiB"],
    ),
    (
        "plan-concurrent",
        &["plan", "--devices", "0,1", "--concurrent", "shift", "--size", "1MiB"],
    ),
    (
        "tune",
        &["tune", "--quick", "--devices", "0,1", "--out", "{dir}/profile.json"],
    ),
    (
        "compare",
        &["compare", "{dir}/bench-1MiB.json", "{dir}/bench-256KiB.json"],
    ),
    (
        "check",
        &["check", "--devices", "0,1", "--baseline", "{dir}/bench-1MiB.json"],
    ),
    (
        "workload-all-reduce",
        &[
            "workload",
            "all-reduce",
            "--devices",
            "0,1",
            "--max-size",
            "64KiB",
            "--issue",
            "both",
        ],
    ),
    (
        "workload-send-recv",
        &["workload", "send-recv", "--devices", "0,1", "--max-size", "64KiB"],
    ),
    (
        "workload-pipeline",
        &["workload", "pipeline", "--devices", "0,1", "--sizes", "4,64KiB,4MiB"],
    ),
    (
        "workload-halo",
        &["workload", "halo", "--devices", "0,1", "--max-size", "4KiB", "--graphs"],
    ),
    (
        "plan-profile",
        &[
            "plan",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            "1MiB",
            "--profile",
            "{dir}/profile.json",
        ],
    ),
];

/// A preset of two hosts, each with one NIC on its first socket: GPUs 2, 3, 6 and 7 are SYS to
/// their NIC.
const HOSTS_PRESET: &str = "2x-pcie-4gpu-2socket";

/// What several hosts add: the NICs in `topo`, the network's strategies in `plan` (GPUDirect RDMA
/// next to the NIC, staged through host memory across the sockets), NCCL's ring across the hosts.
const HOSTS_CASES: &[(&str, &[&str])] = &[
    ("topo", &["topo"]),
    (
        "plan-near-nic",
        &["plan", "--src", "0", "--dst", "5", "--size", "64MiB"],
    ),
    (
        "plan-far-nic",
        &["plan", "--src", "2", "--dst", "6", "--size", "64MiB"],
    ),
    (
        "workload-all-reduce",
        &["workload", "all-reduce", "--sizes", "4KiB,256KiB"],
    ),
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Replaces what differs between runs by nature with placeholders.
fn normalize(text: &str, dir: &Path) -> String {
    let mut out = text.replace(&dir.display().to_string(), "{dir}");
    out = out.replace(env!("CARGO_PKG_VERSION"), "{version}");
    out = mask_dates(&out);
    for key in ["time", "host", "commit", "peerlink_version"] {
        out = mask_json_string(&out, key);
    }
    out
}

/// Dates (`2026-11-30`) → `{date}`: profiles and headers carry the day they were measured.
fn mask_dates(text: &str) -> String {
    let bytes = text.as_bytes();
    let shape = b"dddd-dd-dd";
    let is_date = |at: usize| {
        bytes.len() >= at + shape.len()
            && shape.iter().zip(&bytes[at..]).all(|(s, b)| match s {
                b'd' => b.is_ascii_digit(),
                other => other == b,
            })
    };
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < bytes.len() {
        if is_date(at) {
            out.push_str("{date}");
            at += shape.len();
        } else {
            let ch = text[at..].chars().next().unwrap();
            out.push(ch);
            at += ch.len_utf8();
        }
    }
    out
}

/// `"key": "anything"` → `"key": "{key}"`, wherever the key appears.
fn mask_json_string(text: &str, key: &str) -> String {
    let needle = format!("\"{key}\": \"");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        let value_start = at + needle.len();
        out.push_str(&rest[..value_start]);
        out.push_str(&format!("{{{key}}}"));
        let value_len = rest[value_start..].find('"').unwrap_or(0);
        rest = &rest[value_start + value_len..];
    }
    out.push_str(rest);
    out
}

/// Runs one case on one preset, returning what it printed on stdout (normalized).
fn run_case(preset: &str, args: &[&str], json: bool, dir: &Path) -> String {
    let dir_text = dir.display().to_string();
    // `compare` reads files and opens no backend.
    let mut all: Vec<String> = if args[0] == "compare" {
        Vec::new()
    } else {
        vec!["--sim".into(), preset.into()]
    };
    all.extend(args.iter().map(|a| a.replace("{dir}", &dir_text)));
    if json {
        all.push("--json".into());
    }
    let out = peerlink().args(&all).output().unwrap();
    assert!(
        out.status.success(),
        "{all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    normalize(&String::from_utf8_lossy(&out.stdout), dir)
}

/// Runs `cases` on `preset` with and without `--json`, blessing the files or listing those that
/// differ in `differing`.
fn check(preset: &str, cases: &[(&str, &[&str])], dir: &Path, differing: &mut Vec<String>) {
    let bless = std::env::var_os("PEERLINK_BLESS").is_some();
    for (name, args) in cases {
        for json in [false, true] {
            let file = golden_dir().join(format!(
                "{preset}.{name}.{}",
                if json { "json" } else { "txt" }
            ));
            let got = run_case(preset, args, json, dir);
            if bless {
                std::fs::create_dir_all(golden_dir()).unwrap();
                std::fs::write(&file, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if got != want {
                differing.push(format!(
                    "{} (first differing line: {:?})",
                    file.display(),
                    first_difference(&want, &got)
                ));
            }
        }
    }
}

fn assert_none_differ(differing: &[String]) {
    assert!(
        differing.is_empty(),
        "outputs differ from tests/golden (regenerate with PEERLINK_BLESS=1 and say why in \
         CHANGELOG.md):\n{}",
        differing.join("\n")
    );
}

#[test]
fn every_verb_prints_what_it_printed_before() {
    let mut differing = Vec::new();
    for preset in PRESETS {
        // One scratch directory per preset: `plan-profile` reads the profile `tune` wrote.
        let dir = tempfile::tempdir().unwrap();
        // The two bench documents `compare` reads.
        for size in ["1MiB", "256KiB"] {
            let doc = run_case(
                preset,
                &["bench", "--devices", "0,1", "--size", size],
                true,
                dir.path(),
            );
            std::fs::write(dir.path().join(format!("bench-{size}.json")), doc).unwrap();
        }
        check(preset, CASES, dir.path(), &mut differing);
    }
    assert_none_differ(&differing);
}

#[test]
fn several_hosts_print_what_they_printed_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut differing = Vec::new();
    check(HOSTS_PRESET, HOSTS_CASES, dir.path(), &mut differing);
    assert_none_differ(&differing);
}

/// The first line where two texts differ, as (line number, expected, got).
fn first_difference(want: &str, got: &str) -> (usize, String, String) {
    let (mut w, mut g) = (want.lines(), got.lines());
    for n in 1.. {
        match (w.next(), g.next()) {
            (None, None) => break,
            (a, b) if a != b => {
                return (
                    n,
                    a.unwrap_or("<end>").to_string(),
                    b.unwrap_or("<end>").to_string(),
                )
            }
            _ => {}
        }
    }
    (0, String::new(), String::new())
}

#[test]
fn masking_replaces_values_and_keeps_keys() {
    assert_eq!(mask_dates("on 2026-11-30, 12-34"), "on {date}, 12-34");
    let text =
        "{\n  \"time\": \"2026-11-30T06:00:00Z\",\n  \"host\": \"box\",\n  \"x\": \"time\"\n}";
    assert_eq!(
        mask_json_string(&mask_json_string(text, "time"), "host"),
        "{\n  \"time\": \"{time}\",\n  \"host\": \"{host}\",\n  \"x\": \"time\"\n}"
    );
}

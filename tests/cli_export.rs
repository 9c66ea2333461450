//! `--export-json`, `--export-csv` and `--export-markdown` on every verb, all three in one run,
//! beside what the verb prints; and the progress bar, on a terminal only, on every run that can
//! pass a second.

mod common;

use common::{every_kind, peerlink, succeeds};
use serde_json::Value;
use std::path::Path;

/// The lines of `text` up to the first table: the header.
fn header_lines(text: &str) -> Vec<&str> {
    text.lines().take_while(|l| !l.is_empty()).collect()
}

#[test]
fn every_verb_exports_json_csv_and_markdown_at_once_beside_its_text() {
    let dir = tempfile::tempdir().unwrap();
    for (args, schema) in every_kind(dir.path()) {
        let (json, csv, md) = (
            dir.path().join("out.json"),
            dir.path().join("out.csv"),
            dir.path().join("out.md"),
        );
        let out = succeeds(
            peerlink()
                .args(&args)
                .arg("--export-json")
                .arg(&json)
                .arg("--export-csv")
                .arg(&csv)
                .arg("--export-markdown")
                .arg(&md),
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            serde_json::from_str::<Value>(&stdout).is_err() && !stdout.trim().is_empty(),
            "{args:?}: stdout keeps its text"
        );
        let simulated = args.contains(&"--sim".to_string());

        let doc: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(doc["schema"], schema, "{args:?}");
        assert!(doc["peerlink_version"].is_string(), "{args:?}");

        let csv = std::fs::read_to_string(&csv).unwrap();
        let header = header_lines(&csv);
        assert_eq!(header[0], format!("# schema: {schema}"), "{args:?}");
        assert!(header[1].starts_with("# source: "), "{args:?}: {csv}");
        // compare's header is the compared document's, a committed run on real GPUs.
        assert_eq!(doc["simulated"], simulated, "{args:?}");
        assert_eq!(header[2], format!("# simulated: {simulated}"), "{args:?}");
        assert!(header[3].starts_with("# peerlink_version: "), "{args:?}");
        assert_eq!(
            csv.contains("*** SIMULATED host"),
            doc["simulated"] == true,
            "{args:?}: {csv}"
        );
        let tables: Vec<&str> = csv.split("\n# table: ").skip(1).collect();
        assert!(!tables.is_empty(), "{args:?}: {csv}");
        // Each table: its name, then its columns and rows where it has any.
        let rows: usize = tables
            .iter()
            .map(|t| t.lines().count().saturating_sub(2))
            .sum();
        assert!(rows > 0, "{args:?}: no row in any table: {csv}");

        let md = std::fs::read_to_string(&md).unwrap();
        assert!(md.starts_with(&format!("# peerlink: {schema}\n")), "{md}");
        assert!(md.contains(&format!("- simulated: {}\n", doc["simulated"])));
        assert!(md.contains("- peerlink_version: "), "{md}");
        assert_eq!(md.matches("\n## ").count(), tables.len(), "{md}");
        assert!(md.contains("| --- |"), "{md}");
    }
}

#[test]
fn exports_go_beside_json_on_stdout_and_bench_csv_is_the_exported_table() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bench.csv");
    let run = |extra: &[&str]| {
        let out = peerlink()
            .args([
                "--sim",
                "pcie-2gpu-switch",
                "bench",
                "--tests",
                "ce-write,d2h",
            ])
            .args(["--size", "4K"])
            .args(extra)
            .arg("--export-csv")
            .arg(&csv)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let stdout = run(&["--json"]);
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is still one JSON document");
    assert_eq!(doc["schema"], "peerlink.bench/1");

    let stdout = run(&["--csv"]);
    let exported = std::fs::read_to_string(&csv).unwrap();
    let table = exported.split("# table: figures\n").nth(1).unwrap();
    assert_eq!(
        table, stdout,
        "--csv prints what --export-csv writes after its header"
    );
    assert!(
        !stdout.starts_with('#'),
        "--csv on stdout stays as it was: no comment lines"
    );
}

#[test]
fn destinations_are_checked_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let same = dir.path().join("x");
    for (args, says) in [
        (
            vec![
                "--export-json".into(),
                same.clone(),
                "--export-csv".into(),
                same.clone(),
            ],
            "both name",
        ),
        (
            vec!["--export-markdown".into(), dir.path().to_path_buf()],
            "is a directory",
        ),
        (
            vec!["--export-csv".into(), dir.path().join("missing/out.csv")],
            "does not exist",
        ),
    ] {
        let out = peerlink()
            .args(["--sim", "pcie-2gpu-switch", "bench"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: refused before measuring");
    }
}

/// Runs `args` on a terminal (util-linux's `script`), stdout to a file: what the terminal showed
/// (stderr), and what stdout held.
fn on_a_terminal(args: &[&str], dir: &Path) -> (String, String) {
    let stdout = dir.join("stdout");
    let bin = assert_cmd::cargo::cargo_bin("peerlink");
    let line = format!(
        "{} {} > {}",
        bin.display(),
        args.join(" "),
        stdout.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        // Every bar at once: the runs here are short.
        .env("PEERLINK_PROGRESS_DELAY_MS", "0")
        .output()
        .expect("util-linux's `script` runs a command on a terminal");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        std::fs::read_to_string(stdout).unwrap(),
    )
}

/// The progress bar's stage of each long run's document.
fn stage(schema: &str) -> Option<&'static str> {
    match schema {
        // A stage per test (and sweep): some bar.
        "peerlink.bench/1" => Some("[="),
        "peerlink.explain/1" => Some("explain"),
        "peerlink.plan/1" | "peerlink.plan-sweep/1" => Some("engine proof"),
        "peerlink.plan-batch/1" => Some("batch proof"),
        "peerlink.plan-concurrent/1" => Some("concurrent"),
        "peerlink.profile/1" => Some("sweep"),
        "peerlink.workload/1" => Some("all-reduce"),
        _ => None,
    }
}

#[test]
fn long_runs_show_progress_with_an_eta_on_a_terminal_under_json_too() {
    let dir = tempfile::tempdir().unwrap();
    for (args, schema) in every_kind(dir.path()) {
        let Some(stage) = stage(schema) else { continue };
        let mut all: Vec<&str> = vec!["--json"];
        all.extend(args.iter().map(String::as_str));
        let (terminal, stdout) = on_a_terminal(&all, dir.path());
        assert!(
            terminal.contains(stage) && terminal.contains("ETA"),
            "{args:?}: no bar on the terminal: {terminal}"
        );
        serde_json::from_str::<Value>(&stdout).expect("stdout holds the document alone");

        // Not a terminal: no bar.
        let out = succeeds(peerlink().args(&all).env("PEERLINK_PROGRESS_DELAY_MS", "0"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("ETA"),
            "{args:?}: a bar on a pipe: {stderr}"
        );
    }
}

//! `peerlink report` from the command line: every kind of document the simulator writes in one
//! page, labelled SIMULATED, the charts alone with `--svg DIR`, and what it refuses.

mod common;

use common::{peerlink, succeeds};
use std::path::Path;

/// Writes every kind of document peerlink writes, from the simulated PCIe pair, into `dir`.
fn documents(dir: &Path) -> Vec<String> {
    let profile = dir.join("tune-profile.json").display().to_string();
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("topo", vec!["topo"]),
        ("bench", vec!["bench", "--size", "64KiB"]),
        (
            "sweep",
            vec!["bench", "--sizes", "4B..1MiB", "--tests", "ce-write"],
        ),
        (
            "explain",
            vec!["explain", "--src", "0", "--dst", "1", "--size", "4KiB"],
        ),
        (
            "plan",
            vec![
                "plan", "--src", "0", "--dst", "1", "--size", "1MiB", "--prove",
            ],
        ),
        (
            "plan-sweep",
            vec!["plan", "--src", "0", "--dst", "1", "--sizes", "4KiB,1MiB"],
        ),
        (
            "plan-batch",
            vec![
                "plan",
                "--src",
                "0",
                "--dst",
                "1",
                "--size",
                "4KiB",
                "--messages",
                "10",
                "--prove",
            ],
        ),
        (
            "plan-concurrent",
            vec!["plan", "--concurrent", "shift", "--size", "64KiB"],
        ),
        ("profile", vec!["tune", "--quick", "--out", &profile]),
        (
            "workload",
            vec!["workload", "send-recv", "--max-size", "16KiB"],
        ),
    ];
    let mut files = Vec::new();
    for (name, args) in runs {
        let out = succeeds(
            peerlink()
                .args(["--sim", "pcie-2gpu-switch", "--json"])
                .args(&args),
        );
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, &out.stdout).unwrap();
        files.push(file.display().to_string());
    }
    // compare: the simulated bench against itself.
    let bench = dir.join("bench.json").display().to_string();
    let out = succeeds(peerlink().args(["--json", "compare", &bench, &bench]));
    let compare = dir.join("compare.json");
    std::fs::write(&compare, &out.stdout).unwrap();
    files.push(compare.display().to_string());
    files
}

#[test]
fn every_kind_of_document_makes_a_simulated_section_and_svg_files() {
    let dir = tempfile::tempdir().unwrap();
    let files = documents(dir.path());
    let (html, svg) = (dir.path().join("report.html"), dir.path().join("charts"));
    let out = succeeds(
        peerlink()
            .arg("report")
            .args(&files)
            .arg("-o")
            .arg(&html)
            .arg("--svg")
            .arg(&svg),
    );
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.contains(&format!("{} documents", files.len())),
        "{said}"
    );

    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<section id=").count(), files.len());
    // Every section is labelled, and so is every chart, on the page and alone.
    assert_eq!(
        page.matches("</h2>").count(),
        page.matches("<span class=\"badge\">SIMULATED</span></h2>")
            .count()
    );
    let charts: Vec<&str> = page.split("<svg data-chart=\"").skip(1).collect();
    assert!(charts.len() >= 2 * files.len(), "{} charts", charts.len());
    let mut written: Vec<_> = std::fs::read_dir(&svg)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    written.sort();
    assert_eq!(written.len(), charts.len(), "a file per chart");
    for chart in &charts {
        let id = &chart[..chart.find('"').unwrap()];
        let title = chart
            .split("<title>")
            .nth(1)
            .and_then(|t| t.split("</title>").next())
            .unwrap();
        assert!(title.ends_with("SIMULATED"), "{id}: {title}");
        assert!(
            chart.contains("fill=\"transparent\" pointer-events=\"all\"><title>"),
            "{id}: no tooltip"
        );
        let alone = std::fs::read_to_string(svg.join(format!("{id}.svg"))).unwrap();
        assert!(alone.starts_with("<svg ") && alone.contains(title), "{id}");
    }
    for kind in [
        "topology-graph",
        "topology-matrix",
        "waterfall",
        "engine-sweep",
        "profile-hops",
    ] {
        assert!(page.contains(&format!("-{kind}\"")), "no {kind} chart");
    }
}

#[test]
fn what_report_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let torch = "benchmarks/h200-x2/workload/torch-allreduce-f32.json";
    let topo = "benchmarks/h200-x2/topo.json";
    let out = dir.path().join("r.html").display().to_string();
    let missing = dir.path().join("missing.json").display().to_string();
    for (args, says) in [
        (
            vec![torch, "-o", &out],
            "torch-allreduce-f32.json is not a document peerlink writes",
        ),
        (vec![missing.as_str(), "-o", &out], "does not exist"),
        (vec![topo], "--out"),
        (vec![topo, "-o", &out, "--json"], "not a document"),
        (
            vec![topo, "-o", &out, "--sim", "dgx-h100"],
            "--sim does not apply",
        ),
        (vec![topo, "--svg", topo], "not a directory"),
    ] {
        let result = peerlink().arg("report").args(&args).output().unwrap();
        assert_eq!(result.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert!(!Path::new(&out).exists(), "nothing written when refused");
}

//! `peerlink report` from the command line: every kind of document in one page, the simulated ones
//! labelled SIMULATED, the charts alone with `--svg DIR`, and what it refuses.

mod common;

use common::{every_kind, peerlink, succeeds};
use std::path::Path;

/// Writes every kind of document peerlink writes into `dir`: its files, and whether each is
/// simulated.
fn documents(dir: &Path) -> Vec<(String, bool)> {
    every_kind(dir)
        .into_iter()
        .enumerate()
        .map(|(i, (args, _))| {
            let out = succeeds(peerlink().arg("--json").args(&args));
            let file = dir.join(format!("{i}.json"));
            std::fs::write(&file, &out.stdout).unwrap();
            (
                file.display().to_string(),
                args.contains(&"--sim".to_string()),
            )
        })
        .collect()
}

#[test]
fn every_kind_of_document_makes_a_section_labelled_simulated_where_it_is_and_svg_files() {
    let dir = tempfile::tempdir().unwrap();
    let documents = documents(dir.path());
    let files: Vec<&String> = documents.iter().map(|(file, _)| file).collect();
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
    // The simulated sections are labelled, and so is each of their charts, on the page and alone.
    let simulated = documents.iter().filter(|(_, simulated)| *simulated).count();
    assert!(simulated > 0 && simulated < documents.len());
    assert_eq!(
        page.matches("<span class=\"badge\">SIMULATED</span></h2>")
            .count(),
        simulated
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
        let document: usize = id[1..id.find('-').unwrap()].parse().unwrap();
        assert_eq!(
            title.ends_with("— SIMULATED"),
            documents[document - 1].1,
            "{id}: {title}"
        );
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

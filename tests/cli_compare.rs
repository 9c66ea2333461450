//! `peerlink compare` on two `bench --json` documents from the simulator.

mod common;

use common::{json_of, peerlink};
use predicates::prelude::*;

#[test]
fn a_preset_against_another_pairs_every_shared_figure() {
    let dir = tempfile::tempdir().unwrap();
    let bench = |preset: &str| {
        let path = dir.path().join(format!("{preset}.json"));
        let args = [
            "--sim",
            preset,
            "bench",
            "--tests",
            "ce-write,h2d",
            "--size",
            "1MiB",
        ];
        let doc = json_of(&[&args[..], &["--json"]].concat());
        std::fs::write(&path, doc.to_string()).unwrap();
        (path.to_str().unwrap().to_string(), doc)
    };
    let ((h100, _), (v100, v100_doc)) = (bench("dgx-h100"), bench("dgx1-v100"));
    // The H100 host measures every pair; the DGX-1 only those with P2P, so it sets the count.
    let cells: usize = v100_doc["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["cells"].as_array().unwrap().len())
        .sum();
    let doc = json_of(&["compare", &h100, &v100, "--json"]);
    assert_eq!(doc["schema"], "peerlink.compare/1");
    assert_eq!(doc["source"], "sim:dgx1-v100");
    assert_eq!(doc["base_source"], "sim:dgx-h100");
    let tests: Vec<&str> = doc["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["ce-write 1 MiB", "h2d 1 MiB"]);
    assert_eq!(doc["pairs"].as_array().unwrap().len(), cells);
    assert!(cells > 8, "write cells and one h2d per GPU");
    // NVLink 2 against NVLink 4 through NVSwitch: V100 pairs are slower.
    assert!(doc["tests"][0]["median_ratio"].as_f64().unwrap() < 1.0);
    peerlink()
        .args(["compare", &h100, &v100])
        .assert()
        .success()
        .stdout(predicate::str::contains("median ratio"));
}

#[test]
fn documents_older_than_the_header_still_compare() {
    // Run 17's H200 bench and the simulator exported from it, written before documents carried
    // peerlink's version, the time or the GPUs.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/benchmarks/h200/run17");
    let doc = json_of(&[
        "compare",
        &format!("{dir}/bench.json"),
        &format!("{dir}/sim-bench.json"),
        "--json",
    ]);
    assert_eq!(doc["base_source"], "cuda");
    assert_eq!(doc["source"], "sim:exported-sim");
    assert_eq!(doc["simulated"], true);
    // The header is this run's; the GPUs are the compared document's, which named none.
    assert!(doc["time"].is_string());
    assert_eq!(doc["host_gpus"].as_array().unwrap().len(), 0);
    assert!(doc["pairs"].as_array().unwrap().len() > 10);
}

#[test]
fn anything_but_two_bench_documents_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("topo.json");
    std::fs::write(
        &topo,
        json_of(&["--sim", "dgx-h100", "topo", "--json"]).to_string(),
    )
    .unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not json").unwrap();
    let missing = dir.path().join("missing.json");
    for (a, b, code, says) in [
        (
            &topo,
            &topo,
            2,
            "is not a `peerlink.bench/1` document (its schema is `peerlink.topo/1`)",
        ),
        (&text, &topo, 2, "is not JSON"),
        (&missing, &topo, 2, "missing.json does not exist"),
    ] {
        peerlink()
            .args(["compare", a.to_str().unwrap(), b.to_str().unwrap()])
            .assert()
            .code(code)
            .stderr(predicate::str::contains(says))
            .stderr(predicate::str::contains("panicked").not());
    }
    peerlink().args(["compare", "one.json"]).assert().code(2);
}

#[test]
fn options_that_choose_gpus_are_refused_since_compare_opens_none() {
    for (flags, named) in [
        (&["--sim", "dgx-h100"][..], "--sim does not apply"),
        (&["--gpu"][..], "--gpu does not apply"),
        (
            &["--devices", "0", "--gpu"][..],
            "--gpu and --devices do not apply",
        ),
    ] {
        peerlink()
            .args(flags)
            .args(["compare", "a.json", "b.json"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(named));
    }
}

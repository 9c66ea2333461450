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

/// A `bench --json` of the simulated H200 pair, written to `dir/name`; its path.
fn sim_bench(dir: &std::path::Path, name: &str, tests: &str) -> String {
    let path = dir.join(name);
    let doc = json_of(&["--sim", "h200-pair", "bench", "--tests", tests, "--json"]);
    std::fs::write(&path, doc.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn documents_that_pair_nothing_are_refused_in_one_sentence() {
    // The shipped one-H200 bench (64 MiB, each test on GPU 0 itself) against the simulated pair
    // (8 MiB, between GPUs 0 and 1): once an empty table and exit 0.
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_bench(dir.path(), "sim.json", "ce-write,h2d,copy-latency");
    let gpu = concat!(env!("CARGO_MANIFEST_DIR"), "/benchmarks/h200/bench.json");
    for extra in [&[][..], &["--json"], &["--threshold", "5"]] {
        let out = peerlink()
            .args(["compare", gpu, &sim])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        assert!(out.stdout.is_empty(), "nothing printed as if compared");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("share no figure"), "{stderr}");
    }
}

#[test]
fn a_figure_beyond_the_threshold_exits_1_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim_bench(dir.path(), "base.json", "ce-write,h2d");
    let again = sim_bench(dir.path(), "again.json", "ce-write,h2d");
    // The simulator repeats itself exactly: nothing moves, even against a threshold of 0.
    peerlink()
        .args(["compare", &base, &again, "--threshold", "0"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "within 0%: every one of the 4 paired figures",
        ));
    // GPU 1 → GPU 0 made 10% slower.
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&again).unwrap()).unwrap();
    let cell = &mut doc["tests"][0]["cells"][1];
    assert_eq!(
        (cell["src"].as_u64(), cell["dst"].as_u64()),
        (Some(1), Some(0))
    );
    cell["value"] = serde_json::json!(cell["value"].as_f64().unwrap() * 0.9);
    let slower = dir.path().join("slower.json");
    std::fs::write(&slower, doc.to_string()).unwrap();
    let slower = slower.to_str().unwrap();
    for pct in ["5", "9.9%"] {
        peerlink()
            .args(["compare", &base, slower, "--threshold", pct])
            .assert()
            .code(1)
            .stdout(predicate::str::contains("BEYOND"))
            .stderr(predicate::str::contains(
                "1 of 4 paired figures moved by more than",
            ))
            .stderr(predicate::str::contains("ce-write 8 MiB 1→0 (×0.900)"));
    }
    peerlink()
        .args(["compare", &base, slower, "--threshold", "10.1"])
        .assert()
        .success();
    // Without --threshold, compare only reports.
    peerlink()
        .args(["compare", &base, slower])
        .assert()
        .success();
    // --json: the document still on stdout, with what moved.
    let out = peerlink()
        .args(["compare", &base, slower, "--threshold", "5", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["threshold"]["pct"], 5.0);
    assert_eq!(doc["threshold"]["beyond"][0]["place"], "1→0");
    for bad in ["-5", "five", "5%%"] {
        peerlink()
            .args(["compare", &base, &again, &format!("--threshold={bad}")])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("bad --threshold"));
    }
}

//! Managed (unified) memory from the command line, on the simulator: the bench's managed tests and
//! `explain --memory managed`.

mod common;

use common::{json_of, peerlink};
use predicates::prelude::*;

const MANAGED: &str =
    "managed-fault,managed-accessed-by,managed-prefetch,managed-read-mostly,managed-fault-latency";

#[test]
fn the_managed_tests_fill_their_matrices_and_say_what_they_measure() {
    let doc = json_of(&[
        "--sim",
        "h200-pair",
        "bench",
        "--json",
        "--tests",
        MANAGED,
        "--size",
        "2MiB",
    ]);
    assert_eq!(doc["simulated"], true);
    let tests = doc["tests"].as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, MANAGED.split(',').collect::<Vec<_>>());
    for t in tests {
        let matrix = t["matrix"].as_array().unwrap();
        for (src, dst) in [(0, 1), (1, 0)] {
            assert!(matrix[src][dst].as_f64().unwrap() > 0.0, "{}", t["name"]);
        }
        assert!(t["measures"]
            .as_str()
            .unwrap()
            .contains("every byte verified"));
    }
    assert_eq!(tests[4]["unit"], "us");
    assert_eq!(tests[4]["size_bytes"], 4);
    let fault = tests[0]["matrix"][0][1].as_f64().unwrap();
    let prefetch = tests[2]["matrix"][0][1].as_f64().unwrap();
    assert!(
        prefetch > 10.0 * fault,
        "prefetch {prefetch} vs fault {fault} GB/s"
    );
}

/// `explain` of 2 MiB from GPU 0 to GPU 1 on the simulated H200 pair, with `--memory memory`.
fn explain(memory: &str) -> Vec<&str> {
    vec![
        "--sim",
        "h200-pair",
        "explain",
        "--src",
        "0",
        "--dst",
        "1",
        "--size",
        "2MiB",
        "--memory",
        memory,
    ]
}

#[test]
fn explain_splits_a_managed_read_into_faults_migration_and_read() {
    let args = explain("managed");
    peerlink()
        .args(&args)
        .assert()
        .success()
        .stdout(predicate::str::contains("SIMULATED"))
        .stdout(predicate::str::contains("route: managed memory"))
        .stdout(predicate::str::contains(" page faults "))
        .stdout(predicate::str::contains(" page migration "))
        .stdout(predicate::str::contains("cuMemPrefetchAsync"))
        .stdout(predicate::str::contains("SetAccessedBy"));
    let mut json = args;
    json.push("--json");
    let doc = json_of(&json);
    assert_eq!(doc["schema"], "peerlink.explain/1");
    let parts = doc["parts"].as_array().unwrap();
    let faults = parts.iter().find(|p| p["name"] == "page faults").unwrap();
    assert!(faults["us"].as_f64().unwrap() > 0.0);
}

#[test]
fn an_unknown_kind_of_memory_is_one_sentence_and_exit_2() {
    peerlink()
        .args(explain("hbm"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--memory `hbm`"))
        .stderr(predicate::str::contains("`device` or `managed`"));
}

//! The simulator's NCCL model against NCCL measured on two H200s over NVLink (NCCL 2.28.3,
//! 2026-11-30, `benchmarks/h200-x2/workload/`): the `h200-pair` preset must predict NCCL's time per
//! operation within ±15% at every size from 4 B to 64 MiB, for the all-reduce and for one-way
//! send/recv. (Both ways at once is not modelled that closely yet: NCCL slows 10–40% when a rank
//! sends and receives in one group, which the model leaves out; see BENCHMARKS.md.)

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

/// NCCL's time per operation by (variant, bytes). Of the two issue modes the faster: both time the
/// same operation on the GPU, and a lone slow window (16.9 µs among 6.5 µs ones) is noise from the
/// host side, not NCCL's cost.
fn nccl_times(doc: &Value) -> BTreeMap<(String, u64), f64> {
    let mut times = BTreeMap::new();
    for row in doc["rows"].as_array().expect("rows") {
        if row["contender"] != "nccl" {
            continue;
        }
        let key = (
            row["variant"].as_str().unwrap_or_default().to_string(),
            row["bytes"].as_u64().unwrap(),
        );
        let us = row["time_us"].as_f64().unwrap();
        let best = times.entry(key).or_insert(us);
        *best = f64::min(*best, us);
    }
    times
}

fn measured(file: &str) -> Value {
    let path = format!(
        "{}/benchmarks/h200-x2/workload/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn simulated(workload: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(["--sim", "h200-pair", "workload", workload])
        .args([
            "--sizes",
            "4B..64MiB",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_within(workload: &str, measured: &Value, simulated: &Value, variants: &[&str]) {
    let (gpu, sim) = (nccl_times(measured), nccl_times(simulated));
    let mut compared = 0;
    let mut outside = Vec::new();
    for ((variant, bytes), sim_us) in &sim {
        if !variants.contains(&variant.as_str()) {
            continue;
        }
        // The simulated sweep steps by 2×, the measured one by 4×.
        let Some(&gpu_us) = gpu.get(&(variant.clone(), *bytes)) else {
            continue;
        };
        compared += 1;
        let ratio = sim_us / gpu_us;
        if !(0.85..=1.15).contains(&ratio) {
            outside.push(format!(
                "{variant} {bytes} B: simulated {sim_us:.2} µs, measured {gpu_us:.2} µs ({ratio:.3}×)"
            ));
        }
    }
    assert!(compared >= 12, "{workload}: only {compared} sizes compared");
    assert!(outside.is_empty(), "{workload}: {outside:#?}");
}

#[test]
fn the_nccl_model_predicts_nccls_all_reduce_on_the_h200_pair_within_15_percent() {
    let gpu = measured("workload-all-reduce-f32.json");
    let sim = simulated("all-reduce", &["--dtype", "f32"]);
    assert_within("all-reduce", &gpu, &sim, &[""]);
}

#[test]
fn the_nccl_model_predicts_nccls_one_way_send_recv_on_the_h200_pair_within_15_percent() {
    let gpu = measured("workload-send-recv.json");
    let sim = simulated("send-recv", &["--direction", "one-way"]);
    assert_within("send-recv", &gpu, &sim, &["one-way"]);
}

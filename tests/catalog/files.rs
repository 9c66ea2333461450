//! The input files the catalog's rows name as `F/<name>`, made on demand in a temporary directory.
//!
//! Presets are edited from the embedded ones; bench, topo and profile documents (and an exported
//! preset) are written by peerlink itself on the simulator, once, then edited. A name says what the
//! file holds; [`make`] knows every name the catalog uses and refuses any other, so a row cannot
//! name a file nobody made.

use serde_json::{json, Value};
use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The embedded presets the edits start from.
const PCIE2: &str = include_str!("../../src/topology/presets/pcie-2gpu-switch.json");
const DGX_H100: &str = include_str!("../../src/topology/presets/dgx-h100.json");

/// Documents written by peerlink on the simulator, each made the first time a file needs it.
pub struct Files {
    dir: PathBuf,
    bench_h100: OnceCell<Value>,
    bench_pcie2: OnceCell<Value>,
    bench_sweep: OnceCell<Value>,
    topo: OnceCell<Value>,
    tuned_pcie2: OnceCell<(Value, Value)>,
    tuned_h100: OnceCell<(Value, Value)>,
}

impl Files {
    /// Files go into `dir` (which exists), named as the catalog names them.
    pub fn new(dir: &Path) -> Files {
        Files {
            dir: dir.to_path_buf(),
            bench_h100: OnceCell::new(),
            bench_pcie2: OnceCell::new(),
            bench_sweep: OnceCell::new(),
            topo: OnceCell::new(),
            tuned_pcie2: OnceCell::new(),
            tuned_h100: OnceCell::new(),
        }
    }

    /// Makes `F/<name>` (nothing for the names of missing files) and returns its path.
    pub fn make(&self, name: &str) -> PathBuf {
        let path = self.dir.join(name);
        if path.exists() {
            return path;
        }
        if let Some(bytes) = self.content(name) {
            std::fs::write(&path, bytes).unwrap();
        }
        path
    }

    /// What the file named `name` holds; None for a file that must not exist.
    fn content(&self, name: &str) -> Option<Vec<u8>> {
        let text = |v: &Value| Some(serde_json::to_vec_pretty(v).unwrap());
        let pcie2 = || -> Value { serde_json::from_str(PCIE2).unwrap() };
        let h100 = || -> Value { serde_json::from_str(DGX_H100).unwrap() };
        let preset = |edit: &dyn Fn(&mut Value)| text(&edited(pcie2(), edit));
        Some(match name {
            "missing" | "missing.json" | "missing2.json" => return None,
            "empty.json" => Vec::new(),
            "random.bin" => random_bytes(4096, 7),
            // Printable ASCII, some of it JSON's punctuation: valid UTF-8, never a document.
            "random.json" => random_bytes(4096, 11)
                .into_iter()
                .map(|b| b" {}[]\":,0123456789abcdefeEnulltrue-+."[b as usize % 36])
                .collect(),
            "truncated.json" => DGX_H100.as_bytes()[..DGX_H100.len() / 2].to_vec(),
            "bom.json" => [b"\xEF\xBB\xBF".as_slice(), PCIE2.as_bytes()].concat(),
            "deep.json" => format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
            "array.json" => b"[1, 2, 3]".to_vec(),
            "null.json" => b"null".to_vec(),
            "dup-key.json" => PCIE2
                .replacen("\"name\":", "\"name\": \"first\",\n  \"name\":", 1)
                .into_bytes(),
            "nan-literal.json" => replace_number(PCIE2, "\"host_gbps\"", "NaN"),
            "inf-1e999.json" => replace_number(PCIE2, "\"host_gbps\"", "1e999"),
            "huge-200mb.json" => {
                // A valid preset of 200 MB: its `sources` say a lot.
                let line = "x".repeat(1 << 20);
                let v = edited(pcie2(), &|p| p["sources"] = json!(vec![line.clone(); 200]));
                serde_json::to_vec(&v).unwrap()
            }
            "neg-bw.json" => preset(&|p| p["pcie"]["host_gbps"] = json!(-26.0))?,
            "neg-p2p.json" => preset(&|p| p["pcie"]["p2p_gbps"]["PIX"] = json!(-1.0))?,
            "zero-rate.json" => preset(&|p| p["host"]["staged_gbps"] = json!(0.0))?,
            "zero-gpus.json" => preset(&|p| p["devices"] = json!([]))?,
            "gpus64.json" => preset(&|p| p["devices"] = gpus(64))?,
            "gpus1000.json" => preset(&|p| p["devices"] = gpus(1000))?,
            "gpus1024.json" => preset(&|p| p["devices"] = gpus(1024))?,
            "gpus1025.json" => preset(&|p| p["devices"] = gpus(1025))?,
            "gpus10000.json" => preset(&|p| p["devices"] = gpus(10_000))?,
            "name-1mb.json" => preset(&|p| p["name"] = json!("x".repeat(1 << 20)))?,
            "name-c1.json" => preset(&|p| p["name"] = json!("sim\u{9b}2J"))?,
            "switch-bidi.json" => {
                preset(&|p| p["devices"][0]["pcie_switch"] = json!("sw\u{2066}0"))?
            }
            "nic-name-escape.json" => text(&edited(h100(), &|p| {
                p["nics"] = json!([{ "numa_node": 0, "name": "mlx5_\u{1b}[31m" }])
            }))?,
            "bus-id-bad-device.json" => {
                preset(&|p| p["devices"][0]["pci_bus_id"] = json!("0000:17:20.0"))?
            }
            "bus-id-default-twice.json" => preset(&|p| {
                p["devices"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("pci_bus_id");
                p["devices"][1]["pci_bus_id"] = json!("0000:01:00.0");
            })?,
            "cc-bad.json" => preset(&|p| p["gpu"]["compute_capability"] = json!("sm_90"))?,
            "cpus-bad.json" => preset(&|p| p["devices"][0]["cpu_affinity"] = json!("0-3;rm -rf"))?,
            "numa-huge.json" => preset(&|p| p["devices"][0]["numa_node"] = json!(100_000))?,
            "rate-fast.json" => preset(&|p| p["pcie"]["p2p_gbps"]["PIX"] = json!(1e7))?,
            "nvswitch-links-1000.json" => text(&edited(h100(), &|p| {
                p["nvswitch"]["links_per_gpu"] = json!(1000)
            }))?,
            hostile if hostile.starts_with("hostile-") => {
                std::fs::read(hostile_fixture(&hostile["hostile-".len()..])).unwrap()
            }
            "gpus1000-nvswitch.json" => text(&edited(h100(), &|p| p["devices"] = gpus(1000)))?,
            "link-missing-gpu.json" => {
                preset(&|p| p["links"] = json!([{ "gpus": [0, 5], "link": "PIX" }]))?
            }
            "link-self.json" => {
                preset(&|p| p["links"] = json!([{ "gpus": [1, 1], "link": "PIX" }]))?
            }
            "link-bad-class.json" => {
                preset(&|p| p["links"] = json!([{ "gpus": [0, 1], "link": "NV0" }]))?
            }
            "link-nv-noconfig.json" => {
                preset(&|p| p["links"] = json!([{ "gpus": [0, 1], "link": "NV4" }]))?
            }
            "link-twice.json" => preset(&|p| {
                p["links"] = json!([
                    { "gpus": [0, 1], "link": "PXB" },
                    { "gpus": [1, 0], "link": "SYS" }
                ])
            })?,
            "p2p-nvlink-class.json" => preset(&|p| p["pcie"]["p2p_gbps"]["NV2"] = json!(50.0))?,
            "nvswitch-no-nvlink.json" => text(&edited(h100(), &|p| {
                drop(p.as_object_mut().unwrap().remove("nvlink"))
            }))?,
            "copy-engines-0.json" => preset(&|p| p["gpu"]["copy_engines"] = json!(0))?,
            "mem-huge.json" => preset(&|p| p["gpu"]["memory_mib"] = json!(1u64 << 40))?,
            "mem-2pow44.json" => preset(&|p| p["gpu"]["memory_mib"] = json!(1u64 << 44))?,
            "mem-u64max.json" => preset(&|p| p["devices"][1]["memory_mib"] = json!(u64::MAX))?,
            "mem-1mib.json" => preset(&|p| p["gpu"]["memory_mib"] = json!(1))?,
            "tiny-rate.json" => preset(&|p| {
                p["pcie"]["host_gbps"] = json!(1e-6);
                p["pcie"]["p2p_gbps"]["PIX"] = json!(1e-6);
                p["gpu"]["local_copy_gbps"] = json!(1e-6);
            })?,
            "huge-latency.json" => preset(&|p| {
                p["pcie"]["latency_us"] = json!(1e9);
                p["costs"]["copy_setup_us"] = json!(1e9);
            })?,
            "huge-cost.json" => preset(&|p| p["costs"]["copy_issue_us"] = json!(1e308))?,
            "huge-rate.json" => preset(&|p| {
                p["pcie"]["host_gbps"] = json!(1e300);
                p["pcie"]["p2p_gbps"]["PIX"] = json!(1e300);
                p["gpu"]["local_copy_gbps"] = json!(1e300);
            })?,
            "unknown-field.json" => preset(&|p| p["colour"] = json!("red"))?,
            "missing-field.json" => preset(&|p| drop(p.as_object_mut().unwrap().remove("costs")))?,
            "numa-neg.json" => preset(&|p| p["devices"][0]["numa_node"] = json!(-1))?,
            "all-mig.json" => preset(&|p| {
                for d in p["devices"].as_array_mut().unwrap() {
                    d["mig_enabled"] = json!(true);
                }
            })?,
            "nvswitch-0.json" => text(&edited(h100(), &|p| {
                p["nvswitch"]["links_per_gpu"] = json!(0)
            }))?,
            "eff-2.json" => preset(&|p| p["gpu"]["sm_copy_efficiency"] = json!(2.0))?,
            "name-empty.json" => preset(&|p| p["name"] = json!(""))?,
            "wrong-types.json" => preset(&|p| p["gpu"]["memory_mib"] = json!("lots"))?,
            "float-count.json" => preset(&|p| p["gpu"]["copy_engines"] = json!(2.5))?,
            // Documents peerlink wrote, and edits of them.
            "topo.json" => text(self.topo())?,
            "bench-h100.json" => text(self.bench_h100())?,
            "bench-pcie2.json" => text(self.bench_pcie2())?,
            "bench-sweep.json" => text(self.bench_sweep())?,
            "bench-neg.json" => text(&self.bench_value(json!(-25.7)))?,
            "bench-zero.json" => text(&self.bench_value(json!(0.0)))?,
            "bench-huge.json" => text(&self.bench_value(json!(1e308)))?,
            "bench-nan-str.json" => text(&self.bench_value(json!("NaN")))?,
            "bench-null.json" => text(&self.bench_value(Value::Null))?,
            "bench-nan-literal.json" => replace_number(
                &serde_json::to_string(self.bench_h100()).unwrap(),
                "\"value\"",
                "NaN",
            ),
            "bench-inf-1e999.json" => replace_number(
                &serde_json::to_string(self.bench_h100()).unwrap(),
                "\"value\"",
                "1e999",
            ),
            "bench-dup-key.json" => serde_json::to_string_pretty(self.bench_h100())
                .unwrap()
                .replacen("\"source\":", "\"source\": \"cuda\",\n  \"source\":", 1)
                .into_bytes(),
            "bench-neg-time.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["tests"][0]["cells"][0]["time_us"]["median"] = json!(-1.0)
            }))?,
            "bench-ragged.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["tests"][0]["matrix"][1] = json!([1.0]);
                d["tests"][0]["matrix"][3] = json!([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
            }))?,
            "bench-cell-gpu99.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["tests"][0]["cells"][0]["dst"] = json!(99)
            }))?,
            "bench-schema9.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["schema"] = json!("peerlink.bench/9")
            }))?,
            "bench-notests.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["tests"] = json!([]);
                d["sweeps"] = json!([]);
            }))?,
            "bench-trunc.json" => {
                let full = serde_json::to_vec(self.bench_h100()).unwrap();
                full[..full.len() / 2].to_vec()
            }
            "bench-1000.json" => text(&self.bench_of_1000_gpus())?,
            "bench-1e-300.json" => text(&self.bench_value(json!(1e-300)))?,
            "bench-1e10.json" => text(&self.bench_value(json!(1e10)))?,
            "bench-sweep-1e-300.json" => text(&edited(self.bench_sweep().clone(), &|d| {
                d["sweeps"][0]["points"][0]["median_us"] = json!(1e-300)
            }))?,
            "bench-gpus-2000.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["devices"] = json!((0..2000).collect::<Vec<_>>())
            }))?,
            "bench-name-escapes.json" => text(&edited(self.bench_h100().clone(), &|d| {
                d["host"] = json!("\u{1b}]0;owned\u{7}\u{1b}[2J");
                d["host_gpus"][0]["name"] = json!("H100\u{202e}\u{9b}31m");
            }))?,
            "prof-pcie2.json" => text(&self.tuned_pcie2().0)?,
            "exp-pcie2.json" => text(&self.tuned_pcie2().1)?,
            "prof-h100.json" => text(&self.tuned_h100().0)?,
            "exp-h100.json" => text(&self.tuned_h100().1)?,
            "prof-neg.json" => text(&self.first_hop("beta_gbps", json!(-26.0)))?,
            "prof-zero.json" => text(&self.first_hop("beta_gbps", json!(0.0)))?,
            "prof-alpha-neg.json" => text(&self.first_hop("alpha_us", json!(-3.0)))?,
            "prof-huge.json" => text(&self.first_hop("beta_gbps", json!(1e308)))?,
            "prof-nanstr.json" => text(&self.first_hop("beta_gbps", json!("NaN")))?,
            "prof-src99.json" => text(&self.first_hop("src", json!(99)))?,
            "prof-kind.json" => text(&self.first_hop("kind", json!("warp-drive")))?,
            "prof-nan-literal.json" => replace_number(
                &serde_json::to_string(&self.tuned_pcie2().0).unwrap(),
                "\"beta_gbps\"",
                "NaN",
            ),
            "prof-schema2.json" => text(&edited(self.tuned_pcie2().0.clone(), &|p| {
                p["schema"] = json!("peerlink.profile/2")
            }))?,
            "prof-nohops.json" => text(&edited(self.tuned_pcie2().0.clone(), &|p| {
                p["hops"] = json!([])
            }))?,
            "prof-trunc.json" => {
                let full = serde_json::to_vec(&self.tuned_pcie2().0).unwrap();
                full[..full.len() / 2].to_vec()
            }
            "prof-dup-key.json" => serde_json::to_string_pretty(&self.tuned_pcie2().0)
                .unwrap()
                .replacen("\"gpus\":", "\"gpus\": [],\n  \"gpus\":", 1)
                .into_bytes(),
            "prof-bom.json" => [
                b"\xEF\xBB\xBF".as_slice(),
                &serde_json::to_vec(&self.tuned_pcie2().0).unwrap(),
            ]
            .concat(),
            // peerlink doctor's fault presets, as they are, and all 18 NVLinks of a GPU down.
            fixture if fixture.starts_with("fixture-") => {
                std::fs::read(doctor_fixture(&fixture["fixture-".len()..])).unwrap()
            }
            "nvlinks-all-down.json" => {
                let base = std::fs::read_to_string(doctor_fixture("nvlink-down.json")).unwrap();
                text(&edited(serde_json::from_str(&base).unwrap(), &|p| {
                    p["faults"]["nvlinks_down"][0]["links"] = json!((0..18).collect::<Vec<_>>())
                }))?
            }
            other => panic!("the catalog names F/{other}, a file nobody makes: add it to files.rs"),
        })
    }

    fn bench_h100(&self) -> &Value {
        self.bench_h100.get_or_init(|| {
            peerlink_json(
                &[
                    "--sim",
                    "dgx-h100",
                    "bench",
                    "--tests",
                    "ce-write,h2d,local",
                ],
                &["--size", "64K"],
            )
        })
    }

    fn bench_pcie2(&self) -> &Value {
        self.bench_pcie2.get_or_init(|| {
            peerlink_json(
                &[
                    "--sim",
                    "pcie-2gpu-switch",
                    "bench",
                    "--tests",
                    "ce-write,h2d,local",
                ],
                &["--size", "64K"],
            )
        })
    }

    fn bench_sweep(&self) -> &Value {
        self.bench_sweep.get_or_init(|| {
            peerlink_json(
                &["--sim", "dgx-h100", "bench", "--tests", "ce-write"],
                &["--devices", "0,1", "--sizes", "4K..64K"],
            )
        })
    }

    fn topo(&self) -> &Value {
        self.topo
            .get_or_init(|| peerlink_json(&["--sim", "dgx-h100", "topo"], &[]))
    }

    /// `tune --quick` on `preset`: the profile and the exported preset.
    fn tuned(&self, preset: &str) -> (Value, Value) {
        let (profile, export) = (
            self.dir.join(format!("tuned-{preset}.json")),
            self.dir.join(format!("exported-{preset}.json")),
        );
        let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
            .args(["--sim", preset, "tune", "--quick", "--out"])
            .arg(&profile)
            .arg("--export-sim")
            .arg(&export)
            .output()
            .unwrap();
        assert!(out.status.success(), "tune on {preset}: {out:?}");
        let read = |p: &Path| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        (read(&profile), read(&export))
    }

    fn tuned_pcie2(&self) -> &(Value, Value) {
        self.tuned_pcie2
            .get_or_init(|| self.tuned("pcie-2gpu-switch"))
    }

    fn tuned_h100(&self) -> &(Value, Value) {
        self.tuned_h100.get_or_init(|| self.tuned("dgx-h100"))
    }

    /// The H100 bench document with its first figure replaced by `value`.
    fn bench_value(&self, value: Value) -> Value {
        edited(self.bench_h100().clone(), &|d| {
            d["tests"][0]["cells"][0]["value"] = value.clone()
        })
    }

    /// The PCIe profile with its first hop's `field` replaced by `value`.
    fn first_hop(&self, field: &str, value: Value) -> Value {
        edited(self.tuned_pcie2().0.clone(), &|p| {
            p["hops"][0][field] = value.clone()
        })
    }

    /// A bench document of a 1000-GPU host (999,000 ce-write figures), made from the PCIe one by
    /// repeating its first cell over every pair: measuring it would take hours.
    fn bench_of_1000_gpus(&self) -> Value {
        let gpus = 1000;
        edited(self.bench_pcie2().clone(), &|d| {
            let host_gpu = d["host_gpus"][0].clone();
            d["host_gpus"] = (0..gpus)
                .map(|i| {
                    let mut g = host_gpu.clone();
                    g["index"] = json!(i);
                    g["uuid"] = json!(format!("GPU-sim-1000-{i}"));
                    g
                })
                .collect();
            d["devices"] = json!((0..gpus).collect::<Vec<_>>());
            let mut test = d["tests"][0].clone();
            let cell = test["cells"][0].clone();
            test["matrix"] = json!([]);
            test["not_measured"] = json!([]);
            test["cells"] = (0..gpus)
                .flat_map(|src| {
                    (0..gpus)
                        .filter(move |&dst| dst != src)
                        .map(move |dst| (src, dst))
                })
                .map(|(src, dst)| {
                    let mut c = cell.clone();
                    c["src"] = json!(src);
                    c["dst"] = json!(dst);
                    c
                })
                .collect();
            d["tests"] = json!([test]);
        })
    }
}

/// A host of `n` GPUs on two NUMA nodes, no explicit links.
/// A hostile preset of issue 34's class 6 (tests/fixtures/hostile/).
fn hostile_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile")
        .join(name)
}

/// A fault preset of peerlink doctor's tests.
fn doctor_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

fn gpus(n: usize) -> Value {
    (0..n).map(|i| json!({ "numa_node": i % 2 })).collect()
}

fn edited(mut value: Value, edit: &dyn Fn(&mut Value)) -> Value {
    edit(&mut value);
    value
}

/// `text` with the number after the first `key` replaced by `literal` (which JSON has no word for:
/// NaN, 1e999).
fn replace_number(text: &str, key: &str, literal: &str) -> Vec<u8> {
    let at = text.find(key).expect("the key is there") + key.len();
    let colon = at + text[at..].find(':').unwrap() + 1;
    let end = colon + text[colon..].find([',', '}', '\n']).unwrap();
    format!("{} {literal}{}", &text[..colon], &text[end..]).into_bytes()
}

/// `len` bytes of a fixed pseudo-random sequence (xorshift), so that every run sees the same file.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Runs peerlink with `args`, `more` and `--json`, and returns its document.
fn peerlink_json(args: &[&str], more: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .args(more)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} {more:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

//! What `peerlink bench` found (the body of the `peerlink.bench/1` document,
//! [`crate::bench::document::BenchDocument`]).

use super::fit::Fit;
use super::stats::Stats;
use super::timing::Sampling;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The unit of a test's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Unit {
    /// 1e9 bytes per second.
    #[serde(rename = "GB/s")]
    Gbps,
    #[serde(rename = "us")]
    Micros,
    #[serde(rename = "ns")]
    Nanos,
}

impl Unit {
    /// How documents write the unit: `GB/s`, `us`, `ns`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Gbps => "GB/s",
            Unit::Micros => "us",
            Unit::Nanos => "ns",
        }
    }

    /// How text tables show it.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Gbps => "GB/s",
            Unit::Micros => "µs",
            Unit::Nanos => "ns",
        }
    }
}

/// Whether a test's figures are per ordered pair of GPUs or per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Matrix,
    PerDevice,
}

/// Where a figure belongs: an ordered pair (matrix tests) or one GPU (per-device tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Place {
    Pair { src: usize, dst: usize },
    Device { device: usize },
}

impl std::fmt::Display for Place {
    /// How reports name a place: `0→1` for a pair, `GPU 0` for a device.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Pair { src, dst } => write!(f, "{src}→{dst}"),
            Place::Device { device } => write!(f, "GPU {device}"),
        }
    }
}

impl Place {
    /// The (source, destination) of a place; a device is its own pair.
    pub fn pair(self) -> (usize, usize) {
        match self {
            Place::Pair { src, dst } => (src, dst),
            Place::Device { device } => (device, device),
        }
    }
}

/// One measured figure with the spread behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cell {
    #[serde(flatten)]
    pub place: Place,
    /// The figure, in the test's unit (from the median time).
    pub value: f64,
    /// Bidirectional and fan tests: all directions together, in the test's unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// The per-operation time across samples, in µs, that the figure comes from.
    pub time_us: Stats,
}

/// A figure that was not measured, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotMeasured {
    #[serde(flatten)]
    pub place: Place,
    pub reason: String,
}

/// One test's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TestResult {
    pub name: String,
    pub unit: Unit,
    /// Bytes per message (operation) the figures are for.
    pub size_bytes: u64,
    /// What the number is: read or write, which context issued it, one direction or both, GPU or CPU
    /// time.
    pub measures: String,
    /// N×N over the host's GPUs (row = source), `null` where not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matrix: Option<Vec<Vec<Option<f64>>>>,
    /// Bidirectional tests: both directions of the pair together (symmetric).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_matrix: Option<Vec<Vec<Option<f64>>>>,
    /// One entry per host GPU, `null` where not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<f64>>>,
    pub cells: Vec<Cell>,
    pub not_measured: Vec<NotMeasured>,
    pub notes: Vec<String>,
    /// Seconds the test took on the backend's host clock (virtual on the simulator), filling and
    /// checking the messages included: what extrapolates a run to more GPUs
    /// ([`crate::bench::budget`]). Absent (0 when read) from documents written before it existed.
    #[serde(default)]
    pub wall_s: f64,
}

/// `figure` of each pair's cell, in an N×N matrix over `devices` host GPUs (row = source).
fn laid_out(
    devices: usize,
    cells: &[Cell],
    figure: impl Fn(&Cell) -> Option<f64>,
) -> Vec<Vec<Option<f64>>> {
    let mut m = vec![vec![None; devices]; devices];
    for cell in cells {
        if let Place::Pair { src, dst } = cell.place {
            m[src][dst] = figure(cell);
        }
    }
    m
}

/// What a test is, independent of what it found.
#[derive(Clone, Debug, PartialEq)]
pub struct TestInfo {
    pub name: String,
    pub unit: Unit,
    pub shape: Shape,
    pub size_bytes: u64,
    pub measures: String,
}

impl TestResult {
    /// Lays `cells` out as a matrix or a list over `devices` host GPUs.
    pub fn new(
        info: TestInfo,
        devices: usize,
        cells: Vec<Cell>,
        not_measured: Vec<NotMeasured>,
    ) -> TestResult {
        let (mut matrix, mut total_matrix, mut values) = (None, None, None);
        match info.shape {
            Shape::Matrix => {
                matrix = Some(laid_out(devices, &cells, |c| Some(c.value)));
                // Only bidirectional tests have totals: a second N×N matrix is made for them alone.
                if cells.iter().any(|c| c.total.is_some()) {
                    total_matrix = Some(laid_out(devices, &cells, |c| c.total));
                }
            }
            Shape::PerDevice => {
                let mut v = vec![None; devices];
                for cell in &cells {
                    if let Place::Device { device } = cell.place {
                        v[device] = Some(cell.value);
                    }
                }
                values = Some(v);
            }
        }
        TestResult {
            name: info.name,
            unit: info.unit,
            size_bytes: info.size_bytes,
            measures: info.measures,
            matrix,
            total_matrix,
            values,
            cells,
            not_measured,
            notes: Vec::new(),
            wall_s: 0.0,
        }
    }

    /// The measured figure at a place, if any.
    pub fn cell(&self, place: Place) -> Option<&Cell> {
        self.cells.iter().find(|c| c.place == place)
    }

    /// Why a place has no figure, if it was left out.
    pub fn reason(&self, place: Place) -> Option<&str> {
        self.not_measured
            .iter()
            .find(|n| n.place == place)
            .map(|n| n.reason.as_str())
    }
}

/// One point of a message-size sweep.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepPoint {
    pub bytes: u64,
    /// Median GPU time of one message, µs.
    pub median_us: f64,
    /// 99th percentile of it across samples, µs.
    pub p99_us: f64,
    /// GB/s from the median.
    pub gbps: f64,
}

/// A message-size sweep of one test on one pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sweep {
    pub test: String,
    pub src: usize,
    pub dst: usize,
    pub measures: String,
    pub points: Vec<SweepPoint>,
    /// time = α + bytes/β over the points; `null` when it cannot be fitted (or nothing was measured).
    pub fit: Option<Fit>,
    /// Set when the pair was not measured, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
}

/// Everything `peerlink bench` found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BenchReport {
    /// GPUs measured (CUDA indices).
    pub devices: Vec<usize>,
    /// How many operations and samples each figure took.
    pub timing: Sampling,
    pub notes: Vec<String>,
    pub tests: Vec<TestResult>,
    pub sweeps: Vec<Sweep>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_written_by_their_names() {
        for unit in [Unit::Gbps, Unit::Micros, Unit::Nanos] {
            let json = serde_json::to_value(unit).unwrap();
            assert_eq!(json, unit.name());
            assert_eq!(serde_json::from_value::<Unit>(json).unwrap(), unit);
        }
    }
}

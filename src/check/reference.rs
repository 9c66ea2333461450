//! The reference figures `peerlink check` compares with when it is given no baseline: what a
//! healthy GPU of a known kind gives in each test check runs, each figure with where it comes
//! from. `docs/reference.md` ("Reference figures for `peerlink check`") lists the same.
//!
//! Published figures come from other machines and tools, so they catch a gross fault (a link
//! down, a PCIe link trained below its width) more than a drift of a few percent; a baseline of
//! the host itself, taken when it was healthy, is the sharper check.

use crate::topology::Link;

/// What a healthy GPU of one kind gives in check's tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reference {
    /// The GPU as people name it.
    pub gpu: &'static str,
    /// Device names, as the driver reports them, the figures hold for: a name, or a prefix ending
    /// in `*`.
    names: &'static [&'static str],
    /// The link between two such GPUs that the pair figures hold for.
    pub link: Link,
    pub figures: &'static [ReferenceFigure],
}

/// One reference figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReferenceFigure {
    /// The bench test (`ce-write`), in its unit.
    pub test: &'static str,
    /// Bytes per message check measures at: the test's plateau size (or a latency test's own).
    pub size_bytes: u64,
    pub value: f64,
    /// Where the figure comes from.
    pub source: &'static str,
}

/// peerlink's own figures on the lent pair of H200s (three default `bench` processes).
const H200_SOURCE: &str =
    "measured by peerlink cd1d4b6 on two H200s with 18 NVLinks between them (a \
     VM, driver 580.159.04), 2026-11-30: the median of both GPUs or directions over three \
     processes (benchmarks/h200-x2/bench.json, bench-2.json, bench-3.json)";

/// Every GPU peerlink ships reference figures for.
pub const REFERENCES: &[Reference] = &[
    Reference {
        gpu: "NVIDIA H200 (SXM)",
        names: &["NVIDIA H200"],
        link: Link::NvLink(18),
        figures: &[
            ReferenceFigure {
                test: "ce-write",
                size_bytes: 512 << 20,
                value: 396.43,
                source: H200_SOURCE,
            },
            ReferenceFigure {
                test: "h2d",
                size_bytes: 64 << 20,
                value: 55.31,
                source: H200_SOURCE,
            },
            ReferenceFigure {
                test: "d2h",
                size_bytes: 64 << 20,
                value: 55.21,
                source: H200_SOURCE,
            },
            ReferenceFigure {
                test: "local",
                size_bytes: 1 << 30,
                value: 2132.85,
                source: H200_SOURCE,
            },
            ReferenceFigure {
                test: "copy-latency",
                size_bytes: 4,
                value: 2.224,
                source: H200_SOURCE,
            },
        ],
    },
    Reference {
        gpu: "NVIDIA H100 SXM",
        names: &["NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM*"],
        link: Link::NvLink(18),
        figures: &[
            ReferenceFigure {
                test: "ce-write",
                size_bytes: 512 << 20,
                value: 397.5,
                source: "nvbandwidth v0.10, device_to_device_memcpy_write_ce, one pair of an \
                         8×H100 HGX (NV18 through NVSwitch), at its 512 MiB default; docs/reference.md",
            },
            ReferenceFigure {
                test: "h2d",
                size_bytes: 64 << 20,
                value: 55.4,
                source: "nvbandwidth host_to_device_memcpy_ce over PCIe Gen5 x16; docs/reference.md",
            },
            ReferenceFigure {
                test: "d2h",
                size_bytes: 64 << 20,
                value: 55.4,
                source: "nvbandwidth device_to_host_memcpy_ce over PCIe Gen5 x16 (host↔device \
                         55.4 GB/s); docs/reference.md",
            },
        ],
    },
    Reference {
        gpu: "NVIDIA A100 SXM",
        names: &["NVIDIA A100-SXM*"],
        link: Link::NvLink(12),
        figures: &[ReferenceFigure {
            test: "ce-write",
            size_bytes: 512 << 20,
            value: 274.0,
            source: "p2pBandwidthLatencyTest (CUDA samples), unidirectional P2P writes between 8 \
                     A100-SXM4-80GB with NV12 between every pair: the median of the 56 ordered \
                     pairs, 265.1–275.5 GB/s (github.com/LLMServe/DistServe issue 3, 2024-06-11); \
                     the sample copies 40 MB, where a copy runs about 2% below its plateau, so a \
                     healthy pair measured at 512 MiB comes out at or above it",
        }],
    },
];

impl Reference {
    /// Whether a device the driver names `name` is this kind of GPU.
    pub fn holds_for(&self, name: &str) -> bool {
        self.names.iter().any(|n| match n.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *n,
        })
    }

    /// This GPU's figure for `test`, if it has one.
    pub fn figure(&self, test: &str) -> Option<&'static ReferenceFigure> {
        self.figures.iter().find(|f| f.test == test)
    }
}

/// The reference figures for a device the driver names `name`, if peerlink ships some.
pub fn for_gpu(name: &str) -> Option<&'static Reference> {
    REFERENCES.iter().find(|r| r.holds_for(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{plateau_bytes, CHECKED};

    #[test]
    fn names_the_driver_reports_find_their_gpu_and_no_other() {
        let gpu = |name| for_gpu(name).map(|r| r.gpu);
        assert_eq!(gpu("NVIDIA H200"), Some("NVIDIA H200 (SXM)"));
        assert_eq!(gpu("NVIDIA H100 80GB HBM3"), Some("NVIDIA H100 SXM"));
        assert_eq!(gpu("NVIDIA A100-SXM4-80GB"), Some("NVIDIA A100 SXM"));
        assert_eq!(gpu("NVIDIA A100-SXM4-40GB"), Some("NVIDIA A100 SXM"));
        // PCIe and NVL boards have other links and other figures.
        for other in [
            "NVIDIA H200 NVL",
            "NVIDIA H100 PCIe",
            "NVIDIA H100 NVL",
            "NVIDIA A100 80GB PCIe",
            "Tesla V100-SXM2-16GB",
            "NVIDIA RTX A6000",
        ] {
            assert_eq!(gpu(other), None, "{other}");
        }
    }

    #[test]
    fn every_figure_is_of_a_checked_test_at_the_size_check_measures_it() {
        for reference in REFERENCES {
            for figure in reference.figures {
                assert!(
                    CHECKED.iter().any(|c| c.test == figure.test),
                    "{}: {} is not checked",
                    reference.gpu,
                    figure.test
                );
                assert_eq!(
                    Some(figure.size_bytes),
                    plateau_bytes(figure.test),
                    "{} {}",
                    reference.gpu,
                    figure.test
                );
                assert!(figure.value > 0.0 && !figure.source.is_empty());
            }
        }
    }
}

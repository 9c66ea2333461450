//! The framework's pure parts: sizes, counts, bandwidths, the comparison with NCCL.

use super::kinds::{Contender, IssueChoice, IssueMode};
use super::resources::{ids, streams_on};
use super::rows::{busbw, row, Measured, Row};
use super::settings::{default_iters, default_sizes, prime_ops, Counts, PRIME_OPS};
use super::timing::{measure, Operation};
use super::*;
use crate::backend::StreamId;
use crate::Error;

#[test]
fn default_sizes_run_from_4_bytes_to_1_gib_in_steps_of_4() {
    let sizes = default_sizes();
    assert_eq!(sizes.first(), Some(&4));
    assert_eq!(sizes.last(), Some(&(1 << 30)));
    assert_eq!(sizes.len(), 15);
    assert!(sizes.windows(2).all(|w| w[1] == 4 * w[0]));
}

#[test]
fn iterations_fall_at_large_sizes_but_never_below_5() {
    assert_eq!(default_iters(4), 20);
    assert_eq!(default_iters(64 << 20), 20);
    assert_eq!(default_iters(256 << 20), 5);
    assert_eq!(default_iters(128 << 20), 10);
    assert_eq!(default_iters(1 << 30), 5);
}

#[test]
fn small_operations_prime_with_more_on_gpus_and_once_on_the_simulator() {
    assert_eq!(prime_ops(4, false), PRIME_OPS);
    assert_eq!(prime_ops(16 << 20, false), 16);
    assert_eq!(prime_ops(1 << 30, false), 1);
    assert_eq!(prime_ops(4, true), 1);
}

#[test]
fn busbw_scales_all_reduce_by_2_n_minus_1_over_n_and_nothing_else() {
    assert_eq!(busbw(Workload::AllReduce, 100.0, 2), 100.0);
    assert_eq!(busbw(Workload::AllReduce, 100.0, 8), 175.0);
    assert_eq!(busbw(Workload::AllReduce, 100.0, 4), 150.0);
    for w in [Workload::SendRecv, Workload::Pipeline, Workload::Halo] {
        assert_eq!(busbw(w, 100.0, 8), 100.0);
    }
}

#[test]
fn workloads_and_issue_modes_parse_by_name_and_say_what_exists() {
    for w in Workload::ALL {
        assert_eq!(Workload::parse(w.name()).unwrap(), w);
    }
    let err = Workload::parse("all-gather").unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string()
            .contains("all-reduce, send-recv, pipeline, halo"),
        "{err}"
    );
    assert_eq!(IssueChoice::parse("both").unwrap().modes().len(), 2);
    assert!(IssueChoice::parse("threads").is_err());
}

fn measured(contender: Contender, bytes: u64, time_us: f64) -> Row {
    let m = Measured {
        variant: None,
        bytes,
        contender,
        algorithm: "x".into(),
        issue: IssueMode::Stream,
        iters: 1,
        time_us,
    };
    row(Workload::AllReduce, 2, true, None, m)
}

#[test]
fn peerlink_rows_are_compared_with_the_fastest_nccl_row_of_their_size() {
    let mut rows = vec![
        measured(Contender::Peerlink, 4, 5.0),
        measured(Contender::PeerlinkPick, 4, 5.0),
        measured(Contender::Nccl, 4, 20.0),
        measured(Contender::Nccl, 4, 10.0),
        measured(Contender::Peerlink, 64, 8.0),
    ];
    compare(&mut rows);
    assert_eq!(rows[0].vs_nccl, Some(2.0));
    assert_eq!(rows[1].vs_nccl, Some(2.0));
    assert_eq!(rows[2].vs_nccl, None);
    // No NCCL row at 64 bytes: nothing to compare with.
    assert_eq!(rows[4].vs_nccl, None);
    // 4 bytes in 5 µs.
    assert!((rows[0].algbw_gbps - 4.0 / 5.0 / 1e3).abs() < 1e-12);
}

#[test]
fn peerlink_rows_name_which_nccl_they_are_compared_with() {
    let mut rows = vec![
        measured(Contender::Peerlink, 4, 5.0),
        measured(Contender::Nccl, 4, 20.0),
        measured(Contender::NcclSymmetric, 4, 7.5),
        measured(Contender::Peerlink, 64, 8.0),
        measured(Contender::Nccl, 64, 16.0),
    ];
    compare(&mut rows);
    assert_eq!(rows[0].vs_nccl, Some(4.0));
    assert_eq!(rows[0].vs_nccl_symmetric, Some(1.5));
    // NCCL's own rows are compared with nothing.
    assert_eq!((rows[2].vs_nccl, rows[2].vs_nccl_symmetric), (None, None));
    // No symmetric row at 64 bytes: the plain comparison alone.
    assert_eq!(
        (rows[3].vs_nccl, rows[3].vs_nccl_symmetric),
        (Some(2.0), None)
    );
    assert!(!Contender::NcclSymmetric.is_peerlink());
    assert_eq!(
        Contender::NcclSymmetric.to_string(),
        "NCCL (symmetric windows)"
    );
    assert_eq!(
        serde_json::to_value(Contender::NcclSymmetric).unwrap(),
        "nccl-symmetric"
    );
}

/// A copy of `len` bytes from GPU 0's buffer to GPU 1's on rank 0's stream, or, broken, nothing.
struct Copy {
    backend: std::sync::Arc<dyn Backend>,
    stream: StreamId,
    copy: crate::backend::BufferCopy,
    broken: bool,
}

impl Operation for Copy {
    fn queue(&mut self, _step: u64) -> Result<()> {
        if self.broken {
            return Ok(());
        }
        let method = crate::backend::CopyMethod::CopyEngine;
        self.backend.copy(self.stream, method, &self.copy)
    }
}

#[test]
fn an_operation_that_does_not_deliver_its_bytes_fails_verification() {
    use crate::backend::{sim::SimBackend, BufferCopy, Memory};
    let backend: std::sync::Arc<dyn Backend> =
        std::sync::Arc::new(SimBackend::open("pcie-2gpu-switch").unwrap());
    let b = backend.as_ref();
    b.enable_peer_access(0, 1).unwrap();
    let streams = streams_on(b, &[0, 1]).unwrap();
    let (src, dst) = (
        b.alloc(Memory::Device(0), 4096).unwrap(),
        b.alloc(Memory::Device(1), 4096).unwrap(),
    );
    let data = crate::pattern::bytes(7, 4096);
    b.write(src, 0, &data).unwrap();
    let counts = Counts {
        prime: 1,
        warmup: 1,
        iters: 3,
    };
    for (broken, issue) in [
        (false, IssueMode::Stream),
        (false, IssueMode::Graphs),
        (true, IssueMode::Stream),
        (true, IssueMode::Graphs),
    ] {
        let mut op = Copy {
            backend: backend.clone(),
            stream: *streams[0],
            copy: BufferCopy::from_start(src, dst, 4096),
            broken,
        };
        let result = measure(
            b,
            &ids(&streams),
            issue,
            counts,
            &mut op,
            || b.write(dst, 0, &data.iter().map(|x| !x).collect::<Vec<u8>>()),
            || {
                let mut found = vec![0; 4096];
                b.read(dst, 0, &mut found)?;
                Error::check_bytes("copy", 0, 1, &data, &found)
            },
        );
        match result {
            Ok(us) => {
                assert!(!broken, "{issue:?}: the broken copy passed");
                // One 4 KiB copy at a time over PCIe: a few µs each, whoever issues it.
                assert!(us > 1.0 && us < 50.0, "{issue:?}: {us}");
            }
            Err(e) => {
                assert!(broken, "{issue:?}: {e}");
                assert!(matches!(e, Error::Verification { .. }), "{e}");
            }
        }
    }
}

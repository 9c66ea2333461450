//! The workloads on real GPUs (part of the `gpu` test binary): every workload over every GPU (two at
//! least) at a few sizes, in both issue modes, every row verified; the rows are printed so that a
//! run shows peerlink beside NCCL. NCCL's rows are required where the library is found. On a host
//! with one GPU each test says so in one line and passes, as the other multi-GPU tests do.

use peerlink::backend::cuda::CudaBackend;
use peerlink::backend::Backend;
use peerlink::bench::progress::Silent;
use peerlink::workload;
use peerlink::workload::kinds::{Contender, IssueChoice, Workload};
use peerlink::workload::settings::Options;
use std::sync::Arc;

/// The GPUs; `None`, said on stderr, where the host has fewer than the two the workloads need.
fn backend() -> Option<Arc<dyn Backend>> {
    let backend = CudaBackend::open().unwrap_or_else(|e| panic!("this test needs a GPU: {e}"));
    let gpus = backend.topology().devices.len();
    if gpus < 2 {
        eprintln!("skipped: the workloads need two GPUs, this host has {gpus}");
        return None;
    }
    Some(Arc::new(backend))
}

fn run(workload: Workload, sizes: &[u64]) {
    let Some(backend) = backend() else {
        return;
    };
    let options = Options {
        sizes: Some(sizes.to_vec()),
        iters: Some(10),
        issue: IssueChoice::Both,
        ..Options::default()
    };
    let report = workload::run(&backend, workload, &options, &Silent).unwrap();
    for notice in &report.notices {
        eprintln!("{workload} note: {notice}");
    }
    for r in &report.rows {
        eprintln!(
            "{workload} {:>5} {:>10} {:<24} {:<40} {:<7} {:>10.2} µs {:>8.2} GB/s busbw {:>8.2} vs NCCL {} vs NCCL symm. {}",
            r.variant.map_or("", |v| v.name()),
            r.bytes,
            r.contender.to_string(),
            r.algorithm,
            r.issue.name(),
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.vs_nccl.map_or("—".into(), |v| format!("{v:.2}×")),
            r.vs_nccl_symmetric
                .map_or("—".into(), |v| format!("{v:.2}×"))
        );
        assert!(r.verified && !r.simulated, "{r:?}");
        assert!(r.time_us > 0.0 && r.time_us.is_finite(), "{r:?}");
    }
    let has = |c: Contender| report.rows.iter().any(|r| r.contender == c);
    assert!(
        has(Contender::Peerlink),
        "no peerlink rows: {:?}",
        report.notices
    );
    if let Ok(nccl) = backend.collectives().nccl() {
        assert!(has(Contender::Nccl), "NCCL was found but has no rows");
        if workload == Workload::AllReduce && nccl.symmetric_windows().is_ok() {
            assert!(
                has(Contender::NcclSymmetric),
                "NCCL has symmetric windows but NCCL (symmetric windows) has no rows"
            );
        }
    }
}

const SIZES: [u64; 4] = [4, 64 << 10, 16 << 20, 256 << 20];

#[test]
#[ignore = "needs a GPU"]
fn all_reduce_kernels_and_nccl_verify_every_byte() {
    run(Workload::AllReduce, &SIZES);
}

#[test]
#[ignore = "needs a GPU"]
fn send_recv_engine_and_nccl_verify_every_byte() {
    run(Workload::SendRecv, &SIZES);
}

#[test]
#[ignore = "needs a GPU"]
fn pipeline_hand_overs_verify_every_byte() {
    run(Workload::Pipeline, &SIZES);
}

#[test]
#[ignore = "needs a GPU"]
fn halo_exchanges_verify_every_byte() {
    run(Workload::Halo, &[4, 4 << 10, 64 << 10]);
}

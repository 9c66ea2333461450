//! PEERLINK_NCCL_SERVE=auto with a measurement (PEERLINK_NCCL_TABLE): calls at sizes where the
//! measurement saw peerlink beat NCCL's best are served, the others forwarded; on the simulator,
//! through the C API, every element checked either way. A communicator whose ranks the
//! measurement did not measure (another count, or processes where it measured one) is forwarded, and so is one of one rank. (`all` is tests/serve.rs; `none` is
//! tests/serve_none.rs: the switches are read once per process.)

mod standin;

use standin::ranks::{on_ranks, stream_of, sum_f32};

/// A workload document of 2 GPUs in one process where peerlink's pick won at 4 KiB and lost at
/// 1 MiB to NCCL with symmetric windows (plain NCCL slower at both).
fn table() -> tempfile::NamedTempFile {
    let row = |contender: &str, bytes: u64, us: f64| {
        format!(
            r#"{{"workload":"all-reduce","contender":"{contender}","bytes":{bytes},"time_us":{us},"dtype":"f32","verified":true}}"#
        )
    };
    let rows = [
        row("peerlink-pick", 4096, 4.0),
        row("nccl", 4096, 9.0),
        row("peerlink-pick", 1 << 20, 30.0),
        row("nccl", 1 << 20, 40.0),
        row("nccl-symmetric", 1 << 20, 20.0),
    ]
    .join(",");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!(r#"{{"schema":"peerlink.workload/1","devices":[0,1],"process_layout":"one-process","rows":[{rows}]}}"#),
    )
    .unwrap();
    file
}

#[test]
fn auto_serves_where_the_measurement_saw_peerlink_win_and_forwards_the_rest() {
    let table = table();
    standin::install("auto", Some(table.path().to_str().unwrap()));
    on_ranks(2, |rank, comm| {
        // 1023 f32 (≤ 4 KiB): served; 100 000 f32 (≤ 1 MiB): NCCL with symmetric windows won.
        for (count, served) in [(1023, true), (100_000, false)] {
            let before = standin::count_of_this_thread("ncclAllReduce");
            let (code, reduce, buffers) = sum_f32(rank, comm, count, stream_of(rank));
            assert_eq!(code, 0);
            reduce.check(buffers.1, rank, stream_of(rank), &[0, 1]);
            let forwarded = standin::count_of_this_thread("ncclAllReduce") - before;
            assert_eq!(forwarded, usize::from(!served), "{count} elements");
        }
    });
    // Four ranks: the measurement of two says nothing of them, even at a size it saw won.
    on_ranks(4, |rank, comm| {
        let (code, reduce, buffers) = sum_f32(rank, comm, 1023, stream_of(rank));
        assert_eq!(code, 0);
        reduce.check(buffers.1, rank, stream_of(rank), &[0, 1, 2, 3]);
        assert_eq!(
            standin::count_of_this_thread("ncclAllReduce"),
            1,
            "forwarded"
        );
    });
    // One rank: NCCL's call is a copy, which peerlink's kernel cannot beat.
    on_ranks(1, |rank, comm| {
        let (code, reduce, buffers) = sum_f32(rank, comm, 1023, stream_of(rank));
        assert_eq!(code, 0);
        reduce.check(buffers.1, rank, stream_of(rank), &[0]);
        assert_eq!(
            standin::count_of_this_thread("ncclAllReduce"),
            1,
            "forwarded"
        );
    });
}

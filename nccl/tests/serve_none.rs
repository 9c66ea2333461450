//! PEERLINK_NCCL_SERVE=none: every all-reduce goes to NCCL (the stand-in), none is set up, and
//! the results are NCCL's (the stand-in's), every element checked.

mod standin;

use standin::ranks::{on_ranks, stream_of, Reduce, BF16, F32, SUM};

#[test]
fn none_forwards_every_all_reduce_and_sets_nothing_up() {
    standin::install("none", None);
    on_ranks(2, |rank, comm| {
        for dtype in [F32, BF16] {
            let reduce = Reduce {
                dtype,
                op: SUM,
                count: 1023,
                in_place: true,
            };
            let buffers = reduce.buffers(rank, rank);
            assert_eq!(reduce.call(buffers, comm, stream_of(rank)), 0);
            reduce.check(buffers.1, rank, stream_of(rank), &[0, 1]);
        }
        assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 2);
        assert_eq!(standin::count_of_this_thread("ncclAllGather"), 0);
    });
}

//! The all-reduce across ranks that are threads of one process, on the simulator: memory another
//! library allocated, adopted as symmetric memory, is summed in place; one rank runs each
//! kernel; a graph captured before the buffers a call copies aside into grow still replays; and
//! a sum out of place leaves its input alone.

use super::{GroupAllReduce, LocalAllReduce, LocalRank, ThreadMeeting, ThreadRanks};
use crate::backend::collective::{AllReduceKernel, BufferRange, DataType, Reduction};
use crate::backend::sim::SimBackend;
use crate::backend::{Backend, Memory, StreamId};
use crate::model::CostModel;
use std::sync::Arc;

const RANKS: usize = 4;

/// Fills `input` (`len` bytes of f32) with `rank + 1`, sums it over every rank into `range` (the
/// same range: in place) by the cost model's pick and checks every element; an input elsewhere
/// is checked left as it was. The kernel picked.
fn sum_checked(
    backend: &dyn Backend,
    reduce: &mut GroupAllReduce<ThreadRanks>,
    (input, range): (BufferRange, BufferRange),
    (rank, stream): (usize, StreamId),
) -> AllReduceKernel {
    let mine = (rank as f32 + 1.0).to_le_bytes().repeat(range.len / 4);
    backend.write(input.buffer, input.offset, &mine).unwrap();
    let kernel = reduce
        .all_reduce_from(input, range, stream, DataType::F32, Reduction::Sum)
        .unwrap();
    backend.synchronize(stream).unwrap();
    let mut got = vec![0; range.len];
    backend.read(range.buffer, range.offset, &mut got).unwrap();
    let sum: f32 = (1..=RANKS).map(|r| r as f32).sum();
    let len = range.len;
    assert!(
        got.chunks(4).all(|e| e == sum.to_le_bytes()),
        "rank {rank}, {len} B"
    );
    if input != range {
        backend.read(input.buffer, input.offset, &mut got).unwrap();
        assert!(
            got == mine,
            "rank {rank}, {len} B: the input is left as it was"
        );
    }
    kernel
}

/// Runs `each` on every one of `RANKS` thread ranks at once, each with its all-reduce joined (the
/// cost model from the topology) and a stream of its GPU, both let go after it.
fn on_thread_ranks(
    each: impl Fn(&dyn Backend, &mut GroupAllReduce<ThreadRanks>, usize, StreamId) + Sync,
) {
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::open("dgx-h100").unwrap());
    let gpus: Vec<usize> = (0..RANKS).collect();
    let meeting = ThreadMeeting::new(&gpus);
    std::thread::scope(|scope| {
        for rank in 0..RANKS {
            let (backend, meeting, each) = (backend.clone(), meeting.clone(), &each);
            scope.spawn(move || {
                let b = backend.as_ref();
                let model = CostModel::from_topology(b.topology());
                let ranks = ThreadRanks::new(meeting, rank);
                let mut reduce = GroupAllReduce::join(backend.clone(), ranks, model).unwrap();
                let stream = b.create_stream(rank).unwrap();
                each(b, &mut reduce, rank, stream);
                drop(reduce);
                b.destroy_stream(stream).unwrap();
            });
        }
    });
}

#[test]
fn memory_another_library_allocated_is_adopted_as_symmetric_and_summed_in_place() {
    let len = 16 << 20;
    on_thread_ranks(|b, reduce, rank, stream| {
        // Another library's memory, lent by its address.
        let theirs = b.alloc(Memory::Device(rank), len).unwrap();
        let address = b.sharing().device_address(theirs).unwrap();
        let whole = |buffer| BufferRange {
            buffer,
            offset: 0,
            len,
        };
        // Summed in other memory, 16 MiB goes through the shared buffers (1 MiB so far),
        // which would grow for it.
        let plain = b.borrow_memory(rank, address, len).unwrap();
        assert!(!reduce.queues_only(whole(plain), stream));

        assert!(reduce.symmetric_range(address, len).is_none());
        let adopted = reduce.adopt_symmetric(address, len).unwrap();
        let inside = reduce.symmetric_range(address + 4096, 64).unwrap();
        assert_eq!((inside.buffer, inside.offset), (adopted, 4096));
        // Adopted, it is summed where it lies: two-shot copies nothing.
        assert!(reduce.queues_only(whole(adopted), stream));
        sum_checked(b, reduce, (whole(adopted), whole(adopted)), (rank, stream));
        let part = BufferRange {
            buffer: adopted,
            offset: 4096,
            len: 4 * 1001,
        };
        sum_checked(b, reduce, (part, part), (rank, stream));

        reduce.release_symmetric(adopted).unwrap();
        assert!(reduce.symmetric_range(address, len).is_none());
        assert!(reduce.release_symmetric(adopted).is_err());
        b.free(plain).unwrap();
        b.free(theirs).unwrap();
    });
}

#[test]
fn one_rank_runs_each_kernel_alone_and_its_sum_is_its_input() {
    use crate::backend::collective::AllReduceKernel::{OneShot, OneShotPackets, TwoShot};
    use crate::backend::{BufferCopy, CopyMethod};
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::open("dgx-h100").unwrap());
    let b = backend.as_ref();
    let model = CostModel::from_topology(b.topology());
    let ranks = ThreadRanks::new(ThreadMeeting::new(&[2]), 0);
    let mut reduce = GroupAllReduce::join(backend.clone(), ranks, model).unwrap();
    let stream = b.create_stream(2).unwrap();
    let timed = |queue: &mut dyn FnMut()| {
        let start = b.record(stream).unwrap();
        queue();
        let end = b.record(stream).unwrap();
        b.synchronize(stream).unwrap();
        b.elapsed_us(start, end).unwrap()
    };
    let len = 64 << 20;
    let theirs = b.alloc(Memory::Device(2), len).unwrap();
    let aside = b.alloc(Memory::Device(2), len).unwrap();
    let copy_us = timed(&mut || {
        let copy = BufferCopy::from_start(theirs, aside, len);
        b.copy(stream, CopyMethod::CopyEngine, &copy).unwrap();
    });
    // Adopted as symmetric memory, two-shot copies nothing and one-shot its input aside: what
    // they take beyond that is the kernel's own reading and writing.
    let address = b.sharing().device_address(theirs).unwrap();
    let adopted = reduce.adopt_symmetric(address, len).unwrap();
    for (kernel, len, copies) in [
        (OneShotPackets, 4 * 1001, 0.0),
        (OneShot, len, 1.0),
        (TwoShot, len, 0.0),
    ] {
        let mine: Vec<u8> = (0..len / 4)
            .flat_map(|e| (e as f32).to_le_bytes())
            .collect();
        b.write(adopted, 0, &mine).unwrap();
        let range = BufferRange {
            buffer: adopted,
            offset: 0,
            len,
        };
        let took = timed(&mut || {
            let op = Reduction::Average;
            reduce
                .all_reduce_by(kernel, range, stream, DataType::F32, op)
                .unwrap();
        });
        let mut got = vec![0; len];
        b.read(adopted, 0, &mut got).unwrap();
        assert!(got == mine, "{kernel:?}: one rank's average is its input");
        if len == 64 << 20 {
            // The kernel ran: it read and wrote the bytes (at least half a copy's time).
            assert!(
                took >= (copies + 0.5) * copy_us,
                "{kernel:?}: {took} µs, a copy {copy_us} µs"
            );
        }
    }
    let picked = reduce.all_reduce(
        BufferRange {
            buffer: aside,
            offset: 0,
            len: 4096,
        },
        stream,
        DataType::F32,
        Reduction::Sum,
    );
    assert_eq!(picked.unwrap(), OneShotPackets);
    b.synchronize(stream).unwrap();
    reduce.release_symmetric(adopted).unwrap();
    drop(reduce);
    b.free(theirs).unwrap();
    b.free(aside).unwrap();
    b.destroy_stream(stream).unwrap();
}

#[test]
fn a_call_in_place_captured_before_the_scratch_grows_still_sums_when_replayed() {
    use crate::backend::collective::AllReduceKernel::OneShot;
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::open("dgx-h100").unwrap());
    let b = backend.as_ref();
    let gpus = [0, 1];
    let model = CostModel::from_topology(b.topology());
    let mut reduce = LocalAllReduce::new(backend.clone(), model, &gpus);
    let streams: Vec<StreamId> = gpus.iter().map(|&g| b.create_stream(g).unwrap()).collect();
    // One-shot in place copies each input aside into the GPU's scratch buffer first.
    let in_place = |len: usize| -> Vec<LocalRank> {
        (gpus.iter().zip(&streams))
            .map(|(&device, &stream)| {
                let buffer = b.alloc(Memory::Device(device), len).unwrap();
                let mine = (device as f32 + 1.0).to_le_bytes().repeat(len / 4);
                b.write(buffer, 0, &mine).unwrap();
                LocalRank {
                    device,
                    stream,
                    input: buffer,
                    output: buffer,
                }
            })
            .collect()
    };
    let sum_by_one_shot = |reduce: &mut LocalAllReduce, ranks: &[LocalRank], len| {
        let (dtype, op) = (DataType::F32, Reduction::Sum);
        reduce
            .all_reduce_by(OneShot, ranks, len, dtype, op)
            .unwrap();
    };
    // Each element after `sums` sums in place from inputs of 1 and 2: 3, then doubled each time.
    let check = |ranks: &[LocalRank], len: usize, sums: i32| {
        for rank in ranks {
            b.synchronize(rank.stream).unwrap();
            let mut got = vec![0; len];
            b.read(rank.output, 0, &mut got).unwrap();
            let want = (3.0 * 2f32.powi(sums - 1)).to_le_bytes();
            assert!(got.chunks(4).all(|e| e == want), "after {sums} sums");
        }
    };
    let small = 4 * 1001;
    let warm = in_place(small);
    sum_by_one_shot(&mut reduce, &warm, small);
    check(&warm, small, 1);
    let captured = in_place(small);
    for &stream in &streams {
        b.begin_capture(stream).unwrap();
    }
    sum_by_one_shot(&mut reduce, &captured, small);
    let graphs: Vec<_> = streams.iter().map(|&s| b.end_capture(s).unwrap()).collect();
    // A larger call grows each GPU's scratch buffer.
    let large = 4 << 20;
    let larger = in_place(large);
    sum_by_one_shot(&mut reduce, &larger, large);
    check(&larger, large, 1);
    for replays in 1..=2 {
        for (&graph, &stream) in graphs.iter().zip(&streams) {
            b.replay(graph, stream).unwrap();
        }
        check(&captured, small, replays);
    }
    drop(reduce);
    for rank in warm.iter().chain(&captured).chain(&larger) {
        b.free(rank.input).unwrap();
    }
}

#[test]
fn a_sum_out_of_place_into_other_memory_is_right_and_leaves_every_input_as_it_was() {
    on_thread_ranks(|b, reduce, rank, stream| {
        let mut kernels = Vec::new();
        // Packets, then the kernels that go through the shared buffers (one growing).
        for len in [4 * 1001, 4 * 100_001, 4 << 20] {
            let range = |buffer| BufferRange {
                buffer,
                offset: 0,
                len,
            };
            let input = b.alloc(Memory::Device(rank), len).unwrap();
            let output = b.alloc(Memory::Device(rank), len).unwrap();
            let ranges = (range(input), range(output));
            kernels.push(sum_checked(b, reduce, ranges, (rank, stream)));
            b.free(input).unwrap();
            b.free(output).unwrap();
        }
        let named: Vec<&str> = kernels.iter().map(|k| k.name()).collect();
        assert_eq!(named[0], "one-shot-packets", "{named:?}");
        assert!(
            named[1..].iter().all(|k| *k != "one-shot-packets"),
            "{named:?}"
        );
    });
}

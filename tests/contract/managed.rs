//! The contract of managed (unified) memory: it reads back like any buffer, every GPU's kernels and
//! copy engines reach it without peer access, advice and prefetches move its pages but never its
//! bytes, and only managed buffers take them. A GPU is never given more managed memory than it has
//! free.

use super::{buffer, check_copy, contents, gpus, invalid, pattern, says, usage, SHAPES};
use peerlink::backend::{Advice, Backend, BufferCopy, CopyMethod, Location, Memory};
use peerlink::Error;

/// Every place pages can be put on this host: each GPU, and host memory.
fn locations(b: &dyn Backend) -> Vec<Location> {
    (0..gpus(b))
        .map(Location::Device)
        .chain([Location::Host])
        .collect()
}

pub fn managed_memory_reads_back_and_every_gpu_copies_it_without_peer_access(b: &dyn Backend) {
    let data = pattern(3 << 20, 11);
    let id = buffer(b, Memory::Managed(0), &data);
    assert!(contents(b, id) == data);
    b.free(id).unwrap();
    let last = gpus(b) - 1;
    for issuer in [0, last] {
        for method in [CopyMethod::SmKernel, CopyMethod::CopyEngine] {
            for shape in [SHAPES[1], SHAPES[4]] {
                let managed = Memory::Managed(last - issuer);
                check_copy(b, issuer, method, managed, Memory::Device(issuer), shape);
                check_copy(b, issuer, method, Memory::Device(issuer), managed, shape);
                check_copy(b, issuer, method, managed, managed, shape);
            }
        }
    }
}

pub fn prefetches_and_advice_move_pages_but_never_bytes(b: &dyn Backend) {
    let data = pattern(5 << 20, 13);
    let managed = buffer(b, Memory::Managed(0), &data);
    let streams: Vec<_> = (0..gpus(b)).map(|d| b.create_stream(d).unwrap()).collect();
    let last = gpus(b) - 1;
    let local = b.alloc(Memory::Device(last), data.len()).unwrap();
    let read_on_last = |b: &dyn Backend| {
        let copy = BufferCopy::from_start(managed, local, data.len());
        b.copy(streams[last], CopyMethod::SmKernel, &copy).unwrap();
        b.synchronize(streams[last]).unwrap();
        assert!(contents(b, local) == data, "the read delivered other bytes");
    };
    for to in locations(b) {
        b.managed().prefetch(streams[0], managed, to).unwrap();
        b.synchronize(streams[0]).unwrap();
        read_on_last(b);
    }
    for advice in [
        Advice::SetReadMostly,
        Advice::SetAccessedBy(last),
        Advice::UnsetReadMostly,
        Advice::UnsetAccessedBy(last),
    ] {
        b.managed().advise(managed, advice).unwrap();
        for to in locations(b) {
            b.managed().prefetch(streams[last], managed, to).unwrap();
        }
        read_on_last(b);
        assert!(contents(b, managed) == data, "after {advice:?}");
    }
    b.free(local).unwrap();
    b.free(managed).unwrap();
}

pub fn advice_and_prefetches_take_only_managed_memory_and_gpus_that_exist(b: &dyn Backend) {
    let n = gpus(b);
    let stream = b.create_stream(0).unwrap();
    for memory in [Memory::Device(0), Memory::PinnedHost { numa_node: None }] {
        let other = b.alloc(memory, 64).unwrap();
        says(
            &usage(b.managed().advise(other, Advice::SetReadMostly)),
            "not managed memory",
        );
        says(
            &usage(b.managed().prefetch(stream, other, Location::Device(0))),
            "not managed memory",
        );
        b.free(other).unwrap();
    }
    let managed = b.alloc(Memory::Managed(0), 64).unwrap();
    usage(b.managed().advise(managed, Advice::SetAccessedBy(n)));
    usage(b.managed().prefetch(stream, managed, Location::Device(n)));
    usage(b.alloc(Memory::Managed(n), 64));
    // Work a capture cannot record (beside a copy it can).
    let scratch = buffer(b, Memory::Device(0), &[1; 64]);
    b.begin_capture(stream).unwrap();
    let halves = BufferCopy {
        dst_offset: 32,
        ..BufferCopy::from_start(scratch, scratch, 32)
    };
    b.copy(stream, CopyMethod::CopyEngine, &halves).unwrap();
    says(
        &usage(b.managed().prefetch(stream, managed, Location::Host)),
        "captures a graph",
    );
    let graph = b.end_capture(stream).unwrap();
    b.destroy_graph(graph).unwrap();
    b.free(scratch).unwrap();
    b.free(managed).unwrap();
    invalid(b.managed().advise(managed, Advice::SetReadMostly));
    invalid(b.managed().prefetch(stream, managed, Location::Host));
}

pub fn managed_memory_past_a_gpus_free_memory_is_refused(b: &dyn Backend) {
    let free = b.free_memory(0).unwrap();
    match b.alloc(Memory::Managed(0), free as usize + 1) {
        Err(Error::OutOfMemory { place, asked, .. }) => {
            assert_eq!(asked, free + 1);
            says(&place, "GPU 0");
        }
        other => panic!("expected an out-of-memory refusal, got {other:?}"),
    }
}

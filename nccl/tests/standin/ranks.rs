//! What the serving tests do on each rank: fill an input, call ncclAllReduce through the
//! library, check every element of the output; ranks as threads, or one thread for all.

use std::ffi::{c_int, c_void};

use peerlink::backend::GraphId;

use peerlink_nccl::ffi::typed::{
    ncclAllReduce, ncclCommDestroy, ncclCommInitAll, ncclCommInitRank, ncclCommWindowRegister,
    ncclComm_t, ncclGroupEnd, ncclGroupStart, ncclWindow_t,
};

pub const F16: c_int = 6;
pub const F32: c_int = 7;
pub const BF16: c_int = 9;
pub const SUM: c_int = 0;
pub const AVG: c_int = 4;

/// Rank `rank`'s value at element `i`: small integers, so every sum is exact in bf16 too.
pub fn value(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (i % 5 + 1)) as f32
}

/// One all-reduce of `count` elements through the library on `comm` (rank `rank` of `ranks` on
/// `gpu`), its input filled with [`value`]s, in place or not; returns what the output holds
/// once the stream is done. `call` makes the call (so groups can wrap it).
pub struct Reduce {
    pub dtype: c_int,
    pub op: c_int,
    pub count: usize,
    pub in_place: bool,
}

impl Reduce {
    /// A sum of `count` f32 elements.
    pub fn f32_sum(count: usize, in_place: bool) -> Reduce {
        Reduce {
            dtype: F32,
            op: SUM,
            count,
            in_place,
        }
    }

    fn element(&self) -> usize {
        if self.dtype == F32 {
            4
        } else {
            2
        }
    }

    /// Fills a fresh input (and output) of `gpu` for rank `rank`: the addresses to call with.
    pub fn buffers(&self, rank: usize, gpu: usize) -> (u64, u64) {
        let bytes = self.count * self.element();
        let send = super::device_buffer(gpu, bytes).1;
        self.fill(rank, gpu, send);
        let recv = if self.in_place {
            send
        } else {
            super::device_buffer(gpu, bytes).1
        };
        (send, recv)
    }

    /// Writes rank `rank`'s [`value`]s at `address` of GPU `gpu`.
    pub fn fill(&self, rank: usize, gpu: usize, address: u64) {
        let backend = super::backend();
        let buffer = backend
            .borrow_memory(gpu, address, self.count * self.element())
            .unwrap();
        let values: Vec<f32> = (0..self.count).map(|i| value(rank, i)).collect();
        backend
            .write(buffer, 0, &super::encode(self.dtype, &values))
            .unwrap();
        backend.free(buffer).unwrap();
    }

    pub fn call(&self, (send, recv): (u64, u64), comm: ncclComm_t, stream: u64) -> c_int {
        // SAFETY: the addresses are the simulator's buffers of this rank's GPU, the comm live.
        unsafe {
            ncclAllReduce(
                send as *const c_void,
                recv as *mut c_void,
                self.count,
                self.dtype,
                self.op,
                comm,
                stream as *mut c_void,
            )
        }
    }

    /// Checks every element of `recv` (GPU `gpu`, after `stream`) against the sum (or average)
    /// over `ranks` ranks.
    pub fn check(&self, recv: u64, gpu: usize, stream: u64, ranks: &[usize]) {
        let backend = super::backend();
        let s = backend.borrow_stream(gpu, stream).unwrap();
        backend.synchronize(s).unwrap();
        let buffer = backend
            .borrow_memory(gpu, recv, self.count * self.element())
            .unwrap();
        let mut bytes = vec![0; self.count * self.element()];
        backend.read(buffer, 0, &mut bytes).unwrap();
        backend.free(buffer).unwrap();
        let got = super::decode(self.dtype, &bytes);
        for (i, got) in got.iter().enumerate() {
            let mut want: f32 = ranks.iter().map(|&r| value(r, i)).sum();
            if self.op == AVG {
                want /= ranks.len() as f32;
            }
            let want = super::decode(self.dtype, &super::encode(self.dtype, &[want]))[0];
            assert_eq!(
                *got,
                want,
                "element {i} of {} ({:?})",
                self.count,
                (self.dtype, self.op, self.in_place)
            );
        }
    }
}

/// One out-of-place f32 sum of `count` elements through the library on `comm`, from rank
/// `rank`'s GPU, on `stream`: the call's result code, and the reduce and its buffers (to check).
pub fn sum_f32(
    rank: usize,
    comm: ncclComm_t,
    count: usize,
    stream: u64,
) -> (c_int, Reduce, (u64, u64)) {
    let reduce = Reduce::f32_sum(count, false);
    let buffers = reduce.buffers(rank, rank);
    let code = reduce.call(buffers, comm, stream);
    (code, reduce, buffers)
}

/// A stream handle of rank `rank` that only the capturing tests use: a capture records whatever
/// is queued on its stream, so another test's calls must not share it.
pub fn capture_stream_of(rank: usize) -> u64 {
    0x7000 + rank as u64
}

/// Captures one f32 sum of `count` elements through the library on rank `rank`'s
/// [`capture_stream_of`] into a CUDA graph (on the simulator), then replays it `replays` times,
/// the output zeroed before each (so that only the replay can have summed into it) and every
/// element checked after each against the sum over `everyone`. Returns the capture's result code.
pub fn captured_sum_replays(
    rank: usize,
    comm: ncclComm_t,
    count: usize,
    replays: usize,
    everyone: &[usize],
) -> c_int {
    let reduce = Reduce::f32_sum(count, false);
    let buffers = reduce.buffers(rank, rank);
    let on = (comm, capture_stream_of(rank));
    captured_replays(rank, on, (&reduce, buffers), replays, everyone)
}

/// Captures `reduce` of `buffers` (rank `rank`'s, on its GPU) through the library on `comm` and
/// the stream `handle` into a CUDA graph (on the simulator), then replays it `replays` times
/// ([`replays_sum`]). Returns the capture's result code.
pub fn captured_replays(
    rank: usize,
    (comm, handle): (ncclComm_t, u64),
    (reduce, buffers): (&Reduce, (u64, u64)),
    replays: usize,
    everyone: &[usize],
) -> c_int {
    let (graph, code) = capture(rank, (comm, handle), (reduce, buffers));
    replays_sum(rank, handle, (reduce, buffers), graph, replays, everyone);
    super::backend().destroy_graph(graph).unwrap();
    code
}

/// Captures `reduce` of `buffers` through the library on `comm` and rank `rank`'s stream
/// `handle` into a CUDA graph (on the simulator): the graph and the call's result code.
pub fn capture(
    rank: usize,
    (comm, handle): (ncclComm_t, u64),
    (reduce, buffers): (&Reduce, (u64, u64)),
) -> (GraphId, c_int) {
    let backend = super::backend();
    let stream = backend.borrow_stream(rank, handle).unwrap();
    backend.begin_capture(stream).unwrap();
    let code = reduce.call(buffers, comm, handle);
    (backend.end_capture(stream).unwrap(), code)
}

/// Replays `graph` (rank `rank`'s capture of `reduce` of `(send, recv)` on stream `handle`)
/// `replays` times, each after the input is filled anew (and an output beside it zeroed), every
/// element checked after each against the sum over `everyone`.
pub fn replays_sum(
    rank: usize,
    handle: u64,
    (reduce, (send, recv)): (&Reduce, (u64, u64)),
    graph: GraphId,
    replays: usize,
    everyone: &[usize],
) {
    let backend = super::backend();
    let stream = backend.borrow_stream(rank, handle).unwrap();
    let bytes = reduce.count * reduce.element();
    for _ in 0..replays {
        reduce.fill(rank, rank, send);
        if send != recv {
            let out = backend.borrow_memory(rank, recv, bytes).unwrap();
            backend.write(out, 0, &vec![0; bytes]).unwrap();
            backend.free(out).unwrap();
        }
        backend.replay(graph, stream).unwrap();
        reduce.check(recv, rank, handle, everyone);
    }
}

/// vLLM's order on rank `rank`'s stream `handle`: a call that sets the communicator up, one
/// captured (100,001 f32: through the shared buffers), an eager one larger than the shared
/// buffers made so far (4 MiB, which grow for it), then the graph replayed twice, each replay
/// checked: the buffers a graph's kernels use must outlive the growth.
pub fn replays_after_the_shared_buffers_grow(
    rank: usize,
    comm: ncclComm_t,
    handle: u64,
    everyone: &[usize],
) {
    let (code, first, (_, recv)) = sum_f32(rank, comm, 1001, handle);
    assert_eq!(code, 0);
    first.check(recv, rank, handle, everyone);
    let captured = Reduce::f32_sum(100_001, false);
    let buffers = captured.buffers(rank, rank);
    let (graph, code) = capture(rank, (comm, handle), (&captured, buffers));
    assert_eq!(code, 0);
    let (code, large, (_, recv)) = sum_f32(rank, comm, 1 << 20, handle);
    assert_eq!(code, 0);
    large.check(recv, rank, handle, everyone);
    replays_sum(rank, handle, (&captured, buffers), graph, 2, everyone);
    super::backend().destroy_graph(graph).unwrap();
}

/// `NCCL_WIN_COLL_SYMMETRIC`.
pub const SYMMETRIC: c_int = 1;

/// Registers `len` bytes at `address` as a window of `comm` with `flags` through the library:
/// the window.
pub fn register_window(
    comm: ncclComm_t,
    (address, len): (u64, usize),
    flags: c_int,
) -> ncclWindow_t {
    let mut window: ncclWindow_t = std::ptr::null_mut();
    // SAFETY: the simulator's memory of this rank's GPU, a live communicator, an out-pointer.
    let code =
        unsafe { ncclCommWindowRegister(comm, address as *mut c_void, len, &mut window, flags) };
    assert_eq!(code, 0);
    window
}

/// Rank `rank` of `everyone` registers a symmetric window of 16 MiB on `comm` (which sets the
/// communicator up; inside a group of its own where `grouped`, as nccl-tests registers), captures
/// an in-place sum of it on stream `handle` and replays it twice, then sums into it out of place,
/// every element checked; nothing may reach NCCL. 16 MiB is sixteen times the ranks' shared
/// buffers, which a copy-in would need to grow: nothing grows inside a capture, so in other
/// memory the captured call would be forwarded. Returns the window.
pub fn sums_in_a_window(
    rank: usize,
    (comm, handle): (ncclComm_t, u64),
    grouped: bool,
    everyone: &[usize],
) -> ncclWindow_t {
    let count = 4 << 20;
    let (_, address) = super::device_buffer(rank, count * 4);
    let server = peerlink_nccl::serve::server();
    let adopted = server.windows_of(comm as usize);
    let window = in_group(grouped, || {
        register_window(comm, (address, count * 4), SYMMETRIC)
    });
    assert_eq!(server.windows_of(comm as usize), adopted + 1);
    let in_place = Reduce::f32_sum(count, true);
    let captured = captured_replays(
        rank,
        (comm, handle),
        (&in_place, (address, address)),
        2,
        everyone,
    );
    assert_eq!(captured, 0);
    // Out of place, the output in the window: the input is copied in, then summed there.
    let beside = Reduce::f32_sum(count, false);
    let send = beside.buffers(rank, rank).0;
    assert_eq!(beside.call((send, address), comm, handle), 0);
    beside.check(address, rank, handle, everyone);
    assert_eq!(super::count_of_this_thread("ncclAllReduce"), 0, "served");
    window
}

/// `body`'s result, inside a group where `grouped`.
pub fn in_group<T>(grouped: bool, body: impl FnOnce() -> T) -> T {
    if grouped {
        // SAFETY: opens a group, closed below.
        assert_eq!(unsafe { ncclGroupStart() }, 0);
    }
    let value = body();
    if grouped {
        // SAFETY: closes the group opened above.
        assert_eq!(unsafe { ncclGroupEnd() }, 0);
    }
    value
}

/// All-reduces (`op`: sum or average) of f32, bf16 and f16 at each of `counts`, in place and not,
/// through the library on `comm` (rank `rank` of `ranks`, on GPU `rank`), every element checked.
pub fn reduce_at_counts(rank: usize, ranks: usize, comm: ncclComm_t, op: c_int, counts: &[usize]) {
    let everyone: Vec<usize> = (0..ranks).collect();
    for dtype in [F32, BF16, F16] {
        for &count in counts {
            for in_place in [false, true] {
                let reduce = Reduce {
                    dtype,
                    op,
                    count,
                    in_place,
                };
                let buffers = reduce.buffers(rank, rank);
                assert_eq!(reduce.call(buffers, comm, stream_of(rank)), 0);
                reduce.check(buffers.1, rank, stream_of(rank), &everyone);
            }
        }
    }
}

/// Runs `body(rank, comm)` on `ranks` threads, each rank of one communicator (rank r on GPU r).
pub fn on_ranks(ranks: usize, body: impl Fn(usize, ncclComm_t) + Sync) {
    let id = super::unique_id(0);
    std::thread::scope(|scope| {
        for rank in 0..ranks {
            let body = &body;
            scope.spawn(move || {
                let mut comm: ncclComm_t = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; the id is the stand-in's.
                assert_eq!(
                    unsafe { ncclCommInitRank(&mut comm, ranks as c_int, id, rank as c_int) },
                    0
                );
                body(rank, comm);
                // SAFETY: the communicator made above.
                assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
            });
        }
    });
}

pub fn stream_of(rank: usize) -> u64 {
    0x5000 + rank as u64
}

/// Communicators of every GPU in `gpus`, made by this thread (ncclCommInitAll).
pub fn init_all(gpus: &[c_int]) -> Vec<ncclComm_t> {
    let mut comms = vec![std::ptr::null_mut(); gpus.len()];
    // SAFETY: room for every communicator; the device list as long.
    assert_eq!(
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), gpus.len() as c_int, gpus.as_ptr()) },
        0
    );
    comms
}

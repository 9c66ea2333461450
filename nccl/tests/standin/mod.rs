//! A stand-in "real NCCL" written in Rust, for the serving tests: installed as what the library
//! forwards to (`ffi::install_stand_in`), it makes communicators whose ranks are threads of the
//! test, runs their collectives (all-gather, all-reduce, broadcast, split) across those threads
//! over the simulator the library serves on (the library's own backend, `PEERLINK_NCCL_SIM`),
//! and records every call that reaches it, per thread, so tests can check what was forwarded and
//! in what order. Groups are kept as NCCL keeps them: the calls run at the outermost end.
#![allow(dead_code, clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::ThreadId;

pub mod ranks;

use peerlink::backend::{Backend, Memory};
use peerlink_nccl::exports::Export;
use peerlink_nccl::ffi::typed::{ncclComm_t, ncclUniqueId};

/// One stand-in communicator: its family (shared by its ranks), rank, size and GPU, and how many
/// collectives this rank has made on it.
pub struct Comm {
    family: u64,
    pub rank: usize,
    pub ranks: usize,
    pub gpu: usize,
    calls: AtomicU64,
}

/// Every call that reached the stand-in: the thread, the call's name and its communicator.
static LOG: Mutex<Vec<(ThreadId, &'static str, usize)>> = Mutex::new(Vec::new());

/// Each rank's bytes of one collective, by (family, call number): what the ranks left so far.
type Meetings = HashMap<(u64, u64), Vec<Option<Vec<u8>>>>;
static MEETINGS: Mutex<Option<Meetings>> = Mutex::new(None);
static MET: Condvar = Condvar::new();
static FAMILIES: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static DEPTH: RefCell<u32> = const { RefCell::new(0) };
    static QUEUED: RefCell<Vec<Box<dyn FnOnce()>>> = RefCell::new(Vec::new());
}

fn record(name: &'static str, comm: ncclComm_t) {
    LOG.lock()
        .unwrap()
        .push((std::thread::current().id(), name, comm as usize));
}

/// The calls that reached the stand-in from this thread, in order, with their communicators.
pub fn calls_of_this_thread() -> Vec<(&'static str, usize)> {
    let me = std::thread::current().id();
    LOG.lock()
        .unwrap()
        .iter()
        .filter(|(thread, _, _)| *thread == me)
        .map(|&(_, name, comm)| (name, comm))
        .collect()
}

/// The names of this thread's calls of `name` (for counting).
pub fn count_of_this_thread(name: &str) -> usize {
    calls_of_this_thread()
        .iter()
        .filter(|(n, _)| *n == name)
        .count()
}

/// The library's backend: the simulator the stand-in and the library share.
pub fn backend() -> Arc<dyn Backend> {
    peerlink_nccl::serve::server()
        .backend()
        .expect("PEERLINK_NCCL_SIM opens the simulator")
        .clone()
}

/// Sets the switches (`serve`: none, auto or all; `table`: a file for auto) and installs the
/// stand-in, once per test binary, before any call.
pub fn install(serve: &str, table: Option<&str>) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("PEERLINK_NCCL_SIM", "dgx-h100");
        std::env::set_var("PEERLINK_NCCL_SERVE", serve);
        std::env::set_var("PEERLINK_NCCL_DEBUG", "INFO");
        if let Some(table) = table {
            std::env::set_var("PEERLINK_NCCL_TABLE", table);
        }
        let functions: [(Export, usize); 16] = [
            (Export::ncclCommInitRank, init_rank as *const () as usize),
            (Export::ncclCommInitAll, init_all as *const () as usize),
            (Export::ncclCommSplit, split as *const () as usize),
            (Export::ncclCommUserRank, user_rank as *const () as usize),
            (Export::ncclCommCount, count as *const () as usize),
            (Export::ncclCommCuDevice, cu_device as *const () as usize),
            (Export::ncclAllGather, all_gather as *const () as usize),
            (Export::ncclAllReduce, all_reduce as *const () as usize),
            (Export::ncclBroadcast, broadcast as *const () as usize),
            (Export::ncclGroupStart, group_start as *const () as usize),
            (Export::ncclGroupEnd, group_end as *const () as usize),
            (Export::ncclCommDestroy, destroy as *const () as usize),
            (Export::ncclCommAbort, abort as *const () as usize),
            (
                Export::ncclCommGetAsyncError,
                async_error as *const () as usize,
            ),
            (
                Export::ncclCommWindowRegister,
                window_register as *const () as usize,
            ),
            (
                Export::ncclCommWindowDeregister,
                window_deregister as *const () as usize,
            ),
        ];
        // SAFETY: each function has the type NCCL gives its export, and lives as long as the test.
        unsafe { peerlink_nccl::ffi::install_stand_in(&functions) };
    });
}

/// A fresh unique id, naming a new family whose rank `r` runs on GPU `first_gpu + r`.
pub fn unique_id(first_gpu: usize) -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    let family = FAMILIES.fetch_add(1, Ordering::Relaxed);
    for (i, byte) in family.to_le_bytes().into_iter().enumerate() {
        id.internal[i] = byte as i8 as _;
    }
    id.internal[8] = first_gpu as i8 as _;
    id
}

fn make(family: u64, rank: usize, ranks: usize, gpu: usize) -> ncclComm_t {
    Box::into_raw(Box::new(Comm {
        family,
        rank,
        ranks,
        gpu,
        calls: AtomicU64::new(0),
    })) as ncclComm_t
}

/// The stand-in communicator behind a handle.
pub fn comm<'a>(comm: ncclComm_t) -> &'a Comm {
    // SAFETY: every handle the stand-in gives out is a leaked `Comm`.
    unsafe { &*(comm as *const Comm) }
}

unsafe extern "C" fn init_rank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> c_int {
    let mut family = [0u8; 8];
    for (i, byte) in family.iter_mut().enumerate() {
        *byte = id.internal[i] as u8;
    }
    let first = id.internal[8] as u8 as usize;
    let made = make(
        u64::from_le_bytes(family),
        rank as usize,
        nranks as usize,
        first + rank as usize,
    );
    record("ncclCommInitRank", made);
    // SAFETY: NCCL's contract: `out` is a valid out-pointer.
    unsafe { *out = made };
    0
}

unsafe extern "C" fn init_all(out: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> c_int {
    let family = FAMILIES.fetch_add(1, Ordering::Relaxed);
    for rank in 0..ndev as usize {
        // SAFETY: NCCL's contract: `devlist` (when given) and `out` hold `ndev` entries.
        let gpu = if devlist.is_null() {
            rank
        } else {
            (unsafe { *devlist.add(rank) }) as usize
        };
        let made = make(family, rank, ndev as usize, gpu);
        record("ncclCommInitAll", made);
        unsafe { *out.add(rank) = made };
    }
    0
}

unsafe extern "C" fn user_rank(c: ncclComm_t, out: *mut c_int) -> c_int {
    unsafe { *out = comm(c).rank as c_int };
    0
}

unsafe extern "C" fn count(c: ncclComm_t, out: *mut c_int) -> c_int {
    unsafe { *out = comm(c).ranks as c_int };
    0
}

unsafe extern "C" fn cu_device(c: ncclComm_t, out: *mut c_int) -> c_int {
    unsafe { *out = comm(c).gpu as c_int };
    0
}

unsafe extern "C" fn destroy(c: ncclComm_t) -> c_int {
    record("ncclCommDestroy", c);
    0
}

unsafe extern "C" fn abort(c: ncclComm_t) -> c_int {
    record("ncclCommAbort", c);
    0
}

/// The stand-in's own communicators never fail.
unsafe extern "C" fn async_error(c: ncclComm_t, out: *mut c_int) -> c_int {
    record("ncclCommGetAsyncError", c);
    unsafe { *out = 0 };
    0
}

/// A window handle of its own for each registration (the stand-in keeps nothing of it).
unsafe extern "C" fn window_register(
    c: ncclComm_t,
    _buff: *mut c_void,
    _size: usize,
    win: *mut *mut c_void,
    _flags: c_int,
) -> c_int {
    static WINDOWS: AtomicU64 = AtomicU64::new(1);
    record("ncclCommWindowRegister", c);
    let handle = WINDOWS.fetch_add(1, Ordering::Relaxed) as usize;
    // SAFETY: NCCL's contract: `win` is a valid out-pointer.
    unsafe { *win = handle as *mut c_void };
    0
}

unsafe extern "C" fn window_deregister(c: ncclComm_t, _win: *mut c_void) -> c_int {
    record("ncclCommWindowDeregister", c);
    0
}

unsafe extern "C" fn group_start() -> c_int {
    record("ncclGroupStart", std::ptr::null_mut());
    DEPTH.with(|d| *d.borrow_mut() += 1);
    0
}

unsafe extern "C" fn group_end() -> c_int {
    record("ncclGroupEnd", std::ptr::null_mut());
    let outermost = DEPTH.with(|d| {
        let mut d = d.borrow_mut();
        *d -= 1;
        *d == 0
    });
    if outermost {
        let queued: Vec<Box<dyn FnOnce()>> = QUEUED.with(|q| q.take());
        // Every rank's part first, then each waits for the others': one thread may drive all.
        let mut finishes = Vec::new();
        for contribute in queued {
            contribute();
        }
        FINISH.with(|f| finishes.append(&mut f.borrow_mut()));
        for finish in finishes {
            finish();
        }
    }
    0
}

thread_local! {
    static FINISH: RefCell<Vec<Box<dyn FnOnce()>>> = RefCell::new(Vec::new());
}

/// Where the ranks of one test's communicators meet when they are processes: a directory
/// (the parent test's), named by this variable; unset, they are threads and meet in memory.
pub const MEETING_DIR: &str = "STANDIN_MEETING_DIR";

/// Leaves rank `rank`'s `bytes` of collective `key` for the others.
fn leave(key: (u64, u64), rank: usize, ranks: usize, bytes: Vec<u8>) {
    if let Some(dir) = std::env::var_os(MEETING_DIR) {
        let path = std::path::Path::new(&dir).join(format!("{}-{}-{rank}", key.0, key.1));
        let partial = path.with_extension("partial");
        std::fs::write(&partial, bytes).unwrap();
        // Whole or absent: a reader never sees half a part.
        std::fs::rename(partial, path).unwrap();
        return;
    }
    let mut meetings = MEETINGS.lock().unwrap();
    let parts = meetings
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| vec![None; ranks]);
    parts[rank] = Some(bytes);
    MET.notify_all();
}

/// Every rank's part of collective `key`, in rank order, once all have left theirs.
fn gathered(key: (u64, u64), ranks: usize) -> Vec<Vec<u8>> {
    if let Some(dir) = std::env::var_os(MEETING_DIR) {
        let path =
            |rank: usize| std::path::Path::new(&dir).join(format!("{}-{}-{rank}", key.0, key.1));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while (0..ranks).any(|r| !path(r).is_file()) {
            assert!(
                std::time::Instant::now() < deadline,
                "a rank never came to {key:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        return (0..ranks)
            .map(|r| std::fs::read(path(r)).unwrap())
            .collect();
    }
    let meetings = MEETINGS.lock().unwrap();
    let meetings = MET
        .wait_while(meetings, |m| {
            m.as_ref().unwrap()[&key].iter().any(Option::is_none)
        })
        .unwrap();
    meetings.as_ref().unwrap()[&key]
        .iter()
        .map(|p| p.clone().unwrap())
        .collect()
}

/// Runs a collective of this rank: `part` is what it leaves (read now, once the stream's earlier
/// work is done), `finish` gets every rank's part, in rank order. In a group, both wait for its
/// outermost end.
fn collective(
    c: ncclComm_t,
    stream: u64,
    part: impl FnOnce() -> Vec<u8> + 'static,
    finish: impl FnOnce(Vec<Vec<u8>>) + 'static,
) {
    let comm = comm(c);
    let key = (comm.family, comm.calls.fetch_add(1, Ordering::Relaxed));
    let (rank, ranks, gpu) = (comm.rank, comm.ranks, comm.gpu);
    let contribute = move || {
        let backend = backend();
        let s = backend.borrow_stream(gpu, stream).unwrap();
        backend.synchronize(s).unwrap();
        leave(key, rank, ranks, part());
        FINISH.with(|f| {
            f.borrow_mut()
                .push(Box::new(move || finish(gathered(key, ranks))))
        });
    };
    if DEPTH.with(|d| *d.borrow()) > 0 {
        QUEUED.with(|q| q.borrow_mut().push(Box::new(contribute)));
    } else {
        contribute();
        for finish in FINISH.with(|f| f.take()) {
            finish();
        }
    }
}

/// `len` bytes of GPU `gpu`'s memory at simulated address `address`.
fn read(gpu: usize, address: u64, len: usize) -> Vec<u8> {
    let backend = backend();
    let buffer = backend.borrow_memory(gpu, address, len.max(1)).unwrap();
    let mut bytes = vec![0; len];
    backend.read(buffer, 0, &mut bytes).unwrap();
    backend.free(buffer).unwrap();
    bytes
}

fn write(gpu: usize, address: u64, bytes: &[u8]) {
    let backend = backend();
    let buffer = backend
        .borrow_memory(gpu, address, bytes.len().max(1))
        .unwrap();
    backend.write(buffer, 0, bytes).unwrap();
    backend.free(buffer).unwrap();
}

fn element_bytes(datatype: c_int) -> usize {
    match datatype {
        0 | 1 => 1,
        6 | 9 => 2,
        7 => 4,
        other => panic!("the stand-in has no type {other}"),
    }
}

/// A collective that moves bytes only: each rank's `len` bytes at `send` left for all, and
/// `output` of every rank's written at `recv`.
fn moved(
    c: ncclComm_t,
    stream: *mut c_void,
    (send, recv, len): (*const c_void, *mut c_void, usize),
    output: impl FnOnce(Vec<Vec<u8>>) -> Vec<u8> + 'static,
) {
    let gpu = comm(c).gpu;
    let (send, recv) = (send as u64, recv as u64);
    collective(
        c,
        stream as u64,
        move || read(gpu, send, len),
        move |parts| write(gpu, recv, &output(parts)),
    );
}

unsafe extern "C" fn all_gather(
    send: *const c_void,
    recv: *mut c_void,
    n: usize,
    datatype: c_int,
    c: ncclComm_t,
    stream: *mut c_void,
) -> c_int {
    record("ncclAllGather", c);
    let len = n * element_bytes(datatype);
    moved(c, stream, (send, recv, len), |parts| parts.concat());
    0
}

unsafe extern "C" fn broadcast(
    send: *const c_void,
    recv: *mut c_void,
    n: usize,
    datatype: c_int,
    root: c_int,
    c: ncclComm_t,
    stream: *mut c_void,
) -> c_int {
    record("ncclBroadcast", c);
    let len = n * element_bytes(datatype);
    moved(c, stream, (send, recv, len), move |mut parts| {
        parts.swap_remove(root as usize)
    });
    0
}

unsafe extern "C" fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    n: usize,
    datatype: c_int,
    op: c_int,
    c: ncclComm_t,
    stream: *mut c_void,
) -> c_int {
    record("ncclAllReduce", c);
    let gpu = comm(c).gpu;
    let len = n * element_bytes(datatype);
    let (send, recv) = (send as u64, recv as u64);
    collective(
        c,
        stream as u64,
        move || read(gpu, send, len),
        move |parts| {
            let values: Vec<Vec<f32>> = parts.iter().map(|p| decode(datatype, p)).collect();
            let mut sum: Vec<f32> = (0..n).map(|i| values.iter().map(|v| v[i]).sum()).collect();
            if op == 4 {
                sum.iter_mut().for_each(|s| *s /= values.len() as f32);
            }
            write(gpu, recv, &encode(datatype, &sum));
        },
    );
    0
}

unsafe extern "C" fn split(
    c: ncclComm_t,
    color: c_int,
    key: c_int,
    out: *mut ncclComm_t,
    _config: *mut c_void,
) -> c_int {
    record("ncclCommSplit", c);
    let parent = comm(c);
    let (family, rank, gpu) = (parent.family, parent.rank, parent.gpu);
    let index = parent.calls.load(Ordering::Relaxed);
    let out = out as usize;
    let mine = [color, key, rank as c_int]
        .map(|v| v.to_le_bytes())
        .concat();
    collective(
        c,
        0,
        move || mine,
        move |parts| {
            let words = |p: &Vec<u8>| {
                [0, 1, 2].map(|i| c_int::from_le_bytes(p[i * 4..i * 4 + 4].try_into().unwrap()))
            };
            let mut same: Vec<[c_int; 3]> =
                parts.iter().map(words).filter(|w| w[0] == color).collect();
            same.sort_by_key(|w| (w[1], w[2]));
            let new_rank = same.iter().position(|w| w[2] == rank as c_int).unwrap();
            let made = if color < 0 {
                std::ptr::null_mut()
            } else {
                make(
                    family * 1000 + index * 10 + color as u64,
                    new_rank,
                    same.len(),
                    gpu,
                )
            };
            // SAFETY: NCCL's contract: `out` is a valid out-pointer.
            unsafe { *(out as *mut ncclComm_t) = made };
        },
    );
    0
}

/// peerlink's element type for an NCCL type the stand-in reduces.
fn element_type(datatype: c_int) -> peerlink::backend::collective::DataType {
    use peerlink::backend::collective::DataType;
    match datatype {
        6 => DataType::F16,
        7 => DataType::F32,
        9 => DataType::Bf16,
        other => panic!("the stand-in does not reduce type {other}"),
    }
}

/// f32, bf16 or f16 bytes as values.
pub fn decode(datatype: c_int, bytes: &[u8]) -> Vec<f32> {
    let dtype = element_type(datatype);
    bytes
        .chunks(dtype.size())
        .map(|e| dtype.to_f32(e))
        .collect()
}

/// Values as f32, bf16 or f16 bytes (rounded to nearest even).
pub fn encode(datatype: c_int, values: &[f32]) -> Vec<u8> {
    let dtype = element_type(datatype);
    let mut bytes = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        dtype.push_rounded(v, &mut bytes);
    }
    bytes
}

/// A device buffer of `bytes` on `gpu`, and its simulated address.
pub fn device_buffer(gpu: usize, bytes: usize) -> (peerlink::backend::BufferId, u64) {
    let backend = backend();
    let buffer = backend.alloc(Memory::Device(gpu), bytes).unwrap();
    let address = backend.sharing().device_address(buffer).unwrap();
    (buffer, address)
}

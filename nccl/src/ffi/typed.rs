//! The exports this library reads, declared from NCCL's documentation: the collectives and
//! point-to-point calls (counted per kind and size class), groups, the calls that make
//! communicators (logged under `PEERLINK_NCCL_DEBUG=INFO`), and the two calls that return strings
//! (which must answer with a string even where there is no NCCL).
//!
//! Their safety contract is NCCL's documentation of each function, which the caller keeps.
#![allow(non_camel_case_types, non_snake_case, clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};

use super::{
    no_nccl, real, switches, COUNTERS, NCCL_INVALID_USAGE, NCCL_IN_PROGRESS, NCCL_SUCCESS,
};
use crate::exports::Export;
use crate::log::{self, Communicator};
use crate::serve;
use crate::stats::{size_class, Call, Route};
use crate::switches::Debug;

/// NCCL's C types, by their C names (so that [`SIGNATURES`] reads as nccl.h does).
pub type ncclResult_t = c_int;
pub type ncclDataType_t = c_int;
pub type ncclRedOp_t = c_int;
pub type ncclComm_t = *mut c_void;
pub type cudaStream_t = *mut c_void;
pub type size_t = usize;
/// `ncclConfig_t` is only passed on, by pointer.
pub type ncclConfig_t = c_void;
/// `ncclSimInfo_t` is only passed on, by pointer.
pub type ncclSimInfo_t = c_void;
/// `ncclWindow_t` is only passed on.
pub type ncclWindow_t = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to ncclCommInitRank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; 128],
}

/// Declares each function's type in [`sig`] and lists its C signature in [`SIGNATURES`] (which
/// the tests compare with an installed nccl.h).
macro_rules! signatures {
    ($($name:ident = fn($($ty:ty),*) -> $ret:ty;)*) => {
        /// The function types, by the functions' names.
        pub mod sig {
            use super::*;
            $(pub type $name = unsafe extern "C" fn($($ty),*) -> $ret;)*
        }
        /// Each declared function: its name, its parameters' types and its result's type, as
        /// written in Rust.
        pub const SIGNATURES: &[(&str, &[&str], &str)] =
            &[$((stringify!($name), &[$(stringify!($ty)),*], stringify!($ret))),*];
    };
}

signatures! {
    ncclAllReduce = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclBroadcast = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclBcast = fn(*mut c_void, size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclReduce = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, ncclRedOp_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclAllGather = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclReduceScatter = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclAlltoAll = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclGather = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclScatter = fn(*const c_void, *mut c_void, size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclSend = fn(*const c_void, size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclRecv = fn(*mut c_void, size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
    ncclGroupStart = fn() -> ncclResult_t;
    ncclGroupEnd = fn() -> ncclResult_t;
    ncclCommInitRank = fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t;
    ncclCommInitRankConfig = fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int, *mut ncclConfig_t) -> ncclResult_t;
    ncclCommInitAll = fn(*mut ncclComm_t, c_int, *const c_int) -> ncclResult_t;
    ncclCommInitRankScalable = fn(*mut ncclComm_t, c_int, c_int, c_int, *mut ncclUniqueId, *mut ncclConfig_t) -> ncclResult_t;
    ncclCommSplit = fn(ncclComm_t, c_int, c_int, *mut ncclComm_t, *mut ncclConfig_t) -> ncclResult_t;
    ncclCommShrink = fn(ncclComm_t, *mut c_int, c_int, *mut ncclComm_t, *mut ncclConfig_t, c_int) -> ncclResult_t;
    ncclGetErrorString = fn(ncclResult_t) -> *const c_char;
    ncclGetLastError = fn(ncclComm_t) -> *const c_char;
    ncclCommCount = fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    ncclCommCuDevice = fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    ncclCommUserRank = fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    ncclCommDestroy = fn(ncclComm_t) -> ncclResult_t;
    ncclCommAbort = fn(ncclComm_t) -> ncclResult_t;
    ncclCommGetAsyncError = fn(ncclComm_t, *mut ncclResult_t) -> ncclResult_t;
    ncclCommFinalize = fn(ncclComm_t) -> ncclResult_t;
    ncclCommRegister = fn(ncclComm_t, *mut c_void, size_t, *mut *mut c_void) -> ncclResult_t;
    ncclCommDeregister = fn(ncclComm_t, *mut c_void) -> ncclResult_t;
    ncclCommWindowRegister = fn(ncclComm_t, *mut c_void, size_t, *mut ncclWindow_t, c_int) -> ncclResult_t;
    ncclCommWindowDeregister = fn(ncclComm_t, ncclWindow_t) -> ncclResult_t;
    ncclGroupSimulateEnd = fn(*mut ncclSimInfo_t) -> ncclResult_t;
}

/// Forwards a call whose signature is `sig::$name`, with its arguments.
macro_rules! forward {
    ($name:ident($($arg:expr),*)) => {
        // SAFETY: the type is the one NCCL gives the function.
        match unsafe { real::<sig::$name>(Export::$name) } {
            // SAFETY: the caller's arguments, passed on as NCCL's contract has them.
            Ok(function) => unsafe { function($($arg),*) },
            Err(code) => code,
        }
    };
}

/// A collective or point-to-point call other than all-reduce: counted by kind and by the size it
/// names, then forwarded (after what a group held, [`serve::other_call`]).
macro_rules! counted {
    ($($name:ident as $call:ident ($($arg:ident: $ty:ty),*) counting $count:ident of $dtype:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> ncclResult_t {
            COUNTERS.count(Call::$call, size_class($count, $dtype), Route::Forwarded);
            serve::other_call(|| forward!($name($($arg),*)))
        }
        const _: sig::$name = $name;
    )*};
}

counted! {
    ncclBroadcast as Broadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclBcast as Bcast(buff: *mut c_void, count: size_t, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclReduce as Reduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclAllGather as AllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: size_t, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) counting sendcount of datatype;
    ncclReduceScatter as ReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: size_t, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) counting recvcount of datatype;
    ncclAlltoAll as AlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclGather as Gather(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclScatter as Scatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclSend as Send(sendbuff: *const c_void, count: size_t, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
    ncclRecv as Recv(recvbuff: *mut c_void, count: size_t, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) counting count of datatype;
}

thread_local! {
    /// Communicators made inside this thread's group, logged once the group ends (NCCL sets them
    /// up at ncclGroupEnd, so before then they cannot answer what they are).
    static PENDING: RefCell<Vec<Communicator>> = const { RefCell::new(Vec::new()) };
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: size_t,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let call = serve::AllReduce {
        send: sendbuff as u64,
        recv: recvbuff as u64,
        count,
        datatype,
        op,
        comm: comm as usize,
        stream: stream as u64,
    };
    // Held in a group, it may be forwarded later: the closure keeps the arguments.
    let forward = Box::new(move || {
        forward!(ncclAllReduce(
            sendbuff, recvbuff, count, datatype, op, comm, stream
        ))
    });
    serve::all_reduce(&RealNccl, call, forward)
}
const _: sig::ncclAllReduce = ncclAllReduce;

/// The real NCCL as the serving side needs it (its set-up's all-gather, groups, a
/// communicator's rank, size and GPU).
struct RealNccl;

impl serve::Real for RealNccl {
    fn all_gather(&self, send: u64, recv: u64, bytes: usize, comm: usize, stream: u64) -> i32 {
        let (send, recv) = (send as *const c_void, recv as *mut c_void);
        let (comm, stream) = (comm as ncclComm_t, stream as cudaStream_t);
        forward!(ncclAllGather(send, recv, bytes, NCCL_UINT8, comm, stream))
    }

    fn group_start(&self) -> i32 {
        forward!(ncclGroupStart())
    }

    fn group_end(&self) -> i32 {
        forward!(ncclGroupEnd())
    }

    fn describe(&self, comm: usize) -> Result<(usize, usize, usize), i32> {
        let comm = comm as ncclComm_t;
        let (mut rank, mut ranks, mut gpu) = (0, 0, 0);
        for code in [
            forward!(ncclCommUserRank(comm, &mut rank)),
            forward!(ncclCommCount(comm, &mut ranks)),
            forward!(ncclCommCuDevice(comm, &mut gpu)),
        ] {
            if code != NCCL_SUCCESS {
                return Err(code);
            }
        }
        let unsigned = |value: c_int| usize::try_from(value).map_err(|_| NCCL_INVALID_USAGE);
        Ok((unsigned(rank)?, unsigned(ranks)?, unsigned(gpu)?))
    }
}

/// `ncclUint8`, the type of the set-up's all-gather.
const NCCL_UINT8: ncclDataType_t = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupStart() -> ncclResult_t {
    serve::group_start(&RealNccl)
}
const _: sig::ncclGroupStart = ncclGroupStart;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    serve::group_simulate_end(|| forward!(ncclGroupSimulateEnd(simInfo)))
}
const _: sig::ncclGroupSimulateEnd = ncclGroupSimulateEnd;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupEnd() -> ncclResult_t {
    let result = serve::group_end(&RealNccl);
    if !serve::in_group() {
        // try_with: a call while this thread's locals are being torn down logs nothing.
        for communicator in PENDING
            .try_with(|pending| pending.take())
            .unwrap_or_default()
        {
            log_communicator(communicator, true);
        }
    }
    result
}
const _: sig::ncclGroupEnd = ncclGroupEnd;

/// Notes a communicator just made (under `PEERLINK_NCCL_DEBUG=INFO`): logged now, or at the end of
/// the group it was made in. `said` is the rank and size the creating call named.
fn made(
    result: ncclResult_t,
    comm: *mut ncclComm_t,
    created_by: &'static str,
    said: (Option<i32>, Option<i32>),
) {
    if switches().debug < Debug::Info
        || comm.is_null()
        || !(result == NCCL_SUCCESS || result == NCCL_IN_PROGRESS)
    {
        return;
    }
    // SAFETY: NCCL wrote the new communicator there (the call succeeded or is in progress).
    let address = unsafe { *comm } as usize;
    let communicator = Communicator {
        address,
        created_by,
        rank: said.0,
        ranks: said.1,
        gpu: None,
    };
    if serve::in_group() {
        let _ = PENDING.try_with(|pending| pending.borrow_mut().push(communicator));
    } else {
        log_communicator(communicator, result == NCCL_SUCCESS);
    }
}

/// Logs a communicator, completed from what NCCL answers where it is ready.
fn log_communicator(mut communicator: Communicator, ready: bool) {
    if ready {
        let comm = communicator.address as ncclComm_t;
        let ask = |answer: &mut Option<i32>, code: ncclResult_t, value: c_int| {
            if code == NCCL_SUCCESS {
                *answer = Some(value);
            }
        };
        let (mut rank, mut ranks, mut gpu) = (0, 0, 0);
        ask(
            &mut communicator.rank,
            forward!(ncclCommUserRank(comm, &mut rank)),
            rank,
        );
        ask(
            &mut communicator.ranks,
            forward!(ncclCommCount(comm, &mut ranks)),
            ranks,
        );
        ask(
            &mut communicator.gpu,
            forward!(ncclCommCuDevice(comm, &mut gpu)),
            gpu,
        );
    }
    log::write(&[communicator.line(&serve::server().why_forwarded())]);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    let result = serve::other_call(|| forward!(ncclCommInitRank(comm, nranks, commId, rank)));
    made(result, comm, "ncclCommInitRank", (Some(rank), Some(nranks)));
    result
}
const _: sig::ncclCommInitRank = ncclCommInitRank;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let result =
        serve::other_call(|| forward!(ncclCommInitRankConfig(comm, nranks, commId, rank, config)));
    made(
        result,
        comm,
        "ncclCommInitRankConfig",
        (Some(rank), Some(nranks)),
    );
    result
}
const _: sig::ncclCommInitRankConfig = ncclCommInitRankConfig;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let result = serve::other_call(|| {
        forward!(ncclCommInitRankScalable(
            newcomm, nranks, myrank, nId, commIds, config
        ))
    });
    made(
        result,
        newcomm,
        "ncclCommInitRankScalable",
        (Some(myrank), Some(nranks)),
    );
    result
}
const _: sig::ncclCommInitRankScalable = ncclCommInitRankScalable;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    let result = serve::other_call(|| forward!(ncclCommInitAll(comm, ndev, devlist)));
    for index in 0..ndev.max(0) {
        // SAFETY: NCCL's contract: `comm` has room for `ndev` communicators.
        made(
            result,
            unsafe { comm.add(index as usize) },
            "ncclCommInitAll",
            (Some(index), Some(ndev)),
        );
    }
    result
}
const _: sig::ncclCommInitAll = ncclCommInitAll;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let result = serve::other_call(|| forward!(ncclCommSplit(comm, color, key, newcomm, config)));
    // A rank that passes NCCL_SPLIT_NOCOLOR gets no communicator (NULL).
    // SAFETY: NCCL wrote `*newcomm` where the call succeeded.
    if newcomm.is_null() || unsafe { *newcomm }.is_null() {
        return result;
    }
    made(result, newcomm, "ncclCommSplit", (None, None));
    result
}
const _: sig::ncclCommSplit = ncclCommSplit;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    let result = serve::other_call(|| {
        forward!(ncclCommShrink(
            comm,
            excludeRanksList,
            excludeRanksCount,
            newcomm,
            config,
            shrinkFlags
        ))
    });
    made(result, newcomm, "ncclCommShrink", (None, None));
    result
}
const _: sig::ncclCommShrink = ncclCommShrink;

/// Calls a group may hold that this library only passes on, after what the group held
/// ([`serve::other_call`]); ending a communicator also forgets peerlink's state of it.
macro_rules! passed_on {
    ($($name:ident($($arg:ident: $ty:ty),*) $(forgetting $comm:ident)?;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> ncclResult_t {
            $(serve::server().forget($comm as usize);)?
            serve::other_call(|| forward!($name($($arg),*)))
        }
        const _: sig::$name = $name;
    )*};
}

passed_on! {
    ncclCommDestroy(comm: ncclComm_t) forgetting comm;
    ncclCommFinalize(comm: ncclComm_t);
    ncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: size_t, handle: *mut *mut c_void);
    ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void);
}

/// Registers the window with NCCL, then, where it is symmetric and peerlink serves the
/// communicator with other ranks, with peerlink's all-reduce too (`serve::windows`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: size_t,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    let result =
        serve::other_call(|| forward!(ncclCommWindowRegister(comm, buff, size, win, winFlags)));
    if result == NCCL_SUCCESS && !win.is_null() {
        let window = serve::Window {
            comm: comm as usize,
            address: buff as u64,
            size,
            flags: winFlags,
        };
        // Inside a group NCCL writes the handle at the group's end: read when it is needed.
        // SAFETY: the caller's out-pointer, checked for null, valid until its group ends (NCCL's
        // contract), which is when a held registration reads it.
        let handle = Box::new(move || unsafe { *win } as usize);
        serve::window_registered(&RealNccl, window, handle);
    }
    result
}
const _: sig::ncclCommWindowRegister = ncclCommWindowRegister;

/// Gives the window up in peerlink's all-reduce where it was adopted, then passes the call on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowDeregister(
    comm: ncclComm_t,
    win: ncclWindow_t,
) -> ncclResult_t {
    serve::server().deregister_window(comm as usize, win as usize);
    serve::other_call(|| forward!(ncclCommWindowDeregister(comm, win)))
}
const _: sig::ncclCommWindowDeregister = ncclCommWindowDeregister;

/// Releases the communicator's served kernels that wait for peers, forgets it, and passes the
/// abort on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    serve::server().abort(comm as usize);
    serve::other_call(|| forward!(ncclCommAbort(comm)))
}
const _: sig::ncclCommAbort = ncclCommAbort;

/// ncclRemoteError where a peer of a served communicator is lost (what NCCL, whose kernels did
/// not run those calls, cannot know); otherwise NCCL's answer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    match serve::server().async_error(comm as usize) {
        Some(code) if !asyncError.is_null() => {
            // SAFETY: the caller's out-pointer, checked for null; NCCL writes it the same way.
            unsafe { asyncError.write(code) };
            0
        }
        _ => forward!(ncclCommGetAsyncError(comm, asyncError)),
    }
}
const _: sig::ncclCommGetAsyncError = ncclCommGetAsyncError;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    // SAFETY: the type is the one NCCL gives the function.
    match unsafe { real::<sig::ncclGetErrorString>(Export::ncclGetErrorString) } {
        // SAFETY: any code may be asked about.
        Ok(function) => unsafe { function(result) },
        Err(_) => error_string(result).as_ptr(),
    }
}
const _: sig::ncclGetErrorString = ncclGetErrorString;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    if let Some(why) = no_nccl() {
        return why.as_ptr();
    }
    // SAFETY: the type is the one NCCL gives the function.
    match unsafe { real::<sig::ncclGetLastError>(Export::ncclGetLastError) } {
        // SAFETY: the caller's communicator, passed on.
        Ok(function) => unsafe { function(comm) },
        Err(_) => c"this NCCL has no ncclGetLastError".as_ptr(),
    }
}
const _: sig::ncclGetLastError = ncclGetLastError;

/// NCCL's own words for its result codes, for when there is no NCCL to ask.
fn error_string(result: ncclResult_t) -> &'static CStr {
    match result {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

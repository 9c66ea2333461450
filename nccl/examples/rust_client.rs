//! A Rust program calling NCCL's API through a library loaded by path (as vLLM loads NCCL):
//! `rust_client LIBRARY` prints each call's result code, one line each. The tests run it against
//! libpeerlink_nccl.so in front of a stand-in NCCL.

use std::ffi::{c_int, c_void};

type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;

fn main() -> Result<(), libloading::Error> {
    let path = std::env::args().nth(1).expect("usage: rust_client LIBRARY");
    // SAFETY: loading a library with NCCL's API runs only its initialisers.
    let library = unsafe { libloading::Library::new(path) }?;
    // SAFETY: each type is the one NCCL's documentation gives the function; the arguments are
    // values the stand-in only records.
    unsafe {
        let version: libloading::Symbol<Version> = library.get(b"ncclGetVersion")?;
        let mut code = 0;
        println!("ncclGetVersion {} {code}", version(&mut code));
        let start: libloading::Symbol<Group> = library.get(b"ncclGroupStart")?;
        println!("ncclGroupStart {}", start());
        let all_reduce: libloading::Symbol<AllReduce> = library.get(b"ncclAllReduce")?;
        let (send, recv) = (0x5e00 as *const c_void, 0x4e00 as *mut c_void);
        let result = all_reduce(
            send,
            recv,
            123_456_789,
            9,
            1,
            0xc0 as *mut c_void,
            0x57 as *mut c_void,
        );
        println!("ncclAllReduce {result}");
        let end: libloading::Symbol<Group> = library.get(b"ncclGroupEnd")?;
        println!("ncclGroupEnd {}", end());
    }
    Ok(())
}

//! The C layer, and the only unsafe code of the crate: the exported functions, `dlopen`, `dlsym`
//! and `dladdr`. Every exported symbol has a slot in `SLOTS` holding the real NCCL's function,
//! looked up at its first call.
//!
//! Two kinds of export:
//! - [`typed`]: the calls this library reads (collectives and point-to-point calls, groups, the
//!   calls that make communicators, the two that return strings), declared in Rust from NCCL's
//!   documentation. They count, log, hold calls of a group, and hand `ncclAllReduce` to
//!   [`crate::serve`], which decides whether peerlink serves it.
//! - `trampolines`: every other export, a tail jump through its slot. It preserves any
//!   signature (the device API's host functions return structures by value, which nccl.h gives
//!   only in C++ headers) and costs one indirect jump, so a symbol nobody reads is never
//!   re-declared — and never declared wrongly.

mod trampolines;
pub mod typed;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::exports::{Export, ALL, COUNT};
use crate::log;
use crate::resolve::{self, Loader};
use crate::stats::Counters;
use crate::switches::{Debug, Switches, LIBRARY_VARIABLE};

/// `ncclResult_t`'s values this layer answers with itself.
pub const NCCL_SUCCESS: c_int = 0;
pub const NCCL_SYSTEM_ERROR: c_int = 2;
pub const NCCL_INVALID_USAGE: c_int = 5;
pub const NCCL_IN_PROGRESS: c_int = 7;

/// The marker that tells loaders this library is not NCCL (peerlink's own loader looks for it);
/// its name is peerlink's `NCCL_FORWARDER_MARKER`.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static peerlink_nccl_forwarder: [u8; 48] =
    *b"peerlink's NCCL-API library: forwards to NCCL\0\0\0";

/// A slot's value before its first call.
const UNRESOLVED: usize = 0;
/// A slot's value once the symbol was found missing (and said so): the call gets an error code.
const UNAVAILABLE: usize = 1;

/// The real NCCL's function for each export, in [`Export`]'s order: [`UNRESOLVED`],
/// [`UNAVAILABLE`], or its address. The trampolines read it from assembly.
static SLOTS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(UNRESOLVED) }; COUNT];

/// The real NCCL (its `dlopen` handle), or why there is none; found once, at the first call.
static REAL: OnceLock<Result<usize, CString>> = OnceLock::new();

/// The switches, read with the real NCCL.
static SWITCHES: OnceLock<Switches> = OnceLock::new();

/// The calls counted, printed at exit under `PEERLINK_NCCL_DEBUG=INFO`.
pub static COUNTERS: Counters = Counters::new();

/// The switches (read from the environment on first use).
pub fn switches() -> &'static Switches {
    SWITCHES.get_or_init(|| {
        let switches = Switches::read(|name| std::env::var(name).ok());
        log::write(&switches.refused);
        switches
    })
}

/// The real NCCL's function for `export`, as type `F`, or the result code the call returns
/// instead (the reason was said on stderr once).
///
/// # Safety
/// `F` must be the function type NCCL gives the symbol.
pub unsafe fn real<F: Copy>(export: Export) -> Result<F, c_int> {
    const { assert!(size_of::<F>() == size_of::<usize>()) };
    let address = match SLOTS[export as usize].load(Ordering::Acquire) {
        UNRESOLVED | UNAVAILABLE => resolve_slot(export)?,
        address => address,
    };
    // SAFETY: `address` is the symbol's, which the caller says has type `F` (a function pointer).
    Ok(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
}

/// Whether a test installed a stand-in for the real NCCL ([`install_stand_in`]).
static STAND_IN: AtomicBool = AtomicBool::new(false);

/// For tests (and only them): makes `functions` — each export's stand-in, a function of the type
/// NCCL gives that symbol — the "real NCCL" every call forwards to, in place of the search. A
/// symbol without one returns ncclInvalidUsage. Call it before any NCCL call.
///
/// # Safety
/// Each address must be a function of the type NCCL's documentation gives its export, that stays
/// valid for the life of the process.
pub unsafe fn install_stand_in(functions: &[(Export, usize)]) {
    STAND_IN.store(true, Ordering::Release);
    for &(export, address) in functions {
        SLOTS[export as usize].store(address, Ordering::Release);
    }
    let _ = REAL.set(Ok(0));
}

/// Looks `export` up in the real NCCL and fills its slot: its address, or the code to answer
/// with (ncclSystemError without NCCL, ncclInvalidUsage for a symbol this NCCL lacks).
fn resolve_slot(export: Export) -> Result<usize, c_int> {
    if STAND_IN.load(Ordering::Acquire) {
        return Err(NCCL_INVALID_USAGE);
    }
    let handle = match real_nccl() {
        Ok(handle) => handle,
        Err(_) => return Err(NCCL_SYSTEM_ERROR),
    };
    let slot = &SLOTS[export as usize];
    if slot.load(Ordering::Acquire) == UNAVAILABLE {
        return Err(NCCL_INVALID_USAGE);
    }
    match Dl.symbol(handle, export.name()) {
        Some(address) => {
            slot.store(address, Ordering::Release);
            Ok(address)
        }
        None => {
            if slot.swap(UNAVAILABLE, Ordering::AcqRel) != UNAVAILABLE {
                log::write(&[format!(
                    "the NCCL forwarded to ({}) has no {}: the call returns ncclInvalidUsage",
                    Dl.file_of(handle).unwrap_or_default(),
                    export.name()
                )]);
            }
            Err(NCCL_INVALID_USAGE)
        }
    }
}

/// The real NCCL's handle, found at the first call (and said on stderr where not found).
fn real_nccl() -> Result<usize, &'static CStr> {
    let found = REAL.get_or_init(|| {
        let switches = switches();
        let named = std::env::var_os(LIBRARY_VARIABLE).map(PathBuf::from);
        match resolve::find(&Dl, named, peerlink::backend::cuda::nccl_search_candidates) {
            Ok(found) => {
                if switches.debug >= Debug::Info {
                    announce(found.handle, &found.how);
                }
                Ok(found.handle)
            }
            Err(sentence) => {
                log::write(&[format!(
                    "{sentence}; every NCCL call returns ncclSystemError"
                )]);
                Err(CString::new(sentence).unwrap_or_default())
            }
        }
    });
    found
        .as_ref()
        .map(|&handle| handle)
        .map_err(|why| why.as_c_str())
}

/// Why there is no real NCCL, where there is none (what `ncclGetLastError` then says).
fn no_nccl() -> Option<&'static CStr> {
    real_nccl().err()
}

/// Says which NCCL the calls go to, and prints the summary at exit.
fn announce(handle: usize, how: &str) {
    let mut version = 0;
    // SAFETY: ncclGetVersion's type, `ncclResult_t (int*)`; `version` is a valid out-pointer.
    let answered = Dl.symbol(handle, "ncclGetVersion").map(|address| unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_int) -> c_int>(address)(
            &mut version,
        )
    });
    let version = match answered {
        Some(NCCL_SUCCESS) => format!(
            "{}.{}.{}",
            version / 10000,
            version % 10000 / 100,
            version % 100
        ),
        _ => "of unknown version".to_string(),
    };
    log::write(&[format!(
        "forwarding to NCCL {version} ({}), {how}; {}",
        Dl.file_of(handle).unwrap_or_default(),
        crate::serve::server().why_forwarded()
    )]);
    extern "C" fn print_summary() {
        log::write(&COUNTERS.summary());
    }
    // SAFETY: `print_summary` is a plain function that stays loaded (this library is never
    // unloaded once it forwards).
    unsafe { libc::atexit(print_summary) };
}

/// The dynamic loader.
struct Dl;

impl Dl {
    /// `dlsym(handle, name)`'s address, if it has the symbol.
    fn symbol(&self, handle: usize, name: &str) -> Option<usize> {
        let name = CString::new(name).ok()?;
        // SAFETY: `handle` came from dlopen and is never closed; `name` is NUL-terminated.
        let address = unsafe { libc::dlsym(handle as *mut c_void, name.as_ptr()) };
        (!address.is_null()).then_some(address as usize)
    }

    /// The file the library's `ncclGetVersion` (or marker) was loaded from.
    fn file_of(&self, handle: usize) -> Option<String> {
        let address = self.symbol(handle, "ncclGetVersion")?;
        file_of_address(address as *const c_void).map(|file| file.to_string_lossy().into_owned())
    }

    /// This library's own handle.
    fn own(&self) -> Option<usize> {
        static OWN: OnceLock<Option<usize>> = OnceLock::new();
        *OWN.get_or_init(|| {
            let file = file_of_address(peerlink_nccl_forwarder.as_ptr().cast())?;
            let file = CString::new(file.to_bytes()).ok()?;
            // SAFETY: `file` names a library loaded already; RTLD_NOLOAD loads nothing.
            let handle =
                unsafe { libc::dlopen(file.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            (!handle.is_null()).then_some(handle as usize)
        })
    }
}

/// The file of the loaded object that holds `address`.
fn file_of_address(address: *const c_void) -> Option<&'static CStr> {
    // SAFETY: an all-zero Dl_info is valid (null pointers); dladdr only writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads no memory at `address`; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the loader's NUL-terminated name of an object that stays loaded.
    Some(unsafe { CStr::from_ptr(info.dli_fname) })
}

/// The loader's last error, as text.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call.
    let text: *const c_char = unsafe { libc::dlerror() };
    if text.is_null() {
        return "unknown reason".to_string();
    }
    // SAFETY: non-null, as above.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

impl Loader for Dl {
    type Handle = usize;

    fn open(&self, path: &Path) -> Result<usize, String> {
        let name = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: loading NCCL runs only its own initialisers; RTLD_LOCAL keeps its symbols out
        // of the global scope, where they would shadow nothing of ours anyway.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dl_error());
        }
        Ok(handle as usize)
    }

    fn loaded(&self, name: &str) -> Option<usize> {
        let name = CString::new(name).ok()?;
        // SAFETY: RTLD_NOLOAD only looks up a library loaded already.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        (!handle.is_null()).then_some(handle as usize)
    }

    fn is_ours(&self, handle: usize) -> bool {
        Some(handle) == self.own() || self.symbol(handle, "peerlink_nccl_forwarder").is_some()
    }
}

/// Where a trampoline's slot is not yet filled: the address to jump to, the real function or one
/// that returns the error code. Called from the trampolines' assembly.
extern "C" fn resolve_for_trampoline(index: usize) -> usize {
    extern "C" fn invalid_usage() -> c_int {
        NCCL_INVALID_USAGE
    }
    extern "C" fn system_error() -> c_int {
        NCCL_SYSTEM_ERROR
    }
    let Some(&export) = ALL.get(index) else {
        return invalid_usage as extern "C" fn() -> c_int as usize;
    };
    match resolve_slot(export) {
        Ok(address) => address,
        Err(NCCL_SYSTEM_ERROR) => system_error as extern "C" fn() -> c_int as usize,
        Err(_) => invalid_usage as extern "C" fn() -> c_int as usize,
    }
}

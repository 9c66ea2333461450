//! NCCL, loaded at run time by a small loader of peerlink's own, for one process driving all its
//! GPUs (`ncclCommInitAll`), or for one rank of a communicator across processes, one GPU each
//! (`ncclGetUniqueId` on one rank, `ncclCommInitRank` on every rank).
//!
//! cudarc's NCCL loader tries only `libnccl.so`, a name pip's NCCL wheel (the one PyTorch installs)
//! does not ship: it has `libnccl.so.2` alone. So the library is looked for here: the one the user
//! named (`--nccl-lib`, through [`prefer_library`], or `PEERLINK_NCCL_LIB`) and nothing else; or else
//! `libnccl.so.2` and `libnccl.so` through the dynamic loader's own search, then the wheel's
//! `nvidia/nccl/lib/libnccl.so.2` in the Python installs, the active environment's first. Only the
//! few functions peerlink calls are resolved. A loaded library stays loaded for the life of the
//! process: NCCL keeps threads and global state that unloading would pull away.

use std::error::Error as _;
use std::ffi::{c_char, c_int, c_void, CStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaContext;

use super::{lock, Buffer, Gpus, Stream};
use crate::backend::collective::{
    CommRank, DataType, PeerOp, PeerTransfer, UniqueId, UNIQUE_ID_BYTES,
};
use crate::backend::RawRank;
use crate::{Error, Result};

/// The environment variable that names NCCL's library when `--nccl-lib` does not.
pub const LIBRARY_VARIABLE: &str = "PEERLINK_NCCL_LIB";

/// Names the dynamic loader looks up itself (LD_LIBRARY_PATH, the ld.so cache, the system
/// directories): the soname first, as NCCL's packages and wheels all ship it.
const LOADER_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where pip's NCCL wheel puts the library, under a `site-packages` or `dist-packages` directory.
const WHEEL_LIBRARY: &str = "nvidia/nccl/lib/libnccl.so.2";

/// The symbol peerlink's NCCL-API library (`libpeerlink_nccl.so`, which forwards to NCCL) exports
/// so that no loader takes it for NCCL itself, also where it stands as `libnccl.so.2`.
pub const FORWARDER_MARKER: &str = "peerlink_nccl_forwarder";

/// The library `--nccl-lib` named, for this process.
static PREFERRED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// NCCL once loaded; it is never unloaded.
static LOADED: Mutex<Option<&'static Library>> = Mutex::new(None);

/// Makes NCCL load from `path` alone, in place of the search (what `--nccl-lib` does). Takes effect
/// if NCCL has not been loaded yet in this process.
pub fn prefer_library(path: impl Into<PathBuf>) {
    *lock(&PREFERRED) = Some(path.into());
}

/// `ncclResult_t`. An enum in C, taken as its `int` so that a code this file does not know is
/// still a value, not undefined behaviour.
type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;

/// `ncclComm_t`.
type RawComm = *mut c_void;

/// `ncclUniqueId`: `typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;`,
/// passed by value to ncclCommInitRank.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawUniqueId {
    internal: [u8; UNIQUE_ID_BYTES],
}

/// `ncclDataType_t` values (stable in NCCL's ABI; bfloat16 since NCCL 2.10).
const NCCL_UINT8: c_int = 1;
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
/// `ncclRedOp_t`'s ncclSum.
const NCCL_SUM: c_int = 0;

fn nccl_type(dtype: DataType) -> c_int {
    match dtype {
        DataType::F32 => NCCL_FLOAT32,
        DataType::Bf16 => NCCL_BFLOAT16,
        DataType::F16 => NCCL_FLOAT16,
    }
}

/// The functions peerlink calls, as NCCL's header declares them (`cudaStream_t` is a `CUstream`).
struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, RawUniqueId, c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        CUstream,
    ) -> NcclResult,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, CUstream) -> NcclResult,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, CUstream) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
}

/// A copy of the symbol's function pointer (valid while the library stays loaded), or the name
/// of the symbol the library lacks.
///
/// # Safety
/// `T` must be the symbol's true function type.
unsafe fn function<T: Copy>(
    library: &libloading::Library,
    name: &'static str,
) -> std::result::Result<T, &'static str> {
    // SAFETY: the caller names the type NCCL's header gives the symbol.
    unsafe { library.get::<T>(name) }
        .map(|symbol| *symbol)
        .map_err(|_| name)
}

impl Api {
    /// Every function, or the name of the first one the library lacks.
    fn resolve(library: &libloading::Library) -> std::result::Result<Api, &'static str> {
        // SAFETY: each type above is the one nccl.h declares for the name (NCCL 2.7 and newer).
        unsafe {
            Ok(Api {
                get_version: function(library, "ncclGetVersion")?,
                get_error_string: function(library, "ncclGetErrorString")?,
                comm_init_all: function(library, "ncclCommInitAll")?,
                get_unique_id: function(library, "ncclGetUniqueId")?,
                comm_init_rank: function(library, "ncclCommInitRank")?,
                comm_destroy: function(library, "ncclCommDestroy")?,
                all_reduce: function(library, "ncclAllReduce")?,
                send: function(library, "ncclSend")?,
                recv: function(library, "ncclRecv")?,
                group_start: function(library, "ncclGroupStart")?,
                group_end: function(library, "ncclGroupEnd")?,
            })
        }
    }
}

/// `ncclWindow_t`.
type RawWindow = *mut c_void;

/// `NCCL_WIN_COLL_SYMMETRIC`: a window every rank registers at once, for the symmetric kernels.
const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;

/// The functions of NCCL's symmetric windows (NCCL 2.27 and newer), as nccl.h declares them.
struct WindowApi {
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> NcclResult,
    mem_free: unsafe extern "C" fn(*mut c_void) -> NcclResult,
    register:
        unsafe extern "C" fn(RawComm, *mut c_void, usize, *mut RawWindow, c_int) -> NcclResult,
    deregister: unsafe extern "C" fn(RawComm, RawWindow) -> NcclResult,
}

impl WindowApi {
    /// Every function, or the name of the first one the library lacks (an NCCL before 2.27).
    fn resolve(library: &libloading::Library) -> std::result::Result<WindowApi, &'static str> {
        // SAFETY: each type is the one nccl.h declares for the name (NCCL 2.27 and newer).
        unsafe {
            Ok(WindowApi {
                mem_alloc: function(library, "ncclMemAlloc")?,
                mem_free: function(library, "ncclMemFree")?,
                register: function(library, "ncclCommWindowRegister")?,
                deregister: function(library, "ncclCommWindowDeregister")?,
            })
        }
    }
}

/// The sentence for an NCCL without symmetric windows: `missing` is the first function it lacks.
fn windows_missing(version: &str, missing: &str) -> String {
    format!(
        "NCCL {version} has no {missing}: symmetric windows (ncclCommWindowRegister) came with \
         NCCL 2.27; name a newer NCCL with --nccl-lib or PEERLINK_NCCL_LIB"
    )
}

/// Why the environment keeps NCCL from registering symmetric windows, if it does: they need cuMem
/// memory (`NCCL_CUMEM_ENABLE`) and NCCL's windows on (`NCCL_WIN_ENABLE`), both on by default.
fn windows_turned_off(variable: impl Fn(&str) -> Option<OsString>) -> Option<String> {
    let off = |name: &str| variable(name).is_some_and(|value| value.to_str() == Some("0"));
    if off("NCCL_CUMEM_ENABLE") {
        return Some(
            "NCCL_CUMEM_ENABLE=0 in the environment turns off the cuMem memory NCCL's symmetric \
             windows need; unset it for them"
                .into(),
        );
    }
    off("NCCL_WIN_ENABLE").then(|| {
        "NCCL_WIN_ENABLE=0 in the environment turns NCCL's windows off; unset it for them".into()
    })
}

/// A loaded NCCL: its functions, its version and the file they came from.
pub(super) struct Library {
    api: Api,
    /// The symmetric windows' functions, or why this NCCL has none.
    windows: std::result::Result<WindowApi, String>,
    version: String,
    file: String,
    /// Keeps the functions loaded (the library is leaked, so for the whole process).
    _library: libloading::Library,
}

/// NCCL, loaded on the first call (and then for the whole process), or one sentence why not. A
/// search that failed is made again on the next call.
pub(super) fn open() -> std::result::Result<&'static Library, String> {
    let mut loaded = lock(&LOADED);
    if let Some(library) = *loaded {
        return Ok(library);
    }
    // NVLink SHARP (NVLS) makes NVLink multicast objects, which can take a shared host's GPUs out
    // of service: peerlink never lets NCCL use it. NCCL reads the variable when it makes a
    // communicator; setting it before the library is even loaded leaves no way round it.
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    let preferred = lock(&PREFERRED).clone();
    let library = match named(preferred, std::env::var_os(LIBRARY_VARIABLE)) {
        Some((path, by)) => Library::load(&path).map_err(|why| {
            format!(
                "NCCL named by {by} ({}) cannot be used: {why}; name NCCL's libnccl.so.2 instead \
                 (pip's nvidia-nccl wheels put it under nvidia/nccl/lib)",
                path.display()
            )
        })?,
        None => search(&search_candidates())?,
    };
    let library: &'static Library = Box::leak(Box::new(library));
    *loaded = Some(library);
    Ok(library)
}

/// The NCCL [`open`] loaded.
pub(super) fn opened() -> Result<&'static Library> {
    lock(&LOADED).ok_or_else(|| Error::usage("NCCL was not opened: ask the backend for it first"))
}

/// The library the user named, and how they named it: `--nccl-lib` over the environment.
fn named(
    preferred: Option<PathBuf>,
    variable: Option<OsString>,
) -> Option<(PathBuf, &'static str)> {
    match (preferred, variable) {
        (Some(path), _) => Some((path, "--nccl-lib")),
        (None, Some(path)) if !path.is_empty() => Some((path.into(), LIBRARY_VARIABLE)),
        _ => None,
    }
}

/// The `lib` directories whose `python3*` directories may hold a PyTorch install, in the order a
/// Python started now would use them: the active environment's, the user's, the system's.
fn python_lib_dirs(variable: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let set = |name| {
        variable(name)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    };
    let mut dirs: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .into_iter()
        .filter_map(|name| set(name).map(|prefix| prefix.join("lib")))
        .collect();
    dirs.extend(set("HOME").map(|home| home.join(".local/lib")));
    dirs.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    dirs
}

/// The wheel's libraries that exist under `python3*/site-packages` or `python3*/dist-packages` of
/// each directory, in the directories' order, each once.
fn wheel_libraries(lib_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in lib_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
            .map(|entry| entry.path())
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let library = python.join(packages).join(WHEEL_LIBRARY);
                if library.is_file() && !found.contains(&library) {
                    found.push(library);
                }
            }
        }
    }
    found
}

/// Every library the search tries when none is named, in order: the dynamic loader's names, then
/// the wheels found in this process's Python installs. NCCL-API libraries (peerlink's own) use it
/// to find the NCCL they stand in front of.
pub fn search_candidates() -> Vec<PathBuf> {
    candidates(&python_lib_dirs(|name| std::env::var_os(name)))
}

/// Every place the search tries, in order: the loader's names, then the wheels found.
fn candidates(lib_dirs: &[PathBuf]) -> Vec<PathBuf> {
    LOADER_NAMES
        .iter()
        .map(PathBuf::from)
        .chain(wheel_libraries(lib_dirs))
        .collect()
}

/// The first candidate that loads as NCCL, or a sentence naming where the search looked and what
/// to do (and why a library that was there could not be used).
fn search(candidates: &[PathBuf]) -> std::result::Result<Library, String> {
    let mut refusals = Vec::new();
    for candidate in candidates {
        match Library::load(candidate) {
            Ok(library) => return Ok(library),
            Err(why) if absent(candidate, &why) => {}
            Err(why) => refusals.push(format!("{} could not be used ({why})", candidate.display())),
        }
    }
    let mut sentence = format!(
        "NCCL was not found (looked for {} through the dynamic loader, and for {WHEEL_LIBRARY} in \
         the Python packages of $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local, /usr/local and /usr)",
        LOADER_NAMES.join(" and ")
    );
    if !refusals.is_empty() {
        sentence += &format!("; {}", refusals.join("; "));
    }
    sentence += &format!(
        ": install NCCL 2 (the libnccl2 package, or PyTorch), or name the library with \
         --nccl-lib PATH or {LIBRARY_VARIABLE}=PATH"
    );
    Err(sentence)
}

/// Whether a failed load only means the candidate is not there (the loader names the missing file
/// first; a library that is there but lacks a dependency names the dependency instead).
fn absent(candidate: &Path, why: &str) -> bool {
    why.starts_with(&format!(
        "{}: cannot open shared object file",
        candidate.display()
    ))
}

impl Library {
    /// Loads `path` (a file, or a name for the dynamic loader) and checks it is NCCL.
    fn load(path: &Path) -> std::result::Result<Library, String> {
        // SAFETY: loading runs the library's initialisers, which for NCCL only set up its own state.
        let library = unsafe { libloading::Library::new(path) }.map_err(|error| {
            // libloading's own text is only "dlopen failed"; the loader's reason is its source.
            error
                .source()
                .map_or_else(|| error.to_string(), |source| source.to_string())
        })?;
        // SAFETY: only the symbol's presence is read, never its value.
        if unsafe { library.get::<*const c_void>(FORWARDER_MARKER) }.is_ok() {
            return Err(
                "it is peerlink's NCCL-API library, which forwards to NCCL rather than \
                        being it"
                    .to_string(),
            );
        }
        let api = Api::resolve(&library)
            .map_err(|missing| format!("it has no {missing}, so it is not NCCL 2.7 or newer"))?;
        let mut code = 0;
        // SAFETY: `code` is a valid out-pointer; the call needs nothing set up.
        let answered = unsafe { (api.get_version)(&mut code) };
        if answered != NCCL_SUCCESS {
            return Err(format!(
                "ncclGetVersion failed with ncclResult_t {answered}"
            ));
        }
        let file = loaded_from(api.get_version as *const c_void)
            .unwrap_or_else(|| path.display().to_string());
        let version = version_text(code);
        let windows =
            WindowApi::resolve(&library).map_err(|missing| windows_missing(&version, missing));
        Ok(Library {
            api,
            windows,
            version,
            file,
            _library: library,
        })
    }

    /// NCCL's version and file: `NCCL 2.28.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2)`.
    pub(super) fn describe(&self) -> String {
        format!("NCCL {} ({})", self.version, self.file)
    }

    /// A communicator over `devices` (distinct GPUs, at least one): rank `i` on `devices[i]`.
    pub(super) fn communicator(&'static self, devices: &[usize]) -> Result<Comm> {
        let ordinals: Vec<c_int> = devices.iter().map(|&device| device as c_int).collect();
        let mut comms: Vec<RawComm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device; the checked layer checked the
        // ordinals are distinct GPUs of this host. NCCL makes each device current itself.
        let made = unsafe {
            (self.api.comm_init_all)(
                comms.as_mut_ptr(),
                ordinals.len() as c_int,
                ordinals.as_ptr(),
            )
        };
        self.check("ncclCommInitAll", made)?;
        Ok(Comm {
            library: self,
            ranks: Mutex::new(comms.into_iter().map(RankComm).collect()),
        })
    }

    /// A fresh unique id (`ncclGetUniqueId`): NCCL opens its bootstrap socket for it.
    pub(super) fn unique_id(&self) -> Result<UniqueId> {
        let mut id = RawUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: `id` is a valid out-pointer to a struct of ncclUniqueId's layout.
        let made = unsafe { (self.api.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", made)?;
        UniqueId::from_bytes(&id.internal)
    }

    /// This process's rank of a communicator across processes (`ncclCommInitRank`), on the GPU
    /// whose context is current on this thread (the caller binds `rank.device`'s); returns once
    /// every rank has joined.
    pub(super) fn join(&'static self, id: &UniqueId, rank: CommRank) -> Result<Comm> {
        let mut comm: RawComm = std::ptr::null_mut();
        let id = RawUniqueId {
            internal: *id.as_bytes(),
        };
        // SAFETY: `comm` is a valid out-pointer; the id is ncclUniqueId's layout, passed by value as
        // nccl.h declares; the checked layer checked rank < world. NCCL takes the current device.
        let made = unsafe {
            (self.api.comm_init_rank)(&mut comm, rank.world as c_int, id, rank.rank as c_int)
        };
        self.check("ncclCommInitRank", made)?;
        Ok(Comm {
            library: self,
            ranks: Mutex::new(vec![RankComm(comm)]),
        })
    }

    /// Whether this NCCL has symmetric windows and the environment leaves them on, or why not.
    pub(super) fn symmetric(&self) -> std::result::Result<(), String> {
        self.windows.as_ref().map_err(Clone::clone)?;
        match windows_turned_off(|name| std::env::var_os(name)) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// The symmetric windows' functions ([`Library::symmetric`] said they are there).
    fn windows(&self) -> Result<&WindowApi> {
        self.windows
            .as_ref()
            .map_err(|why| Error::usage(why.clone()))
    }

    /// `bytes` from `ncclMemAlloc` on GPU `device`, whose context is current on this thread.
    pub(super) fn alloc(&'static self, device: usize, bytes: usize) -> Result<WindowMemory> {
        let windows = self.windows()?;
        let mut pointer: *mut c_void = std::ptr::null_mut();
        // SAFETY: `pointer` is a valid out-pointer; NCCL allocates on the current device.
        let made = unsafe { (windows.mem_alloc)(&mut pointer, bytes) };
        self.check("ncclMemAlloc", made)?;
        Ok(WindowMemory {
            address: pointer as u64,
            device,
            free: windows.mem_free,
        })
    }

    /// A failed call as the library's error, in NCCL's words.
    fn check(&self, call: &str, result: NcclResult) -> Result<()> {
        if result == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe {
            let text = (self.api.get_error_string)(result);
            if text.is_null() {
                "unknown error".into()
            } else {
                CStr::from_ptr(text).to_string_lossy()
            }
        };
        Err(Error::Cuda {
            call: call.to_string(),
            message: format!(
                "{text} (ncclResult_t {result}); NCCL_DEBUG=WARN in the environment makes NCCL \
                 say more"
            ),
        })
    }

    /// Runs `queue` between ncclGroupStart and ncclGroupEnd, so that NCCL launches the work of
    /// every rank at once. The group is closed whatever `queue` answers: an open group would
    /// swallow this thread's next calls.
    fn group(&self, queue: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: no arguments; groups nest.
        self.check("ncclGroupStart", unsafe { (self.api.group_start)() })?;
        let queued = queue();
        // SAFETY: closes the group opened above.
        let ended = self.check("ncclGroupEnd", unsafe { (self.api.group_end)() });
        queued.and(ended)
    }
}

/// The file a function was loaded from, as the dynamic loader resolved it.
fn loaded_from(function: *const c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value for dladdr to overwrite.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `function` is an address inside a loaded library; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(function, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set dli_fname to the loader's NUL-terminated path of the library.
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(file.to_string_lossy().into_owned())
}

/// NCCL's version code as people write it: `22803` → `2.28.3` (`2804` → `2.8.4` before 2.9).
fn version_text(code: c_int) -> String {
    let (major, minor, patch) = if code >= 10_000 {
        (code / 10_000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    };
    format!("{major}.{minor}.{patch}")
}

/// Memory from `ncclMemAlloc`, released with `ncclMemFree` when dropped.
pub struct WindowMemory {
    address: u64,
    device: usize,
    free: unsafe extern "C" fn(*mut c_void) -> NcclResult,
}

impl WindowMemory {
    pub(super) fn address(&self) -> u64 {
        self.address
    }

    pub(super) fn device(&self) -> usize {
        self.device
    }
}

impl Drop for WindowMemory {
    fn drop(&mut self) {
        // SAFETY: the address came from ncclMemAlloc and is freed once, here, after every window
        // that held it was deregistered (windows keep their buffers alive); NCCL finds its GPU
        // from the address. A failure cannot be reported from drop.
        let _ = unsafe { (self.free)(self.address as *mut c_void) };
    }
}

/// One rank's handle of a symmetric window.
struct RankWindow(RawWindow);

// SAFETY: a window handle names NCCL's heap state, not bound to a thread; it is used only through
// its communicator, under the communicator's lock.
unsafe impl Send for RankWindow {}
// SAFETY: as above; a shared window is only read (its handle passed to NCCL under that lock).
unsafe impl Sync for RankWindow {}

/// A symmetric window: each rank's handle, and the GPU context each was registered in.
pub struct Window {
    ranks: Vec<RankWindow>,
    contexts: Vec<Arc<CudaContext>>,
}

/// One rank's NCCL communicator.
struct RankComm(RawComm);

// SAFETY: an NCCL communicator is a handle to NCCL's heap state, not bound to the thread that made
// it; `Comm` uses it only under its mutex, one thread at a time, as NCCL requires.
unsafe impl Send for RankComm {}

/// An NCCL communicator over some GPUs, one rank per GPU; destroyed when dropped, if not before.
pub struct Comm {
    library: &'static Library,
    /// Each rank's communicator, in rank order. Every call holds the lock: NCCL communicators must
    /// not be used by two threads at once.
    ranks: Mutex<Vec<RankComm>>,
}

impl Comm {
    /// `ncclAllReduce` (sum) of `len` bytes on every rank, in one group (arguments as
    /// `RawCollectives::nccl_all_reduce` promises).
    pub(super) fn all_reduce(
        &self,
        dtype: DataType,
        ranks: &[RawRank<'_, Gpus>],
        len: usize,
    ) -> Result<()> {
        let comms = lock(&self.ranks);
        let library = self.library;
        library.group(|| {
            for (comm, rank) in comms.iter().zip(ranks) {
                // SAFETY: the checked layer checked that both buffers hold `len` bytes of this
                // rank's GPU and that the stream is on it; the communicator is live (under lock).
                let queued = unsafe {
                    (library.api.all_reduce)(
                        rank.input.address() as *const c_void,
                        rank.output.address() as *mut c_void,
                        len / dtype.size(),
                        nccl_type(dtype),
                        NCCL_SUM,
                        comm.0,
                        rank.stream.stream.cu_stream(),
                    )
                };
                library.check("ncclAllReduce", queued)?;
            }
            Ok(())
        })
    }

    /// `ncclSend` on the sender's stream and `ncclRecv` on the receiver's for every transfer, in
    /// one group (arguments as `RawCollectives::nccl_send_recv` promises).
    pub(super) fn send_recv(
        &self,
        streams: &[&Arc<Stream>],
        transfers: &[PeerTransfer<&Arc<Buffer>>],
    ) -> Result<()> {
        let comms = lock(&self.ranks);
        let library = self.library;
        library.group(|| {
            for transfer in transfers {
                let (from, to) = (transfer.from, transfer.to);
                let src = transfer.src.buffer.address() + transfer.src.offset as u64;
                let dst = transfer.dst.buffer.address() + transfer.dst.offset as u64;
                // SAFETY: the checked layer checked both ranges (same length) lie on the sender's
                // and the receiver's GPU, both ranks exist and differ, and each stream is on its
                // rank's GPU; the communicators are live (under lock).
                let sent = unsafe {
                    (library.api.send)(
                        src as *const c_void,
                        transfer.src.len,
                        NCCL_UINT8,
                        to as c_int,
                        comms[from].0,
                        streams[from].stream.cu_stream(),
                    )
                };
                library.check("ncclSend", sent)?;
                // SAFETY: as above, for the receiving side.
                let received = unsafe {
                    (library.api.recv)(
                        dst as *mut c_void,
                        transfer.dst.len,
                        NCCL_UINT8,
                        from as c_int,
                        comms[to].0,
                        streams[to].stream.cu_stream(),
                    )
                };
                library.check("ncclRecv", received)?;
            }
            Ok(())
        })
    }

    /// This process's one rank's `ncclSend`s and `ncclRecv`s, in one group on `stream` (arguments
    /// as `RawCollectives::nccl_rank_send_recv` promises).
    pub(super) fn rank_send_recv(
        &self,
        stream: &Arc<Stream>,
        ops: &[PeerOp<&Arc<Buffer>>],
    ) -> Result<()> {
        let comms = lock(&self.ranks);
        let comm = comms[0].0;
        let library = self.library;
        let stream = stream.stream.cu_stream();
        library.group(|| {
            for op in ops {
                let range = op.range();
                let at = range.buffer.address() + range.offset as u64;
                let (call, queued) = match *op {
                    // SAFETY: the checked layer checked the range lies in memory of this rank's
                    // GPU, the stream is on it and the peer is another rank; the communicator is
                    // live (under lock).
                    PeerOp::Send { to, .. } => ("ncclSend", unsafe {
                        (library.api.send)(
                            at as *const c_void,
                            range.len,
                            NCCL_UINT8,
                            to as c_int,
                            comm,
                            stream,
                        )
                    }),
                    // SAFETY: as above; receive destinations do not overlap.
                    PeerOp::Recv { from, .. } => ("ncclRecv", unsafe {
                        (library.api.recv)(
                            at as *mut c_void,
                            range.len,
                            NCCL_UINT8,
                            from as c_int,
                            comm,
                            stream,
                        )
                    }),
                };
                library.check(call, queued)?;
            }
            Ok(())
        })
    }

    /// Registers `addresses[i]` (ncclMemAlloc's memory, `bytes` long, on `contexts[i]`'s GPU) as
    /// rank `i`'s part of one symmetric window, every rank in one group: the registration is
    /// collective. NCCL answers success with no window where its symmetric memory is off on this
    /// communicator: that is an error here.
    pub(super) fn register_window(
        &self,
        contexts: Vec<Arc<CudaContext>>,
        addresses: &[u64],
        bytes: usize,
    ) -> Result<Window> {
        let comms = lock(&self.ranks);
        let library = self.library;
        let windows = library.windows()?;
        // Filled in by ncclGroupEnd: NCCL writes each handle when the group completes.
        let mut handles: Vec<RawWindow> = vec![std::ptr::null_mut(); comms.len()];
        let out = handles.as_mut_ptr();
        library.group(|| {
            for (i, (comm, &address)) in comms.iter().zip(addresses).enumerate() {
                super::driver::bind(&contexts[i])?;
                // SAFETY: the checked layer checked the memory came from ncclMemAlloc on this
                // rank's GPU (bound above) and holds `bytes`; `out.add(i)` lies in `handles`,
                // which stays in place until the group has ended; the communicator is live.
                let registered = unsafe {
                    (windows.register)(
                        comm.0,
                        address as *mut c_void,
                        bytes,
                        out.add(i),
                        NCCL_WIN_COLL_SYMMETRIC,
                    )
                };
                library.check("ncclCommWindowRegister", registered)?;
            }
            Ok(())
        })?;
        let window = Window {
            ranks: handles.into_iter().map(RankWindow).collect(),
            contexts,
        };
        if window.ranks.iter().any(|w| w.0.is_null()) {
            drop(comms);
            let _ = self.deregister_window(window);
            return Err(Error::Cuda {
                call: "ncclCommWindowRegister".into(),
                message: "NCCL registered no symmetric window on this communicator (its \
                          symmetric memory is off: cuMem unavailable, or GPUs without P2P \
                          between them); NCCL_DEBUG=INFO says why"
                    .into(),
            });
        }
        Ok(window)
    }

    /// Deregisters every rank's part of `window`, in one group; the first failure is the answer.
    pub(super) fn deregister_window(&self, window: Window) -> Result<()> {
        let comms = lock(&self.ranks);
        let library = self.library;
        let windows = library.windows()?;
        library.group(|| {
            let ranks = comms.iter().zip(&window.ranks).zip(&window.contexts);
            for ((comm, handle), context) in ranks.filter(|((_, h), _)| !h.0.is_null()) {
                super::driver::bind(context)?;
                // SAFETY: the handle came from ncclCommWindowRegister on this communicator (the
                // checked layer keeps a window with its communicator) and is deregistered once:
                // the window is consumed here.
                let done = unsafe { (windows.deregister)(comm.0, handle.0) };
                library.check("ncclCommWindowDeregister", done)?;
            }
            Ok(())
        })
    }

    /// Destroys every rank's communicator (NCCL finishes the work queued on it first); the first
    /// failure is the answer.
    pub(super) fn destroy(self) -> Result<()> {
        let comms = std::mem::take(&mut *lock(&self.ranks));
        let mut outcome = Ok(());
        for comm in comms {
            // SAFETY: the communicator came from ncclCommInitAll and is destroyed once: it was
            // taken out of the table, which the drop below then finds empty.
            let destroyed = unsafe { (self.library.api.comm_destroy)(comm.0) };
            let checked = self.library.check("ncclCommDestroy", destroyed);
            outcome = outcome.and(checked);
        }
        outcome
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        for comm in std::mem::take(&mut *lock(&self.ranks)) {
            // SAFETY: as in `destroy`; a failure cannot be reported from drop.
            let _ = unsafe { (self.library.api.comm_destroy)(comm.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn the_flag_wins_over_the_environment_and_an_empty_variable_names_nothing() {
        let flag = Some(PathBuf::from("/opt/nccl/libnccl.so.2"));
        let variable = Some(OsString::from("/env/libnccl.so.2"));
        assert_eq!(
            named(flag.clone(), variable.clone()),
            Some((PathBuf::from("/opt/nccl/libnccl.so.2"), "--nccl-lib"))
        );
        assert_eq!(
            named(None, variable),
            Some((PathBuf::from("/env/libnccl.so.2"), LIBRARY_VARIABLE))
        );
        assert_eq!(named(None, Some(OsString::new())), None);
        assert_eq!(named(None, None), None);
    }

    #[test]
    fn python_installs_are_searched_active_environment_first() {
        let variables = |name: &str| match name {
            "VIRTUAL_ENV" => Some(OsString::from("/work/venv")),
            "CONDA_PREFIX" => Some(OsString::new()),
            "HOME" => Some(OsString::from("/home/me")),
            _ => None,
        };
        assert_eq!(
            python_lib_dirs(variables),
            [
                "/work/venv/lib",
                "/home/me/.local/lib",
                "/usr/local/lib",
                "/usr/lib"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            python_lib_dirs(|_| None),
            ["/usr/local/lib", "/usr/lib"].map(PathBuf::from)
        );
    }

    #[test]
    fn the_search_tries_the_loader_names_then_every_wheel_found() {
        let root = tempfile::tempdir().unwrap();
        let wheel = |dir: &str| {
            let library = root.path().join(dir).join(WHEEL_LIBRARY);
            fs::create_dir_all(library.parent().unwrap()).unwrap();
            fs::write(&library, b"not a library").unwrap();
            library
        };
        let venv = wheel("venv/lib/python3.12/site-packages");
        let debian = wheel("usr/lib/python3/dist-packages");
        let usr_site = wheel("usr/lib/python3.11/site-packages");
        // Not Python, not the wheel's layout, not a file: none of them is tried.
        wheel("usr/lib/perl5/site-packages");
        fs::create_dir_all(root.path().join("usr/lib/python3.10/site-packages")).unwrap();
        fs::create_dir_all(
            root.path()
                .join("usr/lib/python3.9/site-packages")
                .join(WHEEL_LIBRARY),
        )
        .unwrap();
        let dirs = [
            root.path().join("venv/lib"),
            root.path().join("missing/lib"),
            root.path().join("usr/lib"),
            root.path().join("venv/lib"),
        ];
        assert_eq!(
            candidates(&dirs),
            vec![
                PathBuf::from("libnccl.so.2"),
                PathBuf::from("libnccl.so"),
                venv,
                debian,
                usr_site
            ]
        );
    }

    #[test]
    fn a_search_that_finds_nothing_says_where_it_looked_and_what_to_do() {
        let root = tempfile::tempdir().unwrap();
        let wheel = root
            .path()
            .join("lib/python3.12/site-packages")
            .join(WHEEL_LIBRARY);
        fs::create_dir_all(wheel.parent().unwrap()).unwrap();
        fs::write(&wheel, b"not a library").unwrap();
        // No NCCL on this machine (CI, a laptop): every loader name is absent and the fake wheel
        // is there but is no library. Where NCCL is installed, the search finds it instead.
        let Err(sentence) = search(&candidates(&[root.path().join("lib")])) else {
            eprintln!("skipped: this machine has NCCL");
            return;
        };
        for words in [
            "NCCL was not found",
            "libnccl.so.2 and libnccl.so through the dynamic loader",
            "$VIRTUAL_ENV",
            &format!("{} could not be used (", wheel.display()),
            "--nccl-lib PATH or PEERLINK_NCCL_LIB=PATH",
        ] {
            assert!(
                sentence.contains(words),
                "{words:?} missing from: {sentence}"
            );
        }
        assert!(!sentence.contains("libnccl.so could not"), "{sentence}");
    }

    #[test]
    fn peerlinks_nccl_api_library_is_never_taken_for_nccl() {
        let dir = tempfile::tempdir().unwrap();
        let (source, library) = (dir.path().join("marker.c"), dir.path().join("libnccl.so.2"));
        fs::write(&source, format!("char {FORWARDER_MARKER}[1];\n")).unwrap();
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .args([&library, &source])
            .status();
        if !matches!(built, Ok(status) if status.success()) {
            eprintln!("skipped: no C compiler (cc) to build a library with the marker");
            return;
        }
        let Err(why) = Library::load(&library) else {
            panic!("a library with {FORWARDER_MARKER} was taken for NCCL");
        };
        assert_eq!(
            why,
            "it is peerlink's NCCL-API library, which forwards to NCCL rather than being it"
        );
    }

    /// A library of `source` (C), built with `cc` into `dir` as `libnccl.so.2`; `None` without a
    /// C compiler.
    fn built(dir: &Path, source: &str) -> Option<PathBuf> {
        let (file, library) = (dir.join("fake.c"), dir.join("libnccl.so.2"));
        fs::write(&file, source).unwrap();
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .args([&library, &file])
            .status();
        matches!(built, Ok(status) if status.success()).then_some(library)
    }

    /// A stand-in for NCCL `version` with the functions every NCCL since 2.7 has, and `more`.
    fn fake_nccl(version: u32, more: &[&str]) -> String {
        let mut source = format!("int ncclGetVersion(int* v) {{ *v = {version}; return 0; }}\n");
        let functions = [
            "ncclGetErrorString",
            "ncclCommInitAll",
            "ncclGetUniqueId",
            "ncclCommInitRank",
            "ncclCommDestroy",
            "ncclAllReduce",
            "ncclSend",
            "ncclRecv",
            "ncclGroupStart",
            "ncclGroupEnd",
        ];
        for name in functions.iter().chain(more) {
            source += &format!("int {name}(void) {{ return 1; }}\n");
        }
        source
    }

    #[test]
    fn an_nccl_without_window_functions_says_so_and_one_with_them_has_windows() {
        let dir = tempfile::tempdir().unwrap();
        let Some(old) = built(dir.path(), &fake_nccl(22603, &["ncclMemAlloc"])) else {
            eprintln!("skipped: no C compiler (cc) to build stand-ins for NCCL");
            return;
        };
        let library = Library::load(&old).unwrap();
        assert_eq!(
            library.windows.as_ref().err().map(String::as_str),
            Some(
                "NCCL 2.26.3 has no ncclMemFree: symmetric windows (ncclCommWindowRegister) came \
                 with NCCL 2.27; name a newer NCCL with --nccl-lib or PEERLINK_NCCL_LIB"
            )
        );
        let newer = tempfile::tempdir().unwrap();
        let all = [
            "ncclMemAlloc",
            "ncclMemFree",
            "ncclCommWindowRegister",
            "ncclCommWindowDeregister",
        ];
        let new = built(newer.path(), &fake_nccl(22803, &all)).unwrap();
        let library = Library::load(&new).unwrap();
        assert!(library.windows.is_ok(), "{:?}", library.windows.err());
        // Its sentence, where the environment turns windows off, is the environment's.
        if windows_turned_off(|name| std::env::var_os(name)).is_none() {
            assert_eq!(library.symmetric(), Ok(()));
        }
    }

    #[test]
    fn the_environment_can_turn_nccls_windows_off_and_says_which_variable() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(windows_turned_off(with(&[])), None);
        assert_eq!(
            windows_turned_off(with(&[("NCCL_CUMEM_ENABLE", "1")])),
            None
        );
        let cumem = windows_turned_off(with(&[("NCCL_CUMEM_ENABLE", "0")])).unwrap();
        assert!(
            cumem.starts_with("NCCL_CUMEM_ENABLE=0 in the environment"),
            "{cumem}"
        );
        let windows = windows_turned_off(with(&[("NCCL_WIN_ENABLE", "0")])).unwrap();
        assert!(windows.starts_with("NCCL_WIN_ENABLE=0"), "{windows}");
    }

    #[test]
    fn a_missing_file_is_absent_but_a_missing_dependency_is_a_reason() {
        let name = Path::new("libnccl.so.2");
        assert!(absent(
            name,
            "libnccl.so.2: cannot open shared object file: No such file or directory"
        ));
        assert!(!absent(
            name,
            "libcudart.so.12: cannot open shared object file: No such file or directory"
        ));
        assert!(!absent(name, "libnccl.so.2: invalid ELF header"));
    }

    #[test]
    fn versions_read_as_people_write_them() {
        assert_eq!(version_text(22803), "2.28.3");
        assert_eq!(version_text(21903), "2.19.3");
        assert_eq!(version_text(2804), "2.8.4");
    }

    #[test]
    fn element_types_are_nccls() {
        assert_eq!(nccl_type(DataType::F32), 7);
        assert_eq!(nccl_type(DataType::Bf16), 9);
        assert_eq!(nccl_type(DataType::F16), 6);
    }
}

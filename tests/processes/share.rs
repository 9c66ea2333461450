//! One process exports, a child process imports: this test binary runs one of its own tests again
//! as the child (the importer), handing it the descriptors in a variable and the shared files over
//! a Unix socket (SCM_RIGHTS), as peerlink's groups pass them. The child checks every byte the exporter wrote, writes back
//! from the host, copies in with each method and moves bytes in through the engine with every
//! strategy the host offers; the exporter then checks every byte of its own buffers. The simulator
//! runs it in CI (tests/processes.rs), real GPUs in tests/gpu/processes.rs.

use peerlink::backend::SharedBuffer;
use peerlink::backend::{
    self, Backend, BufferCopy, BufferId, Choice, CopyMethod, Memory, ShareDescriptor,
};
use peerlink::engine::{Fabric, Strategy};
use peerlink::pattern;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

/// The backend the child opens: `cuda` or `sim:<preset>`.
const BACKEND_VAR: &str = "PEERLINK_TEST_CHILD_BACKEND";
/// The exports' descriptors, as JSON.
const SHARED_VAR: &str = "PEERLINK_TEST_CHILD_SHARED";
/// The Unix socket the child takes the exports' files from.
const FDS_VAR: &str = "PEERLINK_TEST_CHILD_FDS";

/// Bytes of each shared buffer: not a whole number of anything.
const LEN: usize = (4 << 20) + 13;
/// Seeds of what the exporter writes first: into its device buffer, and its shared host buffer.
const DEVICE_SEED: u64 = 1;
const HOST_SEED: u64 = 2;
/// Parts of each buffer the child writes, each its own way.
const PARTS: usize = 8;

fn open(name: &str) -> Arc<dyn Backend> {
    let choice = match name.strip_prefix("sim:") {
        Some(preset) => Choice::Sim(preset.to_string()),
        None => Choice::Gpu,
    };
    Arc::from(backend::open(&choice).unwrap().backend)
}

/// Part `k` of a buffer: its offset and length.
fn part(k: usize) -> (usize, usize) {
    let size = LEN / PARTS;
    (k * size, if k == PARTS - 1 { LEN - k * size } else { size })
}

/// The exporter's side: exports device memory of its last GPU and shared host memory, runs
/// `child_test` of this binary as the importer, and checks every byte the child says it wrote (and
/// every byte it did not) in its own memory.
/// `strategies` are the engine strategies the child must have used, into the exported device
/// memory and out of it (others may be offered too).
/// `memory` is the exported device memory's kind.
pub fn export_to_a_child_process(
    backend_name: &str,
    child_test: &str,
    strategies: &[Strategy],
    memory: DeviceMemory,
) {
    let b = open(backend_name);
    let last = b.topology().devices.len() - 1;
    let (owner, device) = memory.alloc(b.as_ref(), last);
    b.write(device, 0, &pattern::bytes(DEVICE_SEED, LEN))
        .unwrap();
    let host = b.sharing().alloc_shared_host(LEN).unwrap();
    b.write(host, 0, &pattern::bytes(HOST_SEED, LEN)).unwrap();
    let mut files: Vec<OwnedFd> = Vec::new();
    let exports: Vec<ShareDescriptor> = [device, host]
        .into_iter()
        .map(|id| {
            let shared = b.sharing().export(id).unwrap();
            files.extend(shared.fd);
            shared.descriptor
        })
        .collect();
    let meeting = tempfile::tempdir().unwrap();
    let socket = meeting.path().join("fds");
    let listener = UnixListener::bind(&socket).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([child_test, "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(BACKEND_VAR, backend_name)
        .env(SHARED_VAR, serde_json::to_string(&exports).unwrap())
        .env(FDS_VAR, &socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    hand_over(&listener, &files, &mut child);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the child failed:\n{stdout}\n{stderr}"
    );
    let mut want = [
        pattern::bytes(DEVICE_SEED, LEN),
        pattern::bytes(HOST_SEED, LEN),
    ];
    let mut ways = Vec::new();
    let mut reads = Vec::new();
    for line in stdout.lines() {
        if let Some(at) = line.find("READ device ") {
            reads.push(line[at + "READ device ".len()..].trim().to_string());
            continue;
        }
        // The test harness prints `test <name> ... ` before the child's first line.
        let Some(at) = line.find("WROTE ") else {
            continue;
        };
        let wrote = &line[at + "WROTE ".len()..];
        let fields: Vec<&str> = wrote.split_whitespace().collect();
        let [buffer, way, k, seed] = fields[..] else {
            panic!("a WROTE line of four fields: {line}")
        };
        let (k, seed): (usize, u64) = (k.parse().unwrap(), seed.parse().unwrap());
        let (offset, len) = part(k);
        let which = usize::from(buffer == "host");
        want[which][offset..offset + len].copy_from_slice(&pattern::bytes(seed, len));
        ways.push(format!("{buffer} {way}"));
    }
    eprintln!("the child wrote: {}", ways.join(", "));
    eprintln!("the child read, every byte checked: {}", reads.join(", "));
    let device_ways = strategies.iter().map(|s| format!("device {s:?}"));
    for needed in device_ways.chain(["device host-write".to_string()]) {
        assert!(ways.contains(&needed), "{needed} missing: {ways:?}");
    }
    for needed in strategies.iter().map(|s| format!("{s:?}")) {
        assert!(
            reads.contains(&needed),
            "a read by {needed} missing: {reads:?}"
        );
    }
    for needed in ["host host-write", "host CopyEngine", "host SmKernel"] {
        assert!(
            ways.iter().any(|w| w == needed),
            "{needed} missing: {ways:?}"
        );
    }
    for (id, want, what) in [(device, &want[0], "device"), (host, &want[1], "host")] {
        let mut got = vec![0; LEN];
        b.read(id, 0, &mut got).unwrap();
        if let Some(at) = (0..LEN).find(|&i| got[i] != want[i]) {
            panic!("the exporter's {what} buffer: first wrong byte at {at}");
        }
        b.free(id).unwrap();
    }
    if owner != device {
        b.free(owner).unwrap();
    }
}

/// The device memory a process exports: its own, or `LEN` bytes at `offset` of another library's
/// allocation, borrowed (`Backend::borrow_memory`; the simulator lends its buffers from their
/// first byte only).
#[derive(Clone, Copy, Debug)]
pub enum DeviceMemory {
    Own,
    /// Of plain device memory (cudaMalloc's, as PyTorch's caching allocator holds it).
    Borrowed {
        offset: usize,
    },
    /// Of NCCL's memory for windows (ncclMemAlloc: mapped memory, which CUDA IPC refuses). Real
    /// GPUs only (tests/gpu/processes.rs): the simulator has no model of NCCL's memory.
    #[allow(dead_code)] // built into tests/processes.rs too, which runs on the simulator alone
    BorrowedFromNccl {
        offset: usize,
    },
}

impl DeviceMemory {
    /// The allocation of `device`'s memory, and the buffer to export (the same, or borrowed).
    fn alloc(self, b: &dyn Backend, device: usize) -> (BufferId, BufferId) {
        let (owner, offset) = match self {
            DeviceMemory::Own => {
                let own = b.alloc(Memory::Device(device), LEN).unwrap();
                return (own, own);
            }
            DeviceMemory::Borrowed { offset } => (
                b.alloc(Memory::Device(device), offset + LEN).unwrap(),
                offset,
            ),
            DeviceMemory::BorrowedFromNccl { offset } => {
                let nccl = b.collectives().nccl().unwrap();
                (
                    nccl.alloc_window_memory(device, offset + LEN).unwrap(),
                    offset,
                )
            }
        };
        let address = b.sharing().device_address(owner).unwrap() + offset as u64;
        (owner, b.borrow_memory(device, address, LEN).unwrap())
    }
}

/// Passes `files` to the child, once it connects to `listener`, as SCM_RIGHTS over the socket:
/// the same open files (a descriptor CUDA exported for mapped memory opens in no other way; its
/// `/proc/<pid>/fd` path opens another file). Gives up where the child exits before it connects.
fn hand_over(listener: &UnixListener, files: &[OwnedFd], child: &mut Child) {
    listener.set_nonblocking(true).unwrap();
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if child.try_wait().unwrap().is_some() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let fds: Vec<BorrowedFd> = files.iter().map(|f| f.as_fd()).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    let count = [fds.len() as u8];
    rustix::net::sendmsg(
        &stream,
        &[IoSlice::new(&count)],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
}

/// The files the exporter passes ([`hand_over`]), in the order of its exports.
fn taken_over(socket: &str) -> Vec<OwnedFd> {
    let stream = UnixStream::connect(socket).unwrap();
    let mut count = [0u8];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let flags = RecvFlags::CMSG_CLOEXEC;
    rustix::net::recvmsg(
        &stream,
        &mut [IoSliceMut::new(&mut count)],
        &mut control,
        flags,
    )
    .unwrap();
    let files: Vec<OwnedFd> = control
        .drain()
        .flat_map(|message| match message {
            RecvAncillaryMessage::ScmRights(fds) => fds.collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(files.len(), usize::from(count[0]));
    files
}

/// The importer's side, run by [`export_to_a_child_process`] in a child process; without its
/// variables (run on its own) it has nothing to import and returns.
pub fn child() {
    let (Ok(name), Ok(shared)) = (std::env::var(BACKEND_VAR), std::env::var(SHARED_VAR)) else {
        eprintln!("run by export_to_a_child_process in a child process: nothing to do alone");
        return;
    };
    let b = open(&name);
    let exports: Vec<ShareDescriptor> = serde_json::from_str(&shared).unwrap();
    let mut files = taken_over(&std::env::var(FDS_VAR).unwrap()).into_iter();
    let mut exports = exports.into_iter().map(|descriptor| {
        let fd = descriptor.has_fd.then(|| files.next().unwrap());
        SharedBuffer { descriptor, fd }
    });
    let (device, host) = (exports.next().unwrap(), exports.next().unwrap());
    into_device_memory(&b, device);
    into_host_memory(&b, host);
}

/// Every byte of an import, against the pattern of `seed`.
fn check_all(got: &[u8], seed: u64, what: &str) {
    if let Some(m) = pattern::first_mismatch(seed, got) {
        panic!("the child's import of {what}: {m:?}");
    }
}

/// The exporter's device memory (of its last GPU), through the engine: a host write, then each
/// strategy from GPU 0 into it, and each strategy out of it into GPU 0. It is imported for GPU 0,
/// which issues direct copies, where GPU 0 has P2P to it; else for its own GPU, where the host and
/// relay routes reach it.
fn into_device_memory(b: &Arc<dyn Backend>, shared: SharedBuffer) {
    let fabric = Fabric::open(b.clone()).unwrap();
    let last = b.topology().devices.len() - 1;
    let p2p = b.topology().pair(0, last).is_some_and(|p| p.p2p);
    let import = fabric.import(shared, if p2p { 0 } else { last }).unwrap();
    check_all(&import.to_vec().unwrap(), DEVICE_SEED, "device memory");
    let (offset, len) = part(0);
    import.write(offset, &pattern::bytes(100, len)).unwrap();
    println!("WROTE device host-write 0 100");
    let strategies = || {
        Strategy::ALL
            .into_iter()
            .filter(|s| *s != Strategy::Resident)
    };
    let offered =
        |strategy: Strategy, moved: peerlink::Result<peerlink::engine::Transfer>| match moved {
            Ok(transfer) => {
                transfer.wait().unwrap();
                true
            }
            Err(peerlink::Error::Usage(why)) => {
                eprintln!("{strategy:?} not offered: {why}");
                false
            }
            Err(other) => panic!("{strategy:?}: {other}"),
        };
    for (k, strategy) in (1..PARTS).zip(strategies()) {
        let (offset, len) = part(k);
        let seed = 100 + k as u64;
        let src = fabric.alloc(0, len).unwrap();
        src.write(0, &pattern::bytes(seed, len)).unwrap();
        let dst = import.range(offset..offset + len);
        if offered(
            strategy,
            fabric.transfer(src.all(), dst).strategy(strategy).submit(),
        ) {
            println!("WROTE device {strategy:?} {k} {seed}");
        }
    }
    // Out of it: the part written from the host above, every byte checked here.
    let (offset, len) = part(0);
    for strategy in strategies() {
        let dst = fabric.alloc(0, len).unwrap();
        let src = import.range(offset..offset + len);
        if offered(
            strategy,
            fabric.transfer(src, dst.all()).strategy(strategy).submit(),
        ) {
            if let Some(m) = pattern::first_mismatch(100, &dst.to_vec().unwrap()) {
                panic!("{strategy:?} out of the import: {m:?}");
            }
            println!("READ device {strategy:?}");
        }
    }
}

/// The exporter's shared host memory: a host write, then a copy by each method from GPU 0.
fn into_host_memory(b: &Arc<dyn Backend>, shared: SharedBuffer) {
    let import = b.sharing().import(shared, 0).unwrap();
    let mut got = vec![0; LEN];
    b.read(import, 0, &mut got).unwrap();
    check_all(&got, HOST_SEED, "shared host memory");
    let (offset, len) = part(0);
    b.write(import, offset, &pattern::bytes(200, len)).unwrap();
    println!("WROTE host host-write 0 200");
    let stream = b.create_stream(0).unwrap();
    for (k, method) in [(1, CopyMethod::CopyEngine), (2, CopyMethod::SmKernel)] {
        let (offset, len) = part(k);
        let seed = 200 + k as u64;
        let src = b.alloc(Memory::Device(0), len).unwrap();
        b.write(src, 0, &pattern::bytes(seed, len)).unwrap();
        let copy = BufferCopy {
            dst: import,
            dst_offset: offset,
            src,
            src_offset: 0,
            len,
        };
        b.copy(stream, method, &copy).unwrap();
        b.synchronize(stream).unwrap();
        b.free(src).unwrap();
        println!("WROTE host {method:?} {k} {seed}");
    }
    b.destroy_stream(stream).unwrap();
    b.free(import).unwrap();
}

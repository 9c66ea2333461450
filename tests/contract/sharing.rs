//! The contract of sharing buffers between processes: shared host memory is a buffer like pinned
//! memory; only device memory and shared host memory this process allocated are exported; a
//! descriptor that does not fit its backend, its file or this host's GPUs is refused as a usage
//! error.
//!
//! The checks on one backend run on real GPUs too. Those that import need a second process: on
//! real GPUs CUDA opens an IPC handle only in another process (tests/gpu/processes.rs runs them as
//! two `peerlink` processes); on the simulator a second backend of the same preset stands in for
//! it (tests/contract/sharing_between.rs), its bytes crossing through the shared file as they do
//! between processes.

use super::{buffer, contents, gpus, invalid, pattern, says, usage, SHAPES};
use peerlink::backend::{
    Backend, BufferCopy, BufferId, CopyMethod, Memory, SharedBuffer, SharedMemory,
};
use peerlink::topology::Source;

/// The memories a process exports: the last GPU's device memory, and shared host memory.
pub fn exportable(b: &dyn Backend, bytes: &[u8]) -> Vec<(&'static str, BufferId)> {
    let device = buffer(b, Memory::Device(gpus(b) - 1), bytes);
    let host = b.sharing().alloc_shared_host(bytes.len()).unwrap();
    b.write(host, 0, bytes).unwrap();
    vec![("device memory", device), ("shared host memory", host)]
}

#[track_caller]
pub fn same_bytes(what: &str, got: &[u8], want: &[u8]) {
    if let Some(at) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: first wrong byte at {at} of {} (want {:#04x}, got {:#04x})",
            want.len(),
            want[at],
            got[at]
        );
    }
}

pub fn shared_host_memory_reads_back_and_gpus_copy_to_and_from_it(b: &dyn Backend) {
    let data = pattern(3 << 20, 21);
    let host = b.sharing().alloc_shared_host(data.len()).unwrap();
    assert_eq!(b.len(host).unwrap(), data.len());
    assert!(contents(b, host) == vec![0; data.len()], "not zeroed");
    b.write(host, 0, &data).unwrap();
    same_bytes("shared host memory", &contents(b, host), &data);
    b.free(host).unwrap();
    // Both copy methods, there and back, every byte.
    let stream = b.create_stream(0).unwrap();
    for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
        for (src_offset, dst_offset, len) in [SHAPES[1], SHAPES[3]] {
            let size = len + 64;
            let shared = b.sharing().alloc_shared_host(size).unwrap();
            let device = buffer(b, Memory::Device(0), &pattern(size, 5));
            let copy = BufferCopy {
                dst: shared,
                dst_offset,
                src: device,
                src_offset,
                len,
            };
            b.copy(stream, method, &copy).unwrap();
            let back = BufferCopy {
                dst: device,
                dst_offset: src_offset,
                src: shared,
                src_offset: dst_offset,
                len,
            };
            b.write(device, 0, &vec![0; size]).unwrap();
            b.synchronize(stream).unwrap();
            b.copy(stream, method, &back).unwrap();
            b.synchronize(stream).unwrap();
            let mut want = vec![0; size];
            want[src_offset..src_offset + len]
                .copy_from_slice(&pattern(size, 5)[src_offset..src_offset + len]);
            same_bytes(
                &format!("{method:?} there and back"),
                &contents(b, device),
                &want,
            );
            b.free(shared).unwrap();
            b.free(device).unwrap();
        }
    }
    b.destroy_stream(stream).unwrap();
}

pub fn exports_refuse_managed_private_pinned_empty_and_released_buffers(b: &dyn Backend) {
    let sharing = b.sharing();
    says(&usage(sharing.alloc_shared_host(0)), "0 bytes");
    let pinned = b
        .alloc(Memory::PinnedHost { numa_node: None }, 4096)
        .unwrap();
    says(&usage(sharing.export(pinned)), "alloc_shared_host");
    let managed = b.alloc(Memory::Managed(0), 4096).unwrap();
    says(&usage(sharing.export(managed)), "managed memory");
    let device = b.alloc(Memory::Device(0), 4096).unwrap();
    b.free(device).unwrap();
    invalid(sharing.export(device));
    for id in [pinned, managed] {
        b.free(id).unwrap();
    }
}

/// An export of `id` with its descriptor changed by `tamper`.
fn tampered(b: &dyn Backend, id: BufferId, tamper: impl FnOnce(&mut SharedBuffer)) -> SharedBuffer {
    let mut shared = b.sharing().export(id).unwrap();
    tamper(&mut shared);
    shared
}

pub fn imports_refuse_descriptors_of_other_backends_gpus_files_and_handles(b: &dyn Backend) {
    let data = pattern(8192, 3);
    for (what, id) in exportable(b, &data) {
        let import = |shared| b.sharing().import(shared, 0);
        let other_source = tampered(b, id, |s| {
            s.descriptor.source = match s.descriptor.source {
                Source::Cuda => Source::Sim("x".into()),
                _ => Source::Cuda,
            }
        });
        says(&usage(import(other_source)), "backend");
        let empty = tampered(b, id, |s| s.descriptor.len = 0);
        says(&usage(import(empty)), "0 bytes");
        // The descriptor says there is a file and none came, or the other way round.
        let fd_lost = tampered(b, id, |s| {
            s.descriptor.has_fd = !s.descriptor.has_fd;
        });
        says(&usage(import(fd_lost)), "file descriptor");
        let bad_handle = tampered(b, id, |s| s.descriptor.handle = vec![1, 2, 3]);
        usage(import(bad_handle));
        let unknown_gpu = tampered(b, id, |s| {
            if let SharedMemory::Device { gpu_uuid } = &mut s.descriptor.memory {
                *gpu_uuid = "GPU-nowhere".into();
            }
        });
        if let SharedMemory::Device { .. } = unknown_gpu.descriptor.memory {
            says(&usage(import(unknown_gpu)), "does not see");
        }
        // A file far shorter than its descriptor says (where the export has a file).
        let longer = tampered(b, id, |s| s.descriptor.len += 1 << 30);
        if longer.fd.is_some() {
            says(&usage(import(longer)), "file");
        }
        b.free(id).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

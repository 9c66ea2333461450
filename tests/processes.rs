//! Buffers shared between real processes on the simulator: this binary runs one of its tests again
//! as a child process that imports what the test exported (tests/processes/share.rs), so the bytes
//! cross between two processes through the simulator's shared files, every byte checked on both
//! sides, through host writes, copies and every engine strategy the host offers; device memory of
//! this process's own, and another library's, borrowed.

#[path = "processes/share.rs"]
mod share;

use share::DeviceMemory;

#[test]
fn a_child_process_writes_and_moves_bytes_through_the_engine_into_buffers_exported_here() {
    // Imported for GPU 0, which has P2P to the exporter's GPU: reached by direct copies alone.
    use peerlink::engine::Strategy::{DirectCe, DirectSm};
    let strategies = [DirectCe, DirectSm];
    share::export_to_a_child_process(
        "sim:dgx-h100",
        "child_imports",
        &strategies,
        DeviceMemory::Own,
    );
}

#[test]
fn another_librarys_memory_borrowed_here_is_exported_and_a_child_moves_bytes_into_it() {
    use peerlink::engine::Strategy::{DirectCe, DirectSm};
    let borrowed = DeviceMemory::Borrowed { offset: 0 };
    share::export_to_a_child_process(
        "sim:dgx-h100",
        "child_imports",
        &[DirectCe, DirectSm],
        borrowed,
    );
}

#[test]
fn across_a_pair_without_p2p_the_engine_stages_into_another_process_memory() {
    // dgx1-v100: GPUs 0 and 7 have no P2P; the child imports the exporter's GPU 7 memory for GPU 7
    // and moves bytes from GPU 0 into it and back out through host memory.
    use peerlink::engine::Strategy::Staged;
    share::export_to_a_child_process(
        "sim:dgx1-v100",
        "child_imports",
        &[Staged],
        DeviceMemory::Own,
    );
}

#[test]
#[ignore = "the importing child of the tests above; alone it has nothing to import"]
fn child_imports() {
    share::child();
}

#[path = "processes/group_reduce.rs"]
mod group_reduce;

#[test]
fn ranks_in_processes_of_their_own_sum_and_average_every_element_by_every_kernel() {
    // 4 KiB and 256 KiB: every kernel; 4 MiB: one-shot and two-shot, the shared buffers grown.
    for world in [2, 3] {
        group_reduce::launch(
            "sim:dgx-h100",
            "group_reduce_rank",
            world,
            &[4 << 10, 256 << 10, 4 << 20],
        );
    }
}

#[test]
#[ignore = "a rank of the test above; alone it has no group to join"]
fn group_reduce_rank() {
    group_reduce::rank();
}

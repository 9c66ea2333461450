//! Sharing between two backends of one simulated host, standing in for two processes (CUDA opens
//! an IPC handle only in another process: on real GPUs tests/gpu/processes.rs runs two `peerlink`
//! processes instead). The bytes cross through the shared file as they do between processes.

use crate::contract::{
    buffer, contents, exportable, gpus, invalid, pattern, same_bytes, says, usage,
};
use peerlink::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory};

/// Stamps one `#[test]` per check, the exporting and the importing backend each opened by `open`.
macro_rules! sharing_between_backends_tests {
    (open = $open:expr) => {
        sharing_between_backends_tests!(@one ($open)
            an_import_sees_every_byte_the_exporter_wrote_and_the_exporter_every_byte_it_wrote,
            copies_on_the_importers_gpus_move_bytes_into_and_out_of_the_exporters_memory,
            freeing_an_import_leaves_the_exporters_buffer_and_memory_alone,
            an_import_is_not_exported_again,
            an_import_is_reached_only_by_work_on_the_gpu_it_was_imported_for,
        );
    };
    (@one ($open:expr) $name:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        fn $name() {
            let (exporter, importer) = ($open, $open);
            crate::sharing_between::$name(&exporter, &importer);
        }
        sharing_between_backends_tests!(@one ($open) $($rest),*);
    };
    (@one ($open:expr)) => {};
}

/// Runs `f` on each exportable memory: the exporter's buffer, holding `data`, and its import for
/// GPU `gpu` of the importer.
fn across(
    exporter: &dyn Backend,
    importer: &dyn Backend,
    (seed, gpu): (u8, usize),
    mut f: impl FnMut(&str, BufferId, BufferId, &[u8]),
) {
    let data = pattern((1 << 20) + 13, seed);
    for (what, id) in exportable(exporter, &data) {
        let shared = exporter.sharing().export(id).unwrap();
        let imported = importer.sharing().import(shared, gpu).unwrap();
        f(what, id, imported, &data);
        importer.free(imported).unwrap();
        exporter.free(id).unwrap();
    }
}

pub fn an_import_sees_every_byte_the_exporter_wrote_and_the_exporter_every_byte_it_wrote(
    exporter: &dyn Backend,
    importer: &dyn Backend,
) {
    across(exporter, importer, (31, 0), |what, id, imported, data| {
        assert_eq!(importer.len(imported).unwrap(), data.len());
        same_bytes(what, &contents(importer, imported), data);
        let theirs = pattern(data.len(), 32);
        importer.write(imported, 0, &theirs).unwrap();
        same_bytes(what, &contents(exporter, id), &theirs);
        exporter.write(id, 7, &data[..100]).unwrap();
        let mut seen = vec![0; 100];
        importer.read(imported, 7, &mut seen).unwrap();
        same_bytes(what, &seen, &data[..100]);
    });
}

pub fn copies_on_the_importers_gpus_move_bytes_into_and_out_of_the_exporters_memory(
    exporter: &dyn Backend,
    importer: &dyn Backend,
) {
    // The exported device memory is the last GPU's; the first reaches it where P2P allows (its
    // import brings peer access: none is enabled here).
    let last = gpus(importer) - 1;
    let issuer = if importer.topology().pair(0, last).is_some_and(|p| p.p2p) {
        0
    } else {
        last
    };
    let stream = importer.create_stream(issuer).unwrap();
    across(
        exporter,
        importer,
        (41, issuer),
        |what, id, imported, data| {
            let len = data.len();
            for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
                let local = buffer(importer, Memory::Device(issuer), &pattern(len, 42));
                let push = BufferCopy {
                    dst: imported,
                    dst_offset: 1,
                    src: local,
                    src_offset: 3,
                    len: len - 3,
                };
                importer.copy(stream, method, &push).unwrap();
                importer.synchronize(stream).unwrap();
                let mut want = data.to_vec();
                want[1..len - 2].copy_from_slice(&pattern(len, 42)[3..]);
                same_bytes(
                    &format!("{what}, {method:?} push"),
                    &contents(exporter, id),
                    &want,
                );
                exporter.write(id, 0, data).unwrap();
                let pull = BufferCopy::from_start(imported, local, len);
                importer.copy(stream, method, &pull).unwrap();
                importer.synchronize(stream).unwrap();
                same_bytes(
                    &format!("{what}, {method:?} pull"),
                    &contents(importer, local),
                    data,
                );
                importer.free(local).unwrap();
            }
        },
    );
    importer.destroy_stream(stream).unwrap();
}

pub fn freeing_an_import_leaves_the_exporters_buffer_and_memory_alone(
    exporter: &dyn Backend,
    importer: &dyn Backend,
) {
    let last = gpus(importer) - 1;
    let free_before = importer.free_memory(last).unwrap();
    let mut closed = Vec::new();
    across(
        exporter,
        importer,
        (51, last),
        |what, id, imported, data| {
            assert_eq!(importer.free_memory(last).unwrap(), free_before, "{what}");
            let copy = importer.alloc(Memory::Device(last), 64).unwrap();
            importer.free(copy).unwrap();
            same_bytes(what, &contents(exporter, id), data);
            closed.push(imported);
        },
    );
    for imported in closed {
        invalid(importer.len(imported));
    }
    assert_eq!(importer.free_memory(last).unwrap(), free_before);
}

pub fn an_import_is_not_exported_again(exporter: &dyn Backend, importer: &dyn Backend) {
    across(exporter, importer, (61, 0), |_, _, imported, _| {
        says(
            &usage(importer.sharing().export(imported)),
            "imported from another process",
        );
    });
}

pub fn an_import_is_reached_only_by_work_on_the_gpu_it_was_imported_for(
    exporter: &dyn Backend,
    importer: &dyn Backend,
) {
    let n = gpus(importer);
    if n < 2 {
        eprintln!("one GPU: every import is for the only GPU");
        return;
    }
    let last = n - 1;
    for peer in (0..last).filter(|&p| importer.topology().pair(p, last).is_some_and(|p| p.p2p)) {
        importer.enable_peer_access(peer, last).unwrap();
    }
    across(
        exporter,
        importer,
        (71, last),
        |what, id, imported, data| {
            let len = data.len();
            for gpu in 0..n {
                let stream = importer.create_stream(gpu).unwrap();
                let local = buffer(importer, Memory::Device(gpu), &pattern(len, 72));
                for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
                    let push = BufferCopy::from_start(local, imported, len);
                    let pushed = importer.copy(stream, method, &push);
                    let device_memory = what == "device memory";
                    if gpu == last || !device_memory {
                        pushed.unwrap();
                        importer.synchronize(stream).unwrap();
                        same_bytes(what, &contents(exporter, id), &pattern(len, 72));
                        exporter.write(id, 0, data).unwrap();
                    } else {
                        let why = usage(pushed);
                        says(&why, &format!("imported for GPU {last}"));
                        // Peer access to the memory's GPU does not reach another process's memory.
                        says(&why, &format!("work on GPU {gpu}"));
                    }
                }
                importer.free(local).unwrap();
                importer.destroy_stream(stream).unwrap();
            }
        },
    );
}

//! Property tests of the transfer engine on the simulator: random sizes (1 B to 64 MiB), unaligned
//! offsets, every strategy, batches, several threads at once, and chains ordered by the caller's
//! streams alone; every byte is checked, and bytes outside the destination range must stay as they
//! were.

use peerlink::backend::sim::SimBackend;
use peerlink::backend::{Backend, Memory};
use peerlink::engine::{BatchStrategy, Buffer, Fabric, Strategy as Way};
use peerlink::pattern;
use proptest::prelude::*;
use std::sync::Arc;

const PRESETS: [&str; 3] = ["dgx1-v100", "pcie-4gpu-2socket", "dgx-h100"];

fn fabric(preset: &str) -> Fabric {
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::open(preset).unwrap());
    Fabric::open(backend).unwrap()
}

/// Mostly small sizes, some medium, a few large: the large ones are what pipelines chunk, but
/// they are slow to fill and check.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        14 => 1usize..=65_536,
        5 => 65_537usize..=(4 << 20),
        1 => (4 << 20) + 1..=(64usize << 20),
    ]
}

fn way() -> impl Strategy<Value = Option<Way>> {
    prop_oneof![
        2 => Just(None),
        1 => proptest::sample::select(Way::ALL.to_vec()).prop_map(Some),
    ]
}

/// One transfer: fills `src`, copies `len` bytes from `src_at` to `dst_at`, and checks all of
/// `dst`. Returns false where the strategy cannot be used on this pair.
fn transfer_checks(
    f: &Fabric,
    (src, dst): (&Buffer, &Buffer),
    (src_at, dst_at, len): (usize, usize, usize),
    strategy: Option<Way>,
    seed: u64,
) -> Result<bool, TestCaseError> {
    let data = pattern::bytes(seed, src.size());
    let before = pattern::bytes(!seed, dst.size());
    src.write(0, &data).unwrap();
    dst.write(0, &before).unwrap();
    let mut t = f.transfer(
        src.range(src_at..src_at + len),
        dst.range(dst_at..dst_at + len),
    );
    if let Some(s) = strategy {
        t = t.strategy(s);
    }
    let transfer = match t.submit() {
        Ok(t) => t,
        // A forced strategy this pair cannot use: refused with a sentence, nothing written.
        Err(e) if strategy.is_some() && e.exit_code() == 2 => {
            prop_assert_eq!(dst.to_vec().unwrap(), before);
            return Ok(false);
        }
        Err(e) => return Err(TestCaseError::fail(e.to_string())),
    };
    transfer.wait().unwrap();
    let got = dst.to_vec().unwrap();
    prop_assert!(
        got[dst_at..dst_at + len] == data[src_at..src_at + len],
        "moved bytes differ"
    );
    prop_assert!(
        got[..dst_at] == before[..dst_at],
        "bytes before the range changed"
    );
    prop_assert!(
        got[dst_at + len..] == before[dst_at + len..],
        "bytes after the range changed"
    );
    Ok(true)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_byte_arrives_and_nothing_else_changes(
        preset in proptest::sample::select(PRESETS.to_vec()),
        pair in (0usize..8, 0usize..8),
        len in size(),
        offsets in (0usize..5000, 0usize..5000),
        tails in (0usize..300, 0usize..300),
        strategy in way(),
        seed in any::<u64>(),
    ) {
        let f = fabric(preset);
        let n = f.devices().len();
        let (a, b) = (pair.0 % n, pair.1 % n);
        let src = f.alloc(a, offsets.0 + len + tails.0).unwrap();
        let dst = f.alloc(b, offsets.1 + len + tails.1).unwrap();
        transfer_checks(&f, (&src, &dst), (offsets.0, offsets.1, len), strategy, seed)?;
    }

    #[test]
    fn batches_deliver_every_message(
        preset in proptest::sample::select(PRESETS.to_vec()),
        pair in (0usize..8, 0usize..8),
        lens in proptest::collection::vec(1usize..3000, 1..150),
        strategy in proptest::option::of(proptest::sample::select(BatchStrategy::ALL.to_vec())),
        seed in any::<u64>(),
    ) {
        let f = fabric(preset);
        let n = f.devices().len();
        let (a, b) = (pair.0 % n, pair.1 % n);
        // Sources packed with odd gaps, destinations in reverse order with other gaps.
        let mut src_at = Vec::new();
        let mut at = 1;
        for (i, len) in lens.iter().enumerate() {
            src_at.push(at);
            at += len + i % 7;
        }
        let src_len = at;
        let mut dst_at = vec![0; lens.len()];
        at = 3;
        for (i, len) in lens.iter().enumerate().rev() {
            dst_at[i] = at;
            at += len + i % 5;
        }
        let src = f.alloc(a, src_len).unwrap();
        let dst = f.alloc(b, at + 11).unwrap();
        let data = pattern::bytes(seed, src_len);
        let before = pattern::bytes(!seed, at + 11);
        src.write(0, &data).unwrap();
        dst.write(0, &before).unwrap();
        let messages: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| (src.range(src_at[i]..src_at[i] + len), dst.range(dst_at[i]..dst_at[i] + len)))
            .collect();
        let prepared = match strategy {
            None => f.prepare_batch(&messages, 1),
            Some(s) => f.prepare_batch_with(&messages, 1, s),
        };
        let Ok(batch) = prepared else {
            // Only a forced strategy the pair cannot use may be refused.
            prop_assert!(strategy.is_some());
            prop_assert_eq!(dst.to_vec().unwrap(), before);
            return Ok(());
        };
        batch.run(&[]).unwrap().wait().unwrap();
        let mut want = before;
        for (i, &len) in lens.iter().enumerate() {
            want[dst_at[i]..dst_at[i] + len].copy_from_slice(&data[src_at[i]..src_at[i] + len]);
        }
        prop_assert!(dst.to_vec().unwrap() == want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn several_threads_transfer_at_once(
        preset in proptest::sample::select(PRESETS.to_vec()),
        jobs in proptest::collection::vec(
            ((0usize..8, 0usize..8), 1usize..(2 << 20), 0usize..999, way()),
            2..6,
        ),
        seed in any::<u64>(),
    ) {
        let f = fabric(preset);
        let n = f.devices().len();
        let outcomes: Vec<Result<bool, TestCaseError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .iter()
                .enumerate()
                .map(|(i, &((a, b), len, offset, strategy))| {
                    let f = &f;
                    scope.spawn(move || {
                        let src = f.alloc(a % n, offset + len).unwrap();
                        let dst = f.alloc(b % n, len + 3).unwrap();
                        let seed = seed.wrapping_add(i as u64);
                        // Twice through the same buffers: the second reuses lanes and streams.
                        let first = transfer_checks(f, (&src, &dst), (offset, 3, len), strategy, seed)?;
                        let second = transfer_checks(f, (&src, &dst), (offset, 3, len), strategy, !seed)?;
                        Ok(first && second)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for outcome in outcomes {
            outcome?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// `submit_ordered` between borrowed memory keeps nothing, so the caller's streams alone order
    /// its transfers: a chain GPU a → b → c, each hop's borrowed handles dropped as soon as it is
    /// queued, delivers every byte to c (and changes nothing around the ranges) once c's stream
    /// is synchronised.
    #[test]
    fn ordered_chains_of_borrowed_memory_deliver_every_byte(
        preset in proptest::sample::select(PRESETS.to_vec()),
        gpus in (0usize..8, 0usize..8, 0usize..8),
        len in size(),
        offsets in (0usize..3000, 0usize..3000, 0usize..3000),
        strategies in (way(), way()),
        seed in any::<u64>(),
    ) {
        let f = fabric(preset);
        let backend = f.backend().clone();
        let n = f.devices().len();
        let gpus = [gpus.0 % n, gpus.1 % n, gpus.2 % n];
        let offsets = [offsets.0, offsets.1, offsets.2];
        let sizes = offsets.map(|at| at + len + 17);
        let buffers: Vec<_> = (0..3)
            .map(|i| backend.alloc(Memory::Device(gpus[i]), sizes[i]).unwrap())
            .collect();
        let data = pattern::bytes(seed, sizes[0]);
        let before = pattern::bytes(!seed, sizes[2]);
        backend.write(buffers[0], 0, &data).unwrap();
        backend.write(buffers[2], 0, &before).unwrap();
        let streams: Vec<_> = gpus.iter().map(|&g| backend.create_stream(g).unwrap()).collect();
        // The simulator lends a buffer from its first byte: the whole, then a range of it.
        let borrow = |i: usize| {
            let address = backend.sharing().device_address(buffers[i]).unwrap();
            f.borrow(gpus[i], address, sizes[i]).unwrap()
        };
        for (hop, strategy) in [(0, strategies.0), (1, strategies.1)] {
            let (from, to) = (borrow(hop), borrow(hop + 1));
            let range = |i: usize| offsets[i]..offsets[i] + len;
            let mut t = f
                .transfer(from.range(range(hop)), to.range(range(hop + 1)))
                .on_streams(streams[hop], streams[hop + 1]);
            if let Some(s) = strategy {
                t = t.strategy(s);
            }
            match t.submit_ordered() {
                Ok(()) => {}
                // A forced strategy this pair cannot use: refused with a sentence.
                Err(e) if strategy.is_some() && e.exit_code() == 2 => return Ok(()),
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            }
        }
        backend.synchronize(streams[2]).unwrap();
        let mut got = vec![0; sizes[2]];
        backend.read(buffers[2], 0, &mut got).unwrap();
        let at = offsets[2];
        prop_assert!(got[at..at + len] == data[offsets[0]..offsets[0] + len], "moved bytes differ");
        prop_assert!(got[..at] == before[..at], "bytes before the range changed");
        prop_assert!(got[at + len..] == before[at + len..], "bytes after the range changed");
        for stream in streams {
            backend.synchronize(stream).unwrap();
            backend.destroy_stream(stream).unwrap();
        }
        for buffer in buffers {
            backend.free(buffer).unwrap();
        }
    }
}

//! The contract of the pattern calls: device memory filled and checked on its GPU gives, byte for
//! byte, the host's pattern (`peerlink::pattern`) at any offset and length, and a check finds
//! the first wrong byte wherever it is.

use super::{buffer, contents, gpus, invalid, p2p, says, usage};
use peerlink::backend::collective::BufferRange;
use peerlink::backend::{Backend, BufferId, Memory};
use peerlink::pattern::{self, Mismatch, SplitMix};

/// Bytes of the buffers the checks fill: several MiB, so that a long range spans many blocks of a
/// GPU's grid, plus an odd tail.
const BUFFER: usize = (3 << 20) + 123;

/// The GPUs the checks run on: GPU 0 and, where there is one, the last (its own memory each time).
fn devices(b: &dyn Backend) -> Vec<usize> {
    let last = gpus(b) - 1;
    if last == 0 {
        vec![0]
    } else {
        vec![0, last]
    }
}

fn range(buffer: BufferId, offset: usize, len: usize) -> BufferRange {
    BufferRange {
        buffer,
        offset,
        len,
    }
}

/// Ranges to fill or check in a buffer of `size` bytes: unaligned starts, single bytes, a word and
/// one byte either side of it, odd lengths, the whole buffer, then `random` more.
fn shapes(rng: &mut SplitMix, size: usize, random: usize) -> Vec<(usize, usize)> {
    let mut shapes = vec![
        (0, 1),
        (1, 1),
        (0, 7),
        (0, 8),
        (0, 9),
        (3, 13),
        (7, 4101),
        (8, 1 << 20),
        (5, 1_000_003),
        (size - 1, 1),
        (0, size),
    ];
    for _ in 0..random {
        let offset = rng.below(size as u64) as usize;
        // Short ranges as often as long ones: a length up to 64 bytes, or up to the buffer's end.
        let most = if rng.below(2) == 0 {
            64.min(size - offset)
        } else {
            size - offset
        };
        shapes.push((offset, 1 + rng.below(most as u64) as usize));
    }
    shapes
}

pub fn pattern_fills_equal_the_host_pattern_at_any_offset_and_length(b: &dyn Backend) {
    let mut rng = SplitMix::new(0xf111);
    for device in devices(b) {
        // The host's picture of the buffer, range after range.
        let mut mirror: Vec<u8> = (0..BUFFER).map(|i| (i % 251) as u8).collect();
        let id = buffer(b, Memory::Device(device), &mirror);
        for (offset, len) in shapes(&mut rng, BUFFER, 24) {
            let seed = rng.next_u64();
            b.patterns().fill(&range(id, offset, len), seed).unwrap();
            mirror[offset..offset + len].copy_from_slice(&pattern::bytes(seed, len));
            let got = contents(b, id);
            if got == mirror {
                continue;
            }
            if let Some(at) = (0..BUFFER).find(|&i| got[i] != mirror[i]) {
                panic!(
                    "GPU {device}: fill of {len} bytes at {offset} (seed {seed:#x}): byte {at} is \
                     {:#04x}, want {:#04x}",
                    got[at], mirror[at]
                );
            }
        }
        b.patterns().fill(&range(id, 17, 0), 1).unwrap();
        b.patterns().fill(&range(id, BUFFER, 0), 1).unwrap();
        assert!(contents(b, id) == mirror, "a fill of 0 bytes wrote nothing");
        b.free(id).unwrap();
    }
}

pub fn pattern_checks_find_one_wrong_byte_wherever_it_is_and_report_it(b: &dyn Backend) {
    let mut rng = SplitMix::new(0xc4ec);
    for device in devices(b) {
        let id = buffer(b, Memory::Device(device), &vec![0; BUFFER]);
        for (offset, len) in shapes(&mut rng, BUFFER, 8) {
            let seed = rng.next_u64();
            let checked = range(id, offset, len);
            b.patterns().fill(&checked, seed).unwrap();
            assert_eq!(b.patterns().first_mismatch(&checked, seed).unwrap(), None);
            let mut positions = vec![0, len - 1, len / 2];
            positions.extend((0..6).map(|_| rng.below(len as u64) as usize));
            for at in positions {
                let expected = pattern::byte_at(seed, at);
                let found = expected ^ (1 + rng.below(255) as u8);
                b.write(id, offset + at, &[found]).unwrap();
                let want = Mismatch {
                    offset: at,
                    expected,
                    found,
                };
                assert_eq!(
                    b.patterns().first_mismatch(&checked, seed).unwrap(),
                    Some(want),
                    "GPU {device}: {len} bytes at {offset}, byte {at} flipped"
                );
                b.write(id, offset + at, &[expected]).unwrap();
            }
            assert_eq!(b.patterns().first_mismatch(&checked, seed).unwrap(), None);
        }

        // Of two wrong bytes the first is reported, however far apart; bytes outside the range do
        // not count; another seed's message is wrong from its first word.
        let (offset, len) = (3, BUFFER - 8);
        let checked = range(id, offset, len);
        let seed = rng.next_u64();
        b.patterns().fill(&checked, seed).unwrap();
        for (early, late) in [(10, len - 2), (len / 3, len / 3 + 1), (0, 7)] {
            for at in [early, late] {
                b.write(id, offset + at, &[!pattern::byte_at(seed, at)])
                    .unwrap();
            }
            let m = b.patterns().first_mismatch(&checked, seed).unwrap();
            assert_eq!(m.map(|m| m.offset), Some(early), "{early} and {late}");
            for at in [early, late] {
                b.write(id, offset + at, &[pattern::byte_at(seed, at)])
                    .unwrap();
            }
        }
        b.write(id, offset - 1, &[0xee]).unwrap();
        b.write(id, offset + len, &[0xee]).unwrap();
        assert_eq!(b.patterns().first_mismatch(&checked, seed).unwrap(), None);
        let other = b.patterns().first_mismatch(&checked, seed ^ 1).unwrap();
        assert!(other.is_some_and(|m| m.offset < 8), "{other:?}");
        assert_eq!(
            b.patterns().first_mismatch(&range(id, 9, 0), 1).unwrap(),
            None
        );
        b.free(id).unwrap();
    }
}

pub fn host_and_gpu_check_each_others_patterns(b: &dyn Backend) {
    let device = *devices(b).last().expect("a GPU");
    let (len, seed) = (1_000_003, 0x5eed);
    // Written by the host, checked on the GPU.
    let id = buffer(b, Memory::Device(device), &pattern::bytes(seed, len));
    assert_eq!(
        b.patterns()
            .first_mismatch(&range(id, 0, len), seed)
            .unwrap(),
        None
    );
    // Filled on the GPU, checked by the host; a copy between GPUs keeps it checkable on either.
    let other = buffer(b, Memory::Device(0), &vec![0; len]);
    b.patterns().fill(&range(other, 0, len), seed + 1).unwrap();
    assert_eq!(pattern::first_mismatch(seed + 1, &contents(b, other)), None);
    if device != 0 && p2p(b, 0, device) {
        b.enable_peer_access(0, device).unwrap();
        let stream = b.create_stream(0).unwrap();
        let copy = peerlink::backend::BufferCopy::from_start(other, id, len);
        b.copy(stream, peerlink::backend::CopyMethod::CopyEngine, &copy)
            .unwrap();
        b.synchronize(stream).unwrap();
        assert_eq!(
            b.patterns()
                .first_mismatch(&range(id, 0, len), seed + 1)
                .unwrap(),
            None
        );
    }
}

pub fn pattern_calls_refuse_pinned_memory_ranges_outside_and_released_buffers(b: &dyn Backend) {
    let pinned = buffer(b, Memory::PinnedHost { numa_node: None }, &[0; 64]);
    says(
        &usage(b.patterns().fill(&range(pinned, 0, 64), 1)),
        "pinned host memory",
    );
    says(
        &usage(b.patterns().first_mismatch(&range(pinned, 0, 64), 1)),
        "pinned host memory",
    );
    let id = buffer(b, Memory::Device(0), &[0; 64]);
    for (offset, len) in [(0, 65), (60, 5), (65, 0), (usize::MAX, 2)] {
        says(
            &usage(b.patterns().fill(&range(id, offset, len), 1)),
            "outside",
        );
        says(
            &usage(b.patterns().first_mismatch(&range(id, offset, len), 1)),
            "outside",
        );
    }
    assert_eq!(contents(b, id), [0; 64], "a refused fill wrote nothing");
    b.free(id).unwrap();
    invalid(b.patterns().fill(&range(id, 0, 8), 1));
    invalid(b.patterns().first_mismatch(&range(id, 0, 8), 1));
}

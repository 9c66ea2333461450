//! The crate's one data pattern: the bytes every measurement, proof and test moves, made so that
//! wrong copies are visible, and the check that finds the first wrong byte.
//!
//! Byte `i` of a message is a byte of a word derived from (`i / 8`, seed). Each sample and each
//! buffer gets its own seed, so a destination that still holds the previous sample's data (stale),
//! received a copy shifted by any number of bytes, or only its first part (truncated), differs from
//! what was sent. Any `u64` is a seed: neighbouring seeds (1, 2, 3…) give unrelated messages.

/// SplitMix64: a tiny, good 64-bit mixer and generator (Steele, Lea and Flood, 2014).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// A value in `0..n` (n > 0); the modulo bias is irrelevant for n far below 2^64.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed derived from several numbers (test, sample, buffer…), different for any change in them.
pub fn seed(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x5eed_u64, |acc, &p| mix(acc ^ mix(p.wrapping_add(1))))
}

/// Where the message for `seed` starts its count: mixed, so that the message of seed `s + 1` is not
/// the message of seed `s` shifted by a word.
fn base(seed: u64) -> u64 {
    mix(seed)
}

/// What multiplies each word's count (odd, so the multiply is a bijection).
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// Word `index` of the message that starts at `base`. Multiplying by an odd constant is a
/// bijection, so two bases give different words at every index and no two words of a message (up
/// to 2^64 of them) are equal; one multiply a word keeps filling and checking large buffers at
/// memory speed.
fn word(base: u64, index: usize) -> u64 {
    (index as u64).wrapping_add(base).wrapping_mul(MULTIPLIER)
}

/// The message for a seed as a GPU generates it (`kernels/pattern.cu`): word `i` (bytes `8i` to
/// `8i + 7`, little-endian) is `(i + base) × multiplier` modulo 2^64. Byte `j` of a message depends
/// on the seed and `j` alone, so any part of it can be made or checked on its own. The host hands
/// the GPU both numbers, so the pattern is defined here only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WordRule {
    pub base: u64,
    pub multiplier: u64,
}

/// How the message for `seed` is generated (see [`WordRule`]).
pub fn word_rule(seed: u64) -> WordRule {
    WordRule {
        base: base(seed),
        multiplier: MULTIPLIER,
    }
}

/// Byte `index` of the message for `seed`.
pub fn byte_at(seed: u64, index: usize) -> u8 {
    word(base(seed), index / 8).to_le_bytes()[index % 8]
}

/// The `len` bytes of the message for `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    fill(seed, &mut out);
    out
}

/// Writes the message for `seed` into `out` (its first `out.len()` bytes), on several threads when
/// it is large: the bench fills and checks messages of up to 1 GiB, where one thread (about 4 GB/s)
/// would take longer than the copies it verifies.
pub fn fill(seed: u64, out: &mut [u8]) {
    let base = base(seed);
    let part = part_len(out.len());
    if part >= out.len() {
        return fill_words(base, 0, out);
    }
    std::thread::scope(|scope| {
        for (k, chunk) in out.chunks_mut(part).enumerate() {
            scope.spawn(move || fill_words(base, k * part / 8, chunk));
        }
    });
}

/// Below this many bytes one thread fills or checks a message: starting threads would cost more.
const PARALLEL_BYTES: usize = 8 << 20;
/// At most this many threads fill or check one message (memory bandwidth is shared).
const MAX_THREADS: usize = 16;

/// The bytes each thread takes of a message of `len` bytes: whole words, at least
/// [`PARALLEL_BYTES`].
fn part_len(len: usize) -> usize {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS);
    len.div_ceil(threads)
        .next_multiple_of(8)
        .max(PARALLEL_BYTES)
}

/// Fills `out` with the message's words from word `first_word` on.
fn fill_words(base: u64, first_word: usize, out: &mut [u8]) {
    let whole = out.len() / 8;
    let mut words = out.chunks_exact_mut(8);
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&word(base, first_word + i).to_le_bytes());
    }
    let tail = words.into_remainder();
    let last = word(base, first_word + whole).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&last[..n]);
}

/// The first byte of `data` that differs from the message for `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub offset: usize,
    pub expected: u8,
    pub found: u8,
}

impl Mismatch {
    /// The verification error this mismatch is, in `test` from GPU `src` to GPU `dst`.
    pub fn into_error(self, test: impl Into<String>, src: usize, dst: usize) -> crate::Error {
        crate::Error::Verification {
            test: test.into(),
            src,
            dst,
            offset: self.offset,
            expected: self.expected,
            found: self.found,
        }
    }
}

/// Checks every byte of `data` against the message for `seed` (on several threads when large).
pub fn first_mismatch(seed: u64, data: &[u8]) -> Option<Mismatch> {
    let base = base(seed);
    let part = part_len(data.len());
    if part >= data.len() {
        return mismatch_from(base, 0, data);
    }
    std::thread::scope(|scope| {
        let parts: Vec<_> = data
            .chunks(part)
            .enumerate()
            .map(|(k, chunk)| scope.spawn(move || mismatch_from(base, k * part, chunk)))
            .collect();
        // The earliest part with a wrong byte holds the first one.
        parts
            .into_iter()
            .map(|p| p.join().expect("a checking thread does not panic"))
            .find_map(|m| m)
    })
}

/// The first wrong byte of `data`, which holds the message that starts at `base` from byte `offset`
/// (a multiple of 8) on.
fn mismatch_from(base: u64, offset: usize, data: &[u8]) -> Option<Mismatch> {
    let first_word = offset / 8;
    // Whole words first (the common, fast path), then the bytes of the word that differs.
    let words = data.chunks_exact(8);
    let tail = words.remainder();
    let wrong_word = words
        .enumerate()
        .find(|(index, chunk)| {
            u64::from_le_bytes((*chunk).try_into().expect("8 bytes"))
                != word(base, first_word + *index)
        })
        .map(|(index, _)| index)
        .or_else(|| {
            let index = data.len() / 8;
            let expected = word(base, first_word + index).to_le_bytes();
            (tail != &expected[..tail.len()]).then_some(index)
        })?;
    let expected = word(base, first_word + wrong_word).to_le_bytes();
    let found = &data[wrong_word * 8..data.len().min(wrong_word * 8 + 8)];
    let at = found
        .iter()
        .zip(expected)
        .position(|(f, e)| *f != e)
        .expect("the word differs");
    Some(Mismatch {
        offset: offset + wrong_word * 8 + at,
        expected: expected[at],
        found: found[at],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_copy_passes_and_lengths_need_not_be_multiples_of_8() {
        for len in [1, 4, 7, 8, 13, 4096] {
            let data = bytes(42, len);
            assert_eq!(data.len(), len);
            assert_eq!(first_mismatch(42, &data), None, "len {len}");
        }
    }

    #[test]
    fn large_messages_filled_and_checked_in_parts_match_one_thread() {
        let len = 3 * PARALLEL_BYTES + 13;
        let mut parallel = vec![0u8; len];
        fill(5, &mut parallel);
        let mut one = vec![0u8; len];
        fill_words(base(5), 0, &mut one);
        assert!(parallel == one);
        assert_eq!(first_mismatch(5, &parallel), None);
        // A wrong byte in a later part is found at its offset, and the earliest one wins.
        for at in [len - 1, 2 * PARALLEL_BYTES + 3, 17] {
            let mut wrong = parallel.clone();
            wrong[at] ^= 0x40;
            wrong[len - 2] ^= 0x01;
            let m = first_mismatch(5, &wrong).unwrap();
            assert_eq!(m.offset, at.min(len - 2), "{at}");
        }
    }

    #[test]
    fn shifted_copies_fail_for_every_shift() {
        let sent = bytes(7, 4096 + 64);
        for shift in 1..64 {
            let received = &sent[shift..shift + 4096];
            let m = first_mismatch(7, received).expect("shift must be caught");
            assert!(m.offset < 16, "shift {shift} first caught at {}", m.offset);
        }
    }

    #[test]
    fn neighbouring_seeds_are_not_shifted_copies_of_each_other() {
        let one = bytes(1, 4096 + 8);
        assert!(first_mismatch(2, &one[8..]).unwrap().offset < 8);
        assert!(first_mismatch(0, &one[..4096]).unwrap().offset < 8);
    }

    #[test]
    fn truncated_and_stale_copies_fail_at_the_first_wrong_byte() {
        let len = 1 << 16;
        let previous = bytes(seed(&[1, 0]), len);
        let current_seed = seed(&[1, 1]);
        let current = bytes(current_seed, len);

        // Truncated: only the first 1000 bytes arrived; the rest is the previous sample's data.
        let mut truncated = previous.clone();
        truncated[..1000].copy_from_slice(&current[..1000]);
        let m = first_mismatch(current_seed, &truncated).unwrap();
        assert!(
            (1000..1008).contains(&m.offset),
            "first wrong byte at {}",
            m.offset
        );
        assert_eq!(m.found, previous[m.offset]);
        assert_eq!(m.expected, current[m.offset]);

        // Stale: nothing arrived.
        assert!(first_mismatch(current_seed, &previous).unwrap().offset < 8);
        // Zeroed memory is not a valid message either.
        assert!(first_mismatch(current_seed, &vec![0; len]).is_some());
    }

    #[test]
    fn every_byte_follows_the_word_rule_a_gpu_is_given() {
        let mut rng = SplitMix::new(3);
        for _ in 0..20 {
            let seed = rng.next_u64();
            let len = 1 + rng.below(300) as usize;
            let message = bytes(seed, len);
            let rule = word_rule(seed);
            for (j, &b) in message.iter().enumerate() {
                let word = ((j / 8) as u64)
                    .wrapping_add(rule.base)
                    .wrapping_mul(rule.multiplier);
                assert_eq!(b, word.to_le_bytes()[j % 8], "seed {seed} byte {j}");
                assert_eq!(b, byte_at(seed, j));
            }
        }
    }

    #[test]
    fn seeds_differ_for_every_part_and_order() {
        let seeds = [
            seed(&[0, 0, 0]),
            seed(&[0, 0, 1]),
            seed(&[0, 1, 0]),
            seed(&[1, 0, 0]),
            seed(&[0, 0]),
        ];
        for (i, a) in seeds.iter().enumerate() {
            for b in &seeds[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}

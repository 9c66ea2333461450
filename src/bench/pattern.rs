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

/// Word `index` of the message that starts at `base`. Multiplying by an odd constant is a
/// bijection, so two bases give different words at every index and no two words of a message (up
/// to 2^64 of them) are equal; one multiply a word keeps filling and checking large buffers at
/// memory speed.
fn word(base: u64, index: usize) -> u64 {
    (index as u64)
        .wrapping_add(base)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The `len` bytes of the message for `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let base = base(seed);
    let mut out = Vec::with_capacity(len + 8);
    for index in 0..len.div_ceil(8) {
        out.extend_from_slice(&word(base, index).to_le_bytes());
    }
    out.truncate(len);
    out
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

/// Checks every byte of `data` against the message for `seed`.
pub fn first_mismatch(seed: u64, data: &[u8]) -> Option<Mismatch> {
    let base = base(seed);
    // Whole words first (the common, fast path), then the bytes of the word that differs.
    let words = data.chunks_exact(8);
    let tail = words.remainder();
    let wrong_word = words
        .enumerate()
        .find(|(index, chunk)| {
            u64::from_le_bytes((*chunk).try_into().expect("8 bytes")) != word(base, *index)
        })
        .map(|(index, _)| index)
        .or_else(|| {
            let index = data.len() / 8;
            let expected = word(base, index).to_le_bytes();
            (tail != &expected[..tail.len()]).then_some(index)
        })?;
    let expected = word(base, wrong_word).to_le_bytes();
    let found = &data[wrong_word * 8..data.len().min(wrong_word * 8 + 8)];
    let at = found
        .iter()
        .zip(expected)
        .position(|(f, e)| *f != e)
        .expect("the word differs");
    Some(Mismatch {
        offset: wrong_word * 8 + at,
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

//! Whether byte ranges of buffers overlap: a batch's destinations (the backend refuses them, since
//! its messages run in any order) and the engine's batch hazards.

use super::BufferId;

/// The starts of two `(buffer, start, end)` ranges that overlap in one buffer, if any.
///
/// Batches usually lay their messages out in order or in reverse order, one buffer after another:
/// such a list is checked in one pass ([`InOrder`]), with no copy and no sort; any other is sorted.
pub(crate) fn first_overlap<I>(ranges: I) -> Option<(usize, usize)>
where
    I: Iterator<Item = (BufferId, usize, usize)> + Clone,
{
    let mut order = InOrder::default();
    if ranges
        .clone()
        .all(|(buffer, start, end)| order.push(buffer, start, end))
    {
        return None;
    }
    let mut sorted: Vec<(BufferId, usize, usize)> = ranges.collect();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
        .map(|w| (w[0].1, w[1].1))
}

/// Follows ranges one at a time while they stay laid out in runs: each buffer's ranges
/// consecutive, each range wholly after (or, for the whole run, wholly before) the one before it.
/// Ranges so laid out cannot overlap; once they are not, only a sort can tell.
#[derive(Default)]
pub(super) struct InOrder {
    previous: Option<(BufferId, usize, usize)>,
    /// `Some(true)` once the current buffer's run is known to ascend.
    ascending: Option<bool>,
    /// Buffers whose run has ended.
    seen: Vec<BufferId>,
}

impl InOrder {
    /// Takes the next non-empty range; `false` once the ranges are no longer in runs.
    pub(super) fn push(&mut self, buffer: BufferId, start: usize, end: usize) -> bool {
        match self.previous {
            Some((b, s, e)) if b == buffer => {
                let up = start >= e;
                if !(up || end <= s) || self.ascending.is_some_and(|a| a != up) {
                    return false;
                }
                self.ascending = Some(up);
            }
            previous => {
                // A buffer met again after another one: its ranges are not in one run.
                if self.seen.contains(&buffer) {
                    return false;
                }
                if let Some((b, ..)) = previous {
                    self.seen.push(b);
                }
                self.ascending = None;
            }
        }
        self.previous = Some((buffer, start, end));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn overlaps_by_brute_force(ranges: &[(BufferId, usize, usize)]) -> bool {
        ranges.iter().enumerate().any(|(i, a)| {
            ranges[i + 1..]
                .iter()
                .any(|b| a.0 == b.0 && a.1 < b.2 && b.1 < a.2)
        })
    }

    #[test]
    fn ranges_in_order_or_reverse_pass_in_one_pass() {
        let up: Vec<_> = (0..10).map(|i| (BufferId(1), i * 8, i * 8 + 8)).collect();
        let down: Vec<_> = up.iter().rev().copied().collect();
        assert_eq!(first_overlap(up.iter().copied()), None);
        assert_eq!(first_overlap(down.iter().copied()), None);
    }

    #[test]
    fn an_overlap_is_found_in_a_run_and_out_of_one() {
        let run = [(BufferId(1), 0, 8), (BufferId(1), 4, 12)];
        assert_eq!(first_overlap(run.iter().copied()), Some((0, 4)));
        // Ascending, then back into the first range after another buffer.
        let scattered = [
            (BufferId(1), 0, 8),
            (BufferId(1), 16, 24),
            (BufferId(2), 0, 8),
            (BufferId(1), 20, 30),
        ];
        assert_eq!(first_overlap(scattered.iter().copied()), Some((16, 20)));
    }

    proptest! {
        #[test]
        fn first_overlap_agrees_with_brute_force(
            raw in proptest::collection::vec((1u64..4, 0usize..64, 1usize..16), 0..24),
            sort in 0u8..3,
        ) {
            let mut ranges: Vec<_> = raw.iter().map(|&(b, s, l)| (BufferId(b), s, s + l)).collect();
            // Sorted and reverse-sorted lists take the one-pass path; others the sort.
            match sort {
                0 => ranges.sort_unstable(),
                1 => { ranges.sort_unstable(); ranges.reverse(); }
                _ => {}
            }
            prop_assert_eq!(
                first_overlap(ranges.iter().copied()).is_some(),
                overlaps_by_brute_force(&ranges)
            );
        }
    }
}

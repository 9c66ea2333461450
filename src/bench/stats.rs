//! Summary statistics of repeated measurements: the crate's one median and its one set of spread
//! figures, for every figure peerlink reports (bench, explain, tune, the engine's proofs, compare).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The spread of a set of samples: what a single median would hide.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// 99th percentile, linearly interpolated between closest ranks (numpy's default).
    pub p99: f64,
    pub mean: f64,
    /// Coefficient of variation: sample standard deviation over the mean (0 for one sample).
    pub cv: f64,
    pub samples: usize,
}

impl Stats {
    /// [`Stats::of`] for times a backend returned: none, or one that is not finite, is an error.
    pub fn of_times(values: &[f64]) -> crate::Result<Stats> {
        Stats::of(values).ok_or_else(|| {
            crate::Error::InvalidHandle(
                "the backend returned no time, or one that is not finite".into(),
            )
        })
    }

    /// Statistics of `values`, or `None` when there are none or one is not finite.
    pub fn of(values: &[f64]) -> Option<Stats> {
        if values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let sorted = sorted(values)?;
        let n = sorted.len();
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let cv = if n > 1 && mean != 0.0 {
            let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            var.sqrt() / mean.abs()
        } else {
            0.0
        };
        Some(Stats {
            median: quantile(&sorted, 0.5),
            min: sorted[0],
            max: sorted[n - 1],
            p99: quantile(&sorted, 0.99),
            mean,
            cv,
            samples: n,
        })
    }
}

/// The median of `values`: the middle one, or the mean of the two middle ones for an even count;
/// `None` when there are none. Values that are not finite sort to the ends (NaN last).
pub fn median(values: &[f64]) -> Option<f64> {
    sorted(values).map(|s| quantile(&s, 0.5))
}

/// `values` in ascending order, `None` when there are none.
fn sorted(values: &[f64]) -> Option<Vec<f64>> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(sorted)
}

/// The `q` quantile of sorted values, interpolating between neighbours (for `q` = 0.5, the mean of
/// the two middle values of an even count).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_p99_and_cv_of_known_data() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.median, 3.0);
        assert_eq!((s.min, s.max), (1.0, 5.0));
        assert_eq!(s.mean, 3.0);
        // Sample standard deviation of 1..=5 is sqrt(2.5).
        assert!((s.cv - 2.5f64.sqrt() / 3.0).abs() < 1e-12);
        // Rank 0.99 * 4 = 3.96: 4 + 0.96 * (5 - 4).
        assert!((s.p99 - 4.96).abs() < 1e-12);

        let even = Stats::of(&[1.0, 2.0, 3.0, 10.0]).unwrap();
        assert_eq!(even.median, 2.5);
        assert_eq!(median(&[10.0, 3.0, 2.0, 1.0]), Some(2.5));
        assert_eq!(median(&[4.0, 1.0, 9.0]), Some(4.0));
        assert_eq!(median(&[]), None);
        // Not finite: sorted to the ends, where a median does not reach.
        assert_eq!(
            median(&[f64::NEG_INFINITY, 1.0, 2.0, f64::NAN, 3.0]),
            Some(2.0)
        );

        let hundred: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(Stats::of(&hundred).unwrap().p99, 100.0);
    }

    #[test]
    fn one_sample_has_no_spread_and_bad_input_has_no_stats() {
        let s = Stats::of(&[7.0]).unwrap();
        assert_eq!((s.median, s.p99, s.cv), (7.0, 7.0, 0.0));
        assert!(Stats::of(&[]).is_none());
        assert!(Stats::of(&[1.0, f64::NAN]).is_none());
    }
}

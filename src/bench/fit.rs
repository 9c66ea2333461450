//! The α–β model of a transfer: time = α + bytes / β.
//!
//! α is the fixed cost of one operation (µs), β the bandwidth it tends to (GB/s). The fit minimises
//! *relative* residuals, so the microsecond-scale latency end and the millisecond-scale bandwidth end
//! count alike (plain least squares in absolute time lets the largest sizes decide α, often making it
//! negative), and reweights (Huber) so that a few stray points — a jittery small copy, a size served
//! from cache — cannot drag β.

use super::stats::median;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// α and β of a sweep, with the sizes where a message reaches half and 90% of β.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fit {
    pub alpha_us: f64,
    pub beta_gbps: f64,
    /// α·β: a message this large moves at β/2.
    pub half_beta_bytes: f64,
    /// 9·α·β: a message this large moves at 0.9·β.
    pub ninety_beta_bytes: f64,
}

impl Fit {
    /// Builds a fit from α (µs) and β (GB/s).
    pub fn new(alpha_us: f64, beta_gbps: f64) -> Fit {
        // GB/s × µs = 1e9 B/s × 1e-6 s = 1e3 bytes.
        let alpha_beta = alpha_us * beta_gbps * 1e3;
        Fit {
            alpha_us,
            beta_gbps,
            half_beta_bytes: alpha_beta,
            ninety_beta_bytes: 9.0 * alpha_beta,
        }
    }

    /// The modelled time of one message of `bytes`, in µs.
    pub fn time_us(&self, bytes: f64) -> f64 {
        self.alpha_us + bytes / (self.beta_gbps * 1e3)
    }

    /// The modelled rate of one message of `bytes`, in GB/s.
    pub fn gbps(&self, bytes: f64) -> f64 {
        bytes / self.time_us(bytes) / 1e3
    }
}

/// Fits `(bytes, time_us)` points. `None` when fewer than two distinct sizes are given or the times
/// do not grow with size (no bandwidth can be read from them).
pub fn fit(points: &[(u64, f64)]) -> Option<Fit> {
    let usable: Vec<(f64, f64)> = points
        .iter()
        .filter(|(b, t)| *b > 0 && t.is_finite() && *t > 0.0)
        .map(|&(b, t)| (b as f64, t))
        .collect();
    let distinct = {
        let mut sizes: Vec<u64> = usable.iter().map(|p| p.0 as u64).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes.len()
    };
    if distinct < 2 {
        return None;
    }
    // Relative residuals: weight each point by 1/t², then Huber-reweight by its scaled residual.
    let mut robustness = vec![1.0; usable.len()];
    let mut line = (0.0, 0.0);
    for _ in 0..20 {
        let weights: Vec<f64> = usable
            .iter()
            .zip(&robustness)
            .map(|((_, t), r)| r / (t * t))
            .collect();
        line = weighted_line(&usable, &weights)?;
        let residuals: Vec<f64> = usable
            .iter()
            .map(|(b, t)| (line.0 + line.1 * b - t) / t)
            .collect();
        let abs: Vec<f64> = residuals.iter().map(|r| r.abs()).collect();
        // The median absolute residual (there is one per usable point, at least two).
        let scale = median(&abs).unwrap_or(0.0).max(1e-6) / 0.6745;
        const HUBER_K: f64 = 1.345;
        robustness = residuals
            .iter()
            .map(|r| {
                let z = (r / scale).abs();
                if z <= HUBER_K {
                    1.0
                } else {
                    HUBER_K / z
                }
            })
            .collect();
    }
    let (alpha, us_per_byte) = line;
    (us_per_byte > 0.0).then(|| Fit::new(alpha, 1.0 / us_per_byte / 1e3))
}

/// Weighted least squares for t = α + γ·b; α is kept ≥ 0 (a negative fixed cost means the points
/// cannot separate it from zero). `None` when γ cannot be determined.
fn weighted_line(points: &[(f64, f64)], weights: &[f64]) -> Option<(f64, f64)> {
    let sum = |f: &dyn Fn(f64, f64) -> f64| -> f64 {
        points
            .iter()
            .zip(weights)
            .map(|(&(b, t), w)| w * f(b, t))
            .sum()
    };
    let (sw, sb, st) = (sum(&|_, _| 1.0), sum(&|b, _| b), sum(&|_, t| t));
    let (sbb, sbt) = (sum(&|b, _| b * b), sum(&|b, t| b * t));
    let det = sw * sbb - sb * sb;
    let (alpha, gamma) = if det > 0.0 {
        ((sbb * st - sb * sbt) / det, (sw * sbt - sb * st) / det)
    } else {
        (f64::NAN, f64::NAN)
    };
    if alpha.is_finite() && alpha >= 0.0 {
        Some((alpha, gamma))
    } else if sbb > 0.0 {
        Some((0.0, sbt / sbb))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(alpha_us: f64, beta_gbps: f64) -> Vec<(u64, f64)> {
        (2..=30)
            .map(|k| {
                let bytes = 1u64 << k;
                (bytes, Fit::new(alpha_us, beta_gbps).time_us(bytes as f64))
            })
            .collect()
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn recovers_alpha_and_beta_from_exact_points() {
        for (alpha, beta) in [(2.5, 390.0), (10.0, 25.0), (0.8, 2000.0)] {
            let f = fit(&synthetic(alpha, beta)).unwrap();
            assert!(close(f.alpha_us, alpha, 1e-6), "{f:?}");
            assert!(close(f.beta_gbps, beta, 1e-6), "{f:?}");
            assert!(close(f.half_beta_bytes, alpha * beta * 1e3, 1e-6));
            assert!(close(f.ninety_beta_bytes, 9.0 * alpha * beta * 1e3, 1e-6));
        }
    }

    #[test]
    fn the_half_and_ninety_percent_sizes_mean_what_they_say() {
        let f = Fit::new(2.0, 400.0);
        assert!(close(f.gbps(f.half_beta_bytes), 200.0, 1e-9));
        assert!(close(f.gbps(f.ninety_beta_bytes), 360.0, 1e-9));
    }

    #[test]
    fn stray_points_at_either_end_do_not_drag_the_fit() {
        let mut points = synthetic(3.0, 400.0);
        points[0].1 *= 4.0; // a jittery 4-byte copy
        points[1].1 *= 3.0;
        let cached = points.len() - 10; // a size served from L2: twice as fast
        points[cached].1 *= 0.5;
        // Noise of ±2% everywhere.
        for (i, p) in points.iter_mut().enumerate() {
            p.1 *= 1.0 + 0.02 * if i % 2 == 0 { 1.0 } else { -1.0 };
        }
        let f = fit(&points).unwrap();
        assert!(close(f.beta_gbps, 400.0, 0.05), "{f:?}");
        assert!(close(f.alpha_us, 3.0, 0.10), "{f:?}");
    }

    #[test]
    fn refuses_what_cannot_be_fitted() {
        assert!(fit(&[]).is_none());
        assert!(fit(&[(4, 1.0), (4, 1.1)]).is_none());
        // Time falling with size: no bandwidth in it.
        assert!(fit(&[(4, 5.0), (1 << 20, 4.0), (1 << 24, 3.0)]).is_none());
    }
}

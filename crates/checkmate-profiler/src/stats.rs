//! Small statistics: quantiles of samples and least-squares lines.

use serde::{Deserialize, Serialize};

/// The `q`-quantile (0..=1) of `sorted` (ascending), linearly interpolated between order
/// statistics (type 7, as numpy's default). `NaN` for an empty slice.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

/// Median, first and third quartile of some samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Median.
    pub median: f64,
    /// First quartile.
    pub q1: f64,
    /// Third quartile.
    pub q3: f64,
    /// Smallest sample.
    pub min: f64,
    /// Number of samples.
    pub count: usize,
}

impl Summary {
    /// Summarizes `samples` (any order). `NaN`s everywhere for no samples.
    pub fn of(samples: &[f64]) -> Summary {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Summary {
            median: quantile_sorted(&s, 0.5),
            q1: quantile_sorted(&s, 0.25),
            q3: quantile_sorted(&s, 0.75),
            min: s.first().copied().unwrap_or(f64::NAN),
            count: s.len(),
        }
    }

    /// Interquartile range `q3 - q1`.
    pub fn iqr(&self) -> f64 {
        self.q3 - self.q1
    }

    /// Standard error of the median, estimated from the IQR as for a normal distribution:
    /// `sigma ~ IQR / 1.349`, `se(median) ~ 1.2533 * sigma / sqrt(n)`.
    pub fn median_standard_error(&self) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        1.2533 * (self.iqr() / 1.349) / (self.count as f64).sqrt()
    }
}

/// A least-squares line `y = intercept + slope * x` and how well it fits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    /// `a` in `y = a + b x`.
    pub intercept: f64,
    /// `b` in `y = a + b x`.
    pub slope: f64,
    /// Coefficient of determination `1 - SS_res / SS_tot` (1 when the samples are all equal and
    /// fitted exactly, 0 when they are equal but the fit misses them).
    pub r2: f64,
    /// Largest `|y - fitted| / |y|` over the points (0 for exact fits; points with `y == 0` use
    /// the absolute residual).
    pub max_rel_residual: f64,
    /// Number of points.
    pub points: usize,
}

impl LinearFit {
    /// The fitted value at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }

    /// Fits `ys` against `xs` by ordinary least squares. `None` with fewer than two distinct
    /// `x` values or mismatched lengths.
    pub fn fit(xs: &[f64], ys: &[f64]) -> Option<LinearFit> {
        let n = xs.len();
        if n != ys.len() || n < 2 {
            return None;
        }
        let mx = xs.iter().sum::<f64>() / n as f64;
        let my = ys.iter().sum::<f64>() / n as f64;
        let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
        if sxx <= 0.0 || !sxx.is_finite() {
            return None;
        }
        let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        let slope = sxy / sxx;
        let intercept = my - slope * mx;
        let mut ss_res = 0.0;
        let mut ss_tot = 0.0;
        let mut max_rel = 0.0f64;
        for (&x, &y) in xs.iter().zip(ys) {
            let r = y - (intercept + slope * x);
            ss_res += r * r;
            ss_tot += (y - my) * (y - my);
            let rel = if y != 0.0 { r.abs() / y.abs() } else { r.abs() };
            max_rel = max_rel.max(rel);
        }
        let scale = ys.iter().map(|y| y * y).sum::<f64>().max(f64::MIN_POSITIVE);
        let r2 = if ss_tot > 1e-24 * scale {
            1.0 - ss_res / ss_tot
        } else if ss_res <= 1e-24 * scale {
            1.0
        } else {
            0.0
        };
        Some(LinearFit {
            intercept,
            slope,
            r2,
            max_rel_residual: max_rel,
            points: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&s, 0.5), 2.5);
        assert_eq!(quantile_sorted(&s, 0.25), 1.75);
        assert_eq!(quantile_sorted(&s, 0.75), 3.25);
        let sum = Summary::of(&[5.0, 1.0, 3.0]);
        assert_eq!((sum.median, sum.min, sum.count), (3.0, 1.0, 3));
        assert!(Summary::of(&[]).median.is_nan());
    }

    #[test]
    fn exact_line_is_recovered() {
        let xs = [1.0, 2.0, 4.0, 8.0];
        let ys: Vec<f64> = xs.iter().map(|x| 0.5 + 0.25 * x).collect();
        let f = LinearFit::fit(&xs, &ys).unwrap();
        assert!((f.intercept - 0.5).abs() < 1e-12);
        assert!((f.slope - 0.25).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert!(f.max_rel_residual < 1e-12);
        assert!((f.at(16.0) - 4.5).abs() < 1e-12);
    }

    #[test]
    fn noisy_line_reports_its_misfit() {
        let xs = [1.0, 2.0, 3.0];
        let ys = [1.0, 3.0, 2.0];
        let f = LinearFit::fit(&xs, &ys).unwrap();
        assert!((f.slope - 0.5).abs() < 1e-12);
        assert!((f.r2 - 0.25).abs() < 1e-12);
        assert!(f.max_rel_residual > 0.3);
        assert!(LinearFit::fit(&[2.0, 2.0], &[1.0, 2.0]).is_none());
        // Constant data fitted exactly.
        assert_eq!(LinearFit::fit(&[1.0, 2.0], &[3.0, 3.0]).unwrap().r2, 1.0);
    }
}

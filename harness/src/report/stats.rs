//! Order statistics of repeated timings, and the crossover rule for a path threshold.

use serde::{Deserialize, Serialize};

/// Median with the 10th and 90th percentiles (docs/design.md §8), plus the extremes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p10: f64,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
}

impl Summary {
    /// Sorts `values` in place. Percentiles interpolate linearly between order statistics (the
    /// rule numpy and R use by default), so the median of an even count is the midpoint.
    /// An empty input gives NaNs with `n = 0`.
    pub fn of(values: &mut [f64]) -> Summary {
        values.sort_by(f64::total_cmp);
        Summary {
            n: values.len(),
            min: values.first().copied().unwrap_or(f64::NAN),
            p10: percentile(values, 0.10),
            median: percentile(values, 0.50),
            p90: percentile(values, 0.90),
            max: values.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// The `q`-quantile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let pos = q * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = pos - lo as f64;
            if frac == 0.0 {
                sorted[lo]
            } else {
                sorted[lo] + (sorted[hi] - sorted[lo]) * frac
            }
        }
    }
}

/// Where the compare side starts winning, from (prompt length, speedup) points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "prompt_tokens", rename_all = "snake_case")]
pub enum Crossover {
    /// Faster at every measured length (the threshold lies at or below the shortest).
    Everywhere(usize),
    /// Faster at this length and at every longer one, not at the length just below it.
    From(usize),
    /// Not faster at the longest measured length: no threshold within the measured range.
    Never,
}

impl Crossover {
    /// The smallest length L such that speedup > 1 at L and at every longer measured length.
    /// "Faster" is a strict speedup above 1.0 of the medians; ties count as not faster.
    pub fn find(points: &[(usize, f64)]) -> Crossover {
        let mut pts: Vec<(usize, f64)> = points.to_vec();
        pts.sort_by_key(|p| p.0);
        let mut from = None;
        for &(len, speedup) in pts.iter().rev() {
            if speedup > 1.0 {
                from = Some(len);
            } else {
                break;
            }
        }
        match from {
            None => Crossover::Never,
            Some(len) if len == pts[0].0 => Crossover::Everywhere(len),
            Some(len) => Crossover::From(len),
        }
    }

    /// A sentence for the report, e.g. "gdn=chunked is faster from 256 prompt tokens up".
    pub fn describe(&self, compare: &str, baseline: &str) -> String {
        match self {
            Crossover::Everywhere(len) => {
                format!("{compare} is faster than {baseline} at every measured length (from {len} tokens, the shortest)")
            }
            Crossover::From(len) => {
                format!("{compare} is faster than {baseline} from {len} prompt tokens up: use it for prompts of at least {len} tokens")
            }
            Crossover::Never => format!("{compare} is not faster than {baseline} at the longest measured length: no crossover"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        // numpy.percentile([1, 2, 3, 4], [10, 50, 90]) = [1.3, 2.5, 3.7]
        let s = Summary::of(&mut [4.0, 1.0, 3.0, 2.0]);
        approx::assert_relative_eq!(s.p10, 1.3, max_relative = 1e-12);
        assert_eq!(s.median, 2.5);
        approx::assert_relative_eq!(s.p90, 3.7, max_relative = 1e-12);
        assert_eq!((s.min, s.max, s.n), (1.0, 4.0, 4));
        let one = Summary::of(&mut [7.5]);
        assert_eq!((one.p10, one.median, one.p90), (7.5, 7.5, 7.5));
        assert!(Summary::of(&mut []).median.is_nan());
    }

    #[test]
    fn crossover_is_the_start_of_the_final_winning_run() {
        use Crossover::*;
        assert_eq!(
            Crossover::find(&[(64, 0.5), (128, 0.9), (256, 1.2), (512, 2.0)]),
            From(256)
        );
        // A win below a loss does not count: the threshold must hold for every longer length.
        assert_eq!(
            Crossover::find(&[(64, 1.1), (128, 0.9), (256, 1.2), (512, 2.0)]),
            From(256)
        );
        assert_eq!(
            Crossover::find(&[(512, 2.0), (64, 1.1), (256, 1.5)]),
            Everywhere(64)
        );
        assert_eq!(
            Crossover::find(&[(64, 0.5), (128, 1.5), (256, 0.99)]),
            Never
        );
        // Equal speed is not faster.
        assert_eq!(Crossover::find(&[(64, 0.5), (128, 1.0)]), Never);
        assert_eq!(Crossover::find(&[]), Never);
    }
}

//! Order statistics of repeated timings, bootstrap confidence intervals of medians and of
//! speedups (ratios of medians) with the verdict they support, and the crossover rule for a
//! path threshold, which counts only significant wins.

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

/// Resamples behind each bootstrap interval: enough that the 2.5% and 97.5% quantiles move
/// by well under a percent between seeds on the repeat counts sweeps use.
pub const RESAMPLES: usize = 4000;

/// Runs a side needs before an interval (and a verdict) is given: the median of fewer than
/// three resampled timings is one of the timings themselves, and says nothing about spread.
pub const MIN_RUNS: usize = 3;

/// The half-width (relative to the median) a sweep's repeats aim for: `harness sweep` repeats
/// until every cell's median interval is this narrow or a cap is reached, and the report marks
/// the cells that stayed wider.
pub const TARGET_HALF_WIDTH: f64 = 0.05;

/// A 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    /// Half the width relative to `center` (0.05: the interval is center ± 5%).
    pub fn relative_half_width(&self, center: f64) -> f64 {
        (self.hi - self.lo) / 2.0 / center.abs()
    }

    /// Whether this interval of a median `center` is within ±[`TARGET_HALF_WIDTH`].
    pub fn is_narrow(&self, center: f64) -> bool {
        self.relative_half_width(center) <= TARGET_HALF_WIDTH
    }
}

/// The median of `values` resampled with replacement `RESAMPLES` times (a fixed seed: the
/// same timings always give the same interval), sorted.
fn bootstrap_medians(values: &[f64], seed: u64) -> Vec<f64> {
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n = values.len();
    let mut sample = vec![0.0; n];
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in sample.iter_mut() {
                // Modulo bias is below n / 2^64: nothing next to timing noise.
                *x = values[(rng.next_u64() % n as u64) as usize];
            }
            sample.sort_by(f64::total_cmp);
            percentile(&sample, 0.5)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    medians
}

/// The percentile-bootstrap 95% interval of the median of `values`, or `None` under
/// [`MIN_RUNS`] runs.
pub fn median_interval(values: &[f64]) -> Option<Interval> {
    if values.len() < MIN_RUNS {
        return None;
    }
    let m = bootstrap_medians(values, 0x6d65_6469_616e);
    Some(Interval {
        lo: percentile(&m, 0.025),
        hi: percentile(&m, 0.975),
    })
}

/// The percentile-bootstrap 95% interval of median(baseline) / median(compare), each side
/// resampled on its own (the runs of one side are not paired with the other's), or `None`
/// when a side has under [`MIN_RUNS`] runs.
pub fn ratio_interval(baseline: &[f64], compare: &[f64]) -> Option<Interval> {
    if baseline.len() < MIN_RUNS || compare.len() < MIN_RUNS {
        return None;
    }
    let b = bootstrap_medians(baseline, 0x6261_7365);
    let c = bootstrap_medians(compare, 0x636f_6d70);
    // The resamples of the two sides are independent, so pairing them index by index after a
    // shuffle-free sort would correlate them: pair b's i-th draw with c's draw from a second,
    // independently seeded permutation instead.
    let mut ratios: Vec<f64> = permuted(&b, 0x0072_6174_696f)
        .iter()
        .zip(&c)
        .map(|(b, c)| b / c)
        .collect();
    ratios.sort_by(f64::total_cmp);
    Some(Interval {
        lo: percentile(&ratios, 0.025),
        hi: percentile(&ratios, 0.975),
    })
}

/// `values` in a seeded random order (Fisher–Yates).
fn permuted(values: &[f64], seed: u64) -> Vec<f64> {
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut v = values.to_vec();
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// What a speedup's interval says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole interval lies above 1: the compare side is faster.
    Faster,
    /// The whole interval lies below 1.
    Slower,
    /// The interval holds 1.
    NoDifference,
    /// A side has under [`MIN_RUNS`] runs: no interval.
    TooFewRuns,
}

impl Verdict {
    pub fn of(interval: Option<Interval>) -> Verdict {
        match interval {
            None => Verdict::TooFewRuns,
            Some(i) if i.lo > 1.0 => Verdict::Faster,
            Some(i) if i.hi < 1.0 => Verdict::Slower,
            Some(_) => Verdict::NoDifference,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Faster => "faster",
            Verdict::Slower => "slower",
            Verdict::NoDifference => "no difference detected",
            Verdict::TooFewRuns => "too few runs",
        }
    }
}

/// Where the compare side starts winning, from (prompt length, verdict) points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "prompt_tokens", rename_all = "snake_case")]
pub enum Crossover {
    /// Significantly faster at every measured length (the threshold lies at or below the
    /// shortest).
    Everywhere(usize),
    /// Significantly faster at this length and at every longer one, not at the length just
    /// below it.
    From(usize),
    /// Not significantly faster at the longest measured length: no threshold is shown within
    /// the measured range.
    Never,
}

impl Crossover {
    /// The smallest length L such that the compare side is [`Verdict::Faster`] at L and at
    /// every longer measured length: a speedup whose interval holds 1 (or has too few runs to
    /// have one) is not a win, however far its median lies above 1.
    pub fn find(points: &[(usize, Verdict)]) -> Crossover {
        let mut pts: Vec<(usize, Verdict)> = points.to_vec();
        pts.sort_by_key(|p| p.0);
        let mut from = None;
        for &(len, verdict) in pts.iter().rev() {
            if verdict == Verdict::Faster {
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
                format!("{compare} is faster than {baseline} at every measured length (from {len} tokens, the shortest; 95% intervals above 1)")
            }
            Crossover::From(len) => {
                format!("{compare} is faster than {baseline} from {len} prompt tokens up (95% intervals above 1 there and at every longer length): use it for prompts of at least {len} tokens")
            }
            Crossover::Never => format!("{compare} is not shown faster than {baseline} at the longest measured length (its 95% interval is not above 1): no crossover"),
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
        use Verdict::{Faster as F, NoDifference as N, Slower as S, TooFewRuns as T};
        assert_eq!(
            Crossover::find(&[(64, S), (128, N), (256, F), (512, F)]),
            From(256)
        );
        // A win below a loss does not count: the threshold must hold for every longer length.
        assert_eq!(
            Crossover::find(&[(64, F), (128, N), (256, F), (512, F)]),
            From(256)
        );
        assert_eq!(
            Crossover::find(&[(512, F), (64, F), (256, F)]),
            Everywhere(64)
        );
        assert_eq!(Crossover::find(&[(64, S), (128, F), (256, S)]), Never);
        // No difference detected, or no interval at all, is not a win.
        assert_eq!(Crossover::find(&[(64, S), (128, N)]), Never);
        assert_eq!(Crossover::find(&[(64, F), (128, T)]), Never);
        assert_eq!(Crossover::find(&[]), Never);
    }

    /// A naive f64 reference: the exact bootstrap distribution of the median of 3 values,
    /// enumerated over all 27 equally likely resamples.
    #[test]
    fn median_interval_follows_the_exact_bootstrap_distribution() {
        let values = [10.0, 11.0, 30.0];
        let mut exact = Vec::new();
        for a in values {
            for b in values {
                for c in values {
                    let mut s = [a, b, c];
                    s.sort_by(f64::total_cmp);
                    exact.push(s[1]);
                }
            }
        }
        // P(median = 10) = P(median = 30) = 7/27, P(median = 11) = 13/27: the 2.5% and 97.5%
        // quantiles are 10 and 30.
        let ci = median_interval(&values).unwrap();
        assert_eq!((ci.lo, ci.hi), (10.0, 30.0));
        let share_11 = bootstrap_medians(&values, 7)
            .iter()
            .filter(|m| **m == 11.0)
            .count() as f64
            / RESAMPLES as f64;
        let want = exact.iter().filter(|m| **m == 11.0).count() as f64 / 27.0;
        assert!((share_11 - want).abs() < 0.03, "{share_11} vs {want}");
        assert!(median_interval(&[1.0, 2.0]).is_none());
    }

    #[test]
    fn ratio_interval_separates_real_differences_from_noise() {
        // Two sides 30% apart with ±2% jitter: the interval excludes 1 and holds 1.3.
        let base: Vec<f64> = (0..9)
            .map(|i| 130.0 * (1.0 + 0.02 * ((i % 5) as f64 - 2.0) / 2.0))
            .collect();
        let comp: Vec<f64> = (0..9)
            .map(|i| 100.0 * (1.0 + 0.02 * ((i % 3) as f64 - 1.0)))
            .collect();
        let ci = ratio_interval(&base, &comp).unwrap();
        assert!(
            ci.lo > 1.2 && ci.hi < 1.4 && ci.lo <= 1.3 && 1.3 <= ci.hi,
            "{ci:?}"
        );
        assert_eq!(Verdict::of(Some(ci)), Verdict::Faster);
        assert_eq!(Verdict::of(ratio_interval(&comp, &base)), Verdict::Slower);
        // Medians 1.30x apart, but ranges that overlap almost entirely: no difference.
        let a = [100.0, 180.0, 130.0, 95.0, 170.0];
        let b = [100.0, 175.0, 90.0, 168.0, 99.0];
        let ci = ratio_interval(&a, &b).unwrap();
        assert!(ci.lo < 1.0 && ci.hi > 1.0, "{ci:?}");
        assert_eq!(Verdict::of(Some(ci)), Verdict::NoDifference);
        assert_eq!(
            Verdict::of(ratio_interval(&a, &b[..2])),
            Verdict::TooFewRuns
        );
        // The same timings give the same interval.
        assert_eq!(ratio_interval(&a, &b), ratio_interval(&a, &b));
    }
}

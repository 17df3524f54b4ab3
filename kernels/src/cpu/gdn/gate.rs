//! The decay gate in log space: `g_log = −exp(A_log) · softplus(a + dt_bias)`.
//!
//! The model never needs the gate itself, only its logarithm (per step it takes `exp(g_log)`,
//! chunked it sums `g_log` inside a chunk). Producing `exp(g_log)` and taking its log later
//! underflows to `log 0 = −inf` under strong decay and then `−inf − (−inf) = NaN` inside a
//! chunk, so the gate stays in log space from the start.

use crate::params::GATE_FLOOR;
use crate::{Result, Tensor};

/// `a` is `[T, Hv]` f32; `a_log` and `dt_bias` are `[Hv]` of any float dtype.
pub fn gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    let hv = a.dim(-1);
    let (a_log, dt_bias) = (a_log.to_vec_f32()?, dt_bias.to_vec_f32()?);
    let out = a
        .f32s()?
        .iter()
        .enumerate()
        .map(|(i, &x)| log_gate(a_log[i % hv], x, dt_bias[i % hv]))
        .collect();
    Tensor::from_f32(a.shape(), out)
}

/// One gate, through logarithms in f64: `−exp(A_log + ln softplus(x))`. The direct product
/// overflows `exp(A_log)` to inf for `A_log > 88` (f32) while `softplus` underflows to 0 for
/// very negative `x`, and `inf · 0 = NaN`; the sum of logarithms has no such corner. NaN input
/// stays NaN.
fn log_gate(a_log: f32, a: f32, dt_bias: f32) -> f32 {
    let x = a as f64 + dt_bias as f64;
    let log_rate = a_log as f64 + ln_softplus(x);
    let g = -log_rate.exp();
    if g < GATE_FLOOR as f64 {
        GATE_FLOOR
    } else {
        g as f32
    }
}

/// `ln(ln(1 + eˣ))` without underflow: below `x = −36`, `softplus(x) = eˣ(1 − eˣ/2 + …)` equals
/// `eˣ` to f64 precision, so its logarithm is `x` itself, even where `eˣ` is 0.
fn ln_softplus(x: f64) -> f64 {
    if x < -36.0 {
        x
    } else {
        (x.max(0.0) + (-x.abs()).exp().ln_1p()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_formula_in_the_ordinary_range() {
        let (a_log, a, dt) = (0.5f32, 0.3f32, -0.1f32);
        let x = (a + dt) as f64;
        let want = -(a_log as f64).exp() * (1.0 + x.exp()).ln();
        let got = log_gate(a_log, a, dt) as f64;
        approx::assert_relative_eq!(got, want, max_relative = 1e-6);
    }

    #[test]
    fn extreme_inputs_stay_finite() {
        assert_eq!(log_gate(100.0, -1e4, 0.0), -0.0);
        assert_eq!(log_gate(1e30, 10.0, 0.0), GATE_FLOOR);
        // e^(1e30) · softplus(−1e30) = e^(1e30 − 1e30) = 1: the logs cancel exactly.
        assert_eq!(log_gate(1e30, -1e30, 0.0), -1.0);
        assert_eq!(log_gate(-1e30, 1e30, 0.0), -0.0);
        assert!(log_gate(f32::NAN, 0.0, 0.0).is_nan());
    }
}

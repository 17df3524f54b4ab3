//! Elementwise activations and the row-wise softmax family.

use rayon::prelude::*;

use crate::{Result, Tensor};

/// `x·sigmoid(x)`; the limit 0 at `x = -inf` is explicit (the formula gives `-inf·0 = NaN`).
pub fn silu(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return -0.0;
    }
    x * sigmoid(x)
}

/// Written with `e^-|x|` so that nothing overflows and tiny results for very negative `x`
/// keep their value instead of rounding through `1/inf`.
pub fn sigmoid(x: f32) -> f32 {
    let e = (-x.abs()).exp();
    if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

/// `log(1 + eˣ) = max(x, 0) + log(1 + e^-|x|)`: exact to rounding for every input, with no
/// overflow for large `x` and no loss of the tiny result for very negative `x`.
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// GELU, tanh approximation: `x·½(1 + tanh(u))` with `u = √(2/π)(x + 0.044715x³)`, computed
/// as the identical `x·sigmoid(2u)`: `1 + tanh(u)` cancels to a few bits (or to 0) in f32 for
/// negative `x`, the sigmoid keeps full relative precision there. The limit 0 at `x = -inf`
/// is explicit (the formula gives `-inf·0 = NaN`).
pub fn gelu_tanh(x: f32) -> f32 {
    const TWO_C: f32 = 1.595_769; // 2·sqrt(2/pi)
    if x == f32::NEG_INFINITY {
        return -0.0;
    }
    x * sigmoid(TWO_C * (x + 0.044_715 * x * x * x))
}

/// Soft capping `c·tanh(x/c)` (Gemma's final logits), with `tanh(y)` as
/// `−expm1(−2|y|) / (2 + expm1(−2|y|))` carrying the sign of `y`: exact to a few ulp near 0
/// (no `1 − e` cancellation) and saturating to ±c without overflow.
pub fn softcap(x: f32, c: f32) -> f32 {
    let y = x / c;
    let m = (-2.0 * y.abs()).exp_m1();
    c * (-m / (2.0 + m)).copysign(y)
}

/// `eˣ` for softmax terms: a Cody–Waite reduction and a degree-7 polynomial (within 2 ulp of
/// `f32::exp` on `[-87, 88]`), written without branches on the value path so loops over it
/// vectorise. Results below `e⁻⁸⁷` flush to 0 (they vanish next to the row maximum's 1);
/// NaN stays NaN. Not for `x > 88`.
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n·LN2_HI` is exact for the |n| <= 128 used here.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5·2²³ rounds to an integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = if x < -87.0 { -87.0 } else { x };
    let xc = if xc > 88.0 { 88.0 } else { xc };
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let y = p * f32::from_bits((ni.wrapping_add(127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        y
    }
}

/// Applies `f` elementwise.
pub fn map(x: &Tensor, f: impl Fn(f32) -> f32 + Sync + Send) -> Result<Tensor> {
    let src = x.f32s()?;
    let mut out = vec![0.0f32; src.len()];
    if src.len() < 1 << 15 {
        out.iter_mut().zip(src).for_each(|(o, &v)| *o = f(v));
    } else {
        out.par_chunks_mut(4096)
            .zip(src.par_chunks(4096))
            .for_each(|(o, s)| o.iter_mut().zip(s).for_each(|(o, &v)| *o = f(v)));
    }
    Tensor::from_f32(x.shape(), out)
}

fn rowwise(x: &Tensor, f: impl Fn(&[f32], &mut [f32]) + Sync + Send) -> Result<Tensor> {
    let src = x.f32s()?;
    let n = x.dim(-1);
    let mut out = vec![0.0f32; src.len()];
    super::for_each_row(&mut out, n, |i, row| f(&src[i * n..(i + 1) * n], row));
    Tensor::from_f32(x.shape(), out)
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    rowwise(x, softmax_row)
}

/// A row of only `-inf` (everything masked) has no mass to spread: it gives all zeros rather
/// than `0/0 = NaN`. NaN inputs give a NaN row.
pub(crate) fn softmax_row(s: &[f32], o: &mut [f32]) {
    let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if m == f32::NEG_INFINITY && !s.iter().any(|v| v.is_nan()) {
        o.fill(0.0);
        return;
    }
    let mut sum = 0.0f64;
    for (o, &v) in o.iter_mut().zip(s) {
        *o = (v - m).exp();
        sum += *o as f64;
    }
    let inv = (1.0 / sum) as f32;
    o.iter_mut().for_each(|v| *v *= inv);
}

/// Computed in f64 for exact-looking logprobs. An all `-inf` row stays all `-inf`
/// (`log 0`), matching `softmax`'s zeros.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    rowwise(x, |s, o| {
        let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        if m == f64::NEG_INFINITY && !s.iter().any(|v| v.is_nan()) {
            o.fill(f32::NEG_INFINITY);
            return;
        }
        // `(v - m) - ln Σ` rather than `v - (m + ln Σ)`: the latter loses ln Σ next to a huge m.
        let log_sum = s.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        o.iter_mut()
            .zip(s)
            .for_each(|(o, &v)| *o = ((v as f64 - m) - log_sum) as f32);
    })
}

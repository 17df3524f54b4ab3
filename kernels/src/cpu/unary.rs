use rayon::prelude::*;

use crate::{Result, Tensor};

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `log(1 + eˣ)`, linear above 20 where the exponential would only add rounding.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
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
    rowwise(x, |s, o| softmax_row(s, o))
}

pub(crate) fn softmax_row(s: &[f32], o: &mut [f32]) {
    let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0.0f32;
    for (o, &v) in o.iter_mut().zip(s) {
        *o = if v == f32::NEG_INFINITY {
            0.0
        } else {
            (v - m).exp()
        };
        sum += *o;
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|v| *v *= inv);
}

pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    rowwise(x, |s, o| {
        let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let lse = m + s.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        o.iter_mut()
            .zip(s)
            .for_each(|(o, &v)| *o = (v as f64 - lse) as f32);
    })
}

//! Sparse mixture of experts on the host: top-k routing of router probabilities and the weighted
//! combine of the selected experts' outputs. The expert matmuls themselves are ordinary
//! matmuls over one expert's rows (see `ops::gather_matmul`).

use std::cmp::Ordering;

use crate::{Result, Tensor};

/// How a router's per-expert scores become the top-k weights (see `ops::Routing`).
#[derive(Debug, Clone, Copy)]
pub struct Rule<'a> {
    /// Added to the scores for the choice only; empty = none.
    pub selection_bias: &'a [f32],
    pub renormalize: bool,
    /// Added to the sum before dividing by it.
    pub renormalize_eps: f32,
    /// Multiplies every final weight.
    pub scale: f32,
}

/// Per row of `scores` (`[T, E]`, softmax or sigmoid outputs): the `k` experts with the highest
/// score plus `rule.selection_bias` (ties to the lower index, NaN ranked last), best first, and
/// their unbiased scores, divided by their sum (+ eps) when `rule.renormalize` (summed in f32 in
/// that order, as mlx-lm's `scores.sum(-1)`), times `rule.scale`.
pub fn route(scores: &[f32], experts: usize, k: usize, rule: Rule) -> (Vec<u32>, Vec<f32>) {
    let rows = scores.len() / experts;
    let mut ids = Vec::with_capacity(rows * k);
    let mut weights = Vec::with_capacity(rows * k);
    let mut order: Vec<u32> = Vec::with_capacity(experts);
    let mut key = vec![0f32; experts];
    for row in scores.chunks(experts) {
        for (e, kv) in key.iter_mut().enumerate() {
            *kv = row[e] + rule.selection_bias.get(e).copied().unwrap_or(0.0);
        }
        order.clear();
        order.extend(0..experts as u32);
        let by = |a: &u32, b: &u32| {
            let (x, y) = (key[*a as usize], key[*b as usize]);
            let by_value = match (x.is_nan(), y.is_nan()) {
                (false, false) => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
                (nx, ny) => nx.cmp(&ny),
            };
            by_value.then(a.cmp(b))
        };
        order.sort_unstable_by(by);
        let chosen = &order[..k];
        let sum: f32 = chosen.iter().map(|&e| row[e as usize]).sum();
        for &e in chosen {
            ids.push(e);
            let p = row[e as usize];
            let w = if rule.renormalize {
                p / (sum + rule.renormalize_eps)
            } else {
                p
            };
            weights.push(w * rule.scale);
        }
    }
    (ids, weights)
}

/// `out[t] = Σ_j weights[t·k + j] · y[t·k + j]` (j in order), plus `scale[t] · shared[t]` when
/// a shared expert is given: `y` is `[T·k, N]`, `shared` `[T, N]`, `scale` `[T, 1]`.
pub fn combine(
    y: &Tensor,
    weights: &[f32],
    k: usize,
    shared: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let n = y.dim(-1);
    let t = y.dim(0) / k;
    let ys = y.f32s()?;
    let shared = match shared {
        Some((s, g)) => Some((s.f32s()?, g.f32s()?)),
        None => None,
    };
    let mut out = vec![0f32; t * n];
    super::for_each_row(&mut out, n, |row, o| {
        for j in 0..k {
            let p = row * k + j;
            let w = weights[p];
            for (o, &v) in o.iter_mut().zip(&ys[p * n..(p + 1) * n]) {
                *o += v * w;
            }
        }
        if let Some((s, g)) = shared {
            for (o, &v) in o.iter_mut().zip(&s[row * n..(row + 1) * n]) {
                *o += g[row] * v;
            }
        }
    });
    Tensor::from_f32(&[t, n], out)
}

//! The sparse mixture-of-experts ops on MLX: MLX's own gathered matmuls (`gather_mm` for dense
//! stacked weights, `gather_qmm` in the weight's quantization mode), which index the stacked
//! `[E, N, K]` weight by expert per row, so only the selected experts are read, as mlx-lm's
//! `SwitchLinear` / `QuantizedSwitchLinear` do. Routing happens on the host (`ops::moe_route`).

use mlx_rs::{ops as mx, Array};

use super::ops::{
    act_array, cast, f32_array, mode_name, no_array, quant_arrays, quant_input, raw_op, some_int,
};
use super::{mlx_err, tensor_of};
use crate::error::Result;
use crate::{Tensor, Weight};

macro_rules! m {
    ($op:expr, $e:expr) => {
        $e.map_err(|e| mlx_err($op, e))?
    };
}

fn indices(v: &[u32]) -> Array {
    Array::from_slice(v, &[v.len() as i32])
}

/// `out[p] = x[rows[p]] · w[ids[p]]ᵀ` (see `ops::gather_matmul`); `x` rows become a batch of
/// 1-row matrices `[T, 1, K]` that both gathers index by `rows`.
pub fn gather_matmul(
    x: &Tensor,
    w: &Weight,
    experts: usize,
    rows: &[u32],
    ids: &[u32],
) -> Result<Tensor> {
    let op = "gather_matmul";
    let (t, k) = (x.dim(0) as i32, x.dim(1) as i32);
    let n = (w.rows() / experts) as i32;
    let e = experts as i32;
    // As `ops::matmul`: f32 on the exact path, the weight's (affine: its scales') dtype on the
    // native path.
    let xa = m!(op, act_array(op, x)?.reshape(&[t, 1, k]));
    let (lhs, rhs) = (indices(rows), indices(ids));
    let y = match w {
        Weight::Dense(d) => {
            // [E·N, K] → [E, K, N]: a view, the product is x · wᵀ per expert.
            let wa = act_array(op, d)?;
            let xa = cast(op, xa, wa.dtype())?;
            let wa = m!(op, wa.reshape(&[e, n, k]));
            let wt = m!(op, wa.swap_axes(1, 2));
            raw_op(op, |res, s| unsafe {
                mlx_sys::mlx_gather_mm(
                    res,
                    xa.as_ptr(),
                    wt.as_ptr(),
                    lhs.as_ptr(),
                    rhs.as_ptr(),
                    false,
                    s,
                )
            })?
        }
        Weight::Quant(q) => {
            let (packed, scales, biases) = quant_arrays(op, q)?;
            let stack = |a: Array| -> Result<Array> {
                let last = *a.shape().last().unwrap_or(&1);
                Ok(m!(op, a.reshape(&[e, n, last])))
            };
            let (packed, scales) = (stack(packed)?, stack(scales)?);
            let biases = biases.map(stack).transpose()?;
            let xa = quant_input(op, xa, biases.as_ref())?;
            let none = no_array();
            let b = biases.as_ref().unwrap_or(&none);
            raw_op(op, |res, s| unsafe {
                mlx_sys::mlx_gather_qmm(
                    res,
                    xa.as_ptr(),
                    packed.as_ptr(),
                    scales.as_ptr(),
                    b.as_ptr(),
                    lhs.as_ptr(),
                    rhs.as_ptr(),
                    true,
                    some_int(q.spec.group_size),
                    some_int(q.spec.bits),
                    mode_name(q.spec.mode).as_ptr(),
                    false,
                    s,
                )
            })?
        }
    };
    let y = m!(op, y.reshape(&[rows.len() as i32, n]));
    tensor_of(op, y)
}

/// `Σ_j w_j · y_j` over each token's `k` experts, plus `scale · shared`, as mlx-lm writes it:
/// `(y * scores[..., None]).sum(-2) + sigmoid(gate) * shared`.
pub fn combine(
    y: &Tensor,
    weights: &[f32],
    top_k: usize,
    shared: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let op = "moe_combine";
    let (p, n) = (y.dim(0) as i32, y.dim(1) as i32);
    let k = top_k as i32;
    let t = p / k;
    let ya = m!(op, f32_array(op, y)?.reshape(&[t, k, n]));
    let wa = Array::from_slice(weights, &[t, k, 1]);
    let mut out = m!(op, ya.multiply(&wa).and_then(|v| v.sum_axis(1, false)));
    if let Some((s, g)) = shared {
        let sg = m!(op, f32_array(op, g)?.multiply(f32_array(op, s)?));
        out = m!(op, mx::add(&out, &sg));
    }
    tensor_of(op, out)
}

//! The op set on MLX arrays. Each op builds MLX graph nodes and returns an unevaluated MLX
//! tensor; host inputs are copied in. Where mlx-lm has a fused kernel for the op (rms_norm,
//! rope, quantized matmul) we call the same one, so our MLX path issues mlx-lm's ops.

use mlx_rs::{fast, ops as mx, Array};

use super::{array_of, mlx_err, tensor_of};
use crate::error::Result;
use crate::ops::RopeLayout;
use crate::{DType, Error, QuantMode, Tensor, Weight};

/// `x @ wᵀ` for dense weights (any float dtype, promoted to f32 like the CPU path widens
/// them) and for affine-quantized weights through MLX's `quantized_matmul`.
pub fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let op = "matmul";
    let xa = f32_array(op, x)?;
    let y = match w {
        Weight::Dense(t) => {
            let wa = f32_array(op, t)?;
            let wt = wa.transpose().map_err(|e| mlx_err(op, e))?;
            mx::matmul(&xa, &wt).map_err(|e| mlx_err(op, e))?
        }
        Weight::Quant(q) => {
            if q.spec.mode != QuantMode::Affine {
                return Err(Error::Unsupported {
                    op: "matmul (fp-quantized weights)",
                    backend: "mlx",
                });
            }
            let packed = array_of(op, &q.packed)?;
            // f32 scales and biases (exact widening) keep the product in f32, as on the CPU.
            let scales = f32_array(op, &q.scales)?;
            let biases = match &q.biases {
                Some(b) => f32_array(op, b)?,
                None => {
                    return Err(Error::Invalid {
                        op,
                        msg: "affine quantized weight without biases".into(),
                    })
                }
            };
            mx::quantized_matmul(
                &xa,
                &packed,
                &scales,
                &biases,
                true,
                q.spec.group_size as i32,
                q.spec.bits as i32,
            )
            .map_err(|e| mlx_err(op, e))?
        }
    };
    tensor_of(op, y)
}

/// RMSNorm through MLX's fused kernel (mlx-lm's `mx.fast.rms_norm`).
pub fn rms_norm(x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let op = "rms_norm";
    let xa = f32_array(op, x)?;
    let wa = w.map(|w| f32_array(op, w)).transpose()?;
    let y = fast::rms_norm(&xa, wa.as_ref(), eps).map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// Rotary embedding through MLX's fused kernel (mlx-lm's `mx.fast.rope`), which rotates
/// consecutive positions starting at an offset along the second-to-last axis.
pub fn rope(
    x: &Tensor,
    positions: &[usize],
    inv_freq: &[f32],
    layout: RopeLayout,
) -> Result<Tensor> {
    let op = "rope";
    let start = positions.first().copied().unwrap_or(0);
    if positions.iter().enumerate().any(|(i, &p)| p != start + i) {
        // mx.fast.rope takes one offset; scattered positions would need the unfused formula.
        return Err(Error::Unsupported {
            op: "rope (non-consecutive positions)",
            backend: "mlx",
        });
    }
    let offset = i32::try_from(start).map_err(|_| mlx_err(op, "position too large"))?;
    // [T, H, D] -> [H, T, D]: positions run along the second-to-last axis.
    let xa = f32_array(op, x)?
        .swap_axes(0, 1)
        .map_err(|e| mlx_err(op, e))?;
    // MLX takes periods (1 / inverse frequency), as mlx-lm's scaled RoPE variants pass them.
    let periods: Vec<f32> = inv_freq.iter().map(|&f| 1.0 / f).collect();
    let freqs = Array::from_slice(&periods, &[periods.len() as i32]);
    let traditional = layout == RopeLayout::Interleaved;
    let dims = 2 * inv_freq.len() as i32;
    let y = fast::rope(&xa, dims, traditional, None, 1.0, offset, &freqs)
        .and_then(|y| y.swap_axes(0, 1))
        .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// Softmax over the last axis, computed in f32 (`precise`).
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let op = "softmax";
    let y = mx::softmax_axis(f32_array(op, x)?, -1, true).map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// `x · sigmoid(x)`, as mlx-lm's `nn.silu` writes it.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    let op = "silu";
    let xa = f32_array(op, x)?;
    let y = mx::sigmoid(&xa)
        .and_then(|s| xa.multiply(&s))
        .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// `a + b` with `b` broadcast over leading dims (the caller checked the shapes).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let op = "add";
    let y = mx::add(f32_array(op, a)?, f32_array(op, b)?).map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// `a · b` with `b` broadcast over leading dims (the caller checked the shapes).
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let op = "mul";
    let y = mx::multiply(f32_array(op, a)?, f32_array(op, b)?).map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// The tensor as an f32 MLX array (float dtypes are widened exactly).
pub(crate) fn f32_array(op: &'static str, t: &Tensor) -> Result<Array> {
    if !t.dtype().is_float() {
        return Err(Error::DType {
            op,
            dtype: t.dtype(),
            msg: "expected a float tensor".into(),
        });
    }
    let a = array_of(op, t)?;
    if t.dtype() == DType::F32 {
        Ok(a)
    } else {
        a.as_type::<f32>().map_err(|e| mlx_err(op, e))
    }
}

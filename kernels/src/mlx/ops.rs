//! The op set on MLX arrays. Each op builds MLX graph nodes and returns an unevaluated MLX
//! tensor; host inputs are copied in. Where mlx-lm has a fused kernel for the op (rms_norm,
//! rope, quantized matmul) we call the same one, so our MLX path issues mlx-lm's ops.

use std::ffi::CStr;
use std::sync::Once;

use mlx_rs::{fast, ops as mx, Array, Dtype, Stream};

use super::{array_of, mlx_err, tensor_of};
use crate::error::{invalid, Result};
use crate::params::RopeLayout;
use crate::{DType, Error, QuantMode, QuantSpec, QuantWeight, Tensor, Weight};

/// `x @ wᵀ` for dense weights and for quantized weights of every mode (MLX's
/// `quantized_matmul`, which reads the same packed codes and scales the CPU path decodes).
///
/// On the exact path (`numerics=exact`) the product is f32: `x` and a dense weight are widened
/// like the CPU path widens them (a weight made resident by [`resident_weight`] on that path is
/// f32 already, so nothing is cast per call). On the native path (`numerics=fast`, see
/// [`native`]) the product runs in the weight's stored dtype, as mlx-lm runs it: `x` is cast to
/// the dense weight's dtype, or to the affine scales' dtype for quantized weights.
///
/// On MLX's CPU device the native path runs dense bf16/f16 products of several rows through
/// MLX's f32 GEMM (see [`widened_product`]): there MLX multiplies bf16 in a single-threaded
/// loop, 20× slower than its f32 GEMM, which goes to BLAS (a 512 × 1024 by 1024 × 3072
/// product on 2 cores: 783 ms against 38 ms with OpenBLAS).
pub fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let op = "matmul";
    let xa = act_array(op, x)?;
    let widen = native() && super::device::on_cpu();
    let y = match w {
        Weight::Dense(t) => {
            let wa = act_array(op, t)?;
            let xa = cast(op, xa, wa.dtype())?;
            // One row reads every weight once whichever way it is multiplied (measured level
            // on a decode step): keep MLX's own product, without a widened copy of the weight.
            if widen && wa.dtype() != Dtype::Float32 && rows(&xa) > 1 {
                widened_product(op, &xa, wa)?
            } else {
                let wt = wa.transpose().map_err(|e| mlx_err(op, e))?;
                mx::matmul(&xa, &wt).map_err(|e| mlx_err(op, e))?
            }
        }
        Weight::Quant(q) => {
            let (packed, scales, biases) = quant_arrays(op, q)?;
            let xa = quant_input(op, xa, biases.as_ref())?;
            // Not widened: MLX's CPU affine product sums in bf16, and the native path is held
            // to mlx-lm's results (f32 sums of dequantized rows were 55× faster for a 4-bit
            // prompt of 128 tokens, but up to 0.37 nats from mlx-lm's log-probs).
            quantized_matmul(&xa, &packed, &scales, biases.as_ref(), q.spec)?
        }
    };
    tensor_of(op, y)
}

/// Rows of an activation `[.., K]`.
fn rows(x: &Array) -> usize {
    x.size() / x.shape().last().map_or(1, |&k| k.max(1) as usize)
}

/// `x @ wᵀ` computed in f32 and rounded once to `x`'s dtype: the contract of MLX's own bf16
/// CPU product (f32 products of the same values, summed in f32, one rounding of the result),
/// with another summation order. `w` is the stored bf16/f16 weight, widened here exactly.
fn widened_product(op: &'static str, x: &Array, w: Array) -> Result<Array> {
    let out = x.dtype();
    let xf = cast(op, x.clone(), Dtype::Float32)?;
    let wt = cast(op, w, Dtype::Float32)?
        .transpose()
        .map_err(|e| mlx_err(op, e))?;
    let y = mx::matmul(&xf, &wt).map_err(|e| mlx_err(op, e))?;
    cast(op, y, out)
}

/// The input of a quantized product: affine kernels compute in the scales' dtype (f32 on the
/// exact path), so `x` is cast to the biases' (= scales') dtype; fp modes take `x` as it is.
pub(crate) fn quant_input(op: &'static str, x: Array, biases: Option<&Array>) -> Result<Array> {
    match biases {
        Some(b) => cast(op, x, b.dtype()),
        None => Ok(x),
    }
}

/// Whether this thread's request runs MLX in the checkpoint's stored dtypes (`numerics=fast`,
/// mlx-lm's way: bf16 weights stay bf16, quantized weights keep their bf16 scales, and
/// activations follow the weights' dtype) rather than in f32 (`numerics=exact`, the path the
/// MLX goldens and the CPU parity were made on). See `cpu::numerics` for the CPU's meaning.
pub fn native() -> bool {
    crate::numerics::Numerics::current() == crate::numerics::Numerics::Fast
}

/// A float tensor (activation or weight) as the ops take it: f32 on the exact path, its own
/// dtype on the native path (MLX then keeps bf16 in bf16 and promotes a bf16 ⊗ f32 pair to f32,
/// as it does for mlx-lm; products cast their input to the weight's dtype).
pub(crate) fn act_array(op: &'static str, t: &Tensor) -> Result<Array> {
    if native() {
        float_check(op, t)?;
        array_of(op, t)
    } else {
        f32_array(op, t)
    }
}

/// A parameter (a norm weight, a bias, a per-channel scale) for an op on activation `x`: on
/// the native path in `x`'s dtype, as mlx-lm holds its parameters in the model dtype (the
/// engine widens them to f32 at load; narrowing a widened bf16 value is exact), so the op
/// stays in bf16; f32 on the exact path.
pub(crate) fn like(op: &'static str, t: &Tensor, x: &Array) -> Result<Array> {
    // On the exact path `x` is f32 and `act_array` already widened `t`: the cast is a no-op.
    cast(op, act_array(op, t)?, x.dtype())
}

/// `a` in `dtype` (no node when it already is).
pub(crate) fn cast(op: &'static str, a: Array, dtype: Dtype) -> Result<Array> {
    if a.dtype() == dtype {
        Ok(a)
    } else {
        a.as_dtype(dtype).map_err(|e| mlx_err(op, e))
    }
}

/// A quantized weight's packed codes, scales and biases as MLX arrays, in the dtypes MLX's
/// quantized kernels take: on the exact path affine scales and biases widened to f32 (exactly,
/// so the product stays in f32 as on the CPU), on the native path as stored; fp scales as their
/// u8 codes.
pub(crate) fn quant_arrays(
    op: &'static str,
    q: &QuantWeight,
) -> Result<(Array, Array, Option<Array>)> {
    let packed = array_of(op, &q.packed)?;
    if q.spec.mode != QuantMode::Affine {
        return Ok((packed, array_of(op, &q.scales)?, None));
    }
    let Some(b) = &q.biases else {
        return invalid(op, "affine quantized weight without biases");
    };
    Ok((packed, act_array(op, &q.scales)?, Some(act_array(op, b)?)))
}

/// The weight as MLX keeps it for the forward: a copy on MLX, evaluated now. On the exact path
/// dense weights and affine scales/biases are widened to f32 here (exact), so no op casts a
/// weight per call; the values are the CPU path's, which widens the same way per tile. On the
/// native path (the thread's numerics when the model is loaded) they keep their stored dtypes,
/// so a bf16 checkpoint holds half the memory and decode reads half the bytes. Either form
/// serves either path (the other one casts per call), so only speed depends on the load.
pub fn resident_weight(w: &Weight) -> Result<Weight> {
    let op = "to_device";
    let keep = |a: Array| -> Result<Tensor> {
        a.eval().map_err(|e| mlx_err(op, e))?;
        tensor_of(op, a)
    };
    Ok(match w {
        Weight::Dense(t) => Weight::Dense(keep(act_array(op, t)?)?),
        Weight::Quant(q) => {
            let (packed, scales, biases) = quant_arrays(op, q)?;
            Weight::Quant(QuantWeight {
                spec: q.spec,
                rows: q.rows,
                cols: q.cols,
                packed: keep(packed)?,
                scales: keep(scales)?,
                biases: biases.map(keep).transpose()?,
            })
        }
    })
}

/// mlx-c's name of a quantization mode.
pub(crate) fn mode_name(mode: QuantMode) -> &'static CStr {
    match mode {
        QuantMode::Affine => c"affine",
        QuantMode::Mxfp4 => c"mxfp4",
        QuantMode::Nvfp4 => c"nvfp4",
        QuantMode::Mxfp8 => c"mxfp8",
    }
}

pub(crate) fn some_int(v: usize) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value: v as i32,
        has_value: true,
    }
}

/// An absent optional array argument of mlx-c (a handle with no array behind it).
pub(crate) fn no_array() -> Array {
    // SAFETY: `mlx_array_new` returns an empty handle, which mlx-c reads as "none" and which
    // `Array`'s drop frees harmlessly (mlx-rs passes absent arrays the same way).
    unsafe { Array::from_ptr(mlx_sys::mlx_array_new()) }
}

/// Calls an mlx-c op that mlx-rs 0.33 does not wrap with the arguments we need (a quantization
/// `mode`, slice updates with plain ranges): `f` gets the result slot and the stream.
pub(crate) fn raw_op(
    op: &'static str,
    f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array> {
    // mlx-rs installs its error handler (which records the message instead of exiting) on the
    // first op it wraps; make sure that happened before calling mlx-c directly.
    static HANDLER: Once = Once::new();
    HANDLER.call_once(|| {
        let _ = Array::from_f32(0.0).reshape(&[1]);
    });
    let stream = Stream::thread_local_or_default();
    // SAFETY: the slot starts as an empty handle; on success mlx-c stores a new array in it,
    // which `from_ptr` takes ownership of; on failure the (possibly empty) handle is freed.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = f(&mut res, stream.as_ptr());
        if status != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(mlx_err(
                op,
                format!("the mlx-c call failed (status {status})"),
            ));
        }
        Ok(Array::from_ptr(res))
    }
}

/// `x @ wᵀ` with `w` quantized in `spec`'s mode (MLX's `quantized_matmul`, transposed).
fn quantized_matmul(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> Result<Array> {
    let none = no_array();
    let biases = biases.unwrap_or(&none);
    raw_op("matmul", |res, s| unsafe {
        mlx_sys::mlx_quantized_matmul(
            res,
            x.as_ptr(),
            packed.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            true,
            some_int(spec.group_size),
            some_int(spec.bits),
            mode_name(spec.mode).as_ptr(),
            s,
        )
    })
}

/// The values of quantized rows (MLX's `dequantize` in `spec`'s mode; no global scale, as the
/// formats we load have none): f32 on the exact path, the scales' dtype on the native path (as
/// mlx-lm's quantized embedding returns them).
pub(crate) fn dequantize(
    packed: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> Result<Array> {
    let none = no_array();
    let biases = biases.unwrap_or(&none);
    let global_scale = no_array();
    let f32_out = mlx_sys::mlx_optional_dtype {
        value: mlx_sys::mlx_dtype__MLX_FLOAT32,
        has_value: !native(),
    };
    raw_op("dequantize", |res, s| unsafe {
        mlx_sys::mlx_dequantize(
            res,
            packed.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            some_int(spec.group_size),
            some_int(spec.bits),
            mode_name(spec.mode).as_ptr(),
            global_scale.as_ptr(),
            f32_out,
            s,
        )
    })
}

/// `src` with the box `start..start+update.shape` replaced by `update` (MLX's slice update,
/// which writes in place when `src` is not shared, instead of copying the whole array).
pub(crate) fn slice_update(
    op: &'static str,
    src: &Array,
    update: &Array,
    start: &[i32],
) -> Result<Array> {
    let stop: Vec<i32> = start
        .iter()
        .zip(update.shape())
        .map(|(a, b)| a + b)
        .collect();
    let strides = vec![1i32; start.len()];
    raw_op(op, |res, s| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s,
        )
    })
}

/// `start..stop` of `a` per axis, a view (MLX's slice; mlx-rs only wraps it through indexing).
pub(crate) fn slice(op: &'static str, a: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
    let strides = vec![1i32; start.len()];
    raw_op(op, |res, s| unsafe {
        mlx_sys::mlx_slice(
            res,
            a.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s,
        )
    })
}

/// RMSNorm through MLX's fused kernel (mlx-lm's `mx.fast.rms_norm`).
pub fn rms_norm(x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let op = "rms_norm";
    let xa = act_array(op, x)?;
    let wa = w.map(|w| like(op, w, &xa)).transpose()?;
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
    // MLX takes periods (1 / inverse frequency), as mlx-lm's scaled RoPE variants pass them.
    let periods: Vec<f32> = inv_freq.iter().map(|&f| 1.0 / f).collect();
    let freqs = Array::from_slice(&periods, &[periods.len() as i32]);
    rope_fused(x, positions, 2 * inv_freq.len(), None, Some(&freqs), layout)
}

/// [`rope`] with MLX deriving the frequencies of `pairs` rotated pairs from `base` itself,
/// exactly as mlx-lm's `nn.RoPE` (`mx.fast.rope(..., base=θ)`) does.
pub fn rope_base(
    x: &Tensor,
    positions: &[usize],
    pairs: usize,
    base: f32,
    layout: RopeLayout,
) -> Result<Tensor> {
    rope_fused(x, positions, 2 * pairs, Some(base), None, layout)
}

fn rope_fused(
    x: &Tensor,
    positions: &[usize],
    dims: usize,
    base: Option<f32>,
    freqs: Option<&Array>,
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
    let xa = act_array(op, x)?
        .swap_axes(0, 1)
        .map_err(|e| mlx_err(op, e))?;
    let traditional = layout == RopeLayout::Interleaved;
    let y = fast::rope(&xa, dims as i32, traditional, base, 1.0, offset, freqs)
        .and_then(|y| y.swap_axes(0, 1))
        .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// Softmax over the last axis, computed in f32 (`precise`).
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let op = "softmax";
    let y = mx::softmax_axis(act_array(op, x)?, -1, true).map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// `x · sigmoid(x)`, as mlx-lm's `nn.silu` writes it.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    let op = "silu";
    let xa = act_array(op, x)?;
    let y = mx::sigmoid(&xa)
        .and_then(|s| xa.multiply(&s))
        .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// `a + b` with `b` broadcast over leading dims (the caller checked the shapes).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let op = "add";
    let y = {
        let a = act_array(op, a)?;
        mx::add(&a, like(op, b, &a)?)
    }
    .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

/// `a · b` with `b` broadcast over leading dims (the caller checked the shapes).
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let op = "mul";
    let y = {
        let a = act_array(op, a)?;
        mx::multiply(&a, like(op, b, &a)?)
    }
    .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, y)
}

fn float_check(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        return Ok(());
    }
    Err(Error::DType {
        op,
        dtype: t.dtype(),
        msg: "expected a float tensor".into(),
    })
}

/// The tensor as an f32 MLX array (float dtypes are widened exactly).
pub(crate) fn f32_array(op: &'static str, t: &Tensor) -> Result<Array> {
    float_check(op, t)?;
    let a = array_of(op, t)?;
    if t.dtype() == DType::F32 {
        Ok(a)
    } else {
        a.as_type::<f32>().map_err(|e| mlx_err(op, e))
    }
}

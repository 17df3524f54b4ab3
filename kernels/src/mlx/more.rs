//! The rest of the op set on MLX arrays: embedding, attention and the KV cache, the remaining
//! activations, log-softmax, and Gated DeltaNet with its conv. Ops that hand values to the host
//! (argmax, top_k) evaluate and read back; everything else stays a lazy graph node.

use mlx_rs::{ops as mx, Array};

use super::ops::{act_array, dequantize, f32_array, quant_arrays, slice, slice_update};
use super::{download, mlx_err, tensor_of};
use crate::error::Result;
use crate::params::{AttnParams, Unary};
use crate::{Tensor, Weight};

/// Shorthand: MLX errors become `Error::Invalid` naming the op.
macro_rules! m {
    ($op:expr, $e:expr) => {
        $e.map_err(|e| mlx_err($op, e))?
    };
}

fn dims(op: &'static str, shape: &[usize]) -> Result<Vec<i32>> {
    super::mlx_shape(op, shape)
}

/// `len` consecutive indices from `start` along `axis` (MLX's take; the C API's slice is not
/// wrapped with plain ranges in mlx-rs).
fn range(op: &'static str, a: &Array, axis: i32, start: usize, len: usize) -> Result<Array> {
    let idx: Vec<i32> = (start..start + len).map(|i| i as i32).collect();
    Ok(m!(
        op,
        a.take_axis(Array::from_slice(&idx, &[len as i32]), axis)
    ))
}

fn scalar(x: f32) -> Array {
    Array::from_f32(x)
}

/// `x` as a 0-d array of `like`'s dtype, so a bf16 activation stays bf16 (an f32 scalar would
/// promote it).
fn scalar_as(op: &'static str, x: f32, like: &Array) -> Result<Array> {
    super::ops::cast(op, scalar(x), like.dtype())
}

/// Rows `ids` of an embedding table on MLX: dense rows widened to f32; quantized rows (packed
/// codes and scales, plus biases for affine) gathered first and then dequantized by MLX in the
/// weight's mode, to f32, so the values equal the CPU's decoded rows. On the native path rows
/// keep the table's dtype (quantized: the scales'), which sets the activations' dtype.
pub fn embedding(w: &Weight, ids: &[u32]) -> Result<Tensor> {
    let op = "embedding";
    let idx = Array::from_slice(ids, &[ids.len() as i32]);
    let y = match w {
        Weight::Dense(t) => m!(op, act_array(op, t)?.take_axis(&idx, 0)),
        Weight::Quant(q) => {
            let (packed, scales, biases) = quant_arrays(op, q)?;
            let rows = |a: Array| -> Result<Array> { Ok(m!(op, a.take_axis(&idx, 0))) };
            let biases = biases.map(rows).transpose()?;
            dequantize(&rows(packed)?, &rows(scales)?, biases.as_ref(), q.spec)?
        }
    };
    tensor_of(op, y)
}

/// Causal GQA attention with MLX ops, the way mlx-lm's reference path writes it: the query
/// heads of one KV head form a group axis, scores `q kᵀ·scale` (optionally soft-capped), an
/// explicit causal/window mask applied with a select, a precise softmax, then `p v`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    let op = "attention";
    let (t, hq, d) = (q.dim(0), q.dim(1), q.dim(2));
    let hk = k.dim(0);
    let (g, kv) = (hq / hk, p.kv_len);
    if t == 0 {
        return tensor_of(op, m!(op, mx::zeros::<f32>(&dims(op, q.shape())?)));
    }
    if p.softcap.is_none() {
        return fused_attention(q, k, v, p);
    }
    let sh = dims(op, &[t, hk, g, d, kv, hq])?;
    let qa = m!(
        op,
        f32_array(op, q)?
            .reshape(&[sh[0], sh[1], sh[2], sh[3]])
            .and_then(|a| a.transpose_axes(&[1, 2, 0, 3]))
    );
    // The first kv_len rows of each cache, as a view (no copy of the cache per step).
    let used = |c: &Tensor| -> Result<Array> {
        let stop = dims(op, &[hk, kv, c.dim(2)])?;
        Ok(m!(
            op,
            slice(op, &f32_array(op, c)?, &[0, 0, 0], &stop)?.expand_dims(1)
        ))
    };
    let (ka, va) = (used(k)?, used(v)?);
    let kt = m!(op, ka.swap_axes(-1, -2));
    let mut s = m!(
        op,
        mx::matmul(&qa, &kt).and_then(|s| s.multiply(scalar(p.scale)))
    );
    if let Some(cap) = p.softcap {
        s = m!(
            op,
            s.divide(scalar(cap))
                .and_then(mx::tanh)
                .and_then(|x| x.multiply(scalar(cap)))
        );
    }
    if let Some(mask) = block_mask(op, t, p)? {
        s = m!(op, mx::select(&mask, &s, scalar(f32::NEG_INFINITY)));
    }
    let probs = m!(op, mx::softmax_axis(&s, -1, true));
    let o = m!(
        op,
        mx::matmul(&probs, &va)
            .and_then(|o| o.transpose_axes(&[2, 0, 1, 3]))
            .and_then(|o| o.reshape(&[sh[0], sh[5], sh[3]]))
    );
    tensor_of(op, o)
}

/// Attention through `mx.fast.scaled_dot_product_attention`, called the way mlx-lm calls it
/// (queries `[1, Hq, T, D]`, the cache's first `kv_len` rows as `[1, Hk, kv_len, D]`, no mask
/// for one query, the "causal" mode for a prompt whose queries end at the last key), so the
/// MLX path issues mlx-lm's attention ops. Other layouts (a window, a query block that does
/// not end at the last key) pass an explicit boolean mask with the same rule as the CPU path.
///
/// On MLX's CPU device the native path runs [`cpu_block`] on blocks of [`CPU_QUERY_BLOCK`]
/// queries, each against the keys up to its last query: there MLX's attention is unfused (it
/// materialises every score, so a long prompt's scores leave the caches), its bf16 products
/// run in a single-threaded loop and its f32 ones go to BLAS. Measured on 2 cores (Zen 2),
/// bench Qwen3 bf16, 512-token prompt: 25.7 s with mlx-lm's attention in blocks, 11.7 s in
/// f32-GEMM blocks; tiny Qwen3, 4000 tokens: 10.2 s unblocked, 3.5 s.
fn fused_attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    let op = "attention";
    let (t, hq, d) = (q.dim(0), q.dim(1), q.dim(2));
    let (hk, kv) = (k.dim(0), p.kv_len);
    let sh = dims(op, &[t, hq, d, hk, kv])?;
    let qa = m!(
        op,
        act_array(op, q)?
            .reshape(&[1, sh[0], sh[1], sh[2]])
            .and_then(|a| a.transpose_axes(&[0, 2, 1, 3]))
    );
    let used = |c: &Tensor| -> Result<Array> {
        let stop = dims(op, &[hk, kv, c.dim(2)])?;
        Ok(m!(
            op,
            slice(op, &act_array(op, c)?, &[0, 0, 0], &stop)?.expand_dims(0)
        ))
    };
    let (ka, va) = (used(k)?, used(v)?);
    let o = if super::ops::native() && super::device::on_cpu() {
        // Widened once here, not per block: every block reads a prefix of the same keys.
        let f32 = |a: Array| super::ops::cast(op, a, mlx_rs::Dtype::Float32);
        let (ka, va) = (f32(ka)?, f32(va)?);
        let mut blocks = Vec::with_capacity(t.div_ceil(CPU_QUERY_BLOCK));
        for s in (0..t).step_by(CPU_QUERY_BLOCK) {
            let e = (s + CPU_QUERY_BLOCK).min(t);
            // Keys past the block's last query are masked for every query of the block.
            let kv_b = (p.q_start + e).min(kv);
            let [s32, e32, kv32, hq32, hk32, d32] = ids(op, [s, e, kv_b, hq, hk, d])?;
            let qb = slice(op, &qa, &[0, 0, s32, 0], &[1, hq32, e32, d32])?;
            let kb = slice(op, &ka, &[0, 0, 0, 0], &[1, hk32, kv32, d32])?;
            let vb = slice(op, &va, &[0, 0, 0, 0], &[1, hk32, kv32, d32])?;
            let pb = AttnParams {
                q_start: p.q_start + s,
                kv_len: kv_b,
                ..*p
            };
            blocks.push(cpu_block(&qb, &kb, &vb, &pb)?);
        }
        if blocks.len() == 1 {
            blocks.pop().expect("one block")
        } else {
            m!(op, mx::concatenate(&blocks, 2))
        }
    } else {
        sdpa_block(&qa, &ka, &va, p)?
    };
    let o = m!(
        op,
        o.transpose_axes(&[0, 2, 1, 3])
            .and_then(|o| o.reshape(&[sh[0], sh[1], sh[2]]))
    );
    tensor_of(op, o)
}

/// One query block of the CPU device's native attention: the ops MLX's unfused attention runs
/// there (`mx.fast.scaled_dot_product_attention` on a CPU), in the same dtypes and roundings
/// (queries scaled in their dtype, scores and `p v` rounded to it, a precise softmax), except
/// that the two products run as f32 GEMMs (BLAS) where MLX runs bf16 ones in a loop: only the
/// summation order inside a product differs. Shapes as [`sdpa_block`]; `ka` and `va` may
/// come widened already (their values, not their dtype, enter the products).
fn cpu_block(qa: &Array, ka: &Array, va: &Array, p: &AttnParams) -> Result<Array> {
    use mlx_rs::Dtype;
    let op = "attention";
    let dt = qa.dtype();
    let (hq, t, d) = (qa.shape()[1], qa.shape()[2], qa.shape()[3]);
    let (hk, kv) = (ka.shape()[1], p.kv_len);
    let g = hq / hk;
    let f32 = |a: Array| super::ops::cast(op, a, Dtype::Float32);
    let qs = m!(op, qa.multiply(scalar_as(op, p.scale, qa)?));
    // The query heads of one KV head as one GEMM's rows: [1, Hk, G·T, D].
    let qs = m!(op, f32(qs)?.reshape(&[1, hk, g * t, d]));
    let kt = m!(op, f32(ka.clone())?.swap_axes(-1, -2));
    let scores = super::ops::cast(op, m!(op, mx::matmul(&qs, &kt)), dt)?;
    let kv32 = dims(op, &[kv])?[0];
    let mut scores = m!(op, scores.reshape(&[1, hk, g, t, kv32]));
    if let Some(mask) = block_mask(op, t as usize, p)? {
        let neg = scalar_as(op, f32::NEG_INFINITY, &scores)?;
        scores = m!(op, mx::select(&mask, &scores, &neg));
    }
    let probs = m!(op, mx::softmax_axis(&scores, -1, true));
    let probs = m!(op, f32(probs)?.reshape(&[1, hk, g * t, kv32]));
    let o = m!(op, mx::matmul(&probs, &f32(va.clone())?));
    let o = super::ops::cast(op, o, dt)?;
    Ok(m!(op, o.reshape(&[1, hq, t, d])))
}

/// The boolean mask `[T, kv_len]` a block of `t` queries at `p.q_start..` needs (`None`: one
/// query seeing every key). Query row i (position q_start + i) sees key j when
/// j <= q_start + i and, with a window w, j > q_start + i - w: the CPU path's rule, so no row
/// is ever fully masked.
fn block_mask(op: &'static str, t: usize, p: &AttnParams) -> Result<Option<Array>> {
    let kv = p.kv_len;
    let windowed = p.window.is_some_and(|w| kv > w);
    if t == 1 && !windowed && p.q_start + 1 == kv {
        return Ok(None);
    }
    let mut m = Vec::with_capacity(t * kv);
    for i in 0..t {
        let pos = p.q_start + i;
        let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        m.extend((0..kv).map(|j| j >= lo && j <= pos));
    }
    let [t32, kv32] = ids(op, [t, kv])?;
    Ok(Some(Array::from_slice(&m, &[t32, kv32])))
}

/// Queries per block of the CPU device's blocked attention (of 128, 256, 512 and 1024,
/// 256 was fastest for 1024 and 4000 queries).
const CPU_QUERY_BLOCK: usize = 256;

/// `N` sizes as MLX's i32 indices.
fn ids<const N: usize>(op: &'static str, v: [usize; N]) -> Result<[i32; N]> {
    let d = dims(op, &v)?;
    Ok(std::array::from_fn(|i| d[i]))
}

/// One `mx.fast.scaled_dot_product_attention` call: queries `qa` `[1, Hq, T, D]` at positions
/// `p.q_start..`, keys and values `[1, Hk, p.kv_len, D]`, masked as [`fused_attention`] says.
fn sdpa_block(qa: &Array, ka: &Array, va: &Array, p: &AttnParams) -> Result<Array> {
    use mlx_rs::fast::{scaled_dot_product_attention as sdpa, ScaledDotProductAttentionMask};
    let op = "attention";
    let (t, kv) = (qa.shape()[2] as usize, p.kv_len);
    let causal = p.q_start + t == kv && p.window.is_none_or(|w| kv <= w);
    let mask_arr;
    let mask = match block_mask(op, t, p)? {
        None => None,
        // mlx-lm's mode for a prompt: the same mask, built by MLX.
        Some(_) if causal => Some(ScaledDotProductAttentionMask::Causal),
        Some(m) => {
            mask_arr = m;
            Some(ScaledDotProductAttentionMask::Array(&mask_arr))
        }
    };
    Ok(m!(op, sdpa(qa, ka, va, p.scale, mask, None)))
}

/// Paged attention on MLX: the keys' slots are gathered through the block table into a flat
/// `[Hk, kv_len, D]` cache (one take per pool), which [`attention`] then reads.
pub fn attention_paged(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (table, block): (&[u32], usize),
    p: &AttnParams,
) -> Result<Tensor> {
    let op = "attention_paged";
    let slots = (0..p.kv_len)
        .map(|j| {
            i32::try_from(table[j / block] as usize * block + j % block)
                .map_err(|_| super::mlx_err(op, "pool slot index too large"))
        })
        .collect::<Result<Vec<i32>>>()?;
    let idx = Array::from_slice(&slots, &[slots.len() as i32]);
    let gather = |t: &Tensor| -> Result<Tensor> {
        tensor_of(op, m!(op, act_array(op, t)?.take_axis(&idx, 1)))
    };
    attention(q, &gather(k)?, &gather(v)?, p)
}

/// Writes `new` `[T, Hk, D]` into the cache `[Hk, Cap, D]` at `pos..pos+T`; the cache becomes
/// an MLX tensor. A slice update rather than a concatenation around the new rows: no 3-way
/// concat of the whole cache per step, and MLX may reuse the old cache buffer in place when
/// nothing else holds it (the cache tensor held the only handle).
pub fn kv_write(cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    let op = "kv_write";
    let n = m!(op, act_array(op, new)?.swap_axes(0, 1));
    // The native path keeps the cache in the keys' dtype, as mlx-lm's KV cache does (a new
    // f32 cache is cast once, at its first write).
    let c = super::ops::cast(op, act_array(op, cache)?, n.dtype())?;
    let at = dims(op, &[pos])?[0];
    let out = slice_update(op, &c, &n, &[0, at, 0])?;
    *cache = tensor_of(op, out)?;
    Ok(())
}

/// Elementwise activations, in the stable forms the CPU path uses.
pub fn unary(x: &Tensor, f: Unary) -> Result<Tensor> {
    let op = "unary";
    let xa = act_array(op, x)?;
    let k = |v: f32| scalar_as(op, v, &xa);
    let y = match f {
        Unary::Silu => return super::ops::silu(x),
        Unary::Sigmoid => m!(op, mx::sigmoid(&xa)),
        // max(x, 0) + log1p(e^-|x|): no overflow, no loss of tiny results.
        Unary::Softplus => {
            let zero = k(0.0)?;
            m!(
                op,
                mx::abs(&xa)
                    .and_then(mx::negative)
                    .and_then(mx::exp)
                    .and_then(mx::log1p)
                    .and_then(|l| mx::maximum(&xa, &zero)?.add(l))
            )
        }
        // x·sigmoid(2u), u = √(2/π)(x + 0.044715x³): the same identity as the CPU path.
        Unary::GeluTanh => {
            let cube = m!(op, xa.multiply(&xa).and_then(|s| s.multiply(&xa)));
            let (a, b) = (k(0.044_715)?, k(1.595_769)?);
            m!(
                op,
                cube.multiply(&a)
                    .and_then(|c| c.add(&xa))
                    .and_then(|u| u.multiply(&b))
                    .and_then(mx::sigmoid)
                    .and_then(|s| xa.multiply(s))
            )
        }
        Unary::Scale(s) => m!(op, xa.multiply(k(s)?)),
        // tanh(x/c)·c, as mlx-lm's `logit_softcap`.
        Unary::Softcap(c) => {
            let c = k(c)?;
            m!(
                op,
                xa.divide(&c)
                    .and_then(mx::tanh)
                    .and_then(|t| t.multiply(&c))
            )
        }
    };
    tensor_of(op, y)
}

/// `silu(gate)·up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let op = "swiglu";
    let (g, u) = (act_array(op, gate)?, act_array(op, up)?);
    let y = m!(
        op,
        mx::sigmoid(&g)
            .and_then(|s| g.multiply(s))
            .and_then(|s| s.multiply(&u))
    );
    tensor_of(op, y)
}

/// `x − logsumexp(x)` per row in f32, as mlx-lm's `generate_step` writes it (MLX's
/// `logsumexp`, which shifts by the row max inside); an all `-inf` row stays `-inf` (as on the
/// CPU) instead of becoming `−inf − (−inf) = NaN`.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let op = "log_softmax";
    let xa = f32_array(op, x)?;
    let lse = m!(op, mx::logsumexp_axis(&xa, -1, true));
    let dead = m!(op, mx::is_neg_inf(&lse));
    let y = m!(
        op,
        xa.subtract(&lse)
            .and_then(|y| mx::select(&dead, scalar(f32::NEG_INFINITY), y))
    );
    tensor_of(op, y)
}

/// Argmax needs host values anyway (token ids): evaluate, read back, and use the CPU rule for
/// ties and NaN.
pub fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    crate::select::argmax(&download(&to_f32_tensor("argmax", x)?)?)
}

pub fn top_k(x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    crate::select::top_k(&download(&to_f32_tensor("top_k", x)?)?, k)
}

fn to_f32_tensor(op: &'static str, x: &Tensor) -> Result<Tensor> {
    tensor_of(op, f32_array(op, x)?)
}

/// `g_log = max(−exp(A_log + ln softplus(a + dt_bias)), GATE_FLOOR)` in f32, with
/// `ln softplus(x) = x` below −36 (where softplus(x) = eˣ to rounding), as the CPU path does
/// in f64: no `exp(A_log)·0 = inf·0` corner.
pub fn gdn_gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    let op = "gdn_gate";
    let hv = dims(op, &[a.dim(1)])?;
    let dt = m!(op, f32_array(op, dt_bias)?.reshape(&hv));
    let a_log = m!(op, f32_array(op, a_log)?.reshape(&hv));
    let x = m!(op, f32_array(op, a)?.add(&dt));
    let sp = m!(
        op,
        mx::abs(&x)
            .and_then(mx::negative)
            .and_then(mx::exp)
            .and_then(mx::log1p)
            .and_then(|l| mx::maximum(&x, scalar(0.0))?.add(l))
            .and_then(mx::log)
    );
    let small = m!(op, x.lt(scalar(-36.0)));
    let ln_sp = m!(op, mx::select(&small, &x, &sp));
    let g = m!(
        op,
        ln_sp
            .add(&a_log)
            .and_then(mx::exp)
            .and_then(mx::negative)
            .and_then(|g| mx::maximum(g, scalar(crate::params::GATE_FLOOR)))
    );
    tensor_of(op, g)
}

/// Steps between evaluations of the recurrent state, so a long prefill does not build one
/// graph of thousands of nodes.
const GDN_EVAL_EVERY: usize = 64;

/// The per-step recurrence with MLX ops, one step at a time over all heads:
/// `S ← e^g·S; δ = β(v − S k); S ← S + δ kᵀ; y = S q`. `state` becomes an MLX tensor.
pub fn gdn_recurrent(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
) -> Result<Tensor> {
    let op = "gdn_recurrent";
    let (t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2));
    let (hv, dv) = (v.dim(1), v.dim(2));
    let sh = dims(op, &[t, hk, hv / hk, dk, hv, dv])?;
    let (hv_, dk_, dv_) = (sh[4], sh[3], sh[5]);
    if t == 0 {
        return tensor_of(op, m!(op, mx::zeros::<f32>(&[0, hv_, dv_])));
    }
    // Value head h reads key head h / (Hv/Hk): repeat each key head Hv/Hk times in place.
    let per_value_head = |x: &Tensor| -> Result<Vec<Array>> {
        let a = m!(
            op,
            f32_array(op, x)?
                .reshape(&[sh[0], sh[1], 1, sh[3]])
                .and_then(|a| mx::broadcast_to(a, &[sh[0], sh[1], sh[2], sh[3]]))
                .and_then(|a| a.reshape(&[sh[0], hv_, dk_]))
        );
        Ok(m!(op, a.split_equal(sh[0], 0)))
    };
    let (qs, ks) = (per_value_head(q)?, per_value_head(k)?);
    let vs = m!(op, f32_array(op, v)?.split_equal(sh[0], 0));
    let decay = m!(
        op,
        f32_array(op, g_log)?
            .exp()
            .and_then(|d| d.split_equal(sh[0], 0))
    );
    let betas = m!(op, f32_array(op, beta)?.split_equal(sh[0], 0));
    let mut s = f32_array(op, state)?;
    let mut ys = Vec::with_capacity(t);
    for i in 0..t {
        let kc = m!(op, ks[i].reshape(&[hv_, dk_, 1]));
        let kr = m!(op, ks[i].reshape(&[hv_, 1, dk_]));
        let qc = m!(op, qs[i].reshape(&[hv_, dk_, 1]));
        let vc = m!(op, vs[i].reshape(&[hv_, dv_, 1]));
        let dec = m!(op, decay[i].reshape(&[hv_, 1, 1]));
        let b = m!(op, betas[i].reshape(&[hv_, 1, 1]));
        s = m!(op, s.multiply(&dec));
        let delta = m!(
            op,
            mx::matmul(&s, &kc)
                .and_then(|sk| vc.subtract(sk))
                .and_then(|r| r.multiply(&b))
        );
        s = m!(op, mx::matmul(&delta, &kr).and_then(|u| s.add(u)));
        ys.push(m!(
            op,
            mx::matmul(&s, &qc).and_then(|y| y.reshape(&[1, hv_, dv_]))
        ));
        if (i + 1) % GDN_EVAL_EVERY == 0 {
            m!(op, s.eval());
        }
    }
    *state = tensor_of(op, s)?;
    tensor_of(op, m!(op, mx::concatenate(&ys, 0)))
}

/// Depthwise causal conv: `out[t] = Σ_j w[:, j] ⊙ [state; x][t + j]`, optionally through SiLU;
/// `state` becomes the last `K − 1` rows of `[state; x]` (an MLX tensor).
pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    state: &mut Tensor,
    silu: bool,
) -> Result<Tensor> {
    let op = "causal_conv1d";
    let (t, kw) = (x.dim(0), weight.dim(1));
    let hist = kw - 1;
    // f32 on both paths: summing the taps in bf16 rounds after every tap, which mlx-lm's
    // conv1d does not (measured: further from mlx-lm's native run, not closer).
    let xa = f32_array(op, x)?;
    let all = if hist > 0 {
        m!(op, mx::concatenate(&[f32_array(op, state)?, xa], 0))
    } else {
        xa
    };
    let w = f32_array(op, weight)?;
    let mut out: Option<Array> = None;
    for j in 0..kw {
        let tap = m!(op, range(op, &w, 1, j, 1)?.reshape(&[-1]));
        let term = m!(op, range(op, &all, 0, j, t)?.multiply(&tap));
        out = Some(match out {
            None => term,
            Some(o) => m!(op, o.add(&term)),
        });
    }
    let mut y = out.ok_or_else(|| mlx_err(op, "a conv needs at least one tap"))?;
    if silu {
        y = m!(op, mx::sigmoid(&y).and_then(|s| y.multiply(s)));
    }
    if hist > 0 {
        *state = tensor_of(op, range(op, &all, 0, t, hist)?)?;
    }
    tensor_of(op, y)
}

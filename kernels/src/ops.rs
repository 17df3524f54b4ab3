//! The op set: every op a model may call, in one list. Each checks shapes and dtypes, then
//! dispatches on the device. All activations are f32; weights may be any `Weight` format.
//!
//! Determinism: every CPU op splits work over output elements only, so results are
//! bit-identical for any thread count.

use crate::error::{shape_err, Result};
use crate::{cpu, Tensor, Weight};

/// RoPE pair layout: `HalfSplit` rotates (x[i], x[i + r/2]) (NeoX/Qwen/Llama in HF layout),
/// `Interleaved` rotates (x[2i], x[2i+1]) (GPT-J style).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    HalfSplit,
    Interleaved,
}

/// Causal attention parameters. Query row `t` sits at absolute position `q_start + t` and
/// sees keys at positions `p` with `p <= q_start + t` and, with a window `w`,
/// `p > q_start + t - w`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    pub q_start: usize,
    pub kv_len: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// `tanh` soft-capping of the scores (`cap·tanh(s/cap)`), as some families use.
    pub softcap: Option<f32>,
}

/// `x @ wᵀ`: `x` is `[.., K]` f32, `w` is `[N, K]` in any weight format; returns `[.., N]`.
pub fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let k = x.dim(-1);
    if w.cols() != k {
        return shape_err(
            "matmul",
            format!(
                "input {:?} has {k} features, weight expects {}",
                x.shape(),
                w.cols()
            ),
        );
    }
    cpu::matmul::matmul(x, w)
}

/// Rows `ids` of an embedding table `[vocab, D]` in any weight format; returns `[T, D]`.
pub fn embedding(w: &Weight, ids: &[u32]) -> Result<Tensor> {
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= w.rows()) {
        return crate::error::invalid(
            "embedding",
            format!(
                "token id {bad} is outside the vocabulary of {} rows",
                w.rows()
            ),
        );
    }
    cpu::matmul::embedding(w, ids)
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w` (`w` of any float dtype,
/// omitted for the weightless variant).
pub fn rms_norm(x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    if let Some(w) = w {
        if w.numel() != x.dim(-1) {
            return shape_err(
                "rms_norm",
                format!(
                    "weight {:?} does not match input {:?}",
                    w.shape(),
                    x.shape()
                ),
            );
        }
    }
    cpu::norm::rms_norm(x, w, eps)
}

/// Rotary embedding on `x` `[T, H, D]`: the first `2·inv_freq.len()` dims of each head are
/// rotated by angle `positions[t]·inv_freq[i]`, the rest pass through.
pub fn rope(
    x: &Tensor,
    positions: &[usize],
    inv_freq: &[f32],
    layout: RopeLayout,
) -> Result<Tensor> {
    if x.dims() != 3 || positions.len() != x.dim(0) || 2 * inv_freq.len() > x.dim(2) {
        return shape_err(
            "rope",
            format!(
                "x {:?} must be [T, H, D] with T = {} positions and D >= {}",
                x.shape(),
                positions.len(),
                2 * inv_freq.len()
            ),
        );
    }
    cpu::rope::rope(x, positions, inv_freq, layout)
}

/// Causal GQA attention. `q` is `[T, Hq, D]`; `k`, `v` are caches `[Hk, Cap, D]` of which
/// the first `p.kv_len` positions are valid; `Hq` must be a multiple of `Hk`. Returns
/// `[T, Hq, D]`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    let ok = q.dims() == 3
        && k.dims() == 3
        && k.shape() == v.shape()
        && q.dim(2) == k.dim(2)
        && k.dim(0) > 0
        && q.dim(1) % k.dim(0) == 0
        && p.kv_len <= k.dim(1)
        && p.q_start + q.dim(0) <= p.kv_len;
    if !ok {
        return shape_err(
            "attention",
            format!(
                "q {:?}, k {:?}, v {:?}, q_start {}, kv_len {}",
                q.shape(),
                k.shape(),
                v.shape(),
                p.q_start,
                p.kv_len
            ),
        );
    }
    cpu::attention::attention(q, k, v, p)
}

/// Writes `new` `[T, Hk, D]` into a cache `[Hk, Cap, D]` at positions `pos..pos+T`.
pub fn kv_write(cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    let ok = cache.dims() == 3
        && new.dims() == 3
        && new.dim(1) == cache.dim(0)
        && new.dim(2) == cache.dim(2)
        && pos + new.dim(0) <= cache.dim(1);
    if !ok {
        return shape_err(
            "kv_write",
            format!(
                "cannot write {:?} at {pos} into cache {:?}",
                new.shape(),
                cache.shape()
            ),
        );
    }
    cpu::attention::kv_write(cache, new, pos)
}

/// Softmax over the last dimension.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    cpu::unary::softmax(x)
}

/// Log-softmax over the last dimension, computed in f64 for exact-looking logprobs.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    cpu::unary::log_softmax(x)
}

pub fn silu(x: &Tensor) -> Result<Tensor> {
    cpu::unary::map(x, cpu::unary::silu)
}

/// GELU, tanh approximation.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    cpu::unary::map(x, cpu::unary::gelu_tanh)
}

pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    cpu::unary::map(x, cpu::unary::sigmoid)
}

pub fn softplus(x: &Tensor) -> Result<Tensor> {
    cpu::unary::map(x, cpu::unary::softplus)
}

/// `x · s`.
pub fn scale(x: &Tensor, s: f32) -> Result<Tensor> {
    cpu::unary::map(x, move |v| v * s)
}

/// `a + b`; `b` may be broadcast over leading dims (its shape a suffix of `a`'s).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    cpu::binary::binary("add", a, b, |x, y| x + y)
}

/// `a · b`; `b` may be broadcast over leading dims (its shape a suffix of `a`'s).
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    cpu::binary::binary("mul", a, b, |x, y| x * y)
}

/// `silu(gate) · up`, the SwiGLU activation (fused: one pass, no temporary).
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    cpu::binary::binary("swiglu", gate, up, |g, u| cpu::unary::silu(g) * u)
}

/// Index of the largest element of each row of `x` `[.., N]`; ties go to the lower index.
pub fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    cpu::select::argmax(x)
}

/// The `k` largest `(index, value)` of a 1-D `x`, best first; ties go to the lower index.
pub fn top_k(x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    cpu::select::top_k(x, k)
}

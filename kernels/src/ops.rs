//! The op set: every op a model may call, in one list. Each checks shapes and dtypes, then
//! runs on the backend of its inputs' device (`backend::on`; the trait `backend::Backend`
//! lists what every backend implements). All activations are f32; weights may be any `Weight`
//! format.
//!
//! Determinism: every CPU op splits work over output elements only, so results are
//! bit-identical for any thread count.

use crate::backend::{devices, on, Gdn};
use crate::error::{shape_err, Result};
use crate::params::Unary;
pub use crate::params::{AttnParams, RopeLayout};
use crate::{cpu, Tensor, Weight};

mod moe;
pub use moe::{gather_matmul, moe_combine, moe_route, moe_route_sigmoid, MoeRoutes, Routing};

/// `x @ wᵀ`: `x` is `[.., K]` f32, `w` is `[N, K]` in any weight format; returns `[.., N]`.
pub fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    check_matmul(x, w)?;
    on(devices(&[x]).chain([w.device()])).matmul(x, w)
}

fn check_matmul(x: &Tensor, w: &Weight) -> Result<()> {
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
    Ok(())
}

/// [`matmul`] of `x` against each of `ws` (one layer's projections of the same input). Each
/// result is bit-identical to its own [`matmul`]; on the CPU, decode-sized inputs run all the
/// products in one parallel loop (fewer thread hand-offs per decode step).
pub fn matmul_many(x: &Tensor, ws: &[&Weight]) -> Result<Vec<Tensor>> {
    for w in ws {
        check_matmul(x, w)?;
    }
    on(devices(&[x]).chain(ws.iter().map(|w| w.device()))).matmul_many(x, ws)
}

/// [`matmul`] for `x` `[M, K]` whose rows are separate sequences (a batched decode step): each
/// row's result is bit-identical to a one-row [`matmul`] of that row. On the CPU the rows go
/// through the decode kernel, whose rows do not depend on each other, in groups of at most
/// [`cpu::matmul::DECODE_MAX_M`] ([`cpu::matmul::matmul_rows`]: a dense weight is read once
/// for all groups); on other devices one row at a time.
pub fn matmul_rows(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let m = x.dim(0);
    let cpu = x.device() == crate::Device::Cpu && w.device() == crate::Device::Cpu;
    if x.dims() != 2 || (cpu && m <= cpu::matmul::DECODE_MAX_M) || (!cpu && m <= 1) {
        return matmul(x, w);
    }
    if cpu {
        check_matmul(x, w)?;
        return cpu::matmul::matmul_rows(x, w);
    }
    let parts = (0..m)
        .map(|r| matmul(&x.narrow0(r, 1)?, w))
        .collect::<Result<Vec<_>>>()?;
    let parts: Vec<Tensor> = parts
        .iter()
        .map(|p| p.to_device(crate::Device::Cpu))
        .collect::<Result<_>>()?;
    let t = Tensor::cat0(&parts.iter().collect::<Vec<_>>())?;
    t.to_device(x.device())
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
    on([w.device()]).embedding(w, ids)
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w` (`w` of any float dtype,
/// omitted for the weightless variant).
pub fn rms_norm(x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    need_rows("rms_norm", x)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return crate::error::invalid(
            "rms_norm",
            format!("eps must be finite and >= 0, got {eps}"),
        );
    }
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
    on(devices(&[x])).rms_norm(x, w, eps)
}

/// Rotary embedding on `x` `[T, H, D]`: the first `2·inv_freq.len()` dims of each head are
/// rotated by angle `positions[t]·inv_freq[i]`, the rest pass through.
pub fn rope(
    x: &Tensor,
    positions: &[usize],
    inv_freq: &[f32],
    layout: RopeLayout,
) -> Result<Tensor> {
    check_rope(x, positions, inv_freq)?;
    on(devices(&[x])).rope(x, positions, inv_freq, None, layout)
}

fn check_rope(x: &Tensor, positions: &[usize], inv_freq: &[f32]) -> Result<()> {
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
    Ok(())
}

/// [`rope`] for the plain `θ^(−2i/dims)` frequencies, with `θ` given too: the CPU path uses
/// `inv_freq` (as [`rope`] does); the MLX path hands `base = θ` to `mx.fast.rope`, as mlx-lm's
/// `nn.RoPE` does, so MLX derives the frequencies itself and the result equals mlx-lm's bit
/// for bit (MLX's own frequencies differ from `inv_freq` in the last f32 bits).
pub fn rope_with_base(
    x: &Tensor,
    positions: &[usize],
    inv_freq: &[f32],
    base: Option<f32>,
    layout: RopeLayout,
) -> Result<Tensor> {
    check_rope(x, positions, inv_freq)?;
    on(devices(&[x])).rope(x, positions, inv_freq, base, layout)
}

/// Causal GQA attention. `q` is `[T, Hq, D]`; `k`, `v` are caches `[Hk, Cap, D]` of which
/// the first `p.kv_len` positions are valid; `Hq` must be a multiple of `Hk`. Returns
/// `[T, Hq, D]`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    let fits = k.dims() == 3 && p.kv_len <= k.dim(1);
    check_attention("attention", (q, k, v), p, fits, String::new)?;
    on(devices(&[q, k, v])).attention(q, k, v, p)
}

/// The checks both attention ops share: shapes (`q` `[T, Hq, D]`, `k` = `v` `[Hk, _, D]`,
/// `Hk` dividing `Hq`, the queries inside the keys), the op's own cache layout (`layout_ok`,
/// described by `layout`), the window and the soft-cap.
fn check_attention(
    op: &'static str,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    p: &AttnParams,
    layout_ok: bool,
    layout: impl FnOnce() -> String,
) -> Result<()> {
    let ok = q.dims() == 3
        && k.dims() == 3
        && k.shape() == v.shape()
        && q.dim(2) == k.dim(2)
        && k.dim(0) > 0
        && q.dim(1).is_multiple_of(k.dim(0))
        && layout_ok
        && p.q_start + q.dim(0) <= p.kv_len;
    if !ok {
        return shape_err(
            op,
            format!(
                "q {:?}, k {:?}, v {:?}{}, q_start {}, kv_len {}",
                q.shape(),
                k.shape(),
                v.shape(),
                layout(),
                p.q_start,
                p.kv_len
            ),
        );
    }
    if p.window == Some(0) {
        return crate::error::invalid(op, "a sliding window must hold at least 1 key");
    }
    if let Some(c) = p.softcap {
        if !(c > 0.0 && c.is_finite()) {
            return crate::error::invalid(op, format!("softcap must be finite and > 0, got {c}"));
        }
    }
    Ok(())
}

/// [`attention`] over a paged KV cache: `k`, `v` are block pools `[Hk, Blocks·B, D]` holding
/// blocks of `B = block` positions, and `table[i]` is the pool block that holds logical
/// positions `i·B .. (i+1)·B`. Keys `0..p.kv_len` are read through the table. The result
/// equals [`attention`] on the same keys laid out flat (bit for bit on the CPU). Not on the
/// native CUDA backend yet (an error says so).
pub fn attention_paged(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (table, block): (&[u32], usize),
    p: &AttnParams,
) -> Result<Tensor> {
    let table_ok = k.dims() == 3
        && block > 0
        && k.dim(1).is_multiple_of(block)
        && p.kv_len <= table.len() * block
        && table.iter().all(|&b| (b as usize) < k.dim(1) / block);
    let layout = || format!(", {} table entries in blocks of {block}", table.len());
    check_attention("attention_paged", (q, k, v), p, table_ok, layout)?;
    on(devices(&[q, k, v])).attention_paged(q, k, v, (table, block), p)
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
    on(devices(&[cache, new])).kv_write(cache, new, pos)
}

/// Softmax over the last dimension. A row that is all `-inf` (fully masked) gives zeros.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    need_rows("softmax", x)?;
    on(devices(&[x])).softmax(x)
}

/// Log-softmax over the last dimension, computed in f64 for exact-looking logprobs. A row
/// that is all `-inf` stays all `-inf`.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    need_rows("log_softmax", x)?;
    on(devices(&[x])).log_softmax(x)
}

fn unary(x: &Tensor, f: Unary) -> Result<Tensor> {
    on(devices(&[x])).unary(x, f)
}

pub fn silu(x: &Tensor) -> Result<Tensor> {
    unary(x, Unary::Silu)
}

/// GELU, tanh approximation.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    unary(x, Unary::GeluTanh)
}

pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    unary(x, Unary::Sigmoid)
}

pub fn softplus(x: &Tensor) -> Result<Tensor> {
    unary(x, Unary::Softplus)
}

/// `x · s`.
pub fn scale(x: &Tensor, s: f32) -> Result<Tensor> {
    unary(x, Unary::Scale(s))
}

/// `c·tanh(x/c)`: logits squashed smoothly into `(−c, c)` (Gemma's final soft cap).
pub fn softcap(x: &Tensor, c: f32) -> Result<Tensor> {
    if !(c.is_finite() && c > 0.0) {
        return crate::error::invalid("softcap", "the cap must be a positive finite number");
    }
    unary(x, Unary::Softcap(c))
}

/// `a + b`; `b` may be broadcast over leading dims (its shape a suffix of `a`'s).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    on(devices(&[a, b])).add(a, b)
}

/// `a · b`; `b` may be broadcast over leading dims (its shape a suffix of `a`'s).
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    on(devices(&[a, b])).mul(a, b)
}

/// `silu(gate) · up`, the SwiGLU activation (fused: one pass, no temporary). Both halves
/// must have the same shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() {
        return shape_err(
            "swiglu",
            format!("gate {:?} and up {:?} differ", gate.shape(), up.shape()),
        );
    }
    on(devices(&[gate, up])).swiglu(gate, up)
}

/// Index of the largest element of each row of `x` `[.., N]`; ties go to the lower index and
/// NaN never wins (an all-NaN row gives 0).
pub fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    need_rows("argmax", x)?;
    on(devices(&[x])).argmax(x)
}

/// The `k` largest `(index, value)` of a 1-D `x`, best first; ties go to the lower index, NaN
/// ranks below `-inf`, and `k > N` gives all `N`.
pub fn top_k(x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    on(devices(&[x])).top_k(x, k)
}

/// Whether every element of an f32 tensor is finite. On a GPU the check runs there and only
/// the verdict comes back (the chunked Gated DeltaNet's fallback test, once per layer).
pub fn all_finite(x: &Tensor) -> Result<bool> {
    need_f32("all_finite", "x", x)?;
    on(devices(&[x])).all_finite(x)
}

/// Row-wise ops work over the last dimension, which a 0-d tensor does not have.
fn need_rows(op: &'static str, x: &Tensor) -> Result<()> {
    if x.dims() == 0 {
        return shape_err(op, "needs at least one dimension, got a scalar");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet (docs/design.md §5) and the depthwise causal conv that feeds it. One sequence per call;
// activations and recurrent state are f32.
// ---------------------------------------------------------------------------------------------

/// Chunk length of [`gdn_chunked`] unless a caller has measured better.
pub const GDN_CHUNK: usize = 64;

/// The log-space decay gate `g_log = −exp(A_log)·softplus(a + dt_bias)`: `a` is `[T, Hv]`,
/// `a_log` and `dt_bias` are `[Hv]` (any float dtype); returns `[T, Hv]`. Finite for every
/// finite input (clamped at [`crate::params::GATE_FLOOR`], whose `exp` is exactly 0); feed it to
/// the GDN ops as is, never as `exp` then `log`.
pub fn gdn_gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    need_f32("gdn_gate", "a", a)?;
    if a.dims() != 2 || a_log.numel() != a.dim(1) || dt_bias.numel() != a.dim(1) {
        return shape_err(
            "gdn_gate",
            format!(
                "a {:?} must be [T, Hv] with A_log {:?} and dt_bias {:?} of Hv elements",
                a.shape(),
                a_log.shape(),
                dt_bias.shape()
            ),
        );
    }
    on(devices(&[a, a_log, dt_bias])).gdn_gate(a, a_log, dt_bias)
}

/// The per-step Gated DeltaNet recurrence (reference and decode path). `q, k` `[T, Hk, Dk]`
/// (already normalised and scaled), `v` `[T, Hv, Dv]`, `g_log, beta` `[T, Hv]`, `state`
/// `[Hv, Dv, Dk]` (updated in place); value head `h` reads key head `h / (Hv/Hk)`. Per step:
/// `S ← e^g·S; δ = β(v − S k); S ← S + δ kᵀ; y = S q`. Returns `y` `[T, Hv, Dv]`.
pub fn gdn_recurrent(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
) -> Result<Tensor> {
    gdn_check("gdn_recurrent", q, k, v, g_log, beta, state)?;
    let g = Gdn {
        q,
        k,
        v,
        g_log,
        beta,
    };
    on(devices(&[q, k, v, g_log, beta, state])).gdn_recurrent(g, state)
}

/// Same contract as [`gdn_recurrent`], computed chunk by chunk (`chunk` tokens at a time, see
/// [`GDN_CHUNK`]) with matrix products: the prefill path. Equal to the per-step result up to
/// f32 rounding.
pub fn gdn_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
    chunk: usize,
) -> Result<Tensor> {
    gdn_check("gdn_chunked", q, k, v, g_log, beta, state)?;
    if chunk == 0 {
        return crate::error::invalid("gdn_chunked", "chunk length must be at least 1");
    }
    let g = Gdn {
        q,
        k,
        v,
        g_log,
        beta,
    };
    on(devices(&[q, k, v, g_log, beta, state])).gdn_chunked(g, state, chunk)
}

/// Depthwise causal conv over time: `x` `[T, C]`, `weight` `[C, K]` (any float dtype; reshape
/// `[C, K, 1]` / `[C, 1, K]` checkpoint tensors first), `state` `[K−1, C]` holding the inputs
/// before `x` (zeros at the start of a sequence), updated to the last `K − 1` inputs. No bias;
/// `silu` applies SiLU to the result. Returns `[T, C]`.
pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    state: &mut Tensor,
    silu: bool,
) -> Result<Tensor> {
    need_f32("causal_conv1d", "x", x)?;
    need_f32("causal_conv1d", "state", state)?;
    let ok = x.dims() == 2
        && weight.dims() == 2
        && weight.dim(0) == x.dim(1)
        && weight.dim(1) >= 1
        && state.shape() == [weight.dim(1) - 1, x.dim(1)];
    if !ok {
        return shape_err(
            "causal_conv1d",
            format!(
                "x {:?} must be [T, C], weight {:?} [C, K] and state {:?} [K-1, C]",
                x.shape(),
                weight.shape(),
                state.shape()
            ),
        );
    }
    on(devices(&[x, weight, state])).causal_conv1d(x, weight, state, silu)
}

/// Shapes and dtypes shared by the two GDN paths.
fn gdn_check(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &Tensor,
) -> Result<()> {
    for (name, t) in [
        ("q", q),
        ("k", k),
        ("v", v),
        ("g_log", g_log),
        ("beta", beta),
        ("state", state),
    ] {
        need_f32(op, name, t)?;
    }
    let ok = q.dims() == 3
        && k.shape() == q.shape()
        && v.dims() == 3
        && v.dim(0) == q.dim(0)
        && q.dim(1) > 0
        && q.dim(2) > 0
        && v.dim(1) > 0
        && v.dim(2) > 0
        && v.dim(1).is_multiple_of(q.dim(1))
        && g_log.shape() == [v.dim(0), v.dim(1)]
        && beta.shape() == [v.dim(0), v.dim(1)]
        && state.shape() == [v.dim(1), v.dim(2), q.dim(2)];
    if !ok {
        return shape_err(
            op,
            format!(
                "want q, k [T, Hk, Dk], v [T, Hv, Dv] with Hv a multiple of Hk, g_log and beta \
                 [T, Hv], state [Hv, Dv, Dk]; got q {:?}, k {:?}, v {:?}, g_log {:?}, beta {:?}, \
                 state {:?}",
                q.shape(),
                k.shape(),
                v.shape(),
                g_log.shape(),
                beta.shape(),
                state.shape()
            ),
        );
    }
    Ok(())
}

/// Activations and recurrent state must be f32 (on MLX any float dtype: its ops cast what they
/// need, and the native path carries bf16 activations); the message names the offending tensor.
fn need_f32(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    #[cfg(feature = "mlx")]
    if t.device() == crate::Device::Mlx && t.dtype().is_float() {
        return Ok(());
    }
    if t.dtype() != crate::DType::F32 {
        return Err(crate::Error::DType {
            op,
            dtype: t.dtype(),
            msg: format!("{name} must be f32"),
        });
    }
    Ok(())
}

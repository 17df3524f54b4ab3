//! Sparse mixture-of-experts ops: routing, a matmul gathered over a stacked expert weight, and
//! the weighted combine. A stacked weight is one [`Weight`] `[E·N, K]` whose rows
//! `e·N..(e+1)·N` are expert `e` (MLX folders store `[E, N, K]`; the loader flattens the
//! leading axes), so every weight format works unchanged.
//!
//! Only the experts a token selected are read: the CPU and CUDA backends group the
//! (token, expert) pairs by expert and run one ordinary matmul per *used* expert over a view of
//! its rows; MLX runs its own `gather_mm` / `gather_qmm`, which index the stacked weight.

use super::{need_f32, shape_err};
use crate::backend::{devices, on};
use crate::{cpu, Result, Tensor, Weight};

/// Where each token goes: `experts` and `weights` are `[T·k]`, token-major, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeRoutes {
    pub top_k: usize,
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

impl MoeRoutes {
    /// Number of routed tokens.
    pub fn tokens(&self) -> usize {
        self.experts.len() / self.top_k.max(1)
    }

    /// The token of each (token, expert) pair: `[0; k] ++ [1; k] ++ ...`.
    pub fn pair_tokens(&self) -> Vec<u32> {
        (0..self.experts.len() as u32)
            .map(|p| p / self.top_k as u32)
            .collect()
    }
}

/// How router scores become the top-k weights.
#[derive(Debug, Clone, Copy)]
pub struct Routing<'a> {
    /// Added to the scores to choose the experts, not to weigh them (LFM2-MoE's
    /// `expert_bias`, load balancing); empty = none, else one per expert.
    pub selection_bias: &'a [f32],
    /// Divide the top-k scores by their sum (`norm_topk_prob`).
    pub renormalize: bool,
    /// Added to that sum first (LFM2-MoE: 1e-6).
    pub renormalize_eps: f32,
    /// Multiplies the final weights (`routed_scaling_factor`).
    pub scale: f32,
}

impl Routing<'_> {
    /// Plain top-k, renormalised or not: Qwen's softmax routers.
    pub fn plain(renormalize: bool) -> Routing<'static> {
        Routing {
            selection_bias: &[],
            renormalize,
            renormalize_eps: 0.0,
            scale: 1.0,
        }
    }
}

/// Routes each row of router logits `[T, E]`: `softmax` (f32, on the logits' device), then on
/// the host the `top_k` most probable experts (ties to the lower index), their probabilities
/// divided by their sum when `renormalize` (Qwen's `norm_topk_prob`).
pub fn moe_route(logits: &Tensor, top_k: usize, renormalize: bool) -> Result<MoeRoutes> {
    route_scores(
        "moe_route",
        logits,
        top_k,
        Routing::plain(renormalize),
        false,
    )
}

/// Routes each row of router logits `[T, E]` by independent `sigmoid` scores (f32, on the
/// logits' device), then on the host as `routing` says: the `top_k` experts by score plus
/// selection bias, weighted by their unbiased scores (LFM2-MoE, DeepSeek-V3-style routers).
pub fn moe_route_sigmoid(logits: &Tensor, top_k: usize, routing: Routing) -> Result<MoeRoutes> {
    route_scores("moe_route_sigmoid", logits, top_k, routing, true)
}

fn route_scores(
    op: &'static str,
    logits: &Tensor,
    top_k: usize,
    routing: Routing,
    sigmoid: bool,
) -> Result<MoeRoutes> {
    need_f32(op, "logits", logits)?;
    let experts = if logits.dims() == 2 { logits.dim(1) } else { 0 };
    let bias_ok = routing.selection_bias.is_empty() || routing.selection_bias.len() == experts;
    if logits.dims() != 2 || top_k == 0 || top_k > experts || !bias_ok {
        return shape_err(
            op,
            format!(
                "logits {:?} must be [T, E] with 1 <= top_k ({top_k}) <= E and a selection \
                 bias of E values or none (got {})",
                logits.shape(),
                routing.selection_bias.len()
            ),
        );
    }
    let scores = if sigmoid {
        super::sigmoid(logits)?
    } else {
        super::softmax(logits)?
    };
    let scores = scores.to_device(crate::Device::Cpu)?;
    let rule = cpu::moe::Rule {
        selection_bias: routing.selection_bias,
        renormalize: routing.renormalize,
        renormalize_eps: routing.renormalize_eps,
        scale: routing.scale,
    };
    let (experts, weights) = cpu::moe::route(scores.f32s()?, experts, top_k, rule);
    Ok(MoeRoutes {
        top_k,
        experts,
        weights,
    })
}

/// `out[p] = x[rows[p]] · w[ids[p]]ᵀ`: `x` `[T, K]` f32, `w` a stacked weight `[E·N, K]` of
/// `experts` experts in any format, `rows` and `ids` one entry per output row. Returns
/// `[P, N]`; rows of experts no pair names are never read.
pub fn gather_matmul(
    x: &Tensor,
    w: &Weight,
    experts: usize,
    rows: &[u32],
    ids: &[u32],
) -> Result<Tensor> {
    need_f32("gather_matmul", "x", x)?;
    let ok = x.dims() == 2
        && w.cols() == x.dim(1)
        && experts > 0
        && w.rows().is_multiple_of(experts)
        && rows.len() == ids.len()
        && !rows.is_empty()
        && rows.iter().all(|&r| (r as usize) < x.dim(0))
        && ids.iter().all(|&e| (e as usize) < experts);
    if !ok {
        return shape_err(
            "gather_matmul",
            format!(
                "x {:?} must be [T, K] and the weight [E·N, K] over {experts} experts (got \
                 {}x{}); {} rows and {} expert ids must pair up, each in range",
                x.shape(),
                w.rows(),
                w.cols(),
                rows.len(),
                ids.len()
            ),
        );
    }
    on(devices(&[x]).chain([w.device()])).gather_matmul(x, w, experts, rows, ids)
}

/// `out[t] = Σ_j weights[t·k + j] · y[t·k + j]` over the `k` routed experts of token `t` (in
/// route order), plus `scale[t] · shared[t]` for a shared expert: `y` `[T·k, N]`, `shared`
/// `[T, N]`, `scale` `[T, 1]` (e.g. `sigmoid(shared_expert_gate(x))`). Returns `[T, N]`.
pub fn moe_combine(
    y: &Tensor,
    weights: &[f32],
    top_k: usize,
    shared: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    need_f32("moe_combine", "y", y)?;
    let ok = y.dims() == 2
        && top_k > 0
        && y.dim(0) == weights.len()
        && y.dim(0).is_multiple_of(top_k)
        && shared.is_none_or(|(s, g)| {
            s.shape() == [y.dim(0) / top_k, y.dim(1)] && g.shape() == [y.dim(0) / top_k, 1]
        });
    if !ok {
        return shape_err(
            "moe_combine",
            format!(
                "y {:?} must be [T·k, N] with k = {top_k} and {} weights; shared {:?} [T, N], \
                 scale {:?} [T, 1]",
                y.shape(),
                weights.len(),
                shared.map(|s| s.0.shape().to_vec()),
                shared.map(|s| s.1.shape().to_vec())
            ),
        );
    }
    if let Some((s, g)) = shared {
        need_f32("moe_combine", "shared", s)?;
        need_f32("moe_combine", "scale", g)?;
    }
    on(devices(&[y])).moe_combine(y, weights, top_k, shared)
}

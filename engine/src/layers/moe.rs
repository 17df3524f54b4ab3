//! Sparse mixture-of-experts MLP (Qwen3-Next / Qwen3.5-MoE): a router picks `top_k` of
//! `experts` SwiGLU experts per token (softmax in f32, top-k, optionally renormalised), and an
//! optional shared expert, scaled by `sigmoid(shared_expert_gate(x))`, is added to every token.
//! Facts from mlx-lm 0.32 (`qwen3_next.py` `Qwen3NextSparseMoeBlock`, `switch_layers.py`,
//! `qwen3_5_moe.py` `sanitize`) and transformers 5.23 (`modeling_qwen3_5_moe.py`).
//!
//! Expert weights are stacked: `switch_mlp.{gate,up,down}_proj` `[E, out, in]` in MLX folders
//! (quantized along `in` like any linear), `experts.gate_up_proj` `[E, 2·I, H]` (gate rows, then
//! up rows) and `experts.down_proj` `[E, H, I]` in original ones (no `.weight` suffix, never
//! quantized). LFM2-MoE's originals keep one tensor per expert (`experts.{e}.{w1,w3,w2}.weight`),
//! stacked here at load. Only the selected experts' rows are read (`ops::gather_matmul`).

use anyhow::{ensure, Result};
use kernels::{ops, Bytes, Tensor, Weight};

use super::params::{params, Param, Params, Visit};
use super::{Linear, RmsNorm, SwiGlu};
use crate::weights::{Scope, WeightStore};

/// Widths of one sparse MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Width of each routed expert (`moe_intermediate_size`).
    pub expert_width: usize,
    /// Width of the shared expert (`shared_expert_intermediate_size`); 0 = none.
    pub shared_width: usize,
    /// `norm_topk_prob`: divide the top-k probabilities by their sum.
    pub renormalize: bool,
}

/// The shared expert and its scalar gate.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    pub mlp: SwiGlu,
    /// `[1, hidden]`.
    pub gate: Linear,
}

/// The routed experts' gated MLPs, stacked per projection, and the gate's activation.
#[derive(Debug, Clone)]
pub struct StackedExperts {
    pub experts: usize,
    /// Stacked `[experts·I, hidden]`.
    pub gate: Weight,
    /// Stacked `[experts·I, hidden]`.
    pub up: Weight,
    /// Stacked `[experts·hidden, I]`.
    pub down: Weight,
    /// GeGLU (`gelu_tanh(gate) · up`, Gemma 4) instead of SwiGLU.
    pub gelu: bool,
}

impl StackedExperts {
    /// `switch` names MLX's stacked `{switch}.{gate,up,down}_proj.weight`, used when present;
    /// else `fused` names the original `{fused}.gate_up_proj` and `{fused}.down_proj`, or, when
    /// there is no `gate_up_proj`, one tensor per expert `{fused}.{e}.{w1,w3,w2}.weight` (gate,
    /// up, down; LFM2-MoE, Mixtral-style). `gelu` selects GeGLU experts (SwiGLU otherwise).
    pub fn load(
        s: &Scope,
        (switch, fused): (&str, &str),
        (e, h, i): (usize, usize, usize),
        gelu: bool,
    ) -> Result<StackedExperts> {
        let store = s.store();
        let (switch, fused) = (s.pp(switch), s.name(fused));
        let (gate, up, down) = if switch.contains("gate_proj.weight") {
            let stacked = |name: &str, rows, cols| switch.pp(name).stacked_weight(e, rows, cols);
            (
                stacked("gate_proj", i, h)?,
                stacked("up_proj", i, h)?,
                stacked("down_proj", h, i)?,
            )
        } else if store.contains(&format!("{fused}.0.w1.weight")) {
            let stack = |name: &str, rows: usize, cols: usize| -> Result<Weight> {
                let names: Vec<String> = (0..e)
                    .map(|x| format!("{fused}.{x}.{name}.weight"))
                    .collect();
                Ok(Weight::Dense(stack_experts(store, &names, rows, cols)?))
            };
            (stack("w1", i, h)?, stack("w3", i, h)?, stack("w2", h, i)?)
        } else {
            let both = store.float_tensor(&format!("{fused}.gate_up_proj"), &[e, 2 * i, h])?;
            let (gate, up) = split_halves(&both, e)?;
            let down = store.float_tensor(&format!("{fused}.down_proj"), &[e, h, i])?;
            (
                Weight::Dense(gate),
                Weight::Dense(up),
                Weight::Dense(down.reshape(&[e * h, i])?),
            )
        };
        Ok(StackedExperts {
            experts: e,
            gate,
            up,
            down,
            gelu,
        })
    }

    /// Each (token, expert) pair's output `[T·k, hidden]`, in route order; reads only the
    /// selected experts' rows.
    pub fn forward(&self, x: &Tensor, routes: &ops::MoeRoutes) -> Result<Tensor> {
        let e = self.experts;
        let tokens = routes.pair_tokens();
        let g = ops::gather_matmul(x, &self.gate, e, &tokens, &routes.experts)?;
        let u = ops::gather_matmul(x, &self.up, e, &tokens, &routes.experts)?;
        let h = if self.gelu {
            ops::mul(&ops::gelu_tanh(&g)?, &u)?
        } else {
            ops::swiglu(&g, &u)?
        };
        let pairs: Vec<u32> = (0..routes.experts.len() as u32).collect();
        Ok(ops::gather_matmul(
            &h,
            &self.down,
            e,
            &pairs,
            &routes.experts,
        )?)
    }
}

impl Params for StackedExperts {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        for w in [&mut self.gate, &mut self.up, &mut self.down] {
            f(Param::Matrix { w, expert: true })?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct SparseMoe {
    pub cfg: MoeConfig,
    /// `[experts, hidden]`.
    pub router: Linear,
    pub experts: StackedExperts,
    pub shared: Option<SharedExpert>,
}

impl SparseMoe {
    /// Loads the block at `prefix` (e.g. `…layers.0.mlp`) in either layout: MLX's
    /// `switch_mlp.*` when present, else the original fused `experts.*`.
    pub fn load(s: &Scope, cfg: MoeConfig) -> Result<SparseMoe> {
        let (h, e, i) = (cfg.hidden, cfg.experts, cfg.expert_width);
        let shared = if cfg.shared_width > 0 {
            Some(SharedExpert {
                mlp: SwiGlu::load(&s.pp("shared_expert"), h, cfg.shared_width)?,
                gate: s.pp("shared_expert_gate").linear(1, h)?,
            })
        } else {
            None
        };
        Ok(SparseMoe {
            cfg,
            router: s.pp("gate").linear(e, h)?,
            experts: StackedExperts::load(s, ("switch_mlp", "experts"), (e, h, i), false)?,
            shared,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.cfg;
        let routes = ops::moe_route(&self.router.forward(x)?, c.top_k, c.renormalize)?;
        let y = self.experts.forward(x, &routes)?;
        let shared = match &self.shared {
            Some(s) => Some((s.mlp.forward(x)?, ops::sigmoid(&s.gate.forward(x)?)?)),
            None => None,
        };
        let shared = shared.as_ref().map(|(s, g)| (s, g));
        Ok(ops::moe_combine(&y, &routes.weights, c.top_k, shared)?)
    }
}

params!(SharedExpert: mlp, gate);
params!(SparseMoe: router, experts, shared);

/// The sparse feed-forward of LFM2-MoE: router `gate` `[E, H]` (8-bit in quantized MLX
/// folders), `sigmoid` scores; the top k by score plus `expert_bias` (f32, for the choice only)
/// weighted by their unbiased scores, divided by their sum + 1e-6 when `norm_topk_prob`, times
/// `routed_scaling_factor`; SwiGLU experts.
#[derive(Debug, Clone)]
pub struct SigmoidMoe {
    pub router: Linear,
    /// Empty without `use_expert_bias`.
    pub expert_bias: Vec<f32>,
    pub experts: StackedExperts,
    pub top_k: usize,
    pub renormalize: bool,
    pub scale: f32,
}

params!(SigmoidMoe: router, expert_bias, experts);

impl SigmoidMoe {
    /// Loads `gate`, `expert_bias` (when `expert_bias`) and the experts under `s`.
    pub fn load(s: &Scope, cfg: MoeConfig, expert_bias: bool, scale: f32) -> Result<SigmoidMoe> {
        let (h, e, i) = (cfg.hidden, cfg.experts, cfg.expert_width);
        Ok(SigmoidMoe {
            router: s.pp("gate").linear(e, h)?,
            expert_bias: match expert_bias {
                true => s.finite_values("expert_bias", &[e])?,
                false => Vec::new(),
            },
            experts: StackedExperts::load(s, ("switch_mlp", "experts"), (e, h, i), false)?,
            top_k: cfg.top_k,
            renormalize: cfg.renormalize,
            scale,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let routing = ops::Routing {
            selection_bias: &self.expert_bias,
            renormalize: self.renormalize,
            renormalize_eps: 1e-6,
            scale: self.scale,
        };
        let routes = ops::moe_route_sigmoid(&self.router.forward(x)?, self.top_k, routing)?;
        let y = self.experts.forward(x, &routes)?;
        Ok(ops::moe_combine(&y, &routes.weights, self.top_k, None)?)
    }
}

/// The sparse branch of the MoE variant (`enable_moe_block`, 26B-A4B style), summed with the
/// dense MLP's output before `post_feedforward_layernorm`. Facts from mlx-lm 0.32
/// `gemma4_text.py` (`Router`, `Experts`, `DecoderLayer`).
pub struct GemmaExperts {
    /// RMSNorm of the residual stream with gain `router.scale · hidden^-½`.
    pub router_norm: RmsNorm,
    /// `router.proj` `[experts, hidden]` (8-bit in quantized MLX folders).
    pub router: Linear,
    /// `router.per_expert_scale`, applied to the top-k weights after their softmax.
    pub per_expert_scale: Vec<f32>,
    pub experts: StackedExperts,
    pub top_k: usize,
    /// `pre_feedforward_layernorm_2`: the experts' input norm.
    pub pre_norm: RmsNorm,
    /// `post_feedforward_layernorm_1`: the dense MLP's output norm.
    pub post_dense_norm: RmsNorm,
    /// `post_feedforward_layernorm_2`: the experts' output norm.
    pub post_norm: RmsNorm,
}

params!(GemmaExperts: router_norm, router, per_expert_scale, experts, pre_norm, post_dense_norm, post_norm);

impl GemmaExperts {
    /// Loads `router.{scale,proj,per_expert_scale}`, the experts and the three norms under `s`
    /// (the decoder layer's scope).
    pub fn load(
        s: &Scope,
        (hidden, experts, top_k, width, eps): (usize, usize, usize, usize, f32),
    ) -> Result<GemmaExperts> {
        let gain = (hidden as f32).powf(-0.5);
        let scale: Vec<f32> = s.pp("router").finite_values("scale", &[hidden])?;
        let norm = |name: &str| s.pp(name).norm(hidden, eps);
        Ok(GemmaExperts {
            router_norm: RmsNorm {
                weight: Tensor::from_f32(&[hidden], scale.iter().map(|v| v * gain).collect())?,
                eps,
            },
            router: s.pp("router.proj").linear(experts, hidden)?,
            per_expert_scale: s
                .pp("router")
                .finite_values("per_expert_scale", &[experts])?,
            experts: StackedExperts::load(
                s,
                ("experts.switch_glu", "experts"),
                (experts, hidden, width),
                true,
            )?,
            top_k,
            pre_norm: norm("pre_feedforward_layernorm_2")?,
            post_dense_norm: norm("post_feedforward_layernorm_1")?,
            post_norm: norm("post_feedforward_layernorm_2")?,
        })
    }

    /// `dense` is the dense MLP's output, `x` the residual stream; returns their sum.
    pub fn forward(&self, x: &Tensor, dense: &Tensor) -> Result<Tensor> {
        let logits = self.router.forward(&self.router_norm.forward(x)?)?;
        // Softmax over all experts then renormalising the top k equals mlx-lm's softmax over
        // the top-k logits.
        let mut routes = ops::moe_route(&logits, self.top_k, true)?;
        for (w, &e) in routes.weights.iter_mut().zip(&routes.experts) {
            *w *= self.per_expert_scale[e as usize];
        }
        let y = self.experts.forward(&self.pre_norm.forward(x)?, &routes)?;
        let sparse = ops::moe_combine(&y, &routes.weights, self.top_k, None)?;
        Ok(ops::add(
            &self.post_dense_norm.forward(dense)?,
            &self.post_norm.forward(&sparse)?,
        )?)
    }
}

/// `[E, 2·I, H]` → gate `[E·I, H]` (each expert's first I rows) and up (its last I rows), as
/// mlx-lm's `sanitize` splits `gate_up_proj`. Copies the stored bytes (any float dtype).
fn split_halves(fused: &Tensor, experts: usize) -> Result<(Tensor, Tensor)> {
    let (rows2, cols) = (fused.dim(1), fused.dim(2));
    ensure!(
        rows2 % 2 == 0,
        "gate_up_proj needs an even number of rows, got {rows2}"
    );
    let half = rows2 / 2;
    let bytes = fused.raw_bytes()?;
    let block = half * cols * fused.dtype().size_in_bytes();
    let (mut gate, mut up) = (
        Vec::with_capacity(experts * block),
        Vec::with_capacity(experts * block),
    );
    for e in 0..experts {
        let at = e * 2 * block;
        gate.extend_from_slice(&bytes[at..at + block]);
        up.extend_from_slice(&bytes[at + block..at + 2 * block]);
    }
    let shape = [experts * half, cols];
    Ok((
        Tensor::from_bytes(&shape, fused.dtype(), Bytes::from_vec(gate))?,
        Tensor::from_bytes(&shape, fused.dtype(), Bytes::from_vec(up))?,
    ))
}

/// The per-expert tensors `names` (each `[rows, cols]`, one float dtype) stacked into
/// `[E·rows, cols]`, as mlx-lm's `sanitize` stacks them. Copies the stored bytes.
fn stack_experts(
    store: &WeightStore,
    names: &[String],
    rows: usize,
    cols: usize,
) -> Result<Tensor> {
    let first = store.float_tensor(&names[0], &[rows, cols])?;
    let dtype = first.dtype();
    let mut bytes = Vec::with_capacity(names.len() * first.raw_bytes()?.len());
    for name in names {
        let t = store.tensor_shaped(name, &[rows, cols])?;
        ensure!(
            t.dtype() == dtype,
            "{}: tensor `{name}` is {:?} but `{}` is {dtype:?}; one expert stack needs one dtype",
            store.dir().display(),
            t.dtype(),
            names[0]
        );
        bytes.extend_from_slice(t.raw_bytes()?);
    }
    Ok(Tensor::from_bytes(
        &[names.len() * rows, cols],
        dtype,
        Bytes::from_vec(bytes),
    )?)
}

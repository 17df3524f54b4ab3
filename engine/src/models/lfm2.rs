//! LFM2 / LFM2.5 (Liquid AI): a hybrid of gated short-convolution blocks and GQA attention
//! blocks, each followed by a SwiGLU feed-forward; pre-norm (`operator_norm`, `ffn_norm`), a
//! final `embedding_norm`, and the LM head tied to the embedding.
//!
//! Facts checked against mlx-lm 0.32 (`lfm2.py`) and transformers 5.23 (`modeling_lfm2.py`,
//! `configuration_lfm2.py`):
//! - a layer is attention when listed in `full_attn_idxs` (mlx-lm reads it first) or marked
//!   `full_attention` in `layer_types` (transformers reads that first; other entries are
//!   `conv`); with neither, transformers makes every layer attention;
//! - attention: `q_proj`/`k_proj`/`v_proj`/`out_proj` without biases, per-head RMSNorm
//!   `q_layernorm`/`k_layernorm`, RoPE over the whole head (rotate-half pairs), θ from
//!   `rope_theta` or `rope_parameters.rope_theta` (default 1e6), head dim `hidden / heads`;
//! - short conv: see [`ShortConv`]; `conv_bias` puts biases on `in_proj`, the conv and
//!   `out_proj` alike;
//! - feed-forward `w2(silu(w1 x) ⊙ w3 x)` of width [`ff_width`];
//! - RMSNorm is `x̂ · w` (no offset) in both layouts, eps `norm_eps`; the two layouts share every
//!   name (`model.*`) and differ only in the conv weight's axis order.
//!
//! LFM2-MoE (`lfm2_moe`, LFM2-8B-A1B; mlx-lm `lfm2_moe.py`, transformers `modeling_lfm2_moe.py`)
//! is the same backbone: the first `num_dense_layers` feed-forwards are dense SwiGLU of width
//! `intermediate_size` (no auto-adjustment), the rest sparse (see [`SigmoidMoe`]). mlx-lm's
//! conversion renames `w1/w3/w2` to `gate_proj/up_proj/down_proj` and stacks the per-expert
//! originals into `switch_mlp.*`; both spellings load.

use anyhow::{bail, ensure, Result};
use kernels::{ops, ops::RopeLayout, Tensor, Weight};

use super::{CausalLm, ModelInfo};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::config::{ModelConfig, QuantConfig};
use crate::layers::{
    AttentionConfig, GqaAttention, Linear, RmsNorm, Rope, ShortConv, StackedExperts, SwiGlu,
};
use crate::weights::WeightStore;

/// Token mixer of one block. One per layer, so the size difference costs nothing worth boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Mixer {
    Conv(ShortConv),
    Attention(GqaAttention),
}

/// Feed-forward of one block: dense SwiGLU, or LFM2-MoE's sparse experts.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum FeedForward {
    Dense(SwiGlu),
    Sparse(SigmoidMoe),
}

impl FeedForward {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }
}

/// The sparse feed-forward of LFM2-MoE: router `gate` `[E, H]` (8-bit in quantized MLX
/// folders), `sigmoid` scores; the top k by score plus `expert_bias` (f32, for the choice only)
/// weighted by their unbiased scores, divided by their sum + 1e-6 when `norm_topk_prob`, times
/// `routed_scaling_factor`; SwiGLU experts.
#[derive(Debug, Clone)]
struct SigmoidMoe {
    router: Linear,
    /// Empty without `use_expert_bias`.
    expert_bias: Vec<f32>,
    experts: StackedExperts,
    top_k: usize,
    renormalize: bool,
    scale: f32,
}

/// LFM2-MoE's sparse widths and routing, from config.json.
#[derive(Debug, Clone, Copy)]
struct MoeShape {
    experts: usize,
    top_k: usize,
    expert_width: usize,
    dense_layers: usize,
    dense_width: usize,
    renormalize: bool,
    expert_bias: bool,
    scale: f32,
}

impl SigmoidMoe {
    fn load(
        store: &WeightStore,
        quant: &QuantConfig,
        p: &str,
        hidden: usize,
        m: &MoeShape,
    ) -> Result<SigmoidMoe> {
        let (e, i) = (m.experts, m.expert_width);
        let expert_bias = if m.expert_bias {
            let name = format!("{p}.expert_bias");
            let b = store.f32_values(&name, &[e])?;
            ensure!(
                b.iter().all(|v| v.is_finite()),
                "{}: `{name}` holds a value that is not finite",
                store.dir().display()
            );
            b
        } else {
            Vec::new()
        };
        Ok(SigmoidMoe {
            router: Linear::load(store, quant, &format!("{p}.gate"), e, hidden)?,
            expert_bias,
            experts: StackedExperts::load(
                store,
                quant,
                (&format!("{p}.switch_mlp"), &format!("{p}.experts")),
                (e, hidden, i),
                false,
            )?,
            top_k: m.top_k,
            renormalize: m.renormalize,
            scale: m.scale,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
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

#[derive(Debug, Clone)]
struct Block {
    operator_norm: RmsNorm,
    mixer: Mixer,
    ffn_norm: RmsNorm,
    feed_forward: FeedForward,
}

impl Block {
    fn forward(&self, x: &Tensor, state: &mut LayerState) -> Result<Tensor> {
        let h = self.operator_norm.forward(x)?;
        let h = match &self.mixer {
            Mixer::Conv(c) => c.forward(&h, state.conv_mut()?)?,
            Mixer::Attention(a) => a.forward(&h, state.kv_mut()?)?,
        };
        let x = ops::add(x, &h)?;
        let h = self.feed_forward.forward(&self.ffn_norm.forward(&x)?)?;
        Ok(ops::add(&x, &h)?)
    }

    fn move_to(&mut self, device: kernels::Device) -> Result<()> {
        self.operator_norm.to_device(device)?;
        match &mut self.mixer {
            Mixer::Conv(c) => c.to_device(device)?,
            Mixer::Attention(a) => a.to_device(device)?,
        }
        self.ffn_norm.to_device(device)?;
        match &mut self.feed_forward {
            FeedForward::Dense(m) => m.to_device(device),
            FeedForward::Sparse(m) => {
                m.router.to_device(device)?;
                m.experts.to_device(device)
            }
        }
    }

    fn weights(&self) -> Vec<&Weight> {
        let mixer: Vec<&Linear> = match &self.mixer {
            Mixer::Conv(c) => c.linears().to_vec(),
            Mixer::Attention(a) => vec![&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj],
        };
        let mut w: Vec<&Weight> = mixer.into_iter().map(|l| &l.weight).collect();
        match &self.feed_forward {
            FeedForward::Dense(ff) => w.extend([&ff.gate.weight, &ff.up.weight, &ff.down.weight]),
            FeedForward::Sparse(m) => {
                w.push(&m.router.weight);
                w.extend(m.experts.weights());
            }
        }
        w
    }

    /// Parameters outside the weight matrices.
    fn other_parameters(&self) -> usize {
        self.operator_norm.weight.numel()
            + self.ffn_norm.weight.numel()
            + match &self.feed_forward {
                FeedForward::Sparse(m) => m.expert_bias.len(),
                FeedForward::Dense(_) => 0,
            }
            + match &self.mixer {
                Mixer::Conv(c) => c.other_parameters(),
                Mixer::Attention(a) => [&a.q_norm, &a.k_norm]
                    .iter()
                    .flat_map(|n| n.as_ref())
                    .map(|n| n.weight.numel())
                    .sum(),
            }
    }
}

/// Hyperparameters read from config.json.
struct Shape {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    eps: f32,
    context: usize,
    conv_kernel: usize,
    conv_bias: bool,
    attention: Vec<bool>,
    rope: Rope,
    tied: bool,
    /// `lfm2_moe` only.
    moe: Option<MoeShape>,
}

impl Shape {
    fn read(cfg: &ModelConfig) -> Result<Shape> {
        let file = cfg.path();
        let file = file.display();
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", heads)?;
        ensure!(
            heads % kv_heads == 0,
            "{file}: field `num_attention_heads` ({heads}) must be a multiple of `num_key_value_heads` ({kv_heads})"
        );
        ensure!(
            cfg.opt("head_dim").is_some() || hidden % heads == 0,
            "{file}: field `hidden_size` ({hidden}) must be a multiple of `num_attention_heads` ({heads}) when `head_dim` is not given"
        );
        let head_dim = cfg.width_or("head_dim", hidden / heads)?;
        ensure!(
            head_dim % 2 == 0,
            "{file}: the head dim ({head_dim}) must be even for RoPE"
        );
        let block_dim = cfg.width_or("block_dim", hidden)?;
        ensure!(
            block_dim == hidden,
            "{file}: field `block_dim` ({block_dim}) must equal `hidden_size` ({hidden})"
        );
        // Older configs say `tie_embedding`; transformers reads it as `tie_word_embeddings`.
        let tied = match cfg.opt("tie_embedding") {
            Some(_) => cfg.bool_or("tie_embedding", true)?,
            None => cfg.bool_or("tie_word_embeddings", true)?,
        };
        Ok(Shape {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab: cfg.vocab_size()?,
            eps: cfg.f64_where("norm_eps", 1e-5, "a number in [0, 1)", |x| {
                (0.0..1.0).contains(&x)
            })? as f32,
            context: cfg.context_length(128_000)?,
            conv_kernel: cfg.width_or("conv_L_cache", 3)?,
            conv_bias: cfg.bool_or("conv_bias", false)?,
            attention: layer_kinds(cfg, layers)?,
            rope: rope(cfg, head_dim)?,
            tied,
            moe: if cfg.model_type == "lfm2_moe" {
                Some(moe_shape(cfg, layers)?)
            } else {
                None
            },
        })
    }
}

/// LFM2-MoE's sparse part (transformers' `Lfm2MoeConfig` defaults where a key is absent).
fn moe_shape(cfg: &ModelConfig, layers: usize) -> Result<MoeShape> {
    let experts = cfg.width("num_experts")?;
    Ok(MoeShape {
        experts,
        top_k: cfg.usize_in("num_experts_per_tok", 1..=experts)?,
        expert_width: cfg.width("moe_intermediate_size")?,
        dense_layers: cfg.usize_in_or("num_dense_layers", 2.min(layers), 0..=layers)?,
        dense_width: cfg.width("intermediate_size")?,
        renormalize: cfg.bool_or("norm_topk_prob", true)?,
        expert_bias: cfg.bool_or("use_expert_bias", true)?,
        scale: cfg.f64_where("routed_scaling_factor", 1.0, "a positive number", |x| {
            x > 0.0 && x.is_finite()
        })? as f32,
    })
}

/// Which layers are attention: `layer_types` and `full_attn_idxs` (either; both must agree when
/// both are given), else all of them (transformers' default).
fn layer_kinds(cfg: &ModelConfig, layers: usize) -> Result<Vec<bool>> {
    let file = cfg.path();
    let file = file.display();
    let from_types = match cfg.opt("layer_types") {
        None => None,
        Some(v) => {
            let Some(types) = v.as_array().filter(|t| t.len() == layers) else {
                bail!("{file}: field `layer_types` must be a list of {layers} strings (one per layer)");
            };
            let mut kinds = Vec::with_capacity(layers);
            for (i, t) in types.iter().enumerate() {
                kinds.push(match t.as_str() {
                    Some("full_attention") => true,
                    Some("conv") => false,
                    _ => bail!("{file}: field `layer_types[{i}]` must be \"conv\" or \"full_attention\", got {t}"),
                });
            }
            Some(kinds)
        }
    };
    let from_idxs = match cfg.opt("full_attn_idxs") {
        None => None,
        Some(v) => {
            let Some(idxs) = v.as_array() else {
                bail!("{file}: field `full_attn_idxs` must be a list of layer indices");
            };
            let mut kinds = vec![false; layers];
            for (i, idx) in idxs.iter().enumerate() {
                match idx.as_u64().map(|n| n as usize) {
                    Some(n) if n < layers => kinds[n] = true,
                    _ => bail!("{file}: field `full_attn_idxs[{i}]` must be a layer index below {layers}, got {idx}"),
                }
            }
            Some(kinds)
        }
    };
    match (from_types, from_idxs) {
        (Some(t), Some(i)) if t != i => {
            bail!("{file}: fields `layer_types` and `full_attn_idxs` describe different layers")
        }
        (Some(k), _) | (None, Some(k)) => Ok(k),
        (None, None) => Ok(vec![true; layers]),
    }
}

/// RoPE over the whole head; θ from `rope_parameters` when it has one (mlx-lm and transformers
/// both prefer it), else `rope_theta`.
fn rope(cfg: &ModelConfig, head_dim: usize) -> Result<Rope> {
    let file = cfg.path();
    let params = cfg.opt("rope_parameters");
    let kind = params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    if kind != "default" {
        bail!(
            "{}: field `rope_parameters.rope_type` = {kind:?} is not supported",
            file.display()
        );
    }
    let theta = match params.and_then(|p| p.get("rope_theta")) {
        Some(v) => {
            let t = v.as_f64().unwrap_or(f64::NAN);
            crate::config::limits::check_rope_theta(cfg, "rope_parameters.rope_theta", t)?
        }
        None => cfg.rope_theta(1_000_000.0)?,
    };
    Ok(Rope::new(theta, head_dim, RopeLayout::HalfSplit))
}

/// The feed-forward width. With `block_auto_adjust_ff_dim` (default true) the configured width
/// `block_ff_dim` (or `intermediate_size`) becomes `int(2·w/3)`, times
/// `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`. mlx-lm rounds up even without
/// a multiplier, transformers only with one; when the two differ the stored `w1` decides.
pub fn ff_width(cfg: &ModelConfig, stored_rows: Option<usize>) -> Result<usize> {
    let file = cfg.path();
    let file = file.display();
    let base = match cfg.opt("block_ff_dim") {
        Some(_) => cfg.width("block_ff_dim")?,
        None => cfg.width("intermediate_size")?,
    };
    if !cfg.bool_or("block_auto_adjust_ff_dim", true)? {
        return Ok(base);
    }
    let multiple = cfg.width_or("block_multiple_of", 256)?;
    let multiplier = match cfg.opt("block_ffn_dim_multiplier") {
        None => None,
        Some(_) => Some(cfg.f64_where(
            "block_ffn_dim_multiplier",
            1.0,
            "a positive number",
            |x| x > 0.0,
        )?),
    };
    let two_thirds = 2 * base / 3;
    let round_up = |w: usize| w.div_ceil(multiple) * multiple;
    let (mlx, hf) = match multiplier {
        Some(m) => {
            let w = round_up((m * two_thirds as f64) as usize);
            (w, w)
        }
        None => (round_up(two_thirds), two_thirds),
    };
    let width = match stored_rows {
        Some(rows) if rows == mlx || rows == hf => rows,
        Some(rows) => bail!(
            "{file}: the feed-forward width from `block_ff_dim`/`intermediate_size` ({base}) and its adjustment is {mlx}{}, but `w1` has {rows} rows",
            if hf != mlx { format!(" (or {hf})") } else { String::new() }
        ),
        None => mlx,
    };
    ensure!(
        width > 0 && width <= crate::config::limits::MAX_WIDTH,
        "{file}: the adjusted feed-forward width {width} is out of range"
    );
    Ok(width)
}

pub struct Lfm2 {
    info: ModelInfo,
    embed: Weight,
    blocks: Vec<Block>,
    embedding_norm: RmsNorm,
    lm_head: Weight,
    kv_heads: usize,
    head_dim: usize,
}

impl Lfm2 {
    pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Lfm2> {
        let s = Shape::read(cfg)?;
        let quant = &cfg.quant;
        let lin = |name: &str, out, inp| Linear::load(store, quant, name, out, inp);
        let inter = match &s.moe {
            Some(m) => m.dense_width,
            None => {
                let w1 = "model.layers.0.feed_forward.w1.weight";
                ff_width(
                    cfg,
                    store.info(w1).and_then(|(_, shape)| shape.first().copied()),
                )?
            }
        };
        let embed = store.weight(
            "model.embed_tokens",
            quant.spec_for("model.embed_tokens"),
            s.vocab,
            s.hidden,
        )?;
        let mut blocks = Vec::with_capacity(s.layers);
        for (i, &attention) in s.attention.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let norm = |name: &str, dim| RmsNorm::load(store, &format!("{p}.{name}"), dim, s.eps);
            let mixer = if attention {
                let a = format!("{p}.self_attn");
                let (h, kvh, d) = (s.heads, s.kv_heads, s.head_dim);
                Mixer::Attention(GqaAttention {
                    cfg: AttentionConfig {
                        heads: h,
                        kv_heads: kvh,
                        head_dim: d,
                        scale: 1.0 / (d as f32).sqrt(),
                        window: None,
                        softcap: None,
                    },
                    q_proj: lin(&format!("{a}.q_proj"), h * d, s.hidden)?,
                    k_proj: lin(&format!("{a}.k_proj"), kvh * d, s.hidden)?,
                    v_proj: lin(&format!("{a}.v_proj"), kvh * d, s.hidden)?,
                    o_proj: lin(&format!("{a}.out_proj"), s.hidden, h * d)?,
                    q_norm: Some(norm("self_attn.q_layernorm.weight", d)?),
                    k_norm: Some(norm("self_attn.k_layernorm.weight", d)?),
                    rope: s.rope.clone(),
                    output_gate: false,
                })
            } else {
                Mixer::Conv(ShortConv::load(
                    store,
                    quant,
                    &format!("{p}.conv"),
                    s.hidden,
                    s.conv_kernel,
                    s.conv_bias,
                )?)
            };
            let ff = format!("{p}.feed_forward");
            let feed_forward = match &s.moe {
                Some(m) if i >= m.dense_layers => {
                    FeedForward::Sparse(SigmoidMoe::load(store, quant, &ff, s.hidden, m)?)
                }
                // mlx-lm's LFM2-MoE conversion renames `w1/w3/w2`; LFM2's keeps them.
                _ if !store.contains(&format!("{ff}.w1.weight"))
                    && store.contains(&format!("{ff}.gate_proj.weight")) =>
                {
                    FeedForward::Dense(SwiGlu::load(store, quant, &ff, s.hidden, inter)?)
                }
                _ => FeedForward::Dense(SwiGlu {
                    gate: lin(&format!("{ff}.w1"), inter, s.hidden)?,
                    up: lin(&format!("{ff}.w3"), inter, s.hidden)?,
                    down: lin(&format!("{ff}.w2"), s.hidden, inter)?,
                }),
            };
            blocks.push(Block {
                operator_norm: norm("operator_norm.weight", s.hidden)?,
                mixer,
                ffn_norm: norm("ffn_norm.weight", s.hidden)?,
                feed_forward,
            });
        }
        let embedding_norm = RmsNorm::load(store, "model.embedding_norm.weight", s.hidden, s.eps)?;
        // mlx-lm always multiplies by the embedding; transformers uses `lm_head` only when the
        // config unties it.
        let lm_head = if s.tied {
            embed.clone()
        } else {
            store.weight("lm_head", quant.spec_for("lm_head"), s.vocab, s.hidden)?
        };

        let mut all: Vec<&Weight> = vec![&embed];
        let mut parameters = embed.numel() + embedding_norm.weight.numel();
        for b in &blocks {
            all.extend(b.weights());
            parameters += b.other_parameters();
        }
        if !s.tied {
            all.push(&lm_head);
        }
        parameters += all[1..].iter().map(|w| w.numel()).sum::<usize>();
        let moe = s.moe.map(|m| {
            let experts: Vec<&Weight> = blocks
                .iter()
                .filter_map(|b| match &b.feed_forward {
                    FeedForward::Sparse(x) => Some(x.experts.weights()),
                    FeedForward::Dense(_) => None,
                })
                .flatten()
                .collect();
            let widths = (m.experts, m.top_k, m.expert_width, 0);
            super::moe_info(widths, &experts, &all, parameters)
        });
        let info = ModelInfo {
            family: if moe.is_some() { "lfm2_moe" } else { "lfm2" }.into(),
            parameters,
            weight_formats: super::formats(all),
            layer_kinds: s
                .attention
                .iter()
                .map(|&a| if a { "full_attention" } else { "conv" }.to_string())
                .collect(),
            context_length: s.context,
            vocab_size: s.vocab,
            hidden_size: s.hidden,
            moe,
        };
        Ok(Lfm2 {
            info,
            embed,
            blocks,
            embedding_norm,
            lm_head,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
        })
    }
}

impl CausalLm for Lfm2 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        ModelState::new(
            self.blocks
                .iter()
                .map(|b| match &b.mixer {
                    Mixer::Conv(c) => LayerState::Conv(c.new_state()),
                    Mixer::Attention(_) => {
                        LayerState::Kv(KvCache::new(self.kv_heads, self.head_dim, 0))
                    }
                })
                .collect(),
        )
    }

    fn device(&self) -> kernels::Device {
        self.embed.device()
    }

    fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        super::embed_and_head_to_device(&mut self.embed, &mut self.lm_head, device)?;
        self.embedding_norm.to_device(device)?;
        for b in &mut self.blocks {
            b.move_to(device)?;
        }
        Ok(())
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        ensure!(
            state.layers.len() == self.blocks.len(),
            "the state has {} layers but the model {} (a state from another model?)",
            state.layers.len(),
            self.blocks.len()
        );
        let mut x = ops::embedding(&self.embed, ids)?;
        for (block, layer) in self.blocks.iter().zip(state.layers.iter_mut()) {
            x = block.forward(&x, layer)?;
        }
        state.pos += ids.len();
        super::lm_logits(&x, &self.embedding_norm, &self.lm_head, all_logits)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config(extra: serde_json::Value) -> ModelConfig {
        let mut root = json!({"model_type": "lfm2", "num_hidden_layers": 4});
        for (k, v) in extra.as_object().unwrap() {
            root[k] = v.clone();
        }
        ModelConfig::from_value(std::path::Path::new("/x"), root).unwrap()
    }

    #[test]
    fn ff_width_follows_both_references() {
        // LFM2-350M: int(2·6656/3) = 4437, ×1.0, rounded up to 256.
        let c = config(json!({"block_ff_dim": 6656, "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": true}));
        assert_eq!(ff_width(&c, None).unwrap(), 4608);
        assert_eq!(ff_width(&c, Some(4608)).unwrap(), 4608);
        assert!(ff_width(&c, Some(4437)).is_err());
        // No multiplier: mlx-lm rounds (4608), transformers does not (4437); w1 decides.
        let c = config(json!({"block_ff_dim": 6656, "block_auto_adjust_ff_dim": true}));
        assert_eq!(ff_width(&c, Some(4437)).unwrap(), 4437);
        assert_eq!(ff_width(&c, Some(4608)).unwrap(), 4608);
        // Not adjusted: the width as given; `block_ff_dim` wins over `intermediate_size`.
        let c = config(json!({"block_ff_dim": 10752, "intermediate_size": 1,
            "block_auto_adjust_ff_dim": false}));
        assert_eq!(ff_width(&c, None).unwrap(), 10752);
    }

    #[test]
    fn layer_kinds_from_either_field() {
        let idxs = config(json!({"full_attn_idxs": [1, 3]}));
        assert_eq!(layer_kinds(&idxs, 4).unwrap(), [false, true, false, true]);
        let types = config(json!({"layer_types": ["conv", "full_attention", "conv", "conv"]}));
        assert_eq!(layer_kinds(&types, 4).unwrap(), [false, true, false, false]);
        let both = config(json!({"full_attn_idxs": [1],
            "layer_types": ["conv", "full_attention", "conv", "full_attention"]}));
        assert!(layer_kinds(&both, 4).is_err());
        let bad = config(json!({"full_attn_idxs": [4]}));
        assert!(layer_kinds(&bad, 4).is_err());
        assert_eq!(layer_kinds(&config(json!({})), 4).unwrap(), [true; 4]);
    }
}

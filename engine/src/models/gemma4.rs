//! Gemma 4 text (`gemma4` with a nested `text_config`, or `gemma4_text`), dense and MoE.
//!
//! Facts checked against mlx-lm 0.32.2 (`gemma4_text.py`, `gemma4.py`, `rope_utils.py`):
//! - layer kinds from `layer_types`, else `sliding_window_pattern` (p − 1 sliding, then one
//!   full); sliding layers attend to the last `sliding_window` positions;
//! - full layers may have their own head dim (`global_head_dim`), KV heads
//!   (`num_global_key_value_heads` with `attention_k_eq_v`, where V is K's projection) and RoPE:
//!   `rope_parameters.{full,sliding}_attention`, the full one "proportional" — frequencies
//!   `factor·θ^(2i/head_dim)` on the first `partial_rotary_factor·head_dim / 2` pairs of the
//!   half-split head, the other pairs unrotated;
//! - attention scale 1; q and k RMSNorm per head, v RMSNorm without a weight;
//! - the last `num_kv_shared_layers` layers compute no K/V: each reads the cache of the last
//!   earlier layer of its kind, and has a double-wide MLP when `use_double_wide_mlp`;
//! - sandwich norms around attention and MLP; GeGLU (tanh GELU) MLP; `layer_scalar` multiplies
//!   each layer's output;
//! - per-layer inputs (`hidden_size_per_layer_input`): a per-layer embedding table plus a
//!   projection of the scaled embeddings, normed and mixed, gate each layer's output;
//! - embeddings × √hidden, tied head, logits soft-capped `c·tanh(x/c)`.
//! - the MoE variant (`enable_moe_block`): a routed expert branch beside the dense MLP (see
//!   [`MoeBranch`]).
//!
//! Names: `language_model.model.*` in mlx-lm folders, `model.language_model.*` in original
//! multimodal ones, `model.*` in text-only ones (Qwen3.5's [`Layout`]). Original folders keep
//! K/V projections on the KV-shared layers; they are unused and not loaded, as mlx-lm drops them.
//! Sliding layers keep a rotating cache (`KvCache::rotating`: at most 2 × the window between
//! forwards), full layers a flat one.

use anyhow::{bail, ensure, Context, Result};
use kernels::{ops, ops::AttnParams, ops::RopeLayout, Tensor, Weight};
use serde_json::Value;

use super::qwen3_5::Layout;
use super::{CausalLm, ModelInfo};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::config::{limits::check_rope_theta, ModelConfig};
use crate::layers::{Linear, RmsNorm, Rope, StackedExperts};
use crate::weights::WeightStore;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sliding,
    Full,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Sliding => "sliding_attention",
            Kind::Full => "full_attention",
        }
    }
}

struct Attention {
    q_proj: Linear,
    /// `None` on KV-shared layers.
    kv: Option<KvProj>,
    o_proj: Linear,
    q_norm: RmsNorm,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    eps: f32,
}

struct KvProj {
    k_proj: Linear,
    /// `None` when V is K's projection (`attention_k_eq_v` on full layers).
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
}

/// The per-layer input gate of the E2B/E4B-style models.
struct PerLayerGate {
    input_gate: Linear,
    projection: Linear,
    post_norm: RmsNorm,
}

struct Block {
    attn: Attention,
    /// Index of the layer whose cache this one reads (itself unless KV-shared).
    kv_source: usize,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ffn_norm: RmsNorm,
    post_ffn_norm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    per_layer: Option<PerLayerGate>,
    layer_scalar: Option<f32>,
    moe: Option<MoeBranch>,
}

/// The sparse branch of the MoE variant (`enable_moe_block`, 26B-A4B style), summed with the
/// dense MLP's output before `post_feedforward_layernorm`. Facts from mlx-lm 0.32
/// `gemma4_text.py` (`Router`, `Experts`, `DecoderLayer`).
struct MoeBranch {
    /// RMSNorm of the residual stream with gain `router.scale · hidden^-½`.
    router_norm: RmsNorm,
    /// `router.proj` `[experts, hidden]` (8-bit in quantized MLX folders).
    router: Linear,
    /// `router.per_expert_scale`, applied to the top-k weights after their softmax.
    per_expert_scale: Vec<f32>,
    experts: StackedExperts,
    top_k: usize,
    /// `pre_feedforward_layernorm_2`: the experts' input norm.
    pre_norm: RmsNorm,
    /// `post_feedforward_layernorm_1`: the dense MLP's output norm.
    post_dense_norm: RmsNorm,
    /// `post_feedforward_layernorm_2`: the experts' output norm.
    post_norm: RmsNorm,
}

impl MoeBranch {
    fn load(
        store: &WeightStore,
        cfg: &ModelConfig,
        p: &str,
        (hidden, experts, top_k, width, eps): (usize, usize, usize, usize, f32),
    ) -> Result<MoeBranch> {
        let scale_name = format!("{p}.router.scale");
        let gain = (hidden as f32).powf(-0.5);
        let scale: Vec<f32> = store
            .f32_values(&scale_name, &[hidden])?
            .iter()
            .map(|v| v * gain)
            .collect();
        let pes_name = format!("{p}.router.per_expert_scale");
        let per_expert_scale = store.f32_values(&pes_name, &[experts])?;
        ensure!(
            per_expert_scale.iter().chain(&scale).all(|v| v.is_finite()),
            "{}: `{scale_name}` or `{pes_name}` holds a value that is not finite",
            store.dir().display()
        );
        let norm = |name: &str| RmsNorm::load(store, &format!("{p}.{name}.weight"), hidden, eps);
        let stacked = StackedExperts::load(
            store,
            &cfg.quant,
            (&format!("{p}.experts.switch_glu"), &format!("{p}.experts")),
            (experts, hidden, width),
            true,
        )?;
        Ok(MoeBranch {
            router_norm: RmsNorm {
                weight: Tensor::from_f32(&[hidden], scale)?,
                eps,
            },
            router: Linear::load(
                store,
                &cfg.quant,
                &format!("{p}.router.proj"),
                experts,
                hidden,
            )?,
            per_expert_scale,
            experts: stacked,
            top_k,
            pre_norm: norm("pre_feedforward_layernorm_2")?,
            post_dense_norm: norm("post_feedforward_layernorm_1")?,
            post_norm: norm("post_feedforward_layernorm_2")?,
        })
    }

    /// `dense` is the dense MLP's output, `x` the residual stream; returns their sum.
    fn forward(&self, x: &Tensor, dense: &Tensor) -> Result<Tensor> {
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

    fn upload(&mut self, device: kernels::Device) -> Result<()> {
        self.router.to_device(device)?;
        self.router_norm.to_device(device)?;
        self.experts.to_device(device)?;
        for n in [
            &mut self.pre_norm,
            &mut self.post_dense_norm,
            &mut self.post_norm,
        ] {
            n.to_device(device)?;
        }
        Ok(())
    }
}

/// The model-level half of the per-layer inputs.
struct PerLayerInputs {
    embed: Weight,
    model_projection: Linear,
    projection_norm: RmsNorm,
    width: usize,
}

pub struct Gemma4 {
    info: ModelInfo,
    embed: Weight,
    blocks: Vec<Block>,
    norm: RmsNorm,
    per_layer: Option<PerLayerInputs>,
    softcap: Option<f32>,
    hidden: usize,
}

fn layer_kinds(cfg: &ModelConfig, layers: usize) -> Result<Vec<Kind>> {
    let file = cfg.path();
    if let Some(types) = cfg.opt("layer_types") {
        let types = types
            .as_array()
            .filter(|t| t.len() == layers)
            .with_context(|| {
                format!(
                    "{}: field `layer_types` must be a list of {layers} layer kinds",
                    file.display()
                )
            })?;
        return types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("sliding_attention") => Ok(Kind::Sliding),
                Some("full_attention") => Ok(Kind::Full),
                _ => bail!(
                    "{}: field `layer_types[{i}]` = {t} is not a layer kind (sliding_attention, full_attention)",
                    file.display()
                ),
            })
            .collect();
    }
    let pattern = cfg.usize_in_or(
        "sliding_window_pattern",
        5,
        1..=crate::config::limits::MAX_LAYERS,
    )?;
    Ok((0..layers)
        .map(|i| {
            if (i + 1).is_multiple_of(pattern) {
                Kind::Full
            } else {
                Kind::Sliding
            }
        })
        .collect())
}

/// The RoPE of one layer kind from `rope_parameters.<kind>` (mlx-lm's defaults when absent).
fn rope_for(cfg: &ModelConfig, kind: Kind, head_dim: usize) -> Result<Rope> {
    let file = cfg.path();
    let params = cfg.opt("rope_parameters").and_then(|p| p.get(kind.name()));
    let field = |key: &str| format!("rope_parameters.{}.{key}", kind.name());
    let num = |key: &str, default: f64| -> Result<f64> {
        match params.and_then(|p| p.get(key)).filter(|v| !v.is_null()) {
            None => Ok(default),
            Some(v) => v.as_f64().filter(|x| x.is_finite()).with_context(|| {
                format!(
                    "{}: field `{}` must be a number, got {v}",
                    file.display(),
                    field(key)
                )
            }),
        }
    };
    let (default_theta, default_type, default_partial) = match kind {
        Kind::Full => (1e6, "proportional", 0.25),
        Kind::Sliding => (1e4, "default", 1.0),
    };
    let theta = check_rope_theta(cfg, &field("rope_theta"), num("rope_theta", default_theta)?)?;
    let kind_name = params
        .and_then(|p| p.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or(default_type);
    match kind_name {
        "default" => Ok(Rope::new(theta, head_dim, RopeLayout::HalfSplit)),
        "proportional" => {
            let partial = num("partial_rotary_factor", default_partial)?;
            let factor = num("factor", 1.0)?;
            ensure!(
                (0.0..=1.0).contains(&partial) && factor > 0.0,
                "{}: fields `{}` ({partial}) must be in [0, 1] and `{}` ({factor}) positive",
                file.display(),
                field("partial_rotary_factor"),
                field("factor")
            );
            let rotated_pairs = (head_dim as f64 * partial) as usize / 2;
            let inv_freq = (0..head_dim / 2)
                .map(|i| {
                    if i < rotated_pairs {
                        let exponent = (2 * i) as f64 / head_dim as f64;
                        (1.0 / (factor * theta.powf(exponent))) as f32
                    } else {
                        0.0 // an unrotated pair
                    }
                })
                .collect();
            Ok(Rope {
                inv_freq,
                layout: RopeLayout::HalfSplit,
                base: None,
            })
        }
        other => bail!(
            "{}: field `{}` = {other:?} is not supported (default, proportional)",
            file.display(),
            field("rope_type")
        ),
    }
}

impl Gemma4 {
    pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Gemma4> {
        let file = cfg.path();
        let layout = Layout::detect(store)?;
        let mp = layout.model_prefix();
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", 1)?;
        let head_dim = cfg.width("head_dim")?;
        let global_head_dim = cfg.width_or("global_head_dim", head_dim)?;
        let k_eq_v = cfg.bool_or("attention_k_eq_v", false)?;
        let global_kv_heads = if k_eq_v {
            cfg.width_or("num_global_key_value_heads", kv_heads)?
        } else {
            kv_heads
        };
        let inter = cfg.width("intermediate_size")?;
        let vocab = cfg.vocab_size()?;
        let eps = cfg.rms_norm_eps(1e-6)?;
        let context = cfg.context_length(131_072)?;
        let kinds = layer_kinds(cfg, layers)?;
        let window = cfg.width_or("sliding_window", 512)?;
        let shared = cfg.usize_in_or("num_kv_shared_layers", 0, 0..=layers - 1)?;
        let double_wide = cfg.bool_or("use_double_wide_mlp", true)?;
        let softcap = match cfg.opt("final_logit_softcapping") {
            None => None,
            Some(_) => Some(cfg.f64_where(
                "final_logit_softcapping",
                30.0,
                "a positive number",
                |x| x > 0.0,
            )? as f32),
        };
        for (h, kv, what) in [
            (heads, kv_heads, "num_key_value_heads"),
            (heads, global_kv_heads, "num_global_key_value_heads"),
        ] {
            ensure!(
                h % kv == 0,
                "{}: field `num_attention_heads` ({h}) must be a multiple of `{what}` ({kv})",
                file.display()
            );
        }
        for (d, what) in [(head_dim, "head_dim"), (global_head_dim, "global_head_dim")] {
            ensure!(
                d % 2 == 0,
                "{}: field `{what}` ({d}) must be even",
                file.display()
            );
        }
        let moe = if cfg.bool_or("enable_moe_block", false)? {
            let experts = cfg.width("num_experts")?;
            let top_k = cfg.usize_in("top_k_experts", 1..=experts)?;
            Some((experts, top_k, cfg.width("moe_intermediate_size")?))
        } else {
            None
        };
        let first_shared = layers - shared;
        // A shared layer reads the last non-shared layer of its kind.
        let mut kv_source: Vec<usize> = (0..layers).collect();
        for j in first_shared..layers {
            kv_source[j] = (0..first_shared)
                .rev()
                .find(|&i| kinds[i] == kinds[j])
                .with_context(|| {
                    format!(
                        "{}: layer {j} shares the KV of an earlier {} layer, and there is none before layer {first_shared} (`num_kv_shared_layers` = {shared})",
                        file.display(),
                        kinds[j].name()
                    )
                })?;
        }

        let quant = &cfg.quant;
        let embed_name = format!("{mp}.embed_tokens");
        let embed = store.weight(&embed_name, quant.spec_for(&embed_name), vocab, hidden)?;
        let per_layer_name = format!("{mp}.embed_tokens_per_layer");
        let per_layer = if store.contains(&format!("{per_layer_name}.weight")) {
            let width = cfg.width("hidden_size_per_layer_input")?;
            let rows = cfg.width_or("vocab_size_per_layer_input", vocab)?;
            let wide = layers
                .checked_mul(width)
                .filter(|&w| w <= crate::config::limits::MAX_WIDTH)
                .with_context(|| {
                    format!(
                        "{}: `num_hidden_layers` × `hidden_size_per_layer_input` is too large",
                        file.display()
                    )
                })?;
            let proj = format!("{mp}.per_layer_model_projection");
            Some(PerLayerInputs {
                embed: store.weight(
                    &per_layer_name,
                    quant.spec_for(&per_layer_name),
                    rows,
                    wide,
                )?,
                model_projection: Linear::load(store, quant, &proj, wide, hidden)?,
                projection_norm: RmsNorm::load(
                    store,
                    &format!("{mp}.per_layer_projection_norm.weight"),
                    width,
                    eps,
                )?,
                width,
            })
        } else {
            None
        };

        let mut blocks = Vec::with_capacity(layers);
        for (i, &kind) in kinds.iter().enumerate() {
            let p = format!("{mp}.layers.{i}");
            let full = kind == Kind::Full;
            let (hd, kvh) = if full {
                (global_head_dim, global_kv_heads)
            } else {
                (head_dim, kv_heads)
            };
            let lin =
                |name: &str, out, inp| Linear::load(store, quant, &format!("{p}.{name}"), out, inp);
            let norm = |name: &str, n| RmsNorm::load(store, &format!("{p}.{name}.weight"), n, eps);
            let kv = if i < first_shared {
                Some(KvProj {
                    k_proj: lin("self_attn.k_proj", kvh * hd, hidden)?,
                    v_proj: if full && k_eq_v {
                        None
                    } else {
                        Some(lin("self_attn.v_proj", kvh * hd, hidden)?)
                    },
                    k_norm: norm("self_attn.k_norm", hd)?,
                })
            } else {
                None
            };
            let width = if i >= first_shared && double_wide {
                2 * inter
            } else {
                inter
            };
            let scalar_name = format!("{p}.layer_scalar");
            let layer_scalar = if store.contains(&scalar_name) {
                let v = store.f32_values(&scalar_name, &[1])?[0];
                ensure!(
                    v.is_finite(),
                    "{}: tensor `{scalar_name}` is not finite ({v})",
                    store.dir().display()
                );
                Some(v)
            } else {
                None
            };
            let per_layer_gate = match &per_layer {
                Some(pl) => Some(PerLayerGate {
                    input_gate: lin("per_layer_input_gate", pl.width, hidden)?,
                    projection: lin("per_layer_projection", hidden, pl.width)?,
                    post_norm: norm("post_per_layer_input_norm", hidden)?,
                }),
                None => None,
            };
            blocks.push(Block {
                attn: Attention {
                    q_proj: lin("self_attn.q_proj", heads * hd, hidden)?,
                    kv,
                    o_proj: lin("self_attn.o_proj", hidden, heads * hd)?,
                    q_norm: norm("self_attn.q_norm", hd)?,
                    rope: rope_for(cfg, kind, hd)?,
                    heads,
                    kv_heads: kvh,
                    head_dim: hd,
                    window: (!full).then_some(window),
                    eps,
                },
                kv_source: kv_source[i],
                input_norm: norm("input_layernorm", hidden)?,
                post_attn_norm: norm("post_attention_layernorm", hidden)?,
                pre_ffn_norm: norm("pre_feedforward_layernorm", hidden)?,
                post_ffn_norm: norm("post_feedforward_layernorm", hidden)?,
                gate_proj: lin("mlp.gate_proj", width, hidden)?,
                up_proj: lin("mlp.up_proj", width, hidden)?,
                down_proj: lin("mlp.down_proj", hidden, width)?,
                per_layer: per_layer_gate,
                layer_scalar,
                moe: match moe {
                    Some((e, k, w)) => {
                        Some(MoeBranch::load(store, cfg, &p, (hidden, e, k, w, eps))?)
                    }
                    None => None,
                },
            });
        }
        let norm = RmsNorm::load(store, &format!("{mp}.norm.weight"), hidden, eps)?;
        ensure!(
            !store.contains(&format!("{}.weight", layout.lm_head())),
            "{}: Gemma 4 ties its head to the embedding, but `{}.weight` is stored",
            store.dir().display(),
            layout.lm_head()
        );

        let mut weights: Vec<&Weight> = vec![&embed];
        let mut parameters = embed.numel() + hidden;
        if let Some(pl) = &per_layer {
            weights.extend([&pl.embed, &pl.model_projection.weight]);
            parameters += pl.embed.numel() + pl.model_projection.weight.numel() + pl.width;
        }
        for b in &blocks {
            let mut lins = vec![
                &b.attn.q_proj,
                &b.attn.o_proj,
                &b.gate_proj,
                &b.up_proj,
                &b.down_proj,
            ];
            if let Some(kv) = &b.attn.kv {
                lins.push(&kv.k_proj);
                lins.extend(&kv.v_proj);
                parameters += kv.k_norm.weight.numel();
            }
            if let Some(g) = &b.per_layer {
                lins.extend([&g.input_gate, &g.projection]);
                parameters += hidden;
            }
            for l in lins {
                weights.push(&l.weight);
                parameters += l.weight.numel();
            }
            parameters += 4 * hidden + b.attn.head_dim + usize::from(b.layer_scalar.is_some());
            if let Some(m) = &b.moe {
                weights.push(&m.router.weight);
                weights.extend(m.experts.weights());
                parameters += m.router.weight.numel() + 4 * hidden + m.per_expert_scale.len();
                parameters += m.experts.weights().iter().map(|w| w.numel()).sum::<usize>();
            }
        }
        let moe_info = moe.map(|(e, k, w)| {
            let experts: Vec<&Weight> = blocks
                .iter()
                .filter_map(|b| b.moe.as_ref())
                .flat_map(|m| m.experts.weights())
                .collect();
            super::moe_info((e, k, w, 0), &experts, &weights, parameters)
        });
        let layer_kinds = blocks
            .iter()
            .zip(&kinds)
            .enumerate()
            .map(|(i, (b, k))| {
                let mut s = match k {
                    Kind::Sliding => format!("sliding_attention({window})"),
                    Kind::Full => "full_attention".to_string(),
                };
                if b.kv_source != i {
                    s.push_str(&format!(" kv-shared from {}", b.kv_source));
                }
                s
            })
            .collect();
        let info = ModelInfo {
            family: "gemma4".into(),
            parameters,
            weight_formats: super::formats(weights),
            layer_kinds,
            context_length: context,
            vocab_size: vocab,
            hidden_size: hidden,
            moe: moe_info,
        };
        Ok(Gemma4 {
            info,
            embed,
            blocks,
            norm,
            per_layer,
            softcap,
            hidden,
        })
    }

    /// Each layer's `[T, width]` input from the per-layer tables and the scaled embeddings.
    fn per_layer_inputs(&self, ids: &[u32], h: &Tensor) -> Result<Option<Vec<Tensor>>> {
        let Some(pl) = &self.per_layer else {
            return Ok(None);
        };
        let (t, l, w) = (ids.len(), self.blocks.len(), pl.width);
        let table = ops::scale(&ops::embedding(&pl.embed, ids)?, (w as f32).sqrt())?;
        let proj = ops::scale(
            &pl.model_projection.forward(h)?,
            (self.hidden as f32).powf(-0.5),
        )?;
        let proj = pl.projection_norm.forward(&proj.reshape(&[t, l, w])?)?;
        let mixed = ops::scale(
            &ops::add(&proj, &table.reshape(&[t, l, w])?)?,
            std::f32::consts::FRAC_1_SQRT_2,
        )?;
        (0..l)
            .map(|i| Ok(mixed.narrow(1, i, 1)?.reshape(&[t, w])?))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

impl Attention {
    /// Moves the weights to `device` once (at load).
    fn upload(&mut self, device: kernels::Device) -> Result<()> {
        self.q_proj.to_device(device)?;
        self.o_proj.to_device(device)?;
        self.q_norm.to_device(device)?;
        if let Some(kv) = &mut self.kv {
            kv.k_proj.to_device(device)?;
            if let Some(v) = &mut kv.v_proj {
                v.to_device(device)?;
            }
            kv.k_norm.to_device(device)?;
        }
        Ok(())
    }

    /// Appends this step's K/V to `cache` (unless the layer is KV-shared, when `cache` is the
    /// source layer's, already holding them) and attends over it.
    fn forward(&self, x: &Tensor, start: usize, cache: &mut KvCache) -> Result<Tensor> {
        let t = x.dim(0);
        let positions: Vec<usize> = (start..start + t).collect();
        let q = self
            .q_proj
            .forward(x)?
            .reshape(&[t, self.heads, self.head_dim])?;
        let q = self.rope.forward(&self.q_norm.forward(&q)?, &positions)?;
        if let Some(kv) = &self.kv {
            let shape = [t, self.kv_heads, self.head_dim];
            let k_raw = kv.k_proj.forward(x)?.reshape(&shape)?;
            let v = match &kv.v_proj {
                Some(v) => v.forward(x)?.reshape(&shape)?,
                None => k_raw.clone(),
            };
            let k = self.rope.forward(&kv.k_norm.forward(&k_raw)?, &positions)?;
            let v = ops::rms_norm(&v, None, self.eps)?;
            cache.append(&k, &v)?;
        }
        let p = AttnParams {
            q_start: 0,
            kv_len: 0,
            scale: 1.0,
            window: self.window,
            softcap: None,
        };
        let o = cache
            .attend(&q, start, p)?
            .reshape(&[t, self.heads * self.head_dim])?;
        self.o_proj.forward(&o)
    }
}

impl CausalLm for Gemma4 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        // Sliding layers rotate (memory bounded by the window), full layers keep every
        // position; KV-shared layers keep an empty cache: they read their source layer's.
        ModelState::new(
            self.blocks
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let window = b.attn.window.filter(|_| b.kv_source == i);
                    LayerState::Kv(KvCache::for_layer(b.attn.kv_heads, b.attn.head_dim, window))
                })
                .collect(),
        )
    }

    fn device(&self) -> kernels::Device {
        self.embed.device()
    }

    fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        self.embed = self.embed.to_device(device)?;
        self.norm.to_device(device)?;
        if let Some(pl) = &mut self.per_layer {
            pl.embed = pl.embed.to_device(device)?;
            pl.model_projection.to_device(device)?;
            pl.projection_norm.to_device(device)?;
        }
        for b in &mut self.blocks {
            b.attn.upload(device)?;
            for n in [
                &mut b.input_norm,
                &mut b.post_attn_norm,
                &mut b.pre_ffn_norm,
                &mut b.post_ffn_norm,
            ] {
                n.to_device(device)?;
            }
            for l in [&mut b.gate_proj, &mut b.up_proj, &mut b.down_proj] {
                l.to_device(device)?;
            }
            if let Some(m) = &mut b.moe {
                m.upload(device)?;
            }
            if let Some(g) = &mut b.per_layer {
                g.input_gate.to_device(device)?;
                g.projection.to_device(device)?;
                g.post_norm.to_device(device)?;
            }
        }
        Ok(())
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        let start = state.pos;
        let mut x = ops::scale(
            &ops::embedding(&self.embed, ids)?,
            (self.hidden as f32).sqrt(),
        )?;
        let per_layer = self.per_layer_inputs(ids, &x)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let cache = state.layers[b.kv_source].kv_mut()?;
            let h = b.attn.forward(&b.input_norm.forward(&x)?, start, cache)?;
            x = ops::add(&x, &b.post_attn_norm.forward(&h)?)?;
            let m = b.pre_ffn_norm.forward(&x)?;
            let g = ops::gelu_tanh(&b.gate_proj.forward(&m)?)?;
            let h = b
                .down_proj
                .forward(&ops::mul(&g, &b.up_proj.forward(&m)?)?)?;
            let h = match &b.moe {
                Some(moe) => moe.forward(&x, &h)?,
                None => h,
            };
            x = ops::add(&x, &b.post_ffn_norm.forward(&h)?)?;
            if let (Some(g), Some(inputs)) = (&b.per_layer, &per_layer) {
                let gate = ops::gelu_tanh(&g.input_gate.forward(&x)?)?;
                let gate = g.projection.forward(&ops::mul(&gate, &inputs[i])?)?;
                x = ops::add(&x, &g.post_norm.forward(&gate)?)?;
            }
            if let Some(s) = b.layer_scalar {
                x = ops::scale(&x, s)?;
            }
        }
        state.pos += ids.len();
        state.settle()?;
        let tail = super::Tail {
            softcap: self.softcap,
            ..Default::default()
        };
        super::lm_logits_with(&x, &self.norm, &self.embed, all_logits, tail)
    }
}

//! Qwen3.5 dense and Qwen3.5/3.6 MoE: a hybrid of Gated DeltaNet linear attention and gated
//! full attention (three linear layers, then one full, by default), pre-norm blocks, and an
//! optional MTP head (`mtp.*`) kept for speculative decoding. The two families differ only in
//! the MLP: SwiGLU in the dense one, a sparse mixture of experts with a shared expert in every
//! layer (MTP layers included) of `qwen3_5_moe` (see [`crate::layers::moe`]).
//!
//! Facts checked against mlx-lm 0.32 (`qwen3_5.py`, `qwen3_next.py`, `gated_delta.py`) and
//! transformers 5.24 (`modeling_qwen3_5.py`, `configuration_qwen3_5.py`):
//! - a layer is full attention when `(i + 1) % full_attention_interval == 0` (mlx-lm); transformers
//!   reads `layer_types` when the config lists it, else builds it from the same rule;
//! - full attention: `q_proj` gives `[query | gate]` per head, per-head q/k RMSNorm, RoPE on the
//!   first `int(head_dim · partial_rotary_factor)` dims (half-split pairs), output ×
//!   `sigmoid(gate)` before `o_proj`; `rope_theta` and `partial_rotary_factor` live in
//!   `rope_parameters` (mlx-lm's defaults: 100000 and 0.25);
//! - tensor names: the text model sits under `language_model.model.*` (+ `language_model.lm_head`)
//!   in mlx-lm folders, `model.language_model.*` (+ top-level `lm_head`, `mtp.*`) in original
//!   multimodal ones and `model.*` (+ `lm_head`) in text-only ones — see [`Layout`].

use anyhow::{bail, ensure, Result};
use kernels::{ops, ops::RopeLayout, Tensor, Weight};
use serde_json::Value;

use super::{CausalLm, ModelInfo, MoeInfo, SelfDrafter};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::config::ModelConfig;
use crate::layers::{
    AttentionConfig, GatedDeltaNet, GdnConfig, GdnPath, GqaAttention, Linear, MoeConfig, RmsNorm,
    Rope, SparseMoe, SwiGlu,
};
use crate::weights::WeightStore;

/// Where a folder keeps the text model's tensors: the one place names are mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Written by mlx-lm: `language_model.model.*`, `language_model.lm_head`.
    Mlx,
    /// Original multimodal checkpoint: `model.language_model.*`, `lm_head`, `mtp.*`.
    Hf,
    /// Original text-only checkpoint (`Qwen3_5ForCausalLM`): `model.*`, `lm_head`, `mtp.*`.
    HfText,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::Mlx, Layout::Hf, Layout::HfText];

    /// Prefix of `embed_tokens`, `layers.N` and `norm`.
    pub fn model_prefix(self) -> &'static str {
        match self {
            Layout::Mlx => "language_model.model",
            Layout::Hf => "model.language_model",
            Layout::HfText => "model",
        }
    }

    pub fn lm_head(self) -> &'static str {
        match self {
            Layout::Mlx => "language_model.lm_head",
            Layout::Hf | Layout::HfText => "lm_head",
        }
    }

    /// mlx-lm drops `mtp.*` when converting; original folders keep it at the top level.
    pub fn mtp_prefix(self) -> &'static str {
        match self {
            Layout::Mlx => "language_model.mtp",
            Layout::Hf | Layout::HfText => "mtp",
        }
    }

    /// The layout whose embedding table the folder holds.
    pub fn detect(store: &WeightStore) -> Result<Layout> {
        for l in Layout::ALL {
            if store.contains(&format!("{}.embed_tokens.weight", l.model_prefix())) {
                return Ok(l);
            }
        }
        let tried: Vec<String> = Layout::ALL
            .iter()
            .map(|l| format!("`{}.embed_tokens.weight`", l.model_prefix()))
            .collect();
        bail!(
            "{}: no known layout of this family: none of {} is present",
            store.dir().display(),
            tried.join(", ")
        )
    }
}

/// Whether the folder stores the 1-D RMSNorm weights of the decoder (input, post-attention,
/// final, q/k norms — not the gated norm inside Gated DeltaNet) as `w − 1`. Original checkpoints
/// do (transformers' `Qwen3_5RMSNorm` computes `x̂·(1 + w)`); mlx-lm adds the 1 when it converts.
/// mlx-lm decides exactly as here: a conv1d weight whose last axis is not 1 is still in the
/// original `[C, 1, K]` layout, so the folder was never converted and its norms need `+1`.
pub fn norms_are_offset(store: &WeightStore, layout: Layout) -> bool {
    let layers = format!("{}.layers.", layout.model_prefix());
    store.names().iter().any(|n| {
        n.starts_with(&layers)
            && n.ends_with("conv1d.weight")
            && store
                .info(n)
                .is_some_and(|(_, shape)| shape.last() != Some(&1))
    })
}

/// Token mixer of one decoder layer. One per layer, so the variants' size difference costs
/// nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Mixer {
    Linear(GatedDeltaNet),
    Full(GqaAttention),
}

/// The MLP of a decoder layer: dense SwiGLU (`qwen3_5`) or sparse experts (`qwen3_5_moe`).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Mlp {
    Dense(SwiGlu),
    Sparse(SparseMoe),
}

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Dense(m) => m.forward(x),
            Mlp::Sparse(m) => m.forward(x),
        }
    }

    /// [`Mlp::forward`] for rows of separate sequences, each equal to its row alone: dense
    /// MLPs batch the rows; sparse ones run row by row (rows sharing an expert would otherwise
    /// meet in one larger expert matmul, which rounds differently).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Dense(m) => m.forward_rows(x),
            Mlp::Sparse(m) => {
                let rows = (0..x.dim(0))
                    .map(|i| m.forward(&x.narrow0(i, 1)?))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Tensor::cat0(&rows.iter().collect::<Vec<_>>())?)
            }
        }
    }

    pub fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        match self {
            Mlp::Dense(m) => m.to_device(device),
            Mlp::Sparse(m) => m.to_device(device),
        }
    }

    fn weights(&self) -> Vec<&Weight> {
        match self {
            Mlp::Dense(m) => vec![&m.gate.weight, &m.up.weight, &m.down.weight],
            Mlp::Sparse(m) => m.weights(),
        }
    }
}

/// One pre-norm decoder layer: `x + mixer(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub mixer: Mixer,
    pub post_norm: RmsNorm,
    pub mlp: Mlp,
}

impl DecoderLayer {
    pub fn forward(&self, x: &Tensor, state: &mut LayerState, gdn: GdnPath) -> Result<Tensor> {
        let h = self.input_norm.forward(x)?;
        let h = match &self.mixer {
            Mixer::Linear(g) => g.forward(&h, state.recurrent_mut()?, gdn)?,
            Mixer::Full(a) => a.forward(&h, state.kv_mut()?)?,
        };
        let x = ops::add(x, &h)?;
        let h = self.mlp.forward(&self.post_norm.forward(&x)?)?;
        Ok(ops::add(&x, &h)?)
    }

    /// One decode step of several sequences (row `i` of `x` is sequence `i`'s token, `states`
    /// their states of this layer); each row equals that sequence's [`DecoderLayer::forward`].
    pub fn forward_batch(
        &self,
        x: &Tensor,
        states: &mut [&mut LayerState],
        gdn: GdnPath,
    ) -> Result<Tensor> {
        let h = self.input_norm.forward(x)?;
        let h = match &self.mixer {
            Mixer::Linear(g) => {
                let mut s = states
                    .iter_mut()
                    .map(|l| l.recurrent_mut())
                    .collect::<Result<Vec<_>>>()?;
                g.forward_batch(&h, &mut s, gdn)?
            }
            Mixer::Full(a) => {
                let mut c = states
                    .iter_mut()
                    .map(|l| l.kv_mut())
                    .collect::<Result<Vec<_>>>()?;
                a.forward_batch(&h, &mut c)?
            }
        };
        let x = ops::add(x, &h)?;
        let h = self.mlp.forward_rows(&self.post_norm.forward(&x)?)?;
        Ok(ops::add(&x, &h)?)
    }

    /// Moves every weight of the layer to `device`.
    pub fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        self.input_norm.to_device(device)?;
        match &mut self.mixer {
            Mixer::Linear(g) => g.to_device(device)?,
            Mixer::Full(a) => a.to_device(device)?,
        }
        self.post_norm.to_device(device)?;
        self.mlp.to_device(device)
    }

    fn weights(&self) -> Vec<&Weight> {
        let mut w: Vec<&Weight> = match &self.mixer {
            Mixer::Linear(g) => g.linears().iter().map(|l| &l.weight).collect(),
            Mixer::Full(a) => [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                .iter()
                .map(|l| &l.weight)
                .collect(),
        };
        w.extend(self.mlp.weights());
        w
    }

    /// Parameters outside the weight matrices.
    fn other_parameters(&self) -> usize {
        let norms = self.input_norm.weight.numel() + self.post_norm.weight.numel();
        norms
            + match &self.mixer {
                Mixer::Linear(g) => g.other_parameters(),
                Mixer::Full(a) => [&a.q_norm, &a.k_norm]
                    .iter()
                    .flat_map(|n| n.as_ref())
                    .map(|n| n.weight.numel())
                    .sum(),
            }
    }
}

/// The multi-token-prediction head of original checkpoints (used by speculative decoding; the
/// LM head is shared with the main model). It drafts from `fc([norm_e(embed(next)) |
/// norm_h(hidden)])` through full-attention layers and `norm`.
#[derive(Debug, Clone)]
pub struct MtpHead {
    /// `[hidden, 2·hidden]`.
    pub fc: Linear,
    pub pre_fc_norm_embedding: RmsNorm,
    pub pre_fc_norm_hidden: RmsNorm,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

/// Hyperparameters read from config.json (inside `text_config` when nested).
#[derive(Debug, Clone)]
struct Shape {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    eps: f32,
    context: usize,
    gdn: GdnConfig,
    full_attention: Vec<bool>,
    rope: Rope,
    tied: bool,
    /// The sparse MLP of `qwen3_5_moe`; `None` for the dense family.
    moe: Option<MoeConfig>,
}

/// Whether `model_type` names the MoE family (root or nested text config).
pub fn is_moe_type(model_type: &str) -> bool {
    matches!(model_type, "qwen3_5_moe" | "qwen3_5_moe_text")
}

impl Shape {
    fn read(cfg: &ModelConfig) -> Result<Shape> {
        let file = cfg.dir.join("config.json");
        let file = file.display();
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", heads)?;
        let head_dim = cfg.width_or("head_dim", (hidden / heads).max(1))?;
        ensure!(
            heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
            "{file}: fields `num_attention_heads` ({heads}) must be a positive multiple of `num_key_value_heads` ({kv_heads})"
        );
        let moe = if is_moe_type(&cfg.model_type) {
            Some(moe_config(cfg, hidden)?)
        } else if cfg.usize_or("num_experts", 0)? > 0 {
            bail!("{file}: field `num_experts` > 0 describes Qwen3.5 MoE (model_type qwen3_5_moe), not the dense family");
        } else {
            None
        };
        if cfg.bool_or("attention_bias", false)? {
            bail!("{file}: field `attention_bias` = true is not supported (Qwen3.5 has no attention biases)");
        }
        let gdn = GdnConfig {
            hidden,
            k_heads: cfg.width("linear_num_key_heads")?,
            v_heads: cfg.width("linear_num_value_heads")?,
            k_dim: cfg.width("linear_key_head_dim")?,
            v_dim: cfg.width("linear_value_head_dim")?,
            conv_kernel: cfg.width_or("linear_conv_kernel_dim", 4)?,
        };
        ensure!(
            gdn.k_heads > 0 && gdn.k_dim > 0 && gdn.v_dim > 0 && gdn.v_heads.is_multiple_of(gdn.k_heads) && gdn.conv_kernel > 0,
            "{file}: `linear_num_value_heads` ({}) must be a multiple of `linear_num_key_heads` ({}), and the linear head dims and `linear_conv_kernel_dim` positive",
            gdn.v_heads,
            gdn.k_heads
        );
        Ok(Shape {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            // The MoE family's MLPs are sized by the expert widths instead.
            inter: if moe.is_some() {
                0
            } else {
                cfg.width("intermediate_size")?
            },
            vocab: cfg.vocab_size()?,
            eps: cfg.rms_norm_eps(1e-6)?,
            context: cfg.context_length(32_768)?,
            gdn,
            full_attention: layer_kinds(cfg, layers)?,
            rope: rope(cfg, head_dim)?,
            tied: cfg.bool_or("tie_word_embeddings", false)?,
            moe,
        })
    }
}

/// The sparse MLP's widths (mlx-lm's defaults: `norm_topk_prob` true, no shared expert). Every
/// layer is sparse, as in mlx-lm and transformers' Qwen3.5-MoE.
fn moe_config(cfg: &ModelConfig, hidden: usize) -> Result<MoeConfig> {
    let file = cfg.dir.join("config.json");
    let file = file.display();
    let experts = cfg.width("num_experts")?;
    let top_k = cfg.width("num_experts_per_tok")?;
    ensure!(
        experts > 0 && top_k > 0 && top_k <= experts,
        "{file}: field `num_experts_per_tok` ({top_k}) must be in 1..=`num_experts` ({experts})"
    );
    Ok(MoeConfig {
        hidden,
        experts,
        top_k,
        expert_width: cfg.width("moe_intermediate_size")?,
        shared_width: cfg.width_or("shared_expert_intermediate_size", 0)?,
        renormalize: cfg.bool_or("norm_topk_prob", true)?,
    })
}

/// Which layers are full attention: `layer_types` when listed (it must agree with
/// `full_attention_interval` when both are given, since mlx-lm only reads the interval),
/// else every `full_attention_interval`-th layer (default 4).
fn layer_kinds(cfg: &ModelConfig, layers: usize) -> Result<Vec<bool>> {
    let file = cfg.dir.join("config.json");
    let file = file.display();
    let interval = cfg.usize_or("full_attention_interval", 4)?;
    ensure!(
        interval > 0,
        "{file}: field `full_attention_interval` must be at least 1"
    );
    let from_interval: Vec<bool> = (0..layers).map(|i| (i + 1) % interval == 0).collect();
    let Some(types) = cfg.opt("layer_types") else {
        return Ok(from_interval);
    };
    let Some(types) = types.as_array().filter(|t| t.len() == layers) else {
        bail!("{file}: field `layer_types` must be a list of {layers} strings (one per layer)");
    };
    let mut kinds = Vec::with_capacity(layers);
    for (i, t) in types.iter().enumerate() {
        kinds.push(match t.as_str() {
            Some("full_attention") => true,
            Some("linear_attention") => false,
            _ => bail!("{file}: field `layer_types[{i}]` must be \"linear_attention\" or \"full_attention\", got {t}"),
        });
    }
    if cfg.opt("full_attention_interval").is_some() && kinds != from_interval {
        bail!("{file}: fields `layer_types` and `full_attention_interval` ({interval}) describe different layer patterns");
    }
    Ok(kinds)
}

/// RoPE over the first `int(head_dim · partial_rotary_factor)` dims. Text-only positions are
/// the same on all three mRoPE sections, so `mrope` is plain RoPE here.
fn rope(cfg: &ModelConfig, head_dim: usize) -> Result<Rope> {
    let file = cfg.dir.join("config.json");
    let file = file.display();
    let params = cfg
        .opt("rope_parameters")
        .or_else(|| cfg.opt("rope_scaling"));
    let field = |key: &str| -> Option<&Value> {
        params
            .and_then(|p| p.get(key))
            .filter(|v| !v.is_null())
            .or_else(|| cfg.opt(key))
    };
    let num = |key: &str, default: f64| -> Result<f64> {
        match field(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("{file}: field `{key}` must be a number, got {v}")),
        }
    };
    let theta = num("rope_theta", 100_000.0)?;
    let partial = num("partial_rotary_factor", 0.25)?;
    let kind = params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    if kind != "default" && kind != "mrope" {
        bail!("{file}: field `rope_parameters.rope_type` = {kind:?} is not supported yet");
    }
    let rot = (head_dim as f64 * partial) as usize;
    ensure!(
        partial > 0.0 && rot <= head_dim && rot >= 2 && rot.is_multiple_of(2),
        "{file}: `partial_rotary_factor` {partial:?} × head_dim {head_dim} must give an even number of rotated dims in 2..={head_dim}"
    );
    let field = if params.is_some_and(|p| p.get("rope_theta").is_some()) {
        "rope_parameters.rope_theta"
    } else {
        "rope_theta"
    };
    let theta = crate::config::limits::check_rope_theta(cfg, field, theta)?;
    Ok(Rope::new(theta, rot, RopeLayout::HalfSplit))
}

pub struct Qwen3_5 {
    info: ModelInfo,
    layout: Layout,
    norms_offset: bool,
    embed: Weight,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Weight,
    mtp: Option<MtpHead>,
    gdn: GdnConfig,
    kv_heads: usize,
    head_dim: usize,
}

/// Loads the pieces of one folder: its layout, norm convention and quantization.
struct Loader<'a> {
    store: &'a WeightStore,
    cfg: &'a ModelConfig,
    shape: &'a Shape,
    offset: bool,
}

impl Loader<'_> {
    /// A decoder RMSNorm (never the gated one), undoing the `w − 1` storage when present.
    fn norm(&self, name: &str, dim: usize) -> Result<RmsNorm> {
        if self.offset {
            RmsNorm::load_offset(self.store, name, dim, self.shape.eps)
        } else {
            RmsNorm::load(self.store, name, dim, self.shape.eps)
        }
    }

    fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Linear::load(self.store, &self.cfg.quant, prefix, out, inp)
    }

    fn attention(&self, p: &str) -> Result<GqaAttention> {
        let s = self.shape;
        let (h, kvh, d) = (s.heads, s.kv_heads, s.head_dim);
        Ok(GqaAttention {
            cfg: AttentionConfig {
                heads: h,
                kv_heads: kvh,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                window: None,
                softcap: None,
            },
            q_proj: self.linear(&format!("{p}.q_proj"), 2 * h * d, s.hidden)?,
            k_proj: self.linear(&format!("{p}.k_proj"), kvh * d, s.hidden)?,
            v_proj: self.linear(&format!("{p}.v_proj"), kvh * d, s.hidden)?,
            o_proj: self.linear(&format!("{p}.o_proj"), s.hidden, h * d)?,
            q_norm: Some(self.norm(&format!("{p}.q_norm.weight"), d)?),
            k_norm: Some(self.norm(&format!("{p}.k_norm.weight"), d)?),
            rope: s.rope.clone(),
            output_gate: true,
        })
    }

    fn layer(&self, p: &str, index: usize, full: bool) -> Result<DecoderLayer> {
        let s = self.shape;
        let mixer = if full {
            Mixer::Full(self.attention(&format!("{p}.self_attn"))?)
        } else {
            Mixer::Linear(GatedDeltaNet::load(
                self.store,
                &self.cfg.quant,
                &format!("{p}.linear_attn"),
                s.gdn,
                index,
                s.eps,
            )?)
        };
        Ok(DecoderLayer {
            input_norm: self.norm(&format!("{p}.input_layernorm.weight"), s.hidden)?,
            mixer,
            post_norm: self.norm(&format!("{p}.post_attention_layernorm.weight"), s.hidden)?,
            mlp: match s.moe {
                Some(m) => Mlp::Sparse(SparseMoe::load(
                    self.store,
                    &self.cfg.quant,
                    &format!("{p}.mlp"),
                    m,
                )?),
                None => Mlp::Dense(SwiGlu::load(
                    self.store,
                    &self.cfg.quant,
                    &format!("{p}.mlp"),
                    s.hidden,
                    s.inter,
                )?),
            },
        })
    }

    /// The MTP head when the folder holds `<prefix>.fc.weight`; its layers are counted from the
    /// stored names (`mtp_num_hidden_layers` is 1 in released configs).
    fn mtp(&self, prefix: &str) -> Result<Option<MtpHead>> {
        if !self.store.contains(&format!("{prefix}.fc.weight")) {
            return Ok(None);
        }
        let s = self.shape;
        let layers_prefix = format!("{prefix}.layers.");
        let count = self
            .store
            .names()
            .iter()
            .filter_map(|n| {
                n.strip_prefix(&layers_prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .max()
            .map_or(0, |m| m + 1);
        ensure!(
            count <= crate::config::limits::MAX_LAYERS,
            "{}: tensor names `{layers_prefix}N.*` go up to layer {}, more than any model has",
            self.store.dir().display(),
            count - 1
        );
        Ok(Some(MtpHead {
            fc: self.linear(&format!("{prefix}.fc"), s.hidden, 2 * s.hidden)?,
            pre_fc_norm_embedding: self
                .norm(&format!("{prefix}.pre_fc_norm_embedding.weight"), s.hidden)?,
            pre_fc_norm_hidden: self
                .norm(&format!("{prefix}.pre_fc_norm_hidden.weight"), s.hidden)?,
            layers: (0..count)
                .map(|i| self.layer(&format!("{layers_prefix}{i}"), i, true))
                .collect::<Result<_>>()?,
            norm: self.norm(&format!("{prefix}.norm.weight"), s.hidden)?,
        }))
    }
}

/// The MoE summary of a sparse Qwen3.5 model (see [`super::moe_info`]).
fn moe_info(m: MoeConfig, all: &[&Weight], layers: &[DecoderLayer], parameters: usize) -> MoeInfo {
    let experts: Vec<&Weight> = layers
        .iter()
        .filter_map(|l| match &l.mlp {
            Mlp::Sparse(s) => Some(s.expert_weights()),
            Mlp::Dense(_) => None,
        })
        .flatten()
        .collect();
    let widths = (m.experts, m.top_k, m.expert_width, m.shared_width);
    super::moe_info(widths, &experts, all, parameters)
}

impl Qwen3_5 {
    pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Qwen3_5> {
        let shape = Shape::read(cfg)?;
        let layout = Layout::detect(store)?;
        let offset = norms_are_offset(store, layout);
        let ld = Loader {
            store,
            cfg,
            shape: &shape,
            offset,
        };
        let m = layout.model_prefix();
        let s = &shape;
        let embed_name = format!("{m}.embed_tokens");
        let embed = store.weight(
            &embed_name,
            cfg.quant.spec_for(&embed_name),
            s.vocab,
            s.hidden,
        )?;
        let layers = (0..s.layers)
            .map(|i| ld.layer(&format!("{m}.layers.{i}"), i, s.full_attention[i]))
            .collect::<Result<Vec<_>>>()?;
        let norm = ld.norm(&format!("{m}.norm.weight"), s.hidden)?;
        // Tied heads use the embedding even when a head is stored, as mlx-lm does.
        let head = layout.lm_head();
        let lm_head = if s.tied {
            embed.clone()
        } else {
            store.weight(head, cfg.quant.spec_for(head), s.vocab, s.hidden)?
        };
        let mtp = ld.mtp(layout.mtp_prefix())?;

        let mut all: Vec<&Weight> = vec![&embed];
        let mut parameters = embed.numel() + norm.weight.numel();
        for l in &layers {
            all.extend(l.weights());
            parameters += l.other_parameters();
        }
        if !s.tied {
            all.push(&lm_head);
        }
        parameters += all[1..].iter().map(|w| w.numel()).sum::<usize>();
        let moe = s.moe.map(|m| moe_info(m, &all, &layers, parameters));
        let info = ModelInfo {
            family: if s.moe.is_some() {
                "qwen3_5_moe"
            } else {
                "qwen3_5"
            }
            .into(),
            parameters,
            weight_formats: super::formats(all),
            layer_kinds: s
                .full_attention
                .iter()
                .map(|&f| {
                    if f {
                        "full_attention"
                    } else {
                        "linear_attention"
                    }
                    .to_string()
                })
                .collect(),
            context_length: s.context,
            vocab_size: s.vocab,
            hidden_size: s.hidden,
            moe,
        };
        Ok(Qwen3_5 {
            info,
            layout,
            norms_offset: offset,
            embed,
            layers,
            norm,
            lm_head,
            mtp,
            gdn: s.gdn,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether the folder stored its decoder norms as `w − 1` (undone at load).
    pub fn norms_offset(&self) -> bool {
        self.norms_offset
    }

    pub fn mtp(&self) -> Option<&MtpHead> {
        self.mtp.as_ref()
    }

    pub fn embedding(&self) -> &Weight {
        &self.embed
    }

    pub fn lm_head(&self) -> &Weight {
        &self.lm_head
    }
}

impl CausalLm for Qwen3_5 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        ModelState::new(
            self.layers
                .iter()
                .map(|l| match l.mixer {
                    Mixer::Linear(_) => LayerState::Recurrent(self.gdn.new_state()),
                    Mixer::Full(_) => LayerState::Kv(KvCache::new(self.kv_heads, self.head_dim, 0)),
                })
                .collect(),
        )
    }

    fn device(&self) -> kernels::Device {
        self.embed.device()
    }

    fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        super::embed_and_head_to_device(&mut self.embed, &mut self.lm_head, device)?;
        self.norm.to_device(device)?;
        for l in &mut self.layers {
            l.to_device(device)?;
        }
        if let Some(m) = &mut self.mtp {
            m.fc.to_device(device)?;
            m.pre_fc_norm_embedding.to_device(device)?;
            m.pre_fc_norm_hidden.to_device(device)?;
            m.norm.to_device(device)?;
            for l in &mut m.layers {
                l.to_device(device)?;
            }
        }
        Ok(())
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        let x = self.decode_layers(ids, state)?;
        super::lm_logits(&x, &self.norm, &self.lm_head, all_logits)
    }

    fn drafter(&self) -> Option<&dyn SelfDrafter> {
        self.mtp.as_ref().map(|_| self as &dyn SelfDrafter)
    }

    /// The decode step of several sequences with the weights read once per group of rows
    /// (dense projections and MLPs); the conv, the delta rule, attention and the experts per
    /// sequence. On the CPU only: elsewhere the sequences run one by one.
    fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        let same_path = states.windows(2).all(|w| w[0].gdn_path == w[1].gdn_path);
        let fits = states.iter().all(|s| s.layers.len() == self.layers.len());
        if self.device() != kernels::Device::Cpu
            || ids.len() != states.len()
            || ids.len() < 2
            || !same_path
            || !fits
        {
            return super::decode_each(self, ids, states);
        }
        let path = states[0].gdn_path;
        let mut x = ops::embedding(&self.embed, ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut ls: Vec<&mut LayerState> =
                states.iter_mut().map(|s| &mut s.layers[i]).collect();
            x = layer.forward_batch(&x, &mut ls, path)?;
        }
        for s in states.iter_mut() {
            s.pos += 1;
        }
        super::lm_logits_rows(&x, &self.norm, &self.lm_head, super::Tail::default())
    }
}

impl Qwen3_5 {
    /// The decoder stack over `ids`: the residual stream `[T, H]` before the final norm.
    fn decode_layers(&self, ids: &[u32], state: &mut ModelState) -> Result<Tensor> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        ensure!(
            state.layers.len() == self.layers.len(),
            "the state has {} layers but the model {} (a state from another model?)",
            state.layers.len(),
            self.layers.len()
        );
        let path = state.gdn_path;
        let mut x = ops::embedding(&self.embed, ids)?;
        for (layer, ls) in self.layers.iter().zip(state.layers.iter_mut()) {
            x = layer.forward(&x, ls, path)?;
        }
        state.pos += ids.len();
        Ok(x)
    }
}

/// The MTP head drafts as vLLM's Qwen3.5 MTP predictor does: `fc([norm_e(embed(token)) |
/// norm_h(hidden)])`, its full-attention layers at the draft positions, `norm`, the shared LM
/// head; `hidden` is the main model's state after its final norm (what vLLM's model returns).
impl SelfDrafter for Qwen3_5 {
    fn forward_hidden(
        &self,
        ids: &[u32],
        state: &mut ModelState,
        all_logits: bool,
    ) -> Result<(Tensor, Tensor)> {
        let x = self.decode_layers(ids, state)?;
        let h = self.norm.forward(&x)?;
        let rows = if all_logits {
            h.clone()
        } else {
            h.narrow0(h.dim(0) - 1, 1)?
        };
        let logits = super::host_logits(&ops::matmul(&rows, &self.lm_head)?)?;
        Ok((logits, h))
    }

    fn new_draft_state(&self) -> ModelState {
        let layers = self.mtp.as_ref().map_or(0, |m| m.layers.len());
        ModelState::new(
            (0..layers)
                .map(|_| LayerState::Kv(KvCache::new(self.kv_heads, self.head_dim, 0)))
                .collect(),
        )
    }

    fn draft(
        &self,
        ids: &[u32],
        hidden: &Tensor,
        state: &mut ModelState,
        logits: bool,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let Some(m) = &self.mtp else {
            bail!("this checkpoint has no MTP head (mtp.*) to draft with");
        };
        ensure!(
            !ids.is_empty() && hidden.dims() == 2 && hidden.dim(0) == ids.len(),
            "the MTP head needs one hidden row per token: {} tokens, hidden {:?}",
            ids.len(),
            hidden.shape()
        );
        ensure!(
            state.layers.len() == m.layers.len(),
            "the draft state has {} layers but the MTP head {}",
            state.layers.len(),
            m.layers.len()
        );
        let e = m
            .pre_fc_norm_embedding
            .forward(&ops::embedding(&self.embed, ids)?)?;
        let h = m.pre_fc_norm_hidden.forward(hidden)?;
        let mut x = m.fc.forward(&concat_columns(&e, &h)?)?;
        let path = state.gdn_path;
        for (layer, ls) in m.layers.iter().zip(state.layers.iter_mut()) {
            x = layer.forward(&x, ls, path)?;
        }
        state.pos += ids.len();
        let out = m.norm.forward(&x)?;
        let logits = if logits {
            let last = out.narrow0(out.dim(0) - 1, 1)?;
            Some(super::host_logits(&ops::matmul(&last, &self.lm_head)?)?)
        } else {
            None
        };
        Ok((logits, out))
    }
}

/// `[a | b]` for `[T, A]` and `[T, B]`, on `a`'s device. Done on the host: the MTP head runs
/// it on a few rows per draft, and no backend has a concat op yet.
fn concat_columns(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let device = a.device();
    let (ha, hb) = (
        a.to_device(kernels::Device::Cpu)?.to_f32()?,
        b.to_device(kernels::Device::Cpu)?.to_f32()?,
    );
    let (t, ca, cb) = (ha.dim(0), ha.dim(1), hb.dim(1));
    let (va, vb) = (ha.f32s()?, hb.f32s()?);
    let mut out = Vec::with_capacity(t * (ca + cb));
    for r in 0..t {
        out.extend_from_slice(&va[r * ca..(r + 1) * ca]);
        out.extend_from_slice(&vb[r * cb..(r + 1) * cb]);
    }
    Ok(Tensor::from_f32(&[t, ca + cb], out)?.to_device(device)?)
}

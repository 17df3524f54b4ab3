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
//!   multimodal ones and `model.*` (+ `lm_head`) in text-only ones — see [`Layout`](crate::weights::Layout).

use anyhow::{bail, ensure, Result};
use kernels::{ops, ops::RopeLayout, Tensor, Weight};
use serde_json::Value;

use super::Describe;
use super::{CausalLm, ModelInfo, SelfDrafter};
use crate::cache::ModelState;
use crate::config::ModelConfig;
use crate::layers::head::host_logits;
use crate::layers::params::params;
use crate::layers::{
    AttentionSpec, Decoder, DecoderLayer, GatedDeltaNet, GdnConfig, GqaAttention, Linear, Mixer,
    Mlp, MoeConfig, RmsNorm, Rope, SparseMoe, SwiGlu, Tail,
};
pub use crate::weights::Layout;
use crate::weights::{norms_are_offset, Scope, WeightStore};

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

params!(MtpHead: fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers, norm);

/// config.json (inside `text_config` when nested), read once.
#[derive(Debug, Clone)]
struct Args {
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

impl Args {
    fn read(cfg: &ModelConfig) -> Result<Args> {
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
        Ok(Args {
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
    let kinds = [("full_attention", true), ("linear_attention", false)];
    let Some(kinds) = cfg.layer_types(layers, &kinds)? else {
        return Ok(from_interval);
    };
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
    decoder: Decoder,
    mtp: Option<MtpHead>,
}

params!(Qwen3_5: decoder, mtp);

/// One decoder layer under `s`: Gated DeltaNet or gated full attention, then the MLP.
fn layer(s: &Scope, a: &Args, index: usize, full: bool) -> Result<DecoderLayer> {
    let mixer = if full {
        Mixer::Attention(GqaAttention::load(
            &s.pp("self_attn"),
            AttentionSpec {
                qk_norm: Some(["q_norm", "k_norm"]),
                output_gate: true,
                ..AttentionSpec::plain(
                    a.hidden,
                    (a.heads, a.kv_heads, a.head_dim),
                    a.rope.clone(),
                    a.eps,
                )
            },
        )?)
    } else {
        Mixer::Linear(GatedDeltaNet::load(
            &s.pp("linear_attn"),
            a.gdn,
            index,
            a.eps,
        )?)
    };
    Ok(DecoderLayer {
        input_norm: s.pp("input_layernorm").norm(a.hidden, a.eps)?,
        mixer,
        post_norm: s.pp("post_attention_layernorm").norm(a.hidden, a.eps)?,
        mlp: match a.moe {
            Some(m) => Mlp::Sparse(SparseMoe::load(&s.pp("mlp"), m)?),
            None => Mlp::Dense(SwiGlu::load(&s.pp("mlp"), a.hidden, a.inter)?),
        },
        residual_scale: None,
        sandwich: None,
    })
}

/// The MTP head when the folder holds `<s>.fc.weight`; its layers are counted from the stored
/// names (`mtp_num_hidden_layers` is 1 in released configs).
fn mtp(s: &Scope, a: &Args) -> Result<Option<MtpHead>> {
    if !s.contains("fc.weight") {
        return Ok(None);
    }
    let count = s.pp("layers").count_children()?;
    Ok(Some(MtpHead {
        fc: s.pp("fc").linear(a.hidden, 2 * a.hidden)?,
        pre_fc_norm_embedding: s.pp("pre_fc_norm_embedding").norm(a.hidden, a.eps)?,
        pre_fc_norm_hidden: s.pp("pre_fc_norm_hidden").norm(a.hidden, a.eps)?,
        layers: (0..count)
            .map(|i| layer(&s.pp("layers").pp(i), a, i, true))
            .collect::<Result<_>>()?,
        norm: s.pp("norm").norm(a.hidden, a.eps)?,
    }))
}

impl Qwen3_5 {
    pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Qwen3_5> {
        let a = Args::read(cfg)?;
        let layout = Layout::detect(store)?;
        let offset = norms_are_offset(store, layout);
        let root = Scope::new(store, &cfg.quant).with_norm_offset(offset);
        let m = root.pp(layout.model_prefix());
        let embed = m.pp("embed_tokens").weight(a.vocab, a.hidden)?;
        let layers = (0..a.layers)
            .map(|i| layer(&m.pp("layers").pp(i), &a, i, a.full_attention[i]))
            .collect::<Result<Vec<_>>>()?;
        // Tied heads use the embedding even when a head is stored, as mlx-lm does.
        let lm_head = match a.tied {
            true => embed.clone(),
            false => root.pp(layout.lm_head()).weight(a.vocab, a.hidden)?,
        };
        let mut decoder = Decoder {
            embed,
            layers,
            norm: m.pp("norm").norm(a.hidden, a.eps)?,
            lm_head,
            embed_scale: None,
            tail: Tail::default(),
        };
        // `engine info` counts the main model; the MTP head is a drafting aid.
        let info = Describe {
            family: if a.moe.is_some() {
                "qwen3_5_moe"
            } else {
                "qwen3_5"
            },
            layer_kinds: decoder.layer_kinds(),
            context_length: a.context,
            vocab_size: a.vocab,
            hidden_size: a.hidden,
            moe: a
                .moe
                .map(|m| (m.experts, m.top_k, m.expert_width, m.shared_width)),
        }
        .info(&mut decoder)?;
        Ok(Qwen3_5 {
            info,
            layout,
            norms_offset: offset,
            mtp: mtp(&root.pp(layout.mtp_prefix()), &a)?,
            decoder,
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

    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }
}

impl CausalLm for Qwen3_5 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        self.decoder.new_state()
    }

    fn device(&self) -> kernels::Device {
        self.decoder.device()
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        self.decoder.forward(ids, state, all_logits)
    }

    fn drafter(&self) -> Option<&dyn SelfDrafter> {
        self.mtp.as_ref().map(|_| self as &dyn SelfDrafter)
    }

    fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        self.decoder.decode_batch(ids, states)
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
        let d = &self.decoder;
        let x = d.hidden(ids, state)?;
        let h = d.norm.forward(&x)?;
        let rows = if all_logits {
            h.clone()
        } else {
            h.narrow0(h.dim(0) - 1, 1)?
        };
        let logits = host_logits(&ops::matmul(&rows, &d.lm_head)?)?;
        Ok((logits, h))
    }

    fn decode_batch_hidden(
        &self,
        ids: &[u32],
        states: &mut [&mut ModelState],
    ) -> Result<(Tensor, Tensor)> {
        self.decoder
            .decode_batch_hidden(ids, states, |id, s| self.forward_hidden(&[id], s, false))
    }

    fn new_draft_state(&self) -> ModelState {
        let layers = self.mtp.as_ref().map_or(&[][..], |m| &m.layers[..]);
        ModelState::new(layers.iter().map(|l| l.mixer.new_state()).collect())
    }

    fn draft(&self, ids: &[u32], hidden: &Tensor, state: &mut ModelState) -> Result<Tensor> {
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
            .forward(&ops::embedding(&self.decoder.embed, ids)?)?;
        let h = m.pre_fc_norm_hidden.forward(hidden)?;
        let mut x = m.fc.forward(&concat_columns(&e, &h)?)?;
        let path = state.gdn_path;
        for (layer, ls) in m.layers.iter().zip(state.layers.iter_mut()) {
            x = layer.forward(&x, ls, path)?;
        }
        state.pos += ids.len();
        m.norm.forward(&x)
    }

    fn draft_logits(&self, head: &Tensor, first: usize, extra: &[u32]) -> Result<Tensor> {
        let w = &self.decoder.lm_head;
        // The first rows are a view of the head (no copy); the extra ones are gathered.
        let first = first.min(w.rows());
        let lead = host_logits(&ops::matmul(head, &w.rows_view(0, first)?)?)?;
        if extra.is_empty() {
            return Ok(lead);
        }
        let rows = Weight::Dense(ops::embedding(w, extra)?);
        let tail = host_logits(&ops::matmul(head, &rows)?)?;
        concat_columns(&lead, &tail)
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

//! Gemma 3 text (`gemma3_text`, or `gemma3` with a nested `text_config`): the shared
//! [`Decoder`] with Gemma's sandwich norms and GeGLU MLPs.
//!
//! Facts checked against mlx-lm 0.32.2 (`gemma3_text.py`) and transformers 5.23
//! (`modeling_gemma3.py`, `configuration_gemma3.py`):
//! - every RMSNorm (input, post-attention, pre- and post-feedforward, final, per-head q/k) is
//!   `x̂ · (1 + w)`, the folder storing `w` in both layouts;
//! - layers slide unless `(i + 1) % sliding_window_pattern == 0` (default 6), or as
//!   `layer_types` lists them; sliding layers attend to the last `sliding_window` positions;
//! - attention scale `query_pre_attn_scalar^-½`; sliding layers rotate with
//!   `rope_local_base_freq` (default 1e4), full ones with `rope_theta` (default 1e6) and
//!   `rope_scaling` (`linear` in the 4B and larger configs); transformers 5 may instead write
//!   `rope_parameters.{sliding,full}_attention`, read the same way;
//! - embeddings × √hidden, the factor rounded to bf16 as mlx-lm and the released bf16 weights
//!   compute it; GeGLU (tanh GELU) MLPs; the head is tied unless `lm_head.weight` is stored;
//! - `final_logit_softcapping` and `attn_logit_softcapping`, when a config sets them, cap the
//!   logits and the attention scores `c·tanh(x/c)` (transformers; released configs leave both
//!   null and mlx-lm ignores them).
//!
//! Names: `model.*` in text-only folders, `language_model.model.*` in mlx-lm's multimodal ones,
//! `model.language_model.*` in transformers 5's ([`Layout`]).

use anyhow::{ensure, Result};
use kernels::ops::RopeLayout;

use super::Dense;
use crate::config::{limits::check_rope_theta, ModelConfig};
use crate::layers::{
    AttentionConfig, AttentionSpec, Decoder, DecoderLayer, GqaAttention, Mixer, Mlp, Rope, SwiGlu,
    Tail,
};
use crate::weights::{Layout, Scope, WeightStore};

/// config.json (inside `text_config` when nested), read once.
struct Args {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    eps: f32,
    context: usize,
    /// Per layer: whether it slides.
    sliding: Vec<bool>,
    window: usize,
    scale: f32,
    local_rope: Rope,
    global_rope: Rope,
    attn_softcap: Option<f32>,
    final_softcap: Option<f32>,
}

impl Args {
    fn read(cfg: &ModelConfig) -> Result<Args> {
        let file = cfg.path();
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", 1)?;
        let head_dim = cfg.width_or("head_dim", 256)?;
        ensure!(
            heads % kv_heads == 0 && head_dim % 2 == 0,
            "{}: `num_attention_heads` ({heads}) must be a multiple of `num_key_value_heads` ({kv_heads}) and `head_dim` ({head_dim}) even",
            file.display()
        );
        let kinds = [("sliding_attention", true), ("full_attention", false)];
        let sliding = match cfg.layer_types(layers, &kinds)? {
            Some(s) => s,
            None => {
                let limit = 1..=crate::config::limits::MAX_LAYERS;
                let pattern = cfg.usize_in_or("sliding_window_pattern", 6, limit)?;
                (0..layers)
                    .map(|i| !(i + 1).is_multiple_of(pattern))
                    .collect()
            }
        };
        let positive = |x: f64| x > 0.0 && x.is_finite();
        let scalar = cfg.f64_where(
            "query_pre_attn_scalar",
            head_dim as f64,
            "positive",
            positive,
        )?;
        let softcap = |key: &str| -> Result<Option<f32>> {
            match cfg.opt(key) {
                None => Ok(None),
                Some(_) => Ok(Some(cfg.f64_where(key, 1.0, "positive", positive)? as f32)),
            }
        };
        Ok(Args {
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter: cfg.width("intermediate_size")?,
            vocab: cfg.vocab_size()?,
            eps: cfg.rms_norm_eps(1e-6)?,
            context: cfg.context_length(32_768)?,
            sliding,
            window: cfg.width_or("sliding_window", 512)?,
            scale: scalar.powf(-0.5) as f32,
            local_rope: rope(cfg, "sliding_attention", head_dim)?,
            global_rope: rope(cfg, "full_attention", head_dim)?,
            attn_softcap: softcap("attn_logit_softcapping")?,
            final_softcap: softcap("final_logit_softcapping")?,
        })
    }
}

/// The RoPE of one layer kind: `rope_parameters.<kind>` when the config has it, else
/// `rope_local_base_freq` (sliding) or `rope_theta` with `rope_scaling` (full).
fn rope(cfg: &ModelConfig, kind: &str, head_dim: usize) -> Result<Rope> {
    let sliding = kind == "sliding_attention";
    let theta = if sliding { 10_000.0 } else { 1_000_000.0 };
    let per_kind = cfg.opt("rope_parameters").and_then(|p| p.get(kind));
    let (key, scaling) = match sliding {
        _ if per_kind.is_some() => {
            return Rope::of_kind(cfg, kind, head_dim, (theta, "default", 1.0))
        }
        true => ("rope_local_base_freq", None),
        false => ("rope_theta", cfg.opt("rope_scaling")),
    };
    let theta = check_rope_theta(cfg, key, cfg.f64_or(key, theta)?)?;
    Rope::scaled(
        cfg,
        theta,
        ("rope_scaling", scaling),
        head_dim,
        RopeLayout::HalfSplit,
    )
}

/// √hidden in the precision the references multiply by: transformers casts it to the
/// embedding table's dtype (exact in f32, rounded in bf16), and mlx-lm rounds it to bf16 for
/// every table, quantized ones included. On the real Gemma 3 270M in f32, the bf16-rounded
/// scale (25.25 for 25.298) moved top-1 log-probs by up to 1.1e-2 against transformers.
fn embed_scale(embed: &kernels::Weight, hidden: usize) -> f32 {
    let exact = (hidden as f32).sqrt();
    match embed {
        kernels::Weight::Dense(t) if t.dtype() == kernels::DType::F32 => exact,
        _ => half::bf16::from_f32(exact).to_f32(),
    }
}

pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Dense> {
    let a = Args::read(cfg)?;
    let layout = Layout::detect(store)?;
    let root = Scope::new(store, &cfg.quant).with_norm_offset(true);
    let m = root.pp(layout.model_prefix());
    let embed = m.pp("embed_tokens").weight(a.vocab, a.hidden)?;
    let layers = (0..a.sliding.len())
        .map(|i| layer(&m.pp("layers").pp(i), &a, i))
        .collect::<Result<Vec<_>>>()?;
    let lm_head = match root.contains(&format!("{}.weight", layout.lm_head())) {
        true => root.pp(layout.lm_head()).weight(a.vocab, a.hidden)?,
        false => embed.clone(),
    };
    let sqrt_hidden = embed_scale(&embed, a.hidden);
    let decoder = Decoder {
        embed,
        layers,
        norm: m.pp("norm").norm(a.hidden, a.eps)?,
        lm_head,
        embed_scale: Some(sqrt_hidden),
        tail: Tail {
            scale: None,
            softcap: a.final_softcap,
        },
    };
    Dense::new("gemma3", decoder, (a.context, a.vocab, a.hidden), None)
}

fn layer(s: &Scope, a: &Args, i: usize) -> Result<DecoderLayer> {
    let sliding = a.sliding[i];
    let rope = if sliding {
        &a.local_rope
    } else {
        &a.global_rope
    };
    let plain = AttentionSpec::plain(
        a.hidden,
        (a.heads, a.kv_heads, a.head_dim),
        rope.clone(),
        a.eps,
    );
    let attention = AttentionSpec {
        cfg: AttentionConfig {
            scale: a.scale,
            window: sliding.then_some(a.window),
            softcap: a.attn_softcap,
            ..plain.cfg
        },
        qk_norm: Some(["q_norm", "k_norm"]),
        ..plain
    };
    let norm = |name: &str| s.pp(name).norm(a.hidden, a.eps);
    Ok(DecoderLayer {
        input_norm: norm("input_layernorm")?,
        mixer: Mixer::Attention(GqaAttention::load(&s.pp("self_attn"), attention)?),
        post_norm: norm("pre_feedforward_layernorm")?,
        mlp: Mlp::GeGlu(SwiGlu::load(&s.pp("mlp"), a.hidden, a.inter)?),
        residual_scale: None,
        sandwich: Some([
            norm("post_attention_layernorm")?,
            norm("post_feedforward_layernorm")?,
        ]),
    })
}

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
//! `intermediate_size` (no auto-adjustment), the rest sparse (see [`SigmoidMoe`](crate::layers::SigmoidMoe)). mlx-lm's
//! conversion renames `w1/w3/w2` to `gate_proj/up_proj/down_proj` and stacks the per-expert
//! originals into `switch_mlp.*`; both spellings load.

use anyhow::{bail, ensure, Result};
use kernels::ops::RopeLayout;

use super::Dense;
use crate::config::ModelConfig;
use crate::layers::{
    AttentionSpec, Decoder, DecoderLayer, GqaAttention, Mixer, Mlp, MoeConfig, Rope, ShortConv,
    SigmoidMoe, SwiGlu, Tail,
};
use crate::weights::{Scope, WeightStore};

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

/// config.json, read once.
struct Args {
    hidden: usize,
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

impl Args {
    fn read(cfg: &ModelConfig) -> Result<Args> {
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
        Ok(Args {
            hidden,
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
pub fn layer_kinds(cfg: &ModelConfig, layers: usize) -> Result<Vec<bool>> {
    let file = cfg.path();
    let file = file.display();
    let from_types = cfg.layer_types(layers, &[("full_attention", true), ("conv", false)])?;
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

/// Loads an LFM2 or LFM2-MoE folder (both layouts share every name).
pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Dense> {
    let a = Args::read(cfg)?;
    let m = Scope::new(store, &cfg.quant).pp("model");
    let inter = match &a.moe {
        Some(moe) => moe.dense_width,
        None => {
            let w1 = "model.layers.0.feed_forward.w1.weight";
            ff_width(
                cfg,
                store.info(w1).and_then(|(_, shape)| shape.first().copied()),
            )?
        }
    };
    let embed = m.pp("embed_tokens").weight(a.vocab, a.hidden)?;
    let layers = a
        .attention
        .iter()
        .enumerate()
        .map(|(i, &attention)| layer(&m.pp("layers").pp(i), &a, i, attention, inter))
        .collect::<Result<Vec<_>>>()?;
    // mlx-lm always multiplies by the embedding; transformers uses `lm_head` only when the
    // config unties it.
    let lm_head = match a.tied {
        true => embed.clone(),
        false => Scope::new(store, &cfg.quant)
            .pp("lm_head")
            .weight(a.vocab, a.hidden)?,
    };
    let decoder = Decoder {
        embed,
        layers,
        norm: m.pp("embedding_norm").norm(a.hidden, a.eps)?,
        lm_head,
        embed_scale: None,
        tail: Tail::default(),
    };
    let family = if a.moe.is_some() { "lfm2_moe" } else { "lfm2" };
    let moe = a.moe.map(|m| (m.experts, m.top_k, m.expert_width, 0));
    Dense::new(family, decoder, (a.context, a.vocab, a.hidden), moe)
}

fn layer(s: &Scope, a: &Args, i: usize, attention: bool, inter: usize) -> Result<DecoderLayer> {
    let mixer = if attention {
        Mixer::Attention(GqaAttention::load(
            &s.pp("self_attn"),
            AttentionSpec {
                qk_norm: Some(["q_layernorm", "k_layernorm"]),
                out: "out_proj",
                ..AttentionSpec::plain(
                    a.hidden,
                    (a.heads, a.kv_heads, a.head_dim),
                    a.rope.clone(),
                    a.eps,
                )
            },
        )?)
    } else {
        Mixer::Conv(ShortConv::load(
            &s.pp("conv"),
            a.hidden,
            a.conv_kernel,
            a.conv_bias,
        )?)
    };
    let ff = s.pp("feed_forward");
    let mlp = match &a.moe {
        Some(m) if i >= m.dense_layers => {
            let widths = MoeConfig {
                hidden: a.hidden,
                experts: m.experts,
                top_k: m.top_k,
                expert_width: m.expert_width,
                shared_width: 0,
                renormalize: m.renormalize,
            };
            Mlp::Sigmoid(SigmoidMoe::load(&ff, widths, m.expert_bias, m.scale)?)
        }
        // mlx-lm's LFM2-MoE conversion renames `w1/w3/w2`; LFM2's keeps them.
        _ if !ff.contains("w1.weight") && ff.contains("gate_proj.weight") => {
            Mlp::Dense(SwiGlu::load(&ff, a.hidden, inter)?)
        }
        _ => Mlp::Dense(SwiGlu::load_named(
            &ff,
            ["w1", "w3", "w2"],
            a.hidden,
            inter,
        )?),
    };
    Ok(DecoderLayer {
        input_norm: s.pp("operator_norm").norm(a.hidden, a.eps)?,
        mixer,
        post_norm: s.pp("ffn_norm").norm(a.hidden, a.eps)?,
        mlp,
        residual_scale: None,
        sandwich: None,
    })
}

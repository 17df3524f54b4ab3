//! Llama-style dense decoders: pre-norm blocks of GQA attention with RoPE and a SwiGLU MLP,
//! a final RMSNorm and an LM head tied to the embedding unless `lm_head.weight` is stored.
//!
//! One loader serves the families built on that skeleton; a [`Variant`] says what each adds:
//! Llama 3 (`attention_bias`, `mlp_bias`, `rope_scaling` llama3/linear, optional sliding
//! layers), Qwen3 (per-head q/k RMSNorm), Qwen2 (biases on q/k/v) and MiniCPM (embedding,
//! residual and logit scales, see `minicpm.rs`). MiniCPM5-style checkpoints that declare
//! `model_type: llama` load here.

use anyhow::{ensure, Result};
use kernels::ops::RopeLayout;

use super::Dense;
use crate::config::ModelConfig;
use crate::layers::{
    AttentionConfig, AttentionSpec, Decoder, DecoderLayer, GqaAttention, Linear, Mixer, Mlp, Rope,
    SwiGlu, Tail,
};
use crate::weights::{Scope, WeightStore};

/// Scalar multipliers some families put on the plain decoder (MiniCPM's μP scales).
#[derive(Debug, Clone, Copy, Default)]
pub struct Scales {
    /// Multiplies the embedding output.
    pub embed: Option<f32>,
    /// Multiplies each block's attention and MLP output before the residual add.
    pub residual: Option<f32>,
    /// Multiplies the final-normed hidden state before the LM head.
    pub logits: Option<f32>,
}

/// What a family adds to the plain decoder (nothing, by default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// `ModelInfo::family`.
    pub family: &'static str,
    /// Per-head RMSNorm on q and k before RoPE (`self_attn.{q,k}_norm`).
    pub qk_norm: bool,
    /// Biases on q, k and v whatever `attention_bias` says (Qwen2).
    pub qkv_bias: bool,
    pub scales: Scales,
}

/// config.json, read once.
struct Args {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    eps: f32,
    context: usize,
    attention_bias: bool,
    mlp_bias: bool,
    /// Per layer: the sliding window of a sliding layer, `None` for full attention.
    windows: Vec<Option<usize>>,
    rope: Rope,
    tie: bool,
}

impl Args {
    fn read(cfg: &ModelConfig) -> Result<Args> {
        let file = cfg.path();
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", heads)?;
        let head_dim = cfg.width_or("head_dim", (hidden / heads).max(1))?;
        ensure!(
            heads % kv_heads == 0,
            "{}: fields `num_attention_heads` ({heads}) must be a multiple of `num_key_value_heads` ({kv_heads})",
            file.display()
        );
        ensure!(
            head_dim % 2 == 0,
            "{}: the head dimension ({head_dim}, field `head_dim` or `hidden_size / num_attention_heads`) must be even for RoPE",
            file.display()
        );
        let kinds = [("full_attention", false), ("sliding_attention", true)];
        let sliding = cfg.layer_types(layers, &kinds)?;
        let window = match sliding.as_ref().is_some_and(|s| s.contains(&true)) {
            true => Some(cfg.width("sliding_window")?),
            false => None,
        };
        let sliding = sliding.unwrap_or_else(|| vec![false; layers]);
        Ok(Args {
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter: cfg.width("intermediate_size")?,
            vocab: cfg.vocab_size()?,
            eps: cfg.rms_norm_eps(1e-6)?,
            context: cfg.context_length(32_768)?,
            attention_bias: cfg.bool_or("attention_bias", false)?,
            mlp_bias: cfg.bool_or("mlp_bias", false)?,
            windows: sliding.iter().map(|&s| window.filter(|_| s)).collect(),
            rope: Rope::from_config(cfg, head_dim, RopeLayout::HalfSplit)?,
            tie: cfg.bool_or("tie_word_embeddings", true)?,
        })
    }
}

/// Loads a Llama-skeleton folder with `variant`'s additions.
pub fn load(cfg: &ModelConfig, store: &WeightStore, variant: Variant) -> Result<Dense> {
    let a = Args::read(cfg)?;
    let root = Scope::new(store, &cfg.quant);
    let m = root.pp("model");
    let embed = m.pp("embed_tokens").weight(a.vocab, a.hidden)?;
    let layers = a
        .windows
        .iter()
        .enumerate()
        .map(|(i, &window)| layer(&m.pp("layers").pp(i), &a, variant, window))
        .collect::<Result<Vec<_>>>()?;
    // Tied unless the checkpoint stores a head (some tied checkpoints still store one).
    let lm_head = if root.contains("lm_head.weight") {
        root.pp("lm_head").weight(a.vocab, a.hidden)?
    } else {
        ensure!(
            a.tie,
            "{}: tensor `lm_head.weight` is missing and `tie_word_embeddings` is false",
            cfg.dir.display()
        );
        embed.clone()
    };
    let s = variant.scales;
    let decoder = Decoder {
        embed,
        layers,
        norm: m.pp("norm").norm(a.hidden, a.eps)?,
        lm_head,
        embed_scale: s.embed,
        tail: Tail {
            scale: s.logits,
            softcap: None,
        },
    };
    Dense::new(
        variant.family,
        decoder,
        (a.context, a.vocab, a.hidden),
        None,
    )
}

fn layer(s: &Scope, a: &Args, variant: Variant, window: Option<usize>) -> Result<DecoderLayer> {
    let plain = AttentionSpec::plain(
        a.hidden,
        (a.heads, a.kv_heads, a.head_dim),
        a.rope.clone(),
        a.eps,
    );
    let attention = AttentionSpec {
        cfg: AttentionConfig {
            window,
            ..plain.cfg
        },
        qkv_bias: a.attention_bias || variant.qkv_bias,
        o_bias: a.attention_bias,
        qk_norm: variant.qk_norm.then_some(["q_norm", "k_norm"]),
        ..plain
    };
    let mlp = s.pp("mlp");
    let lin = |name: &str, out, inp| -> Result<Linear> {
        mlp.pp(name).linear_with_bias(out, inp, a.mlp_bias)
    };
    Ok(DecoderLayer {
        input_norm: s.pp("input_layernorm").norm(a.hidden, a.eps)?,
        mixer: Mixer::Attention(GqaAttention::load(&s.pp("self_attn"), attention)?),
        post_norm: s.pp("post_attention_layernorm").norm(a.hidden, a.eps)?,
        mlp: Mlp::Dense(SwiGlu {
            gate: lin("gate_proj", a.inter, a.hidden)?,
            up: lin("up_proj", a.inter, a.hidden)?,
            down: lin("down_proj", a.hidden, a.inter)?,
        }),
        residual_scale: variant.scales.residual,
        sandwich: None,
    })
}

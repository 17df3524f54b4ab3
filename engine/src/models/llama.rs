//! Llama-style dense decoders: pre-norm blocks of GQA attention with RoPE and a SwiGLU MLP,
//! a final RMSNorm and an LM head tied to the embedding unless `lm_head.weight` is stored.
//!
//! One loader serves the families built on that skeleton; a [`Variant`] says what each adds:
//! Llama 3 (`attention_bias`, `mlp_bias`, `rope_scaling` llama3/linear, optional sliding
//! layers), Qwen3 (per-head q/k RMSNorm) and MiniCPM (embedding, residual and logit scales,
//! see `minicpm.rs`). MiniCPM5-style checkpoints that declare `model_type: llama` load here.

use anyhow::{ensure, Result};
use kernels::{ops, ops::RopeLayout, Tensor, Weight};

use super::{CausalLm, ModelInfo};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::config::ModelConfig;
use crate::layers::{AttentionConfig, GqaAttention, Linear, RmsNorm, Rope, SwiGlu};
use crate::weights::WeightStore;

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

/// What a family adds to the plain decoder.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// `ModelInfo::family`.
    pub family: &'static str,
    /// Per-head RMSNorm on q and k before RoPE (`self_attn.{q,k}_norm`).
    pub qk_norm: bool,
    pub scales: Scales,
}

impl Variant {
    pub const LLAMA: Variant = Variant {
        family: "llama",
        qk_norm: false,
        scales: Scales {
            embed: None,
            residual: None,
            logits: None,
        },
    };
}

struct Block {
    input_norm: RmsNorm,
    attn: GqaAttention,
    post_norm: RmsNorm,
    mlp: SwiGlu,
}

pub struct Llama {
    info: ModelInfo,
    embed: Weight,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Weight,
    kv_heads: usize,
    head_dim: usize,
    scales: Scales,
}

/// `layer_types` (`full_attention` / `sliding_attention`) as a per-layer sliding window.
fn layer_windows(cfg: &ModelConfig, layers: usize) -> Result<Vec<Option<usize>>> {
    let file = cfg.path();
    let Some(types) = cfg.opt("layer_types") else {
        return Ok(vec![None; layers]);
    };
    let types = types.as_array().filter(|t| t.len() == layers);
    let types = types.ok_or_else(|| {
        anyhow::anyhow!(
            "{}: field `layer_types` must be a list of {layers} layer kinds",
            file.display()
        )
    })?;
    let mut window = None;
    types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("full_attention") => Ok(None),
            Some("sliding_attention") => {
                if window.is_none() {
                    window = Some(cfg.width("sliding_window")?);
                }
                Ok(window)
            }
            _ => anyhow::bail!(
                "{}: field `layer_types[{i}]` = {t} is not a layer kind (full_attention, sliding_attention)",
                file.display()
            ),
        })
        .collect()
}

impl Llama {
    pub fn load(cfg: &ModelConfig, store: &WeightStore, variant: Variant) -> Result<Llama> {
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", heads)?;
        let head_dim = cfg.width_or("head_dim", (hidden / heads).max(1))?;
        let inter = cfg.width("intermediate_size")?;
        let vocab = cfg.vocab_size()?;
        let eps = cfg.rms_norm_eps(1e-6)?;
        let context = cfg.context_length(32_768)?;
        let attention_bias = cfg.bool_or("attention_bias", false)?;
        let mlp_bias = cfg.bool_or("mlp_bias", false)?;
        let windows = layer_windows(cfg, layers)?;
        let config_file = cfg.path();
        ensure!(
            heads % kv_heads == 0,
            "{}: fields `num_attention_heads` ({heads}) must be a multiple of `num_key_value_heads` ({kv_heads})",
            config_file.display()
        );
        ensure!(
            head_dim % 2 == 0,
            "{}: the head dimension ({head_dim}, field `head_dim` or `hidden_size / num_attention_heads`) must be even for RoPE",
            config_file.display()
        );
        let quant = &cfg.quant;
        let rope = Rope::from_config(cfg, head_dim, RopeLayout::HalfSplit)?;
        let embed = store.weight(
            "model.embed_tokens",
            quant.spec_for("model.embed_tokens"),
            vocab,
            hidden,
        )?;
        let mut blocks = Vec::with_capacity(layers);
        for (i, window) in windows.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let attn_lin = |name: &str, out, inp| {
                let prefix = format!("{p}.self_attn.{name}");
                Linear::load_with_bias(store, quant, &prefix, out, inp, attention_bias)
            };
            let head_norm = |name: &str| -> Result<Option<RmsNorm>> {
                variant
                    .qk_norm
                    .then(|| {
                        let name = format!("{p}.self_attn.{name}.weight");
                        RmsNorm::load(store, &name, head_dim, eps)
                    })
                    .transpose()
            };
            let mlp_lin = |name: &str, out, inp| {
                let prefix = format!("{p}.mlp.{name}");
                Linear::load_with_bias(store, quant, &prefix, out, inp, mlp_bias)
            };
            blocks.push(Block {
                input_norm: RmsNorm::load(
                    store,
                    &format!("{p}.input_layernorm.weight"),
                    hidden,
                    eps,
                )?,
                attn: GqaAttention {
                    cfg: AttentionConfig {
                        heads,
                        kv_heads,
                        head_dim,
                        scale: 1.0 / (head_dim as f32).sqrt(),
                        window: *window,
                        softcap: None,
                    },
                    q_proj: attn_lin("q_proj", heads * head_dim, hidden)?,
                    k_proj: attn_lin("k_proj", kv_heads * head_dim, hidden)?,
                    v_proj: attn_lin("v_proj", kv_heads * head_dim, hidden)?,
                    o_proj: attn_lin("o_proj", hidden, heads * head_dim)?,
                    q_norm: head_norm("q_norm")?,
                    k_norm: head_norm("k_norm")?,
                    rope: rope.clone(),
                    output_gate: false,
                },
                post_norm: RmsNorm::load(
                    store,
                    &format!("{p}.post_attention_layernorm.weight"),
                    hidden,
                    eps,
                )?,
                mlp: SwiGlu {
                    gate: mlp_lin("gate_proj", inter, hidden)?,
                    up: mlp_lin("up_proj", inter, hidden)?,
                    down: mlp_lin("down_proj", hidden, inter)?,
                },
            });
        }
        let norm = RmsNorm::load(store, "model.norm.weight", hidden, eps)?;
        // Tied unless the checkpoint stores a head (some tied checkpoints still store one).
        let untied = store.contains("lm_head.weight");
        let lm_head = if untied {
            store.weight("lm_head", quant.spec_for("lm_head"), vocab, hidden)?
        } else {
            ensure!(
                cfg.bool_or("tie_word_embeddings", true)?,
                "{}: tensor `lm_head.weight` is missing and `tie_word_embeddings` is false",
                cfg.dir.display()
            );
            embed.clone()
        };

        let mut weights: Vec<&Weight> = vec![&embed];
        let mut parameters = embed.numel() + hidden;
        if untied {
            weights.push(&lm_head);
            parameters += lm_head.numel();
        }
        for b in &blocks {
            let a = &b.attn;
            for l in [
                &a.q_proj,
                &a.k_proj,
                &a.v_proj,
                &a.o_proj,
                &b.mlp.gate,
                &b.mlp.up,
                &b.mlp.down,
            ] {
                weights.push(&l.weight);
                parameters += l.weight.numel() + l.bias.as_ref().map_or(0, |t| t.numel());
            }
            let head_norms = [&a.q_norm, &a.k_norm].into_iter().flatten();
            parameters += 2 * hidden + head_norms.map(|n| n.weight.numel()).sum::<usize>();
        }
        let layer_kinds = windows
            .iter()
            .map(|w| match w {
                None => "full_attention".to_string(),
                Some(w) => format!("sliding_attention({w})"),
            })
            .collect();
        let info = ModelInfo {
            family: variant.family.into(),
            parameters,
            weight_formats: super::formats(weights),
            layer_kinds,
            context_length: context,
            vocab_size: vocab,
            hidden_size: hidden,
            moe: None,
        };
        Ok(Llama {
            info,
            embed,
            blocks,
            norm,
            lm_head,
            kv_heads,
            head_dim,
            scales: variant.scales,
        })
    }
}

/// `x · s` when a scale is set.
fn scaled(x: Tensor, s: Option<f32>) -> Result<Tensor> {
    Ok(match s {
        Some(s) => ops::scale(&x, s)?,
        None => x,
    })
}

impl CausalLm for Llama {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        ModelState::new(
            self.blocks
                .iter()
                // Sliding layers rotate: their memory is bounded by the window.
                .map(|b| {
                    LayerState::Kv(KvCache::for_layer(
                        self.kv_heads,
                        self.head_dim,
                        b.attn.cfg.window,
                    ))
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
        for b in &mut self.blocks {
            b.input_norm.to_device(device)?;
            b.attn.to_device(device)?;
            b.post_norm.to_device(device)?;
            b.mlp.to_device(device)?;
        }
        Ok(())
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        let s = self.scales;
        let mut x = scaled(ops::embedding(&self.embed, ids)?, s.embed)?;
        for (block, layer) in self.blocks.iter().zip(state.layers.iter_mut()) {
            let cache = layer.kv_mut()?;
            let h = block.attn.forward(&block.input_norm.forward(&x)?, cache)?;
            x = ops::add(&x, &scaled(h, s.residual)?)?;
            let h = block.mlp.forward(&block.post_norm.forward(&x)?)?;
            x = ops::add(&x, &scaled(h, s.residual)?)?;
        }
        state.pos += ids.len();
        state.settle()?;
        let tail = super::Tail {
            scale: s.logits,
            softcap: None,
        };
        super::lm_logits_with(&x, &self.norm, &self.lm_head, all_logits, tail)
    }

    /// The decode step of several sequences with the weights read once per group of rows
    /// (`Linear::forward_rows`); attention per sequence. On the CPU only: elsewhere the
    /// sequences run one by one.
    fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        if self.device() != kernels::Device::Cpu || ids.len() != states.len() || ids.len() < 2 {
            return super::decode_each(self, ids, states);
        }
        let s = self.scales;
        let mut x = scaled(ops::embedding(&self.embed, ids)?, s.embed)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let mut caches = states
                .iter_mut()
                .map(|st| st.layers[i].kv_mut())
                .collect::<Result<Vec<_>>>()?;
            let h = block
                .attn
                .forward_batch(&block.input_norm.forward(&x)?, &mut caches)?;
            x = ops::add(&x, &scaled(h, s.residual)?)?;
            let h = block.mlp.forward_rows(&block.post_norm.forward(&x)?)?;
            x = ops::add(&x, &scaled(h, s.residual)?)?;
        }
        for st in states.iter_mut() {
            st.pos += 1;
            st.settle()?;
        }
        let tail = super::Tail {
            scale: s.logits,
            softcap: None,
        };
        super::lm_logits_rows(&x, &self.norm, &self.lm_head, tail)
    }
}

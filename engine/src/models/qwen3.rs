//! Qwen3 dense: pre-norm decoder blocks of GQA attention (per-head q/k RMSNorm, RoPE) and a
//! SwiGLU MLP; the LM head is tied to the embedding unless `lm_head.weight` is stored.

use anyhow::{ensure, Result};
use kernels::{ops, ops::RopeLayout, Tensor, Weight};

use super::{CausalLm, ModelInfo};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::config::ModelConfig;
use crate::layers::{AttentionConfig, GqaAttention, Linear, RmsNorm, Rope, SwiGlu};
use crate::weights::WeightStore;

struct Block {
    input_norm: RmsNorm,
    attn: GqaAttention,
    post_norm: RmsNorm,
    mlp: SwiGlu,
}

pub struct Qwen3 {
    info: ModelInfo,
    embed: Weight,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Weight,
    kv_heads: usize,
    head_dim: usize,
}

impl Qwen3 {
    pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Qwen3> {
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", heads)?;
        let head_dim = cfg.width_or("head_dim", (hidden / heads).max(1))?;
        let inter = cfg.width("intermediate_size")?;
        let vocab = cfg.vocab_size()?;
        let eps = cfg.rms_norm_eps(1e-6)?;
        let context = cfg.context_length(32_768)?;
        let config_file = cfg.dir.join("config.json");
        ensure!(
            heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
            "{}: fields `num_attention_heads` ({heads}) must be a positive multiple of `num_key_value_heads` ({kv_heads})",
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
        for i in 0..layers {
            let p = format!("model.layers.{i}");
            let lin = |name: &str, out, inp| {
                Linear::load(store, quant, &format!("{p}.self_attn.{name}"), out, inp)
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
                        window: None,
                        softcap: None,
                    },
                    q_proj: lin("q_proj", heads * head_dim, hidden)?,
                    k_proj: lin("k_proj", kv_heads * head_dim, hidden)?,
                    v_proj: lin("v_proj", kv_heads * head_dim, hidden)?,
                    o_proj: lin("o_proj", hidden, heads * head_dim)?,
                    q_norm: Some(RmsNorm::load(
                        store,
                        &format!("{p}.self_attn.q_norm.weight"),
                        head_dim,
                        eps,
                    )?),
                    k_norm: Some(RmsNorm::load(
                        store,
                        &format!("{p}.self_attn.k_norm.weight"),
                        head_dim,
                        eps,
                    )?),
                    rope: rope.clone(),
                    output_gate: false,
                },
                post_norm: RmsNorm::load(
                    store,
                    &format!("{p}.post_attention_layernorm.weight"),
                    hidden,
                    eps,
                )?,
                mlp: SwiGlu::load(store, quant, &format!("{p}.mlp"), hidden, inter)?,
            });
        }
        let norm = RmsNorm::load(store, "model.norm.weight", hidden, eps)?;
        // Tied unless the checkpoint stores a head (some tied checkpoints still store one).
        let lm_head = if store.contains("lm_head.weight") {
            store.weight("lm_head", quant.spec_for("lm_head"), vocab, hidden)?
        } else {
            ensure!(
                cfg.bool_or("tie_word_embeddings", true)?,
                "{}: tensor `lm_head.weight` is missing and `tie_word_embeddings` is false",
                cfg.dir.display()
            );
            embed.clone()
        };
        let mut all: Vec<&Weight> = vec![&embed];
        for b in &blocks {
            for l in [
                &b.attn.q_proj,
                &b.attn.k_proj,
                &b.attn.v_proj,
                &b.attn.o_proj,
                &b.mlp.gate,
                &b.mlp.up,
                &b.mlp.down,
            ] {
                all.push(&l.weight);
            }
        }
        let tied = !store.contains("lm_head.weight");
        let mut parameters: usize = all.iter().map(|w| w.numel()).sum();
        parameters += layers * (2 * hidden + 2 * head_dim) + hidden;
        if !tied {
            parameters += lm_head.numel();
            all.push(&lm_head);
        }
        let info = ModelInfo {
            family: "qwen3".into(),
            parameters,
            weight_formats: super::formats(all),
            layer_kinds: vec!["full_attention".into(); layers],
            context_length: context,
            vocab_size: vocab,
            hidden_size: hidden,
            moe: None,
        };
        Ok(Qwen3 {
            info,
            embed,
            blocks,
            norm,
            lm_head,
            kv_heads,
            head_dim,
        })
    }
}

impl CausalLm for Qwen3 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        ModelState::new(
            (0..self.blocks.len())
                .map(|_| LayerState::Kv(KvCache::new(self.kv_heads, self.head_dim, 0)))
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
        let mut x = ops::embedding(&self.embed, ids)?;
        for (block, layer) in self.blocks.iter().zip(state.layers.iter_mut()) {
            let cache = layer.kv_mut()?;
            let h = block.attn.forward(&block.input_norm.forward(&x)?, cache)?;
            x = ops::add(&x, &h)?;
            let h = block.mlp.forward(&block.post_norm.forward(&x)?)?;
            x = ops::add(&x, &h)?;
        }
        state.pos += ids.len();
        super::lm_logits(&x, &self.norm, &self.lm_head, all_logits)
    }
}

//! MiniCPM (`MiniCPMForCausalLM`): the Llama decoder with μP scales: embeddings times
//! `scale_emb`, each residual branch times `scale_depth / √num_hidden_layers`, and the final
//! hidden state divided by `hidden_size / dim_model_base` before the LM head.
//!
//! The logit scale follows transformers' MiniCPM, which applies it whether or not the head is
//! tied; mlx-lm 0.32.2 skips it for tied heads (greedy tokens agree, log-probs do not).

use anyhow::Result;

use super::llama::{Scales, Variant};
use super::Dense;
use crate::config::ModelConfig;
use crate::weights::WeightStore;

pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Dense> {
    let positive = |x: f64| x > 0.0;
    let scale_emb = cfg.f64_where("scale_emb", 1.0, "a positive number", positive)?;
    let scale_depth = cfg.f64_where("scale_depth", 1.0, "a positive number", positive)?;
    let layers = cfg.layer_count("num_hidden_layers")?;
    let hidden = cfg.width("hidden_size")?;
    let dim_model_base = cfg.f64_where(
        "dim_model_base",
        hidden as f64,
        "a positive number",
        positive,
    )?;
    let variant = Variant {
        family: "minicpm",
        scales: Scales {
            embed: Some(scale_emb as f32),
            residual: Some((scale_depth / (layers as f64).sqrt()) as f32),
            logits: Some((dim_model_base / hidden as f64) as f32),
        },
        ..Default::default()
    };
    super::llama::load(cfg, store, variant)
}

//! Qwen3 dense: the Llama decoder (`llama.rs`) with per-head RMSNorm on q and k before RoPE.

use anyhow::Result;

use super::llama::{Scales, Variant};
use super::Dense;
use crate::config::ModelConfig;
use crate::weights::WeightStore;

pub const VARIANT: Variant = Variant {
    family: "qwen3",
    qk_norm: true,
    scales: Scales {
        embed: None,
        residual: None,
        logits: None,
    },
};

pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Dense> {
    super::llama::load(cfg, store, VARIANT)
}

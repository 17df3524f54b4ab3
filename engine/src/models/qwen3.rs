//! Qwen3 dense: the Llama decoder (`llama.rs`) with per-head RMSNorm on q and k before RoPE.

use anyhow::Result;

use super::llama::Variant;
use super::Dense;
use crate::config::ModelConfig;
use crate::weights::WeightStore;

pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Dense> {
    let variant = Variant {
        family: "qwen3",
        qk_norm: true,
        ..Default::default()
    };
    super::llama::load(cfg, store, variant)
}

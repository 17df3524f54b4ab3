//! Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): the Llama decoder (`llama.rs`) with biases on the
//! q, k and v projections (none on `o_proj`), no q/k norm, RoPE θ from `rope_theta` (1e6 in
//! released configs), the head dim `hidden / heads`. The head is tied unless `lm_head.weight`
//! is stored, as mlx-lm loads it. Facts from mlx-lm 0.32 (`qwen2.py`) and transformers 5.23
//! (`modeling_qwen2.py`).

use anyhow::Result;

use super::llama::Variant;
use super::Dense;
use crate::config::ModelConfig;
use crate::weights::WeightStore;

/// Refuses `use_sliding_window: true` (transformers then slides layers from
/// `max_window_layers` on; mlx-lm ignores it): released checkpoints leave it off.
pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Dense> {
    anyhow::ensure!(
        !cfg.bool_or("use_sliding_window", false)?,
        "{}: field `use_sliding_window` = true is not supported (Qwen2's sliding layers)",
        cfg.path().display()
    );
    let variant = Variant {
        family: "qwen2",
        qkv_bias: true,
        ..Default::default()
    };
    super::llama::load(cfg, store, variant)
}

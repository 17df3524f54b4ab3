use anyhow::{bail, Result};
use kernels::{ops, ops::RopeLayout, Tensor};

use crate::config::ModelConfig;

/// Rotary position embedding: per-pair inverse frequencies over the rotated part of a head.
#[derive(Debug, Clone)]
pub struct Rope {
    pub inv_freq: Vec<f32>,
    pub layout: RopeLayout,
    /// `θ` when `inv_freq` is the plain `θ^(−2i/dims)`: the MLX backend then lets MLX derive
    /// the frequencies from it, as mlx-lm's `nn.RoPE` does (same bits as mlx-lm); the CPU
    /// backend always uses `inv_freq`.
    pub base: Option<f32>,
}

impl Rope {
    /// Standard RoPE over the first `rot_dims` (even) dims of a head: `θ^(−2i/rot_dims)`.
    pub fn new(theta: f64, rot_dims: usize, layout: RopeLayout) -> Rope {
        let half = rot_dims / 2;
        let inv_freq = (0..half)
            .map(|i| (1.0 / theta.powf(2.0 * i as f64 / rot_dims as f64)) as f32)
            .collect();
        Rope {
            inv_freq,
            layout,
            base: Some(theta as f32),
        }
    }

    /// Reads `rope_theta` (and rejects scaling schemes not implemented yet, rather than
    /// silently computing something else).
    pub fn from_config(cfg: &ModelConfig, rot_dims: usize, layout: RopeLayout) -> Result<Rope> {
        let theta = cfg.rope_theta(10_000.0)?;
        if let Some(s) = cfg.opt("rope_scaling").filter(|v| !v.is_null()) {
            let kind = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            if kind != "default" {
                bail!(
                    "{}: field `rope_scaling.rope_type` = {kind:?} is not supported yet",
                    cfg.dir.join("config.json").display()
                );
            }
        }
        Ok(Rope::new(theta, rot_dims, layout))
    }

    /// Rotates `x` `[T, H, D]` for the given absolute positions.
    pub fn forward(&self, x: &Tensor, positions: &[usize]) -> Result<Tensor> {
        Ok(ops::rope_with_base(
            x,
            positions,
            &self.inv_freq,
            self.base,
            self.layout,
        )?)
    }
}

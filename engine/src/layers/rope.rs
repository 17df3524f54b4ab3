use anyhow::{anyhow, bail, Result};
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

/// `θ^(−2i/rot_dims)` for each rotated pair, in f64.
fn plain_inv_freq(theta: f64, rot_dims: usize) -> impl Iterator<Item = f64> {
    (0..rot_dims / 2).map(move |i| 1.0 / theta.powf(2.0 * i as f64 / rot_dims as f64))
}

/// Llama 3's frequency-dependent scaling: wavelengths longer than `old_context / low` are
/// stretched by `factor`, shorter than `old_context / high` kept, and the band between blended
/// smoothly (the rule of Meta's reference code, transformers and mlx-lm).
fn llama3_inv_freq(inv_freq: f64, factor: f64, low: f64, high: f64, old_context: f64) -> f64 {
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    if wavelen > old_context / low {
        inv_freq / factor
    } else if wavelen < old_context / high {
        inv_freq
    } else {
        let smooth = (old_context / wavelen - low) / (high - low);
        ((1.0 - smooth) / factor + smooth) * inv_freq
    }
}

impl Rope {
    /// Standard RoPE over the first `rot_dims` (even) dims of a head: `θ^(−2i/rot_dims)`.
    pub fn new(theta: f64, rot_dims: usize, layout: RopeLayout) -> Rope {
        let inv_freq = plain_inv_freq(theta, rot_dims).map(|f| f as f32).collect();
        Rope {
            inv_freq,
            layout,
            base: Some(theta as f32),
        }
    }

    /// Reads `rope_theta` and `rope_scaling` (`default`, `linear` or `llama3`; other schemes are
    /// refused rather than silently computed as something else).
    pub fn from_config(cfg: &ModelConfig, rot_dims: usize, layout: RopeLayout) -> Result<Rope> {
        let theta = cfg.rope_theta(10_000.0)?;
        Rope::scaled(
            cfg,
            theta,
            ("rope_scaling", cfg.opt("rope_scaling")),
            rot_dims,
            layout,
        )
    }

    /// RoPE of base `theta` with the scaling block `scaling` (`default`, `linear` or `llama3`),
    /// whose errors name it as the config field `field`.
    pub fn scaled(
        cfg: &ModelConfig,
        theta: f64,
        (field, scaling): (&str, Option<&serde_json::Value>),
        rot_dims: usize,
        layout: RopeLayout,
    ) -> Result<Rope> {
        let plain = Rope::new(theta, rot_dims, layout);
        let Some(s) = scaling else {
            return Ok(plain);
        };
        let file = cfg.path();
        let kind = s
            .get("rope_type")
            .or_else(|| s.get("type"))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        // A positive, finite number from `rope_scaling`, or `default` when absent.
        let num = |key: &str, default: Option<f64>| -> Result<f64> {
            match s.get(key).filter(|v| !v.is_null()) {
                None => default
                    .ok_or_else(|| anyhow!("{}: field `{field}.{key}` is missing", file.display())),
                Some(v) => match v.as_f64() {
                    Some(x) if x.is_finite() && x > 0.0 => Ok(x),
                    _ => bail!(
                        "{}: field `{field}.{key}` must be a positive number, got {v}",
                        file.display()
                    ),
                },
            }
        };
        let inv_freq: Vec<f32> = match kind {
            "default" => return Ok(plain),
            // Positions divided by `factor`: every frequency divided by it.
            "linear" => {
                let factor = num("factor", None)?;
                plain_inv_freq(theta, rot_dims)
                    .map(|f| (f / factor) as f32)
                    .collect()
            }
            "llama3" => {
                let factor = num("factor", None)?;
                let low = num("low_freq_factor", Some(1.0))?;
                let high = num("high_freq_factor", Some(4.0))?;
                let old_context = num("original_max_position_embeddings", Some(8192.0))?;
                if high <= low {
                    bail!(
                        "{}: field `{field}.high_freq_factor` ({high}) must exceed `low_freq_factor` ({low})",
                        file.display()
                    );
                }
                plain_inv_freq(theta, rot_dims)
                    .map(|f| llama3_inv_freq(f, factor, low, high, old_context) as f32)
                    .collect()
            }
            other => bail!(
                "{}: field `{field}.rope_type` = {other:?} is not supported (supported: default, linear, llama3)",
                file.display()
            ),
        };
        // Scaled frequencies are no longer `θ^(−2i/d)`: MLX must take them explicitly.
        Ok(Rope {
            inv_freq,
            layout,
            base: None,
        })
    }

    /// The RoPE of one layer kind (`sliding_attention`, `full_attention`) from
    /// `rope_parameters.<kind>`, transformers 5's per-kind form (Gemma 3 and 4 write it):
    /// `rope_theta` and `rope_type`, else the family's `defaults` (θ, type, partial factor).
    /// Types: those of [`Rope::scaled`], and `proportional` (Gemma 4: frequencies
    /// `1 / (factor·θ^(2i/head_dim))` on the first `partial_rotary_factor·head_dim / 2` pairs
    /// of the half-split head, the other pairs unrotated).
    pub fn of_kind(
        cfg: &ModelConfig,
        kind: &str,
        head_dim: usize,
        (default_theta, default_type, default_partial): (f64, &str, f64),
    ) -> Result<Rope> {
        let file = cfg.path();
        let field = format!("rope_parameters.{kind}");
        let params = cfg.opt("rope_parameters").and_then(|p| p.get(kind));
        let num = |key: &str, default: f64| -> Result<f64> {
            match params.and_then(|p| p.get(key)).filter(|v| !v.is_null()) {
                None => Ok(default),
                Some(v) => v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                    anyhow!(
                        "{}: field `{field}.{key}` must be a number, got {v}",
                        file.display()
                    )
                }),
            }
        };
        let theta = num("rope_theta", default_theta)?;
        let theta =
            crate::config::limits::check_rope_theta(cfg, &format!("{field}.rope_theta"), theta)?;
        let rope_type = params
            .and_then(|p| p.get("rope_type"))
            .and_then(|v| v.as_str())
            .unwrap_or(default_type);
        let layout = RopeLayout::HalfSplit;
        if rope_type != "proportional" {
            let scaling = serde_json::json!({"rope_type": rope_type});
            let scaling = params
                .filter(|p| p.get("rope_type").is_some())
                .unwrap_or(&scaling);
            return Rope::scaled(cfg, theta, (&field, Some(scaling)), head_dim, layout);
        }
        let partial = num("partial_rotary_factor", default_partial)?;
        let factor = num("factor", 1.0)?;
        if !(0.0..=1.0).contains(&partial) || factor <= 0.0 {
            bail!(
                "{}: fields `{field}.partial_rotary_factor` ({partial}) must be in [0, 1] and `{field}.factor` ({factor}) positive",
                file.display()
            );
        }
        let rotated_pairs = (head_dim as f64 * partial) as usize / 2;
        let inv_freq = (0..head_dim / 2)
            .map(|i| match i < rotated_pairs {
                true => (1.0 / (factor * theta.powf((2 * i) as f64 / head_dim as f64))) as f32,
                false => 0.0, // an unrotated pair
            })
            .collect();
        Ok(Rope {
            inv_freq,
            layout,
            base: None,
        })
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use approx::assert_relative_eq;
    use serde_json::json;

    use super::*;

    fn rope_of(scaling: serde_json::Value) -> Result<Rope> {
        let cfg = ModelConfig::from_value(
            Path::new("/ckpt"),
            json!({"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": scaling}),
        )?;
        Rope::from_config(&cfg, 64, RopeLayout::HalfSplit)
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies_stretches_low_ones_and_blends_between() {
        let plain = Rope::new(500000.0, 64, RopeLayout::HalfSplit);
        let scaled = rope_of(json!({"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}))
        .unwrap();
        assert!(
            scaled.base.is_none(),
            "scaled frequencies must reach MLX explicitly"
        );
        let (mut kept, mut stretched, mut blended) = (0, 0, 0);
        for (&p, &s) in plain.inv_freq.iter().zip(&scaled.inv_freq) {
            let wavelen = 2.0 * std::f64::consts::PI / p as f64;
            if wavelen < 8192.0 / 4.0 {
                assert_eq!(s, p, "short wavelengths are kept");
                kept += 1;
            } else if wavelen > 8192.0 {
                assert_relative_eq!(s, p / 32.0, max_relative = 1e-6);
                stretched += 1;
            } else {
                assert!(
                    s < p && s > p / 32.0,
                    "blend band: {s} not within ({}, {p})",
                    p / 32.0
                );
                blended += 1;
            }
        }
        assert!(
            kept > 0 && stretched > 0 && blended > 0,
            "{kept} {stretched} {blended}"
        );
        // The blend is continuous at both edges of its band.
        let edge_low = 2.0 * std::f64::consts::PI / (8192.0 * (1.0 - 1e-9));
        assert_relative_eq!(
            llama3_inv_freq(edge_low, 32.0, 1.0, 4.0, 8192.0),
            edge_low / 32.0,
            max_relative = 1e-6
        );
        let edge_high = 2.0 * std::f64::consts::PI / (2048.0 * (1.0 + 1e-9));
        assert_relative_eq!(
            llama3_inv_freq(edge_high, 32.0, 1.0, 4.0, 8192.0),
            edge_high,
            max_relative = 1e-6
        );
    }

    #[test]
    fn linear_scaling_divides_every_frequency_and_default_keeps_the_base() {
        let plain = Rope::new(500000.0, 64, RopeLayout::HalfSplit);
        let linear = rope_of(json!({"type": "linear", "factor": 4.0})).unwrap();
        for (&p, &s) in plain.inv_freq.iter().zip(&linear.inv_freq) {
            assert_relative_eq!(s, p / 4.0, max_relative = 1e-6);
        }
        let default = rope_of(json!({"rope_type": "default"})).unwrap();
        assert_eq!(default.inv_freq, plain.inv_freq);
        assert_eq!(default.base, Some(500000.0));
    }

    #[test]
    fn bad_scaling_is_an_error_naming_the_field() {
        for (scaling, field) in [
            (
                json!({"rope_type": "yarn", "factor": 4.0}),
                "rope_scaling.rope_type",
            ),
            (json!({"rope_type": "llama3"}), "rope_scaling.factor"),
            (
                json!({"rope_type": "linear", "factor": -2.0}),
                "rope_scaling.factor",
            ),
            (
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
                "rope_scaling.high_freq_factor",
            ),
        ] {
            let err = format!("{:#}", rope_of(scaling).unwrap_err());
            assert!(err.contains(field) && err.contains("config.json"), "{err}");
        }
    }
}

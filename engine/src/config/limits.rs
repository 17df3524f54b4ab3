//! Checked getters for the config.json values that size allocations or feed the numerics, so
//! every family validates them the same way, before anything is allocated. A checkpoint folder
//! is untrusted input: a width of 10^18 must be an error naming the field, not an abort inside
//! `Vec::with_capacity`, and a `rope_theta` of 0 must be refused at load, not show up as NaN
//! logits.
//!
//! The bounds are far above any released model (hidden sizes ≤ 32k, vocabularies ≤ 262k,
//! ≤ 128 layers, contexts ≤ 10M) and low enough that products of two widths cannot overflow.

use std::ops::RangeInclusive;

use anyhow::{bail, Result};
use serde_json::Value;

use super::{as_usize, ModelConfig};

/// Widths: hidden and intermediate sizes, head counts, head dims, kernel sizes.
pub const MAX_WIDTH: usize = 1 << 20;
/// Decoder layers (also MTP layers).
pub const MAX_LAYERS: usize = 1 << 12;
/// Embedding rows.
pub const MAX_VOCAB: usize = 1 << 24;
/// Positions (`max_position_embeddings`): only bounds requests, never allocated up front.
pub const MAX_CONTEXT: usize = 1 << 32;

impl ModelConfig {
    /// A required integer in `range`.
    pub fn usize_in(&self, key: &str, range: RangeInclusive<usize>) -> Result<usize> {
        let v = self.opt(key).ok_or_else(|| self.missing(key))?;
        self.check_usize(key, v, range)
    }

    /// An optional integer in `range` (`default` when absent; the default is not checked).
    pub fn usize_in_or(
        &self,
        key: &str,
        default: usize,
        range: RangeInclusive<usize>,
    ) -> Result<usize> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => self.check_usize(key, v, range),
        }
    }

    fn check_usize(&self, key: &str, v: &Value, range: RangeInclusive<usize>) -> Result<usize> {
        match as_usize(v) {
            Some(n) if range.contains(&n) => Ok(n),
            _ => Err(self.wrong(
                key,
                &format!("an integer in {}..={}", range.start(), range.end()),
                v,
            )),
        }
    }

    /// A width (hidden size, head count, head dim, ...): 1..=[`MAX_WIDTH`].
    pub fn width(&self, key: &str) -> Result<usize> {
        self.usize_in(key, 1..=MAX_WIDTH)
    }

    pub fn width_or(&self, key: &str, default: usize) -> Result<usize> {
        self.usize_in_or(key, default, 1..=MAX_WIDTH)
    }

    /// A layer count: 1..=[`MAX_LAYERS`].
    pub fn layer_count(&self, key: &str) -> Result<usize> {
        self.usize_in(key, 1..=MAX_LAYERS)
    }

    /// `vocab_size`: 1..=[`MAX_VOCAB`] (the embedding's shape is then checked against it).
    pub fn vocab_size(&self) -> Result<usize> {
        self.usize_in("vocab_size", 1..=MAX_VOCAB)
    }

    /// `max_position_embeddings` (or `default`): 2..=[`MAX_CONTEXT`], room for a prompt token and
    /// a generated one.
    pub fn context_length(&self, default: usize) -> Result<usize> {
        self.usize_in_or("max_position_embeddings", default, 2..=MAX_CONTEXT)
    }

    /// A finite number for which `ok` holds (`default` when absent); `want` says what `ok` asks.
    pub fn f64_where(
        &self,
        key: &str,
        default: f64,
        want: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && ok(x) => Ok(x),
                _ => Err(self.wrong(key, want, v)),
            },
        }
    }

    /// `rope_theta` at the top level of the text config: positive and finite (0 makes the
    /// frequencies infinite, a negative base makes them NaN, and every logit follows).
    pub fn rope_theta(&self, default: f64) -> Result<f64> {
        self.f64_where("rope_theta", default, "a positive number", |x| x > 0.0)
    }

    /// `rms_norm_eps`: finite, in [0, 1) (a negative epsilon takes the square root of a negative
    /// number on quiet rows).
    pub fn rms_norm_eps(&self, default: f64) -> Result<f32> {
        let eps = self.f64_where("rms_norm_eps", default, "a number in [0, 1)", |x| {
            (0.0..1.0).contains(&x)
        })?;
        Ok(eps as f32)
    }
}

/// Checks a `rope_theta` read from somewhere other than the text config's top level (e.g.
/// Qwen3.5's `rope_parameters`); `field` names it in the error.
pub fn check_rope_theta(cfg: &ModelConfig, field: &str, theta: f64) -> Result<f64> {
    if !(theta.is_finite() && theta > 0.0) {
        bail!(
            "{}: field `{field}` must be a positive number, got {theta}",
            cfg.path().display()
        );
    }
    Ok(theta)
}

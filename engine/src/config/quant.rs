//! The `quantization` block mlx-lm writes into config.json (and mirrors as
//! `quantization_config`): `group_size`, `bits`, optional `mode` (default `affine`), and entries
//! keyed by module path that override the default for one module — a dict of the same fields,
//! `false` for a module kept unquantized, or `true` for the default.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use kernels::{QuantMode, QuantSpec};
use serde_json::{Map, Value};

use super::{as_usize, short};

/// Default quantization plus per-module overrides (`None` = stored unquantized).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuantConfig {
    pub default: Option<QuantSpec>,
    pub overrides: BTreeMap<String, Option<QuantSpec>>,
}

impl QuantConfig {
    /// Reads the block from config.json's root, falling back to `text_config` (where some
    /// multimodal conversions put it) and to the legacy `quantization_config` spelling.
    pub(crate) fn from_root(root: &Value, path: &Path) -> Result<QuantConfig> {
        let text = root.get("text_config");
        let candidates = [
            ("quantization", root.get("quantization")),
            ("quantization", text.and_then(|t| t.get("quantization"))),
            ("quantization_config", root.get("quantization_config")),
            (
                "quantization_config",
                text.and_then(|t| t.get("quantization_config")),
            ),
        ];
        for (field, value) in candidates {
            match value {
                None | Some(Value::Null) => continue,
                Some(Value::Object(block)) => return parse_block(block, field, path),
                Some(other) => bail!(
                    "{}: field `{field}` must be an object, got {}",
                    path.display(),
                    short(other)
                ),
            }
        }
        Ok(QuantConfig::default())
    }

    /// The spec of `module` (e.g. `model.layers.0.self_attn.q_proj`): its override if it has
    /// one, else the default. Whether a module without an override is actually quantized is
    /// decided by the checkpoint (a `.scales` tensor beside the weight), as mlx-lm does.
    pub fn spec_for(&self, module: &str) -> Option<QuantSpec> {
        match self.overrides.get(module) {
            Some(s) => *s,
            None => self.default,
        }
    }

    /// True when `module` is explicitly listed as unquantized (`"module": false`).
    pub fn is_excluded(&self, module: &str) -> bool {
        matches!(self.overrides.get(module), Some(None))
    }
}

const SPEC_KEYS: [&str; 3] = ["group_size", "bits", "mode"];

fn parse_block(block: &Map<String, Value>, field: &str, path: &Path) -> Result<QuantConfig> {
    // Hugging Face quantizers (`quant_method`) store weights in their own layouts; like mlx-lm,
    // only MXFP4 is read directly (as MLX's mxfp4), the rest need converting first.
    if let Some(method) = block.get("quant_method") {
        let method = method.as_str().unwrap_or_default();
        if method == "mxfp4" {
            let spec = QuantSpec::new(QuantMode::Mxfp4, 4, 32)?;
            return Ok(QuantConfig {
                default: Some(spec),
                overrides: BTreeMap::new(),
            });
        }
        bail!(
            "{}: field `{field}.quant_method`: `{method}` is not supported; convert the checkpoint with \
             mlx_lm.convert (MLX affine/mxfp4/nvfp4/mxfp8 are supported)",
            path.display(),
        );
    }
    let default = Some(parse_spec(block, path, field)?);
    let mut overrides = BTreeMap::new();
    for (key, value) in block {
        if SPEC_KEYS.contains(&key.as_str()) {
            continue;
        }
        let spec = match value {
            Value::Bool(false) => None,
            Value::Bool(true) => default,
            Value::Object(entry) => Some(parse_spec(entry, path, &format!("{field}.{key}"))?),
            other => bail!(
                "{}: field `{field}.{key}` must be false, true or {{group_size, bits, mode}}, \
                 got {}",
                path.display(),
                short(other)
            ),
        };
        overrides.insert(key.clone(), spec);
    }
    Ok(QuantConfig { default, overrides })
}

/// One `{group_size, bits, mode}` set found at field `base`; missing sizes take the mode's
/// defaults, as MLX does.
fn parse_spec(obj: &Map<String, Value>, path: &Path, base: &str) -> Result<QuantSpec> {
    let at = |key: &str| format!("{}: field `{base}.{key}`", path.display());
    let mode = match obj.get("mode") {
        None | Some(Value::Null) => QuantMode::Affine,
        Some(Value::String(s)) => QuantMode::parse(s).ok_or_else(|| {
            anyhow!(
                "{} is `{s}`, expected one of affine, mxfp4, nvfp4, mxfp8",
                at("mode")
            )
        })?,
        Some(other) => bail!("{} must be a string, got {}", at("mode"), short(other)),
    };
    let (default_bits, default_group) = mode.fixed_bits_group().unwrap_or((4, 64));
    let int = |key: &str, default: usize| -> Result<usize> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => as_usize(v).ok_or_else(|| {
                anyhow!(
                    "{} must be a non-negative integer, got {}",
                    at(key),
                    short(v)
                )
            }),
        }
    };
    let group_size = int("group_size", default_group)?;
    let bits = int("bits", default_bits)?;
    QuantSpec::new(mode, bits, group_size)
        .map_err(|e| anyhow!("{}: field `{base}`: {e}", path.display()))
}

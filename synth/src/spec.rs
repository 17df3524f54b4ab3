//! What to synthesise: family, size, weight format, name layout and seed, with the
//! `FAMILY[:SIZE[:FORMAT[:LAYOUT]]]` shorthand used by other harness commands.

use std::fmt;

use anyhow::{bail, Result};
use clap::ValueEnum;
use kernels::{DType, QuantMode, QuantSpec};
use serde_json::{json, Value};

use super::families;

/// Model widths. Each family maps these to its own dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Size {
    /// About half a million parameters: for unit and integration tests (written in under a second).
    Tiny,
    /// The widths of the family's smallest real model (e.g. Qwen3-0.6B): for benchmarks.
    Bench,
}

/// How the weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Format {
    /// Every tensor in float32.
    F32,
    /// Every tensor in bfloat16.
    Bf16,
    /// MLX affine 4-bit, group 64 (mlx-lm's default); other tensors bf16.
    Q4,
    /// MLX affine 8-bit, group 32; other tensors bf16.
    Q8,
    /// MX FP4: E2M1 values, one E8M0 scale per 32; other tensors bf16.
    Mxfp4,
    /// NV FP4: E2M1 values, one E4M3 scale per 16; other tensors bf16.
    Nvfp4,
    /// MX FP8: E4M3 values, one E8M0 scale per 32; other tensors bf16.
    Mxfp8,
}

/// Tensor-name layout: the original Hugging Face checkpoint's, or mlx-lm's converted one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Layout {
    /// As published on the Hugging Face hub (safetensors metadata `format: pt`).
    Hf,
    /// As written by mlx-lm's convert (metadata `format: mlx`); the only layout for quantized
    /// formats, which only mlx-lm writes.
    Mlx,
}

fn value_name<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

fn parse_value<T: ValueEnum>(what: &str, s: &str) -> Result<T> {
    match T::from_str(s, true) {
        Ok(v) => Ok(v),
        Err(_) => {
            let all: Vec<String> = T::value_variants().iter().map(value_name).collect();
            bail!("unknown {what} `{s}`; expected one of: {}", all.join(", "))
        }
    }
}

impl Size {
    pub fn name(self) -> String {
        value_name(&self)
    }
}

impl Layout {
    pub fn name(self) -> String {
        value_name(&self)
    }

    /// The safetensors `__metadata__` a checkpoint of this layout carries.
    pub fn safetensors_metadata(self) -> std::collections::HashMap<String, String> {
        let format = match self {
            Layout::Hf => "pt",
            Layout::Mlx => "mlx",
        };
        // One key: the crate writes a map, whose order would otherwise vary between runs.
        [("format".to_string(), format.to_string())].into()
    }
}

impl Format {
    /// Every format the synthesiser writes, in a stable order.
    pub const ALL: &'static [Format] = &[
        Format::F32,
        Format::Bf16,
        Format::Q4,
        Format::Q8,
        Format::Mxfp4,
        Format::Nvfp4,
        Format::Mxfp8,
    ];

    pub fn name(self) -> String {
        value_name(&self)
    }

    /// The quantization of Linear and Embedding weights, `None` for plain float formats.
    pub fn quant_spec(self) -> Option<QuantSpec> {
        let (mode, bits, group) = match self {
            Format::F32 | Format::Bf16 => return None,
            Format::Q4 => (QuantMode::Affine, 4, 64),
            Format::Q8 => (QuantMode::Affine, 8, 32),
            Format::Mxfp4 => (QuantMode::Mxfp4, 4, 32),
            Format::Nvfp4 => (QuantMode::Nvfp4, 4, 16),
            Format::Mxfp8 => (QuantMode::Mxfp8, 8, 32),
        };
        Some(QuantSpec::new(mode, bits, group).expect("the built-in formats are valid specs"))
    }

    /// The dtype of every tensor that is not quantized (norms, scales and biases included).
    pub fn float_dtype(self) -> DType {
        match self {
            Format::F32 => DType::F32,
            _ => DType::BF16,
        }
    }

    /// config.json's `torch_dtype`.
    pub fn torch_dtype(self) -> &'static str {
        match self.float_dtype() {
            DType::F32 => "float32",
            _ => "bfloat16",
        }
    }

    /// config.json's `quantization` block as mlx-lm writes it (`quantize_model` in
    /// mlx_lm/utils.py): group size, bits and mode. mlx-lm also copies it to
    /// `quantization_config` for the Hugging Face hub; see [`insert_quantization`].
    pub fn quantization_block(self) -> Option<Value> {
        self.quant_spec()
            .map(|q| json!({"group_size": q.group_size, "bits": q.bits, "mode": q.mode.name()}))
    }
}

/// Records modules that a quantized folder keeps at 8 bits (mlx-lm's `quant_predicate` for
/// routers and gates, see [`crate::plan::Store::Matrix8`]) in the `quantization` blocks
/// that [`insert_quantization`] added, by module path; a float folder has none and is unchanged.
pub fn insert_8bit_overrides(config: &mut Value, modules: &[String]) {
    let q = crate::values::MATRIX8;
    let eight = json!({"group_size": q.group_size, "bits": q.bits});
    for key in ["quantization", "quantization_config"] {
        let Some(block) = config.get_mut(key).and_then(|b| b.as_object_mut()) else {
            continue;
        };
        for m in modules {
            block.insert(m.clone(), eight.clone());
        }
    }
}

/// Adds `quantization` and `quantization_config` to a config object when `format` is quantized.
pub fn insert_quantization(config: &mut Value, format: Format) {
    if let (Some(block), Some(obj)) = (format.quantization_block(), config.as_object_mut()) {
        obj.insert("quantization".into(), block.clone());
        obj.insert("quantization_config".into(), block);
    }
}

/// One synthetic checkpoint: everything its bytes depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SynthSpec {
    /// A registered family name, e.g. `qwen3`.
    pub family: String,
    pub size: Size,
    pub format: Format,
    /// `None` = the default: `mlx` for quantized formats, `hf` otherwise.
    pub layout: Option<Layout>,
    pub seed: u64,
}

impl SynthSpec {
    pub fn new(family: &str, size: Size, format: Format) -> SynthSpec {
        SynthSpec {
            family: family.to_string(),
            size,
            format,
            layout: None,
            seed: 0,
        }
    }

    /// Parses `FAMILY[:SIZE[:FORMAT[:LAYOUT]]]`, e.g. `qwen3`, `qwen3:bench:bf16`,
    /// `qwen3:tiny:q4:mlx`. Omitted parts default to `tiny`, `f32` and the format's layout; the
    /// seed is 0 (set the field to change it).
    pub fn parse(s: &str) -> Result<SynthSpec> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 4 || parts.iter().any(|p| p.is_empty()) {
            bail!("bad synthetic model `{s}`: expected FAMILY[:SIZE[:FORMAT[:LAYOUT]]], e.g. qwen3:tiny:q4:mlx");
        }
        families::find(parts[0])?;
        let size = parts
            .get(1)
            .map_or(Ok(Size::Tiny), |p| parse_value("size", p))?;
        let format = parts
            .get(2)
            .map_or(Ok(Format::F32), |p| parse_value("format", p))?;
        let layout = parts.get(3).map(|p| parse_value("layout", p)).transpose()?;
        let spec = SynthSpec {
            family: parts[0].to_string(),
            size,
            format,
            layout,
            seed: 0,
        };
        spec.check()?;
        Ok(spec)
    }

    /// The layout that will be written.
    pub fn resolved_layout(&self) -> Layout {
        self.layout.unwrap_or(match self.format.quant_spec() {
            Some(_) => Layout::Mlx,
            None => Layout::Hf,
        })
    }

    /// Rejects combinations no real tool writes.
    pub fn check(&self) -> Result<()> {
        families::find(&self.family)?;
        if self.format.quant_spec().is_some() && self.resolved_layout() == Layout::Hf {
            bail!(
                "format {} is only written by mlx-lm; use layout mlx (or leave it out)",
                self.format.name()
            );
        }
        Ok(())
    }
}

/// The canonical `FAMILY:SIZE:FORMAT:LAYOUT` form, plus `@SEED` when the seed is not 0; a
/// stable cache key.
impl fmt::Display for SynthSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.family,
            self.size.name(),
            self.format.name(),
            self.resolved_layout().name()
        )?;
        if self.seed != 0 {
            write!(f, "@{}", self.seed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_fills_defaults_and_round_trips() {
        let s = SynthSpec::parse("qwen3").unwrap();
        assert_eq!(
            (s.size, s.format, s.layout),
            (Size::Tiny, Format::F32, None)
        );
        assert_eq!(s.to_string(), "qwen3:tiny:f32:hf");
        let s = SynthSpec::parse("qwen3:bench:q4").unwrap();
        assert_eq!(s.to_string(), "qwen3:bench:q4:mlx");
        assert_eq!(
            SynthSpec::parse("qwen3:tiny:bf16:mlx").unwrap().layout,
            Some(Layout::Mlx)
        );
    }

    #[test]
    fn parse_rejects_bad_parts() {
        for bad in [
            "",
            "nope",
            "qwen3:huge",
            "qwen3:tiny:q3",
            "qwen3:tiny:q4:hf",
            "qwen3::f32",
            "qwen3:tiny:f32:mlx:x",
        ] {
            assert!(SynthSpec::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn quantization_block_matches_mlx_lm() {
        assert_eq!(
            Format::Q4.quantization_block().unwrap(),
            json!({"group_size": 64, "bits": 4, "mode": "affine"})
        );
        assert_eq!(
            Format::Nvfp4.quantization_block().unwrap(),
            json!({"group_size": 16, "bits": 4, "mode": "nvfp4"})
        );
        assert!(Format::Bf16.quantization_block().is_none());
    }
}

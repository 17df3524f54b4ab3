//! Weight matrices as checkpoints store them: dense (f32/bf16/f16) or quantized in one of MLX's
//! formats. Kernels widen them to f32 a tile of rows at a time, never the whole matrix up front.

use crate::error::{shape_err, Result};
use crate::{DType, Tensor};

/// The quantization families MLX writes (`mode` in config.json's `quantization` block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// `w = scale·q + bias`, q unsigned `bits` wide, packed little-end-first into u32.
    Affine,
    /// E2M1 values, one E8M0 (power of two) scale per 32.
    Mxfp4,
    /// E2M1 values, one E4M3 scale per 16.
    Nvfp4,
    /// E4M3 values, one E8M0 scale per 32.
    Mxfp8,
}

impl QuantMode {
    pub fn parse(s: &str) -> Option<QuantMode> {
        Some(match s {
            "affine" => QuantMode::Affine,
            "mxfp4" => QuantMode::Mxfp4,
            "nvfp4" => QuantMode::Nvfp4,
            "mxfp8" => QuantMode::Mxfp8,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Nvfp4 => "nvfp4",
            QuantMode::Mxfp8 => "mxfp8",
        }
    }

    /// The only (bits, group) an fp mode allows; `None` for affine, which is configurable.
    pub fn fixed_bits_group(self) -> Option<(usize, usize)> {
        match self {
            QuantMode::Affine => None,
            QuantMode::Mxfp4 => Some((4, 32)),
            QuantMode::Nvfp4 => Some((4, 16)),
            QuantMode::Mxfp8 => Some((8, 32)),
        }
    }

    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    pub mode: QuantMode,
    pub bits: usize,
    pub group_size: usize,
}

impl QuantSpec {
    /// Checks the combination is one MLX can write.
    pub fn new(mode: QuantMode, bits: usize, group_size: usize) -> Result<QuantSpec> {
        let ok = match mode.fixed_bits_group() {
            Some((b, g)) => bits == b && group_size == g,
            None => matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) && matches!(group_size, 32 | 64 | 128),
        };
        if !ok {
            return shape_err(
                "quant_spec",
                format!(
                    "{} does not support bits={bits} group_size={group_size}",
                    mode.name()
                ),
            );
        }
        Ok(QuantSpec {
            mode,
            bits,
            group_size,
        })
    }
}

/// A quantized `[rows, cols]` matrix: `packed` u32 `[rows, cols·bits/32]`, `scales`
/// `[rows, cols/group]` (float for affine, u8 codes for the fp modes), `biases` like `scales`
/// (affine only).
#[derive(Debug, Clone)]
pub struct QuantWeight {
    pub spec: QuantSpec,
    pub rows: usize,
    pub cols: usize,
    pub packed: Tensor,
    pub scales: Tensor,
    pub biases: Option<Tensor>,
}

impl QuantWeight {
    /// Validates shapes and dtypes; `what` names the tensor in error messages.
    pub fn new(
        spec: QuantSpec,
        packed: Tensor,
        scales: Tensor,
        biases: Option<Tensor>,
        what: &str,
    ) -> Result<QuantWeight> {
        let op = "quantized weight";
        if packed.dims() < 2 || packed.dtype() != DType::U32 {
            return shape_err(
                op,
                format!(
                    "{what}: packed weight must be u32 with at least 2 dims, got {:?} {:?}",
                    packed.dtype(),
                    packed.shape()
                ),
            );
        }
        let rows = packed.numel() / packed.dim(-1);
        let cols = packed.dim(-1) * 32 / spec.bits;
        if cols % spec.group_size != 0 {
            return shape_err(
                op,
                format!(
                    "{what}: {cols} columns not a multiple of group {}",
                    spec.group_size
                ),
            );
        }
        let groups = cols / spec.group_size;
        let want_scale_dtype_ok = match spec.mode {
            QuantMode::Affine => scales.dtype().is_float(),
            _ => scales.dtype() == DType::U8,
        };
        if scales.numel() != rows * groups || scales.dim(-1) != groups || !want_scale_dtype_ok {
            return shape_err(
                op,
                format!(
                    "{what}: scales {:?} {:?} do not fit {rows}x{cols} with group {} ({})",
                    scales.dtype(),
                    scales.shape(),
                    spec.group_size,
                    spec.mode.name()
                ),
            );
        }
        match (&biases, spec.mode.has_biases()) {
            (Some(b), true) if b.shape() == scales.shape() && b.dtype().is_float() => {}
            (None, false) => {}
            (Some(b), true) => {
                return shape_err(
                    op,
                    format!(
                        "{what}: biases {:?} {:?} must match scales {:?}",
                        b.dtype(),
                        b.shape(),
                        scales.shape()
                    ),
                )
            }
            (None, true) => {
                return shape_err(op, format!("{what}: affine quantization needs biases"))
            }
            (Some(_), false) => {
                return shape_err(op, format!("{what}: {} has no biases", spec.mode.name()))
            }
        }
        let packed = packed.reshape(&[rows, packed.dim(-1)])?;
        let scales = scales.reshape(&[rows, groups])?;
        let biases = biases.map(|b| b.reshape(&[rows, groups])).transpose()?;
        Ok(QuantWeight {
            spec,
            rows,
            cols,
            packed,
            scales,
            biases,
        })
    }
}

/// A weight matrix `[rows, cols]` (out features × in features, as checkpoints store linears).
#[derive(Debug, Clone)]
pub enum Weight {
    /// f32, bf16 or f16, `[rows, cols]`.
    Dense(Tensor),
    Quant(QuantWeight),
}

impl Weight {
    pub fn rows(&self) -> usize {
        match self {
            Weight::Dense(t) => t.dim(0),
            Weight::Quant(q) => q.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Weight::Dense(t) => t.dim(-1),
            Weight::Quant(q) => q.cols,
        }
    }

    /// A short name of the storage format, e.g. `bf16` or `affine-q4-g64`.
    pub fn format_name(&self) -> String {
        match self {
            Weight::Dense(t) => format!("{:?}", t.dtype()).to_lowercase(),
            Weight::Quant(q) => match q.spec.mode {
                QuantMode::Affine => format!("affine-q{}-g{}", q.spec.bits, q.spec.group_size),
                m => m.name().to_string(),
            },
        }
    }

    /// Number of logical parameters.
    pub fn numel(&self) -> usize {
        self.rows() * self.cols()
    }
}

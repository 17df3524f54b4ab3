//! Weight matrices as checkpoints store them: dense (f32/bf16/f16) or quantized in one of MLX's
//! formats. Kernels widen them to f32 a tile of rows at a time, never the whole matrix up front.

pub mod decode;
#[cfg(target_arch = "x86_64")]
mod decode_avx2;
pub mod minifloat;

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
        // Checked first: the arithmetic below divides by the last dim and indexes dims.
        for (part, t) in [("weight", Some(&packed)), ("scales", Some(&scales))]
            .into_iter()
            .chain([("biases", biases.as_ref())])
        {
            if let Some(t) = t.filter(|t| t.dims() < 2 || t.shape().contains(&0)) {
                return shape_err(
                    op,
                    format!(
                        "{what}: {part} must have at least 2 dims, none of size 0, got {:?}",
                        t.shape()
                    ),
                );
            }
        }
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
        if !cols.is_multiple_of(spec.group_size) {
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
    /// Rows `start..start+len` of the matrix in its own format, as a view (no copy): one
    /// expert of a stacked expert weight.
    pub fn rows_view(&self, start: usize, len: usize) -> Result<Weight> {
        Ok(match self {
            Weight::Dense(t) => Weight::Dense(t.narrow0(start, len)?),
            Weight::Quant(q) => Weight::Quant(QuantWeight {
                spec: q.spec,
                rows: len,
                cols: q.cols,
                packed: q.packed.narrow0(start, len)?,
                scales: q.scales.narrow0(start, len)?,
                biases: q
                    .biases
                    .as_ref()
                    .map(|b| b.narrow0(start, len))
                    .transpose()?,
            }),
        })
    }

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

    /// Bytes of the stored tensors (packed codes, scales and biases when quantized).
    pub fn stored_bytes(&self) -> usize {
        let size = |t: &crate::Tensor| t.numel() * t.dtype().size_in_bytes();
        match self {
            Weight::Dense(t) => size(t),
            Weight::Quant(q) => {
                size(&q.packed) + size(&q.scales) + q.biases.as_ref().map_or(0, size)
            }
        }
    }

    /// Where the weight's tensors live (a quantized weight's packed codes decide).
    pub fn device(&self) -> crate::Device {
        match self {
            Weight::Dense(t) => t.device(),
            Weight::Quant(q) => q.packed.device(),
        }
    }

    /// The same weight with every tensor on `device` (packed codes, scales, biases), so a model
    /// moves its weights once at load instead of copying them into each op call. On MLX, dense
    /// weights and affine scales/biases become f32 (an exact widening, as the CPU kernels do
    /// per tile), so the forward casts nothing; on CUDA only affine scales/biases are widened.
    pub fn to_device(&self, device: crate::Device) -> Result<Weight> {
        #[cfg(feature = "mlx")]
        if device == crate::Device::Mlx {
            // MLX keeps weights in the dtypes its kernels take, widened once here.
            return crate::mlx::ops::resident_weight(self);
        }
        #[cfg(feature = "cuda")]
        if device == crate::Device::Cuda {
            // The CUDA kernels take packed codes as stored and affine scales widened once.
            return crate::cuda::resident_weight(self);
        }
        Ok(match self {
            Weight::Dense(t) => Weight::Dense(t.to_device(device)?),
            Weight::Quant(q) => Weight::Quant(QuantWeight {
                spec: q.spec,
                rows: q.rows,
                cols: q.cols,
                packed: q.packed.to_device(device)?,
                scales: q.scales.to_device(device)?,
                biases: q.biases.as_ref().map(|b| b.to_device(device)).transpose()?,
            }),
        })
    }
}

/// Rounds `x` to the nearest value of `dtype` (ties to even), as MLX stores a result in an array
/// of that dtype. F32 (and the U8 alias used for fp scale codes) leave it as is.
fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Quantizes a row-major `[rows, cols]` matrix exactly as MLX 0.32's `mx.quantize` does on its
/// CPU device (same packed bits, same scale/bias values and rounding).
///
/// `scale_dtype` is the dtype of the array MLX would be given (F32, BF16 or F16; U8 is accepted
/// as F32 for the fp modes): `w` is first rounded to it, affine scales and biases are stored in
/// it, and the fp modes do their intermediate arithmetic in it, as MLX's graph does.
///
/// Algorithms (from `mlx/backend/cpu/quantized.cpp` `quantize` and `mlx/ops.cpp`
/// `fp_quantize`'s fallback, which is what runs on CPU):
/// - affine, per group, in f32: `scale = max((max − min) / (2^bits − 1), 1e-7)`, negated unless
///   `|min| > |max|`; the edge (min if `|min| > |max|`, else max) is anchored exactly:
///   `q0 = rint(edge / scale)`, and when `q0 ≠ 0`, `scale = edge / q0`, `bias = edge` (else
///   `bias = 0`). Codes are `clamp(rint((w − bias) / scale), 0, 2^bits − 1)` with ties to even,
///   computed with the unrounded f32 scale/bias, which are then stored rounded to `scale_dtype`.
/// - mxfp4 / mxfp8: `s = amax / maxval` (6 or 448); exponent `e = ⌈log2 s⌉` taken exactly (so
///   `w / 2^e` never exceeds maxval; 0 when s = 0), stored as the E8M0 code `e + 127`; values
///   are `w / 2^e` encoded to E2M1 or E4M3. (Older MLX rounded `log2 s` to nearest; 0.32.4
///   rounds up, as checked against its outputs.)
/// - nvfp4: `s = amax / 6` encoded to E4M3 (round to nearest even, saturating at 448); values
///   are `w / decoded(s)`. No global scale.
/// - E2M1 encoding is MLX's `argmin |v − lut|` over the 16-entry table: nearest value, ties to
///   the smaller magnitude, −0 and tiny negatives to code 0, and NaN (0/0 in an all-zero nvfp4
///   group) to code 0. E4M3 encoding rounds to nearest even and saturates to ±448.
pub fn quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    spec: QuantSpec,
    scale_dtype: DType,
) -> Result<QuantWeight> {
    let op = "quantize";
    let (bits, group) = (spec.bits, spec.group_size);
    let spec = QuantSpec::new(spec.mode, bits, group)?;
    if w.len() != rows * cols {
        return shape_err(
            op,
            format!(
                "{rows}x{cols} needs {} values, got {}",
                rows * cols,
                w.len()
            ),
        );
    }
    if !cols.is_multiple_of(group) {
        return shape_err(
            op,
            format!("{cols} columns are not a multiple of the group size {group}"),
        );
    }
    let in_dtype = match (scale_dtype, spec.mode) {
        (DType::F32 | DType::BF16 | DType::F16, _) => scale_dtype,
        (DType::U8, m) if m != QuantMode::Affine => DType::F32,
        (other, m) => {
            return Err(crate::Error::DType {
                op,
                dtype: other,
                msg: format!(
                    "{} quantization takes scale_dtype f32, bf16 or f16",
                    m.name()
                ),
            })
        }
    };
    let groups = cols / group;
    let words = cols * bits / 32;
    let mut packed = vec![0u32; rows * words];
    let mut codes = vec![0u8; group];
    let mut vals = vec![0.0f32; group];
    let mut scale_out = Vec::with_capacity(rows * groups);
    let mut bias_out = Vec::with_capacity(rows * groups);
    for (gi, chunk) in w.chunks_exact(group).enumerate() {
        for (v, &x) in vals.iter_mut().zip(chunk) {
            *v = round_to(in_dtype, x);
        }
        match spec.mode {
            QuantMode::Affine => {
                let (s, b) = affine_group(&vals, bits, &mut codes);
                scale_out.push(s);
                bias_out.push(b);
            }
            QuantMode::Mxfp4 | QuantMode::Nvfp4 | QuantMode::Mxfp8 => {
                let code = fp_group(&vals, spec.mode, in_dtype, &mut codes);
                scale_out.push(code as f32);
            }
        }
        // Group gi starts at bit gi·group·bits of the flat stream; rows end on word boundaries.
        pack_codes(&codes, bits, gi * group * bits, &mut packed);
    }
    let packed = Tensor::from_slice(&[rows, words], DType::U32, &packed)?;
    let floats = |v: &[f32]| -> Result<Tensor> {
        let shape = [rows, groups];
        match in_dtype {
            DType::BF16 => {
                let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
                Tensor::from_slice(&shape, DType::BF16, &h)
            }
            DType::F16 => {
                let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                Tensor::from_slice(&shape, DType::F16, &h)
            }
            _ => Tensor::from_slice(&shape, DType::F32, v),
        }
    };
    let (scales, biases) = if spec.mode == QuantMode::Affine {
        (floats(&scale_out)?, Some(floats(&bias_out)?))
    } else {
        let u: Vec<u8> = scale_out.iter().map(|&c| c as u8).collect();
        (Tensor::from_slice(&[rows, groups], DType::U8, &u)?, None)
    };
    QuantWeight::new(spec, packed, scales, biases, "quantize output")
}

/// One affine group: writes the codes and returns the (unrounded) scale and bias.
fn affine_group(w: &[f32], bits: usize, codes: &mut [u8]) -> (f32, f32) {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in w {
        lo = lo.min(x);
        hi = hi.max(x);
    }
    let min_is_edge = lo.abs() > hi.abs();
    let mut scale = ((hi - lo) / n_bins).max(1e-7);
    if !min_is_edge {
        scale = -scale;
    }
    let edge = if min_is_edge { lo } else { hi };
    let q0 = (edge / scale).round_ties_even();
    let mut bias = 0.0;
    if q0 != 0.0 {
        scale = edge / q0;
        bias = edge;
    }
    for (c, &x) in codes.iter_mut().zip(w) {
        *c = ((x - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u8;
    }
    (scale, bias)
}

/// One fp group, with MLX's arithmetic carried out in `dt`: writes the value codes and returns
/// the scale code.
fn fp_group(w: &[f32], mode: QuantMode, dt: DType, codes: &mut [u8]) -> u8 {
    use minifloat::{e4m3_to_f32, e8m0_from_exponent, f32_to_e4m3, E2M1_VALUES};
    let maxval = if mode == QuantMode::Mxfp8 { 448.0 } else { 6.0 };
    let amax = w.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    let s = round_to(dt, amax / maxval);
    let (scale_code, divisor) = if mode == QuantMode::Nvfp4 {
        let c = f32_to_e4m3(s);
        (c, e4m3_to_f32(c))
    } else {
        let e = if s == 0.0 { 0 } else { ceil_log2(s) };
        (e8m0_from_exponent(e), round_to(dt, 2.0f64.powi(e) as f32))
    };
    for (c, &x) in codes.iter_mut().zip(w) {
        let v = round_to(dt, x / divisor);
        *c = if mode == QuantMode::Mxfp8 {
            f32_to_e4m3(v)
        } else {
            // argmin over the table, first index on ties (NaN distances never win).
            let mut best = (0u8, (round_to(dt, v - E2M1_VALUES[0])).abs());
            for (j, &l) in E2M1_VALUES.iter().enumerate().skip(1) {
                let d = round_to(dt, v - l).abs();
                if d < best.1 {
                    best = (j as u8, d);
                }
            }
            best.0
        };
    }
    scale_code
}

/// `⌈log2 s⌉` exactly, for finite `s > 0` (the exponent field, plus one unless `s` is a power
/// of two); read from the bits, not from a rounded `log2`.
fn ceil_log2(s: f32) -> i32 {
    let bits = (s as f64).to_bits();
    let exp = ((bits >> 52) & 0x7FF) as i32 - 1023;
    exp + (bits & ((1u64 << 52) - 1) != 0) as i32
}

/// ORs `codes` (each `bits` wide) into the little-end-first bit stream `out` from bit `start`.
fn pack_codes(codes: &[u8], bits: usize, start: usize, out: &mut [u32]) {
    for (i, &c) in codes.iter().enumerate() {
        let bit = start + i * bits;
        let (wi, sh) = (bit / 32, bit % 32);
        let v = (c as u64) << sh;
        out[wi] |= v as u32;
        if sh + bits > 32 {
            out[wi + 1] |= (v >> 32) as u32;
        }
    }
}

/// The whole matrix widened to f32, row-major (for tests and tools; kernels decode per tile).
pub fn dequantize(q: &QuantWeight) -> Result<Vec<f32>> {
    let w = Weight::Quant(q.clone());
    let rows = decode::WeightRows::new(&w)?;
    let mut out = vec![0.0f32; q.rows * q.cols];
    rows.decode_rows(0, &mut out);
    Ok(out)
}

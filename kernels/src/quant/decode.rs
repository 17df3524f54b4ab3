//! Widening weight rows to f32: the per-tile primitive under matmul and embedding.
//!
//! [`WeightRows`] borrows a weight's storage once (checking every length up front), then
//! decodes any row on demand. Scales and biases stay in their stored dtype and are widened one
//! group at a time, so an embedding lookup in a 150k-row table touches only its rows.
//!
//! Bit layouts (checked against MLX's `mlx/backend/cpu/quantized.cpp` and `mlx/ops.cpp`):
//! - affine: each row is a little-end-first bit stream of `bits`-wide unsigned codes packed in
//!   u32 words (for 3/5/6 bits a code may straddle two words); `w = scale·q + bias` per group.
//! - mxfp4 / nvfp4: 8 E2M1 codes per u32, lowest nibble first; scale per 32 (E8M0) or per 16
//!   (E4M3).
//! - mxfp8: 4 E4M3 codes per u32, lowest byte first; E8M0 scale per 32.

use half::{bf16, f16};

use super::minifloat::{e4m3_to_f32, e8m0_to_f32};
use crate::error::shape_err;
use crate::quant::QuantMode;
use crate::{DType, Error, Result, Tensor, Weight};

/// A float slice in any of the dtypes weights, scales and biases are stored in.
#[derive(Clone, Copy)]
pub(crate) enum Floats<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Floats<'a> {
    fn of(t: &'a Tensor, what: &str) -> Result<Floats<'a>> {
        Ok(match t.dtype() {
            DType::F32 => Floats::F32(t.as_slice()?),
            DType::BF16 => Floats::BF16(t.as_slice()?),
            DType::F16 => Floats::F16(t.as_slice()?),
            other => {
                return Err(Error::DType {
                    op: "dequant",
                    dtype: other,
                    msg: format!("{what} must be f32, bf16 or f16"),
                })
            }
        })
    }

    fn len(&self) -> usize {
        match self {
            Floats::F32(s) => s.len(),
            Floats::BF16(s) => s.len(),
            Floats::F16(s) => s.len(),
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> f32 {
        match self {
            Floats::F32(s) => s[i],
            Floats::BF16(s) => bf16_to_f32(s[i]),
            Floats::F16(s) => s[i].to_f32(),
        }
    }

    /// Elements `start..start + out.len()` widened into `out`.
    #[inline(always)]
    fn widen_into(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Floats::F32(s) => out.copy_from_slice(&s[start..end]),
            // A shift per element; written as a plain loop so it vectorises.
            Floats::BF16(s) => out
                .iter_mut()
                .zip(&s[start..end])
                .for_each(|(o, v)| *o = bf16_to_f32(*v)),
            Floats::F16(s) => {
                use half::slice::HalfFloatSliceExt;
                s[start..end].convert_to_f32_slice(out)
            }
        }
    }
}

#[inline(always)]
fn bf16_to_f32(v: bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

#[derive(Clone, Copy)]
enum Layout<'a> {
    Dense(Floats<'a>),
    Affine {
        packed: &'a [u32],
        scales: Floats<'a>,
        biases: Floats<'a>,
        bits: usize,
        group: usize,
    },
    /// mxfp4 (E8M0 scale per 32) and nvfp4 (E4M3 scale per 16).
    Fp4 {
        packed: &'a [u32],
        scales: &'a [u8],
        group: usize,
        e4m3_scales: bool,
    },
    Fp8 {
        packed: &'a [u32],
        scales: &'a [u8],
    },
}

/// A `BITS`-bit affine weight's storage: `packed` holds `32 / BITS` codes per word, row after
/// row.
#[derive(Clone, Copy)]
pub(crate) struct Affine<'a, const BITS: usize> {
    pub packed: &'a [u32],
    pub scales: Floats<'a>,
    pub biases: Floats<'a>,
    pub group: usize,
}

/// 4-bit affine storage (8 codes per word).
pub(crate) type Affine4<'a> = Affine<'a, 4>;
/// 8-bit affine storage (4 codes per word); only x86's fused kernel reads it whole.
#[cfg(target_arch = "x86_64")]
pub(crate) type Affine8<'a> = Affine<'a, 8>;

/// A weight matrix `[rows, cols]` ready to be decoded row by row into f32.
#[derive(Clone, Copy)]
pub struct WeightRows<'a> {
    rows: usize,
    cols: usize,
    layout: Layout<'a>,
}

impl<'a> WeightRows<'a> {
    /// Borrows `w`'s storage, checking that every buffer has the length its shape promises.
    pub fn new(w: &'a Weight) -> Result<WeightRows<'a>> {
        let (rows, cols) = (w.rows(), w.cols());
        let layout = match w {
            Weight::Dense(t) => {
                if t.dims() != 2 {
                    return shape_err(
                        "dequant",
                        format!("dense weight must be 2-D [rows, cols], got {:?}", t.shape()),
                    );
                }
                Layout::Dense(Floats::of(t, "a dense weight")?)
            }
            Weight::Quant(q) => {
                let (bits, group) = (q.spec.bits, q.spec.group_size);
                let packed: &[u32] = q.packed.as_slice()?;
                if group == 0 || cols % group != 0 || cols * bits != q.packed.dim(-1) * 32 {
                    return shape_err(
                        "dequant",
                        format!(
                            "packed weight {:?} does not hold {rows}x{cols} {}-bit codes in groups of {group}",
                            q.packed.shape(),
                            bits
                        ),
                    );
                }
                let groups = rows * (cols / group);
                let check = |what: &str, len: usize| {
                    if len == groups {
                        Ok(())
                    } else {
                        shape_err(
                            "dequant",
                            format!("{what} has {len} elements, {rows}x{cols} with group {group} needs {groups}"),
                        )
                    }
                };
                if packed.len() != rows * cols * bits / 32 {
                    return shape_err("dequant", "packed weight length does not match its shape");
                }
                let u8_scales = || -> Result<&'a [u8]> {
                    let s: &[u8] = q.scales.as_slice()?;
                    check("scales", s.len())?;
                    Ok(s)
                };
                match q.spec.mode {
                    QuantMode::Affine => {
                        if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) {
                            return Err(Error::Unsupported {
                                op: "affine dequant with this bit width",
                                backend: "cpu",
                            });
                        }
                        let scales = Floats::of(&q.scales, "affine scales")?;
                        let Some(b) = q.biases.as_ref() else {
                            return shape_err("dequant", "affine quantization needs biases");
                        };
                        let biases = Floats::of(b, "affine biases")?;
                        check("scales", scales.len())?;
                        check("biases", biases.len())?;
                        Layout::Affine {
                            packed,
                            scales,
                            biases,
                            bits,
                            group,
                        }
                    }
                    mode @ (QuantMode::Mxfp4 | QuantMode::Nvfp4) => {
                        let want = if mode == QuantMode::Mxfp4 { 32 } else { 16 };
                        if bits != 4 || group != want {
                            return shape_err(
                                "dequant",
                                format!("{} needs bits=4 group={want}", mode.name()),
                            );
                        }
                        Layout::Fp4 {
                            packed,
                            scales: u8_scales()?,
                            group,
                            e4m3_scales: mode == QuantMode::Nvfp4,
                        }
                    }
                    QuantMode::Mxfp8 => {
                        if bits != 8 || group != 32 {
                            return shape_err("dequant", "mxfp8 needs bits=8 group=32");
                        }
                        Layout::Fp8 {
                            packed,
                            scales: u8_scales()?,
                        }
                    }
                }
            }
        };
        if let Layout::Dense(f) = layout {
            if f.len() != rows * cols {
                return shape_err("dequant", "dense weight length does not match its shape");
            }
        }
        Ok(WeightRows { rows, cols, layout })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The parts of a 4-bit affine weight, for kernels that fuse its decode into a dot product.
    pub(crate) fn affine4(&self) -> Option<Affine4<'a>> {
        self.affine::<4>()
    }

    /// The parts of an 8-bit affine weight, likewise.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn affine8(&self) -> Option<Affine8<'a>> {
        self.affine::<8>()
    }

    fn affine<const BITS: usize>(&self) -> Option<Affine<'a, BITS>> {
        match self.layout {
            Layout::Affine {
                packed,
                scales,
                biases,
                bits,
                group,
            } if bits == BITS => Some(Affine {
                packed,
                scales,
                biases,
                group,
            }),
            _ => None,
        }
    }

    /// The whole weight as stored, when it is dense bf16 (for kernels that widen it in registers).
    pub(crate) fn bf16_dense(&self) -> Option<&'a [bf16]> {
        match self.layout {
            Layout::Dense(Floats::BF16(s)) => Some(s),
            _ => None,
        }
    }

    /// Rows `r0..r0 + n` as stored, when the weight already is f32 (read in place, no decode).
    #[inline(always)]
    pub fn f32_rows(&self, r0: usize, n: usize) -> Option<&'a [f32]> {
        match self.layout {
            Layout::Dense(Floats::F32(s)) => Some(&s[r0 * self.cols..(r0 + n) * self.cols]),
            _ => None,
        }
    }

    /// Decodes row `r` into `out` (`cols` long). `r < rows` is the caller's promise.
    #[inline(always)]
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.cols);
        self.decode_span(r, 0, out)
    }

    /// Decodes columns `c0..c0 + out.len()` of row `r`. For quantized weights `c0` and the length
    /// must be multiples of the group size (spans never split a group).
    #[inline(always)]
    pub fn decode_span(&self, r: usize, c0: usize, out: &mut [f32]) {
        self.span_impl::<false>(r, c0, out)
    }

    /// [`Self::decode_span`] with the AVX2 group decoders (same bits).
    ///
    /// # Safety
    /// The CPU has AVX2. (Call it from a function compiled with AVX2 enabled so the intrinsics
    /// inline.)
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub unsafe fn decode_span_avx2(&self, r: usize, c0: usize, out: &mut [f32]) {
        self.span_impl::<true>(r, c0, out)
    }

    /// [`Self::decode_rows`] with the AVX2 group decoders.
    ///
    /// # Safety
    /// As [`Self::decode_span_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub unsafe fn decode_rows_avx2(&self, r0: usize, out: &mut [f32]) {
        for (i, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.span_impl::<true>(r0 + i, 0, o);
        }
    }

    #[inline(always)]
    fn span_impl<const AVX2: bool>(&self, r: usize, c0: usize, out: &mut [f32]) {
        let cols = self.cols;
        debug_assert!(c0 + out.len() <= cols);
        match self.layout {
            Layout::Dense(f) => f.widen_into(r * cols + c0, out),
            Layout::Affine {
                packed,
                scales,
                biases,
                bits,
                group,
            } => {
                debug_assert!(c0.is_multiple_of(group) && out.len().is_multiple_of(group));
                let words = cols * bits / 32;
                let w0 = r * words + c0 * bits / 32;
                let span = &packed[w0..w0 + out.len() * bits / 32];
                let g0 = (r * cols + c0) / group;
                let gw = group * bits / 32;
                for (gi, (o, w)) in out
                    .chunks_exact_mut(group)
                    .zip(span.chunks_exact(gw))
                    .enumerate()
                {
                    let (s, b) = (scales.get(g0 + gi), biases.get(g0 + gi));
                    #[cfg(target_arch = "x86_64")]
                    if AVX2 && matches!(bits, 2 | 4 | 8) {
                        // SAFETY: AVX2 is present (the AVX2 entry points' contract).
                        unsafe {
                            match bits {
                                2 => super::decode_avx2::affine2(w, s, b, o),
                                4 => super::decode_avx2::affine4(w, s, b, o),
                                _ => super::decode_avx2::affine8(w, s, b, o),
                            }
                        }
                        continue;
                    }
                    match bits {
                        2 => affine_words::<2, 16>(w, s, b, o),
                        4 => affine_words::<4, 8>(w, s, b, o),
                        8 => affine_words::<8, 4>(w, s, b, o),
                        _ => affine_stream(w, bits, s, b, o),
                    }
                }
            }
            Layout::Fp4 {
                packed,
                scales,
                group,
                e4m3_scales,
            } => {
                debug_assert!(c0.is_multiple_of(group) && out.len().is_multiple_of(group));
                let w0 = (r * cols + c0) / 8;
                let span = &packed[w0..w0 + out.len() / 8];
                let g0 = (r * cols + c0) / group;
                for (gi, (o, w)) in out
                    .chunks_exact_mut(group)
                    .zip(span.chunks_exact(group / 8))
                    .enumerate()
                {
                    let code = scales[g0 + gi];
                    let s = if e4m3_scales {
                        e4m3_to_f32(code)
                    } else {
                        e8m0_to_f32(code)
                    };
                    #[cfg(target_arch = "x86_64")]
                    if AVX2 {
                        // SAFETY: AVX2 is present (the AVX2 entry points' contract).
                        unsafe { super::decode_avx2::fp4(w, s, o) };
                        continue;
                    }
                    for (o8, &word) in o.chunks_exact_mut(8).zip(w) {
                        let o8: &mut [f32; 8] = o8.try_into().expect("chunks of 8");
                        for (i, v) in o8.iter_mut().enumerate() {
                            *v = e2m1_bits((word >> (4 * i)) & 0xF) * s;
                        }
                    }
                }
            }
            Layout::Fp8 { packed, scales } => {
                debug_assert!(c0.is_multiple_of(32) && out.len().is_multiple_of(32));
                let w0 = (r * cols + c0) / 4;
                let span = &packed[w0..w0 + out.len() / 4];
                let g0 = (r * cols + c0) / 32;
                for (gi, (o, w)) in out
                    .chunks_exact_mut(32)
                    .zip(span.chunks_exact(8))
                    .enumerate()
                {
                    let s = e8m0_to_f32(scales[g0 + gi]);
                    for (o4, &word) in o.chunks_exact_mut(4).zip(w) {
                        let o4: &mut [f32; 4] = o4.try_into().expect("chunks of 4");
                        for (i, v) in o4.iter_mut().enumerate() {
                            *v = e4m3_bits((word >> (8 * i)) & 0xFF) * s;
                        }
                    }
                }
            }
        }
    }

    /// Decodes rows `r0..r0 + out.len() / cols` into `out`, one after another.
    #[inline(always)]
    pub fn decode_rows(&self, r0: usize, out: &mut [f32]) {
        for (i, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.decode_row(r0 + i, o);
        }
    }
}

/// One group of power-of-two-width affine codes: `PER = 32 / BITS` codes per word. Fixed-size
/// chunks let the compiler turn the inner loop into one vector shift per word.
#[inline(always)]
fn affine_words<const BITS: u32, const PER: usize>(words: &[u32], s: f32, b: f32, out: &mut [f32]) {
    let mask = (1u32 << BITS) - 1;
    for (o, &w) in out.chunks_exact_mut(PER).zip(words) {
        let o: &mut [f32; PER] = o.try_into().expect("chunks of PER");
        for (i, v) in o.iter_mut().enumerate() {
            *v = s * ((w >> (BITS * i as u32)) & mask) as f32 + b;
        }
    }
}

/// All ones when `c` holds, else zero: lets the decoders below select without branches, which
/// keeps their loops vectorised.
#[inline(always)]
fn mask(c: bool) -> u32 {
    (c as u32).wrapping_neg()
}

/// E2M1 decoded arithmetically (a table lookup would not vectorise): magnitudes 2..7 are a
/// normal float with exponent `126 + e` and one mantissa bit; 0 and 1 are 0.0 and 0.5.
#[inline(always)]
fn e2m1_bits(code: u32) -> f32 {
    let mag = code & 7;
    let normal = (mag << 22) + (126 << 23);
    let small = (mag & 1) * 0x3F00_0000; // used for 0 → 0.0 and 1 → 0.5 only
    let m = mask(mag >= 2);
    f32::from_bits((normal & m) | (small & !m) | ((code & 8) << 28))
}

/// E4M3 decoded arithmetically: normals rebias the exponent (+120), subnormals are m · 2^-9,
/// and `S.1111.111` is NaN (as in [`e4m3_to_f32`]).
#[inline(always)]
fn e4m3_bits(code: u32) -> f32 {
    let mag = code & 0x7F;
    let normal = (mag << 20) + (120 << 23);
    let sub = (mag as f32 * (1.0 / 512.0)).to_bits();
    let m = mask(mag >= 8);
    let nan = mask(mag == 0x7F) & 0x7FC0_0000;
    f32::from_bits((normal & m) | (sub & !m) | nan | ((code & 0x80) << 24))
}

/// One group of 3/5/6-bit affine codes, read as a continuous little-end-first bit stream (a
/// group of 32 codes always ends on a word boundary).
#[inline(always)]
fn affine_stream(words: &[u32], bits: usize, s: f32, b: f32, out: &mut [f32]) {
    let mask = (1u64 << bits) - 1;
    let (mut buf, mut have, mut next) = (0u64, 0usize, 0usize);
    for v in out.iter_mut() {
        if have < bits {
            buf |= (words[next] as u64) << have;
            next += 1;
            have += 32;
        }
        *v = s * (buf & mask) as f32 + b;
        buf >>= bits;
        have -= bits;
    }
}

/// Writes rows `r0..r0 + n` of `w` as f32 into `out` (`n · cols` long).
pub fn dequant_rows(w: &Weight, r0: usize, n: usize, out: &mut [f32]) -> Result<()> {
    let rows = WeightRows::new(w)?;
    if r0 + n > rows.rows() || out.len() != n * rows.cols() {
        return shape_err(
            "dequant",
            format!(
                "rows {r0}..{} into {} values, weight is {}x{}",
                r0 + n,
                out.len(),
                rows.rows(),
                rows.cols()
            ),
        );
    }
    rows.decode_rows(r0, out);
    Ok(())
}

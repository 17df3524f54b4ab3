//! The `fast` numerics' prefill product with dense bf16 weights: activations rounded to bf16
//! (round to nearest even), then products of bf16 pairs summed into f32 as AVX-512 BF16's
//! `vdpbf16ps` does.
//!
//! Per output `(i, j)`, over column pairs `p` in order (an odd last column pairs with a zero):
//! `acc = fma(x[2p+1], w[2p+1], acc)` then `acc = fma(x[2p], w[2p], acc)`, with bf16
//! subnormal inputs read as zero and subnormal results flushed to zero (the instruction's
//! fixed DAZ/FTZ, round to nearest even). `vdpbf16ps` does exactly that on CPUs that have it;
//! AVX2 code runs the same FMAs with MXCSR's DAZ and FTZ set, portable code in software, so
//! every ISA gives the same bits (kernels/tests/kernels/matmul.rs checks them against each other,
//! subnormals included).
//!
//! Weights are repacked per tile of [`NR`] rows into `[pair][row]` words (a word holds one
//! row's two bf16 of a pair), so one vector holds the same pair of 16 rows and each
//! activation pair is broadcast against it.

use half::bf16;

use crate::cpu::isa::Isa;

// `Tile::pack` reads a pair of bf16 as one little-endian word.
const _: () = assert!(cfg!(target_endian = "little"));

/// Weight rows per tile (two AVX-512 registers).
pub const NR: usize = 32;

/// Activations rounded to bf16 and paired: `[m, pairs]` words, low half the even column.
pub struct Bf16Input {
    m: usize,
    pairs: usize,
    words: Vec<u32>,
    /// The same values as f32, `[m, 2 · pairs]` (a pair's even column first), for kernels that
    /// broadcast single values; empty unless asked for.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    values: Vec<f32>,
}

impl Bf16Input {
    /// Input rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Row `i`'s pairs.
    pub fn row(&self, i: usize) -> &[u32] {
        &self.words[i * self.pairs..(i + 1) * self.pairs]
    }

    /// Row `i`'s values as f32 (empty unless `round_input` was asked for them).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn values_row(&self, i: usize) -> &[f32] {
        &self.values[i * 2 * self.pairs..(i + 1) * 2 * self.pairs]
    }
}

/// Whether `tile_product` on `isa` runs an FMA kernel (AVX-512 or AVX2), which broadcasts
/// single f32 values from memory (`Bf16Input::values`), rather than `vdpbf16ps` or the
/// portable kernel. (A broadcast from memory is a load; from a register it would take an FP
/// port from the FMAs.)
pub fn needs_values(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa.avx2 && (!isa.bf16 || isa.bf16_dot_slow)
}

/// Rounds `m` rows of `k` to bf16 pairs, rows in parallel when there are enough of them.
/// With `values`, also keeps them as f32 (for [`needs_values`] kernels).
pub fn round_input(xs: &[f32], m: usize, k: usize, values: bool) -> Bf16Input {
    let pairs = k.div_ceil(2);
    let mut words = vec![0u32; m * pairs];
    crate::cpu::for_each_row(&mut words, pairs, |i, out| {
        round_row(&xs[i * k..(i + 1) * k], out)
    });
    let values = if values {
        let mut v = vec![0.0f32; m * 2 * pairs];
        crate::cpu::for_each_row(&mut v, 2 * pairs, |i, out| {
            for (o, &w) in out
                .chunks_exact_mut(2)
                .zip(&words[i * pairs..(i + 1) * pairs])
            {
                o[0] = f32::from_bits(w << 16);
                o[1] = f32::from_bits(w & 0xFFFF_0000);
            }
        });
        v
    } else {
        Vec::new()
    };
    Bf16Input {
        m,
        pairs,
        words,
        values,
    }
}

/// One row's pairs; an odd last column pairs with a zero.
fn round_row(row: &[f32], out: &mut [u32]) {
    let whole = row.len() / 2;
    for (w, p) in out[..whole].iter_mut().zip(row.chunks_exact(2)) {
        *w = bf16_bits(p[0]) | bf16_bits(p[1]) << 16;
    }
    if let Some(&last) = row.get(2 * whole) {
        out[whole] = bf16_bits(last);
    }
}

/// `bf16::from_f32(v).to_bits()` (round to nearest even; a NaN keeps its top bits and is made
/// quiet) without branches, so the row loop vectorizes.
#[inline(always)]
fn bf16_bits(v: f32) -> u32 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x40;
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

/// One tile of weight rows repacked as `[pair][row]` words; rows past the weight's end are 0.
#[derive(Default)]
pub struct Tile {
    words: Vec<u32>,
    pairs: usize,
}

impl Tile {
    /// Repacks rows `r0..r0 + rows` (`rows ≤ NR`) of the `[n, k]` weight `w`.
    pub fn pack(&mut self, w: &[bf16], k: usize, r0: usize, rows: usize, isa: Isa) {
        let pairs = k.div_ceil(2);
        self.pairs = pairs;
        // Only rows past the weight's end need zeros: every other word is written below.
        self.words.resize(pairs * NR, 0);
        if rows < NR {
            for p in 0..pairs {
                self.words[p * NR + rows..(p + 1) * NR].fill(0);
            }
        }
        let src = &w[r0 * k..(r0 + rows) * k];
        let whole = k / 2;
        // Blocks of 16 rows x 16 pairs transposed in registers where the CPU can.
        let vector = cfg!(target_arch = "x86_64") && isa.avx512;
        let (vec_rows, vec_pairs) = if vector {
            (rows / 16 * 16, whole / 16 * 16)
        } else {
            (0, 0)
        };
        #[cfg(target_arch = "x86_64")]
        if vector {
            for rb in (0..vec_rows).step_by(16) {
                for pb in (0..vec_pairs).step_by(16) {
                    // SAFETY: AVX-512 F is present; rows rb..rb + 16 < rows and words
                    // pb..pb + 16 ≤ whole lie inside `src`; pairs pb..pb + 16 of tile rows
                    // rb..rb + 16 lie inside the tile.
                    unsafe {
                        transpose::block16(
                            src.as_ptr().add(rb * k + 2 * pb),
                            k,
                            self.words.as_mut_ptr().add(pb * NR + rb),
                            NR,
                        )
                    };
                }
            }
        }
        let base = src.as_ptr();
        // The rest row by row, so each row streams from memory once (the tile stays in L2).
        for r in 0..rows {
            let from = if r < vec_rows { vec_pairs } else { 0 };
            for p in from..whole {
                // SAFETY: r < rows and 2p + 1 < k, so both halves lie inside `src`; the word
                // is read unaligned (a pair starts at an odd element when k is odd).
                // Little-endian: the even column lands in the low half, as `round_input` puts it.
                self.words[p * NR + r] =
                    unsafe { base.add(r * k + 2 * p).cast::<u32>().read_unaligned() };
            }
        }
        if whole < pairs {
            for r in 0..rows {
                self.words[whole * NR + r] = src[r * k + 2 * whole].to_bits() as u32;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod transpose {
    //! A 16 x 16 transpose of 32-bit words (a weight tile's pairs) in AVX-512 registers.
    use std::arch::x86_64::*;

    use half::bf16;

    /// `dst[q * dst_stride + j] = word q of row j` for rows `src + j * stride` (bf16 elements),
    /// `j, q < 16`.
    ///
    /// # Safety
    /// AVX-512 F is present; the 16 rows hold 32 bf16 each from their start; `dst` holds the
    /// 16 x 16 words at that stride.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn block16(src: *const bf16, stride: usize, dst: *mut u32, dst_stride: usize) {
        // SAFETY: forwarded from the caller.
        let r: [__m512i; 16] =
            std::array::from_fn(|j| unsafe { _mm512_loadu_si512(src.add(j * stride).cast()) });
        // Per 128-bit lane L: rows 2i and 2i+1 interleaved by word.
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // u[4i + c], lane L: word 4L + c of rows 4i..4i + 4.
        let mut u = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        // Word 4L + c of all 16 rows: lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
        for c in 0..4 {
            let (v0, v1, v2, v3) = (u[c], u[4 + c], u[8 + c], u[12 + c]);
            let s0 = _mm512_shuffle_i32x4::<0x88>(v0, v1);
            let s1 = _mm512_shuffle_i32x4::<0xDD>(v0, v1);
            let s2 = _mm512_shuffle_i32x4::<0x88>(v2, v3);
            let s3 = _mm512_shuffle_i32x4::<0xDD>(v2, v3);
            let out = [
                _mm512_shuffle_i32x4::<0x88>(s0, s2),
                _mm512_shuffle_i32x4::<0x88>(s1, s3),
                _mm512_shuffle_i32x4::<0xDD>(s0, s2),
                _mm512_shuffle_i32x4::<0xDD>(s1, s3),
            ];
            for (l, o) in out.iter().enumerate() {
                // SAFETY: word 4l + c < 16 of the block.
                unsafe { _mm512_storeu_si512(dst.add((4 * l + c) * dst_stride).cast(), *o) };
            }
        }
    }
}

/// `out[i, c] = x_i · w_{r0 + c}` for the tile's rows `c < cols`; `out` is `[m, ldo]` from the
/// tile's first column.
///
/// # Safety
/// `out` points at `x.m` rows of `ldo` floats, of which columns `0..cols` are this call's alone.
pub unsafe fn tile_product(
    t: &Tile,
    x: &Bf16Input,
    isa: Isa,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.avx512 && needs_values(isa) {
        while i + avx512fma::MR <= x.m {
            // SAFETY: AVX-512 F is present; rows i..i + MR exist with their values; forwarded.
            unsafe { avx512fma::rows(t, x, i, cols, out, ldo) };
            i += avx512fma::MR;
        }
    } else if isa.bf16 {
        while i + avx512::MR <= x.m {
            // SAFETY: AVX-512 BF16 is present; rows i..i + MR exist; forwarded.
            unsafe { avx512::rows(t, x, i, cols, out, ldo) };
            i += avx512::MR;
        }
    } else if needs_values(isa) {
        while i + avx2::MR <= x.m {
            // SAFETY: AVX2 and FMA are present; rows i..i + MR exist with their values;
            // forwarded.
            unsafe { avx2::rows(t, x, i, cols, out, ldo) };
            i += avx2::MR;
        }
    }
    let mut acc = [0.0f32; NR];
    while i < x.m {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2 {
            // SAFETY: AVX2 and FMA are present.
            unsafe { avx2::row(t, x, i, &mut acc) };
        } else {
            portable_row(t, x, i, &mut acc);
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            portable_row(t, x, i, &mut acc);
        }
        for (c, &v) in acc[..cols].iter().enumerate() {
            // SAFETY: (i, c) is this call's part of the output.
            unsafe { *out.add(i * ldo + c) = v };
        }
        i += 1;
    }
}

/// A bf16 (its bits in the high half of `w`) as f32, subnormals read as zero.
#[inline(always)]
pub(super) fn daz(bits: u32) -> f32 {
    let v = f32::from_bits(bits);
    if v.is_subnormal() {
        f32::from_bits(bits & 0x8000_0000)
    } else {
        v
    }
}

/// `fma(a, b, acc)` with the result's subnormals flushed to zero.
#[inline(always)]
pub(super) fn fma_ftz(a: f32, b: f32, acc: f32) -> f32 {
    let r = a.mul_add(b, acc);
    if r.is_subnormal() {
        f32::from_bits(r.to_bits() & 0x8000_0000)
    } else {
        r
    }
}

fn portable_row(t: &Tile, x: &Bf16Input, i: usize, acc: &mut [f32; NR]) {
    acc.fill(0.0);
    for p in 0..t.pairs {
        let xw = x.words[i * x.pairs + p];
        let (x0, x1) = (daz(xw << 16), daz(xw & 0xFFFF_0000));
        for (r, a) in acc.iter_mut().enumerate() {
            let ww = t.words[p * NR + r];
            *a = fma_ftz(x1, daz(ww & 0xFFFF_0000), *a);
            *a = fma_ftz(x0, daz(ww << 16), *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod mxcsr {
    //! SSE's control register: the AVX2 emulations of `vdpbf16ps` set its DAZ and FTZ bits for
    //! the span of their FMAs and restore it before any other float work.

    /// MXCSR's flush-to-zero and denormals-are-zero bits.
    pub const FTZ_DAZ: u32 = 0x8040;

    #[inline(always)]
    pub fn read() -> u32 {
        let mut v: u32 = 0;
        // SAFETY: stmxcsr stores the control register into `v`.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack)) };
        v
    }

    #[inline(always)]
    pub fn write(v: u32) {
        // SAFETY: ldmxcsr loads a valid control word (a saved one, or one with two mode bits
        // set).
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack)) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The same FMAs, 8 rows per register, under MXCSR's DAZ and FTZ (restored afterwards).
    use std::arch::x86_64::*;

    use super::{mxcsr, Bf16Input, Tile, NR};

    /// Input rows per pass of [`rows`].
    pub const MR: usize = 5;

    /// [`MR`] input rows against half the tile's rows at a time. Each accumulator takes two
    /// dependent FMAs per pair, so one input row's 4 (in [`row`]) left the FMA units waiting
    /// on the latency; 10 keep them busy (5 input rows measured 6% faster than 4, the most that
    /// fits in 16 registers). Each weight vector is split once for all [`MR`] rows, and the
    /// activations are broadcast from memory (loads, not FP ports). Every output sums its
    /// pairs in the same order as [`row`], so the bits are the same.
    ///
    /// # Safety
    /// AVX2 and FMA are present; rows `i0..i0 + MR` exist with their values; `out` as in
    /// `tile_product`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row
    pub unsafe fn rows(t: &Tile, x: &Bf16Input, i0: usize, cols: usize, out: *mut f32, ldo: usize) {
        let saved = mxcsr::read();
        mxcsr::write(saved | mxcsr::FTZ_DAZ);
        let hi_mask = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let xv: [&[f32]; MR] = std::array::from_fn(|i| x.values_row(i0 + i));
        let mut sums = [[0.0f32; NR]; MR];
        for half in 0..2 {
            let mut a = [[_mm256_setzero_ps(); 2]; MR];
            for p in 0..t.pairs {
                // SAFETY: 16 words of pair p from row 16·half lie inside the tile.
                let (wa, wb) = unsafe {
                    let q = t.words.as_ptr().add(p * NR + 16 * half);
                    (
                        _mm256_loadu_si256(q.cast()),
                        _mm256_loadu_si256(q.add(8).cast()),
                    )
                };
                let odd = [wa, wb].map(|v| _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask)));
                let even = [wa, wb].map(|v| _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                for i in 0..MR {
                    let x0 = _mm256_broadcast_ss(&xv[i][2 * p]);
                    let x1 = _mm256_broadcast_ss(&xv[i][2 * p + 1]);
                    for j in 0..2 {
                        a[i][j] = _mm256_fmadd_ps(x1, odd[j], a[i][j]);
                        a[i][j] = _mm256_fmadd_ps(x0, even[j], a[i][j]);
                    }
                }
            }
            for (s, ai) in sums.iter_mut().zip(&a) {
                for (j, v) in ai.iter().enumerate() {
                    // SAFETY: columns 16·half + 8j .. + 8 lie inside a row of NR sums.
                    unsafe { _mm256_storeu_ps(s.as_mut_ptr().add(16 * half + 8 * j), *v) };
                }
            }
        }
        mxcsr::write(saved);
        for (i, s) in sums.iter().enumerate() {
            // SAFETY: (i0 + i, c < cols) is this call's part of the output.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), out.add((i0 + i) * ldo), cols) };
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row(t: &Tile, x: &Bf16Input, i: usize, acc: &mut [f32; NR]) {
        let saved = mxcsr::read();
        mxcsr::write(saved | mxcsr::FTZ_DAZ);
        let hi_mask = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let mut a = [_mm256_setzero_ps(); 4];
        for p in 0..t.pairs {
            let xw = x.words[i * x.pairs + p] as i32;
            let x0 = _mm256_castsi256_ps(_mm256_set1_epi32(xw << 16));
            let x1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_set1_epi32(xw), hi_mask));
            for (h, ah) in a.iter_mut().enumerate() {
                // SAFETY: 8 words of pair p from row 8h lie inside the tile.
                let ww = unsafe { _mm256_loadu_si256(t.words.as_ptr().add(p * NR + 8 * h).cast()) };
                let w1 = _mm256_castsi256_ps(_mm256_and_si256(ww, hi_mask));
                let w0 = _mm256_castsi256_ps(_mm256_slli_epi32(ww, 16));
                *ah = _mm256_fmadd_ps(x1, w1, *ah);
                *ah = _mm256_fmadd_ps(x0, w0, *ah);
            }
        }
        for (h, ah) in a.iter().enumerate() {
            // SAFETY: acc holds 32 floats.
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * h), *ah) };
        }
        mxcsr::write(saved);
    }
}

/// Columns `0..cols` of input rows `i0..` from two AVX-512 registers of sums per row.
///
/// # Safety
/// AVX-512 F is present; `out` as in `tile_product`, rows `i0..i0 + acc.len()` this call's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_rows(
    acc: &[[std::arch::x86_64::__m512; 2]],
    i0: usize,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    use std::arch::x86_64::_mm512_storeu_ps;
    for (i, a) in acc.iter().enumerate() {
        let mut o = [0.0f32; NR];
        // SAFETY: o holds 32 floats; (i0 + i, c < cols) is this call's output.
        unsafe {
            _mm512_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm512_storeu_ps(o.as_mut_ptr().add(16), a[1]);
            std::ptr::copy_nonoverlapping(o.as_ptr(), out.add((i0 + i) * ldo), cols);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512fma {
    //! `vdpbf16ps` emulated with AVX-512 FMAs under MXCSR's DAZ and FTZ, for CPUs where two
    //! FMAs do more multiply-adds per cycle than the instruction (`Isa::bf16_dot_slow`) or lack
    //! it: [`MR`] input rows × 32 weight rows per pass, each pair's odd then even products.
    use std::arch::x86_64::*;

    use super::{mxcsr, store_rows, Bf16Input, Tile, NR};

    pub const MR: usize = 8;

    /// # Safety
    /// AVX-512 F is present; rows `i0..i0 + MR` exist with their values; `out` as in
    /// `tile_product`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row
    pub unsafe fn rows(t: &Tile, x: &Bf16Input, i0: usize, cols: usize, out: *mut f32, ldo: usize) {
        let saved = mxcsr::read();
        mxcsr::write(saved | mxcsr::FTZ_DAZ);
        let hi = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        // Each input value broadcast straight from memory (`Bf16Input::values`).
        let xp: [*const f32; MR] = std::array::from_fn(|i| x.values_row(i0 + i).as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..t.pairs {
            // SAFETY: 32 words of pair p lie inside the tile; word p lies inside each row.
            unsafe {
                let q = t.words.as_ptr().add(p * NR);
                let wa = _mm512_loadu_si512(q.cast());
                let wb = _mm512_loadu_si512(q.add(16).cast());
                let odd = [
                    _mm512_castsi512_ps(_mm512_and_si512(wa, hi)),
                    _mm512_castsi512_ps(_mm512_and_si512(wb, hi)),
                ];
                let even = [
                    _mm512_castsi512_ps(_mm512_slli_epi32(wa, 16)),
                    _mm512_castsi512_ps(_mm512_slli_epi32(wb, 16)),
                ];
                for i in 0..MR {
                    let x0 = _mm512_set1_ps(*xp[i].add(2 * p));
                    let x1 = _mm512_set1_ps(*xp[i].add(2 * p + 1));
                    for h in 0..2 {
                        acc[i][h] = _mm512_fmadd_ps(x1, odd[h], acc[i][h]);
                        acc[i][h] = _mm512_fmadd_ps(x0, even[h], acc[i][h]);
                    }
                }
            }
        }
        mxcsr::write(saved);
        // SAFETY: forwarded from the caller.
        unsafe { store_rows(&acc, i0, cols, out, ldo) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! [`MR`] input rows × 32 weight rows per pass, one `vdpbf16ps` per register and pair.
    use std::arch::x86_64::*;

    use super::{store_rows, Bf16Input, Tile, NR};

    pub const MR: usize = 8;

    /// # Safety
    /// AVX-512 BF16 is present; rows `i0..i0 + MR` exist; `out` as in `tile_product`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row
    pub unsafe fn rows(t: &Tile, x: &Bf16Input, i0: usize, cols: usize, out: *mut f32, ldo: usize) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let xw = |i: usize, p: usize| x.words[(i0 + i) * x.pairs + p] as i32;
        for p in 0..t.pairs {
            // SAFETY: 32 words of pair p lie inside the tile.
            let (w0, w1) = unsafe {
                let q = t.words.as_ptr().add(p * NR);
                (
                    _mm512_castsi512_ps(_mm512_loadu_si512(q.cast())),
                    _mm512_castsi512_ps(_mm512_loadu_si512(q.add(16).cast())),
                )
            };
            let (w0, w1) = (
                std::mem::transmute::<__m512, __m512bh>(w0),
                std::mem::transmute::<__m512, __m512bh>(w1),
            );
            for i in 0..MR {
                let b = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(xw(i, p)));
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], b, w0);
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], b, w1);
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { store_rows(&acc, i0, cols, out, ldo) };
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::{round_input, tile_product, Tile, NR};
    use crate::cpu::isa::Isa;

    /// The AVX-512 transposes pack the same words as the scalar loop: whole and partial
    /// blocks of 16 rows and 16 pairs, odd k.
    #[test]
    fn vector_packing_is_the_scalar_packing() {
        for (rows, k) in [(32, 64), (29, 77), (16, 100), (7, 33), (32, 1024), (17, 31)] {
            let w: Vec<bf16> = (0..rows * k)
                .map(|i| bf16::from_bits((i * 7919 % 65_521) as u16))
                .collect();
            let (mut a, mut b) = (Tile::default(), Tile::default());
            a.pack(&w, k, 0, rows, Isa::default());
            // A stale, longer tile first: packing must not keep any of it.
            b.words = vec![u32::MAX; 2048 * NR];
            b.pack(&w, k, 0, rows, Isa::detected());
            assert_eq!(a.pairs, b.pairs);
            assert_eq!(
                a.words[..a.pairs * NR],
                b.words[..b.pairs * NR],
                "rows={rows} k={k}"
            );
        }
    }

    /// Every kernel `tile_product` can pick on this CPU, including both AVX-512 kernels whatever
    /// `bf16_dot_slow` says here, gives the portable kernel's bits: normal, tiny and subnormal
    /// values (where the instruction's DAZ/FTZ decide), an odd k and a partial tile.
    #[test]
    fn every_kernel_gives_the_same_bits() {
        let (m, k, rows) = (19, 77, 29);
        let mut state = 0x1234_5678u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mag = [1.0, 1e-20, 1e-39, 3e-38][(state >> 60) as usize % 4];
            ((state >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * mag
        };
        let w: Vec<bf16> = (0..rows * k).map(|_| bf16::from_f32(next())).collect();
        let xs: Vec<f32> = (0..m * k).map(|_| next()).collect();
        let mut tile = Tile::default();
        tile.pack(&w, k, 0, rows, Isa::default());
        let run = |isa: Isa| {
            let x = round_input(&xs, m, k, super::needs_values(isa));
            let mut out = vec![0.0f32; m * NR];
            // SAFETY: `isa` holds only detected features; `out` is m rows of NR.
            unsafe { tile_product(&tile, &x, isa, rows, out.as_mut_ptr(), NR) };
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let want = run(Isa::default());
        let d = Isa::detected();
        let mut variants = vec![Isa {
            avx512: false,
            vnni: false,
            bf16: false,
            bf16_dot_slow: false,
            ..d
        }];
        variants.push(Isa {
            vnni: false,
            bf16: false,
            bf16_dot_slow: false,
            ..d
        });
        variants.push(Isa {
            bf16_dot_slow: false,
            ..d
        });
        variants.push(Isa {
            bf16_dot_slow: d.bf16,
            ..d
        });
        for isa in variants {
            assert_eq!(run(isa), want, "{isa:?}");
        }
    }

    #[test]
    fn bf16_rounding_matches_half() {
        // Every exponent and sign with mantissas around each rounding boundary, a stride
        // through all bit patterns, and the special values.
        let mut bits: Vec<u32> = (0..=u32::MAX).step_by(65_521).collect();
        for hi in 0..=0xFFFFu32 {
            for lo in [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                bits.push(hi << 16 | lo);
            }
        }
        for b in bits {
            let v = f32::from_bits(b);
            assert_eq!(
                super::bf16_bits(v),
                bf16::from_f32(v).to_bits() as u32,
                "{b:#010x}"
            );
        }
    }
}

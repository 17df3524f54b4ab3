//! Decode-shaped products with 4- and 8-bit affine weights, fused for AVX2: per group,
//! `Σ x·(s·q + b) = Σ x·(s·q) + b·Σx`, so each code is widened once, scaled once, and shared by
//! all input rows, and the bias costs one multiply per group using the input's group sums.
//!
//! The sums run in a fixed order (two vector accumulators per input row, alternating words),
//! so results do not depend on threads; they differ in the last bits from the portable
//! decode-then-dot path, which CPUs without AVX2 take.

use std::arch::x86_64::*;

use super::out::DECODE_MAX_M;
use crate::quant::decode::Affine;

/// Σx over each group of each input row: `[m, k / group]`, summed left to right.
pub fn group_sums(xs: &[f32], m: usize, k: usize, group: usize) -> Vec<f32> {
    xs[..m * k]
        .chunks_exact(group)
        .map(|g| g.iter().sum())
        .collect()
}

/// Whether [`row_dot`] takes `BITS`-bit codes in groups of `group`: 4 or 8 bits, and groups of
/// whole 16-column steps.
pub fn applies(bits: usize, group: usize) -> bool {
    matches!(bits, 4 | 8) && group.is_multiple_of(16)
}

/// `out[i] = x_i · w_r` for input rows `i < m ≤ DECODE_MAX_M` and weight row `r`.
///
/// # Safety
/// The CPU has AVX2; [`applies`] to the weight; `xs` holds `m` rows of `k`, `xsum` is
/// `group_sums` of them, and `r` is a row of `w` (which has `k` columns).
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn row_dot<const BITS: usize>(
    w: &Affine<BITS>,
    r: usize,
    k: usize,
    xs: &[f32],
    m: usize,
    xsum: &[f32],
    out: &mut [f32; DECODE_MAX_M],
) {
    // A const row count keeps every accumulator in a register (indexing them by a run-time
    // count spills them to the stack and serialises the adds through memory).
    // SAFETY: forwarded from the caller.
    unsafe { by_rows!(m, row_dot_m[BITS](w, r, k, xs, xsum, out)) }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn row_dot_m<const M: usize, const BITS: usize>(
    w: &Affine<BITS>,
    r: usize,
    k: usize,
    xs: &[f32],
    xsum: &[f32],
    out: &mut [f32; DECODE_MAX_M],
) {
    let group = w.group;
    let groups = k / group;
    // Words per 16 columns: 2 of 4-bit codes, 4 of 8-bit.
    let step = 16 * BITS / 32;
    let words = &w.packed[r * k * BITS / 32..(r + 1) * k * BITS / 32];
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let low = _mm256_set1_epi32(0xF);
    let nibbles = |word: u32| {
        _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts),
            low,
        )
    };
    // Columns c..c + 16 of the row as two vectors of codes.
    let codes = |ws: &[u32]| -> (__m256i, __m256i) {
        if BITS == 4 {
            (nibbles(ws[0]), nibbles(ws[1]))
        } else {
            // SAFETY: `ws` holds the 4 words (16 bytes) of the step.
            let bytes = unsafe { _mm_loadu_si128(ws.as_ptr().cast()) };
            (
                _mm256_cvtepu8_epi32(bytes),
                _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)),
            )
        }
    };
    let mut even = [_mm256_setzero_ps(); M];
    let mut odd = [_mm256_setzero_ps(); M];
    let mut bias = [0.0f32; M];
    for g in 0..groups {
        let s = _mm256_set1_ps(w.scales.get(r * groups + g));
        let b = w.biases.get(r * groups + g);
        // Groups hold whole 16-column steps ([`applies`]).
        let gw = group * BITS / 32;
        for (p, ws) in words[g * gw..(g + 1) * gw].chunks_exact(step).enumerate() {
            let (q0, q1) = codes(ws);
            let (v0, v1) = (
                _mm256_mul_ps(_mm256_cvtepi32_ps(q0), s),
                _mm256_mul_ps(_mm256_cvtepi32_ps(q1), s),
            );
            let c = g * group + p * 16;
            for i in 0..M {
                // SAFETY: c + 16 ≤ k, and row i of xs has k elements.
                let (x0, x1) = unsafe {
                    let base = xs.as_ptr().add(i * k + c);
                    (_mm256_loadu_ps(base), _mm256_loadu_ps(base.add(8)))
                };
                even[i] = _mm256_add_ps(even[i], _mm256_mul_ps(x0, v0));
                odd[i] = _mm256_add_ps(odd[i], _mm256_mul_ps(x1, v1));
            }
        }
        for i in 0..M {
            bias[i] += b * xsum[i * groups + g];
        }
    }
    for i in 0..M {
        out[i] = finish(even[i], odd[i], bias[i]);
    }
}

/// A row's result from its two accumulators and its bias term, in a fixed order.
#[inline]
#[target_feature(enable = "avx2")]
fn finish(even: __m256, odd: __m256, bias: f32) -> f32 {
    // SAFETY: AVX2 (so AVX) is enabled here.
    unsafe { super::out::tree8(_mm256_add_ps(even, odd)) + bias }
}

/// [`row_dot`] on AVX-512: one 16-lane register per input row holds the AVX2 kernel's two
/// accumulators side by side (the step's columns `c..c + 8` in the low half, `c + 8..c + 16` in
/// the high half), and every lane runs the same multiplies and adds in the same order, so the
/// bits are the AVX2 kernel's, with half the instructions.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL (and AVX2); otherwise as [`row_dot`].
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub unsafe fn row_dot_avx512<const BITS: usize>(
    w: &Affine<BITS>,
    r: usize,
    k: usize,
    xs: &[f32],
    m: usize,
    xsum: &[f32],
    out: &mut [f32; DECODE_MAX_M],
) {
    // SAFETY: forwarded from the caller.
    unsafe { by_rows!(m, wide_m[BITS](w, r, k, xs, xsum, out)) }
}

#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn wide_m<const M: usize, const BITS: usize>(
    w: &Affine<BITS>,
    r: usize,
    k: usize,
    xs: &[f32],
    xsum: &[f32],
    out: &mut [f32; DECODE_MAX_M],
) {
    let group = w.group;
    let groups = k / group;
    let step = 16 * BITS / 32;
    let words = &w.packed[r * k * BITS / 32..(r + 1) * k * BITS / 32];
    let shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    let low = _mm512_set1_epi32(0xF);
    // Lane l reads word l / 8 of the step's two.
    let halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    // Columns c..c + 16 of the row as one vector of codes.
    let codes = |ws: &[u32]| -> __m512i {
        if BITS == 4 {
            // SAFETY: `ws` holds the step's 2 words (8 bytes).
            let pair = _mm512_castsi128_si512(unsafe { _mm_loadl_epi64(ws.as_ptr().cast()) });
            let spread = _mm512_permutexvar_epi32(halves, pair);
            _mm512_and_si512(_mm512_srlv_epi32(spread, shifts), low)
        } else {
            // SAFETY: `ws` holds the step's 4 words (16 bytes).
            _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(ws.as_ptr().cast()) })
        }
    };
    let mut acc = [_mm512_setzero_ps(); M];
    let mut bias = [0.0f32; M];
    for g in 0..groups {
        let s = _mm512_set1_ps(w.scales.get(r * groups + g));
        let b = w.biases.get(r * groups + g);
        let gw = group * BITS / 32;
        for (p, ws) in words[g * gw..(g + 1) * gw].chunks_exact(step).enumerate() {
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(codes(ws)), s);
            let c = g * group + p * 16;
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: c + 16 ≤ k, and row i of xs has k elements.
                let x = unsafe { _mm512_loadu_ps(xs.as_ptr().add(i * k + c)) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(x, v));
            }
        }
        for (i, bi) in bias.iter_mut().enumerate() {
            *bi += b * xsum[i * groups + g];
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let even = _mm512_castps512_ps256(*a);
        let odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*a), 1));
        out[i] = finish(even, odd, bias[i]);
    }
}

//! Decode-shaped products with dense bf16 weights, widened in registers (a shift per element)
//! instead of through a buffer: the weight streams from memory once, straight into the sums.
//!
//! Same numerics as the portable decode kernel (`matmul::fold_lanes`): 32 lanes per input row,
//! lane `c % 32` taking column `c`'s product, multiply then add (no FMA), then the fixed tree.
//! AVX-512 holds the 32 lanes in two registers, AVX2 in four; the tail of a row that is not a
//! multiple of 32 runs the same operations in scalar code. So every ISA gives the same bits.

use std::arch::x86_64::*;

use half::bf16;

use super::out::{OutPtr, DECODE_MAX_M};
use crate::cpu::tree_sum;

const LANES: usize = 32;

/// Output columns `r0..r1` for the `m ≤ DECODE_MAX_M` rows of `xs` (`[m, k]`), `w` `[n, k]`.
///
/// # Safety
/// The CPU has AVX2 (and AVX-512 F/BW/VL when `avx512`); no other thread writes columns
/// `r0..r1` of `dst` (`[m, n]`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(
    avx512: bool,
    xs: &[f32],
    m: usize,
    k: usize,
    w: &[bf16],
    n: usize,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    debug_assert!(m <= DECODE_MAX_M);
    // SAFETY: forwarded from the caller.
    unsafe {
        if avx512 {
            by_rows!(m, rows_avx512(xs, k, w, n, r0, r1, dst))
        } else {
            by_rows!(m, rows_avx2(xs, k, w, n, r0, r1, dst))
        }
    }
}

/// The columns past the last whole block of 32, then the tree, for each input row.
#[inline(always)]
unsafe fn finish<const M: usize>(
    lanes: &mut [[f32; LANES]; M],
    xs: &[f32],
    k: usize,
    row: &[bf16],
    r: usize,
    n: usize,
    dst: OutPtr,
) {
    let full = k / LANES * LANES;
    for (i, lane) in lanes.iter_mut().enumerate() {
        for c in full..k {
            lane[c - full] += xs[i * k + c] * f32::from_bits((row[c].to_bits() as u32) << 16);
        }
        // SAFETY: (i, r) is inside the m x n output and column r is the caller's alone.
        unsafe { *dst.at(i * n + r) = tree_sum(*lane) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn rows_avx512<const M: usize>(
    xs: &[f32],
    k: usize,
    w: &[bf16],
    n: usize,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    let widen = |h: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    for r in r0..r1 {
        let row = &w[r * k..(r + 1) * k];
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        for c in (0..k / LANES * LANES).step_by(LANES) {
            // SAFETY: c + 32 ≤ k for the row and for every input row.
            unsafe {
                let wv = _mm512_loadu_si512(row.as_ptr().add(c).cast());
                let w0 = widen(_mm512_castsi512_si256(wv));
                let w1 = widen(_mm512_extracti64x4_epi64(wv, 1));
                for (i, a) in acc.iter_mut().enumerate() {
                    let x = xs.as_ptr().add(i * k + c);
                    a[0] = _mm512_add_ps(a[0], _mm512_mul_ps(_mm512_loadu_ps(x), w0));
                    a[1] = _mm512_add_ps(a[1], _mm512_mul_ps(_mm512_loadu_ps(x.add(16)), w1));
                }
            }
        }
        let mut lanes = [[0.0f32; LANES]; M];
        for (l, a) in lanes.iter_mut().zip(&acc) {
            // SAFETY: a lane array holds 32 floats.
            unsafe {
                _mm512_storeu_ps(l.as_mut_ptr(), a[0]);
                _mm512_storeu_ps(l.as_mut_ptr().add(16), a[1]);
            }
        }
        // SAFETY: forwarded.
        unsafe { finish(&mut lanes, xs, k, row, r, n, dst) };
    }
}

#[target_feature(enable = "avx2")]
unsafe fn rows_avx2<const M: usize>(
    xs: &[f32],
    k: usize,
    w: &[bf16],
    n: usize,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    let widen = |h: __m128i| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    for r in r0..r1 {
        let row = &w[r * k..(r + 1) * k];
        let mut acc = [[_mm256_setzero_ps(); 4]; M];
        for c in (0..k / LANES * LANES).step_by(LANES) {
            // SAFETY: c + 32 ≤ k for the row and for every input row.
            unsafe {
                let p = row.as_ptr().add(c);
                let wq = [
                    widen(_mm_loadu_si128(p.cast())),
                    widen(_mm_loadu_si128(p.add(8).cast())),
                    widen(_mm_loadu_si128(p.add(16).cast())),
                    widen(_mm_loadu_si128(p.add(24).cast())),
                ];
                for (i, a) in acc.iter_mut().enumerate() {
                    let x = xs.as_ptr().add(i * k + c);
                    for (j, wj) in wq.iter().enumerate() {
                        let xj = _mm256_loadu_ps(x.add(8 * j));
                        a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(xj, *wj));
                    }
                }
            }
        }
        let mut lanes = [[0.0f32; LANES]; M];
        for (l, a) in lanes.iter_mut().zip(&acc) {
            for (j, v) in a.iter().enumerate() {
                // SAFETY: a lane array holds 32 floats.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * j), *v) };
            }
        }
        // SAFETY: forwarded.
        unsafe { finish(&mut lanes, xs, k, row, r, n, dst) };
    }
}

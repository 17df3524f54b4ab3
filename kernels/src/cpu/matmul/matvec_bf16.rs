//! Decode-shaped products with dense bf16 weights, widened in registers instead of through a
//! buffer: the weight streams from memory once, straight into the sums.
//!
//! Same numerics as the portable decode kernel (`matmul::fold_lanes`): 32 lanes per input row,
//! lane `c % 32` taking column `c`'s product, multiply then add (no FMA), then the fixed tree.
//! The tail of a row that is not a multiple of 32 runs the same operations in scalar code. So
//! every ISA gives the same bits.
//!
//! A pair of bf16 weights read as one 32-bit word widens with one instruction each: the even
//! column is the word shifted left by 16, the odd one the word with its low half cleared. So
//! the registers hold a block's columns evens first, and the input is laid out once per call in
//! that order ([`Input`]), so every lane still sums the same products in the same order. The
//! tree's first four levels pair even columns with even ones and odd with odd, so it runs on
//! the two halves as they lie and adds them last ([`finish`]).
//!
//! AVX-512 runs one weight row against every input row (16 accumulators for 8), AVX2, with 16
//! registers, against up to three at a time. The lane trees fold in registers.

use std::arch::x86_64::*;

use half::bf16;

use super::out::{OutPtr, DECODE_MAX_M};
use crate::cpu::tree_sum;

const LANES: usize = 32;

/// Which column of a block of 32 each register lane holds: AVX-512 loads the block as one
/// register of 16 words (evens, then odds), AVX2 as two of 8 words each.
fn column(avx512: bool, s: usize) -> usize {
    if avx512 {
        2 * (s % 16) + s / 16
    } else {
        16 * (s / 16) + 2 * (s % 8) + (s % 16) / 8
    }
}

/// 16 floats on a 64-byte boundary, so input rows start on a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// The input rows with each whole block of 32 columns in register order ([`column`]); rows
/// start on cache lines. The columns past the last whole block are read from the caller's rows.
pub struct Input<'a> {
    lines: Vec<Line>,
    /// Floats per row in `lines`.
    stride: usize,
    xs: &'a [f32],
    m: usize,
    k: usize,
}

impl<'a> Input<'a> {
    pub fn new(xs: &'a [f32], m: usize, k: usize, avx512: bool) -> Input<'a> {
        // One line more than the row needs: rows a multiple of 4 KiB apart would share L1 sets.
        let stride = k.div_ceil(16) * 16 + 16;
        let mut lines = vec![Line([0.0; 16]); m * stride / 16];
        let mut order = [0usize; LANES];
        for (s, o) in order.iter_mut().enumerate() {
            *o = column(avx512, s);
        }
        // SAFETY: a `Line` is 16 floats and nothing else (size 64, align 64), so the lines are
        // `16 × len` contiguous floats.
        let flat: &mut [f32] =
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 16) };
        for (src, dst) in xs[..m * k]
            .chunks_exact(k)
            .zip(flat.chunks_exact_mut(stride))
        {
            for (from, to) in src.chunks_exact(LANES).zip(dst.chunks_exact_mut(LANES)) {
                for (t, &c) in to.iter_mut().zip(&order) {
                    *t = from[c];
                }
            }
        }
        Input {
            lines,
            stride,
            xs,
            m,
            k,
        }
    }

    /// Row `i`'s block starting at column `c` (a multiple of 32), in register order.
    #[inline(always)]
    fn at(&self, i: usize, c: usize) -> *const f32 {
        debug_assert!(i < self.m && c + LANES <= self.k);
        self.lines
            .as_ptr()
            .cast::<f32>()
            .wrapping_add(i * self.stride + c)
    }
}

/// Output columns `r0..r1` for the `m ≤ DECODE_MAX_M` rows of `x`, `w` `[n, k]`.
///
/// # Safety
/// The CPU has AVX2 (and AVX-512 F/BW/VL when `avx512`, which `x` was laid out for); no other
/// thread writes columns `r0..r1` of `dst` (`[m, n]`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(
    avx512: bool,
    x: &Input,
    w: &[bf16],
    n: usize,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    debug_assert!(x.m <= DECODE_MAX_M);
    // SAFETY: forwarded from the caller.
    unsafe {
        if avx512 {
            by_rows!(x.m, rows_avx512(x, w, n, r0, r1, dst))
        } else {
            by_rows!(x.m, rows_avx2(x, w, n, r0, r1, dst))
        }
    }
}

/// Input rows `i0..i0 + M` against weight row `r`, from each input row's lanes split into the
/// even columns of a block (`ev[t]` is column `2t`) and the odd ones: the columns past the last
/// whole block join their lanes, then the fixed tree runs on the two halves. The tree's first
/// four levels pair even columns with even ones and odd with odd (`l` with `l + 16`, `+ 8`,
/// `+ 4`, `+ 2`), so each half folds onto itself and the last level adds the two: the same
/// additions as `tree_sum` over the lanes in column order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn finish<const M: usize>(
    ev: &mut [[f32; 16]; M],
    od: &mut [[f32; 16]; M],
    x: &Input,
    i0: usize,
    row: &[bf16],
    r: usize,
    n: usize,
    dst: OutPtr,
) {
    let k = x.k;
    let full = k / LANES * LANES;
    for i in 0..M {
        let (tail, mask) = tail_products(&x.xs[(i0 + i) * k..(i0 + i + 1) * k], row, full);
        for (half, (t, m)) in [&mut ev[i], &mut od[i]]
            .into_iter()
            .zip(tail.iter().zip(mask))
        {
            for (l, (h, &t)) in half.iter_mut().zip(t).enumerate() {
                if m & (1 << l) != 0 {
                    *h += t;
                }
            }
        }
        let total = tree_sum(ev[i]) + tree_sum(od[i]);
        // SAFETY: (i0 + i, r) is inside the m x n output and column r is the caller's alone.
        unsafe { *dst.at((i0 + i) * n + r) = total };
    }
}

/// The products of the columns past the last whole block (`full..k`) of one input row and one
/// weight row, by lane: column `full + l` in half `l % 2` (even, odd) at `l / 2`, with a mask
/// of the lanes that have one.
fn tail_products(xi: &[f32], row: &[bf16], full: usize) -> ([[f32; 16]; 2], [u16; 2]) {
    let mut tail = [[0.0f32; 16]; 2];
    let mut mask = [0u16; 2];
    for c in full..xi.len() {
        let l = c - full;
        tail[l % 2][l / 2] = xi[c] * f32::from_bits((row[c].to_bits() as u32) << 16);
        mask[l % 2] |= 1 << (l / 2);
    }
    (tail, mask)
}

/// One weight row at a time (a single stream from memory: two interleaved rows streamed
/// more slowly from DRAM) against all `M` input rows, whose 2·M accumulators fit the registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn rows_avx512<const M: usize>(
    x: &Input,
    w: &[bf16],
    n: usize,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    let k = x.k;
    let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    for r in r0..r1 {
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        for c in (0..k / LANES * LANES).step_by(LANES) {
            // SAFETY: c + 32 ≤ k inside weight row r.
            let words = unsafe { _mm512_loadu_si512(w.as_ptr().add(r * k + c).cast()) };
            let wv = [
                _mm512_castsi512_ps(_mm512_slli_epi32(words, 16)),
                _mm512_castsi512_ps(_mm512_and_si512(words, high)),
            ];
            for (i, a) in acc.iter_mut().enumerate() {
                let p = x.at(i, c);
                // SAFETY: a block of 32 floats of input row i, on a cache line.
                let xv = unsafe { [_mm512_load_ps(p), _mm512_load_ps(p.add(16))] };
                for h in 0..2 {
                    a[h] = _mm512_add_ps(a[h], _mm512_mul_ps(xv[h], wv[h]));
                }
            }
        }
        // SAFETY: forwarded.
        unsafe { finish_avx512(&acc, x, w, n, r, dst) };
    }
}

/// [`finish`] for weight row `r` against all input rows: the tail columns join their lanes
/// (masked adds, so lanes without one keep their bits, signed zeros included), then each
/// output's two halves fold in registers: all together ([`super::out::trees16`]) when there
/// are four outputs or more, one by one ([`super::out::tree16`]) below.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn finish_avx512<const M: usize>(
    acc: &[[__m512; 2]; M],
    x: &Input,
    w: &[bf16],
    n: usize,
    r: usize,
    dst: OutPtr,
) {
    let k = x.k;
    let full = k / LANES * LANES;
    // Input row i's even half in register i, its odd half in register 8 + i.
    let mut v = [_mm512_setzero_ps(); 16];
    for (i, h) in acc.iter().enumerate() {
        v[i] = h[0];
        v[8 + i] = h[1];
        if full < k {
            let row = &w[r * k..(r + 1) * k];
            let (tail, mask) = tail_products(&x.xs[i * k..(i + 1) * k], row, full);
            for (half, at) in [i, 8 + i].into_iter().enumerate() {
                // SAFETY: a tail holds 16 floats.
                let t = unsafe { _mm512_loadu_ps(tail[half].as_ptr()) };
                v[at] = _mm512_mask_add_ps(v[at], mask[half], v[at], t);
            }
        }
    }
    // SAFETY (all calls): AVX-512 F is present; (i, r) is inside the m x n output and column r
    // is the caller's alone.
    unsafe {
        if M < 4 {
            for i in 0..M {
                *dst.at(i * n + r) = super::out::tree16(v[i]) + super::out::tree16(v[8 + i]);
            }
            return;
        }
        let sums = super::out::trees16(&v);
        for i in 0..M {
            *dst.at(i * n + r) = sums[i] + sums[8 + i];
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn rows_avx2<const M: usize>(
    x: &Input,
    w: &[bf16],
    n: usize,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    // At most three input rows per pass: 12 accumulators and 4 widened weights fill the 16
    // registers.
    for r in r0..r1 {
        let mut i0 = 0;
        while i0 < M {
            // SAFETY: forwarded; row r is the caller's and i0..i0 + MB are input rows.
            unsafe {
                match M - i0 {
                    1 => block_avx2::<1>(x, i0, w, n, r, dst),
                    2 => block_avx2::<2>(x, i0, w, n, r, dst),
                    _ => block_avx2::<3>(x, i0, w, n, r, dst),
                }
            }
            i0 += 3;
        }
    }
}

/// Weight row `r` against input rows `i0..i0 + MB`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2<const MB: usize>(
    x: &Input,
    i0: usize,
    w: &[bf16],
    n: usize,
    r: usize,
    dst: OutPtr,
) {
    let k = x.k;
    let row = &w[r * k..(r + 1) * k];
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let mut acc = [[_mm256_setzero_ps(); 4]; MB];
    for c in (0..k / LANES * LANES).step_by(LANES) {
        // SAFETY: c + 32 ≤ k inside the row.
        let (lo, hi) = unsafe {
            let p = row.as_ptr().add(c);
            (
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(16).cast()),
            )
        };
        let wv = [
            _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(lo, high)),
            _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(hi, high)),
        ];
        for (i, a) in acc.iter_mut().enumerate() {
            let p = x.at(i0 + i, c);
            for (j, v) in wv.iter().enumerate() {
                // SAFETY: a block of 32 floats of input row i0 + i, on a 32-byte boundary.
                let xj = unsafe { _mm256_load_ps(p.add(8 * j)) };
                a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(xj, *v));
            }
        }
    }
    if k.is_multiple_of(LANES) {
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: (i0 + i, r) is inside the m x n output and column r is the caller's.
            unsafe { *dst.at((i0 + i) * n + r) = tree_avx2(a) };
        }
        return;
    }
    let (mut ev, mut od) = ([[0.0f32; 16]; MB], [[0.0f32; 16]; MB]);
    for i in 0..MB {
        // SAFETY: each half holds 16 floats: registers 0 and 2 hold the even columns of the
        // block's two halves, 1 and 3 the odd ones.
        unsafe {
            _mm256_storeu_ps(ev[i].as_mut_ptr(), acc[i][0]);
            _mm256_storeu_ps(od[i].as_mut_ptr(), acc[i][1]);
            _mm256_storeu_ps(ev[i].as_mut_ptr().add(8), acc[i][2]);
            _mm256_storeu_ps(od[i].as_mut_ptr().add(8), acc[i][3]);
        }
    }
    // SAFETY: forwarded.
    unsafe { finish(&mut ev, &mut od, x, i0, row, r, n, dst) };
}

/// [`finish`]'s tree in registers, for rows without tail columns: the even halves (registers
/// 0 and 2) and the odd ones (1 and 3) fold level by level side by side, then meet.
#[inline]
#[target_feature(enable = "avx2")]
fn tree_avx2(a: &[__m256; 4]) -> f32 {
    // Lanes t and t + 8: one register per half.
    let (ev, od) = (_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    // t and t + 4: the even half's four in the low 128 bits, the odd half's in the high.
    let q = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(ev, od),
        _mm256_permute2f128_ps::<0x31>(ev, od),
    );
    // t and t + 2, then t and t + 1, within each 128 bits.
    let h = _mm256_add_ps(q, _mm256_shuffle_ps::<0b11_10_11_10>(q, q));
    let one = _mm256_add_ps(h, _mm256_shuffle_ps::<0b01_01_01_01>(h, h));
    _mm_cvtss_f32(_mm_add_ss(
        _mm256_castps256_ps128(one),
        _mm256_extractf128_ps::<1>(one),
    ))
}

//! The `fast` numerics' decode product with dense bf16 weights: the activations rounded to bf16
//! pairs once (`bgemm_bf16::round_input`), then each weight row summed against them as AVX-512
//! BF16's `vdpbf16ps` sums, reading the row as stored (2 bytes per weight, no repacking).
//!
//! The exact decode kernel widens each weight and multiplies in f32; on this shape the
//! widening, not the memory, bounded it (24–31 GB/s against llama.cpp's 34 with `vdpbf16ps`).
//!
//! Per input row and weight row, pair `p` (columns `2p`, `2p + 1`; an odd last column pairs
//! with a zero) goes to lane `p % 32`, and each lane runs over its pairs in order:
//! `acc = fma(x[2p+1], w[2p+1], acc)` then `acc = fma(x[2p], w[2p], acc)`, with bf16
//! subnormals read as zero and subnormal results flushed (the instruction's fixed DAZ/FTZ, round
//! to nearest even). Then the 32 lanes meet in the fixed tree. AVX-512 BF16 holds the lanes in
//! two registers, the AVX2 emulation in four under MXCSR's DAZ/FTZ, portable code runs them in
//! software: every ISA gives the same bits, and an input row gives the same bits alone or among
//! the rows of an MTP verification.

use half::bf16;

use super::bgemm_bf16::{daz, fma_ftz, Bf16Input};
use super::out::{OutPtr, DECODE_MAX_M};
use crate::cpu::isa::Isa;
use crate::cpu::tree_sum;

/// Lanes per input row (pairs of columns, so a block is 64 columns).
const LANES: usize = 32;

/// Output columns `r0..r1` for the rows of `x` (`m ≤ DECODE_MAX_M` rows of `k`), `w` `[n, k]`.
///
/// # Safety
/// `isa` holds only features the CPU has; no other thread writes columns `r0..r1` of `dst`
/// (`[m, n]`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(
    x: &Bf16Input,
    w: &[bf16],
    k: usize,
    n: usize,
    r0: usize,
    r1: usize,
    isa: Isa,
    dst: OutPtr,
) {
    let m = x.rows();
    debug_assert!(m <= DECODE_MAX_M);
    #[cfg(target_arch = "x86_64")]
    if isa.bf16 && k.is_multiple_of(2 * LANES) {
        use x86::rows_avx512bf16;
        // SAFETY: forwarded from the caller; the rows are whole blocks.
        return unsafe { by_rows!(m, rows_avx512bf16(x, w, k, n, r0, r1, dst)) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { by_rows!(m, rows_m(x, w, k, n, r0, r1, isa, dst)) }
}

/// [`rows`] for `M` input rows: the row count is dispatched once per call, not per weight row
/// (with `k` of about a thousand a weight row is only 16 blocks, so per-row set-up showed).
#[allow(clippy::too_many_arguments)]
unsafe fn rows_m<const M: usize>(
    x: &Bf16Input,
    w: &[bf16],
    k: usize,
    n: usize,
    r0: usize,
    r1: usize,
    isa: Isa,
    dst: OutPtr,
) {
    let blocks = k / 2 / LANES;
    for r in r0..r1 {
        let row = &w[r * k..(r + 1) * k];
        let mut lanes = [[0.0f32; LANES]; M];
        // SAFETY: forwarded; `blocks` whole blocks of 64 columns lie inside the row and inside
        // every input row's pairs.
        let done = unsafe { vector_blocks::<M>(isa, x, row, blocks, &mut lanes) };
        for (i, lane) in lanes.iter_mut().enumerate() {
            pairs_in_software(x.row(i), row, done, lane);
            // SAFETY: (i, r) is inside the m x n output and column r is the caller's alone.
            unsafe { *dst.at(i * n + r) = tree_sum(*lane) };
        }
    }
}

/// Runs the first `blocks` blocks of the row in vector code where the CPU has it; returns the
/// number of pairs done (0 when there is no vector kernel).
#[allow(unused_variables)]
unsafe fn vector_blocks<const M: usize>(
    isa: Isa,
    x: &Bf16Input,
    row: &[bf16],
    blocks: usize,
    lanes: &mut [[f32; LANES]; M],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use x86::{blocks_avx2, blocks_avx512bf16};
        if isa.bf16 {
            // SAFETY: forwarded from the caller.
            unsafe { blocks_avx512bf16::<M>(x, row, blocks, lanes) };
            return blocks * LANES;
        }
        if isa.avx2 {
            // SAFETY: forwarded from the caller.
            unsafe { blocks_avx2::<M>(x, row, blocks, lanes) };
            return blocks * LANES;
        }
    }
    0
}

/// Pairs `from..` of one input row into its lanes, as the instruction would sum them.
fn pairs_in_software(xw: &[u32], row: &[bf16], from: usize, lane: &mut [f32; LANES]) {
    for (p, &xp) in xw.iter().enumerate().skip(from) {
        let lo = row[2 * p].to_bits() as u32;
        let hi = row.get(2 * p + 1).map_or(0, |v| v.to_bits() as u32);
        let a = &mut lane[p % LANES];
        *a = fma_ftz(daz(xp & 0xFFFF_0000), daz(hi << 16), *a);
        *a = fma_ftz(daz(xp << 16), daz(lo << 16), *a);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::bgemm_bf16::mxcsr;
    use super::super::out::{tree16, trees16, OutPtr};
    use super::{Bf16Input, LANES};
    use half::bf16;

    /// Rows of whole blocks only (`k` a multiple of 64) with AVX-512 BF16: one weight row at a
    /// time against all `M` input rows, then the lane trees folded in registers, all outputs
    /// together ([`trees16`]) from four input rows up, one by one ([`tree16`]) below; the same
    /// sums as [`blocks_avx512bf16`] and `tree_sum`, so the same bits.
    ///
    /// # Safety
    /// AVX-512 BF16 is present; `k` is a multiple of 64; `x` has `M` rows of `k / 2` pairs and
    /// `w` `n` rows of `k`; no other thread writes columns `r0..r1` of `dst` (`[M, n]`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn rows_avx512bf16<const M: usize>(
        x: &Bf16Input,
        w: &[bf16],
        k: usize,
        n: usize,
        r0: usize,
        r1: usize,
        dst: OutPtr,
    ) {
        let bh = |v: __m512i| std::mem::transmute::<__m512i, __m512bh>(v);
        let xp: [*const u32; M] = std::array::from_fn(|i| x.row(i).as_ptr());
        for r in r0..r1 {
            let mut acc = [[_mm512_setzero_ps(); 2]; M];
            for b in 0..k / (2 * LANES) {
                // SAFETY: block b's 64 columns lie inside weight row r and its 32 pairs inside
                // each input row.
                unsafe {
                    let p = w.as_ptr().add(r * k + 64 * b);
                    let w0 = bh(_mm512_loadu_si512(p.cast()));
                    let w1 = bh(_mm512_loadu_si512(p.add(32).cast()));
                    for (a, xp) in acc.iter_mut().zip(&xp) {
                        let x0 = bh(_mm512_loadu_si512(xp.add(32 * b).cast()));
                        let x1 = bh(_mm512_loadu_si512(xp.add(32 * b + 16).cast()));
                        a[0] = _mm512_dpbf16_ps(a[0], x0, w0);
                        a[1] = _mm512_dpbf16_ps(a[1], x1, w1);
                    }
                }
            }
            // The tree's first level (lanes l and l + 16) is the two registers' sum.
            let mut v = [_mm512_setzero_ps(); 16];
            for (v, a) in v.iter_mut().zip(&acc) {
                *v = _mm512_add_ps(a[0], a[1]);
            }
            // SAFETY (all calls): AVX-512 F is present; (i, r) is inside the output and column
            // r the caller's.
            unsafe {
                if M < 4 {
                    for (i, v) in v.iter().take(M).enumerate() {
                        *dst.at(i * n + r) = tree16(*v);
                    }
                } else {
                    let sums = trees16(&v);
                    for (i, s) in sums.iter().take(M).enumerate() {
                        *dst.at(i * n + r) = *s;
                    }
                }
            }
        }
    }

    /// Whole blocks with `vdpbf16ps`: lanes 0..16 in one register, 16..32 in the other.
    ///
    /// # Safety
    /// AVX-512 BF16 is present; the row and `M` input rows hold `blocks` whole blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row
    pub unsafe fn blocks_avx512bf16<const M: usize>(
        x: &Bf16Input,
        row: &[bf16],
        blocks: usize,
        lanes: &mut [[f32; LANES]; M],
    ) {
        let xp: [*const u32; M] = std::array::from_fn(|i| x.row(i).as_ptr());
        let wp = row.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        let bh = |v: __m512i| std::mem::transmute::<__m512i, __m512bh>(v);
        for b in 0..blocks {
            // SAFETY: block b's 64 columns lie inside the row and its 32 pairs inside each
            // input row.
            unsafe {
                let w0 = bh(_mm512_loadu_si512(wp.add(64 * b).cast()));
                let w1 = bh(_mm512_loadu_si512(wp.add(64 * b + 32).cast()));
                for i in 0..M {
                    let x0 = bh(_mm512_loadu_si512(xp[i].add(32 * b).cast()));
                    let x1 = bh(_mm512_loadu_si512(xp[i].add(32 * b + 16).cast()));
                    acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x0, w0);
                    acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x1, w1);
                }
            }
        }
        for (l, a) in lanes.iter_mut().zip(&acc) {
            // SAFETY: a lane array holds 32 floats.
            unsafe {
                _mm512_storeu_ps(l.as_mut_ptr(), a[0]);
                _mm512_storeu_ps(l.as_mut_ptr().add(16), a[1]);
            }
        }
    }

    /// The same FMAs on AVX2, 8 lanes per register, under MXCSR's DAZ and FTZ.
    ///
    /// # Safety
    /// AVX2 and FMA are present; the row and `M` input rows hold `blocks` whole blocks.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn blocks_avx2<const M: usize>(
        x: &Bf16Input,
        row: &[bf16],
        blocks: usize,
        lanes: &mut [[f32; LANES]; M],
    ) {
        let xp: [*const u32; M] = std::array::from_fn(|i| x.row(i).as_ptr());
        let wp = row.as_ptr();
        let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let split = |v: __m256i| {
            (
                _mm256_castsi256_ps(_mm256_and_si256(v, hi)),
                _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
            )
        };
        let saved = mxcsr::read();
        mxcsr::write(saved | mxcsr::FTZ_DAZ);
        let mut acc = [[_mm256_setzero_ps(); 4]; M];
        for b in 0..blocks {
            for h in 0..4 {
                // SAFETY: pairs 32b + 8h .. + 8 lie inside the row and each input row.
                unsafe {
                    let (w1, w0) = split(_mm256_loadu_si256(wp.add(64 * b + 16 * h).cast()));
                    for (a, p) in acc.iter_mut().zip(&xp) {
                        let (x1, x0) = split(_mm256_loadu_si256(p.add(32 * b + 8 * h).cast()));
                        a[h] = _mm256_fmadd_ps(x1, w1, a[h]);
                        a[h] = _mm256_fmadd_ps(x0, w0, a[h]);
                    }
                }
            }
        }
        for (l, a) in lanes.iter_mut().zip(&acc) {
            for (h, v) in a.iter().enumerate() {
                // SAFETY: a lane array holds 32 floats.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * h), *v) };
            }
        }
        mxcsr::write(saved);
    }
}

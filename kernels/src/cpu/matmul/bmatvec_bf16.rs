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
//!
//! The AVX2 emulation reads the input already split ([`Input`]): per 8 pairs, their odd columns
//! then their even ones as f32, so each FMA takes its input straight from memory and only the
//! weight is widened. It runs three input rows at a time over a weight row (12 accumulators;
//! all 8 rows at once held 32 and spilled, so 8 rows cost 8.6× one row) and folds the trees in
//! registers.

use half::bf16;

use super::bgemm_bf16::{daz, fma_ftz, round_input, Bf16Input};
use super::out::{OutPtr, DECODE_MAX_M};
use crate::cpu::isa::Isa;
use crate::cpu::tree_sum;

/// Lanes per input row (pairs of columns, so a block is 64 columns).
const LANES: usize = 32;
/// Lanes per AVX2 register: a group of pairs.
const GROUP: usize = 8;

/// The input rows of [`rows`]: rounded to bf16 pairs, and for the AVX2 kernel also split.
pub struct Input {
    pairs: Bf16Input,
    /// Per input row, its whole blocks of 64 columns as groups of 8 pairs: the group's 8 odd
    /// columns, then its 8 even ones, as f32 (empty where [`splits`] is false).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    split: Vec<f32>,
    /// Floats per input row in `split`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    split_len: usize,
}

/// Whether [`rows`] runs the AVX2 emulation on `isa` (and so wants the split input).
fn splits(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa.avx2 && !isa.bf16
}

impl Input {
    /// `m` rows of `k` from `xs`, laid out for `isa`.
    pub fn new(xs: &[f32], m: usize, k: usize, isa: Isa) -> Input {
        let pairs = round_input(xs, m, k, false);
        let split_len = if splits(isa) { k / 64 * 64 } else { 0 };
        let mut split = vec![0.0f32; m * split_len];
        if split_len > 0 {
            for (i, out) in split.chunks_exact_mut(split_len).enumerate() {
                let words = pairs.row(i);
                for (g, o) in out.chunks_exact_mut(2 * GROUP).enumerate() {
                    let (odd, even) = o.split_at_mut(GROUP);
                    for (l, &w) in words[g * GROUP..(g + 1) * GROUP].iter().enumerate() {
                        odd[l] = f32::from_bits(w & 0xFFFF_0000);
                        even[l] = f32::from_bits(w << 16);
                    }
                }
            }
        }
        Input {
            pairs,
            split,
            split_len,
        }
    }

    fn rows(&self) -> usize {
        self.pairs.rows()
    }

    fn row(&self, i: usize) -> &[u32] {
        self.pairs.row(i)
    }
}

/// Output columns `r0..r1` for the rows of `x` (`m ≤ DECODE_MAX_M` rows of `k`), `w` `[n, k]`.
///
/// # Safety
/// `isa` holds only features the CPU has; no other thread writes columns `r0..r1` of `dst`
/// (`[m, n]`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(
    x: &Input,
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
        return unsafe { by_rows!(m, rows_avx512bf16(&x.pairs, w, k, n, r0, r1, dst)) };
    }
    #[cfg(target_arch = "x86_64")]
    if splits(isa) {
        use x86::rows_avx2;
        // SAFETY: forwarded from the caller; `x` was split for this ISA.
        return unsafe { by_rows!(m, rows_avx2(x, w, k, n, r0, r1, dst)) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { by_rows!(m, rows_m(x, w, k, n, r0, r1, isa, dst)) }
}

/// [`rows`] for `M` input rows: the row count is dispatched once per call, not per weight row
/// (with `k` of about a thousand a weight row is only 16 blocks, so per-row set-up showed).
#[allow(clippy::too_many_arguments)]
unsafe fn rows_m<const M: usize>(
    x: &Input,
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
    x: &Input,
    row: &[bf16],
    blocks: usize,
    lanes: &mut [[f32; LANES]; M],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.bf16 {
            // SAFETY: forwarded from the caller.
            unsafe { x86::blocks_avx512bf16::<M>(&x.pairs, row, blocks, lanes) };
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
    use super::super::out::{tree16, tree8, trees16, trees8, OutPtr};
    use super::{Bf16Input, Input, GROUP, LANES};
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

    /// The same FMAs on AVX2, 8 lanes per register, under MXCSR's DAZ and FTZ: for each
    /// weight row, the input rows in groups of [`GROUP_ROWS`] ([`group`]), each group's lanes
    /// in registers, the weight widened once per group. Rows without tail columns fold their
    /// trees in registers ([`trees8`] from four input rows up, [`tree8`] below); the others
    /// finish their tail pairs in software and fold with `tree_sum`. The same sums in the same
    /// order, so the same bits.
    ///
    /// # Safety
    /// AVX2 and FMA are present; `x` was split (`M` rows of `k`) and `w` holds `n` rows of
    /// `k`; no other thread writes columns `r0..r1` of `dst` (`[M, n]`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_avx2<const M: usize>(
        x: &Input,
        w: &[bf16],
        k: usize,
        n: usize,
        r0: usize,
        r1: usize,
        dst: OutPtr,
    ) {
        let blocks = k / (2 * LANES);
        assert_eq!(
            x.split_len,
            64 * blocks,
            "the input was not split for this kernel"
        );
        let xp: [*const f32; M] = std::array::from_fn(|i| x.split[i * x.split_len..].as_ptr());
        let saved = mxcsr::read();
        // Lane group h of input row i, after every block of the current weight row (every
        // row overwrites all of it: set up once, not per row).
        let mut a = [[_mm256_setzero_ps(); 4]; M];
        for r in r0..r1 {
            let wp = w.as_ptr().add(r * k);
            mxcsr::write(saved | mxcsr::FTZ_DAZ);
            let mut i0 = 0;
            while i0 < M {
                // SAFETY (all three): forwarded; rows i0.. of `x` exist.
                match M - i0 {
                    1 => unsafe { group::<1, M>(&xp, i0, wp, blocks, &mut a) },
                    2 => unsafe { group::<2, M>(&xp, i0, wp, blocks, &mut a) },
                    _ => unsafe { group::<3, M>(&xp, i0, wp, blocks, &mut a) },
                }
                i0 += GROUP_ROWS.min(M - i0);
            }
            // The trees run in the caller's mode (FTZ would flush their subnormal sums).
            mxcsr::write(saved);
            let row = &w[r * k..(r + 1) * k];
            // SAFETY (all writes): (i, r) is inside the output and column r the caller's.
            if !k.is_multiple_of(2 * LANES) {
                for (i, a) in a.iter().enumerate() {
                    let mut lane = [0.0f32; LANES];
                    for (h, v) in a.iter().enumerate() {
                        // SAFETY: a lane array holds 32 floats.
                        unsafe { _mm256_storeu_ps(lane.as_mut_ptr().add(GROUP * h), *v) };
                    }
                    super::pairs_in_software(x.row(i), row, blocks * LANES, &mut lane);
                    unsafe { *dst.at(i * n + r) = crate::cpu::tree_sum(lane) };
                }
                continue;
            }
            // The tree's first two levels (lanes l and l + 16, then l and l + 8).
            let c: [__m256; M] = std::array::from_fn(|i| {
                let a = &a[i];
                _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]))
            });
            if M < 4 {
                for (i, c) in c.iter().enumerate() {
                    unsafe { *dst.at(i * n + r) = tree8(*c) };
                }
            } else {
                let mut eight = [_mm256_setzero_ps(); 8];
                eight[..M].copy_from_slice(&c);
                for (i, s) in trees8(&eight).iter().take(M).enumerate() {
                    unsafe { *dst.at(i * n + r) = *s };
                }
            }
        }
    }

    /// Input rows per pass over a weight row in [`rows_avx2`]: three rows hold 12 accumulators,
    /// leaving registers for the widened weight (four rows would spill).
    const GROUP_ROWS: usize = 3;

    /// Input rows `i0..i0 + G` of [`rows_avx2`] against one weight row at `wp`: all 32 lanes
    /// per row at once, block by block, so the row streams in order (the first group reads it
    /// from memory, the others from L1).
    ///
    /// # Safety
    /// AVX2 and FMA are present, MXCSR has DAZ and FTZ set; `xp[i0..i0 + G]` are split input
    /// rows and `wp` a weight row, each of `blocks` whole blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn group<const G: usize, const M: usize>(
        xp: &[*const f32; M],
        i0: usize,
        wp: *const bf16,
        blocks: usize,
        a: &mut [[__m256; 4]; M],
    ) {
        let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let xp: [*const f32; G] = std::array::from_fn(|i| xp[i0 + i]);
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for b in 0..blocks {
            for h in 0..4 {
                // SAFETY: pairs 32b + 8h .. + 8 lie inside the weight row and group 4b + h
                // inside every split input row.
                unsafe {
                    let v = _mm256_loadu_si256(wp.add(64 * b + 16 * h).cast());
                    let w1 = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
                    let w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                    let g = 2 * GROUP * (4 * b + h);
                    for (acc, p) in acc.iter_mut().zip(&xp) {
                        acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(g)), w1, acc[h]);
                        acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(g + GROUP)), w0, acc[h]);
                    }
                }
            }
        }
        a[i0..i0 + G].copy_from_slice(&acc);
    }
}

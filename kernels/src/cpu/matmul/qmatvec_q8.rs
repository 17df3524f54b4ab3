//! The `fast` numerics' decode product with 4-bit affine weights in groups of 64: activations
//! quantized to int8 per group, integer dot products against the 4-bit codes, one float
//! multiply per group (see `numerics`).
//!
//! Per weight row `r` and input row `i`, with `q` the codes, `s`/`b` the weight's group scale and
//! bias, `xq` the int8 activations and `sx` their group scale:
//! `out = Σ_g (Σ_j q·xq as i32) as f32 · (s_g · sx_g)  +  Σ_g b_g · Σ_j x_j`.
//!
//! Only the integer sums run in an ISA-dependent order, and integer sums are exact. The float
//! terms accumulate into 8 lanes per input row, lane `l` of each block of 8 groups taking
//! group [`PERM`]`[l]` (the order the VNNI reduction yields them in), and so do the bias terms,
//! in 8 lanes of their own; each set of lanes is summed in a fixed tree. Every ISA runs exactly
//! those float operations, so VNNI, AVX2, NEON (with or without dotprod) and portable code
//! agree bit for bit.
//!
//! Codes: byte `c` of a group's 32 packed bytes holds element `2c` (low nibble) and `2c + 1`
//! (high nibble), so the activations are stored split into even and odd elements, and a byte
//! vector's low and high nibbles meet them without any shuffle.

use super::out::{OutPtr, DECODE_MAX_M};
use crate::cpu::isa::Isa;
use crate::quant::decode::Affine4;

/// The group size this path handles (MLX's default for 4-bit).
pub const GROUP: usize = 64;
/// Lane `l` of a block of 8 groups accumulates group `PERM[l]` of the block.
const PERM: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// Bytes of codes per group.
const GB: usize = GROUP / 2;

/// Output columns `r0..r1` of a fast 4-bit decode product: for each weight row `r`,
/// `$sums(w, r, q)` gives its scale and bias lanes per input row, and the output is the sum of
/// their trees (in [`tree_sum`]'s order). A macro, not a function: the AVX2 and VNNI kernels
/// each expand it around their own `sums`, which then inlines into the row loop.
#[cfg(target_arch = "x86_64")]
macro_rules! write_rows {
    ($w:expr, ($r0:expr, $r1:expr), $q:expr, ($n:expr, $dst:expr), $sums:path) => {{
        use $crate::cpu::matmul::out::tree8 as tree;
        for r in $r0..$r1 {
            $crate::cpu::matmul::out::prefetch_affine(
                &$w,
                r,
                $q.groups * $crate::cpu::matmul::qmatvec_q8::GROUP,
            );
            let (acc, bacc) = $sums($w, r, $q);
            for (i, (a, b)) in acc.iter().zip(&bacc).enumerate() {
                // SAFETY: (i, r) is inside the output and column r is ours.
                *$dst.at(i * $n + r) = tree(*a) + tree(*b);
            }
        }
    }};
}

/// Input rows quantized for [`row_dot`].
pub struct Q8Input {
    m: usize,
    groups: usize,
    /// Even-indexed elements' codes, `[m, groups, 32]`.
    xe: Vec<i8>,
    /// Odd-indexed elements' codes, `[m, groups, 32]`.
    xo: Vec<i8>,
    /// Per group: the activation scale `max|x| / 127` (0 for an all-zero or non-finite group).
    sx: Vec<f32>,
    /// Per group: Σx in f32, in 16 lanes (element `c` into lane `c % 16`, in order) and then
    /// the fixed tree, so vector code computes it alike (carries NaN and inf through to the
    /// result).
    xsum: Vec<f32>,
    /// `sx` and `xsum` with each whole block of 8 groups in [`PERM`] order (for vector code).
    sxp: Vec<f32>,
    xsump: Vec<f32>,
}

impl Q8Input {
    pub fn m(&self) -> usize {
        self.m
    }

    /// Group `g` of input row `i`: its activation scale.
    #[inline(always)]
    pub fn sx(&self, i: usize, g: usize) -> f32 {
        self.sx[i * self.groups + g]
    }

    /// Group `g` of input row `i`: Σx.
    #[inline(always)]
    pub fn xsum(&self, i: usize, g: usize) -> f32 {
        self.xsum[i * self.groups + g]
    }

    /// Group `g` of input row `i`: the even and the odd elements' codes (32 each).
    #[inline(always)]
    pub fn codes(&self, i: usize, g: usize) -> (&[i8], &[i8]) {
        let at = (i * self.groups + g) * GB;
        (&self.xe[at..at + GB], &self.xo[at..at + GB])
    }
}

/// Quantizes `m` rows of `k` (a multiple of [`GROUP`]).
pub fn quantize(xs: &[f32], m: usize, k: usize) -> Q8Input {
    let groups = k / GROUP;
    let mut q = Q8Input {
        m,
        groups,
        xe: vec![0; m * groups * GB],
        xo: vec![0; m * groups * GB],
        sx: vec![0.0; m * groups],
        xsum: vec![0.0; m * groups],
        sxp: Vec::new(),
        xsump: Vec::new(),
    };
    let isa = Isa::current();
    for (gi, x) in xs[..m * k].chunks_exact(GROUP).enumerate() {
        let (xe, xo) = (&mut q.xe[gi * GB..][..GB], &mut q.xo[gi * GB..][..GB]);
        #[cfg(target_arch = "x86_64")]
        {
            if isa.avx512 {
                // SAFETY: AVX-512 is present; x is one group.
                (q.sx[gi], q.xsum[gi]) = unsafe { quantize_avx512::group(x, xe, xo) };
                continue;
            }
            if isa.avx2 {
                // The portable code compiled for AVX2: `round_ties_even` becomes `vroundps`
                // instead of a call to libm's `rintf` per element (7% of a fast 4-bit prefill
                // on AVX2). Same operations, so the same codes.
                #[target_feature(enable = "avx2")]
                fn wide(x: &[f32], xe: &mut [i8], xo: &mut [i8]) -> (f32, f32) {
                    quantize_group(x, xe, xo)
                }
                // SAFETY: AVX2 is present.
                (q.sx[gi], q.xsum[gi]) = unsafe { wide(x, xe, xo) };
                continue;
            }
        }
        let _ = isa;
        (q.sx[gi], q.xsum[gi]) = quantize_group(x, xe, xo);
    }
    let permuted = |v: &[f32]| {
        let mut p = v.to_vec();
        for i in 0..m {
            for blk in (0..groups / 8 * 8).step_by(8) {
                for (l, &g) in PERM.iter().enumerate() {
                    p[i * groups + blk + l] = v[i * groups + blk + g];
                }
            }
        }
        p
    };
    q.sxp = permuted(&q.sx);
    q.xsump = permuted(&q.xsum);
    q
}

/// Output columns `r0..r1` of the `[m, n]` product at `dst`, on the best path `isa` allows.
///
/// # Safety
/// `dst` holds `m × n` floats, `r1 ≤ n` rows of `w`, and no other thread writes these columns.
pub unsafe fn rows(
    w: &Affine4,
    r0: usize,
    r1: usize,
    q: &Q8Input,
    isa: Isa,
    n: usize,
    dst: OutPtr,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.vnni && q.groups.is_multiple_of(8) {
        // SAFETY: VNNI and AVX-512 are present; forwarded.
        return unsafe { vnni::rows(w, r0, r1, q, n, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 && q.groups.is_multiple_of(8) {
        // SAFETY: AVX2, FMA and F16C are present; forwarded.
        return unsafe { avx2::rows(w, r0, r1, q, n, dst) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa.neon {
        // SAFETY: NEON (and dotprod when asked) is present; forwarded.
        return unsafe {
            if isa.dotprod {
                arm::rows_dotprod(w, r0, r1, q, n, dst)
            } else {
                arm::rows_neon(w, r0, r1, q, n, dst)
            }
        };
    }
    // SAFETY: forwarded.
    unsafe {
        each_row(r0, r1, q.m, n, dst, |r, out| {
            super::out::prefetch_affine(w, r, q.groups * GROUP);
            row_dot(w, r, q, isa, out)
        })
    }
}

/// Output columns `r0..r1` of the `[m, n]` product at `dst`, column `r` from `row(r, out)`.
///
/// # Safety
/// As [`rows`].
#[inline(always)]
unsafe fn each_row(
    r0: usize,
    r1: usize,
    m: usize,
    n: usize,
    dst: OutPtr,
    mut row: impl FnMut(usize, &mut [f32; DECODE_MAX_M]),
) {
    let mut out = [0.0f32; DECODE_MAX_M];
    for r in r0..r1 {
        row(r, &mut out);
        for (i, &v) in out[..m].iter().enumerate() {
            // SAFETY: (i, r) is inside the output and column r is ours.
            unsafe { *dst.at(i * n + r) = v };
        }
    }
}

/// One group's codes (even and odd elements), its scale and its Σx.
#[inline(always)]
fn quantize_group(x: &[f32], xe: &mut [i8], xo: &mut [i8]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let mut lanes = [0.0f32; 16];
    for (c, &v) in x.iter().enumerate() {
        lanes[c % 16] += v;
    }
    let xsum = crate::cpu::tree_sum(lanes);
    if !(amax > 0.0 && amax.is_finite()) {
        xe.fill(0);
        xo.fill(0);
        return (0.0, xsum);
    }
    let inv = 127.0 / amax;
    // NaN codes as 0 (its group's Σx is NaN, which the result keeps).
    let code = |v: f32| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
    for c in 0..GB {
        xe[c] = code(x[2 * c]);
        xo[c] = code(x[2 * c + 1]);
    }
    (amax / 127.0, xsum)
}

#[cfg(target_arch = "x86_64")]
mod quantize_avx512 {
    //! [`super::quantize_group`] in registers, with the same results: max is exact, Σx runs in
    //! the same 16 lanes and tree, and `vcvtps2dq` rounds half to even like `round_ties_even`.
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn group(x: &[f32], xe: &mut [i8], xo: &mut [i8]) -> (f32, f32) {
        debug_assert!(x.len() == 64 && xe.len() == 32 && xo.len() == 32);
        // SAFETY: x holds 64 floats.
        let v: [__m512; 4] =
            std::array::from_fn(|j| unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * j)) });
        let abs = |a: __m512| _mm512_abs_ps(a);
        // The running max second, so a NaN element is skipped as `f32::max` skips it.
        let mx = _mm512_max_ps(
            abs(v[3]),
            _mm512_max_ps(
                abs(v[2]),
                _mm512_max_ps(abs(v[1]), _mm512_max_ps(abs(v[0]), _mm512_setzero_ps())),
            ),
        );
        let amax = _mm512_reduce_max_ps(mx);
        let s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[1]), v[2]), v[3]);
        let h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
        let h = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let xsum = _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
        if !(amax > 0.0 && amax.is_finite()) {
            xe.fill(0);
            xo.fill(0);
            return (0.0, xsum);
        }
        let inv = _mm512_set1_ps(127.0 / amax);
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        let lim = _mm512_set1_epi32(127);
        let code = |a: __m512| {
            let p = _mm512_mul_ps(a, inv);
            let c = _mm512_cvtps_epi32(p);
            let c = _mm512_max_epi32(
                _mm512_min_epi32(c, lim),
                _mm512_sub_epi32(_mm512_setzero_si512(), lim),
            );
            // NaN products code as 0, as in the portable path.
            let c = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), c);
            _mm512_cvtepi32_epi8(c)
        };
        for (half, idx) in [(0, even), (1, odd)] {
            let lo = code(_mm512_permutex2var_ps(v[0], idx, v[1]));
            let hi = code(_mm512_permutex2var_ps(v[2], idx, v[3]));
            let out = if half == 0 { &mut *xe } else { &mut *xo };
            // SAFETY: out holds 32 bytes.
            unsafe {
                _mm_storeu_si128(out.as_mut_ptr().cast(), lo);
                _mm_storeu_si128(out.as_mut_ptr().add(16).cast(), hi);
            }
        }
        (amax / 127.0, xsum)
    }
}

/// `out[i] = x_i · w_r` for every input row of `q`.
fn row_dot(w: &Affine4, r: usize, q: &Q8Input, isa: Isa, out: &mut [f32; DECODE_MAX_M]) {
    debug_assert_eq!(w.group, GROUP);
    // Filled by the vector blocks, which exist on x86-64 only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let (mut lanes, mut biases) = ([[0.0f32; 8]; DECODE_MAX_M], [[0.0f32; 8]; DECODE_MAX_M]);
    // Groups the vector code covered (whole blocks of 8); the scalar step finishes the rest.
    #[cfg(target_arch = "x86_64")]
    let done = if isa.vnni {
        // SAFETY: VNNI (and AVX-512) are present; r is a row of w and q has w's columns.
        unsafe { vnni::blocks(w, r, q, &mut lanes, &mut biases) };
        q.groups / 8 * 8
    } else if isa.avx2 {
        // SAFETY: AVX2 is present.
        unsafe { avx2::blocks(w, r, q, &mut lanes, &mut biases) };
        q.groups / 8 * 8
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = isa;
        0
    };
    finish_row(
        w,
        r,
        q,
        done,
        lanes,
        biases,
        |i, g| group_isum(w, r, q, i, g),
        out,
    )
}

/// `out[i]` for weight row `r` and every input row: the float steps of groups `from..` added
/// to `lanes` and `biases` (which hold the groups before `from`), in the lane order every ISA
/// shares (block by block of 8, lane `l` taking group [`PERM`]`[l]`), then both trees.
/// `isum(i, g)` is the integer sum of group `g` for input row `i`, however the caller
/// computes it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn finish_row(
    w: &Affine4,
    r: usize,
    q: &Q8Input,
    from: usize,
    mut lanes: [[f32; 8]; DECODE_MAX_M],
    mut biases: [[f32; 8]; DECODE_MAX_M],
    isum: impl Fn(usize, usize) -> i32,
    out: &mut [f32; DECODE_MAX_M],
) {
    let g0 = r * q.groups;
    for (i, (lane, bias)) in lanes[..q.m].iter_mut().zip(&mut biases).enumerate() {
        let mut blk = from;
        while blk < q.groups {
            for (l, &p) in PERM.iter().enumerate() {
                let g = blk + p;
                if g < q.groups {
                    let x = i * q.groups + g;
                    add_term(lane, bias, l, isum(i, g), w, g0 + g, q.sx[x], q.xsum[x]);
                }
            }
            blk += 8;
        }
        out[i] = crate::cpu::tree_sum(*lane) + crate::cpu::tree_sum(*bias);
    }
}

/// The float step of one group, shared by every ISA: `lane[l] += isum · (s · sx)` and
/// `bias[l] += b · Σx`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn add_term(
    lane: &mut [f32; 8],
    bias: &mut [f32; 8],
    l: usize,
    isum: i32,
    w: &Affine4,
    sg: usize,
    sx: f32,
    xsum: f32,
) {
    lane[l] += isum as f32 * (w.scales.get(sg) * sx);
    bias[l] += w.biases.get(sg) * xsum;
}

/// Σ q·xq over group `g` of weight row `r` and input row `i`, in plain integer arithmetic.
fn group_isum(w: &Affine4, r: usize, q: &Q8Input, i: usize, g: usize) -> i32 {
    let words = &w.packed[(r * q.groups + g) * (GB / 4)..][..GB / 4];
    let base = (i * q.groups + g) * GB;
    let (xe, xo) = (&q.xe[base..base + GB], &q.xo[base..base + GB]);
    let mut s = 0i32;
    for c in 0..GB {
        let byte = (words[c / 4] >> (8 * (c % 4))) & 0xFF;
        s += (byte & 0xF) as i32 * xe[c] as i32 + (byte >> 4) as i32 * xo[c] as i32;
    }
    s
}

#[cfg(target_arch = "aarch64")]
mod arm {
    //! Group sums with NEON (`sdot` where the CPU has dotprod, else widening multiplies), the
    //! float step in scalar code shared with the portable path ([`super::finish_row`]), so
    //! the bits are the portable path's.
    use std::arch::aarch64::*;

    use super::super::arm_dot::dot4;
    use super::{Affine4, OutPtr, Q8Input, DECODE_MAX_M, GB};

    /// # Safety
    /// The CPU has dotprod; `dst` as in [`super::rows`].
    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn rows_dotprod(
        w: &Affine4,
        r0: usize,
        r1: usize,
        q: &Q8Input,
        n: usize,
        dst: OutPtr,
    ) {
        // SAFETY: forwarded.
        unsafe { rows_with::<true>(w, r0, r1, q, n, dst) }
    }

    /// # Safety
    /// `dst` as in [`super::rows`].
    #[target_feature(enable = "neon")]
    pub unsafe fn rows_neon(w: &Affine4, r0: usize, r1: usize, q: &Q8Input, n: usize, dst: OutPtr) {
        // SAFETY: forwarded.
        unsafe { rows_with::<false>(w, r0, r1, q, n, dst) }
    }

    #[inline(always)]
    unsafe fn rows_with<const DOT: bool>(
        w: &Affine4,
        r0: usize,
        r1: usize,
        q: &Q8Input,
        n: usize,
        dst: OutPtr,
    ) {
        let zero = [[0.0f32; 8]; DECODE_MAX_M];
        // SAFETY: forwarded; dotprod is present when DOT (the callers' contract).
        unsafe {
            super::each_row(r0, r1, q.m, n, dst, |r, out| {
                let isum = |i, g| group_isum::<DOT>(w, r, q, i, g);
                super::finish_row(w, r, q, 0, zero, zero, isum, out)
            })
        }
    }

    /// Σ q·xq over group `g` of weight row `r` and input row `i`: the 32 code bytes' low
    /// nibbles against the even activations, high nibbles against the odd.
    ///
    /// # Safety
    /// dotprod is present when `DOT`.
    #[inline(always)]
    unsafe fn group_isum<const DOT: bool>(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
        i: usize,
        g: usize,
    ) -> i32 {
        let codes = &w.packed[(r * q.groups + g) * (GB / 4)..][..GB / 4];
        let (xe, xo) = q.codes(i, g);
        // SAFETY: `codes` holds 32 bytes, `xe` and `xo` 32 each; dotprod as forwarded.
        unsafe {
            let low = vdupq_n_u8(0x0F);
            let mut acc = vdupq_n_s32(0);
            for h in 0..2 {
                let wv = vld1q_u8(codes.as_ptr().cast::<u8>().add(16 * h));
                let lo = vreinterpretq_s8_u8(vandq_u8(wv, low));
                let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(wv));
                acc = dot4::<DOT>(acc, lo, vld1q_s8(xe.as_ptr().add(16 * h)));
                acc = dot4::<DOT>(acc, hi, vld1q_s8(xo.as_ptr().add(16 * h)));
            }
            vaddvq_s32(acc)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! Group sums with `vpmaddubsw` (u8 × i8 pairs into i16: at most 2·15·127, no saturation)
    //! and `vpmaddwd`, eight groups reduced into one vector, then the float step in vectors.
    use std::arch::x86_64::*;

    use super::{Affine4, OutPtr, Q8Input, DECODE_MAX_M, GB, PERM};
    use crate::quant::decode::Floats;

    /// [`row_dot`](super::row_dot)'s whole blocks of row `r`: the lanes [`sums`] leaves, per
    /// input row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn blocks(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
        lanes: &mut [[f32; 8]; DECODE_MAX_M],
        biases: &mut [[f32; 8]; DECODE_MAX_M],
    ) {
        // SAFETY: forwarded.
        unsafe { by_rows!(q.m, blocks_m(w, r, q, lanes, biases)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn blocks_m<const M: usize>(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
        lanes: &mut [[f32; 8]; DECODE_MAX_M],
        biases: &mut [[f32; 8]; DECODE_MAX_M],
    ) {
        // SAFETY: forwarded.
        store_lanes(unsafe { sums::<M>(w, r, q) }, lanes, biases)
    }

    /// Each input row's scale and bias lanes into `lanes` and `biases` (shared with VNNI's
    /// `blocks`).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn store_lanes<const M: usize>(
        (acc, bacc): ([__m256; M], [__m256; M]),
        lanes: &mut [[f32; 8]; DECODE_MAX_M],
        biases: &mut [[f32; 8]; DECODE_MAX_M],
    ) {
        for i in 0..M {
            // SAFETY: a lane array is 8 floats.
            unsafe {
                _mm256_storeu_ps(lanes[i].as_mut_ptr(), acc[i]);
                _mm256_storeu_ps(biases[i].as_mut_ptr(), bacc[i]);
            }
        }
    }

    /// Whole rows (groups a multiple of 8) with the float step in vectors, as the VNNI kernel
    /// runs it: eight group sums reduced into one vector in [`PERM`] order, then the same
    /// conversions, products and lane sums, so the bits match VNNI's and the scalar step's.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows(w: &Affine4, r0: usize, r1: usize, q: &Q8Input, n: usize, dst: OutPtr) {
        // SAFETY: forwarded.
        unsafe { by_rows!(q.m, rows_m(w, r0, r1, q, n, dst)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_m<const M: usize>(
        w: &Affine4,
        r0: usize,
        r1: usize,
        q: &Q8Input,
        n: usize,
        dst: OutPtr,
    ) {
        // SAFETY: forwarded; the row's groups are whole blocks.
        unsafe { write_rows!(w, (r0, r1), q, (n, dst), sums::<M>) }
    }

    /// Eight consecutive scales or biases from `at`, widened, in [`PERM`] order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load8(f: &Floats, at: usize) -> __m256 {
        let perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        // SAFETY: the caller keeps at + 8 within the row's groups.
        let v = unsafe {
            match f {
                Floats::F32(s) => _mm256_loadu_ps(s.as_ptr().add(at)),
                Floats::BF16(s) => {
                    let h = _mm_loadu_si128(s.as_ptr().add(at).cast());
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                }
                Floats::F16(s) => _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().add(at).cast())),
            }
        };
        _mm256_permutevar8x32_ps(v, perm)
    }

    /// The scale and bias lanes of row `r` over its whole blocks, per input row.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row and lane
    unsafe fn sums<const M: usize>(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
    ) -> ([__m256; M], [__m256; M]) {
        let nib = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let groups = q.groups;
        let g0 = r * groups;
        let mut acc = [_mm256_setzero_ps(); M];
        let mut bacc = [_mm256_setzero_ps(); M];
        for blk in (0..groups / 8 * 8).step_by(8) {
            // Lane l of the block's result holds group PERM[l]: v[l] is that group's 8 partial
            // sums.
            let mut v = [[_mm256_setzero_si256(); 8]; M];
            for (l, &p) in PERM.iter().enumerate() {
                let g = blk + p;
                // SAFETY: group g of row r lies inside `packed` (8 words per group).
                let wv = unsafe {
                    _mm256_loadu_si256(w.packed.as_ptr().add((g0 + g) * (GB / 4)).cast())
                };
                let lo = _mm256_and_si256(wv, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nib);
                for i in 0..M {
                    let base = (i * groups + g) * GB;
                    // SAFETY: base + 32 ≤ xe.len() = xo.len().
                    let (xe, xo) = unsafe {
                        (
                            _mm256_loadu_si256(q.xe.as_ptr().add(base).cast()),
                            _mm256_loadu_si256(q.xo.as_ptr().add(base).cast()),
                        )
                    };
                    let p16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, xe),
                        _mm256_maddubs_epi16(hi, xo),
                    );
                    v[i][l] = _mm256_madd_epi16(p16, ones);
                }
            }
            let isums = std::array::from_fn(|i| reduce8(v[i]));
            // SAFETY: blk + 8 ≤ groups.
            unsafe { float_step::<M>(w, q, g0, blk, isums, (&mut acc, &mut bacc)) };
        }
        (acc, bacc)
    }

    /// The float step of one block of 8 groups, `isums[i]` holding input row `i`'s 8 group
    /// sums in [`PERM`] order: `acc += isum · (s · sx)`, `bacc += b · Σx` in vectors, the same
    /// operations as the scalar [`super::add_term`] (shared by this kernel and VNNI's).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; `blk + 8 ≤ q.groups` and `g0` is the row's first group.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn float_step<const M: usize>(
        w: &Affine4,
        q: &Q8Input,
        g0: usize,
        blk: usize,
        isums: [__m256i; M],
        (acc, bacc): (&mut [__m256; M], &mut [__m256; M]),
    ) {
        // SAFETY: blk + 8 ≤ groups, so every load below stays inside its row.
        let (sw, bw) = unsafe { (load8(&w.scales, g0 + blk), load8(&w.biases, g0 + blk)) };
        for (i, isum) in isums.into_iter().enumerate() {
            let at = i * q.groups + blk;
            // SAFETY: at + 8 ≤ the permuted arrays' length.
            let (sx, xs) = unsafe {
                (
                    _mm256_loadu_ps(q.sxp.as_ptr().add(at)),
                    _mm256_loadu_ps(q.xsump.as_ptr().add(at)),
                )
            };
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(sw, sx));
            acc[i] = _mm256_add_ps(acc[i], t);
            bacc[i] = _mm256_add_ps(bacc[i], _mm256_mul_ps(bw, xs));
        }
    }

    /// Eight vectors of 8 partial sums → their 8 totals, vector `l`'s in lane `l` (integer
    /// sums: exact in any order).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn reduce8(v: [__m256i; 8]) -> __m256i {
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256(a, b, 0x20),
            _mm256_permute2x128_si256(a, b, 0x31),
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    //! Two groups per 512-bit load: `vpdpbusd` of the low and high nibbles against the even and
    //! odd activations leaves 8 partial sums per group; four such vectors (8 groups) reduce to
    //! one vector of 8 group sums in [`PERM`] order, which is converted, scaled and added to the
    //! lanes with the same two roundings the scalar step makes.
    use std::arch::x86_64::*;

    use super::avx2::{float_step, store_lanes};
    use super::{Affine4, OutPtr, Q8Input, DECODE_MAX_M, GB};

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn blocks(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
        lanes: &mut [[f32; 8]; DECODE_MAX_M],
        biases: &mut [[f32; 8]; DECODE_MAX_M],
    ) {
        // SAFETY: forwarded.
        unsafe { by_rows!(q.m, blocks_m(w, r, q, lanes, biases)) }
    }

    /// Whole rows (groups a multiple of 8), the lanes' trees summed in registers in the same
    /// order as `tree_sum`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn rows(w: &Affine4, r0: usize, r1: usize, q: &Q8Input, n: usize, dst: OutPtr) {
        // SAFETY: forwarded.
        unsafe { by_rows!(q.m, rows_m(w, r0, r1, q, n, dst)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    unsafe fn rows_m<const M: usize>(
        w: &Affine4,
        r0: usize,
        r1: usize,
        q: &Q8Input,
        n: usize,
        dst: OutPtr,
    ) {
        // SAFETY: forwarded; the row's groups are whole blocks.
        unsafe { write_rows!(w, (r0, r1), q, (n, dst), sums::<M>) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    unsafe fn blocks_m<const M: usize>(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
        lanes: &mut [[f32; 8]; DECODE_MAX_M],
        biases: &mut [[f32; 8]; DECODE_MAX_M],
    ) {
        // SAFETY: forwarded.
        store_lanes(unsafe { sums::<M>(w, r, q) }, lanes, biases)
    }

    /// The scale and bias lanes of row `r` over its whole blocks, per input row.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row and pair
    unsafe fn sums<const M: usize>(
        w: &Affine4,
        r: usize,
        q: &Q8Input,
    ) -> ([__m256; M], [__m256; M]) {
        let nib = _mm512_set1_epi8(0x0F);
        let groups = q.groups;
        let g0 = r * groups;
        let mut acc = [_mm256_setzero_ps(); M];
        let mut bacc = [_mm256_setzero_ps(); M];
        for blk in (0..groups / 8 * 8).step_by(8) {
            let mut z = [[_mm512_setzero_si512(); 4]; M];
            for p in 0..4 {
                let g = blk + 2 * p;
                // SAFETY: groups g, g + 1 of row r lie inside `packed`; base + 64 ≤ xe.len().
                let wv = unsafe {
                    _mm512_loadu_si512(w.packed.as_ptr().add((g0 + g) * (GB / 4)).cast())
                };
                let lo = _mm512_and_si512(wv, nib);
                let hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
                for i in 0..M {
                    let base = (i * groups + g) * GB;
                    let (xe, xo) = unsafe {
                        (
                            _mm512_loadu_si512(q.xe.as_ptr().add(base).cast()),
                            _mm512_loadu_si512(q.xo.as_ptr().add(base).cast()),
                        )
                    };
                    z[i][p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z[i][p], lo, xe), hi, xo);
                }
            }
            let isums = std::array::from_fn(|i| reduce(z[i]));
            // SAFETY: blk + 8 ≤ groups.
            unsafe { float_step::<M>(w, q, g0, blk, isums, (&mut acc, &mut bacc)) };
        }
        (acc, bacc)
    }

    /// Four vectors of (8 sums of group 2p, 8 sums of group 2p + 1) → the 8 group totals, in
    /// the order groups 0, 2, 4, 6, 1, 3, 5, 7.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    fn reduce(z: [__m512i; 4]) -> __m256i {
        let t01 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(z[0], z[1]),
            _mm512_unpackhi_epi32(z[0], z[1]),
        );
        let t23 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(z[2], z[3]),
            _mm512_unpackhi_epi32(z[2], z[3]),
        );
        // Per 128-bit chunk c: [Σz0, Σz1, Σz2, Σz3] over that chunk's four lanes.
        let u = _mm512_add_epi32(
            _mm512_unpacklo_epi64(t01, t23),
            _mm512_unpackhi_epi64(t01, t23),
        );
        // Chunks 0+1 hold the even groups' halves, 2+3 the odd groups'.
        let a = _mm512_shuffle_i32x4(u, u, 0b10_00_10_00);
        let b = _mm512_shuffle_i32x4(u, u, 0b11_01_11_01);
        _mm512_castsi512_si256(_mm512_add_epi32(a, b))
    }
}

//! The `fast` numerics' prefill product with 4-bit affine weights in groups of 64: activations
//! quantized to int8 per group (the same codes as the decode path, `qmatvec_q8::quantize`),
//! integer dot products against the codes, one float multiply per group and output.
//!
//! Per output `(i, j)`: `A = Σ_g (Σ q·xq as i32) as f32 · (s_jg · sx_ig)` and
//! `B = Σ_g b_jg · Σx_ig`, each summed group after group, and `out = A + B`. The integer sums
//! are exact in any order; every ISA then runs those float operations in that order, so VNNI,
//! AVX2, NEON (with or without dotprod) and portable code give the same bits. (Decode-shaped
//! calls sum the groups in 8 lanes instead, so a row may differ in the last bits between the
//! two, as on the exact path.)
//!
//! Weights are repacked per tile of [`NR`] rows so that one vector holds the same four codes
//! of 16 (AVX-512) or 8 (AVX2) rows: a packed word's low nibbles are the group's elements
//! `8t + {0, 2, 4, 6}` and its high nibbles `8t + {1, 3, 5, 7}`, exactly the four bytes
//! `quantize` stores at word `t` of the even and the odd activations. So a tile is a transpose
//! of words split into nibbles, and each activation word is broadcast against it.

use super::qmatvec_q8::{Q8Input, GROUP};
use crate::cpu::isa::Isa;
use crate::quant::decode::Affine4;

/// Weight rows per tile (two AVX-512 or four AVX2 vectors of rows).
pub const NR: usize = 32;
/// Packed words per group (8 codes each).
const WORDS: usize = GROUP / 8;

/// One tile of weight rows, repacked: codes `[group][word][half][row][4]` as bytes (low nibbles
/// in half 0, high in half 1), scales and biases `[group][row]` as f32. Rows past the weight's
/// end are zero.
#[derive(Default)]
pub struct Tile {
    codes: Vec<u8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
    groups: usize,
}

impl Tile {
    /// Repacks rows `r0..r0 + rows` (`rows ≤ NR`) of `w`, which has `groups` groups per row.
    pub fn pack(&mut self, w: &Affine4, r0: usize, rows: usize, groups: usize) {
        self.groups = groups;
        self.codes.clear();
        self.codes.resize(groups * WORDS * 2 * NR * 4, 0);
        self.scales.clear();
        self.scales.resize(groups * NR, 0.0);
        self.biases.clear();
        self.biases.resize(groups * NR, 0.0);
        for r in 0..rows {
            let row = r0 + r;
            for g in 0..groups {
                let gi = row * groups + g;
                self.scales[g * NR + r] = w.scales.get(gi);
                self.biases[g * NR + r] = w.biases.get(gi);
                for t in 0..WORDS {
                    let word = w.packed[gi * WORDS + t];
                    let lo = (word & 0x0F0F_0F0F).to_le_bytes();
                    let hi = ((word >> 4) & 0x0F0F_0F0F).to_le_bytes();
                    let at = |half: usize| (((g * WORDS + t) * 2 + half) * NR + r) * 4;
                    self.codes[at(0)..at(0) + 4].copy_from_slice(&lo);
                    self.codes[at(1)..at(1) + 4].copy_from_slice(&hi);
                }
            }
        }
    }
}

/// `out[i, c] = x_i · w_{r0 + c}` for the tile's rows `c < cols` and every input row of `q`;
/// `out` is `[q.m, ldo]` from column `r0` on (the caller's offset already applied).
///
/// # Safety
/// `out` points at `q.m` rows of `ldo` floats, of which columns `0..cols` are this call's alone.
pub unsafe fn tile_product(
    t: &Tile,
    q: &Q8Input,
    isa: Isa,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let m = q.m();
    let mut a = [0.0f32; NR];
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.vnni {
        while i + vnni::MR <= m {
            // SAFETY: VNNI is present; rows i..i + MR exist; forwarded.
            unsafe { vnni::rows(t, q, i, cols, out, ldo) };
            i += vnni::MR;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 {
        while i < m {
            // SAFETY: AVX2 is present; forwarded.
            unsafe {
                avx2::row(t, q, i, &mut a);
                finish(t, q, i, &a, cols, out, ldo);
            }
            i += 1;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa.i8mm {
        let mut a2 = [[0.0f32; NR]; 2];
        while i + 2 <= m {
            // SAFETY: i8mm is present; rows i, i + 1 exist; forwarded.
            unsafe {
                arm::rows_i8mm(t, q, i, &mut a2);
                finish(t, q, i, &a2[0], cols, out, ldo);
                finish(t, q, i + 1, &a2[1], cols, out, ldo);
            }
            i += 2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa.neon {
        while i < m {
            // SAFETY: NEON (and dotprod when asked) is present; forwarded.
            unsafe {
                if isa.dotprod {
                    arm::row_dotprod(t, q, i, &mut a);
                } else {
                    arm::row_neon(t, q, i, &mut a);
                }
                finish(t, q, i, &a, cols, out, ldo);
            }
            i += 1;
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = isa;
    while i < m {
        a.fill(0.0);
        for g in 0..t.groups {
            for (r, ar) in a.iter_mut().enumerate() {
                let isum = group_isum(t, q, i, g, r);
                *ar += isum as f32 * (t.scales[g * NR + r] * q.sx(i, g));
            }
        }
        // SAFETY: forwarded.
        unsafe { finish(t, q, i, &a, cols, out, ldo) };
        i += 1;
    }
}

/// `out = A + B` for input row `i`, with `B` summed group after group.
///
/// # Safety
/// As [`tile_product`].
#[inline]
unsafe fn finish(
    t: &Tile,
    q: &Q8Input,
    i: usize,
    a: &[f32; NR],
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut b = [0.0f32; NR];
    for g in 0..t.groups {
        let xs = q.xsum(i, g);
        for (br, &bw) in b.iter_mut().zip(&t.biases[g * NR..(g + 1) * NR]) {
            *br += bw * xs;
        }
    }
    for c in 0..cols {
        // SAFETY: (i, c) is inside this call's part of the output.
        unsafe { *out.add(i * ldo + c) = a[c] + b[c] };
    }
}

/// Σ q·xq of tile row `r`, group `g`, input row `i`, in plain integer arithmetic.
fn group_isum(t: &Tile, q: &Q8Input, i: usize, g: usize, r: usize) -> i32 {
    let (xe, xo) = q.codes(i, g);
    let mut s = 0i32;
    for w in 0..WORDS {
        for half in 0..2 {
            let at = (((g * WORDS + w) * 2 + half) * NR + r) * 4;
            let x = if half == 0 { xe } else { xo };
            for b in 0..4 {
                s += t.codes[at + b] as i32 * x[4 * w + b] as i32;
            }
        }
    }
    s
}

/// Whether `w` takes this path: 4-bit affine in groups of [`GROUP`].
pub fn applies(w: &Affine4) -> bool {
    w.group == GROUP
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! One input row at a time: `vpmaddubsw` + `vpmaddwd` (exact: pairs of 15·127 fit i16)
    //! for the integer sums of 8 rows per register, then the float step in the shared order.
    use std::arch::x86_64::*;

    use super::{Q8Input, Tile, NR, WORDS};

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row(t: &Tile, q: &Q8Input, i: usize, a: &mut [f32; NR]) {
        let ones = _mm256_set1_epi16(1);
        let mut fa = [_mm256_setzero_ps(); 4];
        for g in 0..t.groups {
            let (xe, xo) = q.codes(i, g);
            let mut acc = [_mm256_setzero_si256(); 4];
            for w in 0..WORDS {
                // SAFETY: word w of each half holds 4 bytes.
                let (be, bo) = unsafe {
                    (
                        _mm256_set1_epi32(xe.as_ptr().add(4 * w).cast::<i32>().read_unaligned()),
                        _mm256_set1_epi32(xo.as_ptr().add(4 * w).cast::<i32>().read_unaligned()),
                    )
                };
                for (half, b) in [(0, be), (1, bo)] {
                    let at = ((g * WORDS + w) * 2 + half) * NR * 4;
                    for (h, a) in acc.iter_mut().enumerate() {
                        // SAFETY: 8 rows × 4 bytes from `at + 32h` lie inside the tile.
                        let wv =
                            unsafe { _mm256_loadu_si256(t.codes.as_ptr().add(at + 32 * h).cast()) };
                        *a = _mm256_add_epi32(
                            *a,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wv, b), ones),
                        );
                    }
                }
            }
            let sx = _mm256_set1_ps(q.sx(i, g));
            for (h, f) in fa.iter_mut().enumerate() {
                // SAFETY: 8 scales from g·NR + 8h.
                let sw = unsafe { _mm256_loadu_ps(t.scales.as_ptr().add(g * NR + 8 * h)) };
                *f = _mm256_add_ps(
                    *f,
                    _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_mul_ps(sw, sx)),
                );
            }
        }
        for (h, f) in fa.iter().enumerate() {
            // SAFETY: `a` holds NR = 32 floats.
            unsafe { _mm256_storeu_ps(a.as_mut_ptr().add(8 * h), *f) };
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    //! One input row at a time, the tile's 32 rows in 8 vectors of 4: per activation word
    //! (broadcast), `sdot` where the CPU has dotprod, else widening multiplies; then the float
    //! step in vectors, in the portable order (`isum as f32 · (s · sx)`, then the add).
    //!
    //! With i8mm, two input rows at a time: `smmla` multiplies two 8-byte rows of activations
    //! (a word of even and a word of odd codes each) by two of weights, so one instruction does
    //! a 2 × 2 block 8 deep where `sdot` does 4 outputs 4 deep. A weight row's 8 bytes are its
    //! low-nibble word and its high-nibble word, which the tile stores 4 rows apart in
    //! consecutive halves; one `zip` of 32-bit lanes pairs them, so the tile needs no other
    //! packing.
    use std::arch::aarch64::*;

    use super::super::arm_dot::{dot4, smmla};
    use super::{Q8Input, Tile, NR, WORDS};

    /// Input rows `i` and `i + 1` against the tile: `a[k][r]` as [`row`] gives it for row
    /// `i + k`, the same bits (integer sums are exact; the float step is the same).
    ///
    /// # Safety
    /// The CPU has i8mm; `q` has rows `i` and `i + 1`.
    #[target_feature(enable = "neon,i8mm")]
    pub unsafe fn rows_i8mm(t: &Tile, q: &Q8Input, i: usize, a: &mut [[f32; NR]; 2]) {
        // SAFETY (whole body): as in `row`, for both input rows; i8mm as forwarded.
        unsafe {
            let mut fa = [[vdupq_n_f32(0.0); NR / 4]; 2];
            for g in 0..t.groups {
                let ((xe0, xo0), (xe1, xo1)) = (q.codes(i, g), q.codes(i + 1, g));
                // Pair p holds [(i, 2p), (i, 2p + 1), (i + 1, 2p), (i + 1, 2p + 1)].
                let mut acc = [vdupq_n_s32(0); NR / 2];
                for w in 0..WORDS {
                    let word = |x: &[i8]| x.as_ptr().add(4 * w).cast::<u32>().read_unaligned();
                    let xs = [word(xe0), word(xo0), word(xe1), word(xo1)];
                    let xv = vreinterpretq_s8_u32(vld1q_u32(xs.as_ptr()));
                    let lo = (g * WORDS + w) * 2 * NR * 4;
                    let hi = lo + NR * 4;
                    for h in 0..NR / 4 {
                        let l = vld1q_u32(t.codes.as_ptr().add(lo + 16 * h).cast());
                        let u = vld1q_u32(t.codes.as_ptr().add(hi + 16 * h).cast());
                        let rows01 = vreinterpretq_s8_u32(vzip1q_u32(l, u));
                        let rows23 = vreinterpretq_s8_u32(vzip2q_u32(l, u));
                        acc[2 * h] = smmla(acc[2 * h], xv, rows01);
                        acc[2 * h + 1] = smmla(acc[2 * h + 1], xv, rows23);
                    }
                }
                let sx = [vdupq_n_f32(q.sx(i, g)), vdupq_n_f32(q.sx(i + 1, g))];
                for h in 0..NR / 4 {
                    let (p, r) = (
                        vreinterpretq_s64_s32(acc[2 * h]),
                        vreinterpretq_s64_s32(acc[2 * h + 1]),
                    );
                    let isums = [vzip1q_s64(p, r), vzip2q_s64(p, r)];
                    let sw = vld1q_f32(t.scales.as_ptr().add(g * NR + 4 * h));
                    for k in 0..2 {
                        let isum = vcvtq_f32_s32(vreinterpretq_s32_s64(isums[k]));
                        fa[k][h] = vaddq_f32(fa[k][h], vmulq_f32(isum, vmulq_f32(sw, sx[k])));
                    }
                }
            }
            for (ak, fk) in a.iter_mut().zip(&fa) {
                for (h, f) in fk.iter().enumerate() {
                    vst1q_f32(ak.as_mut_ptr().add(4 * h), *f);
                }
            }
        }
    }

    /// # Safety
    /// The CPU has dotprod.
    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn row_dotprod(t: &Tile, q: &Q8Input, i: usize, a: &mut [f32; NR]) {
        // SAFETY: forwarded.
        unsafe { row::<true>(t, q, i, a) }
    }

    #[target_feature(enable = "neon")]
    pub fn row_neon(t: &Tile, q: &Q8Input, i: usize, a: &mut [f32; NR]) {
        // SAFETY: DOT is false.
        unsafe { row::<false>(t, q, i, a) }
    }

    #[inline(always)]
    unsafe fn row<const DOT: bool>(t: &Tile, q: &Q8Input, i: usize, a: &mut [f32; NR]) {
        // SAFETY (whole body): the tile holds `groups × WORDS × 2 × NR × 4` code bytes and
        // `groups × NR` scales; each activation half holds WORDS words; dotprod as forwarded.
        unsafe {
            let mut fa = [vdupq_n_f32(0.0); NR / 4];
            for g in 0..t.groups {
                let (xe, xo) = q.codes(i, g);
                let mut acc = [vdupq_n_s32(0); NR / 4];
                for w in 0..WORDS {
                    let word = |x: &[i8]| {
                        vreinterpretq_s8_s32(vdupq_n_s32(
                            x.as_ptr().add(4 * w).cast::<i32>().read_unaligned(),
                        ))
                    };
                    for (half, b) in [(0, word(xe)), (1, word(xo))] {
                        let at = ((g * WORDS + w) * 2 + half) * NR * 4;
                        for (h, acc) in acc.iter_mut().enumerate() {
                            let wv =
                                vreinterpretq_s8_u8(vld1q_u8(t.codes.as_ptr().add(at + 16 * h)));
                            *acc = dot4::<DOT>(*acc, wv, b);
                        }
                    }
                }
                let sx = vdupq_n_f32(q.sx(i, g));
                for (h, f) in fa.iter_mut().enumerate() {
                    let sw = vld1q_f32(t.scales.as_ptr().add(g * NR + 4 * h));
                    *f = vaddq_f32(*f, vmulq_f32(vcvtq_f32_s32(acc[h]), vmulq_f32(sw, sx)));
                }
            }
            for (h, f) in fa.iter().enumerate() {
                vst1q_f32(a.as_mut_ptr().add(4 * h), *f);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    //! [`MR`] input rows × 32 weight rows per pass: per activation word, two `vpdpbusd` per
    //! register (low nibbles × even activations, high × odd); per group, the float step into
    //! sums kept in memory (touched once per group, so the integer sums own the registers).
    use std::arch::x86_64::*;

    use super::{Q8Input, Tile, NR, WORDS};

    /// Input rows per pass.
    pub const MR: usize = 8;

    /// # Safety
    /// VNNI is present; rows `i0..i0 + MR` exist; `out` as in `tile_product`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::needless_range_loop)] // parallel arrays indexed by input row
    pub unsafe fn rows(t: &Tile, q: &Q8Input, i0: usize, cols: usize, out: *mut f32, ldo: usize) {
        let mut fa = [[0.0f32; NR]; MR];
        for g in 0..t.groups {
            let codes: [(&[i8], &[i8]); MR] = std::array::from_fn(|i| q.codes(i0 + i, g));
            let mut acc = [[_mm512_setzero_si512(); 2]; MR];
            for w in 0..WORDS {
                let at = (g * WORDS + w) * 2 * NR * 4;
                // SAFETY: the tile holds both halves of 32 rows × 4 bytes at `at`.
                let (lo0, lo1, hi0, hi1) = unsafe {
                    let p = t.codes.as_ptr().add(at);
                    (
                        _mm512_loadu_si512(p.cast()),
                        _mm512_loadu_si512(p.add(64).cast()),
                        _mm512_loadu_si512(p.add(128).cast()),
                        _mm512_loadu_si512(p.add(192).cast()),
                    )
                };
                for i in 0..MR {
                    let (xe, xo) = codes[i];
                    // SAFETY: word w of each half holds 4 bytes.
                    let (be, bo) = unsafe {
                        (
                            _mm512_set1_epi32(
                                xe.as_ptr().add(4 * w).cast::<i32>().read_unaligned(),
                            ),
                            _mm512_set1_epi32(
                                xo.as_ptr().add(4 * w).cast::<i32>().read_unaligned(),
                            ),
                        )
                    };
                    acc[i][0] =
                        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i][0], lo0, be), hi0, bo);
                    acc[i][1] =
                        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i][1], lo1, be), hi1, bo);
                }
            }
            // SAFETY: 32 scales from g·NR; fa rows hold 32 floats.
            unsafe {
                let p = t.scales.as_ptr().add(g * NR);
                let (sw0, sw1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
                for i in 0..MR {
                    let sx = _mm512_set1_ps(q.sx(i0 + i, g));
                    let f = fa[i].as_mut_ptr();
                    let s0 = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][0]), _mm512_mul_ps(sw0, sx));
                    let s1 = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][1]), _mm512_mul_ps(sw1, sx));
                    _mm512_storeu_ps(f, _mm512_add_ps(_mm512_loadu_ps(f), s0));
                    _mm512_storeu_ps(f.add(16), _mm512_add_ps(_mm512_loadu_ps(f.add(16)), s1));
                }
            }
        }
        for i in 0..MR {
            // B = Σ_g b·Σx, group after group, then out = A + B.
            let (mut b0, mut b1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for g in 0..t.groups {
                let xs = _mm512_set1_ps(q.xsum(i0 + i, g));
                // SAFETY: 32 biases from g·NR.
                let (bw0, bw1) = unsafe {
                    let p = t.biases.as_ptr().add(g * NR);
                    (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                };
                b0 = _mm512_add_ps(b0, _mm512_mul_ps(bw0, xs));
                b1 = _mm512_add_ps(b1, _mm512_mul_ps(bw1, xs));
            }
            let mut o = [0.0f32; NR];
            // SAFETY: o and fa[i] hold 32 floats; (i0 + i, c < cols) is this call's output.
            unsafe {
                let f = fa[i].as_ptr();
                _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(_mm512_loadu_ps(f), b0));
                _mm512_storeu_ps(
                    o.as_mut_ptr().add(16),
                    _mm512_add_ps(_mm512_loadu_ps(f.add(16)), b1),
                );
                std::ptr::copy_nonoverlapping(o.as_ptr(), out.add((i0 + i) * ldo), cols);
            }
        }
    }
}

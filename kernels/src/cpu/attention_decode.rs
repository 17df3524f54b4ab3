//! The two products of decode-sized attention (a few query rows against a key tile), without
//! a general gemm: packing panels for two or ten rows cost far more than the products, and
//! dominated decode once the cache held a few hundred keys.
//!
//! Every element has one fixed order of operations, whatever the ISA, the blocking or the
//! number of rows in the call:
//! - a score is `scale ·` the dot of a query row and a key row, accumulated with fused
//!   multiply-adds in 16 lanes (lane `l` takes elements `l, l + 16, …` in order) and summed
//!   in [`super::tree_sum`]'s tree;
//! - an output element is its previous value followed by one fused multiply-add per key, in
//!   key order.
//!
//! So results are bit-identical across ISA levels (the vector versions are the same source,
//! compiled with the wider instructions enabled) and a row's result does not depend on which
//! other rows share the call — decoding one token and verifying five drafted ones give the
//! same bits for the same position.
//!
//! Keys are walked in blocks, every query row per block, so a block is read from memory once
//! and found in L1 by the other rows; values likewise in chunks of [`KEY_CHUNK`] rows. The
//! vector kernels prefetch the tile's values while they score its keys, and the next tile's
//! keys while they accumulate, so memory keeps streaming through both products.

use super::isa::Isa;

/// Lanes of a score's dot product.
const LANES: usize = 16;
/// Keys scored together (independent accumulators hide the FMA latency).
const KEY_BLOCK: usize = 4;
/// Output columns accumulated together per row.
const DIM_BLOCK: usize = 64;
/// Value rows accumulated per pass over the rows and column blocks: 32 rows of D = 128 are
/// 16 KiB, so the first pass brings a chunk from memory and the others find it in L1 (a pass
/// per row and block over the whole tile read it from L2, or memory, each time).
const KEY_CHUNK: usize = 32;

/// `s[c·m + r] = scale · q_r · k_c` for the `m` query rows `q` (`[m, d]`) and the `nk` keys
/// `ks` (`[nk, d]`); `s` is `[nk, m]` (key-major, as the softmax walks it).
///
/// `vs` are the tile's values (`[nk, d]`), which [`accumulate`] reads next: the vector kernels
/// prefetch them as they go, with the keys a few rows ahead, so memory streams while the
/// products run rather than after them.
#[allow(clippy::too_many_arguments)] // the ISA, two operands with their shapes, the scale and the output
pub fn scores(
    isa: Isa,
    q: &[f32],
    m: usize,
    (ks, vs): (&[f32], &[f32]),
    nk: usize,
    d: usize,
    scale: f32,
    s: &mut [f32],
) {
    assert!(q.len() >= m * d && ks.len() >= nk * d && vs.len() >= nk * d && s.len() >= nk * m);
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512 {
            // SAFETY: AVX-512 F is present; sizes checked above.
            return unsafe { x86::scores_avx512(q, m, (ks, vs), nk, d, scale, s) };
        }
        if isa.avx2 {
            // SAFETY: AVX2 and FMA are present; sizes checked above.
            return unsafe { x86::scores_avx2(q, m, (ks, vs), nk, d, scale, s) };
        }
    }
    let _ = (isa, vs);
    scores_generic(q, m, ks, nk, d, scale, s)
}

/// `o[r·d + j] += Σ_c s[c·m + r] · v[c·d + j]`, one fused multiply-add per key in key order,
/// for the `m` rows of `o` (`[m, d]`) and the `nk` value rows `vs` (`[nk, d]`).
///
/// `next` are the keys the next call to [`scores`] will read (`[_, d]`, empty for the last
/// tile): the vector kernels prefetch them, a row per value row, so memory stays busy while
/// this product runs on values already in cache.
#[allow(clippy::too_many_arguments)] // the ISA, two operands with their shapes, the output, the prefetch
pub fn accumulate(
    isa: Isa,
    s: &[f32],
    m: usize,
    vs: &[f32],
    nk: usize,
    d: usize,
    o: &mut [f32],
    next: &[f32],
) {
    assert!(s.len() >= nk * m && vs.len() >= nk * d && o.len() >= m * d);
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512 {
            // SAFETY: AVX-512 F is present; sizes checked above.
            return unsafe { x86::accumulate_avx512(s, m, vs, nk, d, o, next) };
        }
        if isa.avx2 {
            // SAFETY: AVX2 and FMA are present; sizes checked above.
            return unsafe { x86::accumulate_avx2(s, m, vs, nk, d, o, next) };
        }
    }
    let _ = (isa, next);
    accumulate_generic(s, m, vs, nk, d, o)
}

/// The lanes of `KB` keys' dot products with one query row.
#[inline(always)]
fn dots<const KB: usize>(q: &[f32], keys: [&[f32]; KB], d: usize) -> [[f32; LANES]; KB] {
    let mut acc = [[0.0f32; LANES]; KB];
    let whole = d / LANES * LANES;
    for j in (0..whole).step_by(LANES) {
        let qv: &[f32; LANES] = q[j..j + LANES].try_into().expect("a whole lane block");
        for (a, k) in acc.iter_mut().zip(&keys) {
            let kv: &[f32; LANES] = k[j..j + LANES].try_into().expect("a whole lane block");
            for l in 0..LANES {
                a[l] = qv[l].mul_add(kv[l], a[l]);
            }
        }
    }
    for (a, k) in acc.iter_mut().zip(&keys) {
        for l in 0..d - whole {
            a[l] = q[whole + l].mul_add(k[whole + l], a[l]);
        }
    }
    acc
}

#[inline(always)]
fn scores_generic(q: &[f32], m: usize, ks: &[f32], nk: usize, d: usize, scale: f32, s: &mut [f32]) {
    let key = |c: usize| &ks[c * d..(c + 1) * d];
    let mut c0 = 0;
    while c0 < nk {
        let kb = KEY_BLOCK.min(nk - c0);
        for r in 0..m {
            let qr = &q[r * d..(r + 1) * d];
            if kb == KEY_BLOCK {
                let acc = dots::<KEY_BLOCK>(qr, std::array::from_fn(|b| key(c0 + b)), d);
                for (b, a) in acc.into_iter().enumerate() {
                    s[(c0 + b) * m + r] = scale * super::tree_sum(a);
                }
            } else {
                for c in c0..nk {
                    let [a] = dots::<1>(qr, [key(c)], d);
                    s[c * m + r] = scale * super::tree_sum(a);
                }
            }
        }
        c0 += kb;
    }
}

#[inline(always)]
fn accumulate_generic(s: &[f32], m: usize, vs: &[f32], nk: usize, d: usize, o: &mut [f32]) {
    for c0 in (0..nk).step_by(KEY_CHUNK) {
        let c1 = (c0 + KEY_CHUNK).min(nk);
        for r in 0..m {
            let row = &mut o[r * d..(r + 1) * d];
            for j0 in (0..d).step_by(DIM_BLOCK) {
                let w = DIM_BLOCK.min(d - j0);
                if w == DIM_BLOCK {
                    // A whole block accumulates in a fixed-size array the compiler keeps in
                    // registers.
                    let mut acc: [f32; DIM_BLOCK] =
                        row[j0..j0 + DIM_BLOCK].try_into().expect("a block");
                    for c in c0..c1 {
                        let p = s[c * m + r];
                        let v: &[f32; DIM_BLOCK] = vs[c * d + j0..c * d + j0 + DIM_BLOCK]
                            .try_into()
                            .expect("a block");
                        for j in 0..DIM_BLOCK {
                            acc[j] = p.mul_add(v[j], acc[j]);
                        }
                    }
                    row[j0..j0 + DIM_BLOCK].copy_from_slice(&acc);
                } else {
                    let acc = &mut row[j0..j0 + w];
                    for c in c0..c1 {
                        let p = s[c * m + r];
                        for (a, &v) in acc.iter_mut().zip(&vs[c * d + j0..c * d + j0 + w]) {
                            *a = p.mul_add(v, *a);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The generic kernels' arithmetic in explicit vectors: the same fused multiply-adds per
    //! lane and the same reduction tree, so the same bits. Partial blocks go through masks that
    //! leave the lanes past the end untouched.
    use std::arch::x86_64::*;

    use super::{DIM_BLOCK, KEY_BLOCK, KEY_CHUNK, LANES};

    /// How far ahead of the key being scored the kernels prefetch keys (32 KiB at D = 128; 16
    /// measured the same).
    const PREFETCH_KEYS: usize = 64;

    /// `scale ·` the 16-lane tree sum of `(lo, hi)` = lanes 0-7 and 8-15.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn tree(lo: __m256, hi: __m256, scale: f32) -> f32 {
        let t = _mm256_add_ps(lo, hi);
        let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let u = _mm_add_ps(u, _mm_movehl_ps(u, u));
        scale * _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)))
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub unsafe fn scores_avx512(
        q: &[f32],
        m: usize,
        (ks, vs): (&[f32], &[f32]),
        nk: usize,
        d: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        let whole = d / LANES * LANES;
        let tail: __mmask16 = ((1u32 << (d - whole)) - 1) as __mmask16;
        let (qp, kp) = (q.as_ptr(), ks.as_ptr());
        let mut c = 0;
        while c < nk {
            let kb = KEY_BLOCK.min(nk - c);
            prefetch_rows(&ks[..nk * d], c + PREFETCH_KEYS, c + PREFETCH_KEYS + kb, d);
            prefetch_rows(&vs[..nk * d], c, c + kb, d);
            for r in 0..m {
                let qr = r * d;
                let mut acc = [_mm512_setzero_ps(); KEY_BLOCK];
                // SAFETY (all loads): rows r < m of q and c + b < nk of ks are whole rows of d
                // (checked by the caller); masked loads read only the lanes below d.
                for j in (0..whole).step_by(LANES) {
                    let qv = unsafe { _mm512_loadu_ps(qp.add(qr + j)) };
                    for (b, a) in acc[..kb].iter_mut().enumerate() {
                        let kv = unsafe { _mm512_loadu_ps(kp.add((c + b) * d + j)) };
                        *a = _mm512_fmadd_ps(qv, kv, *a);
                    }
                }
                if tail != 0 {
                    let qv = unsafe { _mm512_maskz_loadu_ps(tail, qp.add(qr + whole)) };
                    for (b, a) in acc[..kb].iter_mut().enumerate() {
                        let kv =
                            unsafe { _mm512_maskz_loadu_ps(tail, kp.add((c + b) * d + whole)) };
                        *a = _mm512_mask3_fmadd_ps(qv, kv, *a, tail);
                    }
                }
                for (b, a) in acc[..kb].iter().enumerate() {
                    let lo = _mm512_castps512_ps256(*a);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*a), 1));
                    s[(c + b) * m + r] = tree(lo, hi, scale);
                }
            }
            c += kb;
        }
    }

    /// Asks rows `from..to` of `rows` (`[_, d]`, clipped to its end) into L1.
    #[inline(always)]
    fn prefetch_rows(rows: &[f32], from: usize, to: usize, d: usize) {
        let n = rows.len() / d.max(1);
        let (from, to) = (from.min(n) * d * 4, to.min(n) * d * 4);
        let p = rows.as_ptr().cast::<i8>();
        let mut at = from & !63;
        while at < to {
            // SAFETY: `at < to ≤ rows.len()·4` bytes: inside the slice.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(at)) };
            at += 64;
        }
    }

    /// Mask of the lanes `0..n` of 8 (n ≤ 8) for `maskload`/`blendv`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mask8(n: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores_avx2(
        q: &[f32],
        m: usize,
        (ks, vs): (&[f32], &[f32]),
        nk: usize,
        d: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        let mut c = 0;
        while c < nk {
            let kb = KEY_BLOCK.min(nk - c);
            prefetch_rows(&ks[..nk * d], c + PREFETCH_KEYS, c + PREFETCH_KEYS + kb, d);
            prefetch_rows(&vs[..nk * d], c, c + kb, d);
            for r in 0..m {
                let q = &q[r * d..(r + 1) * d];
                // SAFETY: keys c..c + kb are whole rows of ks (checked by the caller).
                unsafe {
                    if kb == KEY_BLOCK {
                        let acc = block_avx2::<KEY_BLOCK>(q, ks.as_ptr().add(c * d), d);
                        for (b, a) in acc.iter().enumerate() {
                            s[(c + b) * m + r] = tree(a[0], a[1], scale);
                        }
                    } else {
                        for b in 0..kb {
                            let [a] = block_avx2::<1>(q, ks.as_ptr().add((c + b) * d), d);
                            s[(c + b) * m + r] = tree(a[0], a[1], scale);
                        }
                    }
                }
            }
            c += kb;
        }
    }

    /// The 16 lanes (as two vectors) of `KB` consecutive keys' dot products with `q` (`d`
    /// floats); a constant `KB` keeps the accumulators in registers and the loop unbranched.
    ///
    /// # Safety
    /// `keys` points at `KB` whole rows of `d` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_avx2<const KB: usize>(
        q: &[f32],
        keys: *const f32,
        d: usize,
    ) -> [[__m256; 2]; KB] {
        let whole = d / LANES * LANES;
        let rem = d - whole;
        let qp = q.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 2]; KB];
        // SAFETY (all loads): q and the KB key rows hold d floats; masked loads read only the
        // lanes below d.
        for j in (0..whole).step_by(LANES) {
            let q0 = unsafe { _mm256_loadu_ps(qp.add(j)) };
            let q1 = unsafe { _mm256_loadu_ps(qp.add(j + 8)) };
            for (b, a) in acc.iter_mut().enumerate() {
                let k = unsafe { keys.add(b * d + j) };
                a[0] = _mm256_fmadd_ps(q0, unsafe { _mm256_loadu_ps(k) }, a[0]);
                a[1] = _mm256_fmadd_ps(q1, unsafe { _mm256_loadu_ps(k.add(8)) }, a[1]);
            }
        }
        if rem != 0 {
            let (mlo, mhi) = (mask8(rem.min(8)), mask8(rem.saturating_sub(8)));
            let q0 = unsafe { _mm256_maskload_ps(qp.add(whole), mlo) };
            let q1 = unsafe { _mm256_maskload_ps(qp.add(whole + 8), mhi) };
            for (b, a) in acc.iter_mut().enumerate() {
                let k = unsafe { keys.add(b * d + whole) };
                let f0 = _mm256_fmadd_ps(q0, unsafe { _mm256_maskload_ps(k, mlo) }, a[0]);
                let f1 = _mm256_fmadd_ps(q1, unsafe { _mm256_maskload_ps(k.add(8), mhi) }, a[1]);
                a[0] = _mm256_blendv_ps(a[0], f0, _mm256_castsi256_ps(mlo));
                a[1] = _mm256_blendv_ps(a[1], f1, _mm256_castsi256_ps(mhi));
            }
        }
        acc
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub unsafe fn accumulate_avx512(
        s: &[f32],
        m: usize,
        vs: &[f32],
        nk: usize,
        d: usize,
        o: &mut [f32],
        next: &[f32],
    ) {
        const V: usize = DIM_BLOCK / 16;
        let (vp, op) = (vs.as_ptr(), o.as_mut_ptr());
        for c0 in (0..nk).step_by(KEY_CHUNK) {
            let c1 = (c0 + KEY_CHUNK).min(nk);
            prefetch_rows(next, c0, c1, d);
            for r in 0..m {
                for j0 in (0..d).step_by(DIM_BLOCK) {
                    let w = DIM_BLOCK.min(d - j0);
                    // Lane masks of the block's 4 vectors (all set for a whole block).
                    let masks: [__mmask16; V] = std::array::from_fn(|i| {
                        let n = w.saturating_sub(16 * i).min(16);
                        ((1u32 << n) - 1) as __mmask16
                    });
                    // SAFETY (all accesses): row r < m of o and rows c < nk of vs hold d
                    // floats (checked by the caller); masked accesses touch only columns
                    // below d.
                    let at = unsafe { op.add(r * d + j0) };
                    let mut acc: [__m512; V] = std::array::from_fn(|i| unsafe {
                        _mm512_maskz_loadu_ps(masks[i], at.add(16 * i))
                    });
                    for c in c0..c1 {
                        let p = _mm512_set1_ps(s[c * m + r]);
                        let v = unsafe { vp.add(c * d + j0) };
                        for (i, a) in acc.iter_mut().enumerate() {
                            if masks[i] != 0 {
                                let x = unsafe { _mm512_maskz_loadu_ps(masks[i], v.add(16 * i)) };
                                *a = _mm512_fmadd_ps(p, x, *a);
                            }
                        }
                    }
                    for (i, a) in acc.iter().enumerate() {
                        unsafe { _mm512_mask_storeu_ps(at.add(16 * i), masks[i], *a) };
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn accumulate_avx2(
        s: &[f32],
        m: usize,
        vs: &[f32],
        nk: usize,
        d: usize,
        o: &mut [f32],
        next: &[f32],
    ) {
        const V: usize = DIM_BLOCK / 8;
        let (vp, op) = (vs.as_ptr(), o.as_mut_ptr());
        // Only the last column block can be partial: its lane masks, computed once.
        let tail = d % DIM_BLOCK;
        let masks: [__m256i; V] = std::array::from_fn(|i| mask8(tail.saturating_sub(8 * i).min(8)));
        let live = tail.div_ceil(8);
        for c0 in (0..nk).step_by(KEY_CHUNK) {
            let c1 = (c0 + KEY_CHUNK).min(nk);
            prefetch_rows(next, c0, c1, d);
            for r in 0..m {
                for j0 in (0..d).step_by(DIM_BLOCK) {
                    // SAFETY (all accesses): as in `accumulate_avx512`; a whole block's 64
                    // columns lie inside the row, a partial one's masks stop at d.
                    let at = unsafe { op.add(r * d + j0) };
                    if d - j0 >= DIM_BLOCK {
                        // A whole block: plain loads (`vmaskmovps` is slower on some cores).
                        let mut acc: [__m256; V] =
                            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(at.add(8 * i)) });
                        for c in c0..c1 {
                            let p = _mm256_set1_ps(s[c * m + r]);
                            let v = unsafe { vp.add(c * d + j0) };
                            for (i, a) in acc.iter_mut().enumerate() {
                                let x = unsafe { _mm256_loadu_ps(v.add(8 * i)) };
                                *a = _mm256_fmadd_ps(p, x, *a);
                            }
                        }
                        for (i, a) in acc.iter().enumerate() {
                            unsafe { _mm256_storeu_ps(at.add(8 * i), *a) };
                        }
                    } else {
                        let mut acc: [__m256; V] = std::array::from_fn(|i| unsafe {
                            _mm256_maskload_ps(at.add(8 * i), masks[i])
                        });
                        for c in c0..c1 {
                            let p = _mm256_set1_ps(s[c * m + r]);
                            let v = unsafe { vp.add(c * d + j0) };
                            for (i, a) in acc[..live].iter_mut().enumerate() {
                                let x = unsafe { _mm256_maskload_ps(v.add(8 * i), masks[i]) };
                                *a = _mm256_fmadd_ps(p, x, *a);
                            }
                        }
                        for (i, a) in acc[..live].iter().enumerate() {
                            unsafe { _mm256_maskstore_ps(at.add(8 * i), masks[i], *a) };
                        }
                    }
                }
            }
        }
    }
}

//! AVX2 versions of the hottest group decoders (affine 2/4/8-bit, fp4). The compiler does not
//! vectorise the per-word shift-and-convert well on its own. Each computes exactly what the
//! portable loop in `dequant.rs` computes (`s·q + b` with a separate multiply and add, no
//! FMA; fp4 values are exact), so both paths give the same bits.
//!
//! Callers must have checked that the CPU has AVX2.

use std::arch::x86_64::*;

/// `out[j] = s·q_j + b` for 4-bit codes, 8 per word.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn affine4(words: &[u32], s: f32, b: f32, out: &mut [f32]) {
    debug_assert_eq!(out.len(), words.len() * 8);
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let low = _mm256_set1_epi32(0xF);
    let (sv, bv) = (_mm256_set1_ps(s), _mm256_set1_ps(b));
    for (j, &w) in words.iter().enumerate() {
        let q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), low);
        let v = _mm256_add_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(q)), bv);
        // SAFETY: out holds 8 floats per word.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), v) };
    }
}

/// `out[j] = s·q_j + b` for 2-bit codes, 16 per word.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn affine2(words: &[u32], s: f32, b: f32, out: &mut [f32]) {
    debug_assert_eq!(out.len(), words.len() * 16);
    let lo_shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    let hi_shifts = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    let low = _mm256_set1_epi32(0x3);
    let (sv, bv) = (_mm256_set1_ps(s), _mm256_set1_ps(b));
    for (j, &w) in words.iter().enumerate() {
        let wv = _mm256_set1_epi32(w as i32);
        for (half, shifts) in [lo_shifts, hi_shifts].into_iter().enumerate() {
            let q = _mm256_and_si256(_mm256_srlv_epi32(wv, shifts), low);
            let v = _mm256_add_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(q)), bv);
            // SAFETY: out holds 16 floats per word.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(16 * j + 8 * half), v) };
        }
    }
}

/// `out[j] = s·q_j + b` for 8-bit codes, 4 per word (two words per vector).
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn affine8(words: &[u32], s: f32, b: f32, out: &mut [f32]) {
    debug_assert!(out.len() == words.len() * 4 && words.len().is_multiple_of(2));
    let (sv, bv) = (_mm256_set1_ps(s), _mm256_set1_ps(b));
    for j in 0..words.len() / 2 {
        // SAFETY: words j·2 and j·2 + 1 exist; out holds 4 floats per word.
        unsafe {
            let bytes = _mm_loadl_epi64(words.as_ptr().add(2 * j) as *const __m128i);
            let q = _mm256_cvtepu8_epi32(bytes);
            let v = _mm256_add_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(q)), bv);
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), v);
        }
    }
}

/// `out[j] = e2m1(code_j)·s` for 8 E2M1 codes per word: a magnitude table lookup in a
/// register, then the sign bit.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn fp4(words: &[u32], s: f32, out: &mut [f32]) {
    debug_assert_eq!(out.len(), words.len() * 8);
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let table = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    let low = _mm256_set1_epi32(0xF);
    let sign = _mm256_set1_epi32(0x8);
    let sv = _mm256_set1_ps(s);
    for (j, &w) in words.iter().enumerate() {
        let code = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), low);
        // permutevar8x32 reads only the low 3 bits of each index: the magnitude.
        let mag = _mm256_permutevar8x32_ps(table, code);
        let neg = _mm256_slli_epi32(_mm256_and_si256(code, sign), 28);
        let v = _mm256_or_ps(mag, _mm256_castsi256_ps(neg));
        // SAFETY: out holds 8 floats per word.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), _mm256_mul_ps(v, sv)) };
    }
}

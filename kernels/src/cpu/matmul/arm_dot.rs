//! aarch64 int8 dot products of four bytes per 32-bit lane, for the `fast` 4-bit kernels
//! (`qmatvec_q8` in decode, `qgemm_q8` in prefill): `acc[j] += Σ_{b<4} a[4j+b]·x[4j+b]`.
//!
//! With the dotprod extension (Grace's Neoverse V2, Apple M2 and later) that is one `sdot`;
//! plain NEON widens to i16 products (`smull`, at most 128·128 in magnitude, so exact) and adds
//! neighbours pairwise. Integer sums are exact in any order, so both give the portable code's
//! sums, and the kernels' float steps (written once, shared with portable code) fix the bits.
//!
//! `sdot` is written as inline assembly: its intrinsic (`vdotq_s32`) is not stable in Rust yet.
//! So is i8mm's `smmla` (two rows by two, 8 bytes deep), which the prefill kernel uses for two
//! input rows at a time.

use std::arch::aarch64::*;

/// `acc + dot4(a, x)` with `sdot`.
///
/// # Safety
/// The CPU has dotprod.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: dotprod is present (the caller's contract); the instruction only reads and
    // writes these registers.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `acc + A·Bᵀ` with `smmla` (i8mm): `a` holds two rows of 8 bytes (A), `b` two rows of 8
/// (B), and `acc` the 2 × 2 sums row-major: `[a0·b0, a0·b1, a1·b0, a1·b1]`.
///
/// # Safety
/// The CPU has i8mm.
#[inline]
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: i8mm is present (the caller's contract); the instruction only reads and writes
    // these registers. Its intrinsic (`vmmlaq_s32`) is not stable in Rust yet.
    unsafe {
        std::arch::asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `acc + dot4(a, x)` with NEON's widening multiply.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn widening(acc: int32x4_t, a: int8x16_t, x: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(x));
    let hi = vmull_high_s8(a, x);
    // Pairs of products, then pairs of pairs: lane j holds bytes 4j..4j + 4.
    vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
}

/// [`sdot`] when `DOT`, else [`widening`]. Inlined into a caller compiled for dotprod when
/// `DOT`, and for NEON alone otherwise, so the other arm is dead code there.
///
/// # Safety
/// The CPU has dotprod when `DOT`.
#[inline(always)]
pub(crate) unsafe fn dot4<const DOT: bool>(
    acc: int32x4_t,
    a: int8x16_t,
    x: int8x16_t,
) -> int32x4_t {
    if DOT {
        // SAFETY: forwarded.
        unsafe { sdot(acc, a, x) }
    } else {
        // SAFETY: NEON is part of every aarch64 target Rust supports.
        unsafe { widening(acc, a, x) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms against plain integer arithmetic, at the extremes of i8.
    #[test]
    fn both_forms_sum_four_bytes_per_lane_exactly() {
        let a: [i8; 16] = [
            -128, 127, 15, -1, -128, -128, 0, 7, 127, 127, 127, 127, 1, -2, 3, -4,
        ];
        let x: [i8; 16] = [
            -128, -128, 127, 3, -128, -128, -128, -128, 127, 127, 127, 127, -5, 6, -7, 8,
        ];
        let want: [i32; 4] = std::array::from_fn(|j| {
            7 + (0..4)
                .map(|b| a[4 * j + b] as i32 * x[4 * j + b] as i32)
                .sum::<i32>()
        });
        let run = |f: &dyn Fn(int32x4_t, int8x16_t, int8x16_t) -> int32x4_t| {
            // SAFETY: the arrays hold 16 bytes and 4 words.
            unsafe {
                let r = f(vdupq_n_s32(7), vld1q_s8(a.as_ptr()), vld1q_s8(x.as_ptr()));
                let mut out = [0i32; 4];
                vst1q_s32(out.as_mut_ptr(), r);
                out
            }
        };
        // SAFETY: NEON is always present.
        assert_eq!(run(&|c, p, q| unsafe { widening(c, p, q) }), want);
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            // SAFETY: dotprod was detected.
            assert_eq!(run(&|c, p, q| unsafe { sdot(c, p, q) }), want);
        }
    }

    /// `smmla` against plain integer arithmetic: rows of 8 bytes, products row by row.
    #[test]
    fn smmla_is_a_two_by_two_product_of_eight_byte_rows() {
        if !std::arch::is_aarch64_feature_detected!("i8mm") {
            return;
        }
        let a: [i8; 16] = [
            -128, 127, 15, -1, -128, -128, 0, 7, 127, 127, 127, 127, 1, -2, 3, -4,
        ];
        let b: [i8; 16] = [15, 0, 3, 9, 1, 15, 15, 2, -128, -128, 127, 3, -5, 6, -7, 8];
        let dot = |i: usize, j: usize| {
            (0..8)
                .map(|k| a[8 * i + k] as i32 * b[8 * j + k] as i32)
                .sum::<i32>()
        };
        let want = [7 + dot(0, 0), 7 + dot(0, 1), 7 + dot(1, 0), 7 + dot(1, 1)];
        // SAFETY: i8mm was detected; the arrays hold 16 bytes and 4 words.
        let got = unsafe {
            let r = smmla(vdupq_n_s32(7), vld1q_s8(a.as_ptr()), vld1q_s8(b.as_ptr()));
            let mut out = [0i32; 4];
            vst1q_s32(out.as_mut_ptr(), r);
            out
        };
        assert_eq!(got, want);
    }
}

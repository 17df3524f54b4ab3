//! The CPU backend: the reference every other backend is compared against. Parallel work is
//! split over output rows in fixed-size chunks (never over a reduction), so the bits of every
//! result are independent of the thread count.

pub mod attention;
pub(crate) mod bgemm_bf16;
pub mod binary;
pub mod dequant;
#[cfg(target_arch = "x86_64")]
mod dequant_avx2;
pub mod gdn;
pub mod isa;
pub mod matmul;
#[cfg(target_arch = "x86_64")]
mod matvec_bf16;
pub mod minifloat;
pub mod moe;
pub mod norm;
pub mod numerics;
pub(crate) mod qgemm_q8;
#[cfg(target_arch = "x86_64")]
mod qmatvec_avx2;
pub(crate) mod qmatvec_q8;
pub mod rope;
pub mod select;
pub mod unary;

use rayon::prelude::*;

/// Calls `f(row_index, out_row)` for every `width`-sized row of `out`, in parallel when the
/// total work is large enough to pay for it.
pub(crate) fn for_each_row(
    out: &mut [f32],
    width: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if width == 0 {
        return;
    }
    if out.len() < 1 << 14 {
        out.chunks_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    }
}

/// Sums independent partial sums (`N` a power of two) in a fixed pairwise tree, so the result
/// depends only on the lanes' values, never on how the work around it was scheduled.
#[inline(always)]
pub(crate) fn tree_sum<const N: usize>(mut acc: [f32; N]) -> f32 {
    let mut w = N / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

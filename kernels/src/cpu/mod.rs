//! The CPU backend: the reference every other backend is compared against. Parallel work is
//! split over output rows in fixed-size chunks (never over a reduction), so the bits of every
//! result are independent of the thread count.

/// `$f::<M>(args…)` for the const `M` equal to the run-time row count `$m` (at most
/// `matmul::DECODE_MAX_M`): a const count keeps the accumulators in registers. With
/// `$f[G…](args…)` the generic arguments `G…` follow `M` (`$f::<M, G…>`).
macro_rules! by_rows {
    ($m:expr, $f:ident($($a:expr),*)) => {
        by_rows!($m, $f[]($($a),*))
    };
    ($m:expr, $f:ident[$($g:tt)*]($($a:expr),*)) => {
        match $m {
            1 => $f::<1, $($g)*>($($a),*),
            2 => $f::<2, $($g)*>($($a),*),
            3 => $f::<3, $($g)*>($($a),*),
            4 => $f::<4, $($g)*>($($a),*),
            5 => $f::<5, $($g)*>($($a),*),
            6 => $f::<6, $($g)*>($($a),*),
            7 => $f::<7, $($g)*>($($a),*),
            _ => $f::<8, $($g)*>($($a),*),
        }
    };
}

pub mod attention;
mod attention_decode;
mod backend;
pub mod binary;
pub mod gdn;
pub mod isa;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod pool;
pub mod rope;
pub mod unary;

pub(crate) use backend::Cpu;
use rayon::prelude::*;

/// How far ahead of the row being computed the 4-bit decode matvec asks for weight bytes. One
/// row's load misses otherwise stall it: the hardware prefetcher alone left the 4-bit kernel
/// at 13 GB/s per core and 24 GB/s on two (the LM head of Qwen3-0.6B, measured by
/// `cargo bench -p kernels --bench matmul -- lm_head`); 16 KiB ahead into L2 gave 16 and 28.
/// The bf16 matvecs stream twice the bytes per product and do not prefetch: with weights in
/// huge pages (`engine::weights::pages`), 16 KiB ahead cost bench Qwen3 bf16 decode 12–20%
/// on a Zen 2 (17.3 → 15.3 tok/s fast, 18.5 → 14.6 exact), and it was level on Zen 4 before.
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_BYTES: usize = 16 << 10;

/// Asks for the cache lines of bytes `at..at + len` of `data` (clipped to its end) to be
/// loaded into L2. A hint only: no effect on results.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_l2<T>(data: &[T], at: usize, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let base = data.as_ptr().cast::<i8>();
    let end = (at + len).min(std::mem::size_of_val(data));
    let mut line = at;
    while line < end {
        // SAFETY: byte `line` is inside `data`; a prefetch never faults or changes memory.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(base.add(line)) };
        line += 64;
    }
}

/// Calls `f(row_index, out_row)` for every `width`-sized row of `out`, in parallel when the
/// total work is large enough to pay for it.
pub(crate) fn for_each_row<T: Send>(
    out: &mut [T],
    width: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
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

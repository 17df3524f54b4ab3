//! `x @ wᵀ` for every weight format, and embedding lookups.
//!
//! Two kernels, both split over output columns (weight rows) in tiles whose size depends only
//! on the problem shape, never on the thread count, so results are bit-identical for any
//! `RAYON_NUM_THREADS`:
//! - prefill (more than [`DECODE_MAX_M`] input rows): per tile of [`TILE_N`] weight rows, widen
//!   the rows into a thread-local f32 buffer (dense f32 is read in place) and run one
//!   single-threaded `gemm` over all input rows and the tile's full K;
//! - decode (a few input rows): per chunk of [`ROW_CHUNK`] weight rows, widen each row a span
//!   of [`SPAN`] columns at a time into a stack buffer and fold it into [`LANES`] fixed lanes per
//!   input row, so the weight streams from memory exactly once and never lands in a big buffer.
//!   4- and 8-bit affine weights on AVX2 CPUs take a fused kernel instead (`qmatvec_avx2`) that
//!   skips the widened values altogether.
//!
//! The two kernels round differently, so a row's result may differ in the last bits between a
//! call with M ≤ [`DECODE_MAX_M`] and one with more rows; each is deterministic on its own.

#[cfg(target_arch = "aarch64")]
mod arm_dot;
pub(crate) mod bgemm_bf16;
mod bmatvec_bf16;
#[cfg(target_arch = "x86_64")]
mod matvec_bf16;
pub(crate) mod out;
pub(crate) mod qgemm_q8;
#[cfg(target_arch = "x86_64")]
mod qmatvec_avx2;
pub(crate) mod qmatvec_q8;

use std::cell::RefCell;

use gemm::Parallelism;
use rayon::prelude::*;

use out::OutPtr;
pub use out::DECODE_MAX_M;

use crate::cpu::isa::Isa;
use crate::error::shape_err;
use crate::numerics::Numerics;
use crate::quant::decode::WeightRows;
use crate::{Result, Tensor, Weight};

/// Weight rows per prefill tile: large enough that the per-tile `gemm` call amortises packing
/// the input, small enough that a widened tile stays in L2 for typical K.
pub const TILE_N: usize = 128;
/// Weight rows per decode work item.
pub const ROW_CHUNK: usize = 32;
/// Below this many weight elements the work runs on the calling thread.
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

thread_local! {
    /// Scratch for widened weight rows, reused across calls to avoid page-faulting a fresh
    /// buffer per tile.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

pub fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let rows = WeightRows::new(w)?;
    check_input(x, &rows, w)?;
    let (n, k) = (rows.rows(), rows.cols());
    let xs = x.f32s()?;
    let m: usize = x.shape()[..x.dims() - 1].iter().product();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("checked dims above") = n;
    let mut out = vec![0.0f32; m * n];
    if m > 0 && n > 0 && k > 0 {
        // Read once here, on the calling thread: the workers below see neither thread's cap.
        let isa = Isa::current();
        let numerics = Numerics::current();
        if m <= DECODE_MAX_M {
            matvec(xs, m, &rows, &mut out, isa, numerics);
        } else if !(numerics == Numerics::Fast && fast_gemm(xs, m, &rows, &mut out, isa)) {
            tiled_gemm(xs, m, &rows, &mut out, isa);
        }
    }
    Tensor::from_f32(&shape, out)
}

/// `x` must end in as many features as the weight has columns.
fn check_input(x: &Tensor, rows: &WeightRows, w: &Weight) -> Result<()> {
    let (n, k) = (rows.rows(), rows.cols());
    if x.dims() == 0 || x.dim(-1) != k {
        return shape_err(
            "matmul",
            format!(
                "input {:?} must end in {k} features to match weight {n}x{k} ({})",
                x.shape(),
                w.format_name()
            ),
        );
    }
    Ok(())
}

fn tiled_gemm(xs: &[f32], m: usize, w: &WeightRows, out: &mut [f32], isa: Isa) {
    let (n, k) = (w.rows(), w.cols());
    let dst = OutPtr(out.as_mut_ptr());
    let tile = |t: usize| {
        let j0 = t * TILE_N;
        let nt = TILE_N.min(n - j0);
        let run = |rhs: &[f32]| {
            // SAFETY: `rhs` holds `nt` rows of `k`; the destination block is rows 0..m,
            // columns j0..j0 + nt of the m x n output, written by this tile alone.
            unsafe {
                gemm::gemm(
                    m,
                    nt,
                    k,
                    dst.at(j0),
                    1,
                    n as isize,
                    false,
                    xs.as_ptr(),
                    1,
                    k as isize,
                    rhs.as_ptr(),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                )
            }
        };
        match w.f32_rows(j0, nt) {
            Some(block) => run(block),
            None => with_scratch(nt * k, |buf| {
                decode_tile(w, j0, buf, isa);
                run(buf)
            }),
        }
    };
    let tiles = n.div_ceil(TILE_N);
    if m * n * k < PARALLEL_MIN_ELEMS {
        (0..tiles).for_each(tile);
    } else {
        (0..tiles).into_par_iter().for_each(tile);
    }
}

/// The `fast` prefill products: int8 activations against 4-bit group-64 weights
/// (`qgemm_q8`), bf16 activations against bf16 weights (`bgemm_bf16`). Returns false (and
/// writes nothing) for other weights, which the exact kernel takes.
fn fast_gemm(xs: &[f32], m: usize, w: &WeightRows, out: &mut [f32], isa: Isa) -> bool {
    thread_local! {
        static Q8_TILE: RefCell<qgemm_q8::Tile> = RefCell::new(qgemm_q8::Tile::default());
        static BF16_TILE: RefCell<bgemm_bf16::Tile> = RefCell::new(bgemm_bf16::Tile::default());
    }
    let (n, k) = (w.rows(), w.cols());
    let dst = OutPtr(out.as_mut_ptr());
    if let Some(a4) = w.affine4().filter(qgemm_q8::applies) {
        let q = qmatvec_q8::quantize(xs, m, k);
        let groups = k / qmatvec_q8::GROUP;
        for_each_tile(n, qgemm_q8::NR, m * n * k, |r0, cols| {
            Q8_TILE.with(|t| {
                let mut t = t.borrow_mut();
                t.pack(&a4, r0, cols, groups);
                // SAFETY: the tile writes columns r0..r0 + cols of the m x n output alone.
                unsafe { qgemm_q8::tile_product(&t, &q, isa, cols, dst.at(r0), n) };
            })
        });
        return true;
    }
    if let Some(wb) = w.bf16_dense() {
        let x = bgemm_bf16::round_input(xs, m, k, bgemm_bf16::needs_values(isa));
        for_each_tile(n, bgemm_bf16::NR, m * n * k, |r0, cols| {
            BF16_TILE.with(|t| {
                let mut t = t.borrow_mut();
                t.pack(wb, k, r0, cols, isa);
                // SAFETY: the tile writes columns r0..r0 + cols of the m x n output alone.
                unsafe { bgemm_bf16::tile_product(&t, &x, isa, cols, dst.at(r0), n) };
            })
        });
        return true;
    }
    false
}

/// Runs `tile(r0, cols)` over fixed tiles of `nr` weight rows, in parallel when `work` (the
/// product's multiply-adds) pays for it.
fn for_each_tile(n: usize, nr: usize, work: usize, tile: impl Fn(usize, usize) + Sync + Send) {
    let one = |t: usize| tile(t * nr, nr.min(n - t * nr));
    let tiles = n.div_ceil(nr);
    if work < PARALLEL_MIN_ELEMS {
        (0..tiles).for_each(one);
    } else {
        (0..tiles).into_par_iter().for_each(one);
    }
}

fn decode_tile(w: &WeightRows, r0: usize, buf: &mut [f32], isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { simd::decode_rows_avx2(w, r0, buf) };
    }
    let _ = isa;
    w.decode_rows(r0, buf)
}

/// Runs `per_chunk(r0, r1)` over fixed chunks of [`ROW_CHUNK`] weight rows, in parallel when
/// the weight is large enough to pay for it.
fn for_each_row_chunk(w: &WeightRows, per_chunk: impl Fn(usize, usize) + Sync + Send) {
    let n = w.rows();
    let chunk = |c: usize| per_chunk(c * ROW_CHUNK, ((c + 1) * ROW_CHUNK).min(n));
    let chunks = n.div_ceil(ROW_CHUNK);
    if n * w.cols() < PARALLEL_MIN_ELEMS {
        (0..chunks).for_each(chunk);
    } else {
        (0..chunks).into_par_iter().for_each(chunk);
    }
}

fn matvec(xs: &[f32], m: usize, w: &WeightRows, out: &mut [f32], isa: Isa, numerics: Numerics) {
    let chunk = matvec_chunks(xs, m, w, isa, numerics, OutPtr(out.as_mut_ptr()));
    for_each_row_chunk(w, chunk);
}

/// The decode product of `w` as work on chunks of its rows: `chunk(r0, r1)` writes output
/// columns `r0..r1` of the `[m, n]` buffer at `dst`. Safety (of calling the result): `dst`
/// holds `m × n` floats and outlives it, and no two calls write the same columns.
fn matvec_chunks<'a>(
    xs: &'a [f32],
    m: usize,
    w: &'a WeightRows<'a>,
    isa: Isa,
    numerics: Numerics,
    dst: OutPtr,
) -> Box<dyn Fn(usize, usize) + Sync + Send + 'a> {
    let (n, k) = (w.rows(), w.cols());
    if let (Some(wb), Numerics::Fast) = (w.bf16_dense(), numerics) {
        let x = bmatvec_bf16::Input::new(xs, m, k, isa);
        // SAFETY: `isa` is what the CPU has (`x` is laid out for it); `dst` is m x n and each
        // chunk writes only its own columns.
        return Box::new(move |r0, r1| unsafe {
            bmatvec_bf16::rows(&x, wb, k, n, r0, r1, isa, dst)
        });
    }
    if let Some(a4) = w.affine4() {
        if numerics == Numerics::Fast && a4.group == qmatvec_q8::GROUP {
            let q = qmatvec_q8::quantize(xs, m, k);
            // SAFETY: `dst` is m x n and each chunk writes only its own columns.
            return Box::new(move |r0, r1| unsafe {
                qmatvec_q8::rows(&a4, r0, r1, &q, isa, n, dst)
            });
        }
        #[cfg(target_arch = "x86_64")]
        if isa.avx2 && qmatvec_avx2::applies(4, a4.group) {
            return fused_affine(a4, xs, m, k, n, isa, dst);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(a8) = w
        .affine8()
        .filter(|a| isa.avx2 && qmatvec_avx2::applies(8, a.group))
    {
        return fused_affine(a8, xs, m, k, n, isa, dst);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(wb), true) = (w.bf16_dense(), isa.avx2) {
        let x = matvec_bf16::Input::new(xs, m, k, isa.avx512);
        // SAFETY: AVX2 (and AVX-512 when asked, which `x` is laid out for) is present; each
        // chunk writes only its columns.
        return Box::new(move |r0, r1| unsafe {
            matvec_bf16::rows(isa.avx512, &x, wb, n, r0, r1, dst)
        });
    }
    Box::new(move |r0, r1| {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2 {
            // SAFETY: AVX2 is present; the chunk writes only output columns r0..r1.
            return unsafe { simd::matvec_rows_avx2(xs, m, w, r0, r1, dst) };
        }
        // SAFETY: the chunk writes only output columns r0..r1.
        unsafe { matvec_rows::<false>(xs, m, w, r0, r1, dst) }
    })
}

/// The AVX2 fused decode product of 4- or 8-bit affine weights (`qmatvec_avx2`), as work on
/// chunks of rows like [`matvec_chunks`]'s. The caller checked AVX2 and `qmatvec_avx2::applies`.
#[cfg(target_arch = "x86_64")]
fn fused_affine<'a, const BITS: usize>(
    a: crate::quant::decode::Affine<'a, BITS>,
    xs: &'a [f32],
    m: usize,
    k: usize,
    n: usize,
    isa: Isa,
    dst: OutPtr,
) -> Box<dyn Fn(usize, usize) + Sync + Send + 'a> {
    let xsum = qmatvec_avx2::group_sums(xs, m, k, a.group);
    Box::new(move |r0, r1| {
        let mut row = [0.0f32; DECODE_MAX_M];
        for r in r0..r1 {
            out::prefetch_affine(&a, r, k);
            // SAFETY: AVX2 (and AVX-512 where taken) is present and the kernel applies (the
            // caller's checks), xs/xsum are m rows of k and their group sums, and r < n.
            unsafe {
                if isa.avx512 {
                    qmatvec_avx2::row_dot_avx512(&a, r, k, xs, m, &xsum, &mut row)
                } else {
                    qmatvec_avx2::row_dot(&a, r, k, xs, m, &xsum, &mut row)
                }
            };
            for (i, &v) in row[..m].iter().enumerate() {
                // SAFETY: column r belongs to this chunk alone.
                unsafe { *dst.at(i * n + r) = v };
            }
        }
    })
}

/// [`matmul`] of one decode-sized input against several weights (a layer's q/k/v or gate/up
/// projections) in one parallel loop over all their row chunks, instead of one loop each:
/// each result is bit-identical to its own [`matmul`], and a decode step starts fewer loops.
/// Inputs with more rows than [`DECODE_MAX_M`] run one [`matmul`] per weight.
pub fn matmul_many(x: &Tensor, ws: &[&Weight]) -> Result<Vec<Tensor>> {
    let m: usize = x.shape()[..x.dims().saturating_sub(1)].iter().product();
    if x.dims() == 0 || m == 0 || m > DECODE_MAX_M || x.dim(-1) == 0 {
        return ws.iter().map(|w| matmul(x, w)).collect();
    }
    let rows = ws
        .iter()
        .map(|w| WeightRows::new(w))
        .collect::<Result<Vec<_>>>()?;
    for (r, w) in rows.iter().zip(ws) {
        check_input(x, r, w)?;
    }
    let xs = x.f32s()?;
    let (isa, numerics) = (Isa::current(), Numerics::current());
    let mut outs: Vec<Vec<f32>> = rows.iter().map(|r| vec![0.0f32; m * r.rows()]).collect();
    let chunks: Vec<_> = rows
        .iter()
        .zip(outs.iter_mut())
        .map(|(r, out)| matvec_chunks(xs, m, r, isa, numerics, OutPtr(out.as_mut_ptr())))
        .collect();
    let tasks: Vec<(usize, usize)> = rows
        .iter()
        .enumerate()
        .flat_map(|(j, r)| (0..r.rows().div_ceil(ROW_CHUNK)).map(move |c| (j, c)))
        .collect();
    tasks.into_par_iter().for_each(|(j, c)| {
        let n = rows[j].rows();
        chunks[j](c * ROW_CHUNK, ((c + 1) * ROW_CHUNK).min(n))
    });
    drop(chunks);
    outs.into_iter()
        .zip(&rows)
        .map(|(out, r)| {
            let mut shape = x.shape().to_vec();
            *shape.last_mut().expect("checked dims above") = r.rows();
            Tensor::from_f32(&shape, out)
        })
        .collect()
}

/// The rows of `x` (`[M, K]`, separate sequences) against `w`, each through the decode kernel
/// as if alone (so each row's result is bit-identical to its one-row [`matmul`]), in groups of
/// at most [`DECODE_MAX_M`] rows. With dense weights all groups run on each chunk of weight
/// rows in turn, so the chunk comes from memory once for every group (16 rows of a bf16 LM
/// head: 1.3× exact, 1.7× fast on 2 Zen 4 cores); the fused 4- and 8-bit kernels were
/// 0.8-0.9× that way (each group's f32 input evicts the other's), so they run the groups one
/// after another.
pub fn matmul_rows(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let rows = WeightRows::new(w)?;
    check_input(x, &rows, w)?;
    let (n, k) = (rows.rows(), rows.cols());
    let m: usize = x.shape()[..x.dims() - 1].iter().product();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("checked dims above") = n;
    let mut out = vec![0.0f32; m * n];
    if m > 0 && n > 0 && k > 0 {
        let xs = x.f32s()?;
        let (isa, numerics) = (Isa::current(), Numerics::current());
        let interleave = matches!(w, Weight::Dense(_));
        let groups: Vec<_> = (0..m)
            .step_by(DECODE_MAX_M)
            .map(|i0| {
                let mg = DECODE_MAX_M.min(m - i0);
                let dst = OutPtr(out[i0 * n..].as_mut_ptr());
                matvec_chunks(&xs[i0 * k..(i0 + mg) * k], mg, &rows, isa, numerics, dst)
            })
            .collect();
        if interleave {
            for_each_row_chunk(&rows, |r0, r1| groups.iter().for_each(|g| g(r0, r1)));
        } else {
            for g in &groups {
                for_each_row_chunk(&rows, g);
            }
        }
    }
    Tensor::from_f32(&shape, out)
}

/// Columns decoded at a time by the decode kernel: a multiple of every group size, so spans
/// never split a group, and small enough to live on the stack.
const SPAN: usize = 128;

/// Output columns `r0..r1` for all `m` input rows: each weight row is decoded one span at a
/// time into a stack buffer and folded into [`LANES`] lanes per input row, so the weight is read
/// once and the partial sums stay in registers. Safety: no other thread writes those columns.
#[inline(always)]
unsafe fn matvec_rows<const AVX2: bool>(
    xs: &[f32],
    m: usize,
    w: &WeightRows,
    r0: usize,
    r1: usize,
    dst: OutPtr,
) {
    let (n, k) = (w.rows(), w.cols());
    let mut buf = [0.0f32; SPAN];
    let mut acc = [[0.0f32; LANES]; DECODE_MAX_M];
    for r in r0..r1 {
        let acc = &mut acc[..m];
        acc.iter_mut().for_each(|a| *a = [0.0; LANES]);
        let mut c0 = 0;
        while c0 < k {
            let len = SPAN.min(k - c0);
            let span: &[f32] = match w.f32_rows(r, 1) {
                Some(row) => &row[c0..c0 + len],
                None => {
                    let out = &mut buf[..len];
                    #[cfg(target_arch = "x86_64")]
                    if AVX2 {
                        // SAFETY: the AVX2 path is only taken on CPUs that have it.
                        unsafe { w.decode_span_avx2(r, c0, out) };
                    } else {
                        w.decode_span(r, c0, out);
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    w.decode_span(r, c0, out);
                    out
                }
            };
            for (i, a) in acc.iter_mut().enumerate() {
                fold_lanes(a, &xs[i * k + c0..i * k + c0 + len], span);
            }
            c0 += len;
        }
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: (i, r) is inside the m x n output and column r belongs to this chunk.
            unsafe { *dst.at(i * n + r) = crate::cpu::tree_sum(*a) };
        }
    }
}

/// Independent partial sums per input row: enough vector accumulators to hide add latency.
const LANES: usize = 32;

/// `acc[j % LANES] += a[j]·b[j]` in order. Spans are multiples of LANES except a dense row's last,
/// so lane j always receives the same products in the same order, whatever the vector width.
#[inline(always)]
fn fold_lanes(acc: &mut [f32; LANES], a: &[f32], b: &[f32]) {
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in at.iter().zip(bt).enumerate() {
        acc[l] += x * y;
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! The same loops compiled with AVX2 enabled, picked at run time. No FMA: contraction
    //! would change the bits relative to the portable path.
    use super::{OutPtr, WeightRows};

    #[target_feature(enable = "avx2")]
    pub unsafe fn decode_rows_avx2(w: &WeightRows, r0: usize, buf: &mut [f32]) {
        unsafe { w.decode_rows_avx2(r0, buf) }
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn matvec_rows_avx2(
        xs: &[f32],
        m: usize,
        w: &WeightRows,
        r0: usize,
        r1: usize,
        dst: OutPtr,
    ) {
        unsafe { super::matvec_rows::<true>(xs, m, w, r0, r1, dst) }
    }
}

/// Rows `ids` of `w` widened to f32, `[ids.len(), cols]`; only those rows are decoded.
pub fn embedding(w: &Weight, ids: &[u32]) -> Result<Tensor> {
    let rows = WeightRows::new(w)?;
    let d = rows.cols();
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= rows.rows()) {
        return crate::error::invalid(
            "embedding",
            format!(
                "token id {bad} is outside the vocabulary of {} rows",
                rows.rows()
            ),
        );
    }
    let mut out = vec![0.0f32; ids.len() * d];
    if d > 0 {
        let isa = Isa::current();
        let one = |(o, &id): (&mut [f32], &u32)| decode_tile(&rows, id as usize, o, isa);
        if out.len() < PARALLEL_MIN_ELEMS {
            out.chunks_mut(d).zip(ids).for_each(one);
        } else {
            out.par_chunks_mut(d).zip(ids).for_each(one);
        }
    }
    Tensor::from_f32(&[ids.len(), d], out)
}

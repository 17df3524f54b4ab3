//! Causal GQA attention, flash style: each task owns one KV head and a block of query
//! positions (all query heads of that KV head's group), scores the block against key tiles
//! with a single-threaded gemm, and folds each tile into an online softmax. Tasks split the
//! output only, and a task's key tiles are always walked in the same order, so the result is
//! bit-identical for any thread count.
//!
//! Decode-sized calls (at most [`SMALL_T`] query positions) score and accumulate with the
//! kernels of `attention_decode` instead of gemm, whose packing dominated decode steps.

use rayon::prelude::*;

use super::attention_decode as decode;
use super::isa::Isa;
use super::unary::exp_approx;
use crate::params::AttnParams;
use crate::{Result, Tensor};

/// Score rows (query position × head of the GQA group) per task: enough to run the gemm
/// micro-kernels at full width, few enough that causal tasks of unequal size still balance.
const TASK_ROWS: usize = 64;
/// Keys scored per step of the online softmax; the score tile (`TASK_ROWS × KEY_TILE` f32)
/// stays in L2.
const KEY_TILE: usize = 256;
/// Calls with at most this many query positions (one decode token, or the up to 5 tokens of an
/// MTP verification) take [`Geometry::task_small`]: per row, the same bits whichever of them it
/// is. Not the matmuls' 8-row decode bound: a batched step runs attention per sequence, and a
/// longer piece of a prompt keeps the prefill tiling.
const SMALL_T: usize = 5;

pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    run(q, k, v, None, p)
}

/// [`attention`] over a paged cache: `k`, `v` are block pools `[Hk, Blocks·B, D]` and logical
/// key `j` lives in slot `table[j / B]·B + j % B`. Each key tile is gathered from its blocks
/// into a scratch tile and then scored exactly as a flat cache's tile would be (same tiles,
/// same order), so the result is bit-identical to [`attention`] on the same keys laid flat.
pub fn attention_paged(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (table, block): (&[u32], usize),
    p: &AttnParams,
) -> Result<Tensor> {
    run(q, k, v, Some(Pages { table, block }), p)
}

/// A block table and its block size.
#[derive(Clone, Copy)]
struct Pages<'a> {
    table: &'a [u32],
    block: usize,
}

fn run(q: &Tensor, k: &Tensor, v: &Tensor, pages: Option<Pages>, p: &AttnParams) -> Result<Tensor> {
    let (t_len, hq, d) = (q.dim(0), q.dim(1), q.dim(2));
    let (hk, cap) = (k.dim(0), k.dim(1));
    let (qs, ks, vs) = (q.f32s()?, k.f32s()?, v.f32s()?);
    let mut out = vec![0.0f32; t_len * hq * d];
    if out.is_empty() {
        return Tensor::from_f32(q.shape(), out);
    }
    let group = hq / hk;
    let block = TASK_ROWS.div_ceil(group).min(t_len);
    let blocks = t_len.div_ceil(block);
    let geom = Geometry {
        hq,
        d,
        group,
        p: *p,
    };
    let span = |b: usize| (b * block, ((b + 1) * block).min(t_len));
    // Read once here, on the calling thread (see `isa`).
    let isa = Isa::current();
    let tiles: Vec<Vec<f32>> = (0..hk * blocks)
        .into_par_iter()
        .map(|task| {
            let (h, b) = (task / blocks, task % blocks);
            let cache = h * cap * d..(h + 1) * cap * d;
            let keys = Keys {
                ks: &ks[cache.clone()],
                vs: &vs[cache],
                pages,
            };
            if t_len <= SMALL_T {
                geom.task_small(isa, qs, keys, h, span(b))
            } else {
                geom.task(isa, qs, keys, h, span(b))
            }
        })
        .collect();
    for (task, tile) in tiles.iter().enumerate() {
        let (h, b) = (task / blocks, task % blocks);
        let (t0, t1) = span(b);
        let w = group * d;
        for (t, src) in (t0..t1).zip(tile.chunks(w)) {
            let at = (t * hq + h * group) * d;
            out[at..at + w].copy_from_slice(src);
        }
    }
    Tensor::from_f32(q.shape(), out)
}

/// One KV head's keys and values `[Cap, D]`, flat or paged.
struct Keys<'a> {
    ks: &'a [f32],
    vs: &'a [f32],
    pages: Option<Pages<'a>>,
}

impl Keys<'_> {
    /// Keys and values `j0..j0+n` as contiguous `[n, D]` rows: slices of a flat cache, or
    /// gathered block by block into `scratch` for a paged one.
    fn tile<'s>(
        &'s self,
        (j0, n, d): (usize, usize, usize),
        scratch: &'s mut (Vec<f32>, Vec<f32>),
    ) -> (&'s [f32], &'s [f32]) {
        let Some(Pages { table, block }) = self.pages else {
            return (
                &self.ks[j0 * d..(j0 + n) * d],
                &self.vs[j0 * d..(j0 + n) * d],
            );
        };
        let (kt, vt) = scratch;
        kt.clear();
        vt.clear();
        let mut j = j0;
        while j < j0 + n {
            let run = (block - j % block).min(j0 + n - j);
            let slot = table[j / block] as usize * block + j % block;
            kt.extend_from_slice(&self.ks[slot * d..(slot + run) * d]);
            vt.extend_from_slice(&self.vs[slot * d..(slot + run) * d]);
            j += run;
        }
        (kt, vt)
    }
}

/// What every task needs besides its own slices.
struct Geometry {
    hq: usize,
    d: usize,
    group: usize,
    p: AttnParams,
}

impl Geometry {
    /// Keys `lo..hi` visible to query row `t` (causal, optionally windowed).
    fn keys(&self, t: usize) -> (usize, usize) {
        let pos = self.p.q_start + t;
        let lo = self.p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        (lo, pos + 1)
    }

    /// Score rows (of a task over `t0..t1`) that see `key`: query `t` sees it when
    /// `key <= q_start + t` and, with a window `w`, `q_start + t < key + w`. The rows form
    /// one range because they are ordered by position.
    fn rows_seeing(&self, key: usize, (t0, t1): (usize, usize)) -> (usize, usize) {
        let ta = key.saturating_sub(self.p.q_start).max(t0);
        let tb = self
            .p
            .window
            .map_or(t1, |w| (key + w).saturating_sub(self.p.q_start).min(t1));
        if ta >= tb {
            return (0, 0);
        }
        ((ta - t0) * self.group, (tb - t0) * self.group)
    }

    /// This KV head's query rows for positions `t0..t1`, `[(t - t0)·group + j, D]`.
    fn query_rows(&self, qs: &[f32], h: usize, (t0, t1): (usize, usize)) -> Vec<f32> {
        let (d, g) = (self.d, self.group);
        let mut qt = Vec::with_capacity((t1 - t0) * g * d);
        for t in t0..t1 {
            let at = (t * self.hq + h * g) * d;
            qt.extend_from_slice(&qs[at..at + g * d]);
        }
        qt
    }

    /// Output rows `(t, j)` for `t` in `t0..t1` and the group's heads `j`, `[rows, D]` with
    /// row `(t - t0)·group + j`. `keys` are this KV head's.
    ///
    /// Scores and the accumulator are kept column-major (`[key][row]`, `[dim][row]`): that is
    /// the layout gemm's micro-kernels write without transposing, and it makes the softmax
    /// bookkeeping (masking, running max and sum, rescaling) run along contiguous rows.
    fn task(
        &self,
        isa: Isa,
        qs: &[f32],
        keys: Keys,
        h: usize,
        (t0, t1): (usize, usize),
    ) -> Vec<f32> {
        let d = self.d;
        let m = (t1 - t0) * self.group;
        let qt = self.query_rows(qs, h, (t0, t1));
        let (first, _) = self.keys(t0);
        let (_, end) = self.keys(t1 - 1);
        let mut o = vec![0.0f32; d * m];
        let mut soft = Online::new(m);
        let mut scores = vec![0.0f32; m * KEY_TILE.min(end - first)];
        let mut scratch = (Vec::new(), Vec::new());
        for j0 in (first..end).step_by(KEY_TILE) {
            let nk = KEY_TILE.min(end - j0);
            let (ks, vs) = keys.tile((j0, nk, d), &mut scratch);
            let s = &mut scores[..m * nk];
            gemm_into(
                (m, nk, d),
                (s, 1, m),
                false,
                (&qt, d, 1),
                (ks, 1, d),
                self.p.scale,
            );
            soft.fold(isa, self, s, j0, (t0, t1));
            for col in o.chunks_mut(m) {
                col.iter_mut().zip(&soft.corr).for_each(|(x, &c)| *x *= c);
            }
            gemm_into((m, d, nk), (&mut o, 1, m), true, (s, 1, m), (vs, d, 1), 1.0);
        }
        let inv = soft.inverse_sums();
        let mut rows = vec![0.0f32; m * d];
        for (c, col) in o.chunks(m).enumerate() {
            for (r, (&x, &iv)) in col.iter().zip(&inv).enumerate() {
                rows[r * d + c] = x * iv;
            }
        }
        rows
    }

    /// [`Self::task`] for a decode-sized call (at most [`SMALL_T`] query positions): the same
    /// tiles and softmax, with the two products done by `attention_decode` instead of gemm,
    /// and the accumulator kept row-major.
    fn task_small(
        &self,
        isa: Isa,
        qs: &[f32],
        keys: Keys,
        h: usize,
        (t0, t1): (usize, usize),
    ) -> Vec<f32> {
        let d = self.d;
        let m = (t1 - t0) * self.group;
        let qt = self.query_rows(qs, h, (t0, t1));
        let (first, _) = self.keys(t0);
        let (_, end) = self.keys(t1 - 1);
        let mut o = vec![0.0f32; m * d];
        let mut soft = Online::new(m);
        let mut scores = vec![0.0f32; m * KEY_TILE.min(end - first)];
        let mut scratch = (Vec::new(), Vec::new());
        // Tiles end at multiples of KEY_TILE: each row's softmax then folds the same tiles
        // whichever rows share the call (keys a row does not see add exactly nothing).
        let mut j0 = first;
        while j0 < end {
            let nk = ((j0 / KEY_TILE + 1) * KEY_TILE).min(end) - j0;
            let (ks, vs) = keys.tile((j0, nk, d), &mut scratch);
            let s = &mut scores[..m * nk];
            decode::scores(isa, &qt, m, (ks, vs), nk, d, self.p.scale, s);
            soft.fold(isa, self, s, j0, (t0, t1));
            for (row, &c) in o.chunks_mut(d).zip(&soft.corr) {
                row.iter_mut().for_each(|x| *x *= c);
            }
            // The next tile's keys, for the kernel to prefetch (a flat cache's only: a paged
            // one gathers each tile when it gets there).
            let next = match keys.pages {
                None => &keys.ks[(j0 + nk) * d..end * d],
                Some(_) => &[],
            };
            decode::accumulate(isa, s, m, vs, nk, d, &mut o, next);
            j0 += nk;
        }
        for (row, iv) in o.chunks_mut(d).zip(soft.inverse_sums()) {
            row.iter_mut().for_each(|x| *x *= iv);
        }
        o
    }
}

/// The online softmax of one task's `m` score rows, folded one key tile at a time.
struct Online {
    run_max: Vec<f32>,
    run_sum: Vec<f32>,
    shift: Vec<f32>,
    /// After [`Online::fold`]: the factor each row's accumulator must be scaled by before the
    /// tile's values are added.
    corr: Vec<f32>,
    tile_sum: Vec<f32>,
}

impl Online {
    fn new(m: usize) -> Online {
        Online {
            run_max: vec![f32::NEG_INFINITY; m],
            run_sum: vec![0.0; m],
            shift: vec![0.0; m],
            corr: vec![0.0; m],
            tile_sum: vec![0.0; m],
        }
    }

    /// Masks (causal, window) and soft-caps the tile `s` (`[key][row]`, keys from `j0`) of a
    /// task over positions `t0..t1`, replaces each score by its exponential shifted by the
    /// new running max, and updates the running max and sum.
    fn fold(
        &mut self,
        isa: Isa,
        geom: &Geometry,
        s: &mut [f32],
        j0: usize,
        (t0, t1): (usize, usize),
    ) {
        let m = self.run_max.len();
        let mut tile_max = std::mem::take(&mut self.shift);
        tile_max.fill(f32::NEG_INFINITY);
        for (c, col) in s.chunks_mut(m).enumerate() {
            let (a, b) = geom.rows_seeing(j0 + c, (t0, t1));
            col[..a].fill(f32::NEG_INFINITY);
            col[b.max(a)..].fill(f32::NEG_INFINITY);
            let live = &mut col[a..b.max(a)];
            if let Some(cap) = geom.p.softcap {
                live.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
            }
            tile_max[a..b.max(a)]
                .iter_mut()
                .zip(live.iter())
                .for_each(|(mx, &x)| *mx = mx.max(x));
        }
        // New running max; a row with no visible key yet shifts by 0 instead, so its
        // masked scores give exp(-inf) = 0 rather than exp(-inf + inf) = NaN.
        self.shift = tile_max;
        for r in 0..m {
            let new_max = self.run_max[r].max(self.shift[r]);
            self.shift[r] = if new_max == f32::NEG_INFINITY {
                0.0
            } else {
                new_max
            };
            self.corr[r] = exp_approx(self.run_max[r] - self.shift[r]);
            self.run_max[r] = new_max;
        }
        // Shift, exponentiate, then sum per row in key order: three passes, so that the
        // exponentials (independent, the bulk of the work) run as one flat loop the compiler
        // vectorises, instead of one latency chain per score.
        for col in s.chunks_mut(m) {
            col.iter_mut()
                .zip(&self.shift)
                .for_each(|(x, &sh)| *x -= sh);
        }
        exp_in_place(isa, s);
        self.tile_sum.fill(0.0);
        for col in s.chunks(m) {
            self.tile_sum
                .iter_mut()
                .zip(col)
                .for_each(|(sum, &x)| *sum += x);
        }
        self.run_sum
            .iter_mut()
            .zip(&self.corr)
            .zip(&self.tile_sum)
            .for_each(|((l, &c), &t)| *l = *l * c + t);
    }

    /// `1 / Σ` per row. Every row sees at least its own position, so the sum is >= 1 unless
    /// inputs are NaN.
    fn inverse_sums(&self) -> Vec<f32> {
        self.run_sum.iter().map(|&l| 1.0 / l).collect()
    }
}

/// `x = exp_approx(x)` for every element: the same bits at every ISA level (the vector forms
/// are the same source compiled for wider registers; the polynomial has no fused steps).
fn exp_in_place(isa: Isa, s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 {
        #[target_feature(enable = "avx2")]
        fn wide(s: &mut [f32]) {
            s.iter_mut().for_each(|x| *x = exp_approx(*x));
        }
        // SAFETY: the CPU has AVX2.
        return unsafe { wide(s) };
    }
    let _ = isa;
    s.iter_mut().for_each(|x| *x = exp_approx(*x));
}

/// `dst = [dst +] beta · lhs · rhs` for an `m×n` destination; each matrix is given as
/// `(slice, row stride, column stride)`. Single-threaded: parallelism lives in the callers'
/// task split. Panics (a bug, not bad input) if a slice is too short for its strides.
fn gemm_into(
    (m, n, k): (usize, usize, usize),
    dst: (&mut [f32], usize, usize),
    accumulate: bool,
    lhs: (&[f32], usize, usize),
    rhs: (&[f32], usize, usize),
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(dst.0.len() > last(m, n, dst.1, dst.2));
    if k == 0 {
        if !accumulate {
            dst.0.fill(0.0);
        }
        return;
    }
    assert!(lhs.0.len() > last(m, k, lhs.1, lhs.2));
    assert!(rhs.0.len() > last(k, n, rhs.1, rhs.2));
    // SAFETY: the asserts above keep every element the strides address inside its slice, and
    // `dst` is borrowed mutably, so it cannot alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0.as_mut_ptr(),
            dst.2 as isize,
            dst.1 as isize,
            accumulate,
            lhs.0.as_ptr(),
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0.as_ptr(),
            rhs.2 as isize,
            rhs.1 as isize,
            1.0,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

pub fn kv_write(cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    let (t_len, hk, d) = (new.dim(0), new.dim(1), new.dim(2));
    let cap = cache.dim(1);
    let src = new.f32s()?;
    let dst = cache.f32s_mut()?;
    for t in 0..t_len {
        for h in 0..hk {
            let from = (t * hk + h) * d;
            let to = (h * cap + pos + t) * d;
            dst[to..to + d].copy_from_slice(&src[from..from + d]);
        }
    }
    Ok(())
}

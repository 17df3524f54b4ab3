//! Chunked Gated DeltaNet (docs/design.md §5) on MLX ops: the prefill path. The algebra and every
//! numerics choice follow the CPU version (`cpu::gdn::chunked`, whose header derives it):
//!
//! - every decay factor is `exp` of a *segment sum* of `g_log` over a stretch of steps, never a
//!   difference `G_i − G_j` of cumulative sums (which cancels, and gives `−inf − (−inf) = NaN`
//!   under strong decay); the segment sums come from one cumulative sum down the columns of a
//!   strictly-lower matrix holding `g_i` in row `i`, so each entry adds only its own stretch;
//! - gates are clamped at [`GATE_FLOOR`] first (what `gdn_gate` produces anyway), so a caller's
//!   `-inf` becomes a finite sum whose `exp` is exactly 0;
//! - masks are applied last with a select, never by multiplying;
//! - `(I + A)⁻¹` comes from forward substitution, row by row (`M_i = e_i − A_i M`), never from
//!   the overflowing repeated squaring;
//! - the last chunk runs with fewer rows; nothing is padded.
//!
//! Every op is batched over all value heads (`[Hv, L, D]` matmuls), and the parts that do not
//! depend on the state (decays, `P`, `M`, `U`, `W`) over a group of chunks at once, so only a
//! handful of small ops per chunk run in sequence.

use mlx_rs::{ops as mx, Array};

use super::ops::f32_array;
use super::{mlx_err, mlx_shape, tensor_of};
use crate::error::Result;
use crate::params::GATE_FLOOR;
use crate::Tensor;

/// Shorthand: MLX errors become `Error::Invalid` naming the op.
macro_rules! m {
    ($e:expr) => {
        $e.map_err(|e| mlx_err(OP, e))?
    };
}

const OP: &str = "gdn_chunked";

/// Chunks whose state-independent parts are built in one batch. Bounds both the memory of the
/// `[Hv, C, L, L]` intermediates and the graph between two evaluations of the state.
const GROUP_CHUNKS: usize = 16;

/// Same contract as `ops::gdn_chunked`: `q, k` `[T, Hk, Dk]`, `v` `[T, Hv, Dv]`, `g_log, beta`
/// `[T, Hv]`, `state` `[Hv, Dv, Dk]` (becomes an MLX tensor); returns `[T, Hv, Dv]`. Shapes and
/// dtypes are checked by the caller.
pub fn gdn_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
    chunk: usize,
) -> Result<Tensor> {
    let (t, hv, dv) = (v.dim(0), v.dim(1), v.dim(2));
    let sh = mlx_shape(OP, &[hv, dv])?;
    if t == 0 {
        return tensor_of(OP, m!(mx::zeros::<f32>(&[0, sh[0], sh[1]])));
    }
    let x = HeadMajor::new(q, k, v, g_log, beta)?;
    let l = chunk.clamp(1, t);
    let (full, tail) = (t / l, t % l);
    let mut s = f32_array(OP, state)?;
    let mut outs = Vec::with_capacity(full + 1);
    let mut c0 = 0;
    while c0 < full {
        let cn = GROUP_CHUNKS.min(full - c0);
        let prep = Prep::new(&x, c0 * l, cn, l)?;
        for c in 0..cn {
            outs.push(prep.advance(c, &mut s)?);
        }
        c0 += cn;
        // Another group follows: evaluate the state so the graph does not grow with T.
        if c0 < full {
            m!(s.eval());
        }
    }
    if tail > 0 {
        let prep = Prep::new(&x, full * l, 1, tail)?;
        outs.push(prep.advance(0, &mut s)?);
    }
    let y = m!(mx::concatenate(&outs, 1).and_then(|y| y.transpose_axes(&[1, 0, 2])));
    *state = tensor_of(OP, s)?;
    tensor_of(OP, y)
}

/// The inputs head-major, with key heads repeated so value head `h` sees key head
/// `h / (Hv/Hk)`: `q, k` `[Hv, T, Dk]`, `v` `[Hv, T, Dv]`, `g` (clamped) and `beta` `[Hv, T]`.
struct HeadMajor {
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    hv: i32,
    dk: i32,
    dv: i32,
}

impl HeadMajor {
    fn new(q: &Tensor, k: &Tensor, v: &Tensor, g_log: &Tensor, beta: &Tensor) -> Result<Self> {
        let sh = mlx_shape(
            OP,
            &[
                q.dim(0),
                q.dim(1),
                v.dim(1) / q.dim(1),
                q.dim(2),
                v.dim(1),
                v.dim(2),
            ],
        )?;
        let (t, hk, rep, dk, hv, dv) = (sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
        let keys = |x: &Tensor| -> Result<Array> {
            Ok(m!(f32_array(OP, x)?
                .reshape(&[t, hk, 1, dk])
                .and_then(|a| mx::broadcast_to(a, &[t, hk, rep, dk]))
                .and_then(|a| a.reshape(&[t, hv, dk]))
                .and_then(|a| a.transpose_axes(&[1, 0, 2]))))
        };
        let g = m!(f32_array(OP, g_log)?
            .transpose()
            .and_then(|g| mx::maximum(g, Array::from_f32(GATE_FLOOR))));
        Ok(HeadMajor {
            q: keys(q)?,
            k: keys(k)?,
            v: m!(f32_array(OP, v)?.transpose_axes(&[1, 0, 2])),
            g,
            beta: m!(f32_array(OP, beta)?.transpose()),
            hv,
            dk,
            dv,
        })
    }
}

/// The state-independent parts of `cn` consecutive chunks of `l` steps, batched as
/// `[Hv, cn, l, ..]`.
struct Prep {
    /// Masked scores `P = [(q kᵀ)⊙e^(G_i − G_j)]_{j≤i}`.
    p: Array,
    /// `U = M(β⊙v)`.
    u: Array,
    /// `W = M(β⊙e^G⊙k)`.
    w: Array,
    /// `e^G⊙q`.
    qe: Array,
    /// `k⊙e^(G_last − G)`.
    kt: Array,
    /// `e^(G_last)`, `[Hv, cn, 1, 1]`.
    last: Array,
}

impl Prep {
    fn new(x: &HeadMajor, t0: usize, cn: usize, l: usize) -> Result<Self> {
        let n = mlx_shape(OP, &[cn, l])?;
        let (c, li) = (n[0], n[1]);
        let span = |a: &Array, d: Option<i32>| -> Result<Array> {
            let a = time_range(a, t0, cn * l)?;
            Ok(match d {
                Some(d) => m!(a.reshape(&[x.hv, c, li, d])),
                None => m!(a.reshape(&[x.hv, c, li])),
            })
        };
        let (q, k, v) = (
            span(&x.q, Some(x.dk))?,
            span(&x.k, Some(x.dk))?,
            span(&x.v, Some(x.dv))?,
        );
        let (g, b) = (span(&x.g, None)?, span(&x.beta, None)?);

        // seg[i][j] = Σ_{m=j+1..i} g_m for i > j (0 elsewhere): the column-wise cumulative sum
        // of a matrix holding g_i in row i strictly below the diagonal.
        let strict = lower_mask(l, false);
        let incl = lower_mask(l, true);
        let rows = m!(mx::broadcast_to(m!(g.expand_dims(-1)), &[x.hv, c, li, li]));
        let seg = m!(mx::select(&strict, &rows, Array::from_f32(0.0))
            .and_then(|r| r.cumsum(-2, false, true)));
        let decay = m!(mx::exp(&seg));
        // e^(G_i): G_i = Σ_{m≤i} g_m, a sum from the chunk start (no difference taken).
        let head = m!(g.cumsum(-1, false, true).and_then(mx::exp));
        // e^(G_last − G_j) is the last row of the segment decays.
        let tail = m!(pick(&decay, -2, l - 1));
        let last = m!(pick(&head, -1, l - 1).and_then(|e| e.reshape(&[x.hv, c, 1, 1])));

        let kt_t = m!(k.swap_axes(-1, -2));
        let qk = m!(mx::matmul(&q, &kt_t));
        let kk = m!(mx::matmul(&k, &kt_t));
        let col = |a: &Array| a.expand_dims(-1);
        let bcol = m!(col(&b));
        let zero = Array::from_f32(0.0);
        let p = m!(qk
            .multiply(&decay)
            .and_then(|s| mx::select(&incl, s, &zero)));
        let a = m!(bcol
            .multiply(&kk)
            .and_then(|s| s.multiply(&decay))
            .and_then(|s| mx::select(&strict, s, &zero)));
        let mi = unit_lower_inverse(&a, l)?;
        let u = m!(v.multiply(&bcol).and_then(|bv| mx::matmul(&mi, bv)));
        let w = m!(b
            .multiply(&head)
            .and_then(|be| col(&be))
            .and_then(|be| k.multiply(be))
            .and_then(|bk| mx::matmul(&mi, bk)));
        let qe = m!(col(&head).and_then(|e| q.multiply(e)));
        let kt = m!(col(&tail).and_then(|e| k.multiply(e)));
        Ok(Prep {
            p,
            u,
            w,
            qe,
            kt,
            last,
        })
    }

    /// Runs chunk `c` of the group from state `s` (`[Hv, Dv, Dk]`, advanced in place):
    /// `Δ = U − W Sᵀ`, `o = e^G⊙(q Sᵀ) + P Δ`, `S ← e^(G_last) S + Δᵀ (k⊙e^(G_last − G))`.
    /// Returns `o` `[Hv, l, Dv]`.
    fn advance(&self, c: usize, s: &mut Array) -> Result<Array> {
        let at = |a: &Array| -> Result<Array> { Ok(m!(pick(a, 1, c))) };
        let (p, u, w, qe, kt, last) = (
            at(&self.p)?,
            at(&self.u)?,
            at(&self.w)?,
            at(&self.qe)?,
            at(&self.kt)?,
            at(&self.last)?,
        );
        let st = m!(s.swap_axes(-1, -2));
        let delta = m!(mx::matmul(&w, &st).and_then(|ws| u.subtract(ws)));
        let o = m!(mx::matmul(&qe, &st).and_then(|o| o.add(mx::matmul(&p, &delta)?)));
        let upd = m!(delta.swap_axes(-1, -2).and_then(|dt| mx::matmul(dt, &kt)));
        *s = m!(s.multiply(&last).and_then(|d| d.add(upd)));
        Ok(o)
    }
}

/// `M = (I + A)⁻¹` for `a` `[.., n, n]` strictly lower triangular (batched): forward
/// substitution, row by row, `M_i = e_i − A_i M`. `M` starts as `I`; when row `i` is formed,
/// rows `< i` are final and the identity rows `≥ i` meet only zeros of `A_i`, so every row is
/// built from rows already exact to rounding (no powers of `A`, nothing that can overflow).
pub(crate) fn unit_lower_inverse(a: &Array, n: usize) -> Result<Array> {
    let ni = mlx_shape(OP, &[n])?[0];
    let mut m = m!(mx::broadcast_to(
        m!(mx::eye::<f32>(ni, None, None)),
        a.shape()
    ));
    for i in 1..n {
        let e: Vec<f32> = (0..n).map(|j| if j == i { 1.0 } else { 0.0 }).collect();
        let e = Array::from_slice(&e, &[1, ni]);
        let row = m!(pick_keep(a, -2, i).and_then(|ai| e.subtract(mx::matmul(ai, &m)?)));
        let which: Vec<bool> = (0..n).map(|j| j == i).collect();
        let which = Array::from_slice(&which, &[ni, 1]);
        m = m!(mx::select(&which, &row, &m));
    }
    Ok(m)
}

/// `[n, n]` mask of `j < i` (or `j ≤ i` when `inclusive`).
fn lower_mask(n: usize, inclusive: bool) -> Array {
    let v: Vec<bool> = (0..n * n)
        .map(|x| {
            let (i, j) = (x / n, x % n);
            j < i || (inclusive && i == j)
        })
        .collect();
    Array::from_slice(&v, &[n as i32, n as i32])
}

/// Steps `t0..t0+len` of a head-major array (time on axis 1).
fn time_range(a: &Array, t0: usize, len: usize) -> Result<Array> {
    if t0 == 0 && a.shape()[1] as usize == len {
        return Ok(a.clone());
    }
    let idx: Vec<i32> = (t0..t0 + len).map(|i| i as i32).collect();
    Ok(m!(a.take_axis(Array::from_slice(&idx, &[len as i32]), 1)))
}

/// Index `i` along `axis`, dropping the axis.
fn pick(a: &Array, axis: i32, i: usize) -> std::result::Result<Array, mlx_rs::error::Exception> {
    a.take_axis(Array::from_int(i as i32), axis)
}

/// Index `i` along `axis`, keeping the axis (length 1).
fn pick_keep(
    a: &Array,
    axis: i32,
    i: usize,
) -> std::result::Result<Array, mlx_rs::error::Exception> {
    a.take_axis(Array::from_slice(&[i as i32], &[1]), axis)
}

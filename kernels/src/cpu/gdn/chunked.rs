//! The chunked form of the recurrence (docs/design.md §5), for prefill: the steps of a chunk of `L`
//! tokens are folded into a few matrix products run by `gemm`, and the state is touched once
//! per chunk instead of once per token.
//!
//! Within a chunk with start state `S`, write `Gᵢ` for the cumulative log-decay up to step `i`.
//! Unrolling the per-step rule gives the corrections `Δ` (the `δ`s) as the solution of a unit
//! lower-triangular system, `(I + A)Δ = β⊙v − (β⊙e^G⊙k) Sᵀ` with
//! `A_ij = β_i (k_i·k_j) e^(G_i − G_j)` (`j < i`). With `M = (I + A)⁻¹`, `U = M(β⊙v)` and
//! `W = M(β⊙e^G⊙k)`:
//!   `Δ = U − W Sᵀ`,
//!   `o = e^G⊙(q Sᵀ) + [(q kᵀ)⊙e^(G_i − G_j)]_{j≤i} Δ`,
//!   `S ← e^(G_last) S + Δᵀ (k⊙e^(G_last − G))`.
//!
//! Numerics, all in f32:
//! - Every decay factor is `exp` of a sum of `g_log` over a stretch of steps, computed as that
//!   sum directly, never as a difference of cumulative sums: `G_i − G_j` cancels catastrophically
//!   (and gives `−inf − (−inf) = NaN` at the floor) once one strong gate makes `G` huge, while
//!   the segment sums stay exact to rounding. Each exponent is ≤ 0, so nothing overflows.
//! - Entries above the diagonal are written as zeros (a select), never computed as a product with
//!   `exp` of a positive exponent.
//! - `M` comes from forward substitution (`tri`), not the overflowing repeated squaring.
//! - The last chunk simply runs with fewer rows; nothing is padded.

use gemm::Parallelism;

use super::{tri::unit_lower_inverse, Inputs};
use crate::{Result, Tensor};

pub fn chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
    chunk: usize,
) -> Result<Tensor> {
    let x = Inputs::new(q, k, v, g_log, beta)?;
    let out = x.run_heads(state.f32s_mut()?, |h, s| {
        let mut ws = Workspace::new(chunk.min(x.t), x.dk, x.dv);
        let mut y = vec![0.0f32; x.t * x.dv];
        for t0 in (0..x.t).step_by(chunk) {
            let n = chunk.min(x.t - t0);
            ws.chunk(&x, h, t0, n, s, &mut y[t0 * x.dv..(t0 + n) * x.dv]);
        }
        y
    });
    Tensor::from_f32(&[x.t, x.hv, x.dv], out)
}

/// One head's scratch, sized for the longest chunk and reused across chunks. Matrices are
/// row-major with the chunk length `n` of the moment as their leading dimension.
struct Workspace {
    g: Vec<f32>,
    beta: Vec<f32>,
    /// `e^(G_i)`: decay from the chunk start through step `i`.
    head_decay: Vec<f32>,
    /// `e^(G_last − G_j)`: decay after step `j` to the chunk end.
    tail_decay: Vec<f32>,
    /// `e^(G_i − G_j)` for `j ≤ i` (the rest is never read).
    decay: Vec<f32>,
    /// `[q; k] kᵀ` (`2n × n`), then the masked scores `P` on top and `A` below.
    scores: Vec<f32>,
    /// `(I + A)⁻¹`.
    m: Vec<f32>,
    /// `[q; k]` gathered (`2n × Dk`), then `[−e^G⊙q; W]`.
    kq: Vec<f32>,
    /// `β⊙e^G⊙k`, then `k⊙e^(G_last − G)` (`n × Dk`).
    kw: Vec<f32>,
    /// `β⊙v` (`n × Dv`).
    bv: Vec<f32>,
    /// `[o; Δ]` (`2n × Dv`).
    od: Vec<f32>,
}

impl Workspace {
    fn new(l: usize, dk: usize, dv: usize) -> Self {
        Workspace {
            g: vec![0.0; l],
            beta: vec![0.0; l],
            head_decay: vec![0.0; l],
            tail_decay: vec![0.0; l],
            decay: vec![0.0; l * l],
            scores: vec![0.0; 2 * l * l],
            m: vec![0.0; l * l],
            kq: vec![0.0; 2 * l * dk],
            kw: vec![0.0; l * dk],
            bv: vec![0.0; l * dv],
            od: vec![0.0; 2 * l * dv],
        }
    }

    /// Steps `t0..t0+n` of head `h`: writes their outputs into `y` (`n × Dv`) and advances `s`.
    fn chunk(&mut self, x: &Inputs, h: usize, t0: usize, n: usize, s: &mut [f32], y: &mut [f32]) {
        let (dk, dv) = (x.dk, x.dv);
        self.decays(x, h, t0, n);

        // [q; k] kᵀ: the query–key scores on top, the key Gram matrix below.
        let (qd, kd) = self.kq[..2 * n * dk].split_at_mut(n * dk);
        for i in 0..n {
            let at = x.kq_at(t0 + i, h);
            qd[i * dk..(i + 1) * dk].copy_from_slice(&x.q[at..at + dk]);
            kd[i * dk..(i + 1) * dk].copy_from_slice(&x.k[at..at + dk]);
        }
        let qk = View::rows(&self.kq[..2 * n * dk], dk);
        let k_rows = View::rows(&self.kq[n * dk..2 * n * dk], dk);
        mat_mul(&mut self.scores, n, 2 * n, n, dk, None, qk, k_rows.t(), 1.0);

        // The inclusive masked scores P over the query part and A (strictly lower) over the
        // Gram part; everything above the diagonal is a plain zero (a select, not a product).
        let (p, a) = self.scores[..2 * n * n].split_at_mut(n * n);
        for i in 0..n {
            let dec = &self.decay[i * n..(i + 1) * n];
            let b = self.beta[i];
            for j in 0..n {
                p[i * n + j] = if j <= i { p[i * n + j] * dec[j] } else { 0.0 };
                a[i * n + j] = if j < i {
                    b * a[i * n + j] * dec[j]
                } else {
                    0.0
                };
            }
        }
        unit_lower_inverse(a, n, &mut self.m);

        // U = M(β⊙v) into the Δ half of `od`; W = M(β⊙e^G⊙k) over the k half of `kq`, whose
        // q half becomes −e^G⊙q.
        for i in 0..n {
            let at = (t0 + i) * x.hv + h;
            let (b, e) = (self.beta[i], self.head_decay[i]);
            let v = &x.v[at * dv..(at + 1) * dv];
            for (o, &vv) in self.bv[i * dv..(i + 1) * dv].iter_mut().zip(v) {
                *o = b * vv;
            }
            let be = b * e;
            let k = &self.kq[(n + i) * dk..(n + i + 1) * dk];
            for (o, &kk) in self.kw[i * dk..(i + 1) * dk].iter_mut().zip(k) {
                *o = be * kk;
            }
        }
        let m = View::rows(&self.m[..n * n], n);
        let (o, delta) = self.od[..2 * n * dv].split_at_mut(n * dv);
        mat_mul(delta, dv, n, dv, n, None, m, View::rows(&self.bv, dv), 1.0);
        o.fill(0.0);
        let (qe, w) = self.kq[..2 * n * dk].split_at_mut(n * dk);
        mat_mul(w, dk, n, dk, n, None, m, View::rows(&self.kw, dk), 1.0);
        for i in 0..n {
            let e = -self.head_decay[i];
            qe[i * dk..(i + 1) * dk].iter_mut().for_each(|v| *v *= e);
        }

        // [o; Δ] = [0; U] − [−e^G⊙q; W] Sᵀ = [e^G⊙(q Sᵀ); U − W Sᵀ].
        let s_rows = View::rows(s, dk);
        let qw = View::rows(&self.kq[..2 * n * dk], dk);
        mat_mul(
            &mut self.od,
            dv,
            2 * n,
            dv,
            dk,
            Some(1.0),
            qw,
            s_rows.t(),
            -1.0,
        );

        // o += P Δ.
        let (o, delta) = self.od[..2 * n * dv].split_at_mut(n * dv);
        let p = View::rows(&self.scores[..n * n], n);
        mat_mul(o, dv, n, dv, n, Some(1.0), p, View::rows(delta, dv), 1.0);
        y.copy_from_slice(o);

        // S ← e^(G_last) S + Δᵀ (k⊙e^(G_last − G)).
        for i in 0..n {
            let e = self.tail_decay[i];
            let at = x.kq_at(t0 + i, h);
            let k = &x.k[at..at + dk];
            for (o, &kk) in self.kw[i * dk..(i + 1) * dk].iter_mut().zip(k) {
                *o = e * kk;
            }
        }
        let last = self.head_decay[n - 1];
        let delta_t = View::rows(delta, dv).t();
        let kt = View::rows(&self.kw[..n * dk], dk);
        mat_mul(s, dk, dv, dk, n, Some(last), delta_t, kt, 1.0);
    }

    /// Gates of the chunk and every decay factor, each as `exp` of a direct segment sum.
    fn decays(&mut self, x: &Inputs, h: usize, t0: usize, n: usize) {
        for i in 0..n {
            let at = (t0 + i) * x.hv + h;
            self.g[i] = x.g[at];
            self.beta[i] = x.beta[at];
        }
        let g = &self.g[..n];
        let mut sum = 0.0f32;
        for (e, &gi) in self.head_decay.iter_mut().zip(g) {
            sum += gi;
            *e = sum.exp();
        }
        let mut sum = 0.0f32;
        for j in (0..n).rev() {
            self.tail_decay[j] = sum.exp();
            sum += g[j];
        }
        let d = &mut self.decay[..n * n];
        for j in 0..n {
            d[j * n + j] = 1.0;
            let mut sum = 0.0f32;
            for i in j + 1..n {
                sum += g[i];
                d[i * n + j] = sum.exp();
            }
        }
    }
}

/// A matrix inside a slice: element `(r, c)` sits at `data[r·rs + c·cs]`.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    fn rows(data: &'a [f32], ld: usize) -> Self {
        View {
            data,
            rs: ld,
            cs: 1,
        }
    }

    /// The transpose, without moving anything.
    fn t(self) -> Self {
        View {
            data: self.data,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Panics unless every element of an `r × c` matrix lies inside `data`.
    fn check(&self, r: usize, c: usize) {
        if r > 0 && c > 0 {
            assert!((r - 1) * self.rs + (c - 1) * self.cs < self.data.len());
        }
    }
}

/// `dst = alpha·dst + beta·lhs·rhs` (`dst` row-major with leading dimension `ld`, `m × n`;
/// `alpha = None` overwrites it), on the calling thread: a head's work is never split, so its
/// bits do not depend on the thread count.
#[allow(clippy::too_many_arguments)]
fn mat_mul(
    dst: &mut [f32],
    ld: usize,
    m: usize,
    n: usize,
    k: usize,
    alpha: Option<f32>,
    lhs: View,
    rhs: View,
    beta: f32,
) {
    lhs.check(m, k);
    rhs.check(k, n);
    if m > 0 && n > 0 {
        assert!((m - 1) * ld + n <= dst.len());
    }
    // SAFETY: the checks above keep every element gemm reads or writes inside its slice, and
    // `dst` is borrowed mutably, so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld as isize,
            alpha.is_some(),
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            alpha.unwrap_or(0.0),
            beta,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

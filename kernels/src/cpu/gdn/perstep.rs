//! The per-step recurrence, the reference every other path is checked against and the only
//! path decode uses: `S ← e^g·S; δ = β(v − S k); S ← S + δ kᵀ; y = S q`.
//!
//! Row `r` of a head's state `[Dv, Dk]` evolves on its own (it reads only `k_t`, `q_t` and
//! `v_t[r]`), so the loops run a block of rows through a tile of steps while both stay in L1,
//! instead of streaming the whole state through the cache once per token. Reordering
//! independent rows changes no arithmetic: the bits equal the plain step-by-step loop.

use super::Inputs;
use crate::{Result, Tensor};

/// State rows kept hot together (`ROW_BLOCK · Dk` floats: 8 KiB at Dk = 128).
const ROW_BLOCK: usize = 16;
/// Steps walked per pass over a row block (their `k`, `q` rows: 64 KiB at Dk = 128).
const STEP_TILE: usize = 64;
/// Independent partial sums per dot product, reduced in a fixed tree.
const LANES: usize = 16;

pub fn recurrent(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
) -> Result<Tensor> {
    let x = Inputs::new(q, k, v, g_log, beta)?;
    let out = x.run_heads(state.f32s_mut()?, |h, s| run_head(&x, h, s));
    Tensor::from_f32(&[x.t, x.hv, x.dv], out)
}

fn run_head(x: &Inputs, h: usize, s: &mut [f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { run_head_avx2(x, h, s) };
    }
    run_head_portable(x, h, s)
}

/// The same loops compiled with AVX2; no FMA, so the bits match the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_head_avx2(x: &Inputs, h: usize, s: &mut [f32]) -> Vec<f32> {
    run_head_portable(x, h, s)
}

#[inline(always)]
fn run_head_portable(x: &Inputs, h: usize, s: &mut [f32]) -> Vec<f32> {
    let (dk, dv) = (x.dk, x.dv);
    let mut y = vec![0.0f32; x.t * dv];
    for t0 in (0..x.t).step_by(STEP_TILE) {
        let steps = t0..(t0 + STEP_TILE).min(x.t);
        for (b, rows) in s.chunks_mut(ROW_BLOCK * dk).enumerate() {
            for t in steps.clone() {
                let kq = x.kq_at(t, h);
                let (k, q) = (&x.k[kq..kq + dk], &x.q[kq..kq + dk]);
                let at = t * x.hv + h;
                let (decay, beta) = (x.g[at].exp(), x.beta[at]);
                let v = &x.v[at * dv..(at + 1) * dv];
                let y = &mut y[t * dv..(t + 1) * dv];
                for (i, row) in rows.chunks_exact_mut(dk).enumerate() {
                    let r = b * ROW_BLOCK + i;
                    y[r] = step_row(row, k, q, decay, beta, v[r]);
                }
            }
        }
    }
    y
}

/// One step of one state row; returns the row's output `y_t[r]`.
#[inline(always)]
fn step_row(row: &mut [f32], k: &[f32], q: &[f32], decay: f32, beta: f32, v: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut rc = row.chunks_exact_mut(LANES);
    let mut kc = k.chunks_exact(LANES);
    for (r, k) in (&mut rc).zip(&mut kc) {
        for l in 0..LANES {
            r[l] *= decay;
            acc[l] += r[l] * k[l];
        }
    }
    for (l, (r, k)) in rc.into_remainder().iter_mut().zip(kc.remainder()).enumerate() {
        *r *= decay;
        acc[l] += *r * k;
    }
    let delta = beta * (v - reduce(acc));

    let mut acc = [0.0f32; LANES];
    let mut rc = row.chunks_exact_mut(LANES);
    let (mut kc, mut qc) = (k.chunks_exact(LANES), q.chunks_exact(LANES));
    for ((r, k), q) in (&mut rc).zip(&mut kc).zip(&mut qc) {
        for l in 0..LANES {
            r[l] += delta * k[l];
            acc[l] += r[l] * q[l];
        }
    }
    let tail = rc.into_remainder().iter_mut().zip(kc.remainder());
    for (l, ((r, k), q)) in tail.zip(qc.remainder()).enumerate() {
        *r += delta * k;
        acc[l] += *r * q;
    }
    reduce(acc)
}

/// Pairwise sum of the lanes in a fixed order.
#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

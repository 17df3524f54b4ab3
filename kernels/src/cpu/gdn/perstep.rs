//! The per-step recurrence, the reference every other path is checked against and the only
//! path decode uses: `S ← e^g·S; δ = β(v − S k); S ← S + δ kᵀ; y = S q`.
//!
//! Row `r` of a head's state `[Dv, Dk]` evolves on its own (it reads only `k_t`, `q_t` and
//! `v_t[r]`), so the loops run a block of rows through a tile of steps while both stay in L1,
//! instead of streaming the whole state through the cache once per token. Reordering
//! independent rows changes no arithmetic: the bits equal the plain step-by-step loop.

use super::Inputs;
use crate::cpu::tree_sum;
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
    let isa = crate::cpu::isa::Isa::current();
    let out = x.run_heads(state.f32s_mut()?, |h, s| run_head(&x, h, s, isa));
    Tensor::from_f32(&[x.t, x.hv, x.dv], out)
}

fn run_head(x: &Inputs, h: usize, s: &mut [f32], isa: crate::cpu::isa::Isa) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { run_head_avx2(x, h, s) };
    }
    let _ = isa;
    run_tiles(x, h, s, step_row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_head_avx2(x: &Inputs, h: usize, s: &mut [f32]) -> Vec<f32> {
    // SAFETY: this function only runs on CPUs with AVX2.
    run_tiles(x, h, s, |r, k, q, d, b, v| unsafe {
        avx2::step_row(r, k, q, d, b, v)
    })
}

/// Walks head `h` through all steps, a block of state rows at a time; `step` advances one
/// row by one step (see [`step_row`]).
#[inline(always)]
fn run_tiles(
    x: &Inputs,
    h: usize,
    s: &mut [f32],
    step: impl Fn(&mut [f32], &[f32], &[f32], f32, f32, f32) -> f32,
) -> Vec<f32> {
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
                    y[r] = step(row, k, q, decay, beta, v[r]);
                }
            }
        }
    }
    y
}

/// One step of one state row; returns the row's output `y_t[r]`. Element `i` feeds partial
/// sum `i % LANES`, every product is rounded before it is added (no FMA), and the partial
/// sums meet in [`tree_sum`]'s fixed tree: the AVX2 version follows exactly these steps, so
/// both give the same bits.
fn step_row(row: &mut [f32], k: &[f32], q: &[f32], decay: f32, beta: f32, v: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (i, (r, &kk)) in row.iter_mut().zip(k).enumerate() {
        *r *= decay;
        acc[i % LANES] += *r * kk;
    }
    let delta = beta * (v - tree_sum(acc));
    let mut acc = [0.0f32; LANES];
    for (i, ((r, &kk), &qq)) in row.iter_mut().zip(k).zip(q).enumerate() {
        *r += delta * kk;
        acc[i % LANES] += *r * qq;
    }
    tree_sum(acc)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;
    use crate::cpu::tree_sum;

    /// [`super::step_row`] with AVX2 intrinsics: partial sums `0..8` and `8..16` in two
    /// registers, the same multiplies and adds in the same order (no FMA), and the ragged end
    /// done as the portable code does it.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn step_row(
        row: &mut [f32],
        k: &[f32],
        q: &[f32],
        decay: f32,
        beta: f32,
        v: f32,
    ) -> f32 {
        let n = row.len();
        assert!(k.len() == n && q.len() == n);
        let full = n / LANES * LANES;
        let (rp, kp, qp) = (row.as_mut_ptr(), k.as_ptr(), q.as_ptr());
        let mut acc = [0.0f32; LANES];

        // SAFETY (both loops): `i + 16 <= full <= n`, the length of all three slices.
        let dec = _mm256_set1_ps(decay);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..full).step_by(LANES) {
            unsafe {
                let r0 = _mm256_mul_ps(_mm256_loadu_ps(rp.add(i)), dec);
                let r1 = _mm256_mul_ps(_mm256_loadu_ps(rp.add(i + 8)), dec);
                _mm256_storeu_ps(rp.add(i), r0);
                _mm256_storeu_ps(rp.add(i + 8), r1);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(r0, _mm256_loadu_ps(kp.add(i))));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(r1, _mm256_loadu_ps(kp.add(i + 8))));
            }
        }
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), a0);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), a1);
        }
        for i in full..n {
            row[i] *= decay;
            acc[i % LANES] += row[i] * k[i];
        }
        let delta = beta * (v - tree_sum(acc));

        let d = _mm256_set1_ps(delta);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..full).step_by(LANES) {
            unsafe {
                let k0 = _mm256_loadu_ps(kp.add(i));
                let k1 = _mm256_loadu_ps(kp.add(i + 8));
                let r0 = _mm256_add_ps(_mm256_loadu_ps(rp.add(i)), _mm256_mul_ps(d, k0));
                let r1 = _mm256_add_ps(_mm256_loadu_ps(rp.add(i + 8)), _mm256_mul_ps(d, k1));
                _mm256_storeu_ps(rp.add(i), r0);
                _mm256_storeu_ps(rp.add(i + 8), r1);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(r0, _mm256_loadu_ps(qp.add(i))));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(r1, _mm256_loadu_ps(qp.add(i + 8))));
            }
        }
        let mut acc = [0.0f32; LANES];
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), a0);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), a1);
        }
        for i in full..n {
            row[i] += delta * k[i];
            acc[i % LANES] += row[i] * q[i];
        }
        tree_sum(acc)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The AVX2 row step must reproduce the portable one bit for bit, ragged ends included.
    #[test]
    fn avx2_step_matches_portable_bits() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut seed = 0x1234_5678u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 - 0.5
        };
        for n in [1usize, 7, 16, 20, 33, 64, 128, 130] {
            let (k, q): (Vec<f32>, Vec<f32>) = (0..n).map(|_| (next(), next())).unzip();
            let mut a: Vec<f32> = (0..n).map(|_| next()).collect();
            let mut b = a.clone();
            for _ in 0..5 {
                let (decay, beta, v) = (0.9 + 0.1 * next(), 0.5 + next(), next());
                let ya = step_row(&mut a, &k, &q, decay, beta, v);
                // SAFETY: AVX2 checked above.
                let yb = unsafe { avx2::step_row(&mut b, &k, &q, decay, beta, v) };
                assert_eq!(ya.to_bits(), yb.to_bits(), "n = {n}");
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
        }
    }
}

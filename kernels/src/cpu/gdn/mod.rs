//! Gated DeltaNet on the CPU (docs/design.md §5): the log-space decay gate, the per-step recurrence
//! (reference and decode path), the chunked algorithm (prefill), the triangular inverse it
//! rests on, and the depthwise causal conv that feeds q, k, v.
//!
//! Shapes (one sequence): `q, k` `[T, Hk, Dk]`, `v` `[T, Hv, Dv]`, `g_log, beta` `[T, Hv]`,
//! state `[Hv, Dv, Dk]`, output `[T, Hv, Dv]`; value head `h` reads key head `h / (Hv/Hk)`.
//! Both paths give each value head to one task that walks time in order, so a head's bits
//! never depend on the thread count.

mod chunked;
mod conv;
mod gate;
mod perstep;
mod tri;

pub use crate::params::GATE_FLOOR;
pub use chunked::chunked;
pub use conv::causal_conv1d;
pub use gate::gate;
pub use perstep::recurrent;
pub use tri::unit_lower_inverse;

use rayon::prelude::*;

use crate::{Result, Tensor};

/// Below this many state updates (`T·Hv·Dv·Dk`) the heads run on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// The sizes of one call and its inputs as f32 slices (shapes already checked by `ops`).
struct Inputs<'a> {
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

impl<'a> Inputs<'a> {
    fn new(
        q: &'a Tensor,
        k: &'a Tensor,
        v: &'a Tensor,
        g_log: &'a Tensor,
        beta: &'a Tensor,
    ) -> Result<Self> {
        Ok(Inputs {
            t: q.dim(0),
            hk: q.dim(1),
            hv: v.dim(1),
            dk: q.dim(2),
            dv: v.dim(2),
            q: q.f32s()?,
            k: k.f32s()?,
            v: v.f32s()?,
            g: g_log.f32s()?,
            beta: beta.f32s()?,
        })
    }

    fn key_head(&self, h: usize) -> usize {
        h / (self.hv / self.hk)
    }

    /// Offset of key/query row `(t, key head of h)`.
    fn kq_at(&self, t: usize, h: usize) -> usize {
        (t * self.hk + self.key_head(h)) * self.dk
    }

    /// Runs `head(h, state_h)` (which returns that head's `[T, Dv]` output) for every value
    /// head and interleaves the results into `[T, Hv, Dv]`.
    fn run_heads(
        &self,
        state: &mut [f32],
        head: impl Fn(usize, &mut [f32]) -> Vec<f32> + Sync + Send,
    ) -> Vec<f32> {
        let per_head = self.dv * self.dk;
        let heads: Vec<Vec<f32>> = if self.t * self.hv * per_head < PARALLEL_MIN_WORK {
            state
                .chunks_mut(per_head)
                .enumerate()
                .map(|(h, s)| head(h, s))
                .collect()
        } else {
            state
                .par_chunks_mut(per_head)
                .enumerate()
                .map(|(h, s)| head(h, s))
                .collect()
        };
        let mut out = vec![0.0f32; self.t * self.hv * self.dv];
        for (h, y) in heads.iter().enumerate() {
            for (t, row) in y.chunks_exact(self.dv).enumerate() {
                let at = (t * self.hv + h) * self.dv;
                out[at..at + self.dv].copy_from_slice(row);
            }
        }
        out
    }
}

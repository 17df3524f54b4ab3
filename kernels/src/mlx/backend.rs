//! MLX's implementation of the op list: each method forwards to the module that builds the op's
//! MLX graph. Argmax, top-k and the finiteness check read the values on the host.

use super::{gdn, moe, more, ops};
use crate::backend::{Backend, Gdn};
use crate::params::{AttnParams, RopeLayout, Unary};
use crate::{Device, Result, Tensor, Weight};

/// The MLX backend: MLX's default device (Metal on a Mac, the CPU elsewhere).
pub(crate) struct Mlx;

impl Backend for Mlx {
    fn matmul(&self, x: &Tensor, w: &Weight) -> Result<Tensor> {
        ops::matmul(x, w)
    }

    fn matmul_many(&self, x: &Tensor, ws: &[&Weight]) -> Result<Vec<Tensor>> {
        ws.iter().map(|w| ops::matmul(x, w)).collect()
    }

    fn gather_matmul(
        &self,
        x: &Tensor,
        w: &Weight,
        experts: usize,
        rows: &[u32],
        ids: &[u32],
    ) -> Result<Tensor> {
        moe::gather_matmul(x, w, experts, rows, ids)
    }

    fn embedding(&self, w: &Weight, ids: &[u32]) -> Result<Tensor> {
        more::embedding(w, ids)
    }

    fn rms_norm(&self, x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        ops::rms_norm(x, w, eps)
    }

    /// With `θ` known, MLX derives the frequencies itself, as mlx-lm's `nn.RoPE` does, and the
    /// result equals mlx-lm's bit for bit (its frequencies differ from `inv_freq` in the last
    /// f32 bits).
    fn rope(
        &self,
        x: &Tensor,
        positions: &[usize],
        inv_freq: &[f32],
        base: Option<f32>,
        layout: RopeLayout,
    ) -> Result<Tensor> {
        match base {
            Some(base) => ops::rope_base(x, positions, inv_freq.len(), base, layout),
            None => ops::rope(x, positions, inv_freq, layout),
        }
    }

    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
        more::attention(q, k, v, p)
    }

    fn attention_paged(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        table: (&[u32], usize),
        p: &AttnParams,
    ) -> Result<Tensor> {
        more::attention_paged(q, k, v, table, p)
    }

    fn kv_write(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
        more::kv_write(cache, new, pos)
    }

    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        ops::softmax(x)
    }

    fn log_softmax(&self, x: &Tensor) -> Result<Tensor> {
        more::log_softmax(x)
    }

    fn unary(&self, x: &Tensor, f: Unary) -> Result<Tensor> {
        more::unary(x, f)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        need_suffix("add", a, b)?;
        ops::add(a, b)
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        need_suffix("mul", a, b)?;
        ops::mul(a, b)
    }

    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        more::swiglu(gate, up)
    }

    fn argmax(&self, x: &Tensor) -> Result<Vec<u32>> {
        more::argmax(x)
    }

    fn top_k(&self, x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
        more::top_k(x, k)
    }

    /// On the host: MLX's native path hands on bf16, and widening keeps finiteness.
    fn all_finite(&self, x: &Tensor) -> Result<bool> {
        let host = x.to_device(Device::Cpu)?.to_f32()?;
        Ok(host.f32s()?.iter().all(|v| v.is_finite()))
    }

    fn moe_combine(
        &self,
        y: &Tensor,
        weights: &[f32],
        top_k: usize,
        shared: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        moe::combine(y, weights, top_k, shared)
    }

    fn gdn_gate(&self, a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
        more::gdn_gate(a, a_log, dt_bias)
    }

    fn gdn_recurrent(&self, g: Gdn<'_>, state: &mut Tensor) -> Result<Tensor> {
        // On the GPU a Metal kernel keeps the state in registers across all steps.
        #[cfg(feature = "metal")]
        if super::metal::on_gpu() {
            return super::metal::gdn_recurrent(g.q, g.k, g.v, g.g_log, g.beta, state);
        }
        more::gdn_recurrent(g.q, g.k, g.v, g.g_log, g.beta, state)
    }

    fn gdn_chunked(&self, g: Gdn<'_>, state: &mut Tensor, chunk: usize) -> Result<Tensor> {
        gdn::gdn_chunked(g.q, g.k, g.v, g.g_log, g.beta, state, chunk)
    }

    fn causal_conv1d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        state: &mut Tensor,
        silu: bool,
    ) -> Result<Tensor> {
        more::causal_conv1d(x, weight, state, silu)
    }
}

/// The broadcast rule of `add`/`mul`: `b`'s shape is a suffix of `a`'s (MLX would broadcast
/// more freely; the other backends refuse the rest themselves).
fn need_suffix(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if !a.shape().ends_with(b.shape()) {
        return crate::error::shape_err(
            op,
            format!("{:?} cannot broadcast to {:?}", b.shape(), a.shape()),
        );
    }
    Ok(())
}

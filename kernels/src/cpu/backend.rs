//! The CPU's implementation of the op list: each method forwards to the kernel module that
//! holds the op.

use super::{attention, binary, gdn, matmul, moe, norm, rope, unary};
use crate::backend::{grouped_matmul, Backend, Gdn};
use crate::params::{AttnParams, RopeLayout, Unary};
use crate::{Result, Tensor, Weight};

/// The CPU backend (always built; the reference the others are compared with).
pub(crate) struct Cpu;

impl Backend for Cpu {
    fn matmul(&self, x: &Tensor, w: &Weight) -> Result<Tensor> {
        matmul::matmul(x, w)
    }

    fn matmul_many(&self, x: &Tensor, ws: &[&Weight]) -> Result<Vec<Tensor>> {
        matmul::matmul_many(x, ws)
    }

    fn gather_matmul(
        &self,
        x: &Tensor,
        w: &Weight,
        experts: usize,
        rows: &[u32],
        ids: &[u32],
    ) -> Result<Tensor> {
        grouped_matmul(self, x, w, experts, rows, ids)
    }

    fn embedding(&self, w: &Weight, ids: &[u32]) -> Result<Tensor> {
        matmul::embedding(w, ids)
    }

    fn rms_norm(&self, x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        norm::rms_norm(x, w, eps)
    }

    fn rope(
        &self,
        x: &Tensor,
        positions: &[usize],
        inv_freq: &[f32],
        _base: Option<f32>,
        layout: RopeLayout,
    ) -> Result<Tensor> {
        rope::rope(x, positions, inv_freq, layout)
    }

    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
        attention::attention(q, k, v, p)
    }

    fn attention_paged(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        table: (&[u32], usize),
        p: &AttnParams,
    ) -> Result<Tensor> {
        attention::attention_paged(q, k, v, table, p)
    }

    fn kv_write(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
        attention::kv_write(cache, new, pos)
    }

    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        unary::softmax(x)
    }

    fn log_softmax(&self, x: &Tensor) -> Result<Tensor> {
        unary::log_softmax(x)
    }

    fn unary(&self, x: &Tensor, f: Unary) -> Result<Tensor> {
        match f {
            Unary::Silu => unary::map(x, unary::silu),
            Unary::GeluTanh => unary::map(x, unary::gelu_tanh),
            Unary::Sigmoid => unary::map(x, unary::sigmoid),
            Unary::Softplus => unary::map(x, unary::softplus),
            Unary::Scale(s) => unary::map(x, move |v| v * s),
            Unary::Softcap(c) => unary::map(x, move |v| unary::softcap(v, c)),
        }
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        binary::binary("add", a, b, |x, y| x + y)
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        binary::binary("mul", a, b, |x, y| x * y)
    }

    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        binary::binary("swiglu", gate, up, |g, u| unary::silu(g) * u)
    }

    fn argmax(&self, x: &Tensor) -> Result<Vec<u32>> {
        crate::select::argmax(x)
    }

    fn top_k(&self, x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
        crate::select::top_k(x, k)
    }

    fn all_finite(&self, x: &Tensor) -> Result<bool> {
        Ok(x.to_f32()?.f32s()?.iter().all(|v| v.is_finite()))
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
        gdn::gate(a, a_log, dt_bias)
    }

    fn gdn_recurrent(&self, g: Gdn<'_>, state: &mut Tensor) -> Result<Tensor> {
        gdn::recurrent(g.q, g.k, g.v, g.g_log, g.beta, state)
    }

    fn gdn_chunked(&self, g: Gdn<'_>, state: &mut Tensor, chunk: usize) -> Result<Tensor> {
        gdn::chunked(g.q, g.k, g.v, g.g_log, g.beta, state, chunk)
    }

    fn causal_conv1d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        state: &mut Tensor,
        silu: bool,
    ) -> Result<Tensor> {
        gdn::causal_conv1d(x, weight, state, silu)
    }
}

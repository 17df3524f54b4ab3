//! CUDA's implementation of the op list: cuBLAS for dense products, NVRTC-compiled kernels of
//! `kernels/cuda/*.cu` for the rest. Paged attention has no kernel here yet (an error says so).

use super::{
    add, all_finite, argmax, attention, causal_conv1d, embedding, gdn_chunked, gdn_gate,
    gdn_recurrent, kv_write, log_softmax, matmul, moe_combine, mul, rms_norm, rope, softmax,
    swiglu, top_k, unary,
};
use crate::backend::{grouped_matmul, Backend, Gdn};
use crate::params::{AttnParams, RopeLayout, Unary};
use crate::{Result, Tensor, Weight};

/// The native CUDA backend (the first GPU `CUDA_VISIBLE_DEVICES` shows).
pub(crate) struct Cuda;

impl Backend for Cuda {
    fn matmul(&self, x: &Tensor, w: &Weight) -> Result<Tensor> {
        matmul(x, w)
    }

    fn matmul_many(&self, x: &Tensor, ws: &[&Weight]) -> Result<Vec<Tensor>> {
        ws.iter().map(|w| matmul(x, w)).collect()
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
        embedding(w, ids)
    }

    fn rms_norm(&self, x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        rms_norm(x, w, eps)
    }

    fn rope(
        &self,
        x: &Tensor,
        positions: &[usize],
        inv_freq: &[f32],
        _base: Option<f32>,
        layout: RopeLayout,
    ) -> Result<Tensor> {
        rope(x, positions, inv_freq, layout)
    }

    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
        attention(q, k, v, p)
    }

    fn attention_paged(
        &self,
        _q: &Tensor,
        _k: &Tensor,
        _v: &Tensor,
        _table: (&[u32], usize),
        _p: &AttnParams,
    ) -> Result<Tensor> {
        crate::error::invalid(
            "attention_paged",
            "paged KV is not implemented on the native CUDA backend yet; use flat KV there",
        )
    }

    fn kv_write(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
        kv_write(cache, new, pos)
    }

    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        softmax(x)
    }

    fn log_softmax(&self, x: &Tensor) -> Result<Tensor> {
        log_softmax(x)
    }

    fn unary(&self, x: &Tensor, f: Unary) -> Result<Tensor> {
        unary(x, f)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        add(a, b)
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        mul(a, b)
    }

    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        swiglu(gate, up)
    }

    fn argmax(&self, x: &Tensor) -> Result<Vec<u32>> {
        argmax(x)
    }

    fn top_k(&self, x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
        top_k(x, k)
    }

    fn all_finite(&self, x: &Tensor) -> Result<bool> {
        all_finite(x)
    }

    fn moe_combine(
        &self,
        y: &Tensor,
        weights: &[f32],
        top_k: usize,
        shared: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        moe_combine(y, weights, top_k, shared)
    }

    fn gdn_gate(&self, a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
        gdn_gate(a, a_log, dt_bias)
    }

    fn gdn_recurrent(&self, g: Gdn<'_>, state: &mut Tensor) -> Result<Tensor> {
        gdn_recurrent(g.q, g.k, g.v, g.g_log, g.beta, state)
    }

    fn gdn_chunked(&self, g: Gdn<'_>, state: &mut Tensor, chunk: usize) -> Result<Tensor> {
        gdn_chunked(g.q, g.k, g.v, g.g_log, g.beta, state, chunk)
    }

    fn causal_conv1d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        state: &mut Tensor,
        silu: bool,
    ) -> Result<Tensor> {
        causal_conv1d(x, weight, state, silu)
    }
}

use anyhow::Result;
use kernels::{ops, Tensor};

use super::params::params;
use super::Linear;
use crate::weights::Scope;

/// `down(silu(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

params!(SwiGlu: gate, up, down);

impl SwiGlu {
    /// `gate_proj`, `up_proj` `[inter, hidden]` and `down_proj` `[hidden, inter]` under `s`.
    pub fn load(s: &Scope, hidden: usize, inter: usize) -> Result<SwiGlu> {
        SwiGlu::load_named(s, ["gate_proj", "up_proj", "down_proj"], hidden, inter)
    }

    /// [`SwiGlu::load`] with the three projections named otherwise (LFM2's `w1, w3, w2`).
    pub fn load_named(
        s: &Scope,
        [g, u, d]: [&str; 3],
        hidden: usize,
        inter: usize,
    ) -> Result<SwiGlu> {
        Ok(SwiGlu {
            gate: s.pp(g).linear(inter, hidden)?,
            up: s.pp(u).linear(inter, hidden)?,
            down: s.pp(d).linear(hidden, inter)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up] = Linear::forward_many([&self.gate, &self.up], x)?;
        self.down.forward(&gated(&gate, &up, false)?)
    }

    /// [`SwiGlu::forward`] for rows of separate sequences (see [`Linear::forward_rows`]).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        self.rows(x, false)
    }

    /// GeGLU with the same weights: `down(gelu_tanh(gate(x)) · up(x))` (Gemma).
    pub fn forward_gelu(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up] = Linear::forward_many([&self.gate, &self.up], x)?;
        self.down.forward(&gated(&gate, &up, true)?)
    }

    /// [`SwiGlu::forward_gelu`] for rows of separate sequences.
    pub fn forward_rows_gelu(&self, x: &Tensor) -> Result<Tensor> {
        self.rows(x, true)
    }

    fn rows(&self, x: &Tensor, gelu: bool) -> Result<Tensor> {
        let h = gated(&self.gate.forward_rows(x)?, &self.up.forward_rows(x)?, gelu)?;
        self.down.forward_rows(&h)
    }
}

/// `silu(gate) · up`, or `gelu_tanh(gate) · up` when `gelu`.
fn gated(gate: &Tensor, up: &Tensor, gelu: bool) -> Result<Tensor> {
    Ok(match gelu {
        true => ops::mul(&ops::gelu_tanh(gate)?, up)?,
        false => ops::swiglu(gate, up)?,
    })
}

impl SwiGlu {}

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
        self.down.forward(&ops::swiglu(&gate, &up)?)
    }

    /// [`SwiGlu::forward`] for rows of separate sequences (see [`Linear::forward_rows`]).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        let h = ops::swiglu(&self.gate.forward_rows(x)?, &self.up.forward_rows(x)?)?;
        self.down.forward_rows(&h)
    }
}

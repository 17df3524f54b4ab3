use anyhow::Result;
use kernels::{ops, Tensor};

use super::Linear;
use crate::config::QuantConfig;
use crate::weights::WeightStore;

/// `down(silu(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl SwiGlu {
    pub fn load(
        store: &WeightStore,
        quant: &QuantConfig,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<SwiGlu> {
        Ok(SwiGlu {
            gate: Linear::load(store, quant, &format!("{prefix}.gate_proj"), inter, hidden)?,
            up: Linear::load(store, quant, &format!("{prefix}.up_proj"), inter, hidden)?,
            down: Linear::load(store, quant, &format!("{prefix}.down_proj"), hidden, inter)?,
        })
    }

    /// Moves the weights to `device` once (at load), so no op copies them per call.
    pub fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        for l in [&mut self.gate, &mut self.up, &mut self.down] {
            l.to_device(device)?;
        }
        Ok(())
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

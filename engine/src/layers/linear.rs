use anyhow::Result;
use kernels::{ops, Tensor, Weight};

use crate::config::QuantConfig;
use crate::weights::WeightStore;

/// A bias-free linear layer `y = x·Wᵀ` over a weight in any stored format.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
}

impl Linear {
    /// Loads `<prefix>.weight` (plus `.scales`/`.biases` when quantized) as `[out, inp]`.
    pub fn load(
        store: &WeightStore,
        quant: &QuantConfig,
        prefix: &str,
        out: usize,
        inp: usize,
    ) -> Result<Linear> {
        Ok(Linear {
            weight: store.weight(prefix, quant.spec_for(prefix), out, inp)?,
        })
    }

    /// Moves the weights to `device` once (at load), so no op copies them per call.
    pub fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        self.weight = self.weight.to_device(device)?;
        Ok(())
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::matmul(x, &self.weight)?)
    }
}

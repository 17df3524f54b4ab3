use anyhow::Result;
use kernels::{ops, Tensor};

use crate::weights::WeightStore;

/// RMSNorm with its weight widened to f32 once at load.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(store: &WeightStore, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: store.f32_tensor(name, &[dim])?,
            eps,
        })
    }

    /// Like `load`, for checkpoints that store the weight as an offset from 1 (`w − 1`).
    pub fn load_offset(store: &WeightStore, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        let w: Vec<f32> = store
            .f32_values(name, &[dim])?
            .iter()
            .map(|v| v + 1.0)
            .collect();
        Ok(RmsNorm {
            weight: Tensor::from_f32(&[dim], w)?,
            eps,
        })
    }

    /// Normalises over the last dimension (which must equal the weight's length).
    /// Moves the weights to `device` once (at load), so no op copies them per call.
    pub fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        self.weight = self.weight.to_device(device)?;
        Ok(())
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

use anyhow::Result;
use kernels::{ops, Tensor};

use super::params::params;

/// RMSNorm with its weight widened to f32 once at load (see `Scope::norm`).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

params!(RmsNorm: weight);

impl RmsNorm {
    /// Normalises over the last dimension (which must equal the weight's length).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

//! What a family hands to the writer: the JSON files and a list of tensors with how to fill them.

use serde_json::Value;

use super::tokenizer::TokenizerPlan;

/// How a tensor's values are drawn (all from the checkpoint seed and the tensor's name).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `mean + std · N(0, 1)`.
    Gaussian { mean: f32, std: f32 },
}

impl Init {
    pub fn normal(std: f32) -> Init {
        Init::Gaussian { mean: 0.0, std }
    }

    /// Around `mean` with a little noise, e.g. RMSNorm weights near 1.
    pub fn around(mean: f32, std: f32) -> Init {
        Init::Gaussian { mean, std }
    }
}

/// How a tensor is stored in the chosen format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// A Linear or Embedding weight `[out, in]`: quantized in quantized formats when `in` is a
    /// multiple of the group size (mlx-lm's rule), else stored like [`Store::Float`].
    Matrix,
    /// Always the format's float dtype (f32 or bf16): norms and other small tensors.
    Float,
}

/// One logical tensor of the model (before quantization splits it into weight/scales/biases).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    /// The full stored name, ending in `.weight` for matrices.
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
    pub store: Store,
}

impl TensorPlan {
    pub fn new(name: impl Into<String>, shape: &[usize], init: Init, store: Store) -> TensorPlan {
        TensorPlan {
            name: name.into(),
            shape: shape.to_vec(),
            init,
            store,
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A whole checkpoint folder, minus the tensor values.
#[derive(Debug, Clone)]
pub struct ModelPlan {
    /// config.json (quantization blocks already inserted by the family).
    pub config: Value,
    /// generation_config.json.
    pub generation_config: Value,
    pub tokenizer: TokenizerPlan,
    pub tensors: Vec<TensorPlan>,
}

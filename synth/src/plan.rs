//! What a family hands to the writer: the JSON files and a list of tensors with how to fill them.

use serde_json::Value;

use super::tokenizer::TokenizerPlan;

/// How a tensor's values are drawn (all from the checkpoint seed and the tensor's name).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `mean + std · N(0, 1)`.
    Gaussian { mean: f32, std: f32 },
    /// No randomness: element `i` of `n` is `start + (end − start) · ((i + shift) mod n) / (n − 1)`,
    /// an evenly spaced table rotated by `shift` (e.g. per-head decay rates from weak to strong,
    /// rotated per layer so the layers differ).
    Ramp { start: f32, end: f32, shift: usize },
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
    /// A Linear weight that quantized formats keep at 8 bits (affine, group 64) whatever their
    /// own setting, as mlx-lm's MoE `quant_predicate` does for routers and the shared-expert
    /// gate (the family lists it in config.json's `quantization`).
    Matrix8,
    /// Float32 in every format, as mlx-lm keeps some parameters (its `cast_predicate`, e.g.
    /// Gated DeltaNet's `A_log`) and as some original checkpoints store them.
    F32,
}

/// One logical tensor of the model (before quantization splits it into weight/scales/biases).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    /// The full stored name, ending in `.weight` for matrices.
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
    pub store: Store,
    /// The name the values are drawn from when it differs from `name`, so the same logical tensor
    /// gets the same values in every layout (e.g. Qwen3.5's `model.language_model.*` and
    /// `language_model.model.*`).
    pub seed_name: Option<String>,
    /// Values made of two tensors of half this one's dim 1, drawn under these names and
    /// concatenated along dim 1 per index of dim 0 (an original checkpoint's fused
    /// `gate_up_proj` `[E, 2·I, H]`, drawn as the MLX layout's `gate_proj` and `up_proj`).
    pub fused_from: Option<[String; 2]>,
    /// Values made of one tensor per index of dim 0, each drawn under its own name (an MLX
    /// folder's stacked experts `[E, out, in]`, drawn as an original checkpoint's per-expert
    /// tensors).
    pub stacked_from: Option<Vec<String>>,
}

impl TensorPlan {
    pub fn new(name: impl Into<String>, shape: &[usize], init: Init, store: Store) -> TensorPlan {
        TensorPlan {
            name: name.into(),
            shape: shape.to_vec(),
            init,
            store,
            seed_name: None,
            fused_from: None,
            stacked_from: None,
        }
    }

    /// A linear layer's `[out, inp]` weight, entries of std `1/√inp` (unit-RMS outputs for
    /// unit-RMS inputs), stored in the checkpoint's format.
    pub fn linear(name: impl Into<String>, out: usize, inp: usize) -> TensorPlan {
        let init = Init::normal(1.0 / (inp as f32).sqrt());
        TensorPlan::new(name, &[out, inp], init, Store::Matrix)
    }

    /// A norm's `[n]` gain around `mean` with noise `std`, kept as a float.
    pub fn gain(name: impl Into<String>, n: usize, mean: f32, std: f32) -> TensorPlan {
        TensorPlan::new(name, &[n], Init::around(mean, std), Store::Float)
    }

    /// Draws the values as `names.len()` tensors stacked along dim 0 (see
    /// [`TensorPlan::stacked_from`]).
    pub fn stacked_from(mut self, names: Vec<String>) -> TensorPlan {
        assert_eq!(names.len(), self.shape[0], "one name per index of dim 0");
        self.stacked_from = Some(names);
        self
    }

    /// Draws the values as two halves fused along dim 1 (see [`TensorPlan::fused_from`]).
    pub fn fused_from(mut self, first: impl Into<String>, second: impl Into<String>) -> TensorPlan {
        self.fused_from = Some([first.into(), second.into()]);
        self
    }

    /// Draws the values as if the tensor were named `name`.
    pub fn seeded_as(mut self, name: impl Into<String>) -> TensorPlan {
        self.seed_name = Some(name.into());
        self
    }

    /// The name the values are drawn from.
    pub fn value_name(&self) -> &str {
        self.seed_name.as_deref().unwrap_or(&self.name)
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

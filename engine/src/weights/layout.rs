//! Where a folder keeps a text model's tensors. mlx-lm writes `language_model.model.*`
//! (+ `language_model.lm_head`), original multimodal checkpoints `model.language_model.*`
//! (+ top-level `lm_head`, `mtp.*`) and text-only ones `model.*` (+ `lm_head`); Qwen3.5 and
//! Gemma 4 load all three.

use anyhow::{bail, Result};

use super::WeightStore;

/// Where a folder keeps the text model's tensors: the one place names are mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Written by mlx-lm: `language_model.model.*`, `language_model.lm_head`.
    Mlx,
    /// Original multimodal checkpoint: `model.language_model.*`, `lm_head`, `mtp.*`.
    Hf,
    /// Original text-only checkpoint (`Qwen3_5ForCausalLM`): `model.*`, `lm_head`, `mtp.*`.
    HfText,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::Mlx, Layout::Hf, Layout::HfText];

    /// Prefix of `embed_tokens`, `layers.N` and `norm`.
    pub fn model_prefix(self) -> &'static str {
        match self {
            Layout::Mlx => "language_model.model",
            Layout::Hf => "model.language_model",
            Layout::HfText => "model",
        }
    }

    pub fn lm_head(self) -> &'static str {
        match self {
            Layout::Mlx => "language_model.lm_head",
            Layout::Hf | Layout::HfText => "lm_head",
        }
    }

    /// mlx-lm drops `mtp.*` when converting; original folders keep it at the top level.
    pub fn mtp_prefix(self) -> &'static str {
        match self {
            Layout::Mlx => "language_model.mtp",
            Layout::Hf | Layout::HfText => "mtp",
        }
    }

    /// The layout whose embedding table the folder holds.
    pub fn detect(store: &WeightStore) -> Result<Layout> {
        for l in Layout::ALL {
            if store.contains(&format!("{}.embed_tokens.weight", l.model_prefix())) {
                return Ok(l);
            }
        }
        let tried: Vec<String> = Layout::ALL
            .iter()
            .map(|l| format!("`{}.embed_tokens.weight`", l.model_prefix()))
            .collect();
        bail!(
            "{}: no known layout of this family: none of {} is present",
            store.dir().display(),
            tried.join(", ")
        )
    }
}

/// Whether the folder stores the 1-D RMSNorm weights of the decoder (input, post-attention,
/// final, q/k norms — not the gated norm inside Gated DeltaNet) as `w − 1`. Original checkpoints
/// do (transformers' `Qwen3_5RMSNorm` computes `x̂·(1 + w)`); mlx-lm adds the 1 when it converts.
/// mlx-lm decides exactly as here: a conv1d weight whose last axis is not 1 is still in the
/// original `[C, 1, K]` layout, so the folder was never converted and its norms need `+1`.
pub fn norms_are_offset(store: &WeightStore, layout: Layout) -> bool {
    let layers = format!("{}.layers.", layout.model_prefix());
    store.names().iter().any(|n| {
        n.starts_with(&layers)
            && n.ends_with("conv1d.weight")
            && store
                .info(n)
                .is_some_and(|(_, shape)| shape.last() != Some(&1))
    })
}

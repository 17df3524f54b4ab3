//! The model families `harness synth` can write, one module each, behind one small trait.
//! Adding a family = one file that implements [`Family`] + one line in [`FAMILIES`].

mod gemma3;
mod gemma4;
mod lfm2;
mod llama;
mod qwen3;
mod qwen3_5;

use anyhow::{bail, Result};

use super::plan::ModelPlan;
use super::spec::{Layout, SynthSpec};

pub trait Family: Sync {
    /// The name used on the command line and in `FAMILY:...` specs, e.g. `qwen3`.
    fn name(&self) -> &'static str;

    /// One line for `--help`.
    fn about(&self) -> &'static str;

    /// The folder for `spec` in `layout` (already resolved): JSON files, tokenizer and tensor
    /// list with each tensor's initialisation. Tensor names must be the layout's.
    fn plan(&self, spec: &SynthSpec, layout: Layout) -> Result<ModelPlan>;
}

const FAMILIES: &[&dyn Family] = &[
    &qwen3::Qwen3,
    &qwen3::Qwen2,
    &qwen3_5::Qwen3_5 { moe: false },
    &qwen3_5::Qwen3_5 { moe: true },
    &lfm2::Lfm2 { moe: false },
    &lfm2::Lfm2 { moe: true },
    &llama::Llama,
    &llama::MiniCpm,
    &gemma3::Gemma3,
    &gemma4::Gemma4 { moe: false },
    &gemma4::Gemma4 { moe: true },
];

pub fn all() -> &'static [&'static dyn Family] {
    FAMILIES
}

pub fn find(name: &str) -> Result<&'static dyn Family> {
    match FAMILIES.iter().find(|f| f.name() == name) {
        Some(f) => Ok(*f),
        None => {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.name()).collect();
            bail!("unknown model family `{name}`; known: {}", known.join(", "))
        }
    }
}

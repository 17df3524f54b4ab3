//! A scoped view of a checkpoint's tensors: the store, its quantization and a name prefix, so
//! a layer loads `s.pp("self_attn").pp("q_proj").linear(out, inp)` instead of building names
//! by hand (the idea of candle's `VarBuilder::pp`).

use std::fmt::Display;

use anyhow::Result;
use kernels::{Tensor, Weight};

use super::WeightStore;
use crate::config::QuantConfig;
use crate::layers::{Linear, RmsNorm};

#[derive(Clone)]
pub struct Scope<'a> {
    store: &'a WeightStore,
    quant: &'a QuantConfig,
    prefix: String,
    /// The folder stores decoder RMSNorm gains as `w − 1` (undone by [`Scope::norm`]).
    norm_offset: bool,
}

impl<'a> Scope<'a> {
    /// The root scope of a folder (no prefix).
    pub fn new(store: &'a WeightStore, quant: &'a QuantConfig) -> Scope<'a> {
        Scope {
            store,
            quant,
            prefix: String::new(),
            norm_offset: false,
        }
    }

    /// The scope one name level down: `<prefix>.<name>`.
    pub fn pp(&self, name: impl Display) -> Scope<'a> {
        Scope {
            prefix: self.name(name),
            ..self.clone()
        }
    }

    /// This scope whose [`Scope::norm`] adds 1 to every stored gain.
    pub fn with_norm_offset(self, norm_offset: bool) -> Scope<'a> {
        Scope {
            norm_offset,
            ..self
        }
    }

    /// The full name of `leaf` in this scope.
    pub fn name(&self, leaf: impl Display) -> String {
        if self.prefix.is_empty() {
            leaf.to_string()
        } else {
            format!("{}.{leaf}", self.prefix)
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn store(&self) -> &'a WeightStore {
        self.store
    }

    /// Whether `<prefix>.<leaf>` is stored.
    pub fn contains(&self, leaf: &str) -> bool {
        self.store.contains(&self.name(leaf))
    }

    /// The matrix at this scope (`.weight`, plus `.scales`/`.biases` when quantized) as
    /// `[rows, cols]`, quantized as the config says for this module.
    pub fn weight(&self, rows: usize, cols: usize) -> Result<Weight> {
        let spec = self.quant.spec_for(&self.prefix);
        self.store.weight(&self.prefix, spec, rows, cols)
    }

    /// `experts` matrices `[rows, cols]` stacked in one tensor (see
    /// [`WeightStore::stacked_weight`]).
    pub fn stacked_weight(&self, experts: usize, rows: usize, cols: usize) -> Result<Weight> {
        let spec = self.quant.spec_for(&self.prefix);
        self.store
            .stacked_weight(&self.prefix, spec, experts, rows, cols)
    }

    /// A bias-free linear layer `[out, inp]` at this scope.
    pub fn linear(&self, out: usize, inp: usize) -> Result<Linear> {
        self.linear_with_bias(out, inp, false)
    }

    /// A linear layer, with `.bias` `[out]` when `bias`.
    pub fn linear_with_bias(&self, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        Ok(Linear {
            weight: self.weight(out, inp)?,
            bias: match bias {
                true => Some(self.f32_tensor("bias", &[out])?),
                false => None,
            },
        })
    }

    /// The RMSNorm whose gain is `.weight` `[dim]`, undoing a `w − 1` storage when the scope
    /// says so.
    pub fn norm(&self, dim: usize, eps: f32) -> Result<RmsNorm> {
        let weight = if self.norm_offset {
            let w = self.f32_values("weight", &[dim])?;
            Tensor::from_f32(&[dim], w.iter().map(|v| v + 1.0).collect())?
        } else {
            self.f32_tensor("weight", &[dim])?
        };
        Ok(RmsNorm { weight, eps })
    }

    /// `<prefix>.<leaf>` widened to f32, checked to be `shape`.
    pub fn f32_tensor(&self, leaf: &str, shape: &[usize]) -> Result<Tensor> {
        self.store.f32_tensor(&self.name(leaf), shape)
    }

    /// [`Scope::f32_tensor`] as host values.
    pub fn f32_values(&self, leaf: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.store.f32_values(&self.name(leaf), shape)
    }

    /// [`Scope::f32_values`], refused naming the tensor when a value is not finite.
    pub fn finite_values(&self, leaf: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let v = self.f32_values(leaf, shape)?;
        anyhow::ensure!(
            v.iter().all(|x| x.is_finite()),
            "{}: tensor `{}` holds a value that is not finite",
            self.store.dir().display(),
            self.name(leaf)
        );
        Ok(v)
    }

    /// How many numbered children `<prefix>.N.*` are stored (one past the largest N), refused
    /// when the names claim more layers than any model has.
    pub fn count_children(&self) -> Result<usize> {
        let lead = format!("{}.", self.prefix);
        let count = self
            .store
            .names()
            .iter()
            .filter_map(|n| {
                n.strip_prefix(&lead)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .max()
            .map_or(0, |m| m + 1);
        anyhow::ensure!(
            count <= crate::config::limits::MAX_LAYERS,
            "{}: tensor names `{lead}N.*` go up to layer {}, more than any model has",
            self.store.dir().display(),
            count.saturating_sub(1)
        );
        Ok(count)
    }
}

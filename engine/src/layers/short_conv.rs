//! LFM2's gated short convolution: `in_proj` gives three gates `B, C, x`; a depthwise causal
//! conv of `conv_L_cache` taps runs over `B ⊙ x`, its output is gated by `C` and projected
//! back by `out_proj`. The conv carries its last `K − 1` inputs between forwards (no activation,
//! unlike the Gated DeltaNet conv).

use anyhow::{bail, Result};
use kernels::{ops, Tensor};

use super::params::params;
use super::Linear;
use crate::weights::{Scope, WeightStore};

/// Reads a depthwise conv weight as `[C, K]` f32. Original checkpoints store PyTorch's
/// `[C, 1, K]`, mlx-lm moves the kernel axis (`[C, K, 1]`); both hold the bytes of `[C, K]`.
/// mlx-lm's `sanitize` tells them apart the same way (a last axis longer than the middle one
/// is still PyTorch's layout), so with K = 1 the two are the same array anyway.
pub fn depthwise_conv_weight(
    store: &WeightStore,
    name: &str,
    channels: usize,
    kernel: usize,
) -> Result<Tensor> {
    let conv = store.tensor(name)?;
    let s = conv.shape();
    if s != [channels, 1, kernel] && s != [channels, kernel, 1] && s != [channels, kernel] {
        bail!(
            "{}: tensor `{name}` has shape {s:?}, expected [{channels}, 1, {kernel}] (Hugging Face) or [{channels}, {kernel}, 1] (MLX)",
            store.dir().display(),
        );
    }
    let conv = store.f32_tensor(name, conv.shape())?;
    Ok(conv.reshape(&[channels, kernel])?)
}

params!(ShortConv: in_proj, in_bias, conv_weight, conv_bias, out_proj, out_bias);

#[derive(Debug, Clone)]
pub struct ShortConv {
    /// `[3·hidden, hidden]`: rows `B`, then `C`, then `x`.
    pub in_proj: Linear,
    pub in_bias: Option<Tensor>,
    /// Depthwise taps `[hidden, K]`, f32; the last tap multiplies the current position.
    pub conv_weight: Tensor,
    pub conv_bias: Option<Tensor>,
    pub out_proj: Linear,
    pub out_bias: Option<Tensor>,
}

impl ShortConv {
    /// Loads `in_proj`, `conv` and `out_proj` under `s` (e.g. `model.layers.0.conv`); all
    /// three carry a bias when `with_bias` (config.json's `conv_bias`), as both mlx-lm and
    /// transformers build them.
    pub fn load(s: &Scope, hidden: usize, kernel: usize, with_bias: bool) -> Result<ShortConv> {
        let bias = |name: &str, n: usize| {
            with_bias
                .then(|| s.pp(name).f32_tensor("bias", &[n]))
                .transpose()
        };
        Ok(ShortConv {
            in_proj: s.pp("in_proj").linear(3 * hidden, hidden)?,
            in_bias: bias("in_proj", 3 * hidden)?,
            conv_weight: depthwise_conv_weight(s.store(), &s.name("conv.weight"), hidden, kernel)?,
            conv_bias: bias("conv", hidden)?,
            out_proj: s.pp("out_proj").linear(hidden, hidden)?,
            out_bias: bias("out_proj", hidden)?,
        })
    }

    pub fn hidden(&self) -> usize {
        self.conv_weight.dim(0)
    }

    pub fn kernel(&self) -> usize {
        self.conv_weight.dim(1)
    }

    /// The zero conv state of a sequence's start: the `K − 1` inputs before position 0.
    pub fn new_state(&self) -> Tensor {
        Tensor::zeros(&[self.kernel() - 1, self.hidden()])
    }

    /// Runs `x` `[T, hidden]` after the tokens `state` (`[K − 1, hidden]`) has seen; updates it.
    pub fn forward(&self, x: &Tensor, state: &mut Tensor) -> Result<Tensor> {
        let (c, bx) = self.gates(self.in_proj.forward(x)?)?;
        let conv = ops::causal_conv1d(&bx, &self.conv_weight, state, false)?;
        self.out(&c, conv, false)
    }

    /// One decode step of several sequences: row `i` of `x` `[N, hidden]` is the new token of
    /// the sequence whose conv state is `states[i]`. Each row equals that sequence's
    /// [`ShortConv::forward`] alone: the projections read each weight once for a group of
    /// rows (`Linear::forward_rows`), the conv runs per sequence.
    pub fn forward_batch(&self, x: &Tensor, states: &mut [&mut Tensor]) -> Result<Tensor> {
        anyhow::ensure!(
            x.dim(0) == states.len(),
            "a batched decode step has {} rows for {} sequences",
            x.dim(0),
            states.len()
        );
        let (c, bx) = self.gates(self.in_proj.forward_rows(x)?)?;
        let rows = states
            .iter_mut()
            .enumerate()
            .map(|(i, st)| ops::causal_conv1d(&bx.narrow0(i, 1)?, &self.conv_weight, st, false))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let conv = Tensor::cat0(&rows.iter().collect::<Vec<_>>())?;
        self.out(&c, conv, true)
    }

    /// From `in_proj`'s output to the output gate `C` and the conv input `B ⊙ x`.
    fn gates(&self, bcx: Tensor) -> Result<(Tensor, Tensor)> {
        let h = self.hidden();
        let bcx = with_bias(bcx, &self.in_bias)?;
        let b = bcx.narrow(1, 0, h)?;
        let c = bcx.narrow(1, h, h)?;
        let bx = ops::mul(&b, &bcx.narrow(1, 2 * h, h)?)?;
        Ok((c, bx))
    }

    /// The conv output gated by `C` and projected back (`rows`: each row a separate sequence).
    fn out(&self, c: &Tensor, conv: Tensor, rows: bool) -> Result<Tensor> {
        // A bias after a linear conv with no activation is a plain broadcast add.
        let gated = ops::mul(c, &with_bias(conv, &self.conv_bias)?)?;
        let y = if rows {
            self.out_proj.forward_rows(&gated)?
        } else {
            self.out_proj.forward(&gated)?
        };
        with_bias(y, &self.out_bias)
    }
}

fn with_bias(y: Tensor, bias: &Option<Tensor>) -> Result<Tensor> {
    Ok(match bias {
        Some(b) => ops::add(&y, b)?,
        None => y,
    })
}

//! The tail of a decoder: final norm and LM head, with what some families add around it.

use anyhow::Result;
use kernels::{ops, Tensor, Weight};

use super::RmsNorm;

/// What some families add around the LM head.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tail {
    /// Multiplies the normed hidden state before the head (MiniCPM).
    pub scale: Option<f32>,
    /// Soft-caps the logits `c·tanh(x/c)` (Gemma).
    pub softcap: Option<f32>,
}

/// Logits of the last position of `x` (`[1, V]`), or of every position when `all_logits`
/// (multi-token verification), on the host in f32.
pub fn logits(
    x: &Tensor,
    norm: &RmsNorm,
    lm_head: &Weight,
    all_logits: bool,
    tail: Tail,
) -> Result<Tensor> {
    let x = if all_logits {
        x.clone()
    } else {
        x.narrow0(x.dim(0) - 1, 1)?
    };
    Ok(run(&x, norm, lm_head, tail, false)?.0)
}

/// [`logits`] over every row of `x`, each row a separate sequence (a batched decode step):
/// each row's logits equal that row alone.
pub fn logits_rows(x: &Tensor, norm: &RmsNorm, lm_head: &Weight, tail: Tail) -> Result<Tensor> {
    Ok(run(x, norm, lm_head, tail, true)?.0)
}

/// [`logits_rows`] and the rows' hidden states after the final norm (before the tail's
/// scale): what a draft head reads.
pub fn logits_rows_hidden(
    x: &Tensor,
    norm: &RmsNorm,
    lm_head: &Weight,
    tail: Tail,
) -> Result<(Tensor, Tensor)> {
    run(x, norm, lm_head, tail, true)
}

/// Logits on the host and the normed hidden state they come from.
fn run(
    x: &Tensor,
    norm: &RmsNorm,
    lm_head: &Weight,
    tail: Tail,
    rows: bool,
) -> Result<(Tensor, Tensor)> {
    let normed = norm.forward(x)?;
    let h = match tail.scale {
        Some(s) => ops::scale(&normed, s)?,
        None => normed.clone(),
    };
    let mut logits = if rows {
        ops::matmul_rows(&h, lm_head)?
    } else {
        ops::matmul(&h, lm_head)?
    };
    if let Some(c) = tail.softcap {
        logits = ops::softcap(&logits, c)?;
    }
    Ok((host_logits(&logits)?, normed))
}

/// Logits as sampling reads them: f32 on the host (a no-op for host f32 tensors; MLX's native
/// path computes them in bf16, which widens exactly).
pub fn host_logits(logits: &Tensor) -> Result<Tensor> {
    Ok(logits.to_device(kernels::Device::Cpu)?.to_f32()?)
}

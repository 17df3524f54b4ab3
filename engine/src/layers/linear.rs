use anyhow::Result;
use kernels::{ops, Tensor, Weight};

use super::params::params;

/// A linear layer `y = x·Wᵀ (+ b)` over a weight in any stored format; the optional bias is
/// widened to f32 once at load.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.biased(ops::matmul(x, &self.weight)?)
    }

    /// [`Linear::forward`] for `x` `[N, K]` whose rows are separate sequences (a batched decode
    /// step): each row's result equals that row alone (`ops::matmul_rows`).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        self.biased(ops::matmul_rows(x, &self.weight)?)
    }

    /// [`Linear::forward`] of one input through each of `ls` (a layer's projections of the
    /// same input), bit-identical to calling each; on the CPU a decode step runs them in one
    /// parallel loop (`ops::matmul_many`).
    pub fn forward_many<const N: usize>(ls: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let ws: Vec<&Weight> = ls.iter().map(|l| &l.weight).collect();
        let ys = ops::matmul_many(x, &ws)?;
        let ys: Vec<Tensor> = ls
            .iter()
            .zip(ys)
            .map(|(l, y)| l.biased(y))
            .collect::<Result<_>>()?;
        Ok(ys.try_into().expect("one result per weight"))
    }

    fn biased(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => ops::add(&y, b)?,
            None => y,
        })
    }
}

params!(Linear: weight, bias);

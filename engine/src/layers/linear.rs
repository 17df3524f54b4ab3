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

/// Whether two weights are one stored matrix (tensor clones share their data), as a tied LM
/// head is the embedding: such a pair must be moved to a device once and shared there.
pub fn same_weight(a: &Weight, b: &Weight) -> bool {
    fn same(a: &Tensor, b: &Tensor) -> bool {
        match (a.raw_bytes(), b.raw_bytes()) {
            (Ok(x), Ok(y)) => {
                std::ptr::eq(x, y) && a.shape() == b.shape() && a.dtype() == b.dtype()
            }
            _ => false,
        }
    }
    match (a, b) {
        (Weight::Dense(x), Weight::Dense(y)) => same(x, y),
        (Weight::Quant(x), Weight::Quant(y)) => x.spec == y.spec && same(&x.packed, &y.packed),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use kernels::{DType, Tensor, Weight};

    use super::same_weight;

    #[test]
    fn a_clone_is_the_same_weight_and_equal_values_are_not() {
        let t = Tensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let w = Weight::Dense(t.clone());
        assert!(
            same_weight(&w, &w.clone()),
            "a tied head shares the embedding's data"
        );
        let copy = Weight::Dense(Tensor::from_f32(&[2, 3], t.to_vec_f32().unwrap()).unwrap());
        assert!(
            !same_weight(&w, &copy),
            "equal values in separate storage are two weights"
        );
        let reshaped = Weight::Dense(t.reshape(&[3, 2]).unwrap());
        assert!(
            !same_weight(&w, &reshaped),
            "another shape is another weight"
        );
        let bytes = Tensor::from_slice(&[2, 3], DType::U8, &[0u8; 6]).unwrap();
        assert!(!same_weight(&w, &Weight::Dense(bytes)));
    }
}

//! One walk over a model's weights. Every layer says once which tensors it holds
//! ([`Params::params`]); from that walk come the device move, the parameter count, the
//! weight-format summary and the MoE facts, for every family, with no hand-kept lists.
//!
//! A tied LM head is the embedding's own data (a clone sharing its storage): the walk meets it
//! twice, counts it once and uploads it once, keeping the two shared on the device.

use anyhow::Result;
use kernels::{Device, Tensor, Weight};

/// One slot of a model's weights, as the walk yields it.
pub enum Param<'a> {
    /// A matrix in its stored format; `expert` when it stacks a sparse layer's experts (a
    /// decode token reads `top_k` of them).
    Matrix { w: &'a mut Weight, expert: bool },
    /// A small f32 tensor: norm gains, biases, conv taps, decay parameters.
    Tensor(&'a mut Tensor),
    /// Values kept on the host (router scales, expert biases): counted, never moved.
    Host(usize),
}

/// The visitor a walk calls for each slot.
pub type Visit<'v> = dyn FnMut(Param<'_>) -> Result<()> + 'v;

/// A part of a model that holds weights.
pub trait Params {
    /// Calls `f` on every weight this part holds, in a fixed order.
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()>;
}

/// `impl Params` for a struct: visits the named fields in order.
macro_rules! params {
    ($ty:ty: $($field:ident),* $(,)?) => {
        impl $crate::layers::params::Params for $ty {
            fn params(
                &mut self,
                f: &mut $crate::layers::params::Visit<'_>,
            ) -> anyhow::Result<()> {
                $( $crate::layers::params::Params::params(&mut self.$field, f)?; )*
                Ok(())
            }
        }
    };
}
pub(crate) use params;

impl Params for Weight {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        f(Param::Matrix {
            w: self,
            expert: false,
        })
    }
}

impl Params for Tensor {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        f(Param::Tensor(self))
    }
}

impl<T: Params> Params for Option<T> {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        match self {
            Some(p) => p.params(f),
            None => Ok(()),
        }
    }
}

impl<T: Params> Params for Vec<T> {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        self.iter_mut().try_for_each(|p| p.params(f))
    }
}

impl<T: Params, const N: usize> Params for [T; N] {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        self.iter_mut().try_for_each(|p| p.params(f))
    }
}

/// A scalar kept on the host (a layer scale, one router scale of a list).
impl Params for f32 {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        f(Param::Host(1))
    }
}

/// For each matrix slot in walk order, the earlier slot it is tied to (same storage), if any.
/// Read before anything moves, so storage identities are those of the loaded weights.
fn ties(model: &mut (impl Params + ?Sized)) -> Result<Vec<Option<usize>>> {
    let mut seen: Vec<Weight> = Vec::new();
    let mut ties = Vec::new();
    model.params(&mut |p| {
        if let Param::Matrix { w, .. } = p {
            ties.push(seen.iter().position(|s| same_weight(s, w)));
            seen.push(w.clone());
        }
        Ok(())
    })?;
    Ok(ties)
}

/// Moves every weight of `model` to `device` once; tied weights stay one shared copy.
pub fn to_device(model: &mut (impl Params + ?Sized), device: Device) -> Result<()> {
    let ties = ties(model)?;
    let mut moved: Vec<Option<Weight>> = vec![None; ties.len()];
    let mut i = 0;
    model.params(&mut |p| {
        match p {
            Param::Matrix { w, .. } => {
                *w = match ties[i] {
                    Some(j) => moved[j].clone().expect("a tie points back"),
                    None => w.to_device(device)?,
                };
                // Kept only where a later slot shares it.
                if ties[i + 1..].contains(&Some(i)) {
                    moved[i] = Some(w.clone());
                }
                i += 1;
            }
            Param::Tensor(t) => *t = t.to_device(device)?,
            Param::Host(_) => {}
        }
        Ok(())
    })
}

/// What the walk finds: parameters, formats, and the sparse share.
pub struct Summary {
    pub parameters: usize,
    pub formats: Vec<String>,
    /// Bytes of every matrix as stored (tied ones once).
    pub weight_bytes: usize,
    pub expert_parameters: usize,
    pub expert_bytes: usize,
}

/// Counts `model`'s parameters (tied matrices once) and lists its matrix formats.
pub fn summarize(model: &mut (impl Params + ?Sized)) -> Result<Summary> {
    let ties = ties(model)?;
    let mut s = Summary {
        parameters: 0,
        formats: Vec::new(),
        weight_bytes: 0,
        expert_parameters: 0,
        expert_bytes: 0,
    };
    let mut i = 0;
    model.params(&mut |p| {
        match p {
            Param::Matrix { w, expert } => {
                if ties[i].is_none() {
                    s.parameters += w.numel();
                    s.weight_bytes += w.stored_bytes();
                    s.formats.push(w.format_name());
                    if expert {
                        s.expert_parameters += w.numel();
                        s.expert_bytes += w.stored_bytes();
                    }
                }
                i += 1;
            }
            Param::Tensor(t) => s.parameters += t.numel(),
            Param::Host(n) => s.parameters += n,
        }
        Ok(())
    })?;
    s.formats.sort();
    s.formats.dedup();
    Ok(s)
}

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

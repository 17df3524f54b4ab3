use crate::error::shape_err;
use crate::{Result, Tensor};

/// Elementwise `f(a, b)` where `b`'s shape equals `a`'s or is a suffix of it (broadcast over
/// the leading dims).
pub fn binary(
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> Result<Tensor> {
    let (sa, sb) = (a.shape(), b.shape());
    if sb.len() > sa.len() || sa[sa.len() - sb.len()..] != *sb {
        return shape_err(op, format!("cannot broadcast {sb:?} onto {sa:?}"));
    }
    let (x, y) = (a.f32s()?, b.f32s()?);
    let n = y.len().max(1);
    let mut out = vec![0.0f32; x.len()];
    super::for_each_row(&mut out, n, |i, row| {
        let xs = &x[i * n..(i + 1) * n];
        row.iter_mut()
            .zip(xs.iter().zip(y))
            .for_each(|(o, (&p, &q))| *o = f(p, q));
    });
    Tensor::from_f32(sa, out)
}

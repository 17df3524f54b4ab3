use rayon::prelude::*;

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
    let mut out = vec![0.0f32; x.len()];
    let apply = |o: &mut [f32], x: &[f32], y: &[f32]| {
        o.iter_mut()
            .zip(x.iter().zip(y))
            .for_each(|(o, (&p, &q))| *o = f(p, q))
    };
    if y.len() == x.len() {
        // Same shape: split into fixed chunks so large inputs still run in parallel.
        const CHUNK: usize = 4096;
        if x.len() < 1 << 15 {
            apply(&mut out, x, y);
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK).zip(y.par_chunks(CHUNK)))
                .for_each(|(o, (x, y))| apply(o, x, y));
        }
    } else {
        let n = y.len();
        super::for_each_row(&mut out, n, |i, row| apply(row, &x[i * n..(i + 1) * n], y));
    }
    Tensor::from_f32(sa, out)
}

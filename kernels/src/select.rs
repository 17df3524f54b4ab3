use std::cmp::Ordering;

use crate::error::shape_err;
use crate::{Result, Tensor};

/// Index of each row's largest element; ties keep the lowest index (so `-0.0` and `0.0` tie),
/// NaN never wins, and a row of only NaN gives 0.
pub fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    let n = x.dim(-1);
    if n == 0 {
        return shape_err("argmax", format!("empty last dimension in {:?}", x.shape()));
    }
    Ok(x.f32s()?
        .chunks(n)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] || row[best].is_nan() && !v.is_nan() {
                    best = i;
                }
            }
            best as u32
        })
        .collect())
}

/// Descending by value with NaN below everything (even `-inf`), then ascending by index.
fn rank(v: &[f32], a: u32, b: u32) -> Ordering {
    rank_pair((a, v[a as usize]), (b, v[b as usize]))
}

/// [`rank`] on `(index, value)` pairs.
fn rank_pair((a, x): (u32, f32), (b, y): (u32, f32)) -> Ordering {
    let by_value = match (x.is_nan(), y.is_nan()) {
        (false, false) => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
        (nx, ny) => nx.cmp(&ny),
    };
    by_value.then(a.cmp(&b))
}

/// The best `k` of some `(index, value)` candidates under [`top_k`]'s ranking, best first (a
/// device's per-block winners are merged with it).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn best_of(mut cands: Vec<(u32, f32)>, k: usize) -> Vec<(u32, f32)> {
    cands.sort_unstable_by(|a, b| rank_pair(*a, *b));
    cands.truncate(k);
    cands
}

pub fn top_k(x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    if x.dims() != 1 {
        return shape_err(
            "top_k",
            format!("expected a 1-D tensor, got {:?}", x.shape()),
        );
    }
    let v = x.f32s()?;
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    let k = k.min(v.len());
    let by = |a: &u32, b: &u32| rank(v, *a, *b);
    // Partition first so the sort touches only the k winners (vocabularies are ~10⁵).
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by);
    }
    idx.truncate(k);
    idx.sort_unstable_by(by);
    Ok(idx.into_iter().map(|i| (i, v[i as usize])).collect())
}

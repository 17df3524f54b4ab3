use crate::error::shape_err;
use crate::{Result, Tensor};

pub fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    let n = x.dim(-1);
    if n == 0 {
        return shape_err("argmax", "empty last dimension");
    }
    Ok(x.f32s()?
        .chunks(n)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                // Strict `>` keeps the lowest index among ties; NaN never wins.
                if v > row[best] || row[best].is_nan() && !v.is_nan() {
                    best = i;
                }
            }
            best as u32
        })
        .collect())
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
    let key = |i: &u32| {
        let x = v[*i as usize];
        if x.is_nan() {
            f32::NEG_INFINITY
        } else {
            x
        }
    };
    let k = k.min(v.len());
    let by = |a: &u32, b: &u32| key(b).total_cmp(&key(a)).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, by);
    }
    idx.truncate(k);
    idx.sort_by(by);
    Ok(idx.into_iter().map(|i| (i, v[i as usize])).collect())
}

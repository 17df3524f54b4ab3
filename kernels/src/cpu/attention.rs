use crate::ops::AttnParams;
use crate::{Result, Tensor};

pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    let (t_len, hq, d) = (q.dim(0), q.dim(1), q.dim(2));
    let (hk, cap) = (k.dim(0), k.dim(1));
    let group = hq / hk;
    let (qs, ks, vs) = (q.f32s()?, k.f32s()?, v.f32s()?);
    let mut out = vec![0.0f32; t_len * hq * d];
    // One output row per (query position, query head): no reduction is ever split.
    super::for_each_row(&mut out, d, |row, o| {
        let (t, h) = (row / hq, row % hq);
        let kvh = h / group;
        let pos = p.q_start + t;
        let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let qv = &qs[row * d..(row + 1) * d];
        let base = kvh * cap * d;
        let mut scores: Vec<f32> = (lo..=pos)
            .map(|j| {
                let kv = &ks[base + j * d..base + (j + 1) * d];
                let s = dot(qv, kv) * p.scale;
                match p.softcap {
                    Some(c) => c * (s / c).tanh(),
                    None => s,
                }
            })
            .collect();
        let mut probs = vec![0.0f32; scores.len()];
        super::unary::softmax_row(&scores, &mut probs);
        scores.clear();
        o.fill(0.0);
        for (j, &w) in (lo..=pos).zip(&probs) {
            let vv = &vs[base + j * d..base + (j + 1) * d];
            o.iter_mut().zip(vv).for_each(|(o, &x)| *o += w * x);
        }
    });
    Tensor::from_f32(q.shape(), out)
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent partial sums let the compiler vectorise; the order is fixed, so the
    // result does not depend on threads.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

pub fn kv_write(cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    let (t_len, hk, d) = (new.dim(0), new.dim(1), new.dim(2));
    let cap = cache.dim(1);
    let src = new.f32s()?.to_vec();
    let dst = cache.f32s_mut()?;
    for t in 0..t_len {
        for h in 0..hk {
            let from = (t * hk + h) * d;
            let to = (h * cap + pos + t) * d;
            dst[to..to + d].copy_from_slice(&src[from..from + d]);
        }
    }
    Ok(())
}

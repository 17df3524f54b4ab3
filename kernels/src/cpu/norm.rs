use crate::{Result, Tensor};

pub fn rms_norm(x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let src = x.f32s()?;
    let n = x.dim(-1);
    let w = w.map(|w| w.to_vec_f32()).transpose()?;
    let mut out = vec![0.0f32; src.len()];
    super::for_each_row(&mut out, n, |i, row| {
        let s = &src[i * n..(i + 1) * n];
        // Accumulate in f64: a row of thousands of f32 squares loses bits otherwise.
        let ms = s.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / n as f64;
        let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
        match &w {
            Some(w) => row
                .iter_mut()
                .zip(s.iter().zip(w))
                .for_each(|(o, (&v, &g))| *o = v * r * g),
            None => row.iter_mut().zip(s).for_each(|(o, &v)| *o = v * r),
        }
    });
    Tensor::from_f32(x.shape(), out)
}

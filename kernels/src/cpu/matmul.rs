use crate::{Result, Tensor, Weight};

pub fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let (n, k) = (w.rows(), w.cols());
    let m = x.numel() / k;
    let xs = x.f32s()?;
    let mut wt = vec![0.0f32; n * k];
    super::dequant::dequant_rows(w, 0, n, &mut wt)?;
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] =
                super::attention::dot(&xs[i * k..(i + 1) * k], &wt[j * k..(j + 1) * k]);
        }
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap() = n;
    Tensor::from_f32(&shape, out)
}

pub fn embedding(w: &Weight, ids: &[u32]) -> Result<Tensor> {
    let d = w.cols();
    let mut out = vec![0.0f32; ids.len() * d];
    for (i, &id) in ids.iter().enumerate() {
        super::dequant::dequant_rows(w, id as usize, 1, &mut out[i * d..(i + 1) * d])?;
    }
    Tensor::from_f32(&[ids.len(), d], out)
}

use crate::params::RopeLayout;
use crate::{Result, Tensor};

pub fn rope(
    x: &Tensor,
    positions: &[usize],
    inv_freq: &[f32],
    layout: RopeLayout,
) -> Result<Tensor> {
    let (h, d) = (x.dim(1), x.dim(2));
    let half = inv_freq.len();
    let src = x.f32s()?;
    let mut out = src.to_vec();
    super::for_each_row(&mut out, h * d, |t, row| {
        // Angles in f64 so large positions keep their precision; cos/sin rounded once.
        let cs: Vec<(f32, f32)> = inv_freq
            .iter()
            .map(|&f| {
                let a = positions[t] as f64 * f as f64;
                (a.cos() as f32, a.sin() as f32)
            })
            .collect();
        for head in row.chunks_mut(d) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = match layout {
                    RopeLayout::HalfSplit => (i, i + half),
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x1 * c + x0 * s;
            }
        }
    });
    Tensor::from_f32(x.shape(), out)
}

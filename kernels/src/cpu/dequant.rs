//! Widening weight rows to f32: the per-tile primitive under matmul and embedding.

use crate::quant::QuantMode;
use crate::{DType, Result, Weight};

/// Writes rows `r0..r0 + n` of `w` as f32 into `out` (`n · cols` long).
pub fn dequant_rows(w: &Weight, r0: usize, n: usize, out: &mut [f32]) -> Result<()> {
    let cols = w.cols();
    debug_assert_eq!(out.len(), n * cols);
    match w {
        Weight::Dense(t) => {
            let range = r0 * cols..(r0 + n) * cols;
            match t.dtype() {
                DType::F32 => out.copy_from_slice(&t.f32s()?[range]),
                DType::BF16 => out
                    .iter_mut()
                    .zip(&t.as_slice::<half::bf16>()?[range])
                    .for_each(|(o, v)| *o = v.to_f32()),
                DType::F16 => out
                    .iter_mut()
                    .zip(&t.as_slice::<half::f16>()?[range])
                    .for_each(|(o, v)| *o = v.to_f32()),
                other => {
                    return Err(crate::Error::DType {
                        op: "dequant",
                        dtype: other,
                        msg: "dense weights must be f32, bf16 or f16".into(),
                    })
                }
            }
        }
        Weight::Quant(q) => {
            if q.spec.mode != QuantMode::Affine {
                return Err(crate::Error::Unsupported {
                    op: "dequant fp modes",
                    backend: "cpu",
                });
            }
            let bits = q.spec.bits;
            let g = q.spec.group_size;
            let words = q.packed.dim(1);
            let groups = cols / g;
            let packed = q.packed.as_slice::<u32>()?;
            let scales = q.scales.to_vec_f32()?;
            let biases = q.biases.as_ref().expect("affine has biases").to_vec_f32()?;
            let mask = (1u64 << bits) - 1;
            for r in 0..n {
                let row = r0 + r;
                let pw = &packed[row * words..(row + 1) * words];
                for c in 0..cols {
                    let bit = c * bits;
                    let (wi, sh) = (bit / 32, bit % 32);
                    let mut v = (pw[wi] as u64) >> sh;
                    if sh + bits > 32 {
                        v |= (pw[wi + 1] as u64) << (32 - sh);
                    }
                    let qv = (v & mask) as f32;
                    let gi = row * groups + c / g;
                    out[r * cols + c] = scales[gi] * qv + biases[gi];
                }
            }
        }
    }
    Ok(())
}

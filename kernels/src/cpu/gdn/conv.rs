//! The depthwise causal conv1d that mixes each q/k/v channel over the last `K` tokens (Qwen3.5
//! linear attention, LFM2 short conv). The `K − 1` inputs before the first token come from a
//! carried state, so a sequence fed in pieces gives the bits of feeding it whole.

use crate::cpu::{for_each_row, unary::silu as silu_fn};
use crate::{Result, Tensor};

/// `x` `[T, C]` f32, `weight` `[C, K]` any float dtype, `state` `[K−1, C]` f32 (the inputs
/// before `x`). `out[t][c] = Σ_j weight[c][j] · [state; x][t + j][c]`, optionally through SiLU;
/// `state` becomes the last `K − 1` rows of `[state; x]`.
pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    state: &mut Tensor,
    silu: bool,
) -> Result<Tensor> {
    let (t, c, kw) = (x.dim(0), x.dim(1), weight.dim(1));
    let hist = kw - 1;
    let xs = x.f32s()?;
    // Tap-major `[K, C]`, so the inner loop runs over contiguous channels.
    let w = weight.to_vec_f32()?;
    let taps: Vec<f32> = (0..kw * c).map(|i| w[(i % c) * kw + i / c]).collect();
    let st = state.f32s_mut()?;
    let row = |r: usize| -> &[f32] {
        if r < hist {
            &st[r * c..(r + 1) * c]
        } else {
            &xs[(r - hist) * c..(r - hist + 1) * c]
        }
    };
    let mut out = vec![0.0f32; t * c];
    for_each_row(&mut out, c, |i, o| {
        for (j, tap) in taps.chunks_exact(c).enumerate() {
            for ((o, &w), &v) in o.iter_mut().zip(tap).zip(row(i + j)) {
                *o += w * v;
            }
        }
        if silu {
            o.iter_mut().for_each(|v| *v = silu_fn(*v));
        }
    });
    // The new history: the last `K − 1` rows of `[state; x]`.
    let new: Vec<f32> = (t..t + hist).flat_map(|r| row(r).to_vec()).collect();
    st.copy_from_slice(&new);
    Tensor::from_f32(&[t, c], out)
}

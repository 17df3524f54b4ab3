//! Metal kernels of our own, through MLX's custom-kernel hook (`fast::MetalKernel`). Built only
//! with feature `metal`; they run only where MLX's default device is the GPU (a Mac), and the
//! op layer asks [`on_gpu`] before choosing them.
//!
//! The one kernel so far is the per-step Gated DeltaNet recurrence (the decode path): a chain of
//! generic MLX ops reads and writes the whole `[Hv, Dv, Dk]` state several times per token,
//! while this kernel loads it once into registers, walks all `T` steps and writes it back once.

use mlx_rs::fast::{
    MetalKernel, MetalKernelApplyOptions, MetalKernelOptions, MetalKernelOutput, TemplateArg,
};
use mlx_rs::{Array, Dtype};

use super::ops::f32_array;
use super::{mlx_err, mlx_shape, tensor_of};
use crate::error::Result;
use crate::Tensor;

/// Whether MLX's default device is the GPU, where the kernels here can run.
pub fn on_gpu() -> bool {
    matches!(
        super::device::default_device(),
        Ok(super::device::MlxDevice::Gpu)
    )
}

/// State rows (of `Dv`) per threadgroup: one 32-lane SIMD group per row.
const ROWS_PER_GROUP: i32 = 4;

/// The per-step recurrence, one SIMD group per state row `r` of value head `h`.
///
/// Grid `(32, Dv, Hv)`, threadgroups `(32, ROWS_PER_GROUP, 1)`: threads are numbered x-fastest,
/// so the 32 lanes of a SIMD group share one `(r, h)` and split the row's `Dk` columns between
/// them, lane `l` holding columns `l, l + 32, l + 64, …` (`NC = ceil(Dk / 32)` registers). A row
/// evolves independently of the other rows (it reads only `k_t`, `q_t`, `v_t[r]`), so no
/// threadgroup memory or barriers are needed; the two dot products per step (`S_r·k_t` and
/// `S_r·q_t`) are reduced across the lanes with `simd_sum`.
///
/// Layouts (row-major, made contiguous by MLX): `q, k` `[T, Hk, Dk]`, `v` `[T, Hv, Dv]`,
/// `g, beta` `[T, Hv]`, `state_in`/`state_out` `[Hv, Dv, Dk]`, `y` `[T, Hv, Dv]`. `T`, `Hk`,
/// `Hv` and `Dv` are read from the input shapes; `Dk` is a template constant so the register
/// array has a fixed size.
const GDN_STEP_SOURCE: &str = r#"
    const uint lane = thread_position_in_threadgroup.x;   // column slot, 0..31
    const int r = int(thread_position_in_grid.y);         // state row (value channel)
    const int h = int(thread_position_in_grid.z);         // value head
    const int T = int(v_shape[0]);
    const int Hv = int(v_shape[1]);
    const int Dv = int(v_shape[2]);
    const int Hk = int(q_shape[1]);
    if (r >= Dv || h >= Hv) {
        return; // whole SIMD groups only: every lane of a group shares r and h
    }
    const int hk = h / (Hv / Hk);                         // GQA: the key head of value head h
    constexpr int NC = (Dk + 31) / 32;

    // Row r of head h's state, lane-strided into registers.
    float s[NC];
    const device float* s_row = state_in + (size_t(h) * Dv + r) * Dk;
    for (int j = 0; j < NC; ++j) {
        const int c = int(lane) + 32 * j;
        s[j] = c < Dk ? s_row[c] : 0.0f;
    }

    for (int t = 0; t < T; ++t) {
        const device float* kt = k + (size_t(t) * Hk + hk) * Dk;
        const device float* qt = q + (size_t(t) * Hk + hk) * Dk;
        const int th = t * Hv + h;
        const float decay = metal::precise::exp(g[th]);           // g_log <= 0: e^g in [0, 1]
        const float b = beta[th];
        const float vr = v[size_t(th) * Dv + r];

        // S_r <- e^g S_r, then S_r . k_t.
        float sk = 0.0f;
        for (int j = 0; j < NC; ++j) {
            const int c = int(lane) + 32 * j;
            if (c < Dk) {
                s[j] *= decay;
                sk += s[j] * kt[c];
            }
        }
        sk = simd_sum(sk);
        const float delta = b * (vr - sk);

        // S_r <- S_r + delta k_t, then y_t[r] = S_r . q_t.
        float yq = 0.0f;
        for (int j = 0; j < NC; ++j) {
            const int c = int(lane) + 32 * j;
            if (c < Dk) {
                s[j] += delta * kt[c];
                yq += s[j] * qt[c];
            }
        }
        yq = simd_sum(yq);
        if (lane == 0) {
            y[size_t(th) * Dv + r] = yq;
        }
    }

    device float* o_row = state_out + (size_t(h) * Dv + r) * Dk;
    for (int j = 0; j < NC; ++j) {
        const int c = int(lane) + 32 * j;
        if (c < Dk) {
            o_row[c] = s[j];
        }
    }
"#;

/// Same contract as `ops::gdn_recurrent` (shapes checked by the caller), computed by the
/// Metal kernel above; `state` becomes an MLX tensor. The caller makes sure MLX runs on the GPU.
pub fn gdn_recurrent(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
) -> Result<Tensor> {
    let op = "gdn_recurrent (metal)";
    let sh = mlx_shape(op, &[v.dim(0), v.dim(1), v.dim(2), q.dim(2)])?;
    let (t, hv, dv, dk) = (sh[0], sh[1], sh[2], sh[3]);
    if t == 0 {
        return tensor_of(
            op,
            mlx_rs::ops::zeros::<f32>(&[0, hv, dv]).map_err(|e| mlx_err(op, e))?,
        );
    }
    let inputs: Vec<Array> = [q, k, v, g_log, beta, state]
        .into_iter()
        .map(|x| f32_array(op, x))
        .collect::<Result<_>>()?;
    let outputs = [
        MetalKernelOutput {
            shape: vec![t, hv, dv],
            dtype: Dtype::Float32,
        },
        MetalKernelOutput {
            shape: vec![hv, dv, dk],
            dtype: Dtype::Float32,
        },
    ];
    let options = MetalKernelApplyOptions {
        template_args: vec![("Dk".into(), TemplateArg::Int(dk))],
        init_value: None,
        verbose: false,
    };
    // SAFETY: with ensure_row_contiguous the inputs have exactly the layouts the source
    // indexes (shapes checked by `ops::gdn_check`: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta
    // [T, Hv], state [Hv, Dv, Dk], Hv a multiple of Hk). The grid covers (32 lanes, Dv rows, Hv
    // heads); lanes only touch columns < Dk, rows < Dv and heads < Hv, so every access is in
    // bounds. Each (h, r) pair is owned by one SIMD group, which writes y[t, h, r] (lane 0) for
    // every t and all Dk columns of state_out[h, r]: every output element is written exactly
    // once, no two threads write the same element, and inputs are never written.
    let out = with_step_kernel(|kernel| unsafe {
        kernel.apply(
            &inputs,
            &outputs,
            (32, dv, hv),
            (32, ROWS_PER_GROUP.min(dv), 1),
            options,
        )
    })
    .map_err(|e| mlx_err(op, e))?
    .map_err(|e| mlx_err(op, e))?;
    let [y, s]: [Array; 2] = out
        .try_into()
        .map_err(|_| mlx_err(op, "the kernel did not return two outputs"))?;
    *state = tensor_of(op, s)?;
    tensor_of(op, y)
}

/// The kernel object, built once per thread (MLX compiles and caches the library by name and
/// template arguments on first evaluation); the handle is not shared across threads.
fn with_step_kernel<R>(f: impl FnOnce(&MetalKernel) -> R) -> std::result::Result<R, String> {
    thread_local! {
        static KERNEL: std::result::Result<MetalKernel, String> = MetalKernel::new(
            "gdn_recurrent_step",
            &["q", "k", "v", "g", "beta", "state_in"],
            &["y", "state_out"],
            GDN_STEP_SOURCE,
            MetalKernelOptions {
                header: String::new(),
                ensure_row_contiguous: true,
                atomic_outputs: false,
            },
        )
        .map_err(|e| e.to_string());
    }
    KERNEL.with(|k| k.as_ref().map(f).map_err(Clone::clone))
}

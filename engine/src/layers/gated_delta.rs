//! Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5), docs/design.md §5: projections, a depthwise
//! causal conv over the q|k|v channels, L2-normalised q and k, the delta-rule recurrence (per
//! step or chunked), an RMSNorm gated by `silu(z)` and the output projection.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{ensure, Result};
use kernels::{ops, Tensor};

use super::params::params;
use super::{Linear, RmsNorm};
use crate::cache::recurrent::{Record, Recorded};
use crate::cache::RecurrentState;
use crate::weights::Scope;

/// Forwards of at least this many tokens take the chunked path under [`GdnPath::Auto`]; the
/// harness's TTFT sweep says where the crossover lies on a given machine.
pub const GDN_CHUNKED_MIN_TOKENS: usize = 64;

/// The environment variable that picks a [`GdnPath`] when no flag or request does.
pub const GDN_KERNEL_ENV: &str = "GDN_KERNEL";

/// How Gated DeltaNet layers compute a forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GdnPath {
    /// Chunked for forwards of at least [`GDN_CHUNKED_MIN_TOKENS`] tokens, per step otherwise.
    #[default]
    Auto,
    /// Always the per-step recurrence.
    PerStep,
    /// Chunked for every forward of two or more tokens (a single token always steps).
    Chunked,
}

impl GdnPath {
    pub const NAMES: [&'static str; 3] = ["auto", "perstep", "chunked"];

    pub fn name(self) -> &'static str {
        match self {
            GdnPath::Auto => "auto",
            GdnPath::PerStep => "perstep",
            GdnPath::Chunked => "chunked",
        }
    }

    /// `GDN_KERNEL` when it is set and not empty.
    pub fn from_env() -> Result<Option<GdnPath>> {
        match std::env::var(GDN_KERNEL_ENV) {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|e| anyhow::anyhow!("environment variable {GDN_KERNEL_ENV}: {e}")),
            _ => Ok(None),
        }
    }

    /// The path a run uses: `flag` (a CLI flag or request field) wins, then `GDN_KERNEL`,
    /// then `Auto`.
    pub fn resolve(flag: Option<GdnPath>) -> Result<GdnPath> {
        match flag {
            Some(p) => Ok(p),
            None => Ok(GdnPath::from_env()?.unwrap_or_default()),
        }
    }

    /// Whether a forward of `tokens` tokens runs chunked.
    pub fn chunked_for(self, tokens: usize) -> bool {
        match self {
            GdnPath::Auto => tokens >= GDN_CHUNKED_MIN_TOKENS,
            GdnPath::PerStep => false,
            GdnPath::Chunked => tokens >= 2,
        }
    }
}

impl FromStr for GdnPath {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<GdnPath, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(GdnPath::Auto),
            "perstep" | "per-step" | "per_step" => Ok(GdnPath::PerStep),
            "chunked" => Ok(GdnPath::Chunked),
            _ => Err(format!(
                "unknown Gated DeltaNet path {s:?} (expected one of: auto, perstep, chunked)"
            )),
        }
    }
}

impl std::fmt::Display for GdnPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Sizes of one Gated DeltaNet layer (config.json's `linear_*` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnConfig {
    pub hidden: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
}

impl GdnConfig {
    pub fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }

    pub fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels of the conv: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// The zero state of a sequence's start.
    pub fn new_state(&self) -> RecurrentState {
        RecurrentState::new(
            self.conv_kernel,
            self.conv_channels(),
            self.v_heads,
            self.v_dim,
            self.k_dim,
        )
    }
}

/// The reference l2norm adds this to `Σx²` (transformers' `l2norm`, mlx-lm's `normalize_qk`);
/// it is not `rms_norm_eps`.
const QK_L2_EPS: f32 = 1e-6;

#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    pub cfg: GdnConfig,
    /// Layer index, for messages.
    pub layer: usize,
    pub in_proj_qkv: Linear,
    pub in_proj_z: Linear,
    pub in_proj_b: Linear,
    pub in_proj_a: Linear,
    /// Depthwise conv taps `[C, K]`, f32.
    pub conv_weight: Tensor,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    /// Per value head, over `Dv`; stored as is in every layout (never as `w − 1`).
    pub norm: RmsNorm,
    pub out_proj: Linear,
}

impl GatedDeltaNet {
    /// Loads the layer whose tensors sit under `prefix` (e.g. `model.layers.0.linear_attn`).
    /// Both layouts use the same names below the prefix; the conv weight may be `[C, 1, K]`
    /// (Hugging Face) or `[C, K, 1]` (mlx-lm moves the kernel axis), both the same bytes as
    /// `[C, K]`.
    pub fn load(s: &Scope, cfg: GdnConfig, layer: usize, eps: f32) -> Result<GatedDeltaNet> {
        ensure!(
            cfg.k_heads > 0 && cfg.v_heads.is_multiple_of(cfg.k_heads) && cfg.conv_kernel > 0,
            "layer {layer}: `linear_num_value_heads` ({}) must be a multiple of `linear_num_key_heads` ({}), and `linear_conv_kernel_dim` ({}) at least 1",
            cfg.v_heads,
            cfg.k_heads,
            cfg.conv_kernel
        );
        let lin = |name: &str, out: usize| s.pp(name).linear(out, cfg.hidden);
        let c = cfg.conv_channels();
        let conv_weight = super::short_conv::depthwise_conv_weight(
            s.store(),
            &s.name("conv1d.weight"),
            c,
            cfg.conv_kernel,
        )?;
        Ok(GatedDeltaNet {
            cfg,
            layer,
            in_proj_qkv: lin("in_proj_qkv", c)?,
            in_proj_z: lin("in_proj_z", cfg.value_width())?,
            in_proj_b: lin("in_proj_b", cfg.v_heads)?,
            in_proj_a: lin("in_proj_a", cfg.v_heads)?,
            conv_weight,
            a_log: s.f32_tensor("A_log", &[cfg.v_heads])?,
            dt_bias: s.f32_tensor("dt_bias", &[cfg.v_heads])?,
            // The gated norm is stored as is in every layout (never as `w − 1`).
            norm: s
                .clone()
                .with_norm_offset(false)
                .pp("norm")
                .norm(cfg.v_dim, eps)?,
            out_proj: s.pp("out_proj").linear(cfg.hidden, cfg.value_width())?,
        })
    }

    /// Runs `x` `[T, hidden]` after the tokens `state` has seen; updates `state`.
    pub fn forward(&self, x: &Tensor, state: &mut RecurrentState, path: GdnPath) -> Result<Tensor> {
        let [qkv, z, b, a] = self.project(x, false)?;
        let y = self.mix([qkv, z, b, a], state, path)?;
        self.out_proj.forward(&y)
    }

    /// One decode step of several sequences: row `i` of `x` `[N, hidden]` is the new token of
    /// the sequence whose state is `states[i]`. Each row equals that sequence's
    /// [`GatedDeltaNet::forward`] alone: the projections read each weight once for a group of
    /// rows (`Linear::forward_rows`), the conv and the delta rule run per sequence.
    pub fn forward_batch(
        &self,
        x: &Tensor,
        states: &mut [&mut RecurrentState],
        path: GdnPath,
    ) -> Result<Tensor> {
        anyhow::ensure!(
            x.dim(0) == states.len(),
            "a batched decode step has {} rows for {} sequences",
            x.dim(0),
            states.len()
        );
        let proj = self.project(x, true)?;
        let ys = states
            .iter_mut()
            .enumerate()
            .map(|(i, st)| {
                let row = |t: &Tensor| t.narrow0(i, 1);
                let one = [
                    row(&proj[0])?,
                    row(&proj[1])?,
                    row(&proj[2])?,
                    row(&proj[3])?,
                ];
                self.mix(one, st, path)
            })
            .collect::<Result<Vec<_>>>()?;
        self.out_proj
            .forward_rows(&Tensor::cat0(&ys.iter().collect::<Vec<_>>())?)
    }

    /// The input projections `[qkv, z, b, a]`; `rows`: each row a separate sequence.
    fn project(&self, x: &Tensor, rows: bool) -> Result<[Tensor; 4]> {
        if !rows {
            return Linear::forward_many(
                [
                    &self.in_proj_qkv,
                    &self.in_proj_z,
                    &self.in_proj_b,
                    &self.in_proj_a,
                ],
                x,
            );
        }
        Ok([
            self.in_proj_qkv.forward_rows(x)?,
            self.in_proj_z.forward_rows(x)?,
            self.in_proj_b.forward_rows(x)?,
            self.in_proj_a.forward_rows(x)?,
        ])
    }

    /// From the projections of `T` tokens of one sequence to the gated output `[T, Vw]`
    /// (before `out_proj`): conv, q/k normalisation, the delta rule, gated norm. A recorded
    /// forward (speculative verification) keeps its inputs and runs the delta rule per step,
    /// the path its kept positions are rebuilt with.
    fn mix(
        &self,
        [qkv, z, b, a]: [Tensor; 4],
        state: &mut RecurrentState,
        path: GdnPath,
    ) -> Result<Tensor> {
        let record = state.arms_record(&qkv);
        let before = record.then(|| (state.conv.clone(), state.ssm.clone()));
        let mixed = ops::causal_conv1d(&qkv, &self.conv_weight, &mut state.conv, true)?;
        let [q, k, v, beta, g_log] = self.delta_inputs(&mixed, &b, &a)?;
        let path = if record { GdnPath::PerStep } else { path };
        let y = self.recurrence(&q, &k, &v, &g_log, &beta, &mut state.ssm, path)?;
        if let Some((conv, ssm)) = before {
            state.record = Some(Record::Ran(Box::new(Recorded {
                conv,
                ssm,
                qkv,
                delta: [q, k, v, g_log, beta],
            })));
        }
        self.gated_out(&y, &z)
    }

    /// From the conv output `[T, C]` and the `b`, `a` projections to the delta rule's
    /// inputs `[q, k, v, beta, g_log]`: L2-normalised q and k, the write strength and decay.
    fn delta_inputs(&self, mixed: &Tensor, b: &Tensor, a: &Tensor) -> Result<[Tensor; 5]> {
        let c = &self.cfg;
        let t = mixed.dim(0);
        let (kw, vw) = (c.key_width(), c.value_width());
        let q = mixed.narrow(1, 0, kw)?.reshape(&[t, c.k_heads, c.k_dim])?;
        let k = mixed.narrow(1, kw, kw)?.reshape(&[t, c.k_heads, c.k_dim])?;
        let v = mixed
            .narrow(1, 2 * kw, vw)?
            .reshape(&[t, c.v_heads, c.v_dim])?;

        // l2norm(x) = x/√(Σx² + ε) is rms_norm with ε/Dk, times 1/√Dk; q also takes the 1/√Dk
        // readout scale (mlx-lm's normalize_qk; transformers scales q by 1/√Dk after l2norm).
        let inv = 1.0 / (c.k_dim as f32).sqrt();
        let rms_eps = QK_L2_EPS / c.k_dim as f32;
        let q = ops::scale(&ops::rms_norm(&q, None, rms_eps)?, inv * inv)?;
        let k = ops::scale(&ops::rms_norm(&k, None, rms_eps)?, inv)?;

        let beta = ops::sigmoid(b)?;
        let g_log = ops::gdn_gate(a, &self.a_log, &self.dt_bias)?;
        Ok([q, k, v, beta, g_log])
    }

    /// The delta rule's output `[T, Hv, Dv]` normed per head and gated by `silu(z)`: `[T, Vw]`.
    fn gated_out(&self, y: &Tensor, z: &Tensor) -> Result<Tensor> {
        let c = &self.cfg;
        let t = y.dim(0);
        let z = z.reshape(&[t, c.v_heads, c.v_dim])?;
        let y = ops::swiglu(&z, &self.norm.forward(y)?)?;
        Ok(y.reshape(&[t, c.value_width()])?)
    }

    /// The delta rule on the chosen path. A chunked result that is not finite is recomputed
    /// per step from the state as it was before (warned about once per process).
    #[allow(clippy::too_many_arguments)]
    fn recurrence(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g_log: &Tensor,
        beta: &Tensor,
        ssm: &mut Tensor,
        path: GdnPath,
    ) -> Result<Tensor> {
        let t = q.dim(0);
        if !path.chunked_for(t) {
            return Ok(ops::gdn_recurrent(q, k, v, g_log, beta, ssm)?);
        }
        // A clone shares the buffer; the chunked op writes through copy-on-write, so this
        // snapshot stays intact.
        let before = ssm.clone();
        let y = ops::gdn_chunked(q, k, v, g_log, beta, ssm, ops::GDN_CHUNK)?;
        if all_finite(&y)? && all_finite(ssm)? {
            return Ok(y);
        }
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            eprintln!(
                "warning: chunked Gated DeltaNet gave non-finite values (layer {}, {t} tokens); \
                 recomputed per step (further fallbacks are silent)",
                self.layer
            );
        }
        *ssm = before;
        Ok(ops::gdn_recurrent(q, k, v, g_log, beta, ssm)?)
    }
}

params!(GatedDeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv_weight, a_log, dt_bias, norm, out_proj);

/// Checked where the tensor lives (on a GPU only the verdict comes back).
fn all_finite(t: &Tensor) -> Result<bool> {
    Ok(ops::all_finite(t)?)
}

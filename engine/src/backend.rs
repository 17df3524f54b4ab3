//! The compute backends a model can run on, and what each needs from the build. The CPU
//! backend is always built; MLX needs the `mlx` cargo feature, Metal the `metal` feature (on a
//! Mac), CUDA the `cuda` feature (and, at run time, an NVIDIA GPU). Tools name backends with
//! [`Backend`], so an unavailable one fails with the rebuild command or the missing piece
//! instead of running somewhere else.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use kernels::numerics::Numerics;

use crate::Pipeline;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Backend {
    /// The reference CPU backend (always built).
    #[default]
    Cpu,
    /// MLX arrays on MLX's default device: the GPU on a Mac, the CPU elsewhere.
    Mlx,
    /// MLX on the Metal GPU, with the Metal-only kernels (macOS, `--features metal`).
    Metal,
    /// The native CUDA backend on an NVIDIA GPU (`--features cuda`).
    Cuda,
}

impl Backend {
    pub const ALL: [Backend; 4] = [Backend::Cpu, Backend::Mlx, Backend::Metal, Backend::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Mlx => "mlx",
            Backend::Metal => "metal",
            Backend::Cuda => "cuda",
        }
    }

    /// Whether this build can run the backend.
    pub fn is_built(self) -> bool {
        match self {
            Backend::Cpu => true,
            Backend::Mlx => cfg!(feature = "mlx"),
            Backend::Metal => cfg!(feature = "metal"),
            Backend::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// Fails with the rebuild command when this build lacks the backend.
    pub fn require(self) -> Result<()> {
        match self {
            _ if self.is_built() => Ok(()),
            Backend::Metal => bail!(
                "backend metal: this build has no Metal; on a Mac rebuild with \
                 `--features metal` (see README, \"The MLX backend\")"
            ),
            Backend::Cuda => bail!(
                "backend cuda: this build has no CUDA; rebuild with `--features cuda` \
                 (see README, \"The CUDA backend\")"
            ),
            _ => bail!(
                "backend {self}: this build has no MLX; rebuild with `--features mlx` \
                 (see README, \"The MLX backend\")"
            ),
        }
    }

    /// Makes the process ready to run on this backend: Metal pins MLX to the GPU; MLX keeps
    /// MLX's own default device; CUDA finds the driver, the GPU, NVRTC and cuBLAS (an error
    /// says which is missing). Call before loading a model onto the backend.
    pub fn activate(self) -> Result<()> {
        self.require()?;
        #[cfg(feature = "cuda")]
        if self == Backend::Cuda {
            kernels::cuda::probe().map_err(|e| anyhow::anyhow!("backend cuda: {e}"))?;
        }
        #[cfg(feature = "metal")]
        if self == Backend::Metal {
            use kernels::mlx::device::{set_default_device, MlxDevice};
            set_default_device(MlxDevice::Gpu).context("backend metal")?;
        }
        Ok(())
    }

    /// Where results of this backend come from, for golden folders and reports: `cpu`, for
    /// MLX its device (`mlx-cpu`, `mlx-gpu` on a Mac, `mlx-cuda` with MLX's CUDA build), since
    /// MLX's devices round differently, and for
    /// CUDA the GPU model (`cuda-h200`, `cuda-gb10`): kernels and cuBLAS round per architecture.
    pub fn device_key(self) -> String {
        match self {
            Backend::Cpu => "cpu".into(),
            Backend::Metal => "metal".into(),
            Backend::Cuda => {
                #[cfg(feature = "cuda")]
                if let Ok(()) = self.activate() {
                    if let Some(name) = kernels::cuda::device_name() {
                        return cuda_key(&name);
                    }
                }
                "cuda".into()
            }
            Backend::Mlx => {
                #[cfg(feature = "mlx")]
                if let Ok(d) = kernels::mlx::device::default_device() {
                    // MLX's GPU is Metal on a Mac and CUDA with the mlx-cuda build.
                    if cfg!(feature = "mlx-cuda") && d == kernels::mlx::device::MlxDevice::Gpu {
                        return "mlx-cuda".into();
                    }
                    return format!("mlx-{}", d.name());
                }
                "mlx".into()
            }
        }
    }

    /// The arithmetic a run gets when it names none: `fast` on Metal (weights in their stored
    /// dtype, as mlx-lm runs on a Mac), `exact` elsewhere (f32; what the goldens hold).
    pub fn default_numerics(self) -> Numerics {
        match self {
            Backend::Metal => Numerics::Fast,
            _ => Numerics::Exact,
        }
    }

    /// The arithmetic a run of a model whose weight matrices are stored as `formats`
    /// ([`crate::ModelInfo::weight_formats`]) gets when it names none. On the CPU: `fast`
    /// where every matrix is bf16 (bf16 activations into bf16 dot products: prefill about
    /// 1.7× and decode at least as fast as `exact`, log-probs within 0.15 nats top-1 of an f32
    /// reference on real checkpoints, measured up to 0.081 on SmolLM2-135M of which the bf16
    /// weights alone make 0.054); `exact` for f32 weights (nothing to gain) and quantized ones
    /// (4-bit `fast` drifts by up to a nat on SmolLM2-135M; 8-bit `fast` is not faster).
    /// Elsewhere [`Backend::default_numerics`].
    pub fn default_numerics_for(self, formats: &[String]) -> Numerics {
        match self {
            Backend::Cpu if !formats.is_empty() && formats.iter().all(|f| f == "bf16") => {
                Numerics::Fast
            }
            _ => self.default_numerics(),
        }
    }

    /// The numerics that decide how a model's weights are kept on this backend: MLX keeps them
    /// in their stored dtype for `fast` and in f32 for `exact`; the CPU and CUDA keep one form
    /// for both. Callers that cache loaded models key them by this.
    pub fn resident_numerics(self, numerics: Numerics) -> Numerics {
        match self {
            Backend::Mlx | Backend::Metal => numerics,
            Backend::Cpu | Backend::Cuda => Numerics::Exact,
        }
    }

    /// The tensor device the weights live on.
    pub fn device(self) -> kernels::Device {
        match self {
            Backend::Cpu => kernels::Device::Cpu,
            #[cfg(feature = "mlx")]
            Backend::Mlx | Backend::Metal => kernels::Device::Mlx,
            #[cfg(not(feature = "mlx"))]
            Backend::Mlx | Backend::Metal => kernels::Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda => kernels::Device::Cuda,
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda => kernels::Device::Cpu,
        }
    }
}

/// The golden-folder key of a CUDA GPU: `cuda-` and its name without the vendor, lowercased,
/// runs of other characters as one `-` (`NVIDIA H100 80GB HBM3` → `cuda-h100-80gb-hbm3`).
pub fn cuda_key(device_name: &str) -> String {
    let name = device_name.trim();
    let name = name.strip_prefix("NVIDIA").unwrap_or(name);
    let mut key = String::from("cuda");
    for part in name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
    {
        key.push('-');
        key.push_str(&part.to_ascii_lowercase());
    }
    key
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Backend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .with_context(|| {
                format!("unknown backend `{s}`; expected one of: cpu, mlx, metal, cuda")
            })
    }
}

impl Pipeline {
    /// Loads a checkpoint folder onto `backend` for its default numerics (see
    /// [`Pipeline::load_for`]).
    pub fn load_on(dir: &Path, backend: Backend) -> Result<Pipeline> {
        Pipeline::load_for(dir, backend, backend.default_numerics())
    }

    /// Loads a checkpoint folder onto `backend`: the weights are read on the host, then moved
    /// to the backend's device once, in the form requests with `numerics` run fastest on (on
    /// MLX: stored dtypes for `fast`, f32 for `exact`). Requests with the other numerics still
    /// get their own results, casting weights per call.
    pub fn load_for(dir: &Path, backend: Backend, numerics: Numerics) -> Result<Pipeline> {
        backend.activate()?;
        // Other backends upload the weights, so they read them from the map.
        let pages = match backend {
            Backend::Cpu => crate::weights::Pages::for_cpu()?,
            _ => crate::weights::Pages::Mapped,
        };
        let mut p = Pipeline::load_with(dir, pages)?;
        if backend != Backend::Cpu {
            let settings = kernels::Settings::with_numerics(numerics);
            kernels::run(backend.device(), settings, || {
                p.model.to_device(backend.device())
            })
            .with_context(|| format!("moving the weights of {} to {backend}", dir.display()))?;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_golden_keys_name_the_gpu_model() {
        assert_eq!(cuda_key("NVIDIA H200"), "cuda-h200");
        assert_eq!(cuda_key("NVIDIA GB10"), "cuda-gb10");
        assert_eq!(cuda_key("NVIDIA H100 80GB HBM3"), "cuda-h100-80gb-hbm3");
        assert_eq!(cuda_key("Tesla T4"), "cuda-tesla-t4");
    }

    #[test]
    fn every_backend_parses_by_name() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
        }
        let e = "tpu".parse::<Backend>().unwrap_err().to_string();
        assert!(e.contains("cuda"), "{e}");
    }
}

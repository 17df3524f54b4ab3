//! The compute backends a model can run on, and what each needs from the build. The CPU
//! backend is always built; MLX needs the `mlx` cargo feature, Metal the `metal` feature (on a
//! Mac). Tools name backends with [`Backend`], so an unavailable one fails with the rebuild
//! command instead of running somewhere else.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use anyhow::{bail, Context, Result};

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
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Cpu, Backend::Mlx, Backend::Metal];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Mlx => "mlx",
            Backend::Metal => "metal",
        }
    }

    /// Whether this build can run the backend.
    pub fn is_built(self) -> bool {
        match self {
            Backend::Cpu => true,
            Backend::Mlx => cfg!(feature = "mlx"),
            Backend::Metal => cfg!(feature = "metal"),
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
            _ => bail!(
                "backend {self}: this build has no MLX; rebuild with `--features mlx` \
                 (see README, \"The MLX backend\")"
            ),
        }
    }

    /// Makes the process ready to run on this backend: Metal pins MLX to the GPU; MLX keeps
    /// MLX's own default device. Call before loading a model onto the backend.
    pub fn activate(self) -> Result<()> {
        self.require()?;
        #[cfg(feature = "metal")]
        if self == Backend::Metal {
            use kernels::mlx::device::{set_default_device, MlxDevice};
            set_default_device(MlxDevice::Gpu).context("backend metal")?;
        }
        Ok(())
    }

    /// Where results of this backend come from, for golden folders and reports: `cpu`, and for
    /// MLX its device (`mlx-cpu`, `mlx-gpu`), since MLX's CPU and GPU round differently.
    pub fn device_key(self) -> String {
        match self {
            Backend::Cpu => "cpu".into(),
            Backend::Metal => "metal".into(),
            Backend::Mlx => {
                #[cfg(feature = "mlx")]
                if let Ok(d) = kernels::mlx::device::default_device() {
                    return format!("mlx-{}", d.name());
                }
                "mlx".into()
            }
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
        }
    }
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
            .with_context(|| format!("unknown backend `{s}`; expected one of: cpu, mlx, metal"))
    }
}

impl Pipeline {
    /// Loads a checkpoint folder onto `backend`: the weights are read on the host, then moved
    /// to the backend's device once.
    pub fn load_on(dir: &Path, backend: Backend) -> Result<Pipeline> {
        backend.activate()?;
        let mut p = Pipeline::load(dir)?;
        if backend != Backend::Cpu {
            p.model
                .to_device(backend.device())
                .with_context(|| format!("moving the weights of {} to {backend}", dir.display()))?;
        }
        Ok(p)
    }
}

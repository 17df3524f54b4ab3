//! Which device MLX runs on. MLX keeps one process-wide default device (the GPU when the
//! library was built with Metal or CUDA, else the CPU); every MLX op here runs on the default
//! stream of that device.

use mlx_rs::{Device, DeviceType};

use crate::error::Result;

use super::mlx_err;

/// MLX's two device kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlxDevice {
    Cpu,
    Gpu,
}

impl MlxDevice {
    pub fn name(self) -> &'static str {
        match self {
            MlxDevice::Cpu => "cpu",
            MlxDevice::Gpu => "gpu",
        }
    }
}

/// The device MLX ops run on now.
pub fn default_device() -> Result<MlxDevice> {
    let d = Device::try_default().map_err(|e| mlx_err("mlx device", e))?;
    Ok(match d.get_type().map_err(|e| mlx_err("mlx device", e))? {
        DeviceType::Cpu => MlxDevice::Cpu,
        DeviceType::Gpu => MlxDevice::Gpu,
    })
}

/// Whether MLX ops run on its CPU device now (where its f32 products go to BLAS and its bf16
/// and quantized ones do not); false when the device cannot be read.
pub(crate) fn on_cpu() -> bool {
    matches!(default_device(), Ok(MlxDevice::Cpu))
}

/// Makes `d` MLX's default device for the whole process. Asking for the GPU from a library
/// without one is an error, not a silent fall back to the CPU.
pub fn set_default_device(d: MlxDevice) -> Result<()> {
    if d == MlxDevice::Gpu && !gpu_available() {
        return Err(mlx_err(
            "mlx device",
            "this MLX library has no GPU (Linux wheels `mlx[cpu]` are CPU-only; on a Mac \
             install `mlx` with `mlx-metal`)",
        ));
    }
    Device::set_default(&match d {
        MlxDevice::Cpu => Device::cpu(),
        MlxDevice::Gpu => Device::gpu(),
    });
    Ok(())
}

/// Whether this MLX library has a GPU device (Metal or CUDA builds).
pub fn gpu_available() -> bool {
    let mut avail = false;
    // SAFETY: a fresh device handle, queried once and freed; mlx-c writes `avail` only.
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let rc = mlx_sys::mlx_device_is_available(&mut avail, dev);
        mlx_sys::mlx_device_free(dev);
        rc == 0 && avail
    }
}

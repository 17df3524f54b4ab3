//! The CUDA backend (feature `cuda`): tensors whose storage is device memory of one NVIDIA GPU.
//!
//! - cuBLAS runs the dense matrix products (f32 weights in f32; bf16/f16 weights in their own
//!   type with f32 accumulation and output), and the batched products of the chunked Gated
//!   DeltaNet;
//! - every other op is a kernel of `kernels/cuda/*.cu`, compiled by NVRTC at run time for the
//!   device's compute capability and cached per process ([`sources`], [`context`]);
//! - weights move to the device once ([`matmul::resident_weight`]); an op whose inputs live on
//!   the device leaves its output there, and host inputs (a fresh cache or state) are copied in
//!   on first use, so a forward never copies activations back to the host;
//! - the driver, NVRTC and cuBLAS are loaded at run time (cudarc's dynamic loading), so this
//!   builds on machines without CUDA; [`probe`] says whether it can run here.

mod backend;
mod blas;
mod context;
mod elementwise;
mod gdn;
pub mod launch;
mod matmul;
mod rows;
mod signature;
pub mod sources;

pub(crate) use backend::Cuda;
pub use context::{device_name, probe};
pub(crate) use elementwise::{add, all_finite, kv_write, moe_combine, mul, narrow, swiglu, unary};
pub(crate) use gdn::{causal_conv1d, gdn_chunked, gdn_gate, gdn_recurrent};
pub(crate) use matmul::{embedding, matmul, resident_weight};
pub(crate) use rows::{argmax, attention, log_softmax, rms_norm, rope, softmax, top_k};

use std::sync::Arc;

use cudarc::driver::result as drv;

use crate::error::{invalid, Result};
use crate::storage::{Bytes, Storage};
use crate::{DType, Tensor};
use context::{cuda_err, gpu};

/// Device memory shared by the tensors viewing it; freed (stream-ordered) with the last one.
pub struct CudaBuf {
    ptr: u64,
    bytes: usize,
}

impl CudaBuf {
    /// `bytes` of uninitialised device memory.
    fn alloc(bytes: usize) -> Result<CudaBuf> {
        if bytes == 0 {
            return Ok(CudaBuf { ptr: 0, bytes: 0 });
        }
        let g = gpu()?;
        // SAFETY: stream-ordered allocation on the stream every op uses.
        let ptr = unsafe { drv::malloc_async(g.stream, bytes) }.map_err(|e| {
            cuda_err(
                "alloc",
                format!("cannot allocate {bytes} bytes on the GPU: {e:?}"),
            )
        })?;
        Ok(CudaBuf { ptr, bytes })
    }

    pub fn len_bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        if let Ok(g) = gpu() {
            // SAFETY: allocated by `alloc` on this stream; every use was queued before this
            // free on the same stream. A failure here can only leak.
            let _ = unsafe { drv::free_async(self.ptr, g.stream) };
        }
    }
}

/// The device address of a tensor's first element.
pub(crate) fn ptr(t: &Tensor) -> Result<u64> {
    match t.storage() {
        Storage::Cuda(b) => Ok(b.ptr + (t.offset() * t.dtype().size_in_bytes()) as u64),
        _ => invalid("cuda", "tensor is not on the CUDA device"),
    }
}

/// A new device tensor of `shape` and `dtype`, uninitialised.
pub(crate) fn empty(shape: &[usize], dtype: DType) -> Result<Tensor> {
    let buf = CudaBuf::alloc(crate::numel(shape) * dtype.size_in_bytes())?;
    Ok(Tensor::from_storage(
        shape.to_vec(),
        dtype,
        Storage::Cuda(Arc::new(buf)),
    ))
}

/// A new device tensor of zeros.
pub(crate) fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
    let t = empty(shape, dtype)?;
    let bytes = crate::numel(shape) * dtype.size_in_bytes();
    if bytes > 0 {
        let g = gpu()?;
        // SAFETY: `t` owns `bytes` bytes of device memory.
        unsafe { drv::memset_d8_async(ptr(&t)?, 0, bytes, g.stream) }
            .map_err(|e| cuda_err("zeros", format!("{e:?}")))?;
    }
    Ok(t)
}

/// Copies a host tensor to the device (other devices go through the host).
pub(crate) fn upload(t: &Tensor) -> Result<Tensor> {
    if t.device() != crate::Device::Cpu {
        return upload(&t.to_device(crate::Device::Cpu)?);
    }
    let bytes = t.raw_bytes()?;
    let out = empty(t.shape(), t.dtype())?;
    if !bytes.is_empty() {
        let g = gpu()?;
        // SAFETY: `out` holds exactly `bytes.len()` bytes. From pageable memory the async copy
        // has staged `bytes` when it returns (so they may be dropped) and, unlike the
        // synchronous copy, does not wait for the GPU to finish earlier work.
        unsafe { drv::memcpy_htod_async(ptr(&out)?, bytes, g.stream) }
            .map_err(|e| cuda_err("to_device", format!("{e:?}")))?;
    }
    Ok(out)
}

/// Copies a device tensor to the host (waits for every queued op).
pub(crate) fn download(t: &Tensor) -> Result<Tensor> {
    let n = t.numel() * t.dtype().size_in_bytes();
    let mut host = vec![0u8; n];
    if n > 0 {
        let src = ptr(t)?;
        gpu()?;
        // SAFETY: `src` addresses `n` bytes of the tensor's buffer; the synchronous copy waits
        // for the stream.
        unsafe { drv::memcpy_dtoh_sync(&mut host, src) }
            .map_err(|e| cuda_err("to_device", format!("{e:?}")))?;
    }
    if t.dtype() == DType::F32 {
        return Tensor::from_f32(t.shape(), pod_vec(&host));
    }
    Tensor::from_bytes(t.shape(), t.dtype(), Bytes::from_vec(host))
}

/// `t` on the device: itself when it is there, else a copy.
pub(crate) fn on_device(t: &Tensor) -> Result<Tensor> {
    if t.device() == crate::Device::Cuda {
        Ok(t.clone())
    } else {
        upload(t)
    }
}

/// An f32 device tensor ready for an op: copied in from the host when needed, widened from a
/// 16-bit float (small weights such as norm gains and conv taps) on the host first.
pub(crate) fn f32_on_device(op: &'static str, t: &Tensor) -> Result<Tensor> {
    match t.dtype() {
        DType::F32 => on_device(t),
        DType::BF16 | DType::F16 | DType::F64 => {
            upload(&t.to_device(crate::Device::Cpu)?.to_f32()?)
        }
        other => Err(crate::Error::DType {
            op,
            dtype: other,
            msg: "expected a float tensor".into(),
        }),
    }
}

/// A device tensor this op may write in place: `t`'s own buffer when no other tensor shares it
/// and it is viewed whole, else a private copy (copy-on-write, as host tensors do), which then
/// replaces `t`.
pub(crate) fn make_mut(t: &mut Tensor) -> Result<u64> {
    match t.storage() {
        Storage::Cuda(b) => {
            let exclusive = Arc::strong_count(b) == 1
                && t.offset() == 0
                && b.bytes == t.numel() * t.dtype().size_in_bytes();
            if !exclusive {
                *t = copy(t)?;
            }
        }
        // The upload is a private buffer already.
        _ => *t = upload(t)?,
    }
    ptr(t)
}

/// A device copy of a device tensor, in a buffer of its own.
pub(crate) fn copy(t: &Tensor) -> Result<Tensor> {
    let out = empty(t.shape(), t.dtype())?;
    let bytes = t.numel() * t.dtype().size_in_bytes();
    if bytes > 0 {
        let g = gpu()?;
        // SAFETY: both buffers hold `bytes` bytes at these addresses; stream-ordered copy.
        unsafe { drv::memcpy_dtod_async(ptr(&out)?, ptr(t)?, bytes, g.stream) }
            .map_err(|e| cuda_err("copy", format!("{e:?}")))?;
    }
    Ok(out)
}

/// Copies small host values (ids, positions, frequencies) into a fresh device buffer.
pub(crate) fn upload_slice<T: bytemuck::Pod>(
    shape: &[usize],
    dtype: DType,
    data: &[T],
) -> Result<Tensor> {
    upload(&Tensor::from_slice(shape, dtype, data)?)
}

/// Reads back a small device buffer of plain values (argmax indices, top-k candidates, flags).
pub(crate) fn read_back<T: bytemuck::Pod>(t: &Tensor) -> Result<Vec<T>> {
    let host = download(t)?;
    Ok(pod_vec(host.raw_bytes()?))
}

/// Little-endian bytes as plain values (copied, so no alignment is assumed).
fn pod_vec<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

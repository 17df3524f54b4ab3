//! The MLX backend (feature `mlx`): tensors whose storage is an mlx-rs `Array` on MLX's default
//! device (Metal on a Mac, the CPU elsewhere). MLX evaluates lazily; an array is evaluated only
//! when the host needs its values (`Tensor::to_device(Device::Cpu)`), so a chain of ops runs as
//! one graph.

mod backend;
pub mod device;
pub mod gdn;
#[cfg(feature = "metal")]
pub mod metal;
pub mod moe;
pub mod more;
pub mod ops;

pub(crate) use backend::Mlx;

use std::sync::{Arc, Mutex};

use mlx_rs::{Array, Dtype};

use crate::error::{invalid, Result};
use crate::storage::{Bytes, Storage};
use crate::{DType, Error, Tensor};

/// An MLX array shared by tensor clones. mlx-rs arrays are `Send` but not `Sync` (evaluation
/// mutates them); the mutex makes the handle shareable and is held only to clone the
/// (reference-counted) array out.
pub struct MlxArray(Mutex<Array>);

impl MlxArray {
    pub fn new(a: Array) -> Self {
        MlxArray(Mutex::new(a))
    }

    /// A new handle to the same array (no copy of the data).
    pub fn array(&self) -> Array {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

pub(crate) fn mlx_err(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Invalid {
        op,
        msg: format!("MLX: {e}"),
    }
}

fn to_mlx_dtype(op: &'static str, d: DType) -> Result<Dtype> {
    Ok(match d {
        DType::F32 => Dtype::Float32,
        DType::F16 => Dtype::Float16,
        DType::BF16 => Dtype::Bfloat16,
        DType::U32 => Dtype::Uint32,
        DType::U8 => Dtype::Uint8,
        DType::I32 => Dtype::Int32,
        DType::I64 => Dtype::Int64,
        DType::F64 => {
            return Err(Error::DType {
                op,
                dtype: d,
                msg: "MLX has no f64 on its GPU; convert to f32 first".into(),
            })
        }
    })
}

fn from_mlx_dtype(op: &'static str, d: Dtype) -> Result<DType> {
    Ok(match d {
        Dtype::Float32 => DType::F32,
        Dtype::Float16 => DType::F16,
        Dtype::Bfloat16 => DType::BF16,
        Dtype::Uint32 => DType::U32,
        Dtype::Uint8 => DType::U8,
        Dtype::Int32 => DType::I32,
        Dtype::Int64 => DType::I64,
        other => return invalid(op, format!("MLX dtype {other:?} has no tensor dtype")),
    })
}

fn mlx_shape(op: &'static str, shape: &[usize]) -> Result<Vec<i32>> {
    shape
        .iter()
        .map(|&d| i32::try_from(d).map_err(|_| mlx_err(op, format!("dimension {d} too large"))))
        .collect()
}

/// The tensor as an MLX array of its own shape: MLX storage is shared, host data is copied in.
pub(crate) fn array_of(op: &'static str, t: &Tensor) -> Result<Array> {
    let shape = mlx_shape(op, t.shape())?;
    match t.storage() {
        Storage::Mlx(a) => {
            if t.offset() != 0 || a.array().size() != t.numel() {
                return Err(Error::Unsupported {
                    op,
                    backend: "mlx (views with an offset)",
                });
            }
            let a = a.array();
            if a.shape() == shape.as_slice() {
                Ok(a)
            } else {
                a.reshape(&shape).map_err(|e| mlx_err(op, e))
            }
        }
        _ => {
            let dtype = to_mlx_dtype(op, t.dtype())?;
            let bytes = t.raw_bytes()?;
            // SAFETY: `bytes` holds exactly numel·size_of(dtype) bytes of `dtype` in row-major
            // order (checked by the tensor's constructors); MLX copies them.
            Ok(unsafe { Array::from_raw_data(bytes.as_ptr().cast(), &shape, dtype) })
        }
    }
}

/// Wraps an MLX array (not evaluated) as a tensor.
pub(crate) fn tensor_of(op: &'static str, a: Array) -> Result<Tensor> {
    let dtype = from_mlx_dtype(op, a.dtype())?;
    let shape = a.shape().iter().map(|&d| d as usize).collect::<Vec<_>>();
    Ok(Tensor::from_storage(
        shape,
        dtype,
        Storage::Mlx(Arc::new(MlxArray::new(a))),
    ))
}

/// Copies a host tensor into an MLX array.
pub(crate) fn upload(t: &Tensor) -> Result<Tensor> {
    let a = array_of("to_device", t)?;
    tensor_of("to_device", a)
}

/// Evaluates an MLX tensor and copies its values to the host.
pub(crate) fn download(t: &Tensor) -> Result<Tensor> {
    let op = "to_device";
    let a = array_of(op, t)?.contiguous().map_err(|e| mlx_err(op, e))?;
    a.eval().map_err(|e| mlx_err(op, e))?;
    let shape = t.shape();
    macro_rules! bytes_of {
        ($ty:ty) => {{
            let s = a.try_as_slice::<$ty>().map_err(|e| mlx_err(op, e))?;
            Bytes::from_vec(bytemuck::cast_slice(s).to_vec())
        }};
    }
    let bytes = match t.dtype() {
        DType::F32 => {
            let s = a.try_as_slice::<f32>().map_err(|e| mlx_err(op, e))?;
            return Tensor::from_f32(shape, s.to_vec());
        }
        DType::F16 => bytes_of!(half::f16),
        DType::BF16 => bytes_of!(half::bf16),
        DType::U32 => bytes_of!(u32),
        DType::U8 => bytes_of!(u8),
        DType::I32 => bytes_of!(i32),
        DType::I64 => bytes_of!(i64),
        DType::F64 => return invalid(op, "MLX tensors are never f64"),
    };
    Tensor::from_bytes(shape, t.dtype(), bytes)
}

/// `start..start+len` along `dim` of an MLX tensor, as a new (lazy) MLX array: MLX tensors
/// carry no offset views.
pub(crate) fn narrow(t: &Tensor, dim: usize, start: usize, len: usize) -> Result<Tensor> {
    let op = "narrow";
    let idx = (start..start + len)
        .map(|i| i32::try_from(i).map_err(|_| mlx_err(op, "index too large")))
        .collect::<Result<Vec<i32>>>()?;
    let idx = Array::from_slice(&idx, &[len as i32]);
    let a = array_of(op, t)?
        .take_axis(&idx, dim as i32)
        .map_err(|e| mlx_err(op, e))?;
    tensor_of(op, a)
}

use std::sync::Arc;

use crate::error::{invalid, shape_err, Result};
use crate::storage::{Bytes, Device, Storage};
use crate::DType;

/// A dense, row-major, contiguous tensor. Views that keep contiguity (reshape, narrowing the
/// first dimension) are cheap; everything else materialises a new buffer.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
    /// Offset of the first element, in elements of `dtype`.
    offset: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {:?}, {:?})",
            self.shape,
            self.dtype,
            self.device()
        )
    }
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Tensor {
    /// An f32 host tensor; `data.len()` must equal the product of `shape`.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        if numel(shape) != data.len() {
            return shape_err(
                "from_f32",
                format!(
                    "shape {shape:?} needs {} elements, got {}",
                    numel(shape),
                    data.len()
                ),
            );
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::F32,
            storage: Storage::CpuF32(Arc::new(data)),
            offset: 0,
        })
    }

    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            dtype: DType::F32,
            storage: Storage::CpuF32(Arc::new(vec![0.0; numel(shape)])),
            offset: 0,
        }
    }

    /// A tensor viewing `bytes` in place (copied only when misaligned for `dtype`).
    pub fn from_bytes(shape: &[usize], dtype: DType, bytes: Bytes) -> Result<Tensor> {
        let want = numel(shape) * dtype.size_in_bytes();
        if bytes.len() != want {
            return shape_err(
                "from_bytes",
                format!(
                    "shape {shape:?} of {dtype:?} needs {want} bytes, got {}",
                    bytes.len()
                ),
            );
        }
        let bytes = match dtype.size_in_bytes() {
            1 => bytes,
            2 => bytes.aligned_for::<u16>(),
            4 => bytes.aligned_for::<u32>(),
            _ => bytes.aligned_for::<u64>(),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Storage::CpuBytes(bytes),
            offset: 0,
        })
    }

    /// Convenience for tests and small host data of any plain element type.
    pub fn from_slice<T: bytemuck::Pod>(
        shape: &[usize],
        dtype: DType,
        data: &[T],
    ) -> Result<Tensor> {
        Tensor::from_bytes(
            shape,
            dtype,
            Bytes::from_vec(bytemuck::cast_slice(data).to_vec()),
        )
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dims(&self) -> usize {
        self.shape.len()
    }

    /// Size of dimension `d`; negative counts from the end.
    pub fn dim(&self, d: isize) -> usize {
        let i = if d < 0 {
            self.shape.len() as isize + d
        } else {
            d
        };
        self.shape[i as usize]
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.storage.device()
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Offset of the first element in the storage, in elements.
    #[cfg_attr(not(any(feature = "mlx", feature = "cuda")), allow(dead_code))]
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// A tensor over a whole backend buffer (the shape must match the buffer).
    #[cfg_attr(not(any(feature = "mlx", feature = "cuda")), allow(dead_code))]
    pub(crate) fn from_storage(shape: Vec<usize>, dtype: DType, storage: Storage) -> Tensor {
        Tensor {
            shape,
            dtype,
            storage,
            offset: 0,
        }
    }

    /// The same values on `device`: a copy for host <-> MLX (evaluating MLX's lazy graph
    /// when leaving it) and host <-> CUDA, the tensor itself when it is already there.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        #[cfg(feature = "cuda")]
        match (device, self.device()) {
            (Device::Cuda, _) => return crate::cuda::upload(self),
            (Device::Cpu, Device::Cuda) => return crate::cuda::download(self),
            _ => {}
        }
        match device {
            #[cfg(feature = "mlx")]
            Device::Mlx => crate::mlx::upload(self),
            #[cfg(feature = "mlx")]
            Device::Cpu => crate::mlx::download(self),
            #[cfg(not(feature = "mlx"))]
            Device::Cpu => Ok(self.clone()),
            #[cfg(feature = "cuda")]
            Device::Cuda => unreachable!("handled above"),
        }
    }

    /// The raw little-endian bytes of a host tensor.
    pub fn raw_bytes(&self) -> Result<&[u8]> {
        let es = self.dtype.size_in_bytes();
        let (start, len) = (self.offset * es, self.numel() * es);
        match &self.storage {
            Storage::CpuBytes(b) => Ok(&b.as_slice()[start..start + len]),
            Storage::CpuF32(v) => Ok(&bytemuck::cast_slice::<f32, u8>(v)[start..start + len]),
            #[cfg(feature = "mlx")]
            Storage::Mlx(_) => crate::error::invalid(
                "raw_bytes",
                "the tensor lives on MLX; copy it to the host with to_device(Device::Cpu) first",
            ),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => crate::error::invalid(
                "raw_bytes",
                "the tensor lives on the GPU; copy it to the host with to_device(Device::Cpu) first",
            ),
        }
    }

    /// The elements viewed as `T` (which must have the dtype's size).
    pub fn as_slice<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        if std::mem::size_of::<T>() != self.dtype.size_in_bytes() {
            return invalid(
                "as_slice",
                format!(
                    "element size {} does not match dtype {:?}",
                    std::mem::size_of::<T>(),
                    self.dtype
                ),
            );
        }
        bytemuck::try_cast_slice(self.raw_bytes()?).map_err(|e| crate::Error::Invalid {
            op: "as_slice",
            msg: e.to_string(),
        })
    }

    /// The elements of an f32 tensor.
    pub fn f32s(&self) -> Result<&[f32]> {
        if self.dtype != DType::F32 {
            return Err(crate::Error::DType {
                op: "f32s",
                dtype: self.dtype,
                msg: "expected an f32 tensor".into(),
            });
        }
        self.as_slice::<f32>()
    }

    /// Mutable f32 elements, copying the buffer first if it is shared or borrowed (copy on
    /// write), so writers never disturb other views.
    pub fn f32s_mut(&mut self) -> Result<&mut [f32]> {
        if self.dtype != DType::F32 {
            return Err(crate::Error::DType {
                op: "f32s_mut",
                dtype: self.dtype,
                msg: "expected an f32 tensor".into(),
            });
        }
        let n = self.numel();
        let whole = match &self.storage {
            Storage::CpuF32(v) => self.offset == 0 && v.len() == n,
            Storage::CpuBytes(_) => false,
            #[cfg(feature = "mlx")]
            Storage::Mlx(_) => false,
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => false,
        };
        if !whole {
            let copy = self.f32s()?.to_vec();
            self.storage = Storage::CpuF32(Arc::new(copy));
            self.offset = 0;
        }
        match &mut self.storage {
            Storage::CpuF32(v) => Ok(Arc::make_mut(v).as_mut_slice()),
            _ => unreachable!("converted above"),
        }
    }

    /// Any float tensor widened to a new f32 tensor (f32 input is shared, not copied).
    pub fn to_f32(&self) -> Result<Tensor> {
        let data = match self.dtype {
            DType::F32 => return Ok(self.clone()),
            DType::BF16 => self
                .as_slice::<half::bf16>()?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
            DType::F16 => self
                .as_slice::<half::f16>()?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
            DType::F64 => self.as_slice::<f64>()?.iter().map(|&x| x as f32).collect(),
            other => {
                return Err(crate::Error::DType {
                    op: "to_f32",
                    dtype: other,
                    msg: "not a float type".into(),
                })
            }
        };
        Tensor::from_f32(&self.shape, data)
    }

    /// The f32 elements as an owned vector (widening other float dtypes).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        Ok(self.to_f32()?.f32s()?.to_vec())
    }

    /// Same elements, new shape (a view).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return shape_err(
                "reshape",
                format!("cannot reshape {:?} into {shape:?}", self.shape),
            );
        }
        let mut t = self.clone();
        t.shape = shape.to_vec();
        Ok(t)
    }

    /// Rows `start..start+len` of dimension 0 (a view).
    pub fn narrow0(&self, start: usize, len: usize) -> Result<Tensor> {
        let Some(&d0) = self.shape.first() else {
            return shape_err("narrow0", "cannot narrow a scalar");
        };
        if start + len > d0 {
            return shape_err(
                "narrow0",
                format!(
                    "rows {start}..{} out of range for {:?}",
                    start + len,
                    self.shape
                ),
            );
        }
        #[cfg(feature = "mlx")]
        if self.device() == Device::Mlx {
            return crate::mlx::narrow(self, 0, start, len);
        }
        let row = numel(&self.shape[1..]);
        let mut t = self.clone();
        t.shape[0] = len;
        t.offset += start * row;
        Ok(t)
    }

    /// `start..start+len` along any dimension; a view for dimension 0, a copy otherwise.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        if dim >= self.dims() || start + len > self.shape[dim] {
            return shape_err(
                "narrow",
                format!(
                    "{start}..{} along dim {dim} of {:?}",
                    start + len,
                    self.shape
                ),
            );
        }
        #[cfg(feature = "mlx")]
        if self.device() == Device::Mlx {
            return crate::mlx::narrow(self, dim, start, len);
        }
        let contiguous = dim == 0 || self.shape[..dim].iter().all(|&d| d == 1);
        #[cfg(feature = "cuda")]
        if self.device() == Device::Cuda && !contiguous {
            return crate::cuda::narrow(self, dim, start, len);
        }
        if contiguous {
            let lead = self.shape[..dim].iter().product::<usize>();
            let flat = self.reshape(&[lead * self.shape[dim], numel(&self.shape[dim + 1..])])?;
            let mut out = flat.narrow0(start, len)?;
            let mut shape = self.shape.clone();
            shape[dim] = len;
            out.shape = shape;
            return Ok(out);
        }
        let src = self.f32s()?;
        let outer: usize = self.shape[..dim].iter().product();
        let inner: usize = numel(&self.shape[dim + 1..]);
        let d = self.shape[dim];
        let mut data = Vec::with_capacity(outer * len * inner);
        for o in 0..outer {
            let base = (o * d + start) * inner;
            data.extend_from_slice(&src[base..base + len * inner]);
        }
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Tensor::from_f32(&shape, data)
    }

    /// Stack f32 tensors of equal trailing shape along dimension 0.
    pub fn cat0(parts: &[&Tensor]) -> Result<Tensor> {
        let Some(first) = parts.first() else {
            return shape_err("cat0", "nothing to concatenate");
        };
        let tail = &first.shape[1..];
        let mut data = Vec::new();
        let mut rows = 0;
        for p in parts {
            if &p.shape[1..] != tail {
                return shape_err(
                    "cat0",
                    format!("{:?} does not match {:?}", p.shape, first.shape),
                );
            }
            rows += p.shape[0];
            data.extend_from_slice(p.f32s()?);
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        Tensor::from_f32(&shape, data)
    }
}

use std::sync::Arc;

/// Anything that owns a run of bytes a tensor can view without copying: a memory-mapped
/// checkpoint file, or a buffer the loader had to copy (to fix alignment, or after conversion).
pub trait ByteOwner: Send + Sync + 'static {
    fn bytes(&self) -> &[u8];
}

impl ByteOwner for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// An owned buffer aligned to 8 bytes, so any element type can be viewed in place.
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    pub fn copy_from(src: &[u8]) -> Self {
        let mut words = vec![0u64; src.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..src.len()].copy_from_slice(src);
        AlignedBuf {
            words,
            len: src.len(),
        }
    }
}

impl ByteOwner for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

/// A cheap-to-clone window into bytes owned elsewhere.
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn ByteOwner>,
    start: usize,
    len: usize,
}

impl Bytes {
    pub fn new(owner: Arc<dyn ByteOwner>) -> Self {
        let len = owner.bytes().len();
        Bytes {
            owner,
            start: 0,
            len,
        }
    }

    pub fn from_vec(v: Vec<u8>) -> Self {
        Bytes::new(Arc::new(AlignedBuf::copy_from(&v)))
    }

    /// A sub-window; `None` when it would run past the end.
    pub fn slice(&self, start: usize, len: usize) -> Option<Bytes> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(Bytes {
            owner: self.owner.clone(),
            start: self.start + start,
            len,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.owner.bytes()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same bytes, copied into an aligned buffer when they are not aligned for `T`.
    pub fn aligned_for<T: bytemuck::Pod>(&self) -> Bytes {
        if bytemuck::try_cast_slice::<u8, T>(self.as_slice()).is_ok() {
            self.clone()
        } else {
            Bytes::new(Arc::new(AlignedBuf::copy_from(self.as_slice())))
        }
    }
}

/// Where a tensor's elements live. New backends add variants here (device buffers, lazy
/// arrays); ops match on it and report `Unsupported` for combinations they do not handle.
#[derive(Clone)]
pub enum Storage {
    /// Host f32 owned by the tensor (activations, caches); copy-on-write when shared.
    CpuF32(Arc<Vec<f32>>),
    /// Host bytes of any dtype viewed in place (weights straight from a mapped file).
    CpuBytes(Bytes),
    /// An MLX array (feature `mlx`), lazily evaluated on MLX's default device.
    #[cfg(feature = "mlx")]
    Mlx(Arc<crate::mlx::MlxArray>),
    /// Device memory of the CUDA GPU (feature `cuda`), shared by the tensors viewing it.
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::cuda::CudaBuf>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// MLX's default device: the GPU (Metal) on a Mac, the CPU elsewhere.
    #[cfg(feature = "mlx")]
    Mlx,
    /// The CUDA GPU (the first one `CUDA_VISIBLE_DEVICES` shows).
    #[cfg(feature = "cuda")]
    Cuda,
}

impl Storage {
    pub fn device(&self) -> Device {
        match self {
            Storage::CpuF32(_) | Storage::CpuBytes(_) => Device::Cpu,
            #[cfg(feature = "mlx")]
            Storage::Mlx(_) => Device::Mlx,
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Device::Cuda,
        }
    }
}

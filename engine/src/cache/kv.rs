use anyhow::Result;
use kernels::{ops, Tensor};

/// A flat KV cache `[Hk, capacity, D]` per layer that grows by doubling.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub k: Tensor,
    pub v: Tensor,
    pub len: usize,
}

impl KvCache {
    pub fn new(kv_heads: usize, head_dim: usize, capacity: usize) -> KvCache {
        KvCache {
            k: Tensor::zeros(&[kv_heads, capacity, head_dim]),
            v: Tensor::zeros(&[kv_heads, capacity, head_dim]),
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.k.dim(1)
    }

    /// Appends `k`, `v` `[T, Hk, D]` at the end, growing the buffers when needed.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let need = self.len + k.dim(0);
        if need > self.capacity() {
            let cap = need.max(2 * self.capacity()).max(64);
            self.k = grow(&self.k, self.len, cap)?;
            self.v = grow(&self.v, self.len, cap)?;
        }
        ops::kv_write(&mut self.k, k, self.len)?;
        ops::kv_write(&mut self.v, v, self.len)?;
        self.len = need;
        Ok(())
    }
}

fn grow(t: &Tensor, len: usize, cap: usize) -> Result<Tensor> {
    let (h, old, d) = (t.dim(0), t.dim(1), t.dim(2));
    // Grown on the host (rare: capacity doubles) and put back where the cache lived.
    let device = t.device();
    let t = t.to_device(kernels::Device::Cpu)?;
    let src = t.f32s()?;
    let mut out = vec![0.0f32; h * cap * d];
    for head in 0..h {
        out[head * cap * d..head * cap * d + len * d]
            .copy_from_slice(&src[head * old * d..head * old * d + len * d]);
    }
    Ok(Tensor::from_f32(&[h, cap, d], out)?.to_device(device)?)
}

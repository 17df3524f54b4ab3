//! Paged KV: each full-attention layer owns a pool of fixed-size blocks (`[Hk, Blocks·B, D]`
//! for K and for V), and each sequence holds a block table per layer saying which pool block
//! holds its positions `i·B .. (i+1)·B`. Attention reads the keys through the table
//! (`ops::attention_paged`).
//!
//! Blocks are shared by content: when a block fills, its K and V bytes are hashed, and if the
//! pool already holds a block with the same hash and the same bytes (another sequence that
//! prefilled the same prefix the same way), the sequence takes that block instead and frees
//! its own. Reference counts free a block when its last user releases it: a table dropped,
//! trimmed (a rollback), or cloned and then dropped. A shared block is never written: a write
//! into one (after a trim into its middle) first copies it to a block of the sequence's own.
//!
//! Every append first checks that the pool can supply what it needs; running out is an error
//! that leaves the pool and the table exactly as they were. The pool's limit is a count of
//! blocks; its buffers grow (doubling) up to the highest block in use, and blocks are handed
//! out lowest first, so a large limit costs nothing until it is used.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{bail, ensure, Context, Result};
use kernels::{ops, Device, Tensor};

/// One layer's block pool (shared by every sequence of that layer).
#[derive(Debug)]
struct LayerPool {
    /// Which layer, for errors.
    layer: usize,
    k: Tensor,
    v: Tensor,
    block: usize,
    refs: Vec<u32>,
    /// Free blocks, highest id first, so allocation takes the lowest (deterministic layouts).
    free: Vec<u32>,
    /// The block registered under each content hash, and each registered block's hash.
    by_hash: HashMap<u64, u32>,
    hash_of: Vec<Option<u64>>,
}

/// What a pool holds now (tests and `--json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PoolUsage {
    pub blocks: usize,
    pub used: usize,
    /// Blocks held by more than one table.
    pub shared: usize,
}

/// The block pools of one model: one per paged layer, all of the same size.
#[derive(Debug, Clone)]
pub struct KvPool {
    layers: Vec<Option<Arc<Mutex<LayerPool>>>>,
    blocks: usize,
}

impl KvPool {
    /// Pools for the flat KV layers of `template` (a fresh state of the model): `blocks`
    /// blocks of `block` positions each. Rotating (sliding-window) caches stay as they are:
    /// their memory is already bounded by the window.
    pub fn for_state(template: &super::ModelState, block: usize, blocks: usize) -> Result<KvPool> {
        ensure!(block > 0, "a KV block must hold at least one position");
        ensure!(blocks > 0, "a KV pool must hold at least one block");
        block
            .checked_mul(blocks)
            .filter(|&s| s <= u32::MAX as usize)
            .context("the KV pool is too large")?;
        let layers = template
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                super::LayerState::Kv(c) if c.window.is_none() => {
                    let (hk, d) = (c.k.dim(0), c.k.dim(2));
                    Some(Arc::new(Mutex::new(LayerPool {
                        layer: i,
                        k: Tensor::zeros(&[hk, 0, d]),
                        v: Tensor::zeros(&[hk, 0, d]),
                        block,
                        refs: vec![0; blocks],
                        free: (0..blocks as u32).rev().collect(),
                        by_hash: HashMap::new(),
                        hash_of: vec![None; blocks],
                    })))
                }
                _ => None,
            })
            .collect();
        Ok(KvPool { layers, blocks })
    }

    /// A new, empty table into layer `i`'s pool, when that layer is paged.
    pub(super) fn pages(&self, i: usize) -> Option<Pages> {
        self.layers.get(i)?.as_ref().map(|pool| Pages {
            pool: pool.clone(),
            table: Vec::new(),
            len: 0,
            sealed: 0,
        })
    }

    /// Usage of every paged layer's pool, in layer order.
    pub fn usage(&self) -> Vec<PoolUsage> {
        self.layers
            .iter()
            .flatten()
            .map(|p| {
                let p = lock(p);
                PoolUsage {
                    blocks: self.blocks,
                    used: p.refs.iter().filter(|&&r| r > 0).count(),
                    shared: p.refs.iter().filter(|&&r| r > 1).count(),
                }
            })
            .collect()
    }

    /// Checks every pool's bookkeeping: each block is free exactly when nobody holds it, and
    /// the hash index names only held blocks. An error says what is inconsistent.
    pub fn check_consistent(&self) -> Result<()> {
        for p in self.layers.iter().flatten() {
            let p = lock(p);
            let mut free = vec![false; p.refs.len()];
            for &b in &p.free {
                ensure!(
                    !free[b as usize],
                    "layer {}: block {b} is free twice",
                    p.layer
                );
                free[b as usize] = true;
            }
            for (b, (&r, &f)) in p.refs.iter().zip(&free).enumerate() {
                ensure!(
                    (r == 0) == f,
                    "layer {}: block {b} has {r} users but free = {f}",
                    p.layer
                );
            }
            for (&h, &b) in &p.by_hash {
                ensure!(
                    p.refs[b as usize] > 0 && p.hash_of[b as usize] == Some(h),
                    "layer {}: hash index names block {b}, which is free or hashed otherwise",
                    p.layer
                );
            }
        }
        Ok(())
    }
}

fn lock(p: &Mutex<LayerPool>) -> MutexGuard<'_, LayerPool> {
    // A panic while holding the lock cannot leave counts half-updated in a way later code
    // relies on more than the panic itself; keep going with the data.
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// One sequence's block table into one layer's pool.
#[derive(Debug)]
pub struct Pages {
    pool: Arc<Mutex<LayerPool>>,
    table: Vec<u32>,
    /// Positions held.
    len: usize,
    /// Leading full blocks already hashed (and possibly swapped for a shared one).
    sealed: usize,
}

impl Clone for Pages {
    /// A snapshot shares every block (each gains a user); writes then copy what they touch.
    fn clone(&self) -> Pages {
        let mut p = lock(&self.pool);
        for &b in &self.table {
            p.refs[b as usize] += 1;
        }
        Pages {
            pool: self.pool.clone(),
            table: self.table.clone(),
            len: self.len,
            sealed: self.sealed,
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        let mut p = lock(&self.pool);
        for &b in &self.table {
            p.release(b);
        }
    }
}

impl LayerPool {
    fn take(&mut self) -> Result<u32> {
        let b = *self.free.last().expect("checked before taking");
        let cap = self.k.dim(1) / self.block;
        if b as usize >= cap {
            // Grow to hold block b: double, in whole blocks, up to the limit.
            let blocks = (b as usize + 1).max(2 * cap).max(4).min(self.refs.len());
            let (len, slots) = (self.k.dim(1), blocks * self.block);
            self.k = moved(&self.k, 0, len, slots)?;
            self.v = moved(&self.v, 0, len, slots)?;
        }
        self.free.pop();
        self.refs[b as usize] = 1;
        Ok(b)
    }

    fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r -= 1;
        if *r == 0 {
            if let Some(h) = self.hash_of[b as usize].take() {
                if self.by_hash.get(&h) == Some(&b) {
                    self.by_hash.remove(&h);
                }
            }
            self.free.push(b);
        }
    }

    /// Block `b`'s K and V rows `0..n` of every head, on the host.
    fn rows(&self, b: u32, n: usize) -> Result<Vec<f32>> {
        let at = b as usize * self.block;
        let mut out = Vec::new();
        for t in [&self.k, &self.v] {
            // f32 on the host (MLX's native path keeps bf16 pools; widening is exact).
            let piece = t.narrow(1, at, n)?.to_device(Device::Cpu)?.to_f32()?;
            out.extend_from_slice(piece.f32s()?);
        }
        Ok(out)
    }

    /// Copies rows `0..n` of block `from` into block `to` (every head, K and V).
    fn copy_rows(&mut self, from: u32, to: u32, n: usize) -> Result<()> {
        let (b, hk, d) = (self.block, self.k.dim(0), self.k.dim(2));
        for t in [&mut self.k, &mut self.v] {
            // As `[n, Hk, D]` rows, the layout kv_write takes.
            let piece = t
                .narrow(1, from as usize * b, n)?
                .to_device(Device::Cpu)?
                .to_f32()?;
            let src = piece.f32s()?;
            let mut rows = vec![0.0f32; n * hk * d];
            for h in 0..hk {
                for j in 0..n {
                    rows[(j * hk + h) * d..][..d].copy_from_slice(&src[(h * n + j) * d..][..d]);
                }
            }
            ops::kv_write(t, &Tensor::from_f32(&[n, hk, d], rows)?, to as usize * b)?;
        }
        Ok(())
    }
}

/// A content hash of block rows.
fn content_hash(index: usize, rows: &[f32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    index.hash(&mut h);
    for x in rows {
        x.to_bits().hash(&mut h);
    }
    h.finish()
}

impl Pages {
    /// The table (pool block per logical block) and the block size.
    pub fn table(&self) -> (Vec<u32>, usize) {
        (self.table.clone(), lock(&self.pool).block)
    }

    /// Bytes of the blocks this table holds (shared blocks counted in full).
    pub fn bytes(&self) -> usize {
        let p = lock(&self.pool);
        2 * self.table.len() * p.block * p.k.dim(0) * p.k.dim(2) * std::mem::size_of::<f32>()
    }

    /// Attends `q` over the positions this table holds (`p` complete), reading the pool
    /// through the table in place.
    pub fn attend(&self, q: &Tensor, p: &ops::AttnParams) -> Result<Tensor> {
        let pool = lock(&self.pool);
        Ok(ops::attention_paged(
            q,
            &pool.k,
            &pool.v,
            (&self.table, pool.block),
            p,
        )?)
    }

    /// Appends `k`, `v` `[T, Hk, D]` at position `len`.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let t = k.dim(0);
        let pool = self.pool.clone();
        let mut guard = lock(&pool);
        let p = &mut *guard;
        let b = p.block;
        let partial = self.len % b;
        let last_shared =
            partial > 0 && p.refs[*self.table.last().expect("partial block") as usize] > 1;
        let need = (self.len + t).div_ceil(b) - self.table.len() + usize::from(last_shared);
        if need > p.free.len() {
            bail!(
                "the KV block pool of layer {} is exhausted: {t} more positions need {need} blocks of {b}, {} of {} are free (a larger pool: --kv-blocks)",
                p.layer,
                p.free.len(),
                p.refs.len()
            );
        }
        if last_shared {
            // Copy on write: the shared block stays as its other users know it.
            let old = self.table.pop().expect("partial block");
            let new = p.take()?;
            p.copy_rows(old, new, partial)?;
            p.release(old);
            self.table.push(new);
        }
        while self.table.len() < (self.len + t).div_ceil(b) {
            let nb = p.take()?;
            self.table.push(nb);
        }
        // Write block by block: a chunk's rows land in as many pool blocks as it spans.
        let mut done = 0;
        while done < t {
            let pos = self.len + done;
            let n = (b - pos % b).min(t - done);
            let slot = self.table[pos / b] as usize * b + pos % b;
            ops::kv_write(&mut p.k, &k.narrow0(done, n)?, slot)?;
            ops::kv_write(&mut p.v, &v.narrow0(done, n)?, slot)?;
            done += n;
        }
        self.len += t;
        self.seal(p)
    }

    /// Hashes the blocks that filled up and shares those the pool already holds.
    fn seal(&mut self, p: &mut LayerPool) -> Result<()> {
        let full = self.len / p.block;
        for i in self.sealed..full {
            let mine = self.table[i];
            let rows = p.rows(mine, p.block)?;
            let h = content_hash(i, &rows);
            match p.by_hash.get(&h).copied() {
                Some(other) if other != mine && p.rows(other, p.block)? == rows => {
                    p.refs[other as usize] += 1;
                    p.release(mine);
                    self.table[i] = other;
                }
                Some(_) => {}
                None => {
                    p.by_hash.insert(h, mine);
                    p.hash_of[mine as usize] = Some(h);
                }
            }
        }
        self.sealed = full;
        Ok(())
    }

    /// Forgets positions from `pos` on, releasing the blocks past it.
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        ensure!(
            pos <= self.len,
            "cannot trim a paged KV cache of {} positions to {pos}",
            self.len
        );
        let mut p = lock(&self.pool);
        let b = p.block;
        for blk in self.table.drain(pos.div_ceil(b)..) {
            p.release(blk);
        }
        if !pos.is_multiple_of(b) {
            // The last block becomes partial, and will be written: it no longer matches its
            // hash. A block others hold keeps it (this table copies before writing).
            let last = *self.table.last().expect("pos > 0");
            if p.refs[last as usize] == 1 {
                if let Some(h) = p.hash_of[last as usize].take() {
                    if p.by_hash.get(&h) == Some(&last) {
                        p.by_hash.remove(&h);
                    }
                }
            }
        }
        self.sealed = self.sealed.min(pos / b);
        self.len = pos;
        Ok(())
    }
}
/// Slots `from..from+len` of `t` `[H, old, D]` at the front of a zeroed `[H, cap, D]`.
pub(super) fn moved(t: &Tensor, from: usize, len: usize, cap: usize) -> Result<Tensor> {
    let (h, old, d) = (t.dim(0), t.dim(1), t.dim(2));
    // Done on the host (rare: once per doubling, or once per window of decode steps) and put
    // back where the cache lived.
    let device = t.device();
    // f32 on the host (MLX's native path keeps bf16 caches; widening is exact).
    let t = t.to_device(kernels::Device::Cpu)?.to_f32()?;
    let src = t.f32s()?;
    let mut out = vec![0.0f32; h * cap * d];
    for head in 0..h {
        let s = (head * old + from) * d;
        out[head * cap * d..head * cap * d + len * d].copy_from_slice(&src[s..s + len * d]);
    }
    Ok(Tensor::from_f32(&[h, cap, d], out)?.to_device(device)?)
}

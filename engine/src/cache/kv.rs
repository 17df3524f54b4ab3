use anyhow::{ensure, Result};
use kernels::{ops, ops::AttnParams, Tensor};

use super::paged::{moved, Pages};

/// A KV cache `[Hk, capacity, D]` per layer.
///
/// Flat (`window == None`): every position, growing by doubling.
///
/// Rotating (`window == Some(W)`), for sliding-window layers: a query at position `p` sees keys
/// `p − W + 1 ..= p`, so between forwards only the last `W − 1` positions are ever needed again.
/// Older ones are dropped when an append would overflow the buffer (and at [`KvCache::settle`]),
/// which keeps the buffer at `2·W` slots once a sequence runs past the window. The slots stay in
/// position order (slot `i` holds position `start + i`), so attention runs on the buffer with
/// positions relative to `start`: the causal and window masks depend only on differences of
/// positions, and keys are rotated before they are cached, so the result is bit-identical to a
/// flat cache's. Copying `W − 1` slots once per `W + 1` decode steps costs about one slot a step.
///
/// Paged (`pages` set, see [`super::paged`]): the positions live in blocks of a shared pool;
/// `k` and `v` are then empty and `len` counts the positions (`start` stays 0).
#[derive(Debug, Clone)]
pub struct KvCache {
    pub k: Tensor,
    pub v: Tensor,
    /// Valid slots in the buffer.
    pub len: usize,
    /// Absolute position of slot 0 (positions dropped so far).
    pub start: usize,
    /// The sliding window this cache serves, when it rotates.
    pub window: Option<usize>,
    /// The block table, when the cache is paged.
    pub pages: Option<Pages>,
}

impl KvCache {
    /// A flat cache that keeps every position.
    pub fn new(kv_heads: usize, head_dim: usize, capacity: usize) -> KvCache {
        KvCache {
            k: Tensor::zeros(&[kv_heads, capacity, head_dim]),
            v: Tensor::zeros(&[kv_heads, capacity, head_dim]),
            len: 0,
            start: 0,
            window: None,
            pages: None,
        }
    }

    /// A paged cache over `pages` (an empty table into a layer's pool).
    pub fn paged(kv_heads: usize, head_dim: usize, pages: Pages) -> KvCache {
        KvCache {
            pages: Some(pages),
            ..KvCache::new(kv_heads, head_dim, 0)
        }
    }

    /// Attends `q` `[T, Hq, D]`, at absolute positions `q_pos..`, over the cached keys: the
    /// flat or rotating buffer, or the pool through the block table. `p` gives the scale,
    /// window and soft-cap; its positions are filled in here.
    pub fn attend(&self, q: &Tensor, q_pos: usize, p: AttnParams) -> Result<Tensor> {
        // Positions relative to the cache's first slot (a rotating cache has dropped some).
        let p = AttnParams {
            q_start: q_pos - self.start,
            kv_len: self.len,
            ..p
        };
        match &self.pages {
            Some(pages) => pages.attend(q, &p),
            None => Ok(ops::attention(q, &self.k, &self.v, &p)?),
        }
    }

    /// A rotating cache for a layer that attends over a window of `window` positions.
    pub fn rotating(kv_heads: usize, head_dim: usize, window: usize) -> Result<KvCache> {
        ensure!(
            window > 0,
            "a sliding window must hold at least one position"
        );
        Ok(KvCache::for_layer(kv_heads, head_dim, Some(window)))
    }

    /// The cache a layer with this attention window needs: rotating for a sliding window,
    /// flat otherwise. Models pass windows read as config widths, which are at least 1.
    pub fn for_layer(kv_heads: usize, head_dim: usize, window: Option<usize>) -> KvCache {
        debug_assert_ne!(
            window,
            Some(0),
            "a sliding window holds at least one position"
        );
        KvCache {
            window,
            ..KvCache::new(kv_heads, head_dim, 0)
        }
    }

    pub fn capacity(&self) -> usize {
        self.k.dim(1)
    }

    /// Positions seen so far (the absolute position of the next append).
    pub fn pos(&self) -> usize {
        self.start + self.len
    }

    /// Bytes held by the K and V buffers (a paged cache: its blocks).
    pub fn bytes(&self) -> usize {
        if let Some(p) = &self.pages {
            return p.bytes();
        }
        2 * self.k.dim(0) * self.capacity() * self.k.dim(2) * std::mem::size_of::<f32>()
    }

    /// Appends `k`, `v` `[T, Hk, D]` at position [`KvCache::pos`]; a rotating cache first drops
    /// what no query from here on can see.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let t = k.dim(0);
        if let Some(p) = &mut self.pages {
            p.append(k, v)?;
            self.len += t;
            return Ok(());
        }
        let need = self.len + t;
        if need > self.capacity() {
            match self.window {
                None => {
                    let cap = need.max(2 * self.capacity()).max(64);
                    self.relocate(0, cap)?;
                }
                // Shorter than 2W: grow like a flat cache, so a short sequence holds a short
                // buffer (not 2W slots from its first token).
                Some(w) if need <= 2 * w => {
                    let cap = need.max(2 * self.capacity()).max(64).min(2 * w);
                    self.relocate(0, cap)?;
                }
                Some(w) => {
                    let keep = self.len.min(w - 1);
                    let cap = (keep + t).max(2 * w);
                    self.relocate(self.len - keep, cap)?;
                }
            }
        }
        ops::kv_write(&mut self.k, k, self.len)?;
        ops::kv_write(&mut self.v, v, self.len)?;
        self.len += t;
        Ok(())
    }

    /// Forgets the positions from `pos` on (a rollback). The slots stay allocated and are
    /// overwritten by the next append; positions a rotating cache already dropped cannot come
    /// back, so `pos` must not be before [`KvCache::start`].
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        ensure!(
            pos >= self.start && pos <= self.pos(),
            "cannot roll a KV cache holding positions {}..{} back to {pos}",
            self.start,
            self.pos()
        );
        if let Some(p) = &mut self.pages {
            p.truncate(pos)?;
        }
        self.len = pos - self.start;
        Ok(())
    }

    /// Called when a forward is done: a rotating cache that a long prefill left above `2·W`
    /// slots shrinks back to the last `W − 1` positions. Not inside a layer's forward, because
    /// KV-shared layers later in the same forward still read the whole chunk.
    pub fn settle(&mut self) -> Result<()> {
        if let Some(w) = self.window {
            if self.capacity() > 2 * w {
                let keep = self.len.min(w - 1);
                self.relocate(self.len - keep, 2 * w)?;
            }
        }
        Ok(())
    }

    /// Moves slots `from..len` to the front of new `cap`-slot buffers.
    fn relocate(&mut self, from: usize, cap: usize) -> Result<()> {
        let keep = self.len - from;
        self.k = moved(&self.k, from, keep, cap)?;
        self.v = moved(&self.v, from, keep, cap)?;
        self.start += from;
        self.len = keep;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[T, 1, 1]` keys whose value is their absolute position.
    fn positions(from: usize, t: usize) -> Tensor {
        Tensor::from_f32(&[t, 1, 1], (from..from + t).map(|p| p as f32).collect()).unwrap()
    }

    fn slots(c: &KvCache) -> Vec<f32> {
        c.k.f32s().unwrap()[..c.len].to_vec()
    }

    #[test]
    fn rotating_cache_keeps_the_window_in_position_order_across_wraps() {
        let w = 8;
        let mut c = KvCache::rotating(1, 1, w).unwrap();
        let mut pos = 0;
        // Pieces that straddle every wrap: short, longer than the window, single steps.
        for t in [3, 5, 1, 11, 1, 1, 7, 20, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2] {
            c.append(&positions(pos, t), &positions(pos, t)).unwrap();
            pos += t;
            assert_eq!(c.pos(), pos);
            let expect: Vec<f32> = (c.start..pos).map(|p| p as f32).collect();
            assert_eq!(
                slots(&c),
                expect,
                "slots hold positions start..pos in order"
            );
            // Every key the chunk's first query can see is still there.
            assert!(c.start <= (pos - t + 1).saturating_sub(w));
            c.settle().unwrap();
            assert!(c.capacity() <= 2 * w, "at rest the buffer is bounded by 2W");
            assert!(
                c.len >= (w - 1).min(pos),
                "the last W − 1 positions survive"
            );
        }
    }

    #[test]
    fn a_short_sequence_holds_a_short_buffer() {
        let w = 1024;
        let mut c = KvCache::rotating(1, 1, w).unwrap();
        c.append(&positions(0, 16), &positions(0, 16)).unwrap();
        c.settle().unwrap();
        assert_eq!(
            c.capacity(),
            64,
            "grows from the flat minimum, not to 2W at once"
        );
        let mut pos = 16;
        while pos < 3 * w {
            let t = 100.min(3 * w - pos);
            c.append(&positions(pos, t), &positions(pos, t)).unwrap();
            pos += t;
            c.settle().unwrap();
            assert!(c.capacity() <= 2 * w);
            assert_eq!(slots(&c).last(), Some(&((pos - 1) as f32)));
        }
        assert_eq!(c.capacity(), 2 * w, "past 2W it holds 2W");
    }

    #[test]
    fn flat_cache_keeps_every_position() {
        let mut c = KvCache::new(1, 1, 0);
        for (from, t) in [(0, 70), (70, 1), (71, 200)] {
            c.append(&positions(from, t), &positions(from, t)).unwrap();
            c.settle().unwrap();
        }
        assert_eq!(c.start, 0);
        assert_eq!(slots(&c), (0..271).map(|p| p as f32).collect::<Vec<_>>());
    }

    #[test]
    fn zero_window_is_refused() {
        assert!(KvCache::rotating(1, 1, 0).is_err());
    }
}

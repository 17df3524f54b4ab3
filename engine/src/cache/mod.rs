//! Per-sequence state a model carries between forwards. Cloning a state is a snapshot (the
//! tensors are copy-on-write), which is what speculative decoding needs to roll back.

pub mod kv;
pub mod paged;
pub mod recurrent;

pub use kv::KvCache;
pub use paged::{KvPool, PoolUsage};
pub use recurrent::RecurrentState;

use anyhow::{bail, ensure, Result};
use kernels::Tensor;

use crate::layers::GdnPath;

/// What one layer remembers.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Full attention: keys and values of every past position.
    Kv(KvCache),
    /// Linear attention (Gated DeltaNet): a fixed-size conv + recurrent state.
    Recurrent(RecurrentState),
    /// A short convolution (LFM2): its last `K − 1` inputs, `[K − 1, C]` f32.
    Conv(Tensor),
}

impl LayerState {
    /// The KV cache of a full-attention layer; an error names the mismatch otherwise.
    pub fn kv_mut(&mut self) -> Result<&mut KvCache> {
        match self {
            LayerState::Kv(c) => Ok(c),
            other => bail!(
                "layer state mismatch: expected a KV cache, got {}",
                other.kind()
            ),
        }
    }

    /// The state of a linear-attention layer; an error names the mismatch otherwise.
    pub fn recurrent_mut(&mut self) -> Result<&mut RecurrentState> {
        match self {
            LayerState::Recurrent(s) => Ok(s),
            other => bail!(
                "layer state mismatch: expected a recurrent state, got {}",
                other.kind()
            ),
        }
    }

    /// The conv state of a short-conv layer; an error names the mismatch otherwise.
    pub fn conv_mut(&mut self) -> Result<&mut Tensor> {
        match self {
            LayerState::Conv(s) => Ok(s),
            other => bail!(
                "layer state mismatch: expected a conv state, got {}",
                other.kind()
            ),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            LayerState::Kv(_) => "a KV cache",
            LayerState::Recurrent(_) => "a recurrent state",
            LayerState::Conv(_) => "a conv state",
        }
    }
}

/// The state of one sequence: one entry per layer, how many positions it has seen, how its
/// Gated DeltaNet layers compute (families without such layers ignore `gdn_path`) and how the
/// kernels do.
#[derive(Debug, Clone)]
pub struct ModelState {
    pub layers: Vec<LayerState>,
    pub pos: usize,
    pub gdn_path: GdnPath,
    /// How the kernels compute this sequence's forwards (numerics, ISA cap): passed to
    /// `kernels::run` with each of them.
    pub kernels: kernels::Settings,
}

impl ModelState {
    /// A state at position 0 with the automatic GDN path.
    pub fn new(layers: Vec<LayerState>) -> ModelState {
        ModelState {
            layers,
            pos: 0,
            gdn_path: GdnPath::Auto,
            kernels: kernels::Settings::default(),
        }
    }

    /// The same state with every rotating KV cache replaced by a flat one (sliding-window
    /// layers then mask a cache that keeps every position). Only before the first forward.
    pub fn with_flat_kv(mut self) -> Result<ModelState> {
        ensure!(
            self.pos == 0,
            "a state can switch to flat KV caches only before its first forward"
        );
        for l in &mut self.layers {
            if let LayerState::Kv(c) = l {
                *c = KvCache::new(c.k.dim(0), c.k.dim(2), 0);
            }
        }
        Ok(self)
    }

    /// The same state with its flat KV caches paged into `pool` (made for this model by
    /// [`KvPool::for_state`]). Rotating caches stay (their memory is bounded by the window).
    /// Only before the first forward.
    pub fn with_paged_kv(mut self, pool: &KvPool) -> Result<ModelState> {
        ensure!(
            self.pos == 0,
            "a state can switch to paged KV caches only before its first forward"
        );
        for (i, l) in self.layers.iter_mut().enumerate() {
            if let (LayerState::Kv(c), Some(pages)) = (&mut *l, pool.pages(i)) {
                ensure!(
                    c.window.is_none(),
                    "internal: layer {i} has a pool but a rotating cache"
                );
                *c = KvCache::paged(c.k.dim(0), c.k.dim(2), pages);
            }
        }
        Ok(self)
    }

    /// Ends a forward: rotating caches that a long chunk grew shrink back to their bound.
    pub fn settle(&mut self) -> Result<()> {
        for l in &mut self.layers {
            if let LayerState::Kv(c) = l {
                c.settle()?;
            }
        }
        Ok(())
    }

    /// A point to roll back to (speculative decoding): KV caches remember their position only,
    /// since rolling back trims them; recurrent and conv states, which cannot be trimmed, are
    /// cloned (copy-on-write, so the clone costs one copy at the next write).
    pub fn mark(&self) -> StateMark {
        StateMark {
            pos: self.pos,
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Kv(c) => LayerMark::Kv(c.pos()),
                    other => LayerMark::Saved(Box::new(other.clone())),
                })
                .collect(),
        }
    }

    /// Returns to `mark`, taken from this state: KV caches drop the positions after it,
    /// recurrent and conv states become the saved ones.
    pub fn rollback(&mut self, mark: &StateMark) -> Result<()> {
        ensure!(
            mark.layers.len() == self.layers.len() && mark.pos <= self.pos,
            "a state mark from another state (or from its future)"
        );
        for (l, m) in self.layers.iter_mut().zip(&mark.layers) {
            match (l, m) {
                (LayerState::Kv(c), LayerMark::Kv(pos)) => c.truncate(*pos)?,
                (l, LayerMark::Saved(saved)) if l.kind() == saved.kind() => *l = (**saved).clone(),
                (l, _) => bail!("a state mark from another state: layer holds {}", l.kind()),
            }
        }
        self.pos = mark.pos;
        Ok(())
    }

    /// Records, in every Gated DeltaNet layer, what the next forward feeds it (speculative
    /// verification), so [`ModelState::keep_recorded`] can rebuild the state after any of
    /// its positions without running the kept tokens again.
    pub fn record_steps(&mut self) {
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                r.record = Some(recurrent::Record::Armed);
            }
        }
    }

    /// Keeps the first `n` positions of the forward run since `mark` (taken just before
    /// [`record_steps`]) and forgets the rest: KV caches are trimmed, recurrent layers rebuild
    /// their state after position `n` from the record. Recording stops either way. Returns
    /// false, with the state unchanged, where a layer could not record (a short conv, tensors
    /// on a device, more than one forward): the caller then rolls back to `mark` and runs
    /// the kept tokens again.
    ///
    /// [`record_steps`]: ModelState::record_steps
    pub fn keep_recorded(&mut self, mark: &StateMark, n: usize) -> Result<bool> {
        let ran = self.pos.saturating_sub(mark.pos);
        let recorded = self.layers.iter().all(|l| match l {
            LayerState::Kv(_) => true,
            LayerState::Recurrent(r) => r.recorded() == Some(ran),
            LayerState::Conv(_) => false,
        });
        let checked = (|| {
            ensure!(
                mark.layers.len() == self.layers.len() && mark.pos + n <= self.pos && n > 0,
                "keeping {n} positions after a mark at {} in a state at {}",
                mark.pos,
                self.pos
            );
            Ok(())
        })();
        if checked.is_err() || !recorded {
            for l in &mut self.layers {
                if let LayerState::Recurrent(r) = l {
                    r.record = None;
                }
            }
            return checked.map(|_| false);
        }
        let pos = mark.pos + n;
        for l in &mut self.layers {
            match l {
                LayerState::Kv(c) if c.pos() > pos => c.truncate(pos)?,
                LayerState::Recurrent(r) => r.keep_recorded(n)?,
                _ => {}
            }
        }
        self.pos = pos;
        Ok(true)
    }

    /// Forgets every position from `pos` on, when the state allows it: only KV caches can be
    /// trimmed (recurrent and conv states hold no per-position history), and a rotating cache
    /// only back to a position it still holds. Returns whether it was trimmed; a state that
    /// cannot be is left as it was. (KV-shared layers' empty caches have nothing to trim.)
    pub fn trim_to(&mut self, pos: usize) -> Result<bool> {
        if pos > self.pos {
            return Ok(false);
        }
        let trimmable = self.layers.iter().all(|l| match l {
            LayerState::Kv(c) => c.pos() <= pos || c.start <= pos,
            _ => false,
        });
        if !trimmable {
            return Ok(false);
        }
        for l in &mut self.layers {
            if let LayerState::Kv(c) = l {
                if c.pos() > pos {
                    c.truncate(pos)?;
                }
            }
        }
        self.pos = pos;
        Ok(true)
    }

    /// Bytes one more position adds to the KV caches (K and V of every attention layer,
    /// sliding-window layers counted as if they kept every position): what admission control
    /// reserves per token of a sequence.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kv(c) => 2 * c.k.dim(0) * c.k.dim(2) * std::mem::size_of::<f32>(),
                _ => 0,
            })
            .sum()
    }

    /// Bytes held by the KV caches (recurrent and conv states not counted).
    pub fn kv_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kv(c) => c.bytes(),
                _ => 0,
            })
            .sum()
    }
}

/// Where a [`ModelState`] stood (see [`ModelState::mark`]).
#[derive(Debug, Clone)]
pub struct StateMark {
    pos: usize,
    layers: Vec<LayerMark>,
}

impl StateMark {
    /// The position the mark returns to.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

#[derive(Debug, Clone)]
enum LayerMark {
    /// A KV cache's position.
    Kv(usize),
    /// A state that cannot be trimmed, as it was.
    Saved(Box<LayerState>),
}

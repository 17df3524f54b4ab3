//! Per-sequence state a model carries between forwards. Cloning a state is a snapshot (the
//! tensors are copy-on-write), which is what speculative decoding needs to roll back.

pub mod kv;

pub use kv::KvCache;

/// What one layer remembers.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Full attention: keys and values of every past position.
    Kv(KvCache),
}

/// The state of one sequence: one entry per layer, and how many positions it has seen.
#[derive(Debug, Clone)]
pub struct ModelState {
    pub layers: Vec<LayerState>,
    pub pos: usize,
}

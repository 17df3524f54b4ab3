//! Reusing a finished sequence's state for a new prompt that starts the same way: a
//! [`crate::Session`] keeps one (its conversation), the [`super::Scheduler`] keeps several
//! (`engine serve`: the same system prompt, or a chat's next turn, from any client).
//!
//! Reuse never changes the output: the model is causal, so the state after a prefix does not
//! depend on what follows it. What can be reused depends on the state:
//! - KV caches trim to any position they still hold, so an attention-only model reuses the
//!   longest common prefix of the cached tokens and the new prompt;
//! - recurrent (Gated DeltaNet) and conv states cannot be trimmed: a hybrid model reuses the
//!   cache when the new prompt extends everything it has seen, or else rolls back to the
//!   snapshot taken at the end of the previous prompt's prefill (the turn boundary) when the
//!   new prompt extends that prompt (a chat template that re-renders the last answer
//!   differently); otherwise it prefills from scratch.
//!
//! At least one prompt token is always prefilled, since the first token comes from its logits.

use crate::cache::{ModelState, StateMark};
use crate::generate::{GenerateRequest, PagedKv};
use crate::layers::GdnPath;

/// The state of a finished sequence and what it has seen.
#[derive(Debug, Clone)]
pub struct Cached {
    pub state: ModelState,
    /// The tokens `state` has consumed (`state.pos` of them).
    pub seen: Vec<u32>,
    /// The state right after the prompt's prefill.
    pub boundary: StateMark,
    /// The request settings the state was built with; a request with others starts fresh.
    key: Key,
}

type Key = (GdnPath, bool, Option<PagedKv>, kernels::Settings);

fn key(req: &GenerateRequest) -> Key {
    (req.gdn_path, req.flat_kv, req.paged_kv, req.kernels)
}

impl Cached {
    /// What `state` holds after running `req` (its prompt, then `generated`), with `boundary`
    /// marked after the prompt's prefill.
    pub fn new(
        req: &GenerateRequest,
        generated: &[u32],
        state: ModelState,
        boundary: StateMark,
    ) -> Cached {
        let seen = req
            .prompt_ids
            .iter()
            .chain(generated)
            .take(state.pos)
            .copied()
            .collect();
        Cached {
            state,
            seen,
            boundary,
            key: key(req),
        }
    }

    /// Prompt tokens of `req` this state could give at best (0 when its settings differ).
    fn common(&self, req: &GenerateRequest) -> usize {
        if self.key != key(req) {
            return 0;
        }
        self.seen
            .iter()
            .zip(&req.prompt_ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(req.prompt_ids.len().saturating_sub(1))
    }

    /// The state, positioned at the longest prefix of `req`'s prompt it can return to
    /// (leaving at least one token to prefill); `None` when nothing is reusable.
    pub fn resume(mut self, req: &GenerateRequest) -> Option<ModelState> {
        let common = self.common(req);
        if common == 0 {
            return None;
        }
        if common == self.state.pos {
            return Some(self.state);
        }
        // An error here means the cache is inconsistent: drop it rather than trust it.
        if self.state.trim_to(common).ok()? {
            return Some(self.state);
        }
        if self.boundary.pos() <= common && self.state.rollback(&self.boundary).is_ok() {
            return Some(self.state);
        }
        None
    }
}

/// Finished sequences' states, the most recently used last, at most `capacity` of them.
/// Resuming clones a state (its tensors are shared copy-on-write), so one entry serves any
/// number of requests.
#[derive(Debug, Default)]
pub struct PrefixCache {
    entries: Vec<Cached>,
    capacity: usize,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> PrefixCache {
        PrefixCache {
            entries: Vec::new(),
            capacity,
        }
    }

    /// Keeps `c`, dropping the least recently used entry when full; an entry that saw a
    /// prefix of what `c` saw (an earlier turn of the same conversation) gives way to it.
    pub fn insert(&mut self, c: Cached) {
        if self.capacity == 0 {
            return;
        }
        self.entries
            .retain(|e| !(e.key == c.key && c.seen.starts_with(&e.seen)));
        if self.entries.len() >= self.capacity {
            self.entries.remove(0);
        }
        self.entries.push(c);
    }

    /// A state for `req` from the entry that gives the longest prefix, and how many prompt
    /// tokens it holds; `None` when no entry helps.
    pub fn resume(&mut self, req: &GenerateRequest) -> Option<(ModelState, usize)> {
        let mut order: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.common(req), i))
            .filter(|&(common, _)| common > 0)
            .collect();
        order.sort_by_key(|&(common, i)| std::cmp::Reverse((common, i)));
        for (_, i) in order {
            if let Some(state) = self.entries[i].clone().resume(req) {
                let used = self.entries.remove(i);
                self.entries.push(used);
                let reused = state.pos;
                return Some((state, reused));
            }
        }
        None
    }

    /// KV bytes the entries hold (shared buffers counted once per entry).
    pub fn kv_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.state.kv_bytes()).sum()
    }

    /// Drops the least recently used entry; false when there is none.
    pub fn evict_one(&mut self) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        self.entries.remove(0);
        true
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

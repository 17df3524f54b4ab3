//! Multi-turn sessions: one sequence whose cache outlives a request, so the next turn (the whole
//! conversation, re-rendered) prefills only what the cache has not seen.
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

use anyhow::Result;

use crate::cache::{ModelState, StateMark};
use crate::generate::{self, GenerateOutput, GenerateRequest, PagedKv};
use crate::layers::GdnPath;
use crate::models::CausalLm;

/// A conversation's cache, kept across requests.
pub struct Session<'m> {
    model: &'m dyn CausalLm,
    cached: Option<Cached>,
}

/// The state of a finished turn and what it has seen.
struct Cached {
    state: ModelState,
    /// The tokens `state` has consumed (`state.pos` of them).
    seen: Vec<u32>,
    /// The state right after the last prompt's prefill.
    boundary: StateMark,
    /// The request settings the state was built with; a change means a fresh state.
    gdn_path: GdnPath,
    flat_kv: bool,
    paged_kv: Option<PagedKv>,
    kernels: kernels::Settings,
}

/// A turn's output and how much of its prompt came from the cache.
#[derive(Debug, Clone)]
pub struct Turn {
    pub output: GenerateOutput,
    /// Prompt tokens taken from the cache (not prefilled again).
    pub reused: usize,
}

impl<'m> Session<'m> {
    pub fn new(model: &'m dyn CausalLm) -> Session<'m> {
        Session {
            model,
            cached: None,
        }
    }

    /// Forgets the cache: the next turn prefills from scratch.
    pub fn reset(&mut self) {
        self.cached = None;
    }

    /// Tokens the cache holds.
    pub fn cached_tokens(&self) -> usize {
        self.cached.as_ref().map_or(0, |c| c.seen.len())
    }

    /// Runs `req` (the whole conversation so far as its prompt), reusing what the cache holds
    /// of it. Speculative decoding (`req.mtp`) runs on a fresh state and leaves nothing cached:
    /// its draft head's cache would have to follow the main one.
    pub fn generate(&mut self, req: &GenerateRequest, on_token: impl FnMut(u32)) -> Result<Turn> {
        generate::validate(self.model, req)?;
        if req.mtp.is_some() {
            self.cached = None;
            let output = generate::generate(self.model, req, on_token)?;
            return Ok(Turn { output, reused: 0 });
        }
        let mut state = match self.reusable(req) {
            Some(state) => state,
            None => generate::fresh_state(self.model, req)?,
        };
        let reused = state.pos;
        let mut boundary = None;
        let output = generate::continue_plain(
            self.model,
            req,
            &mut state,
            |s| boundary = Some(s.mark()),
            on_token,
        )?;
        let all: Vec<u32> = req
            .prompt_ids
            .iter()
            .chain(&output.tokens)
            .copied()
            .collect();
        self.cached = Some(Cached {
            seen: all[..state.pos].to_vec(),
            state,
            boundary: boundary.expect("continue_plain calls after_prefill"),
            gdn_path: req.gdn_path,
            flat_kv: req.flat_kv,
            paged_kv: req.paged_kv,
            kernels: req.kernels,
        });
        Ok(Turn { output, reused })
    }

    /// Takes the cached state, positioned at the longest prefix of `req`'s prompt it can
    /// return to (leaving at least one token to prefill); `None` when nothing is reusable.
    fn reusable(&mut self, req: &GenerateRequest) -> Option<ModelState> {
        let mut c = self.cached.take()?;
        if (c.gdn_path, c.flat_kv, c.paged_kv, c.kernels)
            != (req.gdn_path, req.flat_kv, req.paged_kv, req.kernels)
        {
            return None;
        }
        let prompt = &req.prompt_ids;
        let common = c
            .seen
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        if common == 0 {
            return None;
        }
        if common == c.state.pos {
            return Some(c.state);
        }
        // An error here means the cache is inconsistent: drop it rather than trust it.
        if c.state.trim_to(common).ok()? {
            return Some(c.state);
        }
        if c.boundary.pos() <= common && c.state.rollback(&c.boundary).is_ok() {
            return Some(c.state);
        }
        None
    }
}

//! Multi-turn sessions: one sequence whose cache outlives a request, so the next turn (the whole
//! conversation, re-rendered) prefills only what the cache has not seen.
//!
//! What a state can give a new prompt is [`crate::generate::prefix`]'s rule.

use anyhow::Result;

use crate::cache::ModelState;
use crate::generate::prefix::Cached;
use crate::generate::{self, GenerateOutput, GenerateRequest};
use crate::models::CausalLm;

/// A conversation's cache, kept across requests.
pub struct Session<'m> {
    model: &'m dyn CausalLm,
    cached: Option<Cached>,
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
        self.cached = Some(Cached::new(
            req,
            &output.tokens,
            state,
            boundary.expect("continue_plain calls after_prefill"),
        ));
        Ok(Turn { output, reused })
    }

    /// Takes the cached state, positioned at the longest prefix of `req`'s prompt it can
    /// return to; `None` when nothing is reusable.
    fn reusable(&mut self, req: &GenerateRequest) -> Option<ModelState> {
        self.cached.take()?.resume(req)
    }
}

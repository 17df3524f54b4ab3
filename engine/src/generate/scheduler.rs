//! Continuous batching, one step at a time: sequences join (prefilled alone, from a cached
//! prefix when one fits), then every running sequence decodes one token per
//! [`Scheduler::step`] through [`CausalLm::decode_batch`] (families that batch read each weight
//! once per group of rows). A sequence that finishes or is cancelled leaves at once, so the
//! caller can let a waiting one join at the next token boundary.
//!
//! [`super::generate_batch`] drives it over a fixed list of requests; `engine serve` drives it
//! from an HTTP queue. Every sequence's tokens equal what it would get alone: prefill is the
//! same forward, decode rows compute bit-identically to a lone row, a cached prefix is the
//! state that prefix leaves (see [`super::prefix`]), and each sequence samples with its own
//! sampler.
//!
//! Memory is bounded before a sequence joins. With paged KV all sequences share one pool per
//! layer, and a sequence joins only when the pool can hold its whole prompt and budget on top
//! of what the running ones may still claim. With flat KV an optional byte budget plays the
//! same part (each sequence reserves the most its caches can grow to, doubling included), and
//! the prefix cache gives back entries, least recently used first, to make room.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use kernels::Tensor;

use super::prefix::{Cached, PrefixCache};
use super::{finished, state_in, token_budget, validate, Decoding};
use super::{FinishReason, GenerateOutput, GenerateRequest};
use crate::cache::{KvPool, ModelState, StateMark};
use crate::models::CausalLm;

/// The caller's name for a sequence.
pub type SeqId = u64;

/// How a scheduler runs.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerOptions {
    /// Sequences decoding together at most.
    pub max_batch: usize,
    /// Finished sequences whose states are kept for prefix reuse (0: none). Only with flat
    /// KV: a paged pool is sized for the running sequences alone.
    pub prefix_cache: usize,
    /// Bytes the flat KV caches of running sequences and cached prefixes may hold (`None`:
    /// unbounded).
    pub kv_budget: Option<usize>,
}

/// What happened to a sequence during a step.
#[derive(Debug)]
pub enum Update {
    /// Its next token, with its log-prob and the best alternatives when the request records
    /// them (`top_logprobs > 0`).
    Token {
        token: u32,
        logprobs: Option<TokenLogprobs>,
    },
    /// It ended; it has left the batch.
    Finished(Box<Finished>),
    /// It failed (its logits diverged, or the batch's forward failed); it has left the batch.
    Failed(anyhow::Error),
}

/// A generated token's log-prob and the request's `top_logprobs` best `(token, log-prob)`.
#[derive(Debug, Clone)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// A finished sequence's output and how much of its prompt came from a cached prefix.
#[derive(Debug, Clone)]
pub struct Finished {
    pub output: GenerateOutput,
    pub cached_prompt_tokens: usize,
}

/// Whether a request can join now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    Now,
    /// After some running sequences leave.
    Later,
    /// Never: it alone needs more than the whole KV budget.
    Never,
}

struct Running {
    id: SeqId,
    req: GenerateRequest,
    state: ModelState,
    decoding: Decoding,
    /// The logits its next token comes from.
    logits: Tensor,
    /// The state after the prompt's prefill (kept with the state in the prefix cache).
    boundary: StateMark,
    cached_prompt_tokens: usize,
    ttft: f64,
    decode_start: Instant,
    /// Pool blocks (paged) or bytes (flat, under a budget) reserved for it.
    reserved: usize,
}

struct Pool {
    pool: KvPool,
    block_size: usize,
    /// Blocks per layer it hands out.
    blocks: usize,
}

pub struct Scheduler<'m> {
    model: &'m dyn CausalLm,
    opts: SchedulerOptions,
    /// The shared pool (paged KV).
    pool: Option<Pool>,
    running: Vec<Running>,
    reserved: usize,
    cache: PrefixCache,
    kv_per_position: usize,
}

impl<'m> Scheduler<'m> {
    /// A scheduler with flat KV caches (requests that ask for paged KV get a pool per
    /// sequence unless [`Scheduler::with_pool`] gives a shared one).
    pub fn new(model: &'m dyn CausalLm, opts: SchedulerOptions) -> Result<Scheduler<'m>> {
        if opts.max_batch == 0 {
            bail!("a batch must run at least one sequence at a time");
        }
        Ok(Scheduler {
            model,
            opts,
            pool: None,
            running: Vec::new(),
            reserved: 0,
            cache: PrefixCache::new(opts.prefix_cache),
            kv_per_position: model.new_state().kv_bytes_per_position(),
        })
    }

    /// Every sequence pages its full-attention caches into one pool of `blocks` blocks of
    /// `block_size` positions per layer; the prefix cache is off.
    pub fn with_pool(mut self, block_size: usize, blocks: usize) -> Result<Scheduler<'m>> {
        let pool = KvPool::for_state(&self.model.new_state(), block_size, blocks)?;
        self.pool = Some(Pool {
            pool,
            block_size,
            blocks,
        });
        self.cache = PrefixCache::new(0);
        Ok(self)
    }

    /// Sequences running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Bytes the KV caches of the running sequences hold.
    pub fn kv_bytes(&self) -> usize {
        self.running.iter().map(|s| s.state.kv_bytes()).sum()
    }

    /// Finished states kept for prefix reuse.
    pub fn cached_prefixes(&self) -> usize {
        self.cache.len()
    }

    /// What `req` reserves: pool blocks per layer (paged), or bytes of flat KV under a budget.
    fn need(&self, req: &GenerateRequest) -> usize {
        let positions = req.prompt_ids.len() + token_budget(self.model, req);
        match &self.pool {
            Some(p) => positions.div_ceil(p.block_size),
            None if self.opts.kv_budget.is_some() => {
                // A flat cache grows by doubling from 64 slots: at most twice what it holds.
                self.kv_per_position * (2 * positions).max(64)
            }
            None => 0,
        }
    }

    fn limit(&self) -> Option<usize> {
        match &self.pool {
            Some(p) => Some(p.blocks),
            None => self.opts.kv_budget,
        }
    }

    /// Whether `req` can join now; under a flat budget, cached prefixes are dropped (least
    /// recently used first) to make room.
    pub fn room_for(&mut self, req: &GenerateRequest) -> Room {
        let need = self.need(req);
        let Some(limit) = self.limit() else {
            return if self.running.len() < self.opts.max_batch {
                Room::Now
            } else {
                Room::Later
            };
        };
        if need > limit {
            return Room::Never;
        }
        if self.running.len() >= self.opts.max_batch || self.reserved + need > limit {
            return Room::Later;
        }
        if self.pool.is_none() {
            while self.reserved + need + self.cache.kv_bytes() > limit {
                if !self.cache.evict_one() {
                    break;
                }
            }
        }
        Room::Now
    }

    /// Prefills `req` (from the longest cached prefix that fits) and adds it to the batch;
    /// its first token comes with the next [`Scheduler::step`]. The caller checks
    /// [`Scheduler::room_for`] first. Returns the prompt tokens that came from a cached
    /// prefix. An error leaves the batch as it was.
    pub fn join(&mut self, id: SeqId, req: GenerateRequest) -> Result<usize> {
        validate(self.model, &req)?;
        if req.mtp.is_some() {
            bail!("speculative decoding (mtp) does not run in a batch");
        }
        let start = Instant::now();
        let (mut state, cached) = match self.cache.resume(&req) {
            Some(hit) => hit,
            None => (
                state_in(self.model, &req, self.pool.as_ref().map(|p| &p.pool))?,
                0,
            ),
        };
        let rest = &req.prompt_ids[state.pos..];
        let logits = super::prefill(self.model, rest, &mut state, req.prefill_step)?;
        let boundary = state.mark();
        let need = self.need(&req);
        self.reserved += need;
        let budget = token_budget(self.model, &req);
        self.running.push(Running {
            id,
            decoding: Decoding::new(&req, budget),
            req,
            state,
            logits,
            boundary,
            cached_prompt_tokens: cached,
            ttft: start.elapsed().as_secs_f64(),
            decode_start: Instant::now(),
            reserved: need,
        });
        Ok(cached)
    }

    /// Takes sequence `id` out of the batch (a client went away); false when it is not
    /// running.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        match self.running.iter().position(|s| s.id == id) {
            Some(i) => {
                let seq = self.running.remove(i);
                self.reserved -= seq.reserved;
                true
            }
            None => false,
        }
    }

    /// One token boundary: every running sequence picks its next token (`on` sees it, or the
    /// sequence's end), then those still running decode it together.
    pub fn step(&mut self, mut on: impl FnMut(SeqId, Update)) {
        let mut next = Vec::with_capacity(self.running.len());
        let mut r = 0;
        while r < self.running.len() {
            let seq = &mut self.running[r];
            let picked = seq
                .decoding
                .next(self.model, &seq.req, &seq.logits, seq.state.pos);
            let done = match picked {
                Ok(Ok(tok)) => {
                    let d = &seq.decoding;
                    let logprobs = d.top.as_ref().and_then(|top| {
                        Some(TokenLogprobs {
                            logprob: d.chosen?,
                            top: top.last()?.clone(),
                        })
                    });
                    on(
                        seq.id,
                        Update::Token {
                            token: tok,
                            logprobs,
                        },
                    );
                    if seq.decoding.tokens.len() == seq.decoding.budget {
                        Some(Ok(FinishReason::Length))
                    } else {
                        next.push(tok);
                        None
                    }
                }
                Ok(Err(reason)) => Some(Ok(reason)),
                Err(e) => Some(Err(e)),
            };
            match done {
                None => r += 1,
                Some(result) => {
                    let seq = self.running.remove(r);
                    self.reserved -= seq.reserved;
                    let id = seq.id;
                    on(id, self.leave(seq, result));
                }
            }
        }
        if self.running.is_empty() {
            return;
        }
        let model = self.model;
        let settings = self.running[0].state.kernels;
        let mut states: Vec<&mut ModelState> =
            self.running.iter_mut().map(|s| &mut s.state).collect();
        let n = states.len();
        let rows = kernels::run(model.device(), settings, || {
            model.decode_batch(&next, &mut states)
        })
        .and_then(|logits| {
            (0..n)
                .map(|i| Ok(logits.narrow0(i, 1)?))
                .collect::<Result<Vec<_>>>()
        });
        match rows {
            Ok(rows) => {
                for (seq, row) in self.running.iter_mut().zip(rows) {
                    seq.logits = row;
                }
            }
            Err(e) => {
                // The batch's forward failed: every sequence in it fails with the same cause.
                for seq in std::mem::take(&mut self.running) {
                    self.reserved -= seq.reserved;
                    on(seq.id, Update::Failed(anyhow!("{e:#}")));
                }
            }
        }
    }

    /// The update for a sequence that left, keeping its state for prefix reuse.
    fn leave(&mut self, seq: Running, result: Result<FinishReason>) -> Update {
        let reason = match result {
            Ok(reason) => reason,
            Err(e) => return Update::Failed(e),
        };
        let decode_secs = seq.decode_start.elapsed().as_secs_f64();
        let output = finished(
            &seq.req,
            seq.decoding.tokens,
            reason,
            (seq.ttft, decode_secs),
            seq.state.kv_bytes(),
            seq.decoding.top,
            None,
        );
        if self.pool.is_none() {
            self.cache.insert(Cached::new(
                &seq.req,
                &output.tokens,
                seq.state,
                seq.boundary,
            ));
        }
        Update::Finished(Box::new(Finished {
            output,
            cached_prompt_tokens: seq.cached_prompt_tokens,
        }))
    }
}

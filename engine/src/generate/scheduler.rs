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
//! A request with speculative decoding (`mtp`) advances a round at each boundary: a plain step
//! joins the batch's forward, a drafting round (drafts and their verification: one or more
//! tokens) runs beside it; while others run, a greedy one takes plain steps only. It starts
//! from a fresh state, since the draft head's cache is not kept with cached prefixes, and its
//! state is not offered for reuse.
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
use super::speculative::Speculator;
use super::{finished, speculative_setup, state_in, token_budget, validate, Decoding};
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

/// Where a running sequence's next token comes from.
enum Next {
    /// These logits (plain decoding, one token per step in the batch's forward).
    Logits(Tensor),
    /// Its own speculative round.
    Speculative(Box<Speculator>),
}

struct Running {
    id: SeqId,
    req: GenerateRequest,
    state: ModelState,
    decoding: Decoding,
    next: Next,
    /// Its token is in this step's batched forward.
    in_step: bool,
    /// Why it ended during the batched forward (a speculative sequence's plain step).
    ended: Option<Result<FinishReason>>,
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
    /// The draft head's KV bytes per position (0 without a head).
    draft_kv_per_position: usize,
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
            draft_kv_per_position: model
                .drafter()
                .map_or(0, |d| d.new_draft_state().kv_bytes_per_position()),
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

    /// What `req` reserves: pool blocks per layer (paged), or bytes of flat KV under a budget
    /// (the draft head's flat cache included with `mtp`; with paged KV the head's one layer
    /// stays outside the pool).
    fn need(&self, req: &GenerateRequest) -> usize {
        let positions = req.prompt_ids.len() + token_budget(self.model, req);
        match &self.pool {
            Some(p) => positions.div_ceil(p.block_size),
            None if self.opts.kv_budget.is_some() => {
                let per_position = self.kv_per_position
                    + if req.mtp.is_some() {
                        self.draft_kv_per_position
                    } else {
                        0
                    };
                // A flat cache grows by doubling from 64 slots: at most twice what it holds.
                per_position * (2 * positions).max(64)
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
        let start = Instant::now();
        let pool = self.pool.as_ref().map(|p| &p.pool);
        let (state, cached, next) = match (&req.mtp, self.model.drafter()) {
            (Some(opts), Some(drafter)) => {
                let mut state = state_in(self.model, &req, pool)?;
                let setup = speculative_setup(self.model, &req, start);
                let spec = Speculator::start(drafter, &mut state, &req.prompt_ids, opts, &setup)?;
                (state, 0, Next::Speculative(Box::new(spec)))
            }
            _ => {
                let (mut state, cached) = match self.cache.resume(&req) {
                    Some(hit) => hit,
                    None => (state_in(self.model, &req, pool)?, 0),
                };
                let rest = &req.prompt_ids[state.pos..];
                let logits = super::prefill(self.model, rest, &mut state, req.prefill_step)?;
                (state, cached, Next::Logits(logits))
            }
        };
        let boundary = state.mark();
        let need = self.need(&req);
        self.reserved += need;
        let budget = token_budget(self.model, &req);
        self.running.push(Running {
            id,
            decoding: Decoding::new(&req, budget),
            req,
            state,
            next,
            in_step: false,
            ended: None,
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

    /// One token boundary. Every running sequence picks its next token from its logits (`on`
    /// sees it, or the sequence's end), and a speculative one runs its own round, unless that
    /// round is a plain step while others run: then it joins the batch. The sequences still
    /// running then decode their tokens in one forward.
    pub fn step(&mut self, mut on: impl FnMut(SeqId, Update)) {
        let batched = self.running.len() > 1;
        let mut tokens = Vec::with_capacity(self.running.len());
        let mut r = 0;
        while r < self.running.len() {
            let seq = &mut self.running[r];
            seq.in_step = false;
            let ended = match &mut seq.next {
                Next::Logits(logits) => {
                    let picked = seq
                        .decoding
                        .next(self.model, &seq.req, logits, seq.state.pos);
                    match picked {
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
                                tokens.push(tok);
                                seq.in_step = true;
                                None
                            }
                        }
                        Ok(Err(reason)) => Some(Ok(reason)),
                        Err(e) => Some(Err(e)),
                    }
                }
                Next::Speculative(spec) => {
                    // While others run, a greedy sequence's rounds all join the batch: a
                    // drafting round alone reads every weight for this one sequence, which
                    // costs more than its drafts win once the batch shares the reads.
                    let budget = seq.decoding.budget;
                    let joins = batched
                        .then(|| {
                            spec.plain_next(budget)
                                .or_else(|| spec.defer_to_batch(budget))
                        })
                        .flatten();
                    match joins {
                        Some(x) => {
                            tokens.push(x);
                            seq.in_step = true;
                            None
                        }
                        None => speculative(self.model, seq, &mut on, None).transpose(),
                    }
                }
            };
            match ended {
                None => r += 1,
                Some(result) => self.depart(r, result, &mut on),
            }
        }
        if let Err(e) = self.forward(&tokens, &mut on) {
            // The batch's forward failed: every sequence in it fails with the same cause.
            for seq in std::mem::take(&mut self.running) {
                self.reserved -= seq.reserved;
                on(seq.id, Update::Failed(anyhow!("{e:#}")));
            }
        }
        // Speculative sequences whose batched plain step ended them leave.
        let mut r = 0;
        while r < self.running.len() {
            match self.running[r].ended.take() {
                None => r += 1,
                Some(result) => self.depart(r, result, &mut on),
            }
        }
    }

    /// Takes sequence `r` out of the batch and tells `on` how it ended.
    fn depart(
        &mut self,
        r: usize,
        result: Result<FinishReason>,
        on: &mut impl FnMut(SeqId, Update),
    ) {
        let seq = self.running.remove(r);
        self.reserved -= seq.reserved;
        let id = seq.id;
        let update = self.leave(seq, result);
        on(id, update);
    }

    /// The batch's forward of `tokens`, one per sequence marked `in_step`: plain sequences
    /// keep their logits row, speculative ones finish their plain step with it (and their
    /// hidden row), recording in `ended` why they end.
    fn forward(&mut self, tokens: &[u32], on: &mut impl FnMut(SeqId, Update)) -> Result<()> {
        let model = self.model;
        let mut members: Vec<&mut Running> =
            self.running.iter_mut().filter(|s| s.in_step).collect();
        let Some(first) = members.first() else {
            return Ok(());
        };
        let settings = first.state.kernels;
        let drafter = members
            .iter()
            .any(|s| matches!(s.next, Next::Speculative(_)))
            .then(|| model.drafter())
            .flatten();
        let mut states: Vec<&mut ModelState> = members.iter_mut().map(|s| &mut s.state).collect();
        let (logits, hidden) = kernels::run(model.device(), settings, || match drafter {
            Some(d) => d
                .decode_batch_hidden(tokens, &mut states)
                .map(|(l, h)| (l, Some(h))),
            None => model.decode_batch(tokens, &mut states).map(|l| (l, None)),
        })?;
        for (i, seq) in members.into_iter().enumerate() {
            let row = logits.narrow0(i, 1)?;
            if let Next::Logits(l) = &mut seq.next {
                *l = row;
                continue;
            }
            let h = match &hidden {
                Some(h) => h.narrow0(i, 1)?,
                None => bail!("internal: a speculative sequence's step without its hidden row"),
            };
            seq.ended = speculative(model, seq, on, Some((row, h))).transpose();
        }
        Ok(())
    }

    /// The update for a sequence that left, keeping its state for prefix reuse.
    fn leave(&mut self, seq: Running, result: Result<FinishReason>) -> Update {
        let reason = match result {
            Ok(reason) => reason,
            Err(e) => return Update::Failed(e),
        };
        let decode_secs = seq.decode_start.elapsed().as_secs_f64();
        let (mtp, plain) = match seq.next {
            Next::Speculative(spec) => (Some(spec.finish().stats), false),
            Next::Logits(_) => (None, true),
        };
        let output = finished(
            &seq.req,
            seq.decoding.tokens,
            reason,
            (seq.ttft, decode_secs),
            seq.state.kv_bytes(),
            seq.decoding.top,
            mtp,
        );
        if self.pool.is_none() && plain {
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

/// Advances speculative sequence `seq` (its tokens recorded in its `decoding` and passed to
/// `on`): its own round, or with `rows` (logits and hidden row of the batch's forward) the
/// plain step it announced. Why it ended, when it has.
fn speculative(
    model: &dyn CausalLm,
    seq: &mut Running,
    on: &mut impl FnMut(SeqId, Update),
    rows: Option<(Tensor, Tensor)>,
) -> Result<Option<FinishReason>> {
    let Running {
        id,
        req,
        state,
        decoding: d,
        next: Next::Speculative(spec),
        decode_start,
        ..
    } = seq
    else {
        bail!("internal: a plain sequence in a speculative round");
    };
    let drafter = model
        .drafter()
        .ok_or_else(|| anyhow!("internal: a speculative sequence on a model without a head"))?;
    let setup = speculative_setup(model, req, *decode_start);
    let (id, k) = (*id, req.top_logprobs);
    let mut failed = None;
    let mut emit = |token: u32, row: &Tensor| {
        let logprobs = match (k, &mut d.top) {
            (0, _) | (_, None) => None,
            (k, Some(top)) => match super::logprobs_of(model, row, token, k) {
                Ok((logprob, best)) => {
                    top.push(best.clone());
                    Some(TokenLogprobs { logprob, top: best })
                }
                Err(e) => {
                    failed.get_or_insert(e);
                    None
                }
            },
        };
        d.tokens.push(token);
        on(id, Update::Token { token, logprobs });
    };
    let more = match rows {
        None => spec.round(drafter, state, &setup, &mut emit)?,
        Some(rows) => spec.plain_rows(drafter, state, &setup, &mut emit, rows)?,
    };
    match failed {
        Some(e) => Err(e),
        None if more => Ok(None),
        None if spec.stopped() => Ok(Some(FinishReason::Stop)),
        None => Ok(Some(FinishReason::Length)),
    }
}

//! Several requests at once (continuous batching): each sequence is prefilled alone when it
//! joins, then all running sequences decode together, one token each per step, through
//! [`CausalLm::decode_batch`] (families that batch read each weight once per group of rows). A
//! sequence that finishes leaves at once and a waiting one joins in its place, so the batch
//! stays full while requests remain.
//!
//! Every result equals running that request alone: prefill is the same forward, decode rows
//! compute bit-identically to a lone row, and each sequence samples with its own sampler.
//!
//! With paged KV all sequences share one pool per layer (so equal prompt prefixes share
//! blocks). A sequence joins only when the pool can hold its whole prompt and budget on top of
//! what the running ones may still claim, so the batch never runs out of blocks midway.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::{bail, Result};
use kernels::Tensor;

use super::{finished, prefill, state_in, validate, Decoding};
use super::{FinishReason, GenerateOutput, GenerateRequest};
use crate::cache::{KvPool, ModelState};
use crate::models::CausalLm;

/// How a batch runs.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Sequences decoding together at most.
    pub max_batch: usize,
}

/// One running sequence.
struct Running {
    /// Which request.
    index: usize,
    state: ModelState,
    decoding: Decoding,
    /// The logits its next token comes from.
    logits: Tensor,
    ttft: f64,
    decode_start: Instant,
    /// Pool blocks reserved for it (paged KV).
    reserved: usize,
}

/// Pool blocks a request may need per layer: its prompt and whole budget.
fn blocks_needed(req: &GenerateRequest, budget: usize) -> usize {
    req.paged_kv.map_or(0, |p| {
        (req.prompt_ids.len() + budget).div_ceil(p.block_size.max(1))
    })
}

/// Runs `reqs` as one batch; `on_token(i, tok)` sees request `i`'s tokens as they come.
/// The requests must agree on the cache settings (flat or paged, block size, GDN path) and
/// must not ask for speculative decoding. Outputs come back in request order.
pub fn generate_batch(
    model: &dyn CausalLm,
    reqs: &[GenerateRequest],
    opts: BatchOptions,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Vec<GenerateOutput>> {
    let Some(first) = reqs.first() else {
        return Ok(Vec::new());
    };
    if opts.max_batch == 0 {
        bail!("a batch must run at least one sequence at a time");
    }
    for (i, r) in reqs.iter().enumerate() {
        validate(model, r).map_err(|e| e.context(format!("request {}", i + 1)))?;
        if r.mtp.is_some() {
            bail!(
                "request {}: speculative decoding (mtp) does not run in a batch",
                i + 1
            );
        }
        if (r.paged_kv, r.flat_kv, r.gdn_path, r.kernels)
            != (first.paged_kv, first.flat_kv, first.gdn_path, first.kernels)
        {
            bail!(
                "request {}: every request of a batch must use the same KV layout, GDN path and kernel settings",
                i + 1
            );
        }
    }
    let budget = |r: &GenerateRequest| super::token_budget(model, r);
    // One pool for the whole batch, sized for the largest request unless given.
    let pool = match first.paged_kv {
        Some(p) => {
            let largest = reqs
                .iter()
                .map(|r| blocks_needed(r, budget(r)))
                .max()
                .unwrap_or(0);
            let blocks = p.blocks.unwrap_or_else(|| {
                reqs.iter()
                    .map(|r| blocks_needed(r, budget(r)))
                    .sum::<usize>()
                    .max(1)
            });
            if largest > blocks {
                bail!(
                    "a request needs {largest} KV blocks of {} positions per layer but the pool holds {blocks} (--kv-blocks)",
                    p.block_size
                );
            }
            Some((
                KvPool::for_state(&model.new_state(), p.block_size, blocks)?,
                blocks,
            ))
        }
        None => None,
    };
    let start = Instant::now();
    let mut waiting: VecDeque<usize> = (0..reqs.len()).collect();
    let mut running: Vec<Running> = Vec::new();
    let mut outputs: Vec<Option<GenerateOutput>> = vec![None; reqs.len()];
    let mut reserved = 0;
    while !waiting.is_empty() || !running.is_empty() {
        // Join: while there is room in the batch and in the pool.
        while let Some(&i) = waiting.front() {
            let req = &reqs[i];
            let need = blocks_needed(req, budget(req));
            let fits = pool
                .as_ref()
                .is_none_or(|(_, blocks)| reserved + need <= *blocks);
            if running.len() >= opts.max_batch || !fits {
                break;
            }
            waiting.pop_front();
            let mut state = state_in(model, req, pool.as_ref().map(|(p, _)| p))?;
            let logits = prefill(model, &req.prompt_ids, &mut state, req.prefill_step)?;
            reserved += need;
            running.push(Running {
                index: i,
                state,
                decoding: Decoding::new(req, budget(req)),
                logits,
                ttft: start.elapsed().as_secs_f64(),
                decode_start: Instant::now(),
                reserved: need,
            });
        }
        // Sample every running sequence's next token; finished ones leave.
        let mut next = Vec::with_capacity(running.len());
        let mut r = 0;
        while r < running.len() {
            let seq = &mut running[r];
            let req = &reqs[seq.index];
            let done = match seq.decoding.next(model, req, &seq.logits, seq.state.pos)? {
                Ok(tok) => {
                    on_token(seq.index, tok);
                    if seq.decoding.tokens.len() == seq.decoding.budget {
                        Some(FinishReason::Length)
                    } else {
                        next.push(tok);
                        None
                    }
                }
                Err(reason) => Some(reason),
            };
            match done {
                Some(reason) => {
                    let seq = running.remove(r);
                    reserved -= seq.reserved;
                    let decode_secs = seq.decode_start.elapsed().as_secs_f64();
                    outputs[seq.index] = Some(finished(
                        req,
                        seq.decoding.tokens,
                        reason,
                        (seq.ttft, decode_secs),
                        seq.state.kv_bytes(),
                        seq.decoding.top,
                        None,
                    ));
                }
                None => r += 1,
            }
        }
        if running.is_empty() {
            continue;
        }
        let mut states: Vec<&mut ModelState> = running.iter_mut().map(|s| &mut s.state).collect();
        let logits = kernels::run(model.device(), first.kernels, || {
            model.decode_batch(&next, &mut states)
        })?;
        for (i, seq) in running.iter_mut().enumerate() {
            seq.logits = logits.narrow0(i, 1)?;
        }
    }
    Ok(outputs
        .into_iter()
        .map(|o| o.expect("every request finishes"))
        .collect())
}

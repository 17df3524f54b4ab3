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

use anyhow::{bail, Result};

use super::scheduler::{Room, Scheduler, SchedulerOptions, Update};
use super::{validate, GenerateOutput, GenerateRequest};
use crate::models::CausalLm;

/// How a batch runs.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Sequences decoding together at most.
    pub max_batch: usize,
}

/// Pool blocks a request may need per layer: its prompt and whole budget.
fn blocks_needed(model: &dyn CausalLm, req: &GenerateRequest) -> usize {
    req.paged_kv.map_or(0, |p| {
        (req.prompt_ids.len() + super::token_budget(model, req)).div_ceil(p.block_size.max(1))
    })
}

/// Runs `reqs` as one batch; `on_token(i, tok)` sees request `i`'s tokens as they come.
/// The requests must agree on the cache settings (flat or paged, block size, GDN path); those
/// with speculative decoding run their own rounds beside the batch's step. Outputs come back
/// in request order.
pub fn generate_batch(
    model: &dyn CausalLm,
    reqs: &[GenerateRequest],
    opts: BatchOptions,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Vec<GenerateOutput>> {
    let Some(first) = reqs.first() else {
        return Ok(Vec::new());
    };
    for (i, r) in reqs.iter().enumerate() {
        validate(model, r).map_err(|e| e.context(format!("request {}", i + 1)))?;
        if (r.paged_kv, r.flat_kv, r.gdn_path, r.kernels)
            != (first.paged_kv, first.flat_kv, first.gdn_path, first.kernels)
        {
            bail!(
                "request {}: every request of a batch must use the same KV layout, GDN path and kernel settings",
                i + 1
            );
        }
    }
    let mut sched = Scheduler::new(
        model,
        SchedulerOptions {
            max_batch: opts.max_batch,
            prefix_cache: 0,
            kv_budget: None,
        },
    )?;
    // One pool for the whole batch, sized for all requests at once unless given.
    if let Some(p) = first.paged_kv {
        let needs = reqs.iter().map(|r| blocks_needed(model, r));
        let largest = needs.clone().max().unwrap_or(0);
        let blocks = p.blocks.unwrap_or_else(|| needs.sum::<usize>().max(1));
        if largest > blocks {
            bail!(
                "a request needs {largest} KV blocks of {} positions per layer but the pool holds {blocks} (--kv-blocks)",
                p.block_size
            );
        }
        sched = sched.with_pool(p.block_size, blocks)?;
    }
    let mut waiting: VecDeque<usize> = (0..reqs.len()).collect();
    let mut outputs: Vec<Option<GenerateOutput>> = vec![None; reqs.len()];
    while !waiting.is_empty() || sched.running() > 0 {
        // Join: while there is room in the batch and in the pool.
        while let Some(&i) = waiting.front() {
            match sched.room_for(&reqs[i]) {
                Room::Now => {}
                Room::Later if sched.running() > 0 => break,
                _ => bail!("request {}: does not fit the KV pool", i + 1),
            }
            waiting.pop_front();
            sched.join(i as u64, reqs[i].clone())?;
        }
        let mut failed = None;
        sched.step(|id, update| match update {
            Update::Token { token, .. } => on_token(id as usize, token),
            Update::Finished(f) => outputs[id as usize] = Some(f.output),
            Update::Failed(e) => {
                failed.get_or_insert(e.context(format!("request {}", id + 1)));
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(outputs
        .into_iter()
        .map(|o| o.expect("every request finishes"))
        .collect())
}

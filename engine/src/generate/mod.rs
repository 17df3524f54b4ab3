//! The prefill/decode loop: validates a request against the model, prefills the prompt (in
//! pieces when asked), then decodes until a stop token or the token budget.

pub mod batch;
pub mod draft_vocab;
pub mod prefix;
pub mod rng;
pub mod sampler;
pub mod scheduler;
pub mod speculative;

use std::time::Instant;

use anyhow::{bail, Result};
use kernels::ops;
use kernels::Settings;

use crate::cache::ModelState;
use crate::layers::GdnPath;
use crate::models::CausalLm;
pub use batch::{generate_batch, BatchOptions};
pub use draft_vocab::DEFAULT_DRAFT_VOCAB;
pub use sampler::{Sampler, SamplingParams};
pub use speculative::{ForcedDrafts, MtpOptions, MtpStats};

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation; the stop token itself is not part of the output.
    pub stop_ids: Vec<u32>,
    /// When > 0, record the best `top_logprobs` `[token, logprob]` pairs of every step.
    pub top_logprobs: usize,
    /// Prefill at most this many tokens per forward (`None`: the whole prompt at once).
    pub prefill_step: Option<usize>,
    /// How Gated DeltaNet layers compute (ignored by families without them).
    pub gdn_path: GdnPath,
    /// Sliding-window layers keep every position (masked) instead of rotating their cache:
    /// the reference that the rotating cache must match bit for bit.
    pub flat_kv: bool,
    /// Speculative decoding with the model's own draft head.
    pub mtp: Option<MtpOptions>,
    /// Full-attention layers keep their KV in blocks of a pool instead of one flat buffer.
    pub paged_kv: Option<PagedKv>,
    /// How the kernels compute: the numerics path, `exact` (f32 activations) or `fast` (see
    /// `kernels::numerics`), and the CPU's instruction-set cap.
    pub kernels: Settings,
}

/// Paged KV settings (see [`crate::cache::paged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKv {
    /// Positions per block.
    pub block_size: usize,
    /// The most blocks each layer's pool hands out (`None`: enough for the whole context).
    pub blocks: Option<usize>,
}

impl Default for PagedKv {
    fn default() -> PagedKv {
        PagedKv {
            block_size: 16,
            blocks: None,
        }
    }
}

/// A fresh state set up as `req` asks: flat or rotating sliding-window caches, paged or flat
/// full-attention caches (a new pool), the GDN path.
pub fn fresh_state(model: &dyn CausalLm, req: &GenerateRequest) -> Result<ModelState> {
    let pool = match req.paged_kv {
        Some(p) => {
            let blocks = p
                .blocks
                .unwrap_or_else(|| model.info().context_length.div_ceil(p.block_size.max(1)) + 1);
            Some(crate::cache::KvPool::for_state(
                &model.new_state(),
                p.block_size,
                blocks,
            )?)
        }
        None => None,
    };
    state_in(model, req, pool.as_ref())
}

/// [`fresh_state`] paging its full-attention caches into `pool` when given (a batch shares
/// one pool across its sequences).
pub(crate) fn state_in(
    model: &dyn CausalLm,
    req: &GenerateRequest,
    pool: Option<&crate::cache::KvPool>,
) -> Result<ModelState> {
    let mut state = model.new_state();
    if req.flat_kv {
        state = state.with_flat_kv()?;
    }
    if let Some(pool) = pool {
        state = state.with_paged_kv(pool)?;
    }
    state.gdn_path = req.gdn_path;
    state.kernels = req.kernels;
    Ok(state)
}

/// One forward of `ids` with the state's kernel settings (on the CPU's worker pool for the
/// host).
pub(crate) fn forward(
    model: &dyn CausalLm,
    ids: &[u32],
    state: &mut ModelState,
    all_logits: bool,
) -> Result<kernels::Tensor> {
    let s = state.kernels;
    kernels::run(model.device(), s, || model.forward(ids, state, all_logits))
}

/// How many tokens `req` may generate: its `max_tokens`, cut to what the context leaves after
/// the prompt ([`validate`] has checked that the prompt fits).
pub(crate) fn token_budget(model: &dyn CausalLm, req: &GenerateRequest) -> usize {
    let context = model.info().context_length;
    req.max_tokens
        .min(context.saturating_sub(req.prompt_ids.len()))
}

/// Feeds `ids` to the model in pieces of at most `step` tokens (all at once when `None`);
/// returns the last piece's logits. `ids` must not be empty.
pub(crate) fn prefill(
    model: &dyn CausalLm,
    ids: &[u32],
    state: &mut ModelState,
    step: Option<usize>,
) -> Result<kernels::Tensor> {
    let mut logits = None;
    for piece in ids.chunks(step.unwrap_or(ids.len()).max(1)) {
        logits = Some(forward(model, piece, state, false)?);
    }
    Ok(logits.expect("prefill of a non-empty prompt"))
}

/// What a sequence has generated so far, and how it picks its next token.
pub(crate) struct Decoding {
    pub sampler: Sampler,
    pub tokens: Vec<u32>,
    pub top: Option<Vec<Vec<(u32, f32)>>>,
    /// The last generated token's own log-prob, when `top` is recorded.
    pub chosen: Option<f32>,
    pub budget: usize,
}

impl Decoding {
    pub fn new(req: &GenerateRequest, budget: usize) -> Decoding {
        Decoding {
            sampler: Sampler::new(req.sampling),
            tokens: Vec::new(),
            top: (req.top_logprobs > 0).then(Vec::new),
            chosen: None,
            budget,
        }
    }

    /// Picks the token after position `pos` from its `logits` (recording log-probs when
    /// asked). `Err(reason)` when the sequence ends instead: a stop token, or no budget left.
    pub fn next(
        &mut self,
        model: &dyn CausalLm,
        req: &GenerateRequest,
        logits: &kernels::Tensor,
        pos: usize,
    ) -> Result<std::result::Result<u32, FinishReason>> {
        if self.tokens.len() >= self.budget {
            return Ok(Err(FinishReason::Length));
        }
        if let Some(top) = self.top.as_mut() {
            top.push(top_logprobs(model, logits, req.top_logprobs)?);
        }
        check_finite(logits, pos)?;
        let tok = self.sampler.sample(logits)?;
        if req.stop_ids.contains(&tok) {
            if let Some(top) = self.top.as_mut() {
                top.pop();
            }
            return Ok(Err(FinishReason::Stop));
        }
        if let Some(top) = &self.top {
            // The chosen token's log-prob: in the recorded best ones, or else (a draw outside
            // them) from the whole row.
            let best = top.last().map_or(&[][..], Vec::as_slice);
            self.chosen = Some(chosen_logprob(model, logits, tok, best)?);
        }
        self.tokens.push(tok);
        Ok(Ok(tok))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` were generated, or the context is full.
    Length,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateOutput {
    pub prompt_ids: Vec<u32>,
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    /// From the prompt entering the engine to the first token's logits on the host.
    pub ttft_ms: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Bytes the KV caches hold when generation ends.
    pub kv_cache_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    /// What speculative decoding did, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpStats>,
}

/// Checks a request against the model's vocabulary and context before any work is done.
pub fn validate(model: &dyn CausalLm, req: &GenerateRequest) -> Result<()> {
    let info = model.info();
    if req.prompt_ids.is_empty() {
        bail!("the prompt is empty: give at least one token");
    }
    if let Some((i, &id)) = req
        .prompt_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= info.vocab_size)
    {
        bail!(
            "prompt token {i} has id {id}, outside the model's vocabulary (vocab_size {})",
            info.vocab_size
        );
    }
    if req.prompt_ids.len() >= info.context_length {
        bail!(
            "the prompt has {} tokens but the context holds {} (max_position_embeddings); at least one must remain for generation",
            req.prompt_ids.len(),
            info.context_length
        );
    }
    if req.prefill_step == Some(0) {
        bail!("prefill step must be at least 1 token");
    }
    if let Some(m) = &req.mtp {
        if model.drafter().is_none() {
            bail!(
                "--mtp needs a checkpoint with its own draft head (Qwen3.5's `mtp.*` tensors, kept in original folders; mlx-lm conversions drop them); this {} model has none",
                info.family
            );
        }
        if !(1..=4).contains(&m.depth) {
            bail!("--mtp takes a draft depth of 1 to 4, got {}", m.depth);
        }
    }
    req.sampling.validate()
}

/// Refuses logits rows with no finite value (NaN or inf everywhere): the model diverged, and
/// greedy decoding would otherwise pick token 0 as if nothing happened. `logits` is `[T, V]`,
/// its last row the prediction after position `last_pos`.
pub(super) fn check_finite(logits: &kernels::Tensor, last_pos: usize) -> Result<()> {
    let host = logits.to_device(kernels::Device::Cpu)?.to_f32()?;
    let v = host.dim(-1);
    let rows = host.f32s()?.chunks(v);
    let t = rows.len();
    for (r, row) in rows.enumerate() {
        if !row.iter().any(|x| x.is_finite()) {
            bail!(
                "the logits after position {} are all NaN or infinite: the checkpoint's weights \
                 or config values make the model diverge",
                last_pos + 1 + r - t
            );
        }
    }
    Ok(())
}

/// The output of a finished request. Decode speed counts the tokens after the first, which
/// came from prefill: `secs` is (TTFT, decode time).
fn finished(
    req: &GenerateRequest,
    tokens: Vec<u32>,
    finish_reason: FinishReason,
    (ttft, decode_secs): (f64, f64),
    kv_cache_bytes: usize,
    top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    mtp: Option<MtpStats>,
) -> GenerateOutput {
    let decode_steps = tokens.len().saturating_sub(1) as f64;
    GenerateOutput {
        prompt_ids: req.prompt_ids.clone(),
        tokens,
        finish_reason,
        ttft_ms: ttft * 1e3,
        prefill_tokens_per_s: req.prompt_ids.len() as f64 / ttft.max(1e-12),
        decode_tokens_per_s: if decode_steps > 0.0 {
            decode_steps / decode_secs.max(1e-12)
        } else {
            0.0
        },
        kv_cache_bytes,
        top_logprobs,
        mtp,
    }
}

/// Runs one request to completion; `on_token` sees every generated token as it is produced.
pub fn generate(
    model: &dyn CausalLm,
    req: &GenerateRequest,
    mut on_token: impl FnMut(u32),
) -> Result<GenerateOutput> {
    validate(model, req)?;
    let mut state = fresh_state(model, req)?;
    if let (Some(opts), Some(drafter)) = (&req.mtp, model.drafter()) {
        let start = Instant::now();
        let mut rows = Vec::new();
        let d = speculative::decode(
            drafter,
            &mut state,
            &req.prompt_ids,
            opts,
            speculative_setup(model, req, start),
            &mut |tok, row| {
                if req.top_logprobs > 0 {
                    rows.push(row.clone());
                }
                on_token(tok)
            },
        )?;
        let top = match req.top_logprobs {
            0 => None,
            k => Some(
                rows.iter()
                    .map(|row| top_logprobs(model, row, k))
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        let decode_secs = start.elapsed().as_secs_f64() - d.ttft;
        let finish = if d.stopped {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        return Ok(finished(
            req,
            d.tokens,
            finish,
            (d.ttft, decode_secs),
            state.kv_bytes(),
            top,
            Some(d.stats),
        ));
    }
    continue_plain(model, req, &mut state, |_| {}, on_token)
}

/// What speculative decoding needs of `req` besides its MTP options; `start` is when the
/// prompt entered the engine.
pub(crate) fn speculative_setup<'r>(
    model: &dyn CausalLm,
    req: &'r GenerateRequest,
    start: Instant,
) -> speculative::Setup<'r> {
    speculative::Setup {
        budget: token_budget(model, req),
        stop_ids: &req.stop_ids,
        keep_rows: req.top_logprobs > 0,
        prefill_step: req.prefill_step.unwrap_or(req.prompt_ids.len()),
        vocab: model.info().vocab_size,
        sampling: req.sampling,
        start,
        device: model.device(),
        kernels: req.kernels,
    }
}

/// Plain decoding of `req` on a `state` that has already seen `req.prompt_ids[..state.pos]`
/// (a fresh state, or one a [`crate::Session`] kept from an earlier turn): prefills the rest
/// of the prompt, lets `after_prefill` look at the state (a session marks the turn boundary
/// there), then decodes. The request must have passed [`validate`] and must leave at least
/// one prompt token to prefill.
pub(crate) fn continue_plain(
    model: &dyn CausalLm,
    req: &GenerateRequest,
    state: &mut ModelState,
    after_prefill: impl FnOnce(&ModelState),
    mut on_token: impl FnMut(u32),
) -> Result<GenerateOutput> {
    let start = Instant::now();
    let rest = req.prompt_ids.get(state.pos..).unwrap_or_default();
    if rest.is_empty() {
        bail!(
            "internal: a continued state has seen {} tokens, the prompt has {}; at least one must be left to prefill",
            state.pos,
            req.prompt_ids.len()
        );
    }
    let mut logits = prefill(model, rest, state, req.prefill_step)?;
    after_prefill(state);
    let ttft = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    // Grown as tokens come: the budget may be a context length of millions.
    let mut d = Decoding::new(req, token_budget(model, req));
    let finish = loop {
        match d.next(model, req, &logits, state.pos)? {
            Err(reason) => break reason,
            Ok(next) => {
                on_token(next);
                if d.tokens.len() == d.budget {
                    break FinishReason::Length;
                }
                logits = forward(model, &[next], state, false)?;
            }
        }
    };
    let decode_secs = decode_start.elapsed().as_secs_f64();
    Ok(finished(
        req,
        d.tokens,
        finish,
        (ttft, decode_secs),
        state.kv_bytes(),
        d.top,
        None,
    ))
}

/// The log-prob of `tok` in one logits row: from `best` (the row's best pairs) when it is
/// there, else from the whole row.
fn chosen_logprob(
    model: &dyn CausalLm,
    logits: &kernels::Tensor,
    tok: u32,
    best: &[(u32, f32)],
) -> Result<f32> {
    match best.iter().find(|e| e.0 == tok) {
        Some(&(_, lp)) => Ok(lp),
        None => token_logprob(model, logits, tok),
    }
}

/// A generated token's log-prob and the best `k` pairs of the logits row it came from.
pub(crate) fn logprobs_of(
    model: &dyn CausalLm,
    logits: &kernels::Tensor,
    tok: u32,
    k: usize,
) -> Result<(f32, Vec<(u32, f32)>)> {
    let best = top_logprobs(model, logits, k)?;
    Ok((chosen_logprob(model, logits, tok, &best)?, best))
}

/// The log-prob of `tok` in one logits row `[1, V]`.
fn token_logprob(model: &dyn CausalLm, logits: &kernels::Tensor, tok: u32) -> Result<f32> {
    let lp = ops::log_softmax(&logits.to_device(model.device())?)?;
    let host = lp.to_device(kernels::Device::Cpu)?.to_f32()?;
    host.f32s()?
        .get(tok as usize)
        .copied()
        .ok_or_else(|| anyhow::anyhow!("token {tok} is outside the logits row"))
}

/// The best `k` `(token, log-prob)` pairs of one logits row `[1, V]`. On the model's device:
/// on MLX that is mlx-lm's own `logits − logsumexp`, so the reported log-probs compare with
/// mlx-lm's bit for bit where the forward does.
fn top_logprobs(
    model: &dyn CausalLm,
    logits: &kernels::Tensor,
    k: usize,
) -> Result<Vec<(u32, f32)>> {
    let lp = ops::log_softmax(&logits.to_device(model.device())?)?;
    let v = lp.dim(-1);
    Ok(ops::top_k(&lp.reshape(&[v])?, k)?)
}

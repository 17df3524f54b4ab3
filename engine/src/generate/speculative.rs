//! Greedy speculative decoding with the model's own draft head (Qwen3.5's MTP).
//!
//! Each round the head drafts up to D tokens after the last emitted token `x`; the main model
//! runs `[x, d_1 .. d_D]` in one forward, the longest prefix of drafts it agrees with is kept,
//! and its own next token (the correction) follows. Greedy output is therefore the main model's
//! own argmax sequence, whatever the drafts are. When a draft is rejected the main state rolls
//! back to `x` and replays the kept tokens: Gated DeltaNet and conv states cannot be trimmed, KV
//! caches are trimmed. The head keeps its own KV caches, rolled back the same way after its
//! chained drafts.

use anyhow::{bail, ensure, Result};
use kernels::{ops, Tensor};

use crate::models::SelfDrafter;

/// Options of speculative decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtpOptions {
    /// Tokens drafted per round (1..=4).
    pub depth: usize,
    /// Test-only: replace the head's drafts (see [`ForcedDrafts`]).
    pub forced: Option<ForcedDrafts>,
}

/// Drafts chosen by a test instead of the head, so full, partial and zero acceptance all run
/// even though synthetic weights draft poorly: in every round the first `correct` drafts are
/// the `reference` output's tokens at those places (what plain decoding produced) and the rest
/// are wrong on purpose (the reference token + 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedDrafts {
    pub reference: Vec<u32>,
    pub correct: usize,
}

/// What speculative decoding did, for `--json`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MtpStats {
    pub depth: usize,
    /// Verification rounds (main-model forwards over drafts).
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// `accepted / drafted`.
    pub acceptance_rate: f64,
    /// Drafts accepted per round.
    pub mean_accepted_length: f64,
    /// For each draft position, the share of rounds in which it was accepted.
    pub per_position_acceptance: Vec<f64>,
    /// Rounds that rolled the main state back and replayed the kept tokens.
    pub replays: usize,
}

/// The first token (from prefill) and everything after it, as [`super::generate`] needs it.
pub(super) struct Decoded {
    pub tokens: Vec<u32>,
    pub stopped: bool,
    /// The logits row each token was chosen from, when the caller records log-probs.
    pub rows: Vec<Tensor>,
    pub stats: MtpStats,
    /// Seconds from `Setup::start` to the first token's logits.
    pub ttft: f64,
}

/// Everything the loop needs besides the model.
pub(super) struct Setup<'a> {
    pub budget: usize,
    pub stop_ids: &'a [u32],
    pub keep_rows: bool,
    pub prefill_step: usize,
    pub vocab: usize,
    /// When the prompt entered the engine (TTFT is measured from it).
    pub start: std::time::Instant,
}

/// The greedy speculative loop from an empty `state`; `on_token` sees every emitted token.
pub(super) fn decode(
    drafter: &dyn SelfDrafter,
    state: &mut crate::cache::ModelState,
    prompt: &[u32],
    opts: &MtpOptions,
    setup: Setup,
    on_token: &mut dyn FnMut(u32),
) -> Result<Decoded> {
    ensure!(
        (1..=4).contains(&opts.depth),
        "--mtp takes a draft depth of 1 to 4, got {}",
        opts.depth
    );
    let d = opts.depth;
    let mut out = Decoded {
        tokens: Vec::new(),
        stopped: false,
        rows: Vec::new(),
        ttft: 0.0,
        stats: MtpStats {
            depth: d,
            per_position_acceptance: vec![0.0; d],
            ..MtpStats::default()
        },
    };
    let mut draft_state = drafter.new_draft_state();
    draft_state.gdn_path = state.gdn_path;

    // Prefill, feeding the head each piece's pairs (token at t + 1, hidden at t) as soon as the
    // token at t + 1 is known; the last pair waits for the first generated token.
    let mut logits = None;
    let mut last_hidden = None;
    let mut at = 0;
    for piece in prompt.chunks(setup.prefill_step) {
        let (l, h) = drafter.forward_hidden(piece, state, false)?;
        let end = at + piece.len();
        let next = &prompt[at + 1..end.min(prompt.len() - 1) + 1];
        let known = next.len().min(piece.len());
        if known > 0 {
            drafter.draft(
                &next[..known],
                &h.narrow0(0, known)?,
                &mut draft_state,
                false,
            )?;
        }
        last_hidden = Some(h.narrow0(h.dim(0) - 1, 1)?);
        logits = Some(l);
        at = end;
    }
    let (logits, mut hidden) = (
        logits.expect("prompt is non-empty"),
        last_hidden.expect("prompt is non-empty"),
    );
    out.ttft = setup.start.elapsed().as_secs_f64();
    let mut x = first_token(&logits)?;
    if !emit(&mut out, x, &logits, &setup, on_token) {
        return Ok(finish(out));
    }
    // The head's pair for the prompt's last position drafts the token after `x`.
    let (pending, mut pending_hidden) = drafter.draft(&[x], &hidden, &mut draft_state, true)?;
    let mut pending = pending.expect("asked for logits");

    while out.tokens.len() < setup.budget {
        let left = setup.budget - out.tokens.len();
        // No draft past the budget: the last token of a round is the main model's own.
        let depth = d.min(left.saturating_sub(1)).max(1);
        let drafts = draft_round(drafter, &mut draft_state, depth, &pending, &pending_hidden)?;
        let drafts = force(opts, drafts, out.tokens.len(), setup.vocab);

        let before = state.mark();
        let mut ids = Vec::with_capacity(depth + 1);
        ids.push(x);
        ids.extend(&drafts);
        let (verify, verify_hidden) = drafter.forward_hidden(&ids, state, true)?;
        all_finite_somewhere(&verify)?;
        let best = ops::argmax(&verify)?;
        let kept = drafts.iter().zip(&best).take_while(|(a, b)| a == b).count();
        let st = &mut out.stats;
        st.rounds += 1;
        st.drafted += depth;
        st.accepted += kept;
        for p in st.per_position_acceptance.iter_mut().take(kept) {
            *p += 1.0;
        }
        hidden = verify_hidden;
        if kept < depth {
            // Back to `x`, then the kept tokens again: the rejected drafts left their marks in
            // the recurrent state.
            state.rollback(&before)?;
            let (_, h) = drafter.forward_hidden(&ids[..kept + 1], state, false)?;
            hidden = h;
            out.stats.replays += 1;
        }
        let correction = best[kept];
        for (i, &t) in drafts[..kept].iter().chain([&correction]).enumerate() {
            let row = if setup.keep_rows {
                verify.narrow0(i, 1)?
            } else {
                verify.clone()
            };
            if !emit(&mut out, t, &row, &setup, on_token) {
                return Ok(finish(out));
            }
        }
        // The head's pairs for the positions the main model just settled: (token at t + 1,
        // hidden at t) for t = pos(x) ..= pos(x) + kept.
        let mut next = drafts[..kept].to_vec();
        next.push(correction);
        let rows = hidden.narrow0(0, kept + 1)?;
        let (l, h) = drafter.draft(&next, &rows, &mut draft_state, true)?;
        pending = l.expect("asked for logits");
        pending_hidden = h.narrow0(kept, 1)?;
        x = correction;
    }
    Ok(finish(out))
}

/// The head's `depth` drafts from its pending prediction, chained on its own hidden states;
/// its state is left where it was (the chained steps are scratch).
fn draft_round(
    drafter: &dyn SelfDrafter,
    state: &mut crate::cache::ModelState,
    depth: usize,
    pending: &Tensor,
    pending_hidden: &Tensor,
) -> Result<Vec<u32>> {
    let mark = state.mark();
    let mut drafts = vec![ops::argmax(pending)?[0]];
    let mut h = pending_hidden.clone();
    while drafts.len() < depth {
        let last = *drafts.last().expect("one draft at least");
        let (l, next_h) = drafter.draft(&[last], &h, state, true)?;
        drafts.push(ops::argmax(&l.expect("asked for logits"))?[0]);
        h = next_h;
    }
    state.rollback(&mark)?;
    Ok(drafts)
}

/// Forced drafts replace the head's (tests only; see [`ForcedDrafts`]). `done` is how many
/// tokens were emitted, so draft `j` stands for output token `done + j`.
fn force(opts: &MtpOptions, drafts: Vec<u32>, done: usize, vocab: usize) -> Vec<u32> {
    let Some(f) = &opts.forced else {
        return drafts;
    };
    drafts
        .iter()
        .enumerate()
        .map(|(j, &own)| match f.reference.get(done + j) {
            Some(&r) if j < f.correct => r,
            Some(&r) => (r + 1) % vocab as u32,
            None => own,
        })
        .collect()
}

fn first_token(logits: &Tensor) -> Result<u32> {
    all_finite_somewhere(logits)?;
    Ok(ops::argmax(logits)?[0])
}

/// Refuses logits rows with no finite value (the model diverged; see `generate`).
fn all_finite_somewhere(logits: &Tensor) -> Result<()> {
    let host = logits.to_device(kernels::Device::Cpu)?.to_f32()?;
    let v = host.dim(-1);
    if let Some(r) = host
        .f32s()?
        .chunks(v)
        .position(|row| !row.iter().any(|x| x.is_finite()))
    {
        bail!("the logits of row {r} are all NaN or infinite: the checkpoint's weights or config values make the model diverge");
    }
    Ok(())
}

/// Records `t` unless it is a stop token; false when generation ends with it.
fn emit(
    out: &mut Decoded,
    t: u32,
    row: &Tensor,
    setup: &Setup,
    on_token: &mut dyn FnMut(u32),
) -> bool {
    if setup.stop_ids.contains(&t) {
        out.stopped = true;
        return false;
    }
    out.tokens.push(t);
    if setup.keep_rows {
        out.rows.push(row.clone());
    }
    on_token(t);
    out.tokens.len() < setup.budget
}

fn finish(mut out: Decoded) -> Decoded {
    let st = &mut out.stats;
    if st.drafted > 0 {
        st.acceptance_rate = st.accepted as f64 / st.drafted as f64;
    }
    if st.rounds > 0 {
        st.mean_accepted_length = st.accepted as f64 / st.rounds as f64;
        for p in &mut st.per_position_acceptance {
            *p /= st.rounds as f64;
        }
    }
    out
}

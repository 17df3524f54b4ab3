//! Speculative decoding with the model's own draft head (Qwen3.5's MTP).
//!
//! Each round the head drafts up to D tokens after the last emitted token `x`; the main model
//! runs `[x, d_1 .. d_D]` in one forward. Greedy: the longest prefix of drafts it agrees with
//! is kept and its own next token (the correction) follows, so the output is the main model's
//! own argmax sequence whatever the drafts are. Sampling: drafts are drawn from the head's
//! distribution and kept by the standard speculative-sampling rule ([`accept_sampled`]), so
//! the tokens follow the main model's distribution exactly.
//!
//! When a draft is rejected the main state returns to the last kept position without running
//! the model again: verification records what each Gated DeltaNet layer was fed
//! (`ModelState::record_steps`), `keep_recorded` rebuilds those layers' states at the kept
//! position from it (the delta rule alone, no matmuls) and trims the KV caches. Where a layer
//! cannot record (tensors on a device) the state rolls back to `x` and the kept tokens are
//! replayed. The head keeps its own KV caches, trimmed the same way after its chained drafts.
//!
//! How deep to draft follows the acceptance seen so far ([`Pace`]): fewer drafts when they
//! are rejected, plain decoding (the head only keeping its cache in step) when even one
//! rarely survives, with probes at growing intervals to notice when it would again.

use anyhow::Result;
use kernels::{ops, Tensor};
use kernels::{run, Settings};

use super::draft_vocab::{DraftVocab, DEFAULT_DRAFT_VOCAB};
use super::sampler::{Dist, Sampler, SamplingParams};
use crate::cache::ModelState;
use crate::models::SelfDrafter;

/// Options of speculative decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtpOptions {
    /// Tokens drafted per round (1..=4).
    pub depth: usize,
    /// Test-only: replace the head's drafts (see [`ForcedDrafts`]).
    pub forced: Option<ForcedDrafts>,
    /// Drafts come from the token ids below this bound and the higher ids the sequence
    /// already holds (see [`super::draft_vocab`]); `None`: from the whole vocabulary.
    pub draft_vocab: Option<usize>,
}

impl MtpOptions {
    /// `depth` drafts a round from the default draft vocabulary.
    pub fn new(depth: usize) -> MtpOptions {
        MtpOptions {
            depth,
            forced: None,
            draft_vocab: Some(DEFAULT_DRAFT_VOCAB),
        }
    }
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
    /// The most tokens drafted per round (`--mtp D`).
    pub depth: usize,
    /// Verification rounds (main-model forwards over drafts).
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// `accepted / drafted`.
    pub acceptance_rate: f64,
    /// Drafts accepted per round.
    pub mean_accepted_length: f64,
    /// For each draft position, the share of the rounds that drafted it in which it was
    /// accepted.
    pub per_position_acceptance: Vec<f64>,
    /// Rounds with a rejection that returned to the last kept position from the states
    /// recorded during verification (no forward run again).
    pub rollbacks: usize,
    /// Rounds with a rejection that rolled back to `x` and replayed the kept tokens (where
    /// the state could not record).
    pub replays: usize,
    /// Tokens decoded without drafts, while acceptance was too low to pay.
    pub plain_steps: usize,
}

/// How many tokens the next round drafts, from the acceptance seen so far. Deterministic
/// (no timings), so a seed gives the same tokens on every run.
///
/// Draft position `j` pays when it is likely to be reached and kept: the estimate `a` of one
/// draft's acceptance (an exponential average over every verified draft, weight
/// [`Pace::WEIGHT`]) gives `a^j`, drafted while it is at least [`Pace::WORTH`]. Below that
/// for the first draft, decoding goes plain and probes with one draft after 2, 4, 8, ..
/// [`Pace::MAX_GAP`] plain steps; a kept probe resumes drafting.
#[derive(Debug, Clone)]
struct Pace {
    max: usize,
    accept: f64,
    /// Plain steps before the next probe.
    skip: usize,
    /// The gap after the next failed probe.
    gap: usize,
}

impl Pace {
    /// The weight of the newest verified draft in the acceptance estimate.
    const WEIGHT: f64 = 0.5;
    /// The least chance of being reached and kept for which a draft position is drafted.
    /// An extra draft costs a head forward (its layer and the draft vocabulary's rows of the
    /// LM head, about 7% of a plain step's weights on the bench widths) and a verification
    /// row (up to half a plain step where the multi-row products are compute-bound, as on
    /// AVX2), against a token it gains with that chance.
    const WORTH: f64 = 0.5;
    /// The first and the longest run of plain steps between probes.
    const MIN_GAP: usize = 2;
    const MAX_GAP: usize = 32;

    fn new(max: usize) -> Pace {
        Pace {
            max,
            accept: 1.0,
            skip: 0,
            gap: Self::MIN_GAP,
        }
    }

    /// The depth of the next round, or `None` for a plain step.
    fn next(&mut self) -> Option<usize> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        let mut depth = 1;
        while depth < self.max && self.accept.powi(depth as i32 + 1) >= Self::WORTH {
            depth += 1;
        }
        Some(depth)
    }

    /// Takes a round's outcome: `kept` of `drafted` drafts accepted.
    fn verified(&mut self, drafted: usize, kept: usize) {
        for ok in (0..kept)
            .map(|_| true)
            .chain((kept < drafted).then_some(false))
        {
            self.accept = (1.0 - Self::WEIGHT) * self.accept + Self::WEIGHT * f64::from(ok);
        }
        if kept > 0 {
            self.gap = Self::MIN_GAP;
        } else if self.accept < Self::WORTH {
            self.skip = self.gap;
            self.gap = (2 * self.gap).min(Self::MAX_GAP);
        }
    }
}

/// What speculative decoding produced: the first token (from prefill) and everything after it.
pub(crate) struct Decoded {
    pub tokens: Vec<u32>,
    /// It ended on a stop token (else on the budget).
    pub stopped: bool,
    pub stats: MtpStats,
    /// Seconds from `Setup::start` to the first token's logits.
    pub ttft: f64,
}

/// Everything a round needs besides the model and the state.
pub(crate) struct Setup<'a> {
    pub budget: usize,
    pub stop_ids: &'a [u32],
    /// Whether the caller reads each token's own logits row (for log-probs): a verification's
    /// rows are then cut apart for it.
    pub keep_rows: bool,
    pub prefill_step: usize,
    pub vocab: usize,
    /// Greedy at temperature 0, else speculative sampling.
    pub sampling: SamplingParams,
    /// When the prompt entered the engine (TTFT is measured from it).
    pub start: std::time::Instant,
    /// Where the model's weights live (forwards on the CPU run on its thread pool).
    pub device: kernels::Device,
    /// How the kernels compute (the sequence's settings, for the draft head too).
    pub kernels: Settings,
}

/// Where a [`Speculator`] stands between rounds.
enum Phase {
    /// Prefilled: the prompt's last logits and hidden row wait for the first token.
    First {
        logits: Tensor,
        hidden: Tensor,
    },
    /// `x`, the last emitted token, is not fed yet; the head's output row for the token after
    /// it (`head`: its LM head gives the first draft, and the next drafts chain on it) waits
    /// for the next round. Its logits are computed only when a round drafts.
    Next {
        x: u32,
        head: Tensor,
    },
    Done,
}

/// One sequence's speculative decoding as a state machine, so that a caller can interleave it
/// with other work at token boundaries (the batch scheduler): [`Speculator::start`]
/// prefills, each [`Speculator::round`] emits the next one or more tokens (a plain step, or a
/// drafting round and its verification), [`Speculator::finish`] gives the result.
pub(crate) struct Speculator {
    opts: MtpOptions,
    draft_state: ModelState,
    sampler: Option<Sampler>,
    pace: Pace,
    /// For each draft position, the rounds that drafted it.
    reached: Vec<usize>,
    /// The next round's depth when [`Speculator::plain_next`] has asked [`Pace`] already
    /// (`Some(None)`: a plain step).
    decided: Option<Option<usize>>,
    vocab: DraftVocab,
    phase: Phase,
    out: Decoded,
}

/// The speculative loop from an empty `state` (greedy, or sampled by [`accept_sampled`]);
/// `on_token` sees every emitted token with the logits row it came from.
pub(crate) fn decode(
    drafter: &dyn SelfDrafter,
    state: &mut ModelState,
    prompt: &[u32],
    opts: &MtpOptions,
    setup: Setup,
    on_token: &mut dyn FnMut(u32, &Tensor),
) -> Result<Decoded> {
    let mut s = Speculator::start(drafter, state, prompt, opts, &setup)?;
    while s.round(drafter, state, &setup, on_token)? {}
    Ok(s.finish())
}

impl Speculator {
    /// Prefills `prompt` into the empty `state`, feeding the head each piece's pairs (token at
    /// t + 1, hidden at t) as soon as the token at t + 1 is known; the last pair waits for the
    /// first generated token, which the first round picks.
    pub fn start(
        drafter: &dyn SelfDrafter,
        state: &mut ModelState,
        prompt: &[u32],
        opts: &MtpOptions,
        setup: &Setup,
    ) -> Result<Speculator> {
        // `generate::validate` checked the depth (1..=4) and that the model has a head.
        let d = opts.depth;
        let mut draft_state = drafter.new_draft_state();
        draft_state.gdn_path = state.gdn_path;
        let mut logits = None;
        let mut last_hidden = None;
        let mut at = 0;
        for piece in prompt.chunks(setup.prefill_step.max(1)) {
            let (l, h) = run(setup.device, setup.kernels, || {
                drafter.forward_hidden(piece, state, false)
            })?;
            let end = at + piece.len();
            let next = &prompt[at + 1..end.min(prompt.len() - 1) + 1];
            let known = next.len().min(piece.len());
            if known > 0 {
                let rows = h.narrow0(0, known)?;
                draft(setup, drafter, (&next[..known], &rows), &mut draft_state)?;
            }
            last_hidden = Some(h.narrow0(h.dim(0) - 1, 1)?);
            logits = Some(l);
            at = end;
        }
        let (Some(logits), Some(hidden)) = (logits, last_hidden) else {
            anyhow::bail!("speculative decoding needs a non-empty prompt");
        };
        Ok(Speculator {
            opts: opts.clone(),
            draft_state,
            // Sampling draws in the order plain decoding does for the first token, so a
            // seed's first token is the same with and without MTP.
            sampler: (setup.sampling.temperature > 0.0).then(|| Sampler::new(setup.sampling)),
            pace: Pace::new(d),
            reached: vec![0; d],
            decided: None,
            vocab: DraftVocab::new(opts.draft_vocab, setup.vocab, prompt),
            phase: Phase::First { logits, hidden },
            out: Decoded {
                tokens: Vec::new(),
                stopped: false,
                ttft: setup.start.elapsed().as_secs_f64(),
                stats: MtpStats {
                    depth: d,
                    per_position_acceptance: vec![0.0; d],
                    ..MtpStats::default()
                },
            },
        })
    }

    /// Whether the last round ended on a stop token.
    pub fn stopped(&self) -> bool {
        self.out.stopped
    }

    /// The next one or more tokens, each passed to `on_token` with its logits row. False when
    /// the sequence has ended (a stop token, or the budget reached).
    pub fn round(
        &mut self,
        drafter: &dyn SelfDrafter,
        state: &mut ModelState,
        setup: &Setup,
        on_token: &mut dyn FnMut(u32, &Tensor),
    ) -> Result<bool> {
        let next = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Done => return Ok(false),
            // The first token comes from the prompt's logits, as a plain step's from its
            // forward's (not counted as one).
            Phase::First { logits, hidden } => {
                self.take(drafter, state, setup, on_token, (logits, hidden))?
            }
            Phase::Next { x, head } => {
                if self.out.tokens.len() >= setup.budget {
                    None
                } else {
                    match self.decided.take().unwrap_or_else(|| self.pace.next()) {
                        None => {
                            let rows = run(setup.device, setup.kernels, || {
                                drafter.forward_hidden(&[x], state, false)
                            })?;
                            self.plain(drafter, state, setup, on_token, rows)?
                        }
                        Some(depth) => {
                            self.verify(drafter, state, setup, on_token, (x, depth), &head)?
                        }
                    }
                }
            }
        };
        match next {
            Some((x, head)) => {
                self.phase = Phase::Next { x, head };
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// When the next round is a plain step (as [`Pace`] decides from this sequence's own
    /// acceptance, so the tokens do not depend on what runs beside it), the token its forward
    /// feeds: the caller runs that forward (in a batch, [`SelfDrafter::decode_batch_hidden`])
    /// and passes its rows to [`Speculator::plain_rows`]. `None`: the next round runs whole in
    /// [`Speculator::round`].
    pub fn plain_next(&mut self, budget: usize) -> Option<u32> {
        let x = self.unfed(budget)?;
        let depth = *self.decided.get_or_insert_with(|| self.pace.next());
        depth.is_none().then_some(x)
    }

    /// For a greedy sequence, turns the next round into a plain step even where [`Pace`]
    /// would draft (the head still takes its pair, so drafting can resume at any later round)
    /// and gives the token its forward feeds, as [`Speculator::plain_next`] does. For greedy
    /// sequences in a batch, whose drafting rounds would read the weights on their own:
    /// greedy tokens are the same either way (the MTP figures follow the rounds run). `None`
    /// for a sampled sequence, whose draws depend on which rounds run.
    pub fn defer_to_batch(&mut self, budget: usize) -> Option<u32> {
        if self.sampler.is_some() {
            return None;
        }
        let x = self.unfed(budget)?;
        self.decided = Some(None);
        Some(x)
    }

    /// The token the next round feeds (the last emitted one), while the sequence runs and
    /// has budget left.
    fn unfed(&self, budget: usize) -> Option<u32> {
        match self.phase {
            Phase::Next { x, .. } if self.out.tokens.len() < budget => Some(x),
            _ => None,
        }
    }

    /// The plain step [`Speculator::plain_next`] announced, from the logits and hidden row of
    /// its forward; false when the sequence has ended.
    pub fn plain_rows(
        &mut self,
        drafter: &dyn SelfDrafter,
        state: &ModelState,
        setup: &Setup,
        on_token: &mut dyn FnMut(u32, &Tensor),
        rows: (Tensor, Tensor),
    ) -> Result<bool> {
        let (Some(None), Phase::Next { .. }) = (
            self.decided.take(),
            std::mem::replace(&mut self.phase, Phase::Done),
        ) else {
            anyhow::bail!("internal: a plain step's rows without a plain step announced");
        };
        Ok(match self.plain(drafter, state, setup, on_token, rows)? {
            Some((x, head)) => {
                self.phase = Phase::Next { x, head };
                true
            }
            None => false,
        })
    }

    /// The result, with the acceptance rates.
    pub fn finish(self) -> Decoded {
        finish(self.out, &self.reached)
    }

    fn pick(&mut self, logits: &Tensor) -> Result<u32> {
        Ok(match self.sampler.as_mut() {
            Some(s) => s.sample(logits)?,
            None => ops::argmax(logits)?[0],
        })
    }

    /// A plain step from its forward's logits and hidden row (see [`Speculator::take`]).
    fn plain(
        &mut self,
        drafter: &dyn SelfDrafter,
        state: &ModelState,
        setup: &Setup,
        on_token: &mut dyn FnMut(u32, &Tensor),
        rows: (Tensor, Tensor),
    ) -> Result<Option<(u32, Tensor)>> {
        self.out.stats.plain_steps += 1;
        self.take(drafter, state, setup, on_token, rows)
    }

    /// The token after a one-token forward, from its logits; the head then takes its pair
    /// (that token, the forward's hidden row) so its cache stays in step, its LM head waiting
    /// for a round that drafts. Returns the next phase's `x` and head row, or `None` at the
    /// end.
    fn take(
        &mut self,
        drafter: &dyn SelfDrafter,
        state: &ModelState,
        setup: &Setup,
        on_token: &mut dyn FnMut(u32, &Tensor),
        (logits, h): (Tensor, Tensor),
    ) -> Result<Option<(u32, Tensor)>> {
        super::check_finite(&logits, state.pos)?;
        let t = self.pick(&logits)?;
        if !emit(&mut self.out, t, &logits, setup, on_token) {
            return Ok(None);
        }
        let head = draft(setup, drafter, (&[t], &h), &mut self.draft_state)?;
        Ok(Some((t, head)))
    }

    /// A drafting round: up to `depth` drafts, one verification forward over `[x, drafts]`,
    /// the agreeing drafts and the model's own next token emitted, the state back at the last
    /// kept position.
    fn verify(
        &mut self,
        drafter: &dyn SelfDrafter,
        state: &mut ModelState,
        setup: &Setup,
        on_token: &mut dyn FnMut(u32, &Tensor),
        (x, depth): (u32, usize),
        head: &Tensor,
    ) -> Result<Option<(u32, Tensor)>> {
        // No draft past the budget: the last token of a round is the main model's own.
        let left = setup.budget - self.out.tokens.len();
        let depth = depth.min(left.saturating_sub(1)).max(1);
        self.vocab.take(&self.out.tokens);
        let (drafts, dists) = draft_round(
            setup,
            drafter,
            &mut self.draft_state,
            (depth, &self.vocab),
            head,
            self.sampler.as_mut(),
        )?;
        let (drafts, dists) = force(
            &self.opts,
            (drafts, dists),
            self.out.tokens.len(),
            setup.vocab,
        );

        let before = state.mark();
        state.record_steps();
        let mut ids = Vec::with_capacity(depth + 1);
        ids.push(x);
        ids.extend(&drafts);
        let (verify, mut hidden) = run(setup.device, setup.kernels, || {
            drafter.forward_hidden(&ids, state, true)
        })?;
        super::check_finite(&verify, state.pos)?;
        let (kept, correction) = match self.sampler.as_mut() {
            None => {
                let best = ops::argmax(&verify)?;
                let kept = drafts.iter().zip(&best).take_while(|(a, b)| a == b).count();
                (kept, best[kept])
            }
            Some(s) => accept_sampled(s, &verify, &drafts, &dists)?,
        };
        self.pace.verified(depth, kept);
        let st = &mut self.out.stats;
        st.rounds += 1;
        st.drafted += depth;
        st.accepted += kept;
        for r in self.reached.iter_mut().take(depth) {
            *r += 1;
        }
        for p in st.per_position_acceptance.iter_mut().take(kept) {
            *p += 1.0;
        }
        // Back to the last kept position: from the recorded states, or (where a layer could
        // not record) to `x` and the kept tokens again. With every draft kept the state
        // already stands there.
        if !state.keep_recorded(&before, kept + 1)? && kept < depth {
            state.rollback(&before)?;
            let (_, h) = run(setup.device, setup.kernels, || {
                drafter.forward_hidden(&ids[..kept + 1], state, false)
            })?;
            hidden = h;
            self.out.stats.replays += 1;
        } else if kept < depth {
            self.out.stats.rollbacks += 1;
        }
        for (i, &t) in drafts[..kept].iter().chain([&correction]).enumerate() {
            let row = if setup.keep_rows {
                verify.narrow0(i, 1)?
            } else {
                verify.clone()
            };
            if !emit(&mut self.out, t, &row, setup, on_token) {
                return Ok(None);
            }
        }
        // The head's pairs for the positions the main model just settled: (token at t + 1,
        // hidden at t) for t = pos(x) ..= pos(x) + kept.
        let mut next = drafts[..kept].to_vec();
        next.push(correction);
        let rows = hidden.narrow0(0, kept + 1)?;
        let h = draft(setup, drafter, (&next, &rows), &mut self.draft_state)?;
        Ok(Some((correction, h.narrow0(kept, 1)?)))
    }
}

/// One run of the draft head (see [`SelfDrafter::draft`]) with the sequence's kernel settings.
fn draft(
    setup: &Setup,
    drafter: &dyn SelfDrafter,
    (ids, hidden): (&[u32], &Tensor),
    state: &mut ModelState,
) -> Result<Tensor> {
    run(setup.device, setup.kernels, || {
        drafter.draft(ids, hidden, state)
    })
}

/// The head's `depth` drafts from its output row `head` (its LM head over `vocab` gives the
/// first), chained on its own hidden states: its argmax when greedy, else drawn from its
/// distribution (returned beside, for the acceptance test). Its state is left where it was
/// (the chained steps are scratch).
fn draft_round(
    setup: &Setup,
    drafter: &dyn SelfDrafter,
    state: &mut ModelState,
    (depth, vocab): (usize, &DraftVocab),
    head: &Tensor,
    mut sampler: Option<&mut Sampler>,
) -> Result<(Vec<u32>, Vec<Dist>)> {
    let mark = state.mark();
    let (mut drafts, mut dists) = (Vec::with_capacity(depth), Vec::new());
    let mut h = head.clone();
    loop {
        let logits = run(setup.device, setup.kernels, || {
            drafter.draft_logits(&h, vocab.first(), vocab.extra())
        })?;
        let (next, dist) = vocab.pick(&logits, sampler.as_deref_mut())?;
        drafts.push(next);
        dists.extend(dist);
        if drafts.len() == depth {
            break;
        }
        h = draft(setup, drafter, (&[next], &h), state)?;
    }
    state.rollback(&mark)?;
    Ok((drafts, dists))
}

/// The standard speculative-sampling rule: draft `d_j`, drawn from `q_j`, is kept with
/// probability `min(1, p_j(d_j) / q_j(d_j))`, `p_j` the model's distribution at that place;
/// at the first rejection the next token is drawn from `max(0, p_j − q_j)` renormalised, and
/// when every draft is kept, from the model's next distribution. The tokens then follow the
/// model's own distribution exactly. Returns (kept drafts, next token).
fn accept_sampled(
    s: &mut Sampler,
    verify: &Tensor,
    drafts: &[u32],
    dists: &[Dist],
) -> Result<(usize, u32)> {
    for (j, (&d, q)) in drafts.iter().zip(dists).enumerate() {
        let p = s.distribution(&verify.narrow0(j, 1)?)?;
        let (pd, qd) = (p.prob(d), q.prob(d));
        if s.uniform() * qd < pd {
            continue;
        }
        // `pd < qd` here, so the residual has mass.
        let r = p.residual(q).unwrap_or(p);
        return Ok((j, s.draw(&r)));
    }
    let last = s.distribution(&verify.narrow0(drafts.len(), 1)?)?;
    Ok((drafts.len(), s.draw(&last)))
}

/// Forced drafts replace the head's (tests only; see [`ForcedDrafts`]). `done` is how many
/// tokens were emitted, so draft `j` stands for output token `done + j`. When sampling, a
/// forced draft's distribution is all on it.
fn force(
    opts: &MtpOptions,
    (drafts, dists): (Vec<u32>, Vec<Dist>),
    done: usize,
    vocab: usize,
) -> (Vec<u32>, Vec<Dist>) {
    let Some(f) = &opts.forced else {
        return (drafts, dists);
    };
    let forced: Vec<u32> = drafts
        .iter()
        .enumerate()
        .map(|(j, &own)| match f.reference.get(done + j) {
            Some(&r) if j < f.correct => r,
            Some(&r) => (r + 1) % vocab as u32,
            None => own,
        })
        .collect();
    let dists = if dists.is_empty() {
        dists
    } else {
        forced.iter().map(|&t| Dist::point(t)).collect()
    };
    (forced, dists)
}

/// Records `t` unless it is a stop token; false when generation ends with it.
fn emit(
    out: &mut Decoded,
    t: u32,
    row: &Tensor,
    setup: &Setup,
    on_token: &mut dyn FnMut(u32, &Tensor),
) -> bool {
    if setup.stop_ids.contains(&t) {
        out.stopped = true;
        return false;
    }
    out.tokens.push(t);
    on_token(t, row);
    out.tokens.len() < setup.budget
}

/// The stats' rates; `reached[j]`: rounds that drafted position `j`.
fn finish(mut out: Decoded, reached: &[usize]) -> Decoded {
    let st = &mut out.stats;
    if st.drafted > 0 {
        st.acceptance_rate = st.accepted as f64 / st.drafted as f64;
    }
    if st.rounds > 0 {
        st.mean_accepted_length = st.accepted as f64 / st.rounds as f64;
    }
    for (p, &n) in st.per_position_acceptance.iter_mut().zip(reached) {
        if n > 0 {
            *p /= n as f64;
        }
    }
    out
}

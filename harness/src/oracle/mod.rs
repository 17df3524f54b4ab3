//! Comparing the engine with stored outputs of an independent implementation (mlx-lm), the
//! way vLLM compares against Hugging Face: walk the greedy tokens; at the first mismatch each
//! side's token must be in the other side's top-5, then stop. Both sides compute in f32, so the
//! top-1 log-probs of the matched steps must also agree closely ([`DEFAULT_LOGPROB_TOL`]).
//!
//! [`check`] runs every stored reference ([`cases::sources`]): folders mlx-lm wrote itself and
//! synthetic checkpoints in both name layouts. A synthetic reference records its checkpoint's
//! hash, so a reference made from other bytes is reported as stale ("checkpoint changed,
//! regenerate"), not as a numerics failure.

pub mod cases;
pub mod cli;

use kernels::numerics::Numerics;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use engine::layers::gated_delta::GdnPath;
use engine::{generate, Backend, Pipeline, RequestOptions};
use serde::{Deserialize, Serialize};

use crate::golden::checkpoint_sha256;
use cases::Source;

/// How deep into the other side's ranking a divergent token may sit.
pub const TOP_N_AT_MISMATCH: usize = 5;

/// The largest |top-1 log-prob difference| over matched steps that still passes. f32 against
/// f32 with different summation orders differs by ~1e-5; a rounding difference in the weights
/// (e.g. a norm weight rounded to bf16) shows up as ~1e-2.
pub const DEFAULT_LOGPROB_TOL: f32 = 1e-3;

/// A reference file as `harness/oracle/reference.py` writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct Reference {
    pub model: String,
    /// The synthetic spec the checkpoint was made from (synthetic references only).
    #[serde(default)]
    pub synth: Option<String>,
    /// [`checkpoint_sha256`] of the folder the reference was made from (synthetic references).
    #[serde(default)]
    pub checkpoint_sha256: Option<String>,
    #[serde(default)]
    pub reference: RefInfo,
    pub cases: Vec<RefCase>,
}

/// How the reference was made (only what the check needs).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RefInfo {
    /// Present when the model has Gated DeltaNet layers: which recurrence mlx-lm ran.
    #[serde(default)]
    pub gdn_path: Option<String>,
    /// What made a real-checkpoint reference (ci/real/reference.py): `transformers`,
    /// `mlx-lm` (f32) or `mlx-lm-native`.
    #[serde(default)]
    pub tool: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RefCase {
    /// The prompt's text, where the reference tokenized it itself (real checkpoints): the
    /// engine's tokenizer (and chat template, for chat cases) must give `prompt_ids` from it.
    #[serde(default)]
    pub prompt: Option<String>,
    pub prompt_ids: Vec<u32>,
    #[serde(default)]
    pub chat_user_message: Option<String>,
    pub tokens: Vec<u32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

impl RefCase {
    /// `p300` for an id prompt of 300 tokens, `chat21` for a chat prompt of 21.
    pub fn label(&self) -> String {
        let kind = if self.chat_user_message.is_some() {
            "chat"
        } else {
            "p"
        };
        format!("{kind}{}", self.prompt_ids.len())
    }
}

impl Reference {
    /// Reads and checks a reference file (every step has a non-empty top list).
    pub fn read(path: &Path) -> Result<Reference> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: Reference =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        for (i, c) in r.cases.iter().enumerate() {
            if c.prompt_ids.is_empty()
                || c.top_logprobs.len() != c.tokens.len()
                || c.top_logprobs.iter().any(|t| t.is_empty())
            {
                bail!(
                    "{}: case {i} is malformed (empty prompt, or not one non-empty top_logprobs list per token); regenerate it with bash harness/oracle/regenerate_all.sh",
                    path.display()
                );
            }
        }
        Ok(r)
    }

    /// Whether the model has Gated DeltaNet layers (reference.py says which recurrence ran).
    pub fn has_gdn(&self) -> bool {
        self.reference.gdn_path.is_some()
    }
}

/// The first step where the two sides chose different tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    pub step: usize,
    pub engine_token: u32,
    pub reference_token: u32,
    /// Where the engine's token sits in the reference's top list (0 = best), if it is there.
    pub engine_token_rank_in_reference: Option<usize>,
    /// Where the reference's token sits in the engine's top list, if it is there.
    pub reference_token_rank_in_engine: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseVerdict {
    pub prompt_tokens: usize,
    /// Steps where both sides chose the same token, before any mismatch.
    pub matched: usize,
    pub steps: usize,
    pub mismatch: Option<Mismatch>,
    /// Largest |top-1 logprob difference| over the matched steps.
    pub max_logprob_diff: f32,
    /// Largest |logprob difference| over the reference's top-5 ids at the matched steps. An
    /// id missing from our list counts as far as our last listed log-prob (a lower bound).
    pub max_top5_logprob_diff: f32,
    /// Every step matched and every step's whole top list (ids and f32 log-probs, as many
    /// entries as the shorter list holds) is equal bit for bit.
    pub bit_identical: bool,
    /// The top-5 rule: no mismatch, or each side's token in the other's top-5 at the first one
    /// (and both sides made the same number of steps).
    pub pass: bool,
}

impl CaseVerdict {
    /// The top-5 rule and the log-prob tolerance together.
    pub fn passes(&self, logprob_tol: f32) -> bool {
        self.pass && self.max_logprob_diff <= logprob_tol
    }
}

fn top_at(tops: &[Vec<(u32, f32)>], i: usize) -> &[(u32, f32)] {
    tops.get(i).map_or(&[], |t| &t[..])
}

fn rank(top: &[(u32, f32)], tok: u32) -> Option<usize> {
    top.iter().position(|&(t, _)| t == tok)
}

/// `max(a, b)`, where a NaN `b` counts as infinite (NaN must not hide behind `max`).
fn nan_safe_max(a: f32, b: f32) -> f32 {
    if b.is_nan() {
        f32::INFINITY
    } else {
        a.max(b)
    }
}

/// The largest |logprob difference| over `theirs`' first five ids at one step. An id not in
/// `ours` sits at or below our last listed log-prob, so it counts at least that far off.
fn top5_diff(ours: &[(u32, f32)], theirs: &[(u32, f32)]) -> f32 {
    let Some(&(_, floor)) = ours.last() else {
        return f32::INFINITY;
    };
    theirs
        .iter()
        .take(5)
        .map(|&(id, lp)| match ours.iter().find(|o| o.0 == id) {
            Some(o) => (o.1 - lp).abs(),
            None => (lp - floor).max(0.0),
        })
        .fold(0.0, nan_safe_max)
}

/// Compares one side's greedy run with the other's. Each `top` list is best first; a step
/// with an empty list counts as a mismatch of its log-prob (infinite difference).
pub fn compare(
    ours: &[u32],
    our_top: &[Vec<(u32, f32)>],
    theirs: &[u32],
    their_top: &[Vec<(u32, f32)>],
) -> CaseVerdict {
    let steps = ours.len().min(theirs.len());
    let mut max_diff = 0.0f32;
    let mut max_top5 = 0.0f32;
    let mut identical = ours.len() == theirs.len();
    for i in 0..steps {
        let (ot, tt) = (top_at(our_top, i), top_at(their_top, i));
        let n = ot.len().min(tt.len());
        identical &= n > 0
            && ot[..n]
                .iter()
                .zip(&tt[..n])
                .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
        if ours[i] != theirs[i] {
            let m = Mismatch {
                step: i,
                engine_token: ours[i],
                reference_token: theirs[i],
                engine_token_rank_in_reference: rank(tt, ours[i]),
                reference_token_rank_in_engine: rank(ot, theirs[i]),
            };
            let within = |r: Option<usize>| r.is_some_and(|r| r < TOP_N_AT_MISMATCH);
            let pass = within(m.engine_token_rank_in_reference)
                && within(m.reference_token_rank_in_engine);
            return CaseVerdict {
                prompt_tokens: 0,
                matched: i,
                steps,
                mismatch: Some(m),
                max_logprob_diff: max_diff,
                max_top5_logprob_diff: max_top5,
                bit_identical: false,
                pass,
            };
        }
        let diff = match (ot.first(), tt.first()) {
            (Some(a), Some(b)) => (a.1 - b.1).abs(),
            _ => f32::INFINITY,
        };
        max_diff = nan_safe_max(max_diff, diff);
        max_top5 = nan_safe_max(max_top5, top5_diff(ot, tt));
    }
    CaseVerdict {
        prompt_tokens: 0,
        matched: steps,
        steps,
        mismatch: None,
        max_logprob_diff: max_diff,
        max_top5_logprob_diff: max_top5,
        bit_identical: identical,
        pass: ours.len() == theirs.len(),
    }
}

/// Runs one case greedily (stop tokens ignored, as the reference does) and compares.
fn run_case(
    p: &Pipeline,
    case: &RefCase,
    gdn: Option<GdnPath>,
    numerics: Numerics,
) -> Result<CaseVerdict> {
    let vocab = p.model.info().vocab_size;
    if let Some(&bad) = case.prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("prompt id {bad} is outside the model's vocabulary ({vocab})");
    }
    let opts = RequestOptions {
        max_tokens: Some(case.tokens.len()),
        temperature: Some(0.0),
        top_logprobs: 8,
        ignore_eos: true,
        gdn_path: gdn,
        kernels: kernels::Settings::with_numerics(numerics),
        ..Default::default()
    };
    // The engine's own loop: it computes the top log-probs on the model's device (on MLX as
    // mlx-lm does, `logits − logsumexp(logits)`), so dense Qwen3 cases match bit for bit.
    // mlx-lm prefills `prompt[:-1]` and runs the last prompt token as its own step; mirroring
    // that was measured to change nothing for dense Qwen3 (MLX's CPU matmul rounds a row the
    // same whatever the row count), so the engine's one-forward prefill is kept.
    let req = p.request(case.prompt_ids.clone(), &opts);
    let out = generate::generate(p.model.as_ref(), &req, |_| {})?;
    let top = out.top_logprobs.unwrap_or_default();
    let mut v = compare(&out.tokens, &top, &case.tokens, &case.top_logprobs);
    v.prompt_tokens = case.prompt_ids.len();
    Ok(v)
}

/// Runs the engine greedily on every case of a reference file against the model in `dir` on
/// `backend`, with the Gated DeltaNet path `gdn` (auto when `None`).
pub fn check_reference(
    dir: &Path,
    reference: &Path,
    backend: Backend,
    gdn: Option<GdnPath>,
) -> Result<Vec<CaseVerdict>> {
    let r = Reference::read(reference)?;
    let p = Pipeline::load_on(dir, backend)?;
    check_cases(&p, &r, gdn, Numerics::Exact)
}

/// [`check_reference`] on a loaded pipeline, with the CPU kernels' `numerics`.
pub fn check_cases(
    p: &Pipeline,
    r: &Reference,
    gdn: Option<GdnPath>,
    numerics: Numerics,
) -> Result<Vec<CaseVerdict>> {
    r.cases
        .iter()
        .map(|case| run_case(p, case, gdn, numerics))
        .collect()
}

/// What to check.
#[derive(Debug, Clone)]
pub struct Options {
    /// The workspace root (holds `goldens/oracle` and the mlx-written fixtures).
    pub root: PathBuf,
    /// A substring of case ids (`SOURCE/PATH/PROMPT`); `None` = every case.
    pub filter: Option<String>,
    /// The backend the engine runs on.
    pub backend: Backend,
    /// One Gated DeltaNet path for every case; `None` = per step and chunked for models with
    /// Gated DeltaNet layers (the default path for the others).
    pub gdn: Option<GdnPath>,
    /// The CPU kernels' arithmetic (`fast` is held to the same greedy-walk rule and
    /// log-prob tolerance as `exact`).
    pub numerics: Numerics,
    pub logprob_tol: f32,
    /// Check against mlx-lm run in the folders' stored dtypes (`goldens/oracle/
    /// mlx-written-native`) instead of the f32 references: for MLX's native path.
    pub native_references: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            root: synth::workspace_root(),
            filter: None,
            backend: Backend::Cpu,
            gdn: None,
            numerics: Numerics::Exact,
            logprob_tol: DEFAULT_LOGPROB_TOL,
            native_references: false,
        }
    }
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Compared(CaseVerdict),
    /// The synthetic checkpoint is not the one the reference was made from.
    CheckpointChanged {
        reference: String,
        now: String,
    },
    /// No reference file for this source.
    Missing,
    /// The case could not run (or its reference could not be read).
    Error(String),
}

/// One case's outcome, with the file it was checked against.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// `SOURCE/PATH/PROMPT`, e.g. `synth/qwen3_5:tiny:q4:mlx/gdn=chunked/p300`.
    pub id: String,
    pub file: PathBuf,
    pub outcome: Outcome,
}

impl CaseResult {
    pub fn passed(&self, logprob_tol: f32) -> bool {
        matches!(&self.outcome, Outcome::Compared(v) if v.passes(logprob_tol))
    }

    /// The short word of the result line.
    pub fn label(&self, logprob_tol: f32) -> &'static str {
        match &self.outcome {
            Outcome::Compared(v) if v.passes(logprob_tol) => "ok",
            Outcome::Compared(_) => "FAIL",
            Outcome::CheckpointChanged { .. } => "STALE",
            Outcome::Missing => "MISSING",
            Outcome::Error(_) => "ERROR",
        }
    }

    /// What the result line says after the label.
    pub fn detail(&self, logprob_tol: f32) -> String {
        match &self.outcome {
            Outcome::Compared(v) => {
                let mut s = format!(
                    "{:>2}/{} max|Δ top-1 logprob| {:.1e}",
                    v.matched, v.steps, v.max_logprob_diff
                );
                if let Some(m) = &v.mismatch {
                    let r =
                        |r: Option<usize>| r.map_or(">8".to_string(), |r| format!("#{}", r + 1));
                    s.push_str(&format!(
                        "; step {}: engine {} (mlx-lm's {}), mlx-lm {} (engine's {})",
                        m.step,
                        m.engine_token,
                        r(m.engine_token_rank_in_reference),
                        m.reference_token,
                        r(m.reference_token_rank_in_engine)
                    ));
                    if !v.pass {
                        s.push_str(&format!(": outside the top-{TOP_N_AT_MISMATCH}"));
                    }
                } else if !v.pass {
                    s.push_str("; the two sides made a different number of steps");
                }
                if v.max_logprob_diff > logprob_tol {
                    s.push_str(&format!("; log-prob difference above {logprob_tol:.0e}"));
                }
                if v.bit_identical {
                    s.push_str("; every top-8 log-prob bit-identical");
                }
                s
            }
            Outcome::CheckpointChanged { reference, now } => format!(
                "checkpoint changed, regenerate (sha256 {} in the reference, {} now)",
                &reference[..reference.len().min(12)],
                &now[..now.len().min(12)]
            ),
            Outcome::Missing => "no reference file".to_string(),
            Outcome::Error(e) => e.clone(),
        }
    }
}

/// The summary of a check.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub results: Vec<CaseResult>,
    /// Reference files no source owns.
    pub orphans: Vec<PathBuf>,
    pub logprob_tol: f32,
}

impl CheckReport {
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.results.iter().filter(|r| !r.passed(self.logprob_tol))
    }

    pub fn all_passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// Failures that mean "the reference is out of date", not "the numerics are wrong".
    pub fn stale(&self) -> usize {
        self.failures()
            .filter(|r| {
                matches!(
                    r.outcome,
                    Outcome::CheckpointChanged { .. } | Outcome::Missing
                )
            })
            .count()
    }
}

/// The Gated DeltaNet paths to run a reference on, as (label, path).
fn paths_for(r: &Reference, gdn: Option<GdnPath>) -> Vec<(String, Option<GdnPath>)> {
    match (r.has_gdn(), gdn) {
        (false, _) => vec![("default".to_string(), gdn)],
        (true, Some(g)) => vec![(format!("gdn={}", g.name()), Some(g))],
        (true, None) => [GdnPath::PerStep, GdnPath::Chunked]
            .into_iter()
            .map(|g| (format!("gdn={}", g.name()), Some(g)))
            .collect(),
    }
}

/// Checks one source's reference; each result goes to `progress` and into `out`.
fn check_source(
    opts: &Options,
    source: &Source,
    out: &mut Vec<CaseResult>,
    progress: &mut impl FnMut(&CaseResult),
) {
    let file = source.reference_file(&opts.root);
    let selected = |id: &str| opts.filter.as_deref().is_none_or(|f| id.contains(f));
    let mut emit = |id: String, outcome: Outcome| {
        let r = CaseResult {
            id,
            file: file.clone(),
            outcome,
        };
        progress(&r);
        out.push(r);
    };
    let whole = source.to_string();
    if !file.exists() {
        if selected(&whole) {
            emit(whole, Outcome::Missing);
        }
        return;
    }
    let reference = match Reference::read(&file) {
        Ok(r) => r,
        Err(e) => {
            if selected(&whole) {
                emit(whole, Outcome::Error(format!("{e:#}")));
            }
            return;
        }
    };
    let mut ids = Vec::new();
    for (label, gdn) in paths_for(&reference, opts.gdn) {
        for case in &reference.cases {
            let id = format!("{source}/{label}/{}", case.label());
            if selected(&id) {
                ids.push((id, gdn, case));
            }
        }
    }
    if ids.is_empty() {
        return;
    }
    let loaded = (|| -> Result<Pipeline> {
        let dir = source.folder(&opts.root)?;
        if let Source::Synth(spec) = source {
            if reference.synth.as_deref() != Some(&spec.to_string()) {
                bail!(
                    "{} records synth spec {:?}, expected {spec}; regenerate it",
                    file.display(),
                    reference.synth
                );
            }
        }
        if let Some(want) = &reference.checkpoint_sha256 {
            let now = checkpoint_sha256(&dir)?;
            if &now != want {
                return Err(anyhow::Error::new(Stale {
                    reference: want.clone(),
                    now,
                }));
            }
        }
        Pipeline::load_for(&dir, opts.backend, opts.numerics)
    })();
    match loaded {
        Ok(p) => {
            for (id, gdn, case) in ids {
                let outcome = match run_case(&p, case, gdn, opts.numerics) {
                    Ok(v) => Outcome::Compared(v),
                    Err(e) => Outcome::Error(format!("{e:#}")),
                };
                emit(id, outcome);
            }
        }
        Err(e) => {
            let outcome = match e.downcast_ref::<Stale>() {
                Some(s) => Outcome::CheckpointChanged {
                    reference: s.reference.clone(),
                    now: s.now.clone(),
                },
                None => Outcome::Error(format!("{source}: {e:#}")),
            };
            for (id, _, _) in ids {
                emit(id, outcome.clone());
            }
        }
    }
}

/// A reference made from other checkpoint bytes (carried through `anyhow` to [`check_source`]).
#[derive(Debug)]
struct Stale {
    reference: String,
    now: String,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "checkpoint changed")
    }
}

impl std::error::Error for Stale {}

/// Checks every selected case of every stored reference; `progress` sees each result as soon
/// as it is known. Each checkpoint is loaded once.
pub fn check(opts: &Options, mut progress: impl FnMut(&CaseResult)) -> CheckReport {
    let mut results = Vec::new();
    let sources = if opts.native_references {
        cases::native_sources()
    } else {
        cases::sources()
    };
    for source in sources {
        check_source(opts, &source, &mut results, &mut progress);
    }
    let orphans = if opts.filter.is_none() && !opts.native_references {
        cases::orphans(&opts.root)
    } else {
        Vec::new()
    };
    CheckReport {
        results,
        orphans,
        logprob_tol: opts.logprob_tol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(ids: &[u32]) -> Vec<Vec<(u32, f32)>> {
        vec![ids.iter().map(|&i| (i, -1.0)).collect()]
    }

    #[test]
    fn top5_rule_and_ranks() {
        // Within each other's top-5: a tolerated near-tie.
        let v = compare(&[1], &top(&[1, 2]), &[2], &top(&[2, 1]));
        assert!(v.pass);
        let m = v.mismatch.unwrap();
        assert_eq!(
            (
                m.engine_token_rank_in_reference,
                m.reference_token_rank_in_engine
            ),
            (Some(1), Some(1))
        );
        // The engine's token is sixth in the reference's list: outside the top-5.
        assert!(!compare(&[9], &top(&[9, 2]), &[2], &top(&[2, 3, 4, 5, 6, 9])).pass);
        // Different lengths never pass.
        assert!(
            !compare(
                &[1, 2],
                &[top(&[1])[0].clone(), top(&[2])[0].clone()],
                &[1],
                &top(&[1])
            )
            .pass
        );
    }

    #[test]
    fn bit_identical_needs_every_pair_of_every_step_equal() {
        let a = vec![vec![(3, -0.5), (4, -1.25)], vec![(5, -0.125)]];
        assert!(compare(&[3, 5], &a, &[3, 5], &a).bit_identical);
        // One ulp off in a second-ranked log-prob.
        let mut b = a.clone();
        b[0][1].1 = f32::from_bits(b[0][1].1.to_bits() + 1);
        let v = compare(&[3, 5], &a, &[3, 5], &b);
        assert!(!v.bit_identical && v.max_logprob_diff == 0.0);
        // A different id at the same rank, a missing step, a different length.
        let mut c = a.clone();
        c[0][1].0 = 9;
        assert!(!compare(&[3, 5], &a, &[3, 5], &c).bit_identical);
        assert!(!compare(&[3, 5], &a, &[3, 5], &a[..1]).bit_identical);
        assert!(!compare(&[3], &a, &[3, 5], &a).bit_identical);
    }

    #[test]
    fn logprob_difference_is_over_matched_steps_and_nan_counts_as_infinite() {
        let ours = vec![vec![(3, -0.5)], vec![(4, -0.1)], vec![(5, -0.6), (6, -0.7)]];
        let theirs = vec![
            vec![(3, -0.5001)],
            vec![(4, -0.2)],
            vec![(6, -0.0), (5, -1.0)],
        ];
        let v = compare(&[3, 4, 5], &ours, &[3, 4, 6], &theirs);
        assert!((v.max_logprob_diff - 0.1).abs() < 1e-6, "{v:?}");
        assert_eq!(v.matched, 2);
        assert!(!v.passes(1e-3) && v.passes(0.2));
        let nan = vec![vec![(3, f32::NAN)]];
        assert!(!compare(&[3], &nan, &[3], &top(&[3])).passes(1.0));
    }

    #[test]
    fn top5_difference_covers_the_references_first_five_ids() {
        let theirs = vec![vec![
            (1, -0.1),
            (2, -2.0),
            (3, -3.0),
            (4, -4.0),
            (5, -5.0),
            (6, -6.0),
        ]];
        // Ranks 2-5 in another order, the sixth id far off: only the first five count.
        let ours = vec![vec![(1, -0.1), (3, -3.25), (2, -2.0), (5, -5.0), (4, -4.5)]];
        let v = compare(&[1], &ours, &[1], &theirs);
        assert_eq!((v.max_logprob_diff, v.max_top5_logprob_diff), (0.0, 0.5));
        // The reference's fifth id missing from our list: at least as far as our last entry.
        let short = vec![vec![(1, -0.1), (2, -2.0), (3, -3.0), (4, -4.0), (7, -7.0)]];
        let v = compare(&[1], &short, &[1], &theirs);
        assert_eq!(v.max_top5_logprob_diff, 2.0);
        // Nothing listed on our side: infinitely off.
        let v = compare(&[1], &[vec![]], &[1], &theirs);
        assert_eq!(v.max_top5_logprob_diff, f32::INFINITY);
    }
}

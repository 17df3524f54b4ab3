//! Path parity: the same model run on two paths (e.g. `gdn=perstep` vs `gdn=chunked`, or
//! `backend=cpu` vs `backend=mlx`) over the same prompts at T=0. Per prompt a verdict — `identical`, `late-drift@k` or
//! `EARLY-DIVERGE@k` (k = first differing generated token; early = k < 16) — and the NMSE of
//! the prefill's last-position logits, which shows how far apart the paths are even when the
//! greedy tokens agree.

pub mod cli;

use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use engine::{Pipeline, RequestOptions};
use serde::{Serialize, Serializer};

use crate::backends::Loaded;
use crate::golden::first_divergence;
use crate::paths::PathSpec;

/// A divergence before this many generated tokens fails: two correct paths may drift apart
/// once greedy decoding meets a near-tie, but not within the first few tokens.
pub const EARLY_DIVERGE_TOKENS: usize = 16;

/// Prompt lengths of the built-in set, in tokens: short ones, both sides of the Gated DeltaNet
/// chunk (64) and its automatic threshold, and a few chunks with a ragged tail.
pub const BUILTIN_LENGTHS: &[usize] = &[9, 24, 63, 64, 65, 100, 150, 257];

/// Text the built-in prompts are cut from (the synthetic tokenizer learned its merges from it,
/// so it encodes into ordinary multi-byte tokens).
const BUILTIN_TEXT: &str = synth::tokenizer::CORPUS;

/// Tokens generated per prompt unless asked otherwise; longer than [`EARLY_DIVERGE_TOKENS`] so
/// a late drift can be told from an early divergence.
pub const DEFAULT_MAX_TOKENS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Identical,
    /// First difference at generated token `k ≥ EARLY_DIVERGE_TOKENS`.
    LateDrift(usize),
    /// First difference at generated token `k < EARLY_DIVERGE_TOKENS`.
    EarlyDiverge(usize),
}

impl Verdict {
    pub fn is_early(self) -> bool {
        matches!(self, Verdict::EarlyDiverge(_))
    }

    /// The first differing token, if any.
    pub fn first_diff(self) -> Option<usize> {
        match self {
            Verdict::Identical => None,
            Verdict::LateDrift(k) | Verdict::EarlyDiverge(k) => Some(k),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Identical => write!(f, "identical"),
            Verdict::LateDrift(k) => write!(f, "late-drift@{k}"),
            Verdict::EarlyDiverge(k) => write!(f, "EARLY-DIVERGE@{k}"),
        }
    }
}

impl Serialize for Verdict {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The verdict for two greedy token sequences of the same prompt.
pub fn classify(a: &[u32], b: &[u32]) -> Verdict {
    match first_divergence(a, b) {
        None => Verdict::Identical,
        Some(k) if k < EARLY_DIVERGE_TOKENS => Verdict::EarlyDiverge(k),
        Some(k) => Verdict::LateDrift(k),
    }
}

/// Normalised mean squared error Σ(a−b)²/Σa² in f64, with `a` the reference. 0 when both are
/// all zero; infinite when only `a` is; NaN when either holds a non-finite value.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "nmse of different lengths");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            return f64::NAN;
        }
        let d = x as f64 - y as f64;
        num += d * d;
        den += x as f64 * x as f64;
    }
    if num == 0.0 {
        0.0
    } else if den == 0.0 {
        f64::INFINITY
    } else {
        num / den
    }
}

/// One prompt's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct PromptResult {
    pub index: usize,
    pub prompt_tokens: usize,
    pub verdict: Verdict,
    pub first_diff: Option<usize>,
    /// NMSE of the prefill's last-position logits, path b against path a (`null` in JSON when
    /// either side is non-finite).
    pub logits_nmse: f64,
    pub tokens_a: Vec<u32>,
    pub tokens_b: Vec<u32>,
    pub text_a: String,
    pub text_b: String,
}

/// A parity run over a set of prompts.
#[derive(Debug, Clone, Serialize)]
pub struct ParityReport {
    pub model: String,
    pub a: String,
    pub b: String,
    pub max_tokens: usize,
    pub early_diverge_tokens: usize,
    pub results: Vec<PromptResult>,
}

impl ParityReport {
    pub fn early_divergences(&self) -> usize {
        self.results.iter().filter(|r| r.verdict.is_early()).count()
    }

    pub fn passed(&self) -> bool {
        self.early_divergences() == 0
    }

    /// One line: counts per verdict and the largest logits NMSE.
    pub fn summary(&self) -> String {
        let identical = self
            .results
            .iter()
            .filter(|r| r.verdict == Verdict::Identical)
            .count();
        let early = self.early_divergences();
        let late = self.results.len() - identical - early;
        let worst = self
            .results
            .iter()
            .map(|r| r.logits_nmse)
            .fold(0.0f64, |m, x| {
                if x.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    m.max(x)
                }
            });
        format!(
            "{} vs {} on {}: {} prompts, {identical} identical, {late} late drift, {early} early divergence; max logits NMSE {worst:.3e}",
            self.a,
            self.b,
            self.model,
            self.results.len()
        )
    }
}

/// `n` built-in prompts cut from a fixed text with `pipeline`'s tokenizer, lengths cycling
/// through [`BUILTIN_LENGTHS`] and each starting at a different place in the text.
pub fn builtin_prompts(pipeline: &Pipeline, n: usize) -> Result<Vec<Vec<u32>>> {
    let ids = pipeline.tokenizer.encode(BUILTIN_TEXT, false)?;
    if ids.is_empty() {
        bail!("the built-in prompt text encodes to no tokens");
    }
    Ok((0..n)
        .map(|i| {
            let len = BUILTIN_LENGTHS[i % BUILTIN_LENGTHS.len()];
            let start = (i * 97) % ids.len();
            ids.iter().cycle().skip(start).take(len).copied().collect()
        })
        .collect())
}

/// One prompt per non-empty line of `file`, encoded without a chat template.
pub fn file_prompts(pipeline: &Pipeline, file: &Path) -> Result<Vec<Vec<u32>>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading prompts from {}", file.display()))?;
    let prompts = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| pipeline.tokenizer.encode(l, true))
        .collect::<Result<Vec<_>>>()?;
    if prompts.is_empty() {
        bail!("{}: no prompts (expected one per line)", file.display());
    }
    Ok(prompts)
}

/// One path's run of one prompt: the prefill's last-position logits and the greedy tokens.
fn run_path(
    models: &Loaded,
    prompt: &[u32],
    path: PathSpec,
    max_tokens: usize,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let pipeline = models.for_path(&path)?;
    let model = pipeline.model.as_ref();
    let mut state = path.apply_state(model.new_state())?;
    let settings = kernels::Settings::with_numerics(path.numerics.unwrap_or_default());
    let logits = kernels::run(model.device(), settings, || {
        model.forward(prompt, &mut state, false)
    })?
    .to_vec_f32()?;
    let mut opts = RequestOptions {
        max_tokens: Some(max_tokens),
        temperature: Some(0.0),
        ignore_eos: true,
        ..Default::default()
    };
    path.apply(&mut opts);
    let out = path.generate(model, &pipeline.request(prompt.to_vec(), &opts))?;
    Ok((logits, out.tokens))
}

/// Runs every prompt on both paths of the model in `models` (loaded on both paths' backends;
/// named `model` in the report); `progress` sees each result as soon as it is known.
pub fn run(
    models: &Loaded,
    model: &str,
    prompts: &[Vec<u32>],
    a: PathSpec,
    b: PathSpec,
    max_tokens: usize,
    mut progress: impl FnMut(&PromptResult),
) -> Result<ParityReport> {
    let pipeline = models.for_path(&a)?;
    let mut results = Vec::with_capacity(prompts.len());
    for (index, prompt) in prompts.iter().enumerate() {
        let (logits_a, tokens_a) = run_path(models, prompt, a, max_tokens)
            .with_context(|| format!("prompt {index}, path {a}"))?;
        let (logits_b, tokens_b) = run_path(models, prompt, b, max_tokens)
            .with_context(|| format!("prompt {index}, path {b}"))?;
        let verdict = classify(&tokens_a, &tokens_b);
        let r = PromptResult {
            index,
            prompt_tokens: prompt.len(),
            verdict,
            first_diff: verdict.first_diff(),
            logits_nmse: nmse(&logits_a, &logits_b),
            text_a: pipeline.tokenizer.decode(&tokens_a, false)?,
            text_b: pipeline.tokenizer.decode(&tokens_b, false)?,
            tokens_a,
            tokens_b,
        };
        progress(&r);
        results.push(r);
    }
    Ok(ParityReport {
        model: model.to_string(),
        a: a.to_string(),
        b: b.to_string(),
        max_tokens,
        early_diverge_tokens: EARLY_DIVERGE_TOKENS,
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_matches_the_formula() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        // (0.5² + 0²) / (1² + 2²) = 0.05
        approx::assert_relative_eq!(nmse(&[1.0, 2.0], &[1.5, 2.0]), 0.05, max_relative = 1e-14);
        assert_eq!(nmse(&[0.0], &[1.0]), f64::INFINITY);
        assert!(nmse(&[f32::NAN], &[1.0]).is_nan());
    }
}

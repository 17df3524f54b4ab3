//! Comparing the engine with stored outputs of an independent implementation (mlx-lm), the
//! way vLLM compares against Hugging Face: walk the greedy tokens; at the first mismatch each
//! side's token must be in the other side's top-5, then stop.

use std::path::Path;

use anyhow::{Context, Result};
use engine::layers::gated_delta::GdnPath;
use engine::{generate, Pipeline, RequestOptions};
use serde::Deserialize;

/// How deep into the other side's ranking a divergent token may sit.
pub const TOP_N_AT_MISMATCH: usize = 5;

#[derive(Debug, Clone, Deserialize)]
pub struct Reference {
    pub model: String,
    pub cases: Vec<RefCase>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RefCase {
    pub prompt_ids: Vec<u32>,
    pub tokens: Vec<u32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CaseVerdict {
    pub prompt_tokens: usize,
    /// Steps where both sides chose the same token, before any mismatch.
    pub matched: usize,
    pub steps: usize,
    /// The first differing step, with (engine token, reference token).
    pub mismatch: Option<(usize, u32, u32)>,
    /// Largest |top-1 logprob difference| over the matched steps.
    pub max_logprob_diff: f32,
    pub pass: bool,
}

/// Compares one side's greedy run with the other's. Each `top` list is best first.
pub fn compare(
    ours: &[u32],
    our_top: &[Vec<(u32, f32)>],
    theirs: &[u32],
    their_top: &[Vec<(u32, f32)>],
) -> CaseVerdict {
    let steps = ours.len().min(theirs.len());
    let mut max_diff = 0.0f32;
    let in_top =
        |top: &[(u32, f32)], tok: u32| top.iter().take(TOP_N_AT_MISMATCH).any(|&(t, _)| t == tok);
    for i in 0..steps {
        if ours[i] != theirs[i] {
            let pass = in_top(&their_top[i], ours[i]) && in_top(&our_top[i], theirs[i]);
            return CaseVerdict {
                prompt_tokens: 0,
                matched: i,
                steps,
                mismatch: Some((i, ours[i], theirs[i])),
                max_logprob_diff: max_diff,
                pass,
            };
        }
        max_diff = max_diff.max((our_top[i][0].1 - their_top[i][0].1).abs());
    }
    CaseVerdict {
        prompt_tokens: 0,
        matched: steps,
        steps,
        mismatch: None,
        max_logprob_diff: max_diff,
        pass: ours.len() == theirs.len(),
    }
}

/// Runs the engine greedily on every case of a reference file against the model in `dir`,
/// with the Gated DeltaNet path `gdn` (auto when `None`).
pub fn check_reference(dir: &Path, reference: &Path, gdn: Option<GdnPath>) -> Result<Vec<CaseVerdict>> {
    let text = std::fs::read_to_string(reference)
        .with_context(|| format!("reading {}", reference.display()))?;
    let r: Reference =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", reference.display()))?;
    let p = Pipeline::load(dir)?;
    r.cases
        .iter()
        .map(|case| {
            let opts = RequestOptions {
                max_tokens: Some(case.tokens.len()),
                temperature: Some(0.0),
                top_logprobs: 8,
                ignore_eos: true,
                gdn_path: gdn,
                ..Default::default()
            };
            let req = p.request(case.prompt_ids.clone(), &opts);
            let out = generate::generate(p.model.as_ref(), &req, |_| {})?;
            let top = out.top_logprobs.unwrap_or_default();
            let mut v = compare(&out.tokens, &top, &case.tokens, &case.top_logprobs);
            v.prompt_tokens = case.prompt_ids.len();
            Ok(v)
        })
        .collect()
}

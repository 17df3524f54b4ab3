//! T=0 goldens: stored outputs of every case in the matrix ([`cases::MATRIX`]) per backend,
//! checked byte for byte. `check` compares a fresh run with the stored file; `bless` rewrites
//! the files (atomically) and says what moved.
//!
//! A golden also records its checkpoint's hash: when the synthesiser changes a model, the
//! golden is reported as stale ("checkpoint changed, re-bless"), not as a numerics failure.

pub mod cases;
pub mod cli;
pub mod file;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Result;
pub use engine::Backend;
use engine::{Pipeline, RequestOptions};

pub use cases::{Case, MATRIX, MAX_TOKENS, PROMPTS};
pub use file::{checkpoint_sha256, Golden};

use crate::backends::Loaded;

/// `goldens/<device key>` in the workspace: `goldens/cpu`, `goldens/mlx-cpu`, ... (MLX on its
/// CPU and on a GPU round differently, so each device has its own set).
pub fn default_dir(backend: Backend) -> PathBuf {
    synth::workspace_root()
        .join("goldens")
        .join(backend.device_key())
}

/// What to check or bless.
#[derive(Debug, Clone)]
pub struct Options {
    /// The backend the cases run on.
    pub backend: Backend,
    /// The folder of golden files, e.g. `goldens/cpu`.
    pub dir: PathBuf,
    /// A substring of case ids or file names; `None` = every case.
    pub filter: Option<String>,
}

impl Options {
    pub fn for_backend(backend: Backend) -> Options {
        Options {
            backend,
            dir: default_dir(backend),
            filter: None,
        }
    }
}

/// The outcome of checking one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass,
    /// Generated ids differ; `index` is the first differing token (or the shorter length).
    Mismatch {
        index: usize,
        /// The ids at `index` (`None` past the end of a shorter list).
        expected_id: Option<u32>,
        actual_id: Option<u32>,
        expected_text: String,
        actual_text: String,
    },
    /// Ids agree but the decoded text does not (the tokenizer's decoding changed).
    TextMismatch {
        expected_text: String,
        actual_text: String,
    },
    /// The checkpoint's bytes changed since the bless: the golden is stale, not wrong.
    CheckpointChanged {
        golden: String,
        now: String,
    },
    /// The case's definition (prompt ids or token count) changed since the bless.
    CaseChanged(String),
    /// No golden file for this case.
    Missing,
    /// The case could not run (or its file could not be read).
    Error(String),
}

impl Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass)
    }

    /// The short word of the progress line.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Pass => "OK",
            Verdict::Mismatch { .. } | Verdict::TextMismatch { .. } => "FAIL",
            Verdict::CheckpointChanged { .. } | Verdict::CaseChanged(_) => "STALE",
            Verdict::Missing => "MISSING",
            Verdict::Error(_) => "ERROR",
        }
    }

    /// The rest of the progress line and any detail lines after it.
    pub fn detail(&self) -> String {
        match self {
            Verdict::Pass => String::new(),
            Verdict::Mismatch {
                index,
                expected_id,
                actual_id,
                expected_text,
                actual_text,
            } => {
                let id = |t: &Option<u32>| t.map_or("none".to_string(), |t| t.to_string());
                format!(
                    "first divergent token at index {index} (golden id {}, now id {})\n      golden: {expected_text:?}\n      now:    {actual_text:?}",
                    id(expected_id),
                    id(actual_id)
                )
            }
            Verdict::TextMismatch {
                expected_text,
                actual_text,
            } => format!(
                "token ids identical but the text differs\n      golden: {expected_text:?}\n      now:    {actual_text:?}"
            ),
            Verdict::CheckpointChanged { golden, now } => format!(
                "checkpoint changed, re-bless (sha256 {} in the golden, {} now)",
                short(golden),
                short(now)
            ),
            Verdict::CaseChanged(what) => format!("{what} changed, re-bless"),
            Verdict::Missing => "no golden file".to_string(),
            Verdict::Error(e) => e.clone(),
        }
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// One case's outcome, with the file it was checked against.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub case: String,
    pub file: PathBuf,
    pub verdict: Verdict,
}

/// What `bless` did to one case's file.
#[derive(Debug, Clone, PartialEq)]
pub enum BlessChange {
    New,
    Unchanged,
    /// Generated ids moved; `index` is the first differing token.
    ChangedAt(usize),
    /// Only other fields moved (the checkpoint hash, the prompt, the text, or an unreadable file).
    Updated(String),
}

impl std::fmt::Display for BlessChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlessChange::New => write!(f, "new"),
            BlessChange::Unchanged => write!(f, "unchanged"),
            BlessChange::ChangedAt(k) => write!(f, "changed at index {k}"),
            BlessChange::Updated(what) => write!(f, "updated ({what})"),
        }
    }
}

/// A fresh run of one case, as a golden (engine version filled in).
fn run_case(
    case: &Case,
    pipeline: &Pipeline,
    checkpoint_sha256: &str,
    version: &str,
) -> Result<Golden> {
    let prompt_ids = case.prompt.ids(pipeline)?;
    let mut opts = RequestOptions {
        max_tokens: Some(MAX_TOKENS),
        temperature: Some(0.0),
        ignore_eos: true,
        ..Default::default()
    };
    case.path.apply(&mut opts);
    let req = pipeline.request(prompt_ids.clone(), &opts);
    let out = case.path.generate(pipeline.model.as_ref(), &req)?;
    let text = pipeline.tokenizer.decode(&out.tokens, false)?;
    Ok(Golden {
        case: case.id(),
        synth: case.spec.to_string(),
        path: case.path.to_string(),
        prompt: case.prompt.name.to_string(),
        checkpoint_sha256: checkpoint_sha256.to_string(),
        max_tokens: MAX_TOKENS,
        prompt_ids,
        generated_ids: out.tokens,
        text,
        engine_version: version.to_string(),
    })
}

/// The first index where two id lists differ (the shorter length when one is a prefix).
pub fn first_divergence(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(k) => Some(k),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// Compares a stored golden with a fresh run of the same checkpoint.
pub fn compare(golden: &Golden, now: &Golden) -> Verdict {
    if golden.checkpoint_sha256 != now.checkpoint_sha256 {
        return Verdict::CheckpointChanged {
            golden: golden.checkpoint_sha256.clone(),
            now: now.checkpoint_sha256.clone(),
        };
    }
    if golden.prompt_ids != now.prompt_ids {
        return Verdict::CaseChanged("prompt".into());
    }
    if golden.max_tokens != now.max_tokens {
        return Verdict::CaseChanged("max_tokens".into());
    }
    if let Some(index) = first_divergence(&golden.generated_ids, &now.generated_ids) {
        return Verdict::Mismatch {
            index,
            expected_id: golden.generated_ids.get(index).copied(),
            actual_id: now.generated_ids.get(index).copied(),
            expected_text: golden.text.clone(),
            actual_text: now.text.clone(),
        };
    }
    if golden.text != now.text {
        return Verdict::TextMismatch {
            expected_text: golden.text.clone(),
            actual_text: now.text.clone(),
        };
    }
    Verdict::Pass
}

/// Runs every selected case, grouped by checkpoint (each is synthesised, hashed and loaded
/// once), handing each fresh result and its file to `visit`.
fn for_each_case(
    opts: &Options,
    mut visit: impl FnMut(&Case, &Path, Result<Golden>),
) -> Result<Vec<String>> {
    let (mut cases, skipped) = cases::cases(opts.filter.as_deref())?;
    cases.retain(|c| c.runs_on(opts.backend));
    let version = file::engine_version();
    let mut i = 0;
    while i < cases.len() {
        let spec = &cases[i].spec;
        let group = cases[i..].iter().take_while(|c| &c.spec == spec).count();
        let dir_hash = synth::cached(spec).and_then(|dir| Ok((checkpoint_sha256(&dir)?, dir)));
        // Loaded once per backend and resident numerics (MLX keeps weights per numerics).
        let mut loaded = dir_hash
            .as_ref()
            .map(|(hash, dir)| (hash, Loaded::new(dir)));
        for case in &cases[i..i + group] {
            let path = opts.dir.join(case.file_name());
            let fresh = match &mut loaded {
                Ok((hash, l)) => l
                    .ensure(opts.backend, case.path.numerics.unwrap_or_default())
                    .map_err(|e| anyhow::anyhow!("{spec}: {e:#}"))
                    .and_then(|p| run_case(case, p, hash, &version)),
                Err(e) => Err(anyhow::anyhow!("{spec}: {e:#}")),
            };
            visit(case, &path, fresh);
        }
        i += group;
    }
    Ok(skipped)
}

/// Files in `dir` that no case of the matrix writes (left over from a removed case).
fn orphans(dir: &Path) -> Result<Vec<PathBuf>> {
    let (all, _) = cases::cases(None)?;
    let known: BTreeSet<String> = all.iter().map(Case::file_name).collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| !known.contains(&*n.to_string_lossy()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The summary of a check, for the caller to print or assert on.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub results: Vec<CaseResult>,
    /// Matrix rows not run (their family cannot be synthesised yet).
    pub skipped: Vec<String>,
    /// Golden files no case owns.
    pub orphans: Vec<PathBuf>,
}

impl CheckReport {
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.results.iter().filter(|r| !r.verdict.passed())
    }

    pub fn all_passed(&self) -> bool {
        self.failures().next().is_none()
    }
}

/// Checks every selected case against its golden in `opts.dir`; `progress` sees each result
/// as soon as it is known.
pub fn check(opts: &Options, mut progress: impl FnMut(&CaseResult)) -> Result<CheckReport> {
    let mut results = Vec::new();
    let skipped = for_each_case(opts, |case, path, fresh| {
        let verdict = if !path.exists() {
            Verdict::Missing
        } else {
            match (Golden::read(path), fresh) {
                (Err(e), _) | (_, Err(e)) => Verdict::Error(format!("{e:#}")),
                (Ok(golden), Ok(now)) => compare(&golden, &now),
            }
        };
        let r = CaseResult {
            case: case.id(),
            file: path.to_path_buf(),
            verdict,
        };
        progress(&r);
        results.push(r);
    })?;
    let orphans = if opts.filter.is_none() {
        orphans(&opts.dir)?
    } else {
        Vec::new()
    };
    Ok(CheckReport {
        results,
        skipped,
        orphans,
    })
}

/// Rewrites the golden of every selected case whose output or inputs moved (unchanged files
/// are left alone, so their recorded engine version says when they were last made).
/// `progress` sees each case's change as soon as its file is written. Fails on the first case
/// that cannot run, after reporting the ones before it.
pub fn bless(
    opts: &Options,
    mut progress: impl FnMut(&Case, &Path, &BlessChange),
) -> Result<Vec<(String, BlessChange)>> {
    let mut changes = Vec::new();
    let mut first_error = None;
    for_each_case(opts, |case, path, fresh| {
        if first_error.is_some() {
            return;
        }
        let now = match fresh {
            Ok(g) => g,
            Err(e) => {
                first_error = Some(e.context(format!("blessing {}", case.id())));
                return;
            }
        };
        let change = match path.exists().then(|| Golden::read(path)) {
            None => BlessChange::New,
            Some(Err(e)) => BlessChange::Updated(format!("the old file was unreadable: {e:#}")),
            Some(Ok(old)) => match first_divergence(&old.generated_ids, &now.generated_ids) {
                Some(k) => BlessChange::ChangedAt(k),
                None => {
                    let mut moved = Vec::new();
                    if old.checkpoint_sha256 != now.checkpoint_sha256 {
                        moved.push("checkpoint hash");
                    }
                    if old.prompt_ids != now.prompt_ids {
                        moved.push("prompt");
                    }
                    if old.text != now.text {
                        moved.push("text");
                    }
                    if old.max_tokens != now.max_tokens || old.case != now.case {
                        moved.push("case");
                    }
                    if moved.is_empty() {
                        BlessChange::Unchanged
                    } else {
                        BlessChange::Updated(format!("{}; tokens unchanged", moved.join(", ")))
                    }
                }
            },
        };
        if change != BlessChange::Unchanged {
            if let Err(e) = now.write_atomic(path) {
                first_error = Some(e);
                return;
            }
        }
        progress(case, path, &change);
        changes.push((case.id(), change));
    })?;
    match first_error {
        Some(e) => Err(e),
        None => Ok(changes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_index() {
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_divergence(&[1, 2], &[1, 2, 3]), Some(2));
        assert_eq!(first_divergence(&[], &[4]), Some(0));
    }
}

//! TTFT sweeps (docs/design.md §8): time requests over prompt lengths × execution paths, the paths
//! interleaved inside each repetition (so drift in machine load hits every path alike) after
//! untimed warm-up passes, one [`Measurement`] per request; repetitions continue where a
//! median is not yet known to ±5%, up to a repeat and a time cap. `harness report` turns the rows into
//! tables and plots.

pub mod cli;
pub mod prompt;
pub mod record;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use engine::generate::GenerateOutput;
use engine::{Pipeline, RequestOptions};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::backends::Loaded;
use crate::machine::{self, Machine};
use crate::paths::PathSpec;
use crate::report::stats;
pub use prompt::PromptIds;
pub use record::{read_jsonl, Measurement};

/// A loaded model ready to time: the model on each backend the paths name, plus the ids its
/// prompts may use. Shared by the sweep and the criterion bench so both time exactly the same
/// request.
pub struct TtftRunner {
    pub models: Loaded,
    prompts: PromptIds,
}

impl TtftRunner {
    /// The model on the CPU backend.
    pub fn load(dir: &Path) -> Result<TtftRunner> {
        TtftRunner::load_for(dir, &[PathSpec::default()])
    }

    /// The model on every backend `paths` name.
    pub fn load_for(dir: &Path, paths: &[PathSpec]) -> Result<TtftRunner> {
        let models = Loaded::for_paths(dir, paths)
            .with_context(|| format!("loading the model in {}", dir.display()))?;
        let pipeline = models.first()?;
        let prompts = PromptIds::for_model(
            dir,
            pipeline.tokenizer.vocab_size(),
            pipeline.model.info().vocab_size,
        )?;
        Ok(TtftRunner { models, prompts })
    }

    fn pipeline(&self) -> &Pipeline {
        self.models
            .first()
            .expect("a runner holds at least one pipeline")
    }

    /// Fails when a prompt of `len` tokens plus `max_tokens` generated ones would not fit the
    /// model's context (the engine would cut generation short and the output hashes would
    /// compare different amounts of text).
    pub fn check_length(&self, len: usize, max_tokens: usize) -> Result<()> {
        let context = self.pipeline().model.info().context_length;
        if len == 0 {
            bail!("prompt length 0: every length must be at least 1 token");
        }
        if len + max_tokens > context {
            bail!(
                "prompt length {len} + {max_tokens} generated tokens exceeds the model's context of {context} tokens \
                 (max_position_embeddings in {}); use shorter --lengths or fewer --max-tokens",
                self.pipeline().dir.join("config.json").display()
            );
        }
        Ok(())
    }

    /// The benchmark prompt of exactly `len` ordinary tokens.
    pub fn prompt(&self, len: usize, seed: u64) -> Vec<u32> {
        self.prompts.prompt(len, seed)
    }

    /// One greedy request on `path`, generating exactly `max_tokens` tokens (stop tokens are
    /// ignored so every path and repetition does the same work).
    pub fn run(
        &self,
        prompt_ids: Vec<u32>,
        path: &PathSpec,
        max_tokens: usize,
    ) -> Result<GenerateOutput> {
        let mut opts = RequestOptions {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ignore_eos: true,
            ..RequestOptions::default()
        };
        path.apply(&mut opts);
        let pipeline = self.models.for_path(path)?;
        let req = pipeline.request(prompt_ids, &opts);
        path.generate(pipeline.model.as_ref(), &req)
    }
}

/// The hex sha256 of token ids as little-endian u32s.
pub fn output_hash(tokens: &[u32]) -> String {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What to sweep.
#[derive(Debug, Clone)]
pub struct SweepPlan {
    pub model_dir: PathBuf,
    /// Recorded as the rows' `model`: the synth spec or the folder's name.
    pub model_name: String,
    pub lengths: Vec<usize>,
    pub paths: Vec<PathSpec>,
    /// Timed repetitions every (length, path) gets.
    pub repeats: usize,
    /// Repetitions beyond `repeats` are run, for the lengths whose median TTFT on some path is
    /// not yet known to ±5% (95% bootstrap interval), up to this many in all...
    pub max_repeats: usize,
    /// ...or until the timed passes have taken this long.
    pub time_cap: std::time::Duration,
    /// Untimed passes over every length and path before the first timed one.
    pub warmup: usize,
    pub max_tokens: usize,
    pub prompt_seed: u64,
    pub label: Option<String>,
}

impl SweepPlan {
    fn validate(&self) -> Result<()> {
        if self.lengths.is_empty() {
            bail!("no prompt lengths: give --lengths, e.g. --lengths 64,256,1024");
        }
        if self.paths.is_empty() {
            bail!("no paths: give --paths, e.g. --paths gdn=perstep,gdn=chunked");
        }
        if self.repeats == 0 {
            bail!("--repeats must be at least 1");
        }
        if self.max_repeats < self.repeats {
            bail!(
                "--max-repeats {} is below --repeats {}: it caps the repetitions added after them",
                self.max_repeats,
                self.repeats
            );
        }
        if self.max_tokens == 0 {
            bail!("--max-tokens must be at least 1 (the first token is what TTFT times)");
        }
        Ok(())
    }
}

/// How a sweep's timed repetitions ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Every (length, path) had its median TTFT known to ±5% after this many repetitions.
    Narrow { repeats: usize },
    /// `max_repeats` reached with these (length, path) cells still wider than ±5%.
    RepeatCap {
        repeats: usize,
        wide: Vec<(usize, String)>,
    },
    /// `time_cap` reached after this many repetitions, these cells still wider than ±5%.
    TimeCap {
        repeats: usize,
        wide: Vec<(usize, String)>,
    },
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cells = |wide: &[(usize, String)]| {
            wide.iter()
                .map(|(len, path)| format!("{len} tokens on {path}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Stop::Narrow { repeats } => write!(
                f,
                "repeats: every median TTFT is known to ±5% (95% interval) after at most {repeats} repetitions"
            ),
            Stop::RepeatCap { repeats, wide } => write!(
                f,
                "repeats: stopped at --max-repeats {repeats} with {} still wider than ±5%: {}",
                wide.len(),
                cells(wide)
            ),
            Stop::TimeCap { repeats, wide } => write!(
                f,
                "repeats: stopped at --time-cap after {repeats} repetitions with {} still wider than ±5%: {}",
                wide.len(),
                cells(wide)
            ),
        }
    }
}

/// The (length, path) cells of `rows` whose median TTFT is not yet known to ±5%.
fn wide_cells(rows: &[Measurement], lengths: &[usize], paths: &[PathSpec]) -> Vec<(usize, String)> {
    let mut wide = Vec::new();
    for &len in lengths {
        for path in paths {
            let name = path.to_string();
            let mut v: Vec<f64> = rows
                .iter()
                .filter(|r| r.prompt_tokens == len && r.path == name)
                .map(|r| r.ttft_ms)
                .collect();
            let ci = stats::median_interval(&v);
            let median = stats::Summary::of(&mut v).median;
            if !ci.is_some_and(|ci| ci.is_narrow(median)) {
                wide.push((len, name));
            }
        }
    }
    wide
}

/// Runs the plan: `warmup` untimed passes, then repetitions, each over every length and, inside
/// it, every path, one timed request each. After `repeats` of them, a repetition runs only the
/// lengths where some path's median is not yet known to ±5% (all paths of such a length, so
/// the paths still meet under the same machine load), until none is left, `max_repeats` or
/// `time_cap`. `on_row` sees each measurement as soon as it exists (the CLI appends it to the
/// jsonl file); all are returned, with how the repetitions ended.
pub fn run_sweep(
    plan: &SweepPlan,
    progress: bool,
    mut on_row: impl FnMut(&Measurement) -> Result<()>,
) -> Result<(Vec<Measurement>, Stop)> {
    plan.validate()?;
    let runner = TtftRunner::load_for(&plan.model_dir, &plan.paths)?;
    for &len in &plan.lengths {
        runner.check_length(len, plan.max_tokens)?;
    }
    let machine = Machine::current();
    let commit = machine::commit();

    let per_pass = (plan.lengths.len() * plan.paths.len()) as u64;
    let bar = if progress {
        ProgressBar::new(per_pass * (plan.warmup + plan.repeats) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>9} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
        )
        .expect("a valid progress template")
        .progress_chars("=> "),
    );

    let mut rows = Vec::new();
    let mut timed_since = None;
    let mut pass = 0;
    let stop = loop {
        let warm = pass < plan.warmup;
        let rep = pass.saturating_sub(plan.warmup);
        let lengths: Vec<usize> = if warm || rep < plan.repeats {
            plan.lengths.clone()
        } else {
            let wide = wide_cells(&rows, &plan.lengths, &plan.paths);
            let started: std::time::Instant =
                *timed_since.get_or_insert_with(std::time::Instant::now);
            if wide.is_empty() {
                break Stop::Narrow { repeats: rep };
            } else if rep >= plan.max_repeats {
                break Stop::RepeatCap { repeats: rep, wide };
            } else if started.elapsed() >= plan.time_cap {
                break Stop::TimeCap { repeats: rep, wide };
            }
            let lens: Vec<usize> = plan
                .lengths
                .iter()
                .copied()
                .filter(|l| wide.iter().any(|(w, _)| w == l))
                .collect();
            bar.inc_length((lens.len() * plan.paths.len()) as u64);
            lens
        };
        if !warm && timed_since.is_none() {
            timed_since = Some(std::time::Instant::now());
        }
        bar.set_prefix(if warm {
            "warm-up".to_string()
        } else if rep < plan.repeats {
            format!("rep {}/{}", rep + 1, plan.repeats)
        } else {
            format!("rep {}/≤{}", rep + 1, plan.max_repeats)
        });
        for &len in &lengths {
            let ids = runner.prompt(len, plan.prompt_seed);
            for path in &plan.paths {
                bar.set_message(format!("{len} tokens, {path}"));
                let out = runner
                    .run(ids.clone(), path, plan.max_tokens)
                    .with_context(|| {
                        format!("{}: {len}-token prompt on path {path}", plan.model_name)
                    })?;
                bar.inc(1);
                if warm {
                    continue;
                }
                let row = Measurement {
                    machine: machine.clone(),
                    backend: path.backend().device_key(),
                    commit: commit.clone(),
                    label: plan.label.clone(),
                    model: plan.model_name.clone(),
                    path: path.to_string(),
                    prompt_tokens: len,
                    repeat: rep,
                    prompt_seed: plan.prompt_seed,
                    max_tokens: plan.max_tokens,
                    generated_tokens: out.tokens.len(),
                    ttft_ms: out.ttft_ms,
                    prefill_tokens_per_s: out.prefill_tokens_per_s,
                    decode_tokens_per_s: out.decode_tokens_per_s,
                    output_sha256: Some(output_hash(&out.tokens)),
                };
                on_row(&row)?;
                rows.push(row);
            }
        }
        pass += 1;
    };
    bar.finish_and_clear();
    Ok((rows, stop))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_hash_is_sha256_of_le_ids() {
        // sha256 of the empty input, a published constant.
        assert_eq!(
            output_hash(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // 0x64636261 little-endian is the bytes "abcd"; sha256("abcd") is a published constant.
        assert_eq!(
            output_hash(&[0x6463_6261]),
            "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589"
        );
    }
}

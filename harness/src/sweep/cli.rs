//! `harness sweep`: the command-line face of [`run_sweep`](super::run_sweep).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::{run_sweep, SweepPlan};
use crate::models;
use crate::paths::{parse_paths, VALID_PATHS};
use synth::SynthSpec;

/// Time TTFT over prompt lengths and execution paths; one JSON line per measurement.
///
/// Prompts are exactly LENGTH ordinary tokens (deterministic ids from --seed, no special
/// tokens), decoded greedily for --max-tokens tokens. After --warmup untimed passes, each
/// repetition runs every length, and inside it every path, so slow drifts in machine load
/// hit all paths alike. After --repeats repetitions, more run for the lengths where some
/// path's median TTFT is not yet known to ±5% (95% bootstrap interval), until none is left,
/// --max-repeats or --time-cap; the sweep says which ended it, and `harness report` marks
/// the cells that stayed wider. Each line records the machine, backend, commit, model, path,
/// prompt_tokens, repeat, ttft_ms, prefill/decode tokens/s and the output's sha256.
///
/// Lines are appended to --out one at a time and flushed, so an interrupted sweep keeps
/// what it measured and several sweeps can share one file.
///
/// Examples:
///   harness sweep --synth qwen3_5:bench:bf16 --lengths 64,256,1024,4096 \
///       --paths gdn=perstep,gdn=chunked --out sweep.jsonl
///   harness sweep --model ~/models/Qwen3-0.6B --lengths 128,512 --repeats 5 --out q3.jsonl
///   harness report sweep.jsonl --out reports/latest
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SweepArgs {
    /// A checkpoint folder (Hugging Face or MLX layout).
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with = "synth",
        required_unless_present = "synth"
    )]
    pub model: Option<PathBuf>,

    /// A synthetic checkpoint, made and cached on first use: FAMILY[:SIZE[:FORMAT[:LAYOUT]]].
    #[arg(long, value_name = "SPEC")]
    pub synth: Option<String>,

    /// Prompt lengths in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', required = true, value_name = "N,N,...")]
    pub lengths: Vec<usize>,

    /// Execution paths, comma-separated (valid: default, gdn=auto|perstep|chunked).
    #[arg(long, default_value = "default", value_name = "PATH,PATH,...")]
    pub paths: String,

    /// Timed repetitions every (length, path) gets (at least 3 give an interval).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,

    /// The most repetitions in all, added where a median is not yet known to ±5%.
    #[arg(long, default_value_t = 30)]
    pub max_repeats: usize,

    /// Seconds of timed repetitions after which no more are added.
    #[arg(long, default_value_t = 300.0, value_name = "SECONDS")]
    pub time_cap: f64,

    /// Untimed passes over every length and path before timing.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,

    /// Tokens generated per request (decode tokens/s is measured over them).
    #[arg(long, default_value_t = 8)]
    pub max_tokens: usize,

    /// Seed of the prompt ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// A tag stored in every line (e.g. `before`, `after`), for `harness report --baseline
    /// label=before --compare label=after`.
    #[arg(long)]
    pub label: Option<String>,

    /// The jsonl file to append to (created if missing).
    #[arg(long, value_name = "FILE.jsonl")]
    pub out: PathBuf,
}

impl SweepArgs {
    pub fn run(self) -> Result<()> {
        let paths = parse_paths(&self.paths)
            .with_context(|| format!("--paths {} (valid: {VALID_PATHS})", self.paths))?;
        let model_name = match (&self.model, &self.synth) {
            (_, Some(spec)) => SynthSpec::parse(spec)?.to_string(),
            (Some(dir), None) => dir
                .canonicalize()
                .unwrap_or_else(|_| dir.clone())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string()),
            (None, None) => unreachable!("clap requires --model or --synth"),
        };
        let model_dir = models::resolve(self.model.as_deref(), self.synth.as_deref())?;
        let plan = SweepPlan {
            model_dir,
            model_name,
            lengths: self.lengths,
            paths,
            repeats: self.repeats,
            max_repeats: self.max_repeats,
            time_cap: std::time::Duration::try_from_secs_f64(self.time_cap)
                .map_err(|e| anyhow::anyhow!("--time-cap {}: {e}", self.time_cap))?,
            warmup: self.warmup,
            max_tokens: self.max_tokens,
            prompt_seed: self.seed,
            label: self.label,
        };

        if let Some(parent) = self.out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.out)
            .with_context(|| format!("opening {} for appending", self.out.display()))?;
        let out = &self.out;
        // Each line goes out in one write on an append-mode file, then is flushed: a crash
        // leaves only whole lines behind.
        let (rows, stop) = run_sweep(&plan, true, |row| {
            let mut line = serde_json::to_string(row)?;
            line.push('\n');
            file.write_all(line.as_bytes())
                .and_then(|_| file.flush())
                .with_context(|| format!("appending to {}", out.display()))
        })?;
        eprintln!("{}", summary(&rows));
        eprintln!("{stop}");
        eprintln!(
            "appended {} measurements to {}; next: harness report {}",
            rows.len(),
            self.out.display(),
            self.out.display()
        );
        Ok(())
    }
}

/// Median TTFT per (length, path), one line each, for a glance at the end of a sweep.
fn summary(rows: &[super::Measurement]) -> String {
    let mut keys: Vec<(usize, String)> = rows
        .iter()
        .map(|r| (r.prompt_tokens, r.path.clone()))
        .collect();
    keys.dedup();
    keys.sort();
    keys.dedup();
    let mut s = String::from("prompt tokens  path                 median TTFT ms");
    for (len, path) in keys {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.prompt_tokens == len && r.path == path)
            .map(|r| r.ttft_ms)
            .collect();
        let med = crate::report::stats::Summary::of(&mut v).median;
        s.push_str(&format!("\n{len:>13}  {path:<20} {med:>14.2}"));
    }
    s
}

//! One line of a sweep's jsonl file: one timed request, with everything needed to group it
//! (model, path, prompt length, machine, commit) and to judge parity (the output's hash).

use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::machine::Machine;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub machine: Machine,
    /// `cpu`, later `cuda` or `mlx`.
    pub backend: String,
    /// `git rev-parse --short HEAD` (`-dirty` when the tree had changes); `null` outside git.
    pub commit: Option<String>,
    /// A free-form tag from `--label` (e.g. `before`, `after`), for comparing runs that share a
    /// commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The synthetic spec (`qwen3_5:bench:bf16:hf`) or the model folder's name.
    pub model: String,
    /// The execution path, canonical spelling (`gdn=perstep`, `default`).
    pub path: String,
    pub prompt_tokens: usize,
    /// 0-based repetition index; warm-up runs are not recorded.
    pub repeat: usize,
    /// Seed of the prompt ids (the same prompt for every path and repetition).
    #[serde(default)]
    pub prompt_seed: u64,
    pub max_tokens: usize,
    pub generated_tokens: usize,
    /// From the prompt entering the engine to the first token's logits on the host.
    pub ttft_ms: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// sha256 (hex) of the generated token ids as little-endian u32s: equal hashes across
    /// paths mean identical greedy output. `null` for sources without outputs (criterion).
    pub output_sha256: Option<String>,
}

/// The longest TTFT a report accepts (about 11.6 days): anything longer is a unit mistake or a
/// corrupt file, and would stretch the plots' log axes over meaningless decades.
pub const MAX_TTFT_MS: f64 = 1e9;

impl Measurement {
    /// Whether the timings are ones a report can table and plot: TTFT in (0, MAX_TTFT_MS] ms,
    /// a prompt of at least one token, throughputs non-negative (NaN: not measured).
    pub fn check(&self) -> Result<(), String> {
        if !(self.ttft_ms > 0.0 && self.ttft_ms <= MAX_TTFT_MS) {
            return Err(format!(
                "`ttft_ms` = {} is not a time in (0, {MAX_TTFT_MS:e}] ms",
                self.ttft_ms
            ));
        }
        if self.prompt_tokens == 0 {
            return Err("`prompt_tokens` = 0: a TTFT needs a prompt".into());
        }
        for (field, v) in [
            ("prefill_tokens_per_s", self.prefill_tokens_per_s),
            ("decode_tokens_per_s", self.decode_tokens_per_s),
        ] {
            if v.is_infinite() || v < 0.0 {
                return Err(format!("`{field}` = {v} is not a rate"));
            }
        }
        Ok(())
    }
}

/// Reads a jsonl file of measurements; blank lines are skipped, a bad line (malformed, or with
/// timings no report can show) is an error that names the file and line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Measurement>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}: reading line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let row: Measurement = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a sweep measurement", path.display(), i + 1))?;
        row.check()
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), i + 1))?;
        rows.push(row);
    }
    Ok(rows)
}

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

/// Reads a jsonl file of measurements; blank lines are skipped, a bad line is an error that
/// names the file and line.
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
        rows.push(row);
    }
    Ok(rows)
}

//! Reads the TTFT benchmarks criterion wrote (`cargo bench -p harness --bench ttft`) as
//! measurements: one per criterion sample, so the report's median and p10–p90 come from the
//! same order statistics as a sweep's.
//!
//! Layout: `<dir>/<group>/<function>/<value>/new/{benchmark.json, sample.json}`, where the
//! bench names its group `ttft/<model>`, the function the path, the value the prompt length.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::machine::{self, Machine};
use crate::sweep::Measurement;

/// The group prefix the ttft bench uses; other benchmarks in the folder are skipped.
pub const GROUP_PREFIX: &str = "ttft/";

#[derive(Deserialize)]
struct Benchmark {
    group_id: String,
    function_id: Option<String>,
    value_str: Option<String>,
}

#[derive(Deserialize)]
struct Sample {
    iters: Vec<f64>,
    /// Nanoseconds per sample (all of its iterations together).
    times: Vec<f64>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not criterion's format", path.display()))
}

/// Every `new/benchmark.json` below `dir`.
fn find_benchmarks(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            // `base` and `change` hold older runs and comparisons; only `new` is this run.
            if path.file_name().is_some_and(|n| n == "new") {
                let b = path.join("benchmark.json");
                if b.is_file() {
                    out.push(b);
                }
            } else if path
                .file_name()
                .is_none_or(|n| n != "base" && n != "change" && n != "report")
            {
                find_benchmarks(&path, out)?;
            }
        }
    }
    Ok(())
}

/// The TTFT measurements under a criterion output folder (usually `target/criterion`).
/// Criterion does not record the machine or commit: rows get this machine, no commit, and the
/// label `criterion`.
pub fn read_criterion(dir: &Path) -> Result<Vec<Measurement>> {
    if !dir.is_dir() {
        bail!("{}: not a folder (criterion writes target/criterion after `cargo bench -p harness --bench ttft`)", dir.display());
    }
    let mut files = Vec::new();
    find_benchmarks(dir, &mut files)?;
    // In the order criterion ran them (its sample files' write times), so the default
    // baseline is the bench's first path, as with a sweep's first line.
    files.sort_by_key(|f| {
        let written = std::fs::metadata(f.with_file_name("sample.json"))
            .and_then(|m| m.modified())
            .ok();
        (written, f.clone())
    });
    let machine = Machine::current();
    let mut rows = Vec::new();
    for file in files {
        let b: Benchmark = read_json(&file)?;
        let Some(model) = b.group_id.strip_prefix(GROUP_PREFIX) else {
            continue;
        };
        let (Some(path), Some(len)) = (
            b.function_id,
            b.value_str.and_then(|v| v.parse::<usize>().ok()),
        ) else {
            continue;
        };
        let sample: Sample = read_json(&file.with_file_name("sample.json"))?;
        for (repeat, (iters, ns)) in sample.iters.iter().zip(&sample.times).enumerate() {
            let ttft_ms = ns / iters.max(1.0) / 1e6;
            let row = Measurement {
                machine: machine.clone(),
                backend: machine::backend(),
                commit: None,
                label: Some("criterion".into()),
                model: model.to_string(),
                path: path.clone(),
                prompt_tokens: len,
                repeat,
                prompt_seed: 0,
                max_tokens: 1,
                generated_tokens: 1,
                ttft_ms,
                prefill_tokens_per_s: len as f64 / (ttft_ms / 1e3),
                decode_tokens_per_s: f64::NAN,
                output_sha256: None,
            };
            row.check().map_err(|e| {
                anyhow::anyhow!(
                    "{}: sample {repeat}: {e}",
                    file.with_file_name("sample.json").display()
                )
            })?;
            rows.push(row);
        }
    }
    if rows.is_empty() {
        bail!(
            "{}: no TTFT benchmarks (looked for */new/benchmark.json with group `{GROUP_PREFIX}<model>`); \
             run `cargo bench -p harness --bench ttft` first",
            dir.display()
        );
    }
    Ok(rows)
}

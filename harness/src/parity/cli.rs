//! `harness parity`: two paths of one model on the same prompts, one line per prompt.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use super::{builtin_prompts, file_prompts, run, DEFAULT_MAX_TOKENS, EARLY_DIVERGE_TOKENS};
use crate::backends::Loaded;
use crate::models;
use crate::paths::{parse_path, PathSpec};

/// Compare two execution paths of one model at T=0, prompt by prompt.
///
/// Each prompt runs greedily on path A and path B (stop tokens ignored). The verdict is
/// `identical`, `late-drift@k` or `EARLY-DIVERGE@k`, where k is the first generated token that
/// differs and early means k < 16; beside it, the NMSE Σ(a−b)²/Σa² of the prefill's
/// last-position logits. Exits non-zero when any prompt diverges early.
///
/// Paths: `default`, or KEY=VALUE joined by `+`; keys: backend=cpu|mlx|metal|cuda (the model
/// is loaded once per backend; mlx, metal and cuda need a build with that feature),
/// gdn=auto|perstep|chunked.
///
/// Examples:
///   harness parity --synth qwen3_5:tiny --a gdn=perstep --b gdn=chunked
///   harness parity --synth qwen3_5:tiny:q4 --a backend=cpu --b backend=mlx
///   harness parity --synth qwen3_5:tiny --a backend=cpu --b backend=cuda+gdn=chunked
///   harness parity --model ~/models/Qwen3.5-0.8B --a gdn=perstep --b gdn=chunked --prompts prompts.txt --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ParityArgs {
    /// A checkpoint folder (Hugging Face or MLX layout).
    #[arg(long, value_name = "DIR", conflicts_with = "synth")]
    pub model: Option<PathBuf>,

    /// A synthetic checkpoint FAMILY[:SIZE[:FORMAT[:LAYOUT]]], made and cached on first use.
    #[arg(long, value_name = "SPEC")]
    pub synth: Option<String>,

    /// The reference path.
    #[arg(long, value_name = "PATH", value_parser = parse_path)]
    pub a: PathSpec,

    /// The path compared with it.
    #[arg(long, value_name = "PATH", value_parser = parse_path)]
    pub b: PathSpec,

    /// How many built-in prompts (lengths 9 to 257 tokens, cycling), or a file with one prompt
    /// per line.
    #[arg(long, value_name = "N|FILE", default_value = "8")]
    pub prompts: String,

    /// Tokens generated per prompt and path.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_TOKENS)]
    pub max_tokens: usize,

    /// Print the results as JSON on stdout (progress lines go to stderr).
    #[arg(long)]
    pub json: bool,
}

impl ParityArgs {
    pub fn run(self) -> Result<()> {
        if self.max_tokens == 0 {
            bail!("--max-tokens must be at least 1");
        }
        if self.max_tokens <= EARLY_DIVERGE_TOKENS {
            eprintln!(
                "note: with --max-tokens {} no divergence can count as late (early means before token {EARLY_DIVERGE_TOKENS})",
                self.max_tokens
            );
        }
        let dir = models::resolve(self.model.as_deref(), self.synth.as_deref())?;
        let model = self
            .synth
            .clone()
            .unwrap_or_else(|| dir.display().to_string());
        let models = Loaded::for_paths(&dir, &[self.a, self.b])?;
        let pipeline = models.first()?;
        let prompts = match self.prompts.parse::<usize>() {
            Ok(0) => bail!("--prompts 0: give at least one prompt"),
            Ok(n) => builtin_prompts(pipeline, n)?,
            Err(_) => file_prompts(pipeline, std::path::Path::new(&self.prompts))?,
        };
        let json = self.json;
        let line = |s: String| {
            if json {
                eprintln!("{s}")
            } else {
                println!("{s}")
            }
        };
        line(format!(
            "parity on {model}: a = {}, b = {}, {} prompts, {} tokens each",
            self.a,
            self.b,
            prompts.len(),
            self.max_tokens
        ));
        let report = run(
            &models,
            &model,
            &prompts,
            self.a,
            self.b,
            self.max_tokens,
            |r| {
                line(format!(
                    "  prompt {:>3} ({:>5} tokens)  {:<20} logits NMSE {:.3e}",
                    r.index,
                    r.prompt_tokens,
                    r.verdict.to_string(),
                    r.logits_nmse
                ));
                if r.verdict.is_early() {
                    line(format!("      a: {:?}\n      b: {:?}", r.text_a, r.text_b));
                }
            },
        )?;
        line(report.summary());
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        if !report.passed() {
            bail!(
                "{} of {} prompts diverged within the first {EARLY_DIVERGE_TOKENS} tokens",
                report.early_divergences(),
                report.results.len()
            );
        }
        Ok(())
    }
}

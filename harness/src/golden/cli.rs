//! `harness golden check|bless`: one line per case, like llama.cpp's test-backend-ops.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use super::{bless, cases, check, default_dir, Backend, Options, Verdict};
use crate::paths::parse_backend;

/// T=0 goldens: stored greedy outputs of tiny synthetic checkpoints, checked byte for byte.
///
/// The matrix is family × weight format × path × prompt (qwen3 in every format on the default
/// path; qwen3_5 in every format on gdn=perstep and gdn=chunked), each generating a fixed number
/// of tokens at temperature 0 with stop tokens ignored. Checkpoints are synthesised on the fly
/// and cached under target/harness-cache.
///
/// Examples:
///   harness golden check
///   harness golden check --filter qwen3_5:tiny:q4
///   harness golden bless --filter gdn=chunked
///   harness golden check --backend mlx        (a build with --features mlx; goldens/mlx-cpu)
///   harness golden check --backend cuda       (--features cuda on an NVIDIA GPU; goldens/cuda-<gpu>)
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GoldenArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Compare fresh runs with the stored goldens; exits non-zero on any difference.
    Check(Common),
    /// Rewrite the goldens from fresh runs (atomically) and print what changed.
    Bless(Common),
}

#[derive(Debug, Args)]
pub struct Common {
    /// Only cases whose id (SPEC/PATH/PROMPT, e.g. `qwen3:tiny:q4:mlx/default/long`) or file
    /// name contains this text.
    #[arg(long, value_name = "PATTERN")]
    pub filter: Option<String>,

    /// The backend to run on: cpu, mlx (MLX's default device; goldens/mlx-cpu here,
    /// goldens/mlx-gpu on a Mac), metal, or cuda (goldens/cuda-<gpu model>, e.g. cuda-h200).
    /// All but cpu need a build with that feature.
    #[arg(long, value_name = "cpu|mlx|metal|cuda", default_value = "cpu", value_parser = parse_backend)]
    pub backend: Backend,

    /// The golden folder [default: goldens/<backend> in the workspace].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Common {
    fn options(&self) -> Result<Options> {
        // Activate first: which device MLX runs on decides the golden folder.
        self.backend.activate()?;
        Ok(Options {
            backend: self.backend,
            dir: self
                .dir
                .clone()
                .unwrap_or_else(|| default_dir(self.backend)),
            filter: self.filter.clone(),
        })
    }
}

/// The bless command that refreshes `filter`'s cases, for messages.
fn bless_command(c: &Common, filter: Option<&str>) -> String {
    let mut s = String::from("cargo run --release -p harness");
    match c.backend {
        Backend::Cpu => {}
        Backend::Mlx => s.push_str(" --features mlx"),
        Backend::Metal => s.push_str(" --features metal"),
        Backend::Cuda => s.push_str(" --features cuda"),
    }
    s.push_str(" -- golden bless");
    if c.backend != Backend::Cpu {
        s.push_str(&format!(" --backend {}", c.backend));
    }
    if let Some(d) = &c.dir {
        s.push_str(&format!(" --dir {}", d.display()));
    }
    if let Some(f) = filter {
        s.push_str(&format!(" --filter '{f}'"));
    }
    s
}

impl GoldenArgs {
    pub fn run(self) -> Result<()> {
        match self.action {
            Action::Check(c) => run_check(&c),
            Action::Bless(c) => run_bless(&c),
        }
    }
}

fn selected(c: &Common) -> Result<usize> {
    let (n, skipped) = cases::cases(c.filter.as_deref()).map(|(v, s)| (v.len(), s))?;
    for s in skipped {
        println!("  skip  {s}");
    }
    if n == 0 {
        bail!(
            "no golden case matches --filter {:?}; case ids look like qwen3:tiny:q4:mlx/default/short",
            c.filter.as_deref().unwrap_or("")
        );
    }
    Ok(n)
}

fn run_check(c: &Common) -> Result<()> {
    let opts = c.options()?;
    let n = selected(c)?;
    println!("golden check: {n} cases against {}", opts.dir.display());
    let report = check(&opts, |r| {
        let detail = r.verdict.detail();
        let (first, rest) = detail.split_once('\n').unwrap_or((&detail, ""));
        println!("  {:<48} {:<7} {first}", r.case, r.verdict.label());
        if !rest.is_empty() {
            println!("{rest}");
        }
    })?;
    for o in &report.orphans {
        println!(
            "  note  {} belongs to no case (delete it if its case was removed)",
            o.display()
        );
    }
    let failed: Vec<_> = report.failures().collect();
    let passed = report.results.len() - failed.len();
    println!("{passed}/{} golden cases passed", report.results.len());
    if failed.is_empty() {
        return Ok(());
    }
    let stale = failed
        .iter()
        .filter(|r| {
            matches!(
                r.verdict,
                Verdict::Missing | Verdict::CheckpointChanged { .. } | Verdict::CaseChanged(_)
            )
        })
        .count();
    if stale > 0 {
        println!(
            "{stale} golden(s) missing or stale (the model or case changed, not the numerics): run `{}`",
            bless_command(c, c.filter.as_deref())
        );
    }
    bail!(
        "{} of {} golden cases failed",
        failed.len(),
        report.results.len()
    )
}

fn run_bless(c: &Common) -> Result<()> {
    let opts = c.options()?;
    let n = selected(c)?;
    println!("golden bless: {n} cases into {}", opts.dir.display());
    let changes = bless(&opts, |case, _, change| {
        println!("  {:<48} {change}", case.id());
    })?;
    let unchanged = changes
        .iter()
        .filter(|(_, ch)| *ch == super::BlessChange::Unchanged)
        .count();
    println!(
        "{} goldens written, {unchanged} unchanged",
        changes.len() - unchanged
    );
    Ok(())
}

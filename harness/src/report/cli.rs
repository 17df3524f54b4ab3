//! `harness report`: the command-line face of [`compare`](super::compare) and
//! [`write_report`](super::write_report).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use super::{compare, criterion, tables, write_report, Sides};
use crate::sweep::read_jsonl;

/// Turn sweep results into a comparison table, plots and the crossover length (and
/// `harness bench-serve` results into serving tables and plots).
///
/// Rows are joined on model, prompt length and every other recorded key; the table compares
/// the --baseline side with the --compare side (median TTFT and p10–p90, speedup = baseline
/// median / compare median, parity from the output hashes) and shows only the key columns that
/// differ between rows. Writes report.md, report.csv, report.json, ttft.svg/png and
/// speedup.svg/png into --out, and prints the table and the crossover: the smallest prompt
/// length from which the compare side is faster at every longer length.
///
/// --baseline/--compare take a path (gdn=perstep) or DIM=VALUE along another dimension:
/// commit=abc1234 (prefix), machine=EPYC (substring), backend=cpu, label=before.
/// By default they are the first two distinct paths in the files.
///
/// Examples:
///   harness report sweep.jsonl
///   harness report sweep.jsonl --baseline gdn=perstep --compare gdn=chunked --out reports/gdn
///   harness report old.jsonl new.jsonl --baseline commit=1a2b3c --compare commit=4d5e6f
///   harness report --criterion target/criterion
///   harness report bench-serve.jsonl --out reports/serve
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ReportArgs {
    /// Sweep jsonl files (from `harness sweep`).
    #[arg(value_name = "FILES")]
    pub files: Vec<PathBuf>,

    /// The reference side: a path, or DIM=VALUE (DIM: path, commit, machine, backend, label).
    #[arg(long, value_name = "PATH|DIM=VALUE")]
    pub baseline: Option<String>,

    /// The side compared with the baseline (same forms).
    #[arg(long, value_name = "PATH|DIM=VALUE")]
    pub compare: Option<String>,

    /// Also read criterion's results from this folder (e.g. target/criterion).
    #[arg(long, value_name = "DIR")]
    pub criterion: Option<PathBuf>,

    /// Output folder.
    #[arg(long, default_value = "reports/latest", value_name = "DIR")]
    pub out: PathBuf,
}

impl ReportArgs {
    pub fn run(self) -> Result<()> {
        if self.files.is_empty() && self.criterion.is_none() {
            bail!("nothing to report: give sweep jsonl files and/or --criterion DIR");
        }
        let mut rows = Vec::new();
        let mut serve = Vec::new();
        for f in &self.files {
            match crate::bench_serve::read(f)? {
                Some(records) => serve.extend(records),
                None => rows.extend(read_jsonl(f)?),
            }
        }
        if !serve.is_empty() {
            let files = crate::bench_serve::summary::write(&serve, &self.out)?;
            let levels = crate::bench_serve::summary::levels(&serve);
            println!(
                "{}",
                crate::bench_serve::summary::markdown(&levels).trim_end()
            );
            println!();
            println!("wrote {} to {}", files.join(", "), self.out.display());
            if rows.is_empty() && self.criterion.is_none() {
                return Ok(());
            }
        }
        if let Some(dir) = &self.criterion {
            rows.extend(criterion::read_criterion(dir)?);
        }
        let c = compare(
            &rows,
            &Sides {
                baseline: self.baseline,
                compare: self.compare,
            },
        )?;
        let written = write_report(&c, &self.out)?;
        println!("{}", tables::markdown(&c, &[]).trim_end());
        println!();
        println!(
            "wrote {} files to {}",
            written.files.len(),
            written.dir.display()
        );
        Ok(())
    }
}

//! The `harness` command line. Each subcommand's arguments and `run()` live in its module
//! (`harness::<name>::cli`); adding one = one enum variant + one match arm. With no subcommand
//! the main job runs (`harness run` with its defaults).

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "harness",
    version,
    about = "Verification and benchmarks for the engine: synthetic checkpoints, goldens, path parity, \
oracle conformance, TTFT sweeps and reports.",
    long_about = "Verification and benchmarks for the engine.\n\n\
With no subcommand, runs the main job (`harness run`): synthesises the default models, checks the \
goldens, the oracle references and per-step vs chunked parity, runs a short TTFT sweep and writes \
a report to reports/latest/. No download is needed.\n\n\
`--synth SPEC` (parity, sweep) means a synthetic checkpoint made on the fly and cached under \
target/harness-cache: FAMILY[:SIZE[:FORMAT[:LAYOUT]]], e.g. qwen3_5:tiny or qwen3_5:bench:q4."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The main job: goldens, oracle, parity, a short sweep and a report (the default).
    Run(crate::run::RunArgs),
    #[command(after_long_help = crate::synth_cli::families_help())]
    Synth(crate::synth_cli::SynthArgs),
    Golden(crate::golden::cli::GoldenArgs),
    Parity(crate::parity::cli::ParityArgs),
    Sweep(crate::sweep::cli::SweepArgs),
    Report(crate::report::cli::ReportArgs),
    Oracle(crate::oracle::cli::OracleArgs),
    #[command(name = "import-gguf")]
    ImportGguf(crate::import_cli::ImportArgs),
    Quantize(crate::quantize_cli::QuantizeArgs),
    #[command(name = "bench-serve")]
    BenchServe(crate::bench_serve::BenchServeArgs),
}

impl Command {
    pub fn run(self) -> Result<()> {
        match self {
            Command::Run(args) => args.run(),
            Command::Synth(args) => args.run(),
            Command::Golden(args) => args.run(),
            Command::Parity(args) => args.run(),
            Command::Sweep(args) => args.run(),
            Command::Report(args) => args.run(),
            Command::Oracle(args) => args.run(),
            Command::ImportGguf(args) => args.run(),
            Command::Quantize(args) => args.run(),
            Command::BenchServe(args) => args.run(),
        }
    }
}

/// Runs a command given as words after `harness`, exactly as a user would type it.
pub fn run_words(words: &[&str]) -> Result<()> {
    let cli = Cli::try_parse_from(std::iter::once("harness").chain(words.iter().copied()))?;
    match cli.command {
        Some(c) => c.run(),
        None => crate::run::RunArgs::default().run(),
    }
}

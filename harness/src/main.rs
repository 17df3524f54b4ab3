//! `harness`: verification and benchmarks for the engine. Each subcommand lives in its library
//! module (`harness::<name>::cli`); adding one = one enum variant + one match arm.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "harness", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(after_long_help = harness::synth::cli::families_help())]
    Synth(harness::synth::cli::SynthArgs),
    Golden(harness::golden::cli::GoldenArgs),
    Parity(harness::parity::cli::ParityArgs),
    Sweep(harness::sweep::cli::SweepArgs),
    Report(harness::report::cli::ReportArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Synth(args) => args.run(),
        Command::Golden(args) => args.run(),
        Command::Parity(args) => args.run(),
        Command::Sweep(args) => args.run(),
        Command::Report(args) => args.run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! `harness`: verification and benchmarks for the engine (see `harness::cli`).

use std::process::ExitCode;

use clap::Parser;
use harness::cli::Cli;

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Some(command) => command.run(),
        None => harness::run::RunArgs::default().run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

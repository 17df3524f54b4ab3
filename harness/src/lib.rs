//! Verification and benchmarks for the engine: synthetic checkpoints (`synth`), and more.

pub mod backends;
pub mod cli;
pub mod golden;
pub mod machine;
pub mod models;
pub mod oracle;
pub mod parity;
pub mod paths;
pub mod report;
pub mod run;
pub mod sweep;
pub mod synth;

//! Verification and benchmarks for the engine: goldens, path parity, the oracles, TTFT sweeps
//! and reports, on folders the user names or on synthetic checkpoints (the `synth` crate).

pub mod backends;
pub mod bench_serve;
pub mod cli;
pub mod golden;
pub mod import_cli;
pub mod machine;
pub mod models;
pub mod oracle;
pub mod parity;
pub mod paths;
pub mod quantize_cli;
pub mod report;
pub mod run;
pub mod sweep;
pub mod synth_cli;

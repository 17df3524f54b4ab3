//! The harness's integration tests, one module per subject (one test binary, so the suite links
//! once): goldens, the oracles (mlx-lm, real checkpoints), path parity, sweeps and reports.

mod golden;
mod main_job;
mod oracle_synth;
mod parity;
mod quantize;
mod real_checkpoints;
mod real_tokenizers;
mod sweep_report;

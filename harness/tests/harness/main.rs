//! The harness's integration tests, one module per subject (one test binary, so the suite links
//! once): synthetic checkpoints, goldens, the oracle, path parity, sweeps and reports.

mod batch;
mod gdn_properties;
mod gemma4_kv;
mod golden;
mod main_job;
mod malformed_corpus;
mod mtp;
mod oracle_synth;
mod paged_kv;
mod parity;
mod qwen3_5_moe;
mod qwen3_5_paths;
mod qwen3_determinism;
mod real_checkpoints;
mod session;
mod sweep_report;
mod synth;
mod synth_lfm2;
mod synth_qwen3_5;

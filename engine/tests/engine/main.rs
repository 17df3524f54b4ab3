//! The engine's integration tests, one module per subject (one test binary, so the suite links
//! once): loading and its errors, the families' layers against references, sampling, the CLI.

mod cli_batch;
mod cli_chat;
mod cli_determinism;
mod cli_errors;
mod fuzz_loaders;
mod lfm2;
mod loading;
mod mlx_backend;
mod qwen3_5;
mod sampling;

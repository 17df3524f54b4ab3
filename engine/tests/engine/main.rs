//! The engine's integration tests, one module per subject (one test binary, so the suite links
//! once): loading and its errors (malformed folders, fuzzed loaders), each family's layers
//! against references, generation features (sampling, batches, sessions, paged KV, MTP), the CLI.
//! Synthetic checkpoints come from the `synth` crate.

mod batch;
mod cli_batch;
mod cli_chat;
mod cli_determinism;
mod cli_errors;
mod fuzz_loaders;
mod gemma3;
mod gemma4_kv;
mod gguf;
mod lfm2;
mod loading;
mod malformed_corpus;
mod mlx_backend;
mod mtp;
mod paged_kv;
mod qwen3_5;
mod qwen3_5_moe;
mod qwen3_5_paths;
mod qwen3_determinism;
mod sampling;
mod scheduler;
#[cfg(feature = "serve")]
mod serve;
mod session;
mod weights_walk;

//! The MLX backend against the CPU reference (built with `--features mlx`; on MLX's CPU device
//! here, on the GPU with `--features metal`).

#[path = "../common/mod.rs"]
mod common;
mod conformance;
mod gdn;
mod native;

//! The synthetic checkpoints: deterministic bytes, the structure mlx-lm and transformers write
//! for each family and layout, and folders the engine's loaders accept.

mod checkpoints;
mod lfm2;
mod qwen3_5;

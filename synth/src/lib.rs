//! Synthetic checkpoints: complete, deterministic model folders (config, generation config,
//! tokenizer, safetensors) for every family and weight format, written from a seed with no
//! download. The bytes depend only on the [`SynthSpec`] (family, size, format, layout, seed) —
//! not on the machine or the thread count — so goldens recorded on one machine hold on another.
//!
//! ```no_run
//! use synth::{write_checkpoint, SynthSpec, WriteOptions};
//! let spec = SynthSpec::parse("qwen3:tiny:q4:mlx")?;
//! write_checkpoint(&spec, std::path::Path::new("/tmp/qwen3-tiny-q4"), &WriteOptions::default())?;
//! # anyhow::Ok(())
//! ```

pub mod cache;
pub mod families;
pub mod plan;
pub mod rng;
pub mod safetensors_writer;
pub mod spec;
pub mod tokenizer;
mod values;
mod write;

pub use cache::{cache_dir, cached, workspace_root};
pub use spec::{Format, Layout, Size, SynthSpec};
pub use write::{write_checkpoint, WriteOptions, Written};

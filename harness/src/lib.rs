//! Verification and benchmarks for the engine: synthetic checkpoints (`synth`), and more.

pub mod oracle;
pub mod synth;

//! The CUDA backend (built with `--features cuda`): NVRTC compiles of every kernel source, and
//! op conformance against the CPU reference where a GPU is present.

#[path = "../common/mod.rs"]
mod common;
mod conformance;
mod nvrtc;

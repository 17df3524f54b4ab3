//! The kernels crate's integration tests on the CPU backend, one module per subject (one test
//! binary, so the suite links once): every op against references, the matmul formats and
//! instruction sets, quantization, MoE, and the Gated DeltaNet property tests. The MLX and CUDA
//! backends have their own binaries (`mlx`, `cuda`), built only with their feature.

#[path = "../common/mod.rs"]
mod common;
mod gdn_properties;
mod matmul;
mod mlx_quant;
mod moe;
mod ops;
mod quant;

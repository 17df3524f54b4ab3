//! Building blocks shared by the model families. Each holds its weights and calls tensor ops;
//! none of them touch a backend directly.

pub mod attention;
pub mod gated_delta;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod short_conv;

pub use attention::{AttentionConfig, GqaAttention};
pub use gated_delta::{GatedDeltaNet, GdnConfig, GdnPath};
pub use linear::Linear;
pub use mlp::SwiGlu;
pub use moe::{MoeConfig, SparseMoe, StackedExperts};
pub use norm::RmsNorm;
pub use rope::Rope;
pub use short_conv::ShortConv;

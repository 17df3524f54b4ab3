//! Building blocks shared by the model families. Each holds its weights and calls tensor ops;
//! none of them touch a backend directly. Families share layers only through this module.

pub mod attention;
pub mod decoder;
pub mod gated_delta;
pub mod head;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod params;
pub mod rope;
pub mod short_conv;

pub use attention::{AttentionConfig, AttentionSpec, GqaAttention};
pub use decoder::{Decoder, DecoderLayer, Mixer, Mlp};
pub use gated_delta::{GatedDeltaNet, GdnConfig, GdnPath};
pub use head::Tail;
pub use linear::Linear;
pub use mlp::SwiGlu;
pub use moe::{GemmaExperts, MoeConfig, SigmoidMoe, SparseMoe, StackedExperts};
pub use norm::RmsNorm;
pub use params::{Param, Params};
pub use rope::Rope;
pub use short_conv::ShortConv;

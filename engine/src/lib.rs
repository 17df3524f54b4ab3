//! The inference engine: checkpoint loading (`config`, `weights`, `tokenizer`), model families
//! (`models`, built from `layers`; what `engine info` says of them, `info`), per-sequence state (`cache`) and the generation loop
//! (`generate`), multi-turn reuse of that state (`session`). `Pipeline` ties a checkpoint folder
//! together.

pub mod alloc_budget;
pub mod backend;
pub mod cache;
pub mod config;
pub mod files;
pub mod generate;
pub mod gguf;
pub mod info;
pub mod layers;
pub mod models;
pub mod pipeline;
#[cfg(feature = "serve")]
pub mod serve;
pub mod session;
pub mod tokenizer;
pub mod weights;

pub use backend::Backend;
pub use pipeline::{Pipeline, RequestOptions};
pub use session::{Session, Turn};

/// Every program that links the engine counts bytes per budgeted thread (chat templates from
/// checkpoint folders run under a memory budget, see [`alloc_budget`]). A program with an
/// allocator of its own turns off the default feature `alloc-budget`.
#[cfg(feature = "alloc-budget")]
#[global_allocator]
static GLOBAL: alloc_budget::BudgetAlloc = alloc_budget::BudgetAlloc;

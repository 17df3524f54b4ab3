//! What `engine info` says of a model (family, parameters, formats, layer kinds, the sparse
//! share), counted by one walk over its weights ([`crate::layers::params`]).

use anyhow::Result;

use crate::layers::params::{summarize, Params};

/// What `engine info` prints and tools record.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ModelInfo {
    pub family: String,
    pub parameters: usize,
    pub weight_formats: Vec<String>,
    pub layer_kinds: Vec<String>,
    pub context_length: usize,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Sparse families only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeInfo>,
}

/// What a sparse mixture-of-experts model uses per token.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MoeInfo {
    pub experts: usize,
    pub experts_per_token: usize,
    pub expert_width: usize,
    /// 0 when the model has no shared expert.
    pub shared_expert_width: usize,
    /// Parameters a token uses: all but the unselected experts'.
    pub active_parameters: usize,
    /// Bytes of every weight matrix as stored (embedding and head once when tied).
    pub weight_bytes: usize,
    /// Of those, the bytes a decode token reads: all but the unselected experts'.
    pub active_weight_bytes: usize,
}

/// The facts `engine info` prints, from one walk over the model.
pub struct Describe<'a> {
    pub family: &'a str,
    pub layer_kinds: Vec<String>,
    pub context_length: usize,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// (experts, top-k, expert width, shared-expert width) of a sparse model.
    pub moe: Option<(usize, usize, usize, usize)>,
}

impl Describe<'_> {
    pub fn info(self, model: &mut (impl Params + ?Sized)) -> Result<ModelInfo> {
        let s = summarize(model)?;
        // A decode token reads everything but the `E − k` unselected experts of each layer.
        let moe = self.moe.map(|(experts, top_k, expert_width, shared)| {
            let unused = |total: usize| total / experts * (experts - top_k);
            MoeInfo {
                experts,
                experts_per_token: top_k,
                expert_width,
                shared_expert_width: shared,
                active_parameters: s.parameters - unused(s.expert_parameters),
                weight_bytes: s.weight_bytes,
                active_weight_bytes: s.weight_bytes - unused(s.expert_bytes),
            }
        });
        Ok(ModelInfo {
            family: self.family.into(),
            parameters: s.parameters,
            weight_formats: s.formats,
            layer_kinds: self.layer_kinds,
            context_length: self.context_length,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            moe,
        })
    }
}

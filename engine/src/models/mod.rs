//! Model families, one module each, and the registry keyed by config.json's `model_type`.

pub mod gemma3;
pub mod gemma4;
pub mod lfm2;
pub mod llama;
pub mod minicpm;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;

use std::path::Path;

use anyhow::{bail, Result};
use kernels::Tensor;

use crate::cache::ModelState;
use crate::config::ModelConfig;
pub use crate::info::{Describe, ModelInfo, MoeInfo};
use crate::layers::decoder::decode_each;
use crate::layers::params::{params, Params};
use crate::layers::Decoder;
use crate::weights::{Pages, WeightStore};

/// A decoder-only language model: a forward over any number of new tokens that extends a
/// sequence state. Multi-token forwards serve prefill and speculative verification alike.
pub trait CausalLm: Params + Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// A fresh, empty state for one sequence.
    fn new_state(&self) -> ModelState;

    /// Moves every weight to `device` once; forwards then run there (the embedding lookup
    /// puts the activations on the weights' device) and return logits on the host.
    fn to_device(&mut self, device: kernels::Device) -> Result<()> {
        crate::layers::params::to_device(self, device)
    }

    /// Where the weights live (the CPU until `to_device` moves them).
    fn device(&self) -> kernels::Device;

    /// Runs `ids` at positions `state.pos..`, updates the state and returns logits: `[1, V]`
    /// for the last position, or `[T, V]` for every position when `all_logits`.
    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor>;

    /// The model's own draft head for speculative decoding, when its checkpoint has one.
    fn drafter(&self) -> Option<&dyn SelfDrafter> {
        None
    }

    /// One decode step of several sequences: `ids[i]` is the next token of `states[i]`.
    /// Returns the logits `[N, V]` on the host, row `i` equal (bit for bit) to what
    /// [`CausalLm::forward`] of that token alone gives. By default the sequences run one after
    /// another; families that batch (reading each weight once for all rows) override it.
    fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        decode_each(ids, states, |id, s| self.forward(&[id], s, false))
    }
}

/// A model that drafts its own next tokens (Qwen3.5's multi-token-prediction head): the head
/// reads the main model's hidden state at position `t` with the token at `t + 1` and predicts
/// the token at `t + 2`; chained on its own output it drafts further.
pub trait SelfDrafter: Sync {
    /// [`CausalLm::forward`] that also returns the hidden state of every position after the
    /// final norm, `[T, H]` on the model's device.
    fn forward_hidden(
        &self,
        ids: &[u32],
        state: &mut ModelState,
        all_logits: bool,
    ) -> Result<(Tensor, Tensor)>;

    /// [`CausalLm::decode_batch`] that also returns each row's hidden state after the final
    /// norm (`[N, H]`), row `i` equal to [`SelfDrafter::forward_hidden`] of `ids[i]` alone.
    fn decode_batch_hidden(
        &self,
        ids: &[u32],
        states: &mut [&mut ModelState],
    ) -> Result<(Tensor, Tensor)>;

    /// A fresh state for the draft head (its own KV caches).
    fn new_draft_state(&self) -> ModelState;

    /// The head's logits on the host for one row of its own output, over a draft vocabulary:
    /// token ids `0..first` (`first` clamped to the vocabulary), then the ids of `extra` in
    /// order, `[1, min(first, V) + extra.len()]`. Drafts need not come from the whole
    /// vocabulary (verification keeps only what the model agrees with), and the LM head over
    /// all of it costs a third of a plain step on the bench Qwen3.5.
    fn draft_logits(&self, head: &Tensor, first: usize, extra: &[u32]) -> Result<Tensor>;

    /// Runs the head on `ids[i]` paired with row `i` of `hidden` (a hidden state from
    /// [`SelfDrafter::forward_hidden`] or from this head), at draft positions `state.pos..`.
    /// Returns the head's own hidden states `[T, H]` (after its final norm), whose last row
    /// [`SelfDrafter::draft_logits`] turns into a draft.
    fn draft(&self, ids: &[u32], hidden: &Tensor, state: &mut ModelState) -> Result<Tensor>;
}

/// Loads the family named by the folder's config.json, for the CPU backend (weights in huge
/// pages where the machine allows, see [`crate::weights::pages`]).
pub fn load(dir: &Path) -> Result<Box<dyn CausalLm>> {
    load_with(dir, Pages::for_cpu()?)
}

/// [`load`] with the weights' bytes kept as `pages` asks.
pub fn load_with(dir: &Path, pages: Pages) -> Result<Box<dyn CausalLm>> {
    let cfg = ModelConfig::load(dir)?;
    let store = WeightStore::open_with(dir, pages)?;
    from_parts(&cfg, &store)
}

/// The family named by `cfg`, built from `store`'s tensors.
pub fn from_parts(cfg: &ModelConfig, store: &WeightStore) -> Result<Box<dyn CausalLm>> {
    let dir = &cfg.dir;
    match cfg.model_type.as_str() {
        "qwen3" => Ok(Box::new(qwen3::load(cfg, store)?)),
        "qwen2" => Ok(Box::new(qwen2::load(cfg, store)?)),
        "llama" => {
            let llama = llama::Variant {
                family: "llama",
                ..Default::default()
            };
            Ok(Box::new(llama::load(cfg, store, llama)?))
        }
        "minicpm" => Ok(Box::new(minicpm::load(cfg, store)?)),
        // LFM2-MoE is the same backbone with sparse feed-forwards (one loader, see lfm2.rs).
        "lfm2" | "lfm2_moe" => Ok(Box::new(lfm2::load(cfg, store)?)),
        "gemma3" | "gemma3_text" => Ok(Box::new(gemma3::load(cfg, store)?)),
        "gemma4" | "gemma4_text" => Ok(Box::new(gemma4::Gemma4::load(cfg, store)?)),
        // `qwen3_5_text` is the nested text config's type, seen at the root of text-only saves.
        "qwen3_5" | "qwen3_5_text" => Ok(Box::new(qwen3_5::Qwen3_5::load(cfg, store)?)),
        // The same hybrid with sparse MLPs (one loader, see qwen3_5.rs).
        t if qwen3_5::is_moe_type(t) => Ok(Box::new(qwen3_5::Qwen3_5::load(cfg, store)?)),
        other => bail!(
            "{}: field `model_type` = {other:?} is not a supported family (supported: gemma3, gemma4, lfm2, lfm2_moe, llama, minicpm, qwen2, qwen3, qwen3_5, qwen3_5_moe)",
            dir.join("config.json").display()
        ),
    }
}

/// A family that is a plain [`Decoder`] (Llama, Qwen3, MiniCPM, LFM2): the decoder and what
/// `engine info` says of it.
pub struct Dense {
    info: ModelInfo,
    decoder: Decoder,
}

params!(Dense: decoder);

impl Dense {
    /// `dims` is (context length, vocabulary, hidden width); `moe` the sparse widths (experts,
    /// top-k, expert width, shared-expert width) of a sparse model.
    pub fn new(
        family: &str,
        mut decoder: Decoder,
        (context_length, vocab_size, hidden_size): (usize, usize, usize),
        moe: Option<(usize, usize, usize, usize)>,
    ) -> Result<Dense> {
        let info = Describe {
            family,
            layer_kinds: decoder.layer_kinds(),
            context_length,
            vocab_size,
            hidden_size,
            moe,
        }
        .info(&mut decoder)?;
        Ok(Dense { info, decoder })
    }

    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }
}

impl CausalLm for Dense {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        self.decoder.new_state()
    }

    fn device(&self) -> kernels::Device {
        self.decoder.device()
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        self.decoder.forward(ids, state, all_logits)
    }

    fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        self.decoder.decode_batch(ids, states)
    }
}

//! Model families, one module each, and the registry keyed by config.json's `model_type`.

pub mod gemma4;
pub mod lfm2;
pub mod llama;
pub mod minicpm;
pub mod qwen3;
pub mod qwen3_5;

use std::path::Path;

use anyhow::{bail, Result};
use kernels::Tensor;

use crate::cache::ModelState;
use crate::config::ModelConfig;
use crate::weights::{Pages, WeightStore};

/// What `engine info` prints and tools record.
#[derive(Debug, Clone, serde::Serialize)]
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

/// What a decode token reads of a sparse model: everything but the `E − k` unselected experts
/// of each layer (embedding rows are counted whole on both sides). `widths` is (experts, top-k,
/// expert width, shared-expert width); `experts` the stacked expert weights of every layer.
pub(crate) fn moe_info(
    (experts, top_k, expert_width, shared_expert_width): (usize, usize, usize, usize),
    expert_weights: &[&kernels::Weight],
    all: &[&kernels::Weight],
    parameters: usize,
) -> MoeInfo {
    let unused = |total: usize| total / experts * (experts - top_k);
    let expert_params: usize = expert_weights.iter().map(|w| w.numel()).sum();
    let expert_bytes: usize = expert_weights.iter().map(|w| w.stored_bytes()).sum();
    let weight_bytes: usize = all.iter().map(|w| w.stored_bytes()).sum();
    MoeInfo {
        experts,
        experts_per_token: top_k,
        expert_width,
        shared_expert_width,
        active_parameters: parameters - unused(expert_params),
        weight_bytes,
        active_weight_bytes: weight_bytes - unused(expert_bytes),
    }
}

/// Runs `f`, one forward of a model whose weights live on `device`: on the CPU kernels'
/// thread pool for the host (see `kernels::cpu::pool`); other devices keep it on the calling
/// thread, which their contexts are bound to.
pub(crate) fn on_host_pool<R: Send>(device: kernels::Device, f: impl FnOnce() -> R + Send) -> R {
    if device == kernels::Device::Cpu {
        kernels::cpu::pool::on_pool(f)
    } else {
        f()
    }
}

/// A decoder-only language model: a forward over any number of new tokens that extends a
/// sequence state. Multi-token forwards serve prefill and speculative verification alike.
pub trait CausalLm: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// A fresh, empty state for one sequence.
    fn new_state(&self) -> ModelState;

    /// Moves every weight to `device` once; forwards then run there (the embedding lookup
    /// puts the activations on the weights' device) and return logits on the host.
    fn to_device(&mut self, device: kernels::Device) -> Result<()>;

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
        decode_each(self, ids, states)
    }
}

/// [`CausalLm::decode_batch`] one sequence at a time.
pub fn decode_each<M: CausalLm + ?Sized>(
    model: &M,
    ids: &[u32],
    states: &mut [&mut ModelState],
) -> Result<Tensor> {
    anyhow::ensure!(
        ids.len() == states.len() && !ids.is_empty(),
        "a batched decode step needs one token per sequence ({} tokens, {} sequences)",
        ids.len(),
        states.len()
    );
    let rows = ids
        .iter()
        .zip(states.iter_mut())
        .map(|(&id, s)| model.forward(&[id], s, false))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat0(&rows.iter().collect::<Vec<_>>())?)
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

    /// A fresh state for the draft head (its own KV caches).
    fn new_draft_state(&self) -> ModelState;

    /// Runs the head on `ids[i]` paired with row `i` of `hidden` (a hidden state from
    /// [`SelfDrafter::forward_hidden`] or from this head), at draft positions `state.pos..`.
    /// Returns the last row's logits `[1, V]` on the host when `logits` (the LM head is the
    /// costly part, and only the last row drafts) and the head's own hidden states `[T, H]`.
    fn draft(
        &self,
        ids: &[u32],
        hidden: &Tensor,
        state: &mut ModelState,
        logits: bool,
    ) -> Result<(Option<Tensor>, Tensor)>;
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
        "llama" => Ok(Box::new(llama::Llama::load(cfg, store, llama::Variant::LLAMA)?)),
        "minicpm" => Ok(Box::new(minicpm::load(cfg, store)?)),
        // LFM2-MoE is the same backbone with sparse feed-forwards (one loader, see lfm2.rs).
        "lfm2" | "lfm2_moe" => Ok(Box::new(lfm2::Lfm2::load(cfg, store)?)),
        "gemma4" | "gemma4_text" => Ok(Box::new(gemma4::Gemma4::load(cfg, store)?)),
        // `qwen3_5_text` is the nested text config's type, seen at the root of text-only saves.
        "qwen3_5" | "qwen3_5_text" => Ok(Box::new(qwen3_5::Qwen3_5::load(cfg, store)?)),
        // The same hybrid with sparse MLPs (one loader, see qwen3_5.rs).
        t if qwen3_5::is_moe_type(t) => Ok(Box::new(qwen3_5::Qwen3_5::load(cfg, store)?)),
        other => bail!(
            "{}: field `model_type` = {other:?} is not a supported family (supported: gemma4, lfm2, lfm2_moe, llama, minicpm, qwen3, qwen3_5, qwen3_5_moe)",
            dir.join("config.json").display()
        ),
    }
}

/// The shared tail of a decoder: final norm and LM head over the last position, or over every
/// position when `all_logits` (multi-token verification).
pub fn lm_logits(
    x: &Tensor,
    norm: &crate::layers::RmsNorm,
    lm_head: &kernels::Weight,
    all_logits: bool,
) -> Result<Tensor> {
    lm_logits_with(x, norm, lm_head, all_logits, Tail::default())
}

/// What some families add around the LM head.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tail {
    /// Multiplies the normed hidden state before the head (MiniCPM).
    pub scale: Option<f32>,
    /// Soft-caps the logits `c·tanh(x/c)` (Gemma).
    pub softcap: Option<f32>,
}

/// [`lm_logits`] with a family's [`Tail`], applied on the model's device.
pub fn lm_logits_with(
    x: &Tensor,
    norm: &crate::layers::RmsNorm,
    lm_head: &kernels::Weight,
    all_logits: bool,
    tail: Tail,
) -> Result<Tensor> {
    let x = if all_logits {
        x.clone()
    } else {
        x.narrow0(x.dim(0) - 1, 1)?
    };
    head_logits(&x, norm, lm_head, tail, false)
}

/// [`lm_logits_with`] over every row of `x`, each row a separate sequence (a batched decode
/// step): each row's logits equal that row alone.
pub fn lm_logits_rows(
    x: &Tensor,
    norm: &crate::layers::RmsNorm,
    lm_head: &kernels::Weight,
    tail: Tail,
) -> Result<Tensor> {
    head_logits(x, norm, lm_head, tail, true)
}

fn head_logits(
    x: &Tensor,
    norm: &crate::layers::RmsNorm,
    lm_head: &kernels::Weight,
    tail: Tail,
    rows: bool,
) -> Result<Tensor> {
    let mut h = norm.forward(x)?;
    if let Some(s) = tail.scale {
        h = kernels::ops::scale(&h, s)?;
    }
    let mut logits = if rows {
        kernels::ops::matmul_rows(&h, lm_head)?
    } else {
        kernels::ops::matmul(&h, lm_head)?
    };
    if let Some(c) = tail.softcap {
        logits = kernels::ops::softcap(&logits, c)?;
    }
    host_logits(&logits)
}

/// Logits as sampling reads them: f32 on the host (a no-op for host f32 tensors; MLX's native
/// path computes them in bf16, which widens exactly).
pub(crate) fn host_logits(logits: &Tensor) -> Result<Tensor> {
    Ok(logits.to_device(kernels::Device::Cpu)?.to_f32()?)
}

/// Moves a decoder's embedding and LM head to `device`. A tied head is the embedding's own data
/// (a clone sharing its storage): it is uploaded once and stays shared.
pub fn embed_and_head_to_device(
    embed: &mut kernels::Weight,
    lm_head: &mut kernels::Weight,
    device: kernels::Device,
) -> Result<()> {
    let tied = crate::layers::linear::same_weight(embed, lm_head);
    *embed = embed.to_device(device)?;
    *lm_head = if tied {
        embed.clone()
    } else {
        lm_head.to_device(device)?
    };
    Ok(())
}

/// Distinct weight formats of a set of weights, sorted, for `ModelInfo`.
pub fn formats<'a>(weights: impl IntoIterator<Item = &'a kernels::Weight>) -> Vec<String> {
    let mut f: Vec<String> = weights.into_iter().map(|w| w.format_name()).collect();
    f.sort();
    f.dedup();
    f
}

//! The pre-norm decoder most families are: an embedding, layers of `x + mixer(norm(x))` then
//! `x + mlp(norm(x))`, a final norm and the LM head. Families differ in the mixer (attention,
//! Gated DeltaNet, short convolution), the MLP (dense or sparse) and a few scales; they build a
//! [`Decoder`] from their config and tensors and let it run.

use anyhow::{ensure, Result};
use kernels::{ops, Tensor, Weight};

use super::head::{self, Tail};
use super::params::{params, Params, Visit};
use super::{GatedDeltaNet, GqaAttention, RmsNorm, ShortConv, SigmoidMoe, SparseMoe, SwiGlu};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::layers::GdnPath;

/// Token mixer of one decoder layer. One per layer, so the variants' size difference costs
/// nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Mixer {
    Attention(GqaAttention),
    /// Gated DeltaNet linear attention (Qwen3.5).
    Linear(GatedDeltaNet),
    /// Gated short convolution (LFM2).
    Conv(ShortConv),
}

impl Mixer {
    /// The empty state of this layer for a new sequence. Sliding attention rotates: its
    /// memory is bounded by the window.
    pub fn new_state(&self) -> LayerState {
        match self {
            Mixer::Attention(a) => {
                let c = &a.cfg;
                LayerState::Kv(KvCache::for_layer(c.kv_heads, c.head_dim, c.window))
            }
            Mixer::Linear(g) => LayerState::Recurrent(g.cfg.new_state()),
            Mixer::Conv(c) => LayerState::Conv(c.new_state()),
        }
    }

    /// The name `engine info` lists for this layer.
    pub fn kind(&self) -> String {
        match self {
            Mixer::Attention(a) => match a.cfg.window {
                None => "full_attention".into(),
                Some(w) => format!("sliding_attention({w})"),
            },
            Mixer::Linear(_) => "linear_attention".into(),
            Mixer::Conv(_) => "conv".into(),
        }
    }
}

impl Params for Mixer {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        match self {
            Mixer::Attention(a) => a.params(f),
            Mixer::Linear(g) => g.params(f),
            Mixer::Conv(c) => c.params(f),
        }
    }
}

/// The MLP of a decoder layer.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Mlp {
    Dense(SwiGlu),
    /// The same three projections with a tanh-GELU gate (Gemma).
    GeGlu(SwiGlu),
    /// Softmax-routed experts with an optional shared expert (Qwen3.5-MoE).
    Sparse(SparseMoe),
    /// Sigmoid-routed experts (LFM2-MoE).
    Sigmoid(SigmoidMoe),
}

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Dense(m) => m.forward(x),
            Mlp::GeGlu(m) => m.forward_gelu(x),
            Mlp::Sparse(m) => m.forward(x),
            Mlp::Sigmoid(m) => m.forward(x),
        }
    }

    /// [`Mlp::forward`] for rows of separate sequences, each equal to its row alone: dense
    /// MLPs batch the rows; sparse ones run row by row (rows sharing an expert would otherwise
    /// meet in one larger expert matmul, which rounds differently).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Dense(m) => m.forward_rows(x),
            Mlp::GeGlu(m) => m.forward_rows_gelu(x),
            _ => {
                let rows = (0..x.dim(0))
                    .map(|i| self.forward(&x.narrow0(i, 1)?))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Tensor::cat0(&rows.iter().collect::<Vec<_>>())?)
            }
        }
    }
}

impl Params for Mlp {
    fn params(&mut self, f: &mut Visit<'_>) -> Result<()> {
        match self {
            Mlp::Dense(m) | Mlp::GeGlu(m) => m.params(f),
            Mlp::Sparse(m) => m.params(f),
            Mlp::Sigmoid(m) => m.params(f),
        }
    }
}

/// One pre-norm decoder layer: `x + mixer(norm(x))`, then `x + mlp(norm(x))`; Gemma's
/// sandwich norms also norm each branch's output before its residual add.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub mixer: Mixer,
    pub post_norm: RmsNorm,
    pub mlp: Mlp,
    /// Multiplies both branches before their residual add (MiniCPM's depth scale).
    pub residual_scale: Option<f32>,
    /// Norms of the mixer's and the MLP's outputs (Gemma's `post_attention_layernorm` and
    /// `post_feedforward_layernorm`; `post_norm` is then its `pre_feedforward_layernorm`).
    pub sandwich: Option<[RmsNorm; 2]>,
}

params!(DecoderLayer: input_norm, mixer, post_norm, mlp, sandwich);

impl DecoderLayer {
    pub fn forward(&self, x: &Tensor, state: &mut LayerState, gdn: GdnPath) -> Result<Tensor> {
        let h = self.input_norm.forward(x)?;
        let h = match &self.mixer {
            Mixer::Attention(a) => a.forward(&h, state.kv_mut()?)?,
            Mixer::Linear(g) => g.forward(&h, state.recurrent_mut()?, gdn)?,
            Mixer::Conv(c) => c.forward(&h, state.conv_mut()?)?,
        };
        let x = self.residual(x, h, 0)?;
        let h = self.mlp.forward(&self.post_norm.forward(&x)?)?;
        self.residual(&x, h, 1)
    }

    /// One decode step of several sequences (row `i` of `x` is sequence `i`'s token, `states`
    /// their states of this layer); each row equals that sequence's [`DecoderLayer::forward`].
    fn forward_batch(
        &self,
        x: &Tensor,
        states: &mut [&mut ModelState],
        i: usize,
    ) -> Result<Tensor> {
        let h = self.input_norm.forward(x)?;
        let h = match &self.mixer {
            Mixer::Attention(a) => {
                let mut c = states
                    .iter_mut()
                    .map(|s| s.layers[i].kv_mut())
                    .collect::<Result<Vec<_>>>()?;
                a.forward_batch(&h, &mut c)?
            }
            Mixer::Linear(g) => {
                let path = states[0].gdn_path;
                let mut r = states
                    .iter_mut()
                    .map(|s| s.layers[i].recurrent_mut())
                    .collect::<Result<Vec<_>>>()?;
                g.forward_batch(&h, &mut r, path)?
            }
            Mixer::Conv(c) => {
                let mut st = states
                    .iter_mut()
                    .map(|s| s.layers[i].conv_mut())
                    .collect::<Result<Vec<_>>>()?;
                c.forward_batch(&h, &mut st)?
            }
        };
        let x = self.residual(x, h, 0)?;
        let h = self.mlp.forward_rows(&self.post_norm.forward(&x)?)?;
        self.residual(&x, h, 1)
    }

    /// `x + branch`, the branch (0: mixer, 1: MLP) normed and scaled as the family asks.
    fn residual(&self, x: &Tensor, branch: Tensor, which: usize) -> Result<Tensor> {
        let h = match &self.sandwich {
            Some(norms) => norms[which].forward(&branch)?,
            None => branch,
        };
        Ok(ops::add(x, &scaled(h, self.residual_scale)?)?)
    }
}

/// `x · s` when a scale is set.
fn scaled(x: Tensor, s: Option<f32>) -> Result<Tensor> {
    Ok(match s {
        Some(s) => ops::scale(&x, s)?,
        None => x,
    })
}

/// Embedding, layers, final norm and LM head.
#[derive(Debug, Clone)]
pub struct Decoder {
    pub embed: Weight,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// The embedding itself (a clone sharing its data) when tied.
    pub lm_head: Weight,
    /// Multiplies the embedding output (MiniCPM's `scale_emb`).
    pub embed_scale: Option<f32>,
    pub tail: Tail,
}

params!(Decoder: embed, layers, norm, lm_head);

impl Decoder {
    /// A fresh, empty state for one sequence.
    pub fn new_state(&self) -> ModelState {
        ModelState::new(self.layers.iter().map(|l| l.mixer.new_state()).collect())
    }

    pub fn device(&self) -> kernels::Device {
        self.embed.device()
    }

    pub fn layer_kinds(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.mixer.kind()).collect()
    }

    /// The residual stream `[T, H]` after every layer, before the final norm.
    pub fn hidden(&self, ids: &[u32], state: &mut ModelState) -> Result<Tensor> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        self.check_state(state)?;
        let path = state.gdn_path;
        let mut x = scaled(ops::embedding(&self.embed, ids)?, self.embed_scale)?;
        for (layer, ls) in self.layers.iter().zip(state.layers.iter_mut()) {
            x = layer.forward(&x, ls, path)?;
        }
        state.pos += ids.len();
        state.settle()?;
        Ok(x)
    }

    /// Logits of the last position (`[1, V]`), or of every position when `all_logits`.
    pub fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        let x = self.hidden(ids, state)?;
        head::logits(&x, &self.norm, &self.lm_head, all_logits, self.tail)
    }

    fn check_state(&self, state: &ModelState) -> Result<()> {
        ensure!(
            state.layers.len() == self.layers.len(),
            "the state has {} layers but the model {} (a state from another model?)",
            state.layers.len(),
            self.layers.len()
        );
        Ok(())
    }

    /// Whether a decode step of several sequences can read each weight once for all rows:
    /// on the CPU, with every sequence on one Gated DeltaNet path.
    fn batches(&self, ids: &[u32], states: &[&mut ModelState]) -> bool {
        batches_on_cpu(self.device(), ids, states, self.layers.len())
            && states.windows(2).all(|w| w[0].gdn_path == w[1].gdn_path)
    }

    /// One decode step of several sequences, `[N, V]` logits with row `i` equal (bit for bit)
    /// to `forward` of `ids[i]` alone: the dense projections and MLPs read each weight once for
    /// all rows; attention, the delta rule and the experts run per sequence. Elsewhere the
    /// sequences run one by one.
    pub fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        if !self.batches(ids, states) {
            return decode_each(ids, states, |id, s| self.forward(&[id], s, false));
        }
        let x = self.batch_rows(ids, states)?;
        head::logits_rows(&x, &self.norm, &self.lm_head, self.tail)
    }

    /// [`Decoder::decode_batch`] that also gives each row's hidden state after the final norm
    /// (`[N, H]`, what a draft head reads); where the rows cannot run together, `each` runs
    /// one sequence's token and gives its logits and hidden row.
    pub fn decode_batch_hidden(
        &self,
        ids: &[u32],
        states: &mut [&mut ModelState],
        mut each: impl FnMut(u32, &mut ModelState) -> Result<(Tensor, Tensor)>,
    ) -> Result<(Tensor, Tensor)> {
        if !self.batches(ids, states) {
            let mut hidden = Vec::with_capacity(ids.len());
            let logits = decode_each(ids, states, |id, s| {
                let (logits, h) = each(id, s)?;
                hidden.push(h);
                Ok(logits)
            })?;
            return Ok((logits, Tensor::cat0(&hidden.iter().collect::<Vec<_>>())?));
        }
        let x = self.batch_rows(ids, states)?;
        head::logits_rows_hidden(&x, &self.norm, &self.lm_head, self.tail)
    }

    /// The batched decode step up to the final norm: row `i` is sequence `i`'s output.
    fn batch_rows(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        let mut x = scaled(ops::embedding(&self.embed, ids)?, self.embed_scale)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward_batch(&x, states, i)?;
        }
        for s in states.iter_mut() {
            s.pos += 1;
            s.settle()?;
        }
        Ok(x)
    }
}

/// Whether a decode step of `ids` over `states` can run its rows together: on the CPU (the
/// rows are stacked and split on the host), two or more sequences, one token each, every
/// state of a model with `layers` layers.
pub fn batches_on_cpu(
    device: kernels::Device,
    ids: &[u32],
    states: &[&mut ModelState],
    layers: usize,
) -> bool {
    device == kernels::Device::Cpu
        && ids.len() == states.len()
        && ids.len() >= 2
        && states.iter().all(|s| s.layers.len() == layers)
}

/// A batched decode step one sequence at a time: `step(ids[i], states[i])` gives row `i`.
pub fn decode_each(
    ids: &[u32],
    states: &mut [&mut ModelState],
    mut step: impl FnMut(u32, &mut ModelState) -> Result<Tensor>,
) -> Result<Tensor> {
    ensure!(
        ids.len() == states.len() && !ids.is_empty(),
        "a batched decode step needs one token per sequence ({} tokens, {} sequences)",
        ids.len(),
        states.len()
    );
    let rows = ids
        .iter()
        .zip(states.iter_mut())
        .map(|(&id, s)| step(id, s))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat0(&rows.iter().collect::<Vec<_>>())?)
}

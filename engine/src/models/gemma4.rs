//! Gemma 4 text (`gemma4` with a nested `text_config`, or `gemma4_text`), dense and MoE.
//!
//! Facts checked against mlx-lm 0.32.2 (`gemma4_text.py`, `gemma4.py`, `rope_utils.py`):
//! - layer kinds from `layer_types`, else `sliding_window_pattern` (p − 1 sliding, then one
//!   full); sliding layers attend to the last `sliding_window` positions;
//! - full layers may have their own head dim (`global_head_dim`), KV heads
//!   (`num_global_key_value_heads` with `attention_k_eq_v`, where V is K's projection) and RoPE:
//!   `rope_parameters.{full,sliding}_attention`, the full one "proportional" — frequencies
//!   `factor·θ^(2i/head_dim)` on the first `partial_rotary_factor·head_dim / 2` pairs of the
//!   half-split head, the other pairs unrotated;
//! - attention scale 1; q and k RMSNorm per head, v RMSNorm without a weight;
//! - the last `num_kv_shared_layers` layers compute no K/V: each reads the cache of the last
//!   earlier layer of its kind, and has a double-wide MLP when `use_double_wide_mlp`;
//! - sandwich norms around attention and MLP; GeGLU (tanh GELU) MLP; `layer_scalar` multiplies
//!   each layer's output;
//! - per-layer inputs (`hidden_size_per_layer_input`): a per-layer embedding table plus a
//!   projection of the scaled embeddings, normed and mixed, gate each layer's output;
//! - embeddings × √hidden, tied head, logits soft-capped `c·tanh(x/c)`.
//! - the MoE variant (`enable_moe_block`): a routed expert branch beside the dense MLP (see
//!   [`GemmaExperts`](crate::layers::moe::GemmaExperts)).
//!
//! Names: `language_model.model.*` in mlx-lm folders, `model.language_model.*` in original
//! multimodal ones, `model.*` in text-only ones ([`Layout`]). Original folders keep
//! K/V projections on the KV-shared layers; they are unused and not loaded, as mlx-lm drops them.
//! Sliding layers keep a rotating cache (`KvCache::rotating`: at most 2 × the window between
//! forwards), full layers a flat one.

use anyhow::{ensure, Context, Result};
use kernels::{ops, ops::AttnParams, Tensor, Weight};

use super::Describe;
use super::{CausalLm, ModelInfo};
use crate::cache::{KvCache, LayerState, ModelState};
use crate::config::ModelConfig;
use crate::layers::decoder::{batches_on_cpu, decode_each};
use crate::layers::params::params;
use crate::layers::{head, GemmaExperts, Linear, RmsNorm, Rope, Tail};
use crate::weights::{Layout, Scope, WeightStore};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sliding,
    Full,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Sliding => "sliding_attention",
            Kind::Full => "full_attention",
        }
    }
}

struct Attention {
    q_proj: Linear,
    /// `None` on KV-shared layers.
    kv: Option<KvProj>,
    o_proj: Linear,
    q_norm: RmsNorm,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    eps: f32,
}

struct KvProj {
    k_proj: Linear,
    /// `None` when V is K's projection (`attention_k_eq_v` on full layers).
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
}

/// The per-layer input gate of the E2B/E4B-style models.
struct PerLayerGate {
    input_gate: Linear,
    projection: Linear,
    post_norm: RmsNorm,
}

params!(Attention: q_proj, kv, o_proj, q_norm);
params!(KvProj: k_proj, v_proj, k_norm);
params!(PerLayerGate: input_gate, projection, post_norm);

struct Block {
    attn: Attention,
    /// Index of the layer whose cache this one reads (itself unless KV-shared).
    kv_source: usize,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ffn_norm: RmsNorm,
    post_ffn_norm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    per_layer: Option<PerLayerGate>,
    layer_scalar: Option<f32>,
    moe: Option<GemmaExperts>,
}

params!(Block: attn, input_norm, post_attn_norm, pre_ffn_norm, post_ffn_norm, gate_proj, up_proj, down_proj, per_layer, layer_scalar, moe);

/// Layer `i` under `s`. KV-shared layers load no K/V projections (original folders keep them,
/// unused; mlx-lm drops them).
fn block(
    cfg: &ModelConfig,
    s: &Scope,
    a: &Args,
    i: usize,
    per_layer: Option<&PerLayerInputs>,
) -> Result<Block> {
    let full = a.kinds[i] == Kind::Full;
    let (hd, kvh) = if full { a.full } else { a.sliding };
    let hidden = a.hidden;
    let at = s.pp("self_attn");
    let kv = if i < a.first_shared {
        Some(KvProj {
            k_proj: at.pp("k_proj").linear(kvh * hd, hidden)?,
            v_proj: match full && a.k_eq_v {
                true => None,
                false => Some(at.pp("v_proj").linear(kvh * hd, hidden)?),
            },
            k_norm: at.pp("k_norm").norm(hd, a.eps)?,
        })
    } else {
        None
    };
    let width = match i >= a.first_shared && a.double_wide {
        true => 2 * a.inter,
        false => a.inter,
    };
    let layer_scalar = match s.contains("layer_scalar") {
        true => Some(s.finite_values("layer_scalar", &[1])?[0]),
        false => None,
    };
    let per_layer = match per_layer {
        Some(pl) => Some(PerLayerGate {
            input_gate: s.pp("per_layer_input_gate").linear(pl.width, hidden)?,
            projection: s.pp("per_layer_projection").linear(hidden, pl.width)?,
            post_norm: s.pp("post_per_layer_input_norm").norm(hidden, a.eps)?,
        }),
        None => None,
    };
    let norm = |name: &str| s.pp(name).norm(hidden, a.eps);
    let mlp = s.pp("mlp");
    Ok(Block {
        attn: Attention {
            q_proj: at.pp("q_proj").linear(a.heads * hd, hidden)?,
            kv,
            o_proj: at.pp("o_proj").linear(hidden, a.heads * hd)?,
            q_norm: at.pp("q_norm").norm(hd, a.eps)?,
            rope: rope_for(cfg, a.kinds[i], hd)?,
            heads: a.heads,
            kv_heads: kvh,
            head_dim: hd,
            window: (!full).then_some(a.window),
            eps: a.eps,
        },
        kv_source: a.kv_source[i],
        input_norm: norm("input_layernorm")?,
        post_attn_norm: norm("post_attention_layernorm")?,
        pre_ffn_norm: norm("pre_feedforward_layernorm")?,
        post_ffn_norm: norm("post_feedforward_layernorm")?,
        gate_proj: mlp.pp("gate_proj").linear(width, hidden)?,
        up_proj: mlp.pp("up_proj").linear(width, hidden)?,
        down_proj: mlp.pp("down_proj").linear(hidden, width)?,
        per_layer,
        layer_scalar,
        moe: match a.moe {
            Some((e, k, w)) => Some(GemmaExperts::load(s, (hidden, e, k, w, a.eps))?),
            None => None,
        },
    })
}

/// The model-level half of the per-layer inputs.
struct PerLayerInputs {
    embed: Weight,
    model_projection: Linear,
    projection_norm: RmsNorm,
    width: usize,
}

params!(PerLayerInputs: embed, model_projection, projection_norm);

pub struct Gemma4 {
    info: ModelInfo,
    embed: Weight,
    blocks: Vec<Block>,
    norm: RmsNorm,
    per_layer: Option<PerLayerInputs>,
    softcap: Option<f32>,
    hidden: usize,
}

params!(Gemma4: embed, blocks, norm, per_layer);

fn layer_kinds(cfg: &ModelConfig, layers: usize) -> Result<Vec<Kind>> {
    let kinds = [
        ("sliding_attention", Kind::Sliding),
        ("full_attention", Kind::Full),
    ];
    if let Some(kinds) = cfg.layer_types(layers, &kinds)? {
        return Ok(kinds);
    }
    let pattern = cfg.usize_in_or(
        "sliding_window_pattern",
        5,
        1..=crate::config::limits::MAX_LAYERS,
    )?;
    Ok((0..layers)
        .map(|i| {
            if (i + 1).is_multiple_of(pattern) {
                Kind::Full
            } else {
                Kind::Sliding
            }
        })
        .collect())
}

/// The RoPE of one layer kind from `rope_parameters.<kind>`, with mlx-lm's defaults where
/// absent: full layers proportional over a quarter of the head at θ = 1e6, sliding ones plain
/// at θ = 1e4.
fn rope_for(cfg: &ModelConfig, kind: Kind, head_dim: usize) -> Result<Rope> {
    let defaults = match kind {
        Kind::Full => (1e6, "proportional", 0.25),
        Kind::Sliding => (1e4, "default", 1.0),
    };
    Rope::of_kind(cfg, kind.name(), head_dim, defaults)
}

/// config.json (inside `text_config` when nested), read once.
struct Args {
    hidden: usize,
    heads: usize,
    /// (head dim, KV heads) of sliding and of full layers.
    sliding: (usize, usize),
    full: (usize, usize),
    k_eq_v: bool,
    inter: usize,
    vocab: usize,
    eps: f32,
    context: usize,
    kinds: Vec<Kind>,
    window: usize,
    first_shared: usize,
    double_wide: bool,
    softcap: Option<f32>,
    /// (experts, top-k, expert width) of the MoE variant.
    moe: Option<(usize, usize, usize)>,
    /// Per layer, the layer whose cache it reads (itself unless KV-shared).
    kv_source: Vec<usize>,
}

impl Args {
    fn read(cfg: &ModelConfig) -> Result<Args> {
        let file = cfg.path();
        let hidden = cfg.width("hidden_size")?;
        let layers = cfg.layer_count("num_hidden_layers")?;
        let heads = cfg.width("num_attention_heads")?;
        let kv_heads = cfg.width_or("num_key_value_heads", 1)?;
        let head_dim = cfg.width("head_dim")?;
        let global_head_dim = cfg.width_or("global_head_dim", head_dim)?;
        let k_eq_v = cfg.bool_or("attention_k_eq_v", false)?;
        let global_kv_heads = if k_eq_v {
            cfg.width_or("num_global_key_value_heads", kv_heads)?
        } else {
            kv_heads
        };
        let inter = cfg.width("intermediate_size")?;
        let vocab = cfg.vocab_size()?;
        let eps = cfg.rms_norm_eps(1e-6)?;
        let context = cfg.context_length(131_072)?;
        let kinds = layer_kinds(cfg, layers)?;
        let window = cfg.width_or("sliding_window", 512)?;
        let shared = cfg.usize_in_or("num_kv_shared_layers", 0, 0..=layers - 1)?;
        let double_wide = cfg.bool_or("use_double_wide_mlp", true)?;
        let softcap = match cfg.opt("final_logit_softcapping") {
            None => None,
            Some(_) => Some(cfg.f64_where(
                "final_logit_softcapping",
                30.0,
                "a positive number",
                |x| x > 0.0,
            )? as f32),
        };
        for (h, kv, what) in [
            (heads, kv_heads, "num_key_value_heads"),
            (heads, global_kv_heads, "num_global_key_value_heads"),
        ] {
            ensure!(
                h % kv == 0,
                "{}: field `num_attention_heads` ({h}) must be a multiple of `{what}` ({kv})",
                file.display()
            );
        }
        for (d, what) in [(head_dim, "head_dim"), (global_head_dim, "global_head_dim")] {
            ensure!(
                d % 2 == 0,
                "{}: field `{what}` ({d}) must be even",
                file.display()
            );
        }
        let moe = if cfg.bool_or("enable_moe_block", false)? {
            let experts = cfg.width("num_experts")?;
            let top_k = cfg.usize_in("top_k_experts", 1..=experts)?;
            Some((experts, top_k, cfg.width("moe_intermediate_size")?))
        } else {
            None
        };
        let first_shared = layers - shared;
        // A shared layer reads the last non-shared layer of its kind.
        let mut kv_source: Vec<usize> = (0..layers).collect();
        for j in first_shared..layers {
            kv_source[j] = (0..first_shared)
            .rev()
            .find(|&i| kinds[i] == kinds[j])
            .with_context(|| {
                format!(
                    "{}: layer {j} shares the KV of an earlier {} layer, and there is none before layer {first_shared} (`num_kv_shared_layers` = {shared})",
                    file.display(),
                    kinds[j].name()
                )
            })?;
        }
        Ok(Args {
            hidden,
            heads,
            sliding: (head_dim, kv_heads),
            full: (global_head_dim, global_kv_heads),
            k_eq_v,
            inter,
            vocab,
            eps,
            context,
            kinds,
            window,
            first_shared,
            double_wide,
            softcap,
            moe,
            kv_source,
        })
    }
}

impl Gemma4 {
    pub fn load(cfg: &ModelConfig, store: &WeightStore) -> Result<Gemma4> {
        let a = Args::read(cfg)?;
        let layout = Layout::detect(store)?;
        let m = Scope::new(store, &cfg.quant).pp(layout.model_prefix());
        let per_layer = if m.contains("embed_tokens_per_layer.weight") {
            let width = cfg.width("hidden_size_per_layer_input")?;
            let rows = cfg.width_or("vocab_size_per_layer_input", a.vocab)?;
            let wide = a
                .kinds
                .len()
                .checked_mul(width)
                .filter(|&w| w <= crate::config::limits::MAX_WIDTH)
                .with_context(|| {
                    format!(
                        "{}: `num_hidden_layers` × `hidden_size_per_layer_input` is too large",
                        cfg.path().display()
                    )
                })?;
            Some(PerLayerInputs {
                embed: m.pp("embed_tokens_per_layer").weight(rows, wide)?,
                model_projection: m.pp("per_layer_model_projection").linear(wide, a.hidden)?,
                projection_norm: m.pp("per_layer_projection_norm").norm(width, a.eps)?,
                width,
            })
        } else {
            None
        };
        let blocks = (0..a.kinds.len())
            .map(|i| block(cfg, &m.pp("layers").pp(i), &a, i, per_layer.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let head = format!("{}.weight", layout.lm_head());
        ensure!(
            !store.contains(&head),
            "{}: Gemma 4 ties its head to the embedding, but `{head}` is stored",
            store.dir().display(),
        );
        let mut model = Gemma4 {
            info: Default::default(),
            embed: m.pp("embed_tokens").weight(a.vocab, a.hidden)?,
            blocks,
            norm: m.pp("norm").norm(a.hidden, a.eps)?,
            per_layer,
            softcap: a.softcap,
            hidden: a.hidden,
        };
        let layer_kinds = model
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut s = match b.attn.window {
                    Some(w) => format!("sliding_attention({w})"),
                    None => "full_attention".to_string(),
                };
                if b.kv_source != i {
                    s.push_str(&format!(" kv-shared from {}", b.kv_source));
                }
                s
            })
            .collect();
        model.info = Describe {
            family: "gemma4",
            layer_kinds,
            context_length: a.context,
            vocab_size: a.vocab,
            hidden_size: a.hidden,
            moe: a.moe.map(|(e, k, w)| (e, k, w, 0)),
        }
        .info(&mut model)?;
        Ok(model)
    }

    /// Each layer's `[T, width]` input from the per-layer tables and the scaled embeddings.
    fn per_layer_inputs(
        &self,
        ids: &[u32],
        h: &Tensor,
        seqs: &Seqs,
    ) -> Result<Option<Vec<Tensor>>> {
        let Some(pl) = &self.per_layer else {
            return Ok(None);
        };
        let (t, l, w) = (ids.len(), self.blocks.len(), pl.width);
        let table = ops::scale(&ops::embedding(&pl.embed, ids)?, (w as f32).sqrt())?;
        let proj = ops::scale(
            &seqs.linear(&pl.model_projection, h)?,
            (self.hidden as f32).powf(-0.5),
        )?;
        let proj = pl.projection_norm.forward(&proj.reshape(&[t, l, w])?)?;
        let mixed = ops::scale(
            &ops::add(&proj, &table.reshape(&[t, l, w])?)?,
            std::f32::consts::FRAC_1_SQRT_2,
        )?;
        (0..l)
            .map(|i| Ok(mixed.narrow(1, i, 1)?.reshape(&[t, w])?))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The sequences a forward's rows belong to: `T` positions of one sequence from its `pos`, or
/// one new token per sequence (a batched decode step, row `i` for `states[i]`). Positions
/// advance only when the forward ends.
enum Seqs<'a, 'b> {
    One(&'a mut ModelState),
    Batch(&'a mut [&'b mut ModelState]),
}

impl Seqs<'_, '_> {
    /// `l` applied to `x`: for a batch each row as its own sequence (`Linear::forward_rows`,
    /// the bits of that row alone).
    fn linear(&self, l: &Linear, x: &Tensor) -> Result<Tensor> {
        match self {
            Seqs::One(_) => l.forward(x),
            Seqs::Batch(_) => l.forward_rows(x),
        }
    }
}

impl Attention {
    /// Appends this step's K/V to each sequence's cache of layer `source` (unless the layer
    /// is KV-shared, when that is the source layer's cache, already holding them) and attends
    /// over it.
    fn forward(&self, x: &Tensor, source: usize, seqs: &mut Seqs) -> Result<Tensor> {
        let q = seqs.linear(&self.q_proj, x)?;
        let kv = match &self.kv {
            Some(kv) => {
                let k = seqs.linear(&kv.k_proj, x)?;
                let v = match &kv.v_proj {
                    Some(v) => seqs.linear(v, x)?,
                    None => k.clone(),
                };
                Some((kv, k, v))
            }
            None => None,
        };
        let o = match seqs {
            Seqs::One(state) => {
                let start = state.pos;
                self.attend(q, kv, start, state.layers[source].kv_mut()?)?
            }
            Seqs::Batch(states) => {
                let outs = states
                    .iter_mut()
                    .enumerate()
                    .map(|(i, st)| {
                        let row = |t: &Tensor| t.narrow0(i, 1);
                        let kv = match &kv {
                            Some((p, k, v)) => Some((*p, row(k)?, row(v)?)),
                            None => None,
                        };
                        let start = st.pos;
                        self.attend(row(&q)?, kv, start, st.layers[source].kv_mut()?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat0(&outs.iter().collect::<Vec<_>>())?
            }
        };
        seqs.linear(&self.o_proj, &o)
    }

    /// One sequence's positions `start..`: q `[T, heads·D]` and, unless KV-shared, the raw K
    /// and V projections; returns the attention output `[T, heads·D]` before `o_proj`.
    fn attend(
        &self,
        q: Tensor,
        kv: Option<(&KvProj, Tensor, Tensor)>,
        start: usize,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let t = q.dim(0);
        let positions: Vec<usize> = (start..start + t).collect();
        let q = q.reshape(&[t, self.heads, self.head_dim])?;
        let q = self.rope.forward(&self.q_norm.forward(&q)?, &positions)?;
        if let Some((p, k, v)) = kv {
            let shape = [t, self.kv_heads, self.head_dim];
            let k = self
                .rope
                .forward(&p.k_norm.forward(&k.reshape(&shape)?)?, &positions)?;
            let v = ops::rms_norm(&v.reshape(&shape)?, None, self.eps)?;
            cache.append(&k, &v)?;
        }
        let p = AttnParams {
            q_start: 0,
            kv_len: 0,
            scale: 1.0,
            window: self.window,
            softcap: None,
        };
        Ok(cache
            .attend(&q, start, p)?
            .reshape(&[t, self.heads * self.head_dim])?)
    }
}

impl Block {
    /// Layer `i` over `x` (`per_layer`: its per-layer input rows).
    fn forward(&self, x: &Tensor, per_layer: Option<&Tensor>, seqs: &mut Seqs) -> Result<Tensor> {
        let h = self
            .attn
            .forward(&self.input_norm.forward(x)?, self.kv_source, seqs)?;
        let mut x = ops::add(x, &self.post_attn_norm.forward(&h)?)?;
        let m = self.pre_ffn_norm.forward(&x)?;
        let g = ops::gelu_tanh(&seqs.linear(&self.gate_proj, &m)?)?;
        let h = seqs.linear(
            &self.down_proj,
            &ops::mul(&g, &seqs.linear(&self.up_proj, &m)?)?,
        )?;
        let h = match (&self.moe, &seqs) {
            (None, _) => h,
            (Some(moe), Seqs::One(_)) => moe.forward(&x, &h)?,
            // Row by row: rows sharing an expert would otherwise meet in one larger expert
            // matmul, which rounds differently.
            (Some(moe), Seqs::Batch(_)) => {
                let rows = (0..x.dim(0))
                    .map(|i| moe.forward(&x.narrow0(i, 1)?, &h.narrow0(i, 1)?))
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat0(&rows.iter().collect::<Vec<_>>())?
            }
        };
        x = ops::add(&x, &self.post_ffn_norm.forward(&h)?)?;
        if let (Some(g), Some(input)) = (&self.per_layer, per_layer) {
            let gate = ops::gelu_tanh(&seqs.linear(&g.input_gate, &x)?)?;
            let gate = seqs.linear(&g.projection, &ops::mul(&gate, input)?)?;
            x = ops::add(&x, &g.post_norm.forward(&gate)?)?;
        }
        if let Some(s) = self.layer_scalar {
            x = ops::scale(&x, s)?;
        }
        Ok(x)
    }
}

impl Gemma4 {
    /// The layers over `ids`' embeddings, then the soft-capped logits of the last row, or of
    /// every row when `all_rows` (a batch's rows are all wanted).
    fn run(&self, ids: &[u32], mut seqs: Seqs, all_rows: bool) -> Result<Tensor> {
        let mut x = ops::scale(
            &ops::embedding(&self.embed, ids)?,
            (self.hidden as f32).sqrt(),
        )?;
        let per_layer = self.per_layer_inputs(ids, &x, &seqs)?;
        for (i, b) in self.blocks.iter().enumerate() {
            x = b.forward(&x, per_layer.as_ref().map(|p| &p[i]), &mut seqs)?;
        }
        let tail = Tail {
            softcap: self.softcap,
            ..Default::default()
        };
        match seqs {
            Seqs::One(state) => {
                state.pos += ids.len();
                state.settle()?;
                head::logits(&x, &self.norm, &self.embed, all_rows, tail)
            }
            Seqs::Batch(states) => {
                for s in states.iter_mut() {
                    s.pos += 1;
                    s.settle()?;
                }
                head::logits_rows(&x, &self.norm, &self.embed, tail)
            }
        }
    }
}

impl CausalLm for Gemma4 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> ModelState {
        // Sliding layers rotate (memory bounded by the window), full layers keep every
        // position; KV-shared layers keep an empty cache: they read their source layer's.
        ModelState::new(
            self.blocks
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let window = b.attn.window.filter(|_| b.kv_source == i);
                    LayerState::Kv(KvCache::for_layer(b.attn.kv_heads, b.attn.head_dim, window))
                })
                .collect(),
        )
    }

    fn device(&self) -> kernels::Device {
        self.embed.device()
    }

    fn forward(&self, ids: &[u32], state: &mut ModelState, all_logits: bool) -> Result<Tensor> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        self.run(ids, Seqs::One(state), all_logits)
    }

    /// The dense projections and MLPs read each weight once for all rows; attention and the
    /// experts run per sequence. Row `i` equals `forward` of `ids[i]` alone.
    fn decode_batch(&self, ids: &[u32], states: &mut [&mut ModelState]) -> Result<Tensor> {
        if !batches_on_cpu(self.device(), ids, states, self.blocks.len()) {
            return decode_each(ids, states, |id, s| self.forward(&[id], s, false));
        }
        self.run(ids, Seqs::Batch(states), true)
    }
}

//! Qwen3.5 dense (`Qwen3_5ForConditionalGeneration`, text model only): Gated DeltaNet linear
//! attention in three of every four layers, gated full attention in the fourth, SwiGLU MLPs.
//!
//! The two layouts differ in more than names, so a loader must really handle both:
//! - `hf` (the published checkpoint): `model.language_model.*`, top-level `lm_head.weight` and
//!   `mtp.*` (the multi-token-prediction head); conv1d as PyTorch stores it, `[C, 1, K]`; the
//!   1-D RMSNorm weights of the decoder and of the MTP head stored as `w − 1` (transformers'
//!   `Qwen3_5RMSNorm` computes `x̂ · (1 + w)`), but not Gated DeltaNet's gated output norm, which is
//!   the multiplier itself; `A_log` and that gated norm in float32 even in bf16 folders (as the
//!   published Qwen3.5-0.8B stores them).
//! - `mlx` (what `mlx_lm.convert` writes): `language_model.model.*`, `language_model.lm_head`,
//!   no `mtp.*`; conv1d `[C, K, 1]`; every norm the multiplier; `A_log` float32 (mlx-lm's
//!   `cast_predicate`), everything else in the folder's dtype; `rope_parameters.rope_type` renamed
//!   to `type` (mlx-lm's `TextModelArgs` renames it in place before `save_config`).
//!
//! Both layouts of one seed hold the same model: values are drawn under the mlx name, and a norm's
//! offset form is drawn from the same noise as its multiplier form.
//!
//! The same writer makes Qwen3.5/3.6 MoE (`qwen3_5_moe`): every MLP is a sparse block — router
//! `mlp.gate`, routed experts and a shared expert with its `shared_expert_gate` — stored as
//! mlx-lm writes it (`mlp.switch_mlp.{gate,up,down}_proj` `[E, out, in]`; router and shared-expert
//! gate at 8 bits in quantized folders, listed in `quantization`) or as the original checkpoint
//! has it (`mlp.experts.gate_up_proj` `[E, 2·I, H]`, `mlp.experts.down_proj` `[E, H, I]`).

use anyhow::Result;
use serde_json::{json, Value};

use super::qwen3::qwen_tokenizer;
use crate::plan::{Init, ModelPlan, Store, TensorPlan};
use crate::spec::{insert_8bit_overrides, insert_quantization, Layout, Size, SynthSpec};

/// `moe: false` is Qwen3.5 dense, `true` Qwen3.5/3.6 MoE.
pub struct Qwen3_5 {
    pub moe: bool,
}

struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    /// Every `interval`-th layer is full attention.
    interval: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Gated DeltaNet: key heads, value heads, their dims and the conv kernel.
    k_heads: usize,
    v_heads: usize,
    k_dim: usize,
    v_dim: usize,
    conv_kernel: usize,
    vocab: usize,
    tied: bool,
    max_positions: usize,
    /// The vision tower described by `vision_config` (no weights are written for it).
    vision: VisionDims,
    /// The sparse MLP of the MoE family (`intermediate` is then unused).
    moe: Option<MoeDims>,
}

struct MoeDims {
    experts: usize,
    top_k: usize,
    expert_width: usize,
    shared_width: usize,
}

struct VisionDims {
    depth: usize,
    hidden: usize,
    heads: usize,
    intermediate: usize,
}

fn dims(size: Size, moe: bool) -> Dims {
    if moe {
        return moe_dims(size);
    }
    match size {
        Size::Tiny => Dims {
            hidden: 128,
            intermediate: 256,
            layers: 4,
            interval: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            k_heads: 2,
            v_heads: 4,
            k_dim: 32,
            v_dim: 32,
            conv_kernel: 4,
            vocab: 1024,
            tied: false,
            max_positions: 4096,
            vision: VisionDims {
                depth: 1,
                hidden: 64,
                heads: 2,
                intermediate: 128,
            },
            moe: None,
        },
        // Qwen3.5-0.8B's text model (Qwen/Qwen3.5-0.8B config.json, text_config): 24 layers, full
        // attention at 3, 7, …, 23; 16 key and 16 value heads of 128 in the linear layers; 8
        // query / 2 KV heads of 256 in the full ones; tied embedding of 248320 rows.
        Size::Bench => Dims {
            hidden: 1024,
            intermediate: 3584,
            layers: 24,
            interval: 4,
            heads: 8,
            kv_heads: 2,
            head_dim: 256,
            k_heads: 16,
            v_heads: 16,
            k_dim: 128,
            v_dim: 128,
            conv_kernel: 4,
            vocab: 248_320,
            tied: true,
            max_positions: 262_144,
            vision: VisionDims {
                depth: 12,
                hidden: 768,
                heads: 12,
                intermediate: 3072,
            },
            moe: None,
        },
    }
}

fn moe_dims(size: Size) -> Dims {
    match size {
        // Four layers like the dense tiny model; 8 experts of width 64, 2 routed per token.
        Size::Tiny => Dims {
            moe: Some(MoeDims {
                experts: 8,
                top_k: 2,
                expert_width: 64,
                shared_width: 64,
            }),
            ..dims(Size::Tiny, false)
        },
        // Qwen3.5-35B-A3B's per-token widths (transformers' `Qwen3_5MoeTextConfig` defaults are
        // that checkpoint's): hidden 2048; 16 query / 2 KV heads of 256; 16 key / 32 value
        // linear heads of 128; experts of width 512, 8 routed per token, a shared expert of 512;
        // untied head of 248320 rows. Cut to 8 layers (full attention at 3 and 7) and 64 of its
        // 256 experts, so the q4 folder is about 1.6 GB.
        Size::Bench => Dims {
            hidden: 2048,
            intermediate: 0,
            layers: 8,
            interval: 4,
            heads: 16,
            kv_heads: 2,
            head_dim: 256,
            k_heads: 16,
            v_heads: 32,
            k_dim: 128,
            v_dim: 128,
            conv_kernel: 4,
            vocab: 248_320,
            tied: false,
            max_positions: 262_144,
            vision: VisionDims {
                depth: 27,
                hidden: 1152,
                heads: 16,
                intermediate: 4304,
            },
            moe: Some(MoeDims {
                experts: 64,
                top_k: 8,
                expert_width: 512,
                shared_width: 512,
            }),
        },
    }
}

impl Dims {
    fn is_full_attention(&self, layer: usize) -> bool {
        (layer + 1).is_multiple_of(self.interval)
    }

    /// Channels of the depthwise conv: q, k (`Hk·Dk` each) and v (`Hv·Dv`).
    fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    fn rotary_dims(&self) -> usize {
        (self.head_dim as f64 * PARTIAL_ROTARY) as usize
    }
}

const PARTIAL_ROTARY: f64 = 0.25;
const ROPE_THETA: u64 = 10_000_000;

/// Standard deviation of the logits (see the Qwen3 family): peaky enough that greedy decoding
/// rarely meets near-ties, not so peaky that sampling sees a single candidate.
const LOGIT_STD: f32 = 5.0;

/// Noise on RMSNorm weights around 1 (large enough that a loader forgetting the `+1` of the hf
/// layout's offset norms produces clearly different logits).
const NORM_NOISE: f32 = 0.1;

/// Depthwise conv taps ~ N(0, 0.5²): about 1/√K, so the conv keeps the scale of its input.
const CONV_STD: f32 = 0.5;

/// Gain of the projections that write into the residual stream (`o_proj`, `out_proj`,
/// `down_proj`) over 1/√fan_in, so each layer's contribution is comparable to the embedding and
/// the token mixers (the recurrent state above all) visibly shape the output.
const RESIDUAL_GAIN: f32 = 4.0;

/// Per value head `A = exp(A_log)`; the step's log decay is `−A · softplus(a + dt_bias)`. The
/// heads of a layer span A from 0.002 (state kept over thousands of steps) to 60 (log decay often
/// below −104, where `exp` underflows f32: forgotten at once), log-spaced, rotated per layer.
const A_MIN: f64 = 0.002;
const A_MAX: f64 = 60.0;

/// `dt_bias` per value head from −1 to 1.5: `softplus(dt_bias)` from about 0.3 to 1.7.
const DT_BIAS: (f32, f32) = (-1.0, 1.5);

const SPECIALS: [&str; 7] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
];

const TRANSFORMERS_VERSION: &str = "4.57.1";

/// Router gain over 1/√hidden: router logits of std ~2 keep the top-k choice clear of
/// near-ties, so two implementations that round differently pick the same experts.
const ROUTER_GAIN: f32 = 2.0;

impl super::Family for Qwen3_5 {
    fn name(&self) -> &'static str {
        if self.moe {
            "qwen3_5_moe"
        } else {
            "qwen3_5"
        }
    }

    fn about(&self) -> &'static str {
        if self.moe {
            "Qwen3.5/3.6 MoE, the Qwen3.5 hybrid with sparse expert MLPs (tiny: 4 layers, 8 experts, top-2; bench: Qwen3.5-35B-A3B widths, 8 layers, 64 experts); hf layout includes mtp.*"
        } else {
            "Qwen3.5 dense, Gated DeltaNet + gated attention (tiny: 4 layers, hidden 128; bench: Qwen3.5-0.8B widths); hf layout includes mtp.*"
        }
    }

    fn plan(&self, spec: &SynthSpec, layout: Layout) -> Result<ModelPlan> {
        let d = dims(spec.size, self.moe);
        let tokenizer = qwen_tokenizer(d.vocab, &SPECIALS, d.max_positions);
        let id = |t: &str| {
            tokenizer
                .special_id(t)
                .expect("Qwen3.5's specials are in the plan")
        };
        let ids = SpecialIds {
            endoftext: id("<|endoftext|>"),
            im_end: id("<|im_end|>"),
            vision_start: id("<|vision_start|>"),
            vision_end: id("<|vision_end|>"),
            image_pad: id("<|image_pad|>"),
            video_pad: id("<|video_pad|>"),
        };
        let mut config = config(&d, spec, layout, &ids);
        insert_quantization(&mut config, spec.format);
        if d.moe.is_some() {
            insert_moe_overrides(&mut config, &d);
        }
        let generation_config = json!({
            "bos_token_id": ids.endoftext,
            "do_sample": true,
            "eos_token_id": [ids.im_end, ids.endoftext],
            "pad_token_id": ids.endoftext,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": TRANSFORMERS_VERSION,
        });
        Ok(ModelPlan {
            config,
            generation_config,
            tokenizer,
            tensors: tensors(&d, layout),
        })
    }
}

struct SpecialIds {
    endoftext: u32,
    im_end: u32,
    vision_start: u32,
    vision_end: u32,
    image_pad: u32,
    video_pad: u32,
}

/// `mrope_section` splits the rotary half-dims over (time, height, width) like Qwen's configs:
/// [11, 11, 10] for 64 rotary dims. For text all three positions are equal, so it is plain RoPE.
fn mrope_section(rotary_dims: usize) -> [usize; 3] {
    let half = rotary_dims / 2;
    let a = half.div_ceil(3);
    [a, a, half - 2 * a]
}

/// mlx-lm's MoE `quant_predicate` keeps each router and shared-expert gate at 8 bits.
fn insert_moe_overrides(config: &mut Value, d: &Dims) {
    let modules: Vec<String> = (0..d.layers)
        .flat_map(|l| {
            ["gate", "shared_expert_gate"]
                .map(|m| format!("language_model.model.layers.{l}.mlp.{m}"))
        })
        .collect();
    insert_8bit_overrides(config, &modules);
}

/// config.json as the published checkpoint has it (keys sorted, as transformers writes them), or
/// as `mlx_lm.convert` rewrites it (the same content, `rope_type` renamed to `type`; the writer
/// sorts the top level and the family's caller adds `quantization`).
fn config(d: &Dims, spec: &SynthSpec, layout: Layout, ids: &SpecialIds) -> Value {
    let layer_types: Vec<&str> = (0..d.layers)
        .map(|i| {
            if d.is_full_attention(i) {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    let mut rope = json!({
        "mrope_interleaved": true,
        "mrope_section": mrope_section(d.rotary_dims()),
        "partial_rotary_factor": PARTIAL_ROTARY,
        "rope_theta": ROPE_THETA,
    });
    let rope_type_key = match layout {
        Layout::Hf => "rope_type",
        Layout::Mlx => "type",
    };
    rope.as_object_mut()
        .expect("a JSON object")
        .insert(rope_type_key.into(), json!("default"));
    let mut text = json!({
        "attention_bias": false,
        "attention_dropout": 0.0,
        "attn_output_gate": true,
        "bos_token_id": ids.endoftext,
        "dtype": spec.format.torch_dtype(),
        "eos_token_id": ids.endoftext,
        "full_attention_interval": d.interval,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "hidden_size": d.hidden,
        "initializer_range": 0.02,
        "intermediate_size": d.intermediate,
        "layer_types": layer_types,
        "linear_conv_kernel_dim": d.conv_kernel,
        "linear_key_head_dim": d.k_dim,
        "linear_num_key_heads": d.k_heads,
        "linear_num_value_heads": d.v_heads,
        "linear_value_head_dim": d.v_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": d.max_positions,
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": false,
        "num_attention_heads": d.heads,
        "num_hidden_layers": d.layers,
        "num_key_value_heads": d.kv_heads,
        "pad_token_id": null,
        "partial_rotary_factor": PARTIAL_ROTARY,
        "rms_norm_eps": 1e-6,
        "rope_parameters": rope,
        "tie_word_embeddings": d.tied,
        "use_cache": true,
        "vocab_size": d.vocab,
    });
    let (architecture, model_type) = match &d.moe {
        None => ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
        Some(m) => {
            let t = text.as_object_mut().expect("a JSON object");
            t.remove("intermediate_size");
            t.insert("model_type".into(), json!("qwen3_5_moe_text"));
            t.insert("moe_intermediate_size".into(), json!(m.expert_width));
            t.insert("num_experts".into(), json!(m.experts));
            t.insert("num_experts_per_tok".into(), json!(m.top_k));
            t.insert("router_aux_loss_coef".into(), json!(0.001));
            t.insert(
                "shared_expert_intermediate_size".into(),
                json!(m.shared_width),
            );
            ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
        }
    };
    let v = &d.vision;
    json!({
        "architectures": [architecture],
        "image_token_id": ids.image_pad,
        "model_type": model_type,
        "text_config": text,
        "tie_word_embeddings": d.tied,
        "transformers_version": TRANSFORMERS_VERSION,
        "video_token_id": ids.video_pad,
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": v.depth,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": v.hidden,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": v.intermediate,
            "model_type": model_type,
            "num_heads": v.heads,
            "num_position_embeddings": 2304,
            "out_hidden_size": d.hidden,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": ids.vision_end,
        "vision_start_token_id": ids.vision_start,
    })
}

/// Collects the tensors under the layout's names, each drawn under its mlx name.
struct Tensors<'a> {
    d: &'a Dims,
    layout: Layout,
    out: Vec<TensorPlan>,
}

impl Tensors<'_> {
    /// A tensor of the text model; `path` is relative to the decoder (`layers.0.mlp...`), or
    /// `lm_head.weight`.
    fn text(&mut self, path: &str, shape: &[usize], init: Init, store: Store) {
        let mlx = match path {
            "lm_head.weight" => format!("language_model.{path}"),
            _ => format!("language_model.model.{path}"),
        };
        let name = match (self.layout, path) {
            (Layout::Mlx, _) => mlx.clone(),
            (Layout::Hf, "lm_head.weight") => path.to_string(),
            (Layout::Hf, _) => format!("model.language_model.{path}"),
        };
        self.out
            .push(TensorPlan::new(name, shape, init, store).seeded_as(mlx));
    }

    /// A tensor that exists only in the hf layout (the MTP head), under its own name.
    fn hf_only(&mut self, name: &str, shape: &[usize], init: Init, store: Store) {
        self.out.push(TensorPlan::new(name, shape, init, store));
    }

    fn push(&mut self, name: &str, shape: &[usize], init: Init, store: Store) {
        if name.starts_with("mtp.") {
            self.hf_only(name, shape, init, store);
        } else {
            self.text(name, shape, init, store);
        }
    }

    fn linear_with_gain(&mut self, name: &str, out: usize, inp: usize, gain: f32) {
        let std = gain / (inp as f32).sqrt();
        self.push(name, &[out, inp], Init::normal(std), Store::Matrix);
    }

    fn linear(&mut self, name: &str, out: usize, inp: usize) {
        self.linear_with_gain(name, out, inp, 1.0);
    }

    /// A projection that writes into the residual stream.
    fn residual(&mut self, name: &str, out: usize, inp: usize) {
        self.linear_with_gain(name, out, inp, RESIDUAL_GAIN);
    }

    /// A `Qwen3_5RMSNorm` weight: the multiplier in mlx folders, the offset from 1 in hf ones
    /// (the same noise either way).
    fn decoder_norm(&mut self, name: &str, n: usize) {
        let mean = match self.layout {
            Layout::Mlx => 1.0,
            Layout::Hf => 0.0,
        };
        self.push(name, &[n], Init::around(mean, NORM_NOISE), Store::Float);
    }

    /// Attention or MTP decoder layer at `p` (e.g. `layers.3` or `mtp.layers.0`): gated full
    /// attention + MLP.
    fn full_attention_layer(&mut self, p: &str) {
        let d = self.d;
        let (q_dim, kv_dim) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        // q_proj yields [query | gate] per head.
        self.linear(&format!("{p}.self_attn.q_proj.weight"), 2 * q_dim, d.hidden);
        self.linear(&format!("{p}.self_attn.k_proj.weight"), kv_dim, d.hidden);
        self.linear(&format!("{p}.self_attn.v_proj.weight"), kv_dim, d.hidden);
        self.residual(&format!("{p}.self_attn.o_proj.weight"), d.hidden, q_dim);
        self.decoder_norm(&format!("{p}.self_attn.q_norm.weight"), d.head_dim);
        self.decoder_norm(&format!("{p}.self_attn.k_norm.weight"), d.head_dim);
    }

    fn linear_attention(&mut self, p: &str, gdn_index: usize) {
        let d = self.d;
        let value_dim = d.v_heads * d.v_dim;
        let a = format!("{p}.linear_attn");
        self.linear(&format!("{a}.in_proj_qkv.weight"), d.conv_dim(), d.hidden);
        self.linear(&format!("{a}.in_proj_z.weight"), value_dim, d.hidden);
        self.linear(&format!("{a}.in_proj_b.weight"), d.v_heads, d.hidden);
        self.linear(&format!("{a}.in_proj_a.weight"), d.v_heads, d.hidden);
        self.residual(&format!("{a}.out_proj.weight"), d.hidden, value_dim);
        let conv_shape = match self.layout {
            Layout::Hf => [d.conv_dim(), 1, d.conv_kernel],
            Layout::Mlx => [d.conv_dim(), d.conv_kernel, 1],
        };
        self.push(
            &format!("{a}.conv1d.weight"),
            &conv_shape,
            Init::normal(CONV_STD),
            Store::Float,
        );
        self.push(
            &format!("{a}.A_log"),
            &[d.v_heads],
            Init::Ramp {
                start: A_MIN.ln() as f32,
                end: A_MAX.ln() as f32,
                shift: gdn_index,
            },
            Store::F32,
        );
        self.push(
            &format!("{a}.dt_bias"),
            &[d.v_heads],
            Init::Ramp {
                start: DT_BIAS.0,
                end: DT_BIAS.1,
                shift: 3 * gdn_index + 1,
            },
            Store::Float,
        );
        // The gated output norm is the multiplier in both layouts; the published checkpoint
        // keeps it in float32.
        let norm_store = match self.layout {
            Layout::Hf => Store::F32,
            Layout::Mlx => Store::Float,
        };
        self.push(
            &format!("{a}.norm.weight"),
            &[d.v_dim],
            Init::around(1.0, NORM_NOISE),
            norm_store,
        );
    }

    fn mlp_and_norms(&mut self, p: &str) {
        let d = self.d;
        self.decoder_norm(&format!("{p}.input_layernorm.weight"), d.hidden);
        self.decoder_norm(&format!("{p}.post_attention_layernorm.weight"), d.hidden);
        if let Some(m) = &d.moe {
            self.sparse_mlp(&format!("{p}.mlp"), m);
            return;
        }
        self.linear(
            &format!("{p}.mlp.gate_proj.weight"),
            d.intermediate,
            d.hidden,
        );
        self.linear(&format!("{p}.mlp.up_proj.weight"), d.intermediate, d.hidden);
        self.residual(
            &format!("{p}.mlp.down_proj.weight"),
            d.hidden,
            d.intermediate,
        );
    }
}

impl Tensors<'_> {
    /// A sparse MoE block at `p` (`layers.N.mlp` or `mtp.layers.0.mlp`).
    fn sparse_mlp(&mut self, p: &str, m: &MoeDims) {
        let (h, e, i) = (self.d.hidden, m.experts, m.expert_width);
        let std = |gain: f32, fan_in: usize| gain / (fan_in as f32).sqrt();
        self.push(
            &format!("{p}.gate.weight"),
            &[e, h],
            Init::normal(std(ROUTER_GAIN, h)),
            Store::Matrix8,
        );
        // Experts: drawn under the MLX names; the original layout fuses gate and up.
        let mlx = |proj: &str| self.mlx_name(&format!("{p}.switch_mlp.{proj}.weight"));
        match self.layout {
            Layout::Mlx => {
                for (proj, shape, gain) in [
                    ("gate_proj", [e, i, h], 1.0),
                    ("up_proj", [e, i, h], 1.0),
                    ("down_proj", [e, h, i], RESIDUAL_GAIN),
                ] {
                    self.push(
                        &format!("{p}.switch_mlp.{proj}.weight"),
                        &shape,
                        Init::normal(std(gain, shape[2])),
                        Store::Matrix,
                    );
                }
            }
            Layout::Hf => {
                let (gate, up, down) = (mlx("gate_proj"), mlx("up_proj"), mlx("down_proj"));
                let fused = TensorPlan::new(
                    self.hf_name(&format!("{p}.experts.gate_up_proj")),
                    &[e, 2 * i, h],
                    Init::normal(std(1.0, h)),
                    Store::Matrix,
                )
                .fused_from(gate, up);
                self.out.push(fused);
                let down = TensorPlan::new(
                    self.hf_name(&format!("{p}.experts.down_proj")),
                    &[e, h, i],
                    Init::normal(std(RESIDUAL_GAIN, i)),
                    Store::Matrix,
                )
                .seeded_as(down);
                self.out.push(down);
            }
        }
        let s = format!("{p}.shared_expert");
        self.linear(&format!("{s}.gate_proj.weight"), m.shared_width, h);
        self.linear(&format!("{s}.up_proj.weight"), m.shared_width, h);
        self.residual(&format!("{s}.down_proj.weight"), h, m.shared_width);
        self.push(
            &format!("{p}.shared_expert_gate.weight"),
            &[1, h],
            Init::normal(std(1.0, h)),
            Store::Matrix8,
        );
    }

    /// The name a decoder path (or an `mtp.*` name) has in the MLX layout, which seeds values.
    fn mlx_name(&self, path: &str) -> String {
        if path.starts_with("mtp.") {
            path.to_string()
        } else {
            format!("language_model.model.{path}")
        }
    }

    /// The name a decoder path (or an `mtp.*` name) has in the original layout.
    fn hf_name(&self, path: &str) -> String {
        if path.starts_with("mtp.") {
            path.to_string()
        } else {
            format!("model.language_model.{path}")
        }
    }
}

fn tensors(d: &Dims, layout: Layout) -> Vec<TensorPlan> {
    let mut t = Tensors {
        d,
        layout,
        out: Vec::new(),
    };
    let logit_std = LOGIT_STD / (d.hidden as f32).sqrt();
    // A tied embedding doubles as the lm_head, so it takes the lm_head's scale; an untied one
    // gets unit entries (its scale is normalised away by the first RMSNorm anyway).
    let embed_std = if d.tied { logit_std } else { 1.0 };
    t.push(
        "embed_tokens.weight",
        &[d.vocab, d.hidden],
        Init::normal(embed_std),
        Store::Matrix,
    );
    t.decoder_norm("norm.weight", d.hidden);
    if !d.tied {
        t.push(
            "lm_head.weight",
            &[d.vocab, d.hidden],
            Init::normal(logit_std),
            Store::Matrix,
        );
    }
    let mut gdn_index = 0;
    for l in 0..d.layers {
        let p = format!("layers.{l}");
        if d.is_full_attention(l) {
            t.full_attention_layer(&p);
        } else {
            t.linear_attention(&p, gdn_index);
            gdn_index += 1;
        }
        t.mlp_and_norms(&p);
    }
    // mlx-lm drops the MTP head when converting; the published checkpoint has one layer.
    if layout == Layout::Hf {
        t.linear("mtp.fc.weight", d.hidden, 2 * d.hidden);
        t.decoder_norm("mtp.pre_fc_norm_embedding.weight", d.hidden);
        t.decoder_norm("mtp.pre_fc_norm_hidden.weight", d.hidden);
        t.full_attention_layer("mtp.layers.0");
        t.mlp_and_norms("mtp.layers.0");
        t.decoder_norm("mtp.norm.weight", d.hidden);
    }
    t.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mrope_section_matches_published_configs() {
        // Qwen3.5 (head_dim 256, 64 rotary dims): [11, 11, 10].
        assert_eq!(mrope_section(64), [11, 11, 10]);
        assert_eq!(mrope_section(16), [3, 3, 2]);
    }

    #[test]
    fn layer_pattern_is_three_linear_then_one_full() {
        let d = dims(Size::Bench, false);
        let full: Vec<usize> = (0..d.layers).filter(|&i| d.is_full_attention(i)).collect();
        assert_eq!(full, [3, 7, 11, 15, 19, 23]);
    }
}

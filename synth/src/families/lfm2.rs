//! LFM2 (`Lfm2ForCausalLM`): gated short-convolution blocks with a few GQA attention blocks
//! between them, SwiGLU feed-forwards (`w1`, `w3`, `w2`) of the auto-adjusted width, pre-norms
//! `operator_norm` / `ffn_norm`, final `embedding_norm`, tied head.
//!
//! The layouts share every tensor name (`model.*`) and value; they differ where real folders do:
//! - `hf` (the published checkpoint): the conv weight as PyTorch stores it, `[C, 1, K]`;
//!   config.json lists the layer kinds as `layer_types` (as the current hub configs do);
//! - `mlx` (what `mlx_lm.convert` writes): the conv weight `[C, K, 1]` (mlx-lm's `sanitize`);
//!   config.json lists them as `full_attn_idxs` (as folders converted from the first LFM2
//!   releases do, whose configs mlx-lm copies), so the loader meets both forms.
//!
//! The same writer makes LFM2-MoE (`lfm2_moe`, `Lfm2MoeForCausalLM`): the first
//! `num_dense_layers` feed-forwards dense (width `intermediate_size`, not adjusted), the rest a
//! sigmoid router `feed_forward.gate` (8-bit in quantized folders, as mlx-lm's
//! `quant_predicate` keeps it), an f32 `expert_bias` and SwiGLU experts: one tensor per expert
//! (`experts.{e}.w1/w3/w2`) in `hf`, stacked `switch_mlp.{gate,up,down}_proj` `[E, out, in]`
//! and the dense `w1/w3/w2` renamed `gate_proj/up_proj/down_proj` in `mlx` (mlx-lm's
//! `sanitize`). Both layouts draw every value under the `hf` name, so they hold one model.

use anyhow::Result;
use serde_json::{json, Value};

use crate::plan::{Init, ModelPlan, Store, TensorPlan};
use crate::spec::{insert_8bit_overrides, insert_quantization, Layout, Size, SynthSpec};
use crate::tokenizer::TokenizerPlan;

/// `moe: false` is LFM2, `true` LFM2-MoE.
pub struct Lfm2 {
    pub moe: bool,
}

/// LFM2-MoE's sparse feed-forwards.
struct MoeDims {
    /// Layers `0..dense_layers` keep a dense feed-forward of width `dense_width`.
    dense_layers: usize,
    dense_width: usize,
    experts: usize,
    top_k: usize,
    expert_width: usize,
}

struct Dims {
    hidden: usize,
    /// `block_ff_dim` before the auto-adjustment.
    block_ff_dim: usize,
    multiple_of: usize,
    layers: usize,
    attention_layers: &'static [usize],
    heads: usize,
    kv_heads: usize,
    conv_kernel: usize,
    vocab: usize,
    max_positions: usize,
    moe: Option<MoeDims>,
}

fn dims(size: Size, moe: bool) -> Dims {
    if moe {
        return moe_dims(size);
    }
    match size {
        // Conv, attention, conv, attention: both mixers, each after the other kind.
        Size::Tiny => Dims {
            hidden: 128,
            block_ff_dim: 384,
            multiple_of: 64,
            layers: 4,
            attention_layers: &[1, 3],
            heads: 4,
            kv_heads: 2,
            conv_kernel: 3,
            vocab: 1024,
            max_positions: 4096,
            moe: None,
        },
        // LFM2-350M (LiquidAI/LFM2-350M config.json): 16 layers, attention at 2, 5, 8, 10, 12,
        // 14; 16 query / 8 KV heads of 64; feed-forward 6656 → 4608; tied 65536-row embedding.
        Size::Bench => Dims {
            hidden: 1024,
            block_ff_dim: 6656,
            multiple_of: 256,
            layers: 16,
            attention_layers: &[2, 5, 8, 10, 12, 14],
            heads: 16,
            kv_heads: 8,
            conv_kernel: 3,
            vocab: 65_536,
            max_positions: 128_000,
            moe: None,
        },
    }
}

fn moe_dims(size: Size) -> Dims {
    match size {
        // The tiny LFM2 with a dense first layer, then 8 experts of width 64, 2 per token.
        Size::Tiny => Dims {
            moe: Some(MoeDims {
                dense_layers: 1,
                dense_width: 256,
                experts: 8,
                top_k: 2,
                expert_width: 64,
            }),
            ..dims(Size::Tiny, false)
        },
        // LFM2-8B-A1B (LiquidAI/LFM2-8B-A1B config.json): hidden 2048; 32 query / 8 KV heads of
        // 64; dense feed-forward 7168 in the first 2 layers; 32 experts of width 1792, 4 per
        // token, expert bias; tied 65536-row embedding. Its 24 layers (attention at 2, 6, 10,
        // 14, 18, 21) are cut to the first 8 (attention at 2 and 6), so the q4 folder is about
        // 1.4 GB.
        Size::Bench => Dims {
            hidden: 2048,
            block_ff_dim: 7168,
            multiple_of: 256,
            layers: 8,
            attention_layers: &[2, 6],
            heads: 32,
            kv_heads: 8,
            conv_kernel: 3,
            vocab: 65_536,
            max_positions: 128_000,
            moe: Some(MoeDims {
                dense_layers: 2,
                dense_width: 7168,
                experts: 32,
                top_k: 4,
                expert_width: 1792,
            }),
        },
    }
}

impl Dims {
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// The adjusted width (multiplier 1.0): `int(2·w/3)` rounded up to `multiple_of`.
    fn ff_dim(&self) -> usize {
        (2 * self.block_ff_dim / 3).div_ceil(self.multiple_of) * self.multiple_of
    }
}

/// Standard deviation of the logits (see the Qwen3 family).
const LOGIT_STD: f32 = 5.0;

/// Noise on RMSNorm weights around 1.
const NORM_NOISE: f32 = 0.1;

/// Depthwise conv taps ~ N(0, 0.6²): about 1/√K, so the conv keeps the scale of its input.
const CONV_STD: f32 = 0.6;

/// Gain of the projections that write into the residual stream over 1/√fan_in, so each
/// block's contribution is comparable to the embedding (see the Qwen3.5 family).
const RESIDUAL_GAIN: f32 = 4.0;

/// Router gain over 1/√hidden (see the Qwen3.5-MoE family): clear choices between experts.
const ROUTER_GAIN: f32 = 2.0;

/// Standard deviation of `expert_bias`: big enough to change some choices (the sigmoid scores
/// are spread over (0, 1)), small enough to keep them clear of near-ties.
const EXPERT_BIAS_STD: f32 = 0.05;

/// `in_proj` gives three gates multiplied together (`C ⊙ conv(B ⊙ x)`); a gain on it keeps
/// the product from shrinking to nothing.
const IN_PROJ_GAIN: f32 = 2.0;

const SPECIALS: [&str; 5] = [
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
];

/// LFM2's ChatML template: the bos token, then `<|im_start|>role\n…<|im_end|>\n` per message.
const CHAT_TEMPLATE: &str = "{{- bos_token }}\
{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

const TRANSFORMERS_VERSION: &str = "4.54.0";

impl super::Family for Lfm2 {
    fn name(&self) -> &'static str {
        if self.moe {
            "lfm2_moe"
        } else {
            "lfm2"
        }
    }

    fn about(&self) -> &'static str {
        if self.moe {
            "LFM2-MoE, LFM2 with sigmoid-routed sparse feed-forwards (tiny: 4 layers, 8 experts, top-2; bench: LFM2-8B-A1B widths, 8 layers)"
        } else {
            "LFM2, short conv + GQA attention (tiny: 4 layers, hidden 128; bench: LFM2-350M widths)"
        }
    }

    fn plan(&self, spec: &SynthSpec, layout: Layout) -> Result<ModelPlan> {
        let d = dims(spec.size, self.moe);
        let tokenizer = TokenizerPlan {
            regular_tokens: d.vocab - SPECIALS.len(),
            specials: SPECIALS.iter().map(|s| s.to_string()).collect(),
            split_regex: super::qwen3::SPLIT_REGEX.to_string(),
            chat_template: CHAT_TEMPLATE.to_string(),
            bos_token: Some("<|startoftext|>".into()),
            eos_token: "<|im_end|>".into(),
            pad_token: "<|pad|>".into(),
            tokenizer_class: "PreTrainedTokenizerFast".into(),
            model_max_length: d.max_positions,
        };
        let id = |t: &str| {
            tokenizer
                .special_id(t)
                .expect("LFM2's specials are in the plan")
        };
        let (pad, bos, im_end) = (id("<|pad|>"), id("<|startoftext|>"), id("<|im_end|>"));
        let mut config = config(&d, spec, layout, [pad, bos, im_end]);
        insert_quantization(&mut config, spec.format);
        if let Some(m) = &d.moe {
            let routers: Vec<String> = (m.dense_layers..d.layers)
                .map(|l| format!("model.layers.{l}.feed_forward.gate"))
                .collect();
            insert_8bit_overrides(&mut config, &routers);
        }
        let generation_config = json!({
            "bos_token_id": bos,
            "eos_token_id": im_end,
            "pad_token_id": pad,
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

fn config(d: &Dims, spec: &SynthSpec, layout: Layout, [pad, bos, eos]: [u32; 3]) -> Value {
    let mut config = json!({
        "architectures": ["Lfm2ForCausalLM"],
        "block_auto_adjust_ff_dim": true,
        "block_dim": d.hidden,
        "block_ff_dim": d.block_ff_dim,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": d.multiple_of,
        "bos_token_id": bos,
        "conv_L_cache": d.conv_kernel,
        "conv_bias": false,
        "eos_token_id": eos,
        "hidden_size": d.hidden,
        "intermediate_size": d.block_ff_dim,
        "max_position_embeddings": d.max_positions,
        "model_type": "lfm2",
        "norm_eps": 1e-5,
        "num_attention_heads": d.heads,
        "num_hidden_layers": d.layers,
        "num_key_value_heads": d.kv_heads,
        "pad_token_id": pad,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": true,
        "torch_dtype": spec.format.torch_dtype(),
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": true,
        "vocab_size": d.vocab,
    });
    let kinds = match layout {
        Layout::Hf => (
            "layer_types",
            json!((0..d.layers)
                .map(|i| if d.attention_layers.contains(&i) {
                    "full_attention"
                } else {
                    "conv"
                })
                .collect::<Vec<_>>()),
        ),
        Layout::Mlx => ("full_attn_idxs", json!(d.attention_layers)),
    };
    config[kinds.0] = kinds.1;
    if let Some(m) = &d.moe {
        let obj = config.as_object_mut().expect("an object");
        for key in [
            "block_auto_adjust_ff_dim",
            "block_dim",
            "block_ff_dim",
            "block_ffn_dim_multiplier",
            "block_multiple_of",
        ] {
            obj.remove(key);
        }
        for (k, v) in [
            ("architectures", json!(["Lfm2MoeForCausalLM"])),
            ("model_type", json!("lfm2_moe")),
            ("intermediate_size", json!(m.dense_width)),
            ("moe_intermediate_size", json!(m.expert_width)),
            ("num_dense_layers", json!(m.dense_layers)),
            ("num_experts", json!(m.experts)),
            ("num_experts_per_tok", json!(m.top_k)),
            ("norm_topk_prob", json!(true)),
            ("use_expert_bias", json!(true)),
            ("routed_scaling_factor", json!(1.0)),
        ] {
            obj.insert(k.into(), v);
        }
    }
    config
}

fn tensors(d: &Dims, layout: Layout) -> Vec<TensorPlan> {
    let linear = |name: String, out: usize, inp: usize, gain: f32| {
        TensorPlan::new(
            name,
            &[out, inp],
            Init::normal(gain / (inp as f32).sqrt()),
            Store::Matrix,
        )
    };
    let norm = |name: String, n: usize| {
        TensorPlan::new(name, &[n], Init::around(1.0, NORM_NOISE), Store::Float)
    };
    // Tied: the embedding doubles as the lm_head, so it takes the lm_head's scale.
    let mut t = vec![
        TensorPlan::new(
            "model.embed_tokens.weight",
            &[d.vocab, d.hidden],
            Init::normal(LOGIT_STD / (d.hidden as f32).sqrt()),
            Store::Matrix,
        ),
        norm("model.embedding_norm.weight".into(), d.hidden),
    ];
    let (h, hd, ff) = (d.hidden, d.head_dim(), d.ff_dim());
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        if d.attention_layers.contains(&l) {
            let a = format!("{p}.self_attn");
            t.extend([
                linear(format!("{a}.q_proj.weight"), d.heads * hd, h, 1.0),
                linear(format!("{a}.k_proj.weight"), d.kv_heads * hd, h, 1.0),
                linear(format!("{a}.v_proj.weight"), d.kv_heads * hd, h, 1.0),
                linear(
                    format!("{a}.out_proj.weight"),
                    h,
                    d.heads * hd,
                    RESIDUAL_GAIN,
                ),
                norm(format!("{a}.q_layernorm.weight"), hd),
                norm(format!("{a}.k_layernorm.weight"), hd),
            ]);
        } else {
            let c = format!("{p}.conv");
            let conv_shape = match layout {
                Layout::Hf => [h, 1, d.conv_kernel],
                Layout::Mlx => [h, d.conv_kernel, 1],
            };
            t.extend([
                linear(format!("{c}.in_proj.weight"), 3 * h, h, IN_PROJ_GAIN),
                TensorPlan::new(
                    format!("{c}.conv.weight"),
                    &conv_shape,
                    Init::normal(CONV_STD),
                    Store::Float,
                ),
                linear(format!("{c}.out_proj.weight"), h, h, RESIDUAL_GAIN),
            ]);
        }
        t.extend([
            norm(format!("{p}.operator_norm.weight"), h),
            norm(format!("{p}.ffn_norm.weight"), h),
        ]);
        let f = format!("{p}.feed_forward");
        match &d.moe {
            None => t.extend([
                linear(format!("{f}.w1.weight"), ff, h, 1.0),
                linear(format!("{f}.w3.weight"), ff, h, 1.0),
                linear(format!("{f}.w2.weight"), h, ff, RESIDUAL_GAIN),
            ]),
            Some(m) if l < m.dense_layers => {
                let w = m.dense_width;
                for (hf, mlx, out, inp, gain) in [
                    ("w1", "gate_proj", w, h, 1.0),
                    ("w3", "up_proj", w, h, 1.0),
                    ("w2", "down_proj", h, w, RESIDUAL_GAIN),
                ] {
                    let plan = linear(format!("{f}.{hf}.weight"), out, inp, gain);
                    t.push(match layout {
                        Layout::Hf => plan,
                        Layout::Mlx => TensorPlan {
                            name: format!("{f}.{mlx}.weight"),
                            ..plan.clone()
                        }
                        .seeded_as(plan.name),
                    });
                }
            }
            Some(m) => t.extend(sparse_ff(&f, h, m, layout)),
        }
    }
    t
}

/// One LFM2-MoE sparse feed-forward at `f` (`model.layers.N.feed_forward`).
fn sparse_ff(f: &str, h: usize, m: &MoeDims, layout: Layout) -> Vec<TensorPlan> {
    let (e, i) = (m.experts, m.expert_width);
    let std = |gain: f32, fan_in: usize| Init::normal(gain / (fan_in as f32).sqrt());
    let mut t = vec![
        TensorPlan::new(
            format!("{f}.gate.weight"),
            &[e, h],
            std(ROUTER_GAIN, h),
            Store::Matrix8,
        ),
        TensorPlan::new(
            format!("{f}.expert_bias"),
            &[e],
            Init::normal(EXPERT_BIAS_STD),
            Store::F32,
        ),
    ];
    for (hf, mlx, out, inp, gain) in [
        ("w1", "gate_proj", i, h, 1.0),
        ("w3", "up_proj", i, h, 1.0),
        ("w2", "down_proj", h, i, RESIDUAL_GAIN),
    ] {
        let per_expert: Vec<String> = (0..e)
            .map(|x| format!("{f}.experts.{x}.{hf}.weight"))
            .collect();
        match layout {
            Layout::Hf => t.extend(
                per_expert
                    .into_iter()
                    .map(|n| TensorPlan::new(n, &[out, inp], std(gain, inp), Store::Matrix)),
            ),
            Layout::Mlx => t.push(
                TensorPlan::new(
                    format!("{f}.switch_mlp.{mlx}.weight"),
                    &[e, out, inp],
                    std(gain, inp),
                    Store::Matrix,
                )
                .stacked_from(per_expert),
            ),
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_has_lfm2_350m_widths() {
        let d = dims(Size::Bench, false);
        assert_eq!((d.ff_dim(), d.head_dim()), (4608, 64));
        assert_eq!(dims(Size::Tiny, false).ff_dim(), 256);
    }
}

//! Gemma 4 text, dense (`Gemma4ForConditionalGeneration`'s language model): sliding and full
//! attention layers with their own head dims and RoPE, KV sharing in the last layers, sandwich
//! norms, GeGLU, per-layer inputs, `layer_scalar`, tied head with a final soft cap.
//!
//! The tiny model turns every feature on at once: 6 layers `S S F S S F`, the last two
//! KV-shared (reading layers 3 and 2) with double-wide MLPs, full layers with head dim 64,
//! one KV head and K = V (`attention_k_eq_v`), proportional RoPE on a quarter of their dims,
//! a sliding window of 32 (the 70- and 300-token prompts run past it), per-layer inputs of
//! width 16. `gemma4_moe` is the MoE variant (`enable_moe_block`, 26B-A4B style) on the same
//! attention stack, without per-layer inputs or KV sharing (as that model has neither): every
//! layer adds 8 GeGLU experts of width 64 (top 2) beside its dense MLP, with the router at 8
//! bits in quantized folders. Names: `model.language_model.*` in the hf layout (which also keeps the unused K/V
//! projections of the KV-shared layers), `language_model.model.*` in mlx-lm's.

use anyhow::Result;
use serde_json::{json, Value};

use crate::plan::{Init, ModelPlan, Store, TensorPlan};
use crate::spec::{insert_8bit_overrides, insert_quantization, Layout, Size, SynthSpec};
use crate::tokenizer::TokenizerPlan;

/// Gemma 4 text; `moe` selects the MoE variant (`gemma4_moe`).
pub struct Gemma4 {
    pub moe: bool,
}

/// The sparse branch's widths.
struct MoeDims {
    experts: usize,
    top_k: usize,
    width: usize,
}

struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    global_head_dim: usize,
    global_kv_heads: usize,
    k_eq_v: bool,
    vocab: usize,
    per_layer_width: usize,
    kv_shared: usize,
    window: usize,
    /// Every `pattern`-th layer is full.
    pattern: usize,
    max_positions: usize,
    moe: Option<MoeDims>,
}

impl Dims {
    fn is_full(&self, layer: usize) -> bool {
        (layer + 1).is_multiple_of(self.pattern)
    }
}

fn dims(size: Size, moe: bool) -> Dims {
    if moe {
        return moe_dims(size);
    }
    match size {
        Size::Tiny => Dims {
            hidden: 128,
            intermediate: 256,
            layers: 6,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            global_head_dim: 64,
            global_kv_heads: 1,
            k_eq_v: true,
            vocab: 1024,
            per_layer_width: 16,
            kv_shared: 2,
            window: 32,
            pattern: 3,
            max_positions: 4096,
            moe: None,
        },
        // Gemma 4 E2B's widths (hidden 1536, 35 layers of which the last 20 share KV, 8 q / 1 KV
        // heads × 256, full layers × 512, MLP 6144, per-layer inputs 256, window 512), with the
        // vocabulary cut from 262144 to 32768: the per-layer table alone would be 2.3 B
        // parameters at full size.
        Size::Bench => Dims {
            hidden: 1536,
            intermediate: 6144,
            layers: 35,
            heads: 8,
            kv_heads: 1,
            head_dim: 256,
            global_head_dim: 512,
            global_kv_heads: 1,
            k_eq_v: false,
            vocab: 32_768,
            per_layer_width: 256,
            kv_shared: 20,
            window: 512,
            pattern: 5,
            max_positions: 131_072,
            moe: None,
        },
    }
}

fn moe_dims(size: Size) -> Dims {
    match size {
        Size::Tiny => Dims {
            per_layer_width: 0,
            kv_shared: 0,
            moe: Some(MoeDims {
                experts: 8,
                top_k: 2,
                width: 64,
            }),
            ..dims(size, false)
        },
        // Gemma 4 26B-A4B's text widths (hidden 2816; 16 q heads × 256, 8 KV heads on sliding
        // layers, 2 × 512 with K = V on full ones; window 1024; dense MLP 2112 beside 128 GeGLU
        // experts of 704, 8 per token; no per-layer inputs or KV sharing), cut to its first
        // 6 layers (one sliding/full period: 5 sliding, then full), 64 of the 128 experts and
        // the vocabulary from 262144 to 32768, so the q4 folder is about 1.5 GB.
        Size::Bench => Dims {
            hidden: 2816,
            intermediate: 2112,
            layers: 6,
            heads: 16,
            kv_heads: 8,
            head_dim: 256,
            global_head_dim: 512,
            global_kv_heads: 2,
            k_eq_v: true,
            vocab: 32_768,
            per_layer_width: 0,
            kv_shared: 0,
            window: 1024,
            pattern: 6,
            max_positions: 262_144,
            moe: Some(MoeDims {
                experts: 64,
                top_k: 8,
                width: 704,
            }),
        },
    }
}

const LOGIT_STD: f32 = 5.0;
const NORM_NOISE: f32 = 0.05;
const SOFTCAP: f64 = 30.0;

const SPECIALS: [&str; 5] = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
];

/// Gemma's turn markers (`user` / `model`).
const TEMPLATE: &str = "{{- bos_token }}{%- for message in messages %}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}\
{{- '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' }}{%- endfor %}\
{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}";

/// Split rule: Llama 3's (Gemma's own tokenizer is SentencePiece; the rule only shapes the
/// synthetic vocabulary).
const SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Gemma tokenizer shape shared by the Gemma families (byte-level BPE standing in for
/// SentencePiece, Gemma's specials and turn template) and its (pad, eos, bos, end-of-turn) ids.
pub(super) fn gemma_tokenizer(vocab: usize, max_positions: usize) -> (TokenizerPlan, [u32; 4]) {
    let plan = TokenizerPlan {
        regular_tokens: vocab - SPECIALS.len(),
        specials: SPECIALS.iter().map(|s| s.to_string()).collect(),
        split_regex: SPLIT.to_string(),
        chat_template: TEMPLATE.to_string(),
        bos_token: Some("<bos>".into()),
        eos_token: "<end_of_turn>".into(),
        pad_token: "<pad>".into(),
        tokenizer_class: "GemmaTokenizer".into(),
        model_max_length: max_positions,
    };
    let id = |t: &str| {
        plan.special_id(t)
            .expect("Gemma's specials are in the plan")
    };
    let ids = [id("<pad>"), id("<eos>"), id("<bos>"), id("<end_of_turn>")];
    (plan, ids)
}

impl super::Family for Gemma4 {
    fn name(&self) -> &'static str {
        if self.moe {
            "gemma4_moe"
        } else {
            "gemma4"
        }
    }

    fn about(&self) -> &'static str {
        if self.moe {
            "Gemma 4 text, MoE variant (tiny: 6 layers, 8 GeGLU experts top-2 beside each dense MLP; bench: 26B-A4B widths, 6 layers, 64 experts, vocab 32768)"
        } else {
            "Gemma 4 text, dense (tiny: 6 layers with KV sharing, K=V, per-layer inputs; bench: E2B widths, vocab 32768)"
        }
    }

    fn plan(&self, spec: &SynthSpec, layout: Layout) -> Result<ModelPlan> {
        let d = dims(spec.size, self.moe);
        let (tokenizer, [pad, eos, bos, eot]) = gemma_tokenizer(d.vocab, d.max_positions);
        let kinds: Vec<&str> = (0..d.layers)
            .map(|l| {
                if d.is_full(l) {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        let mut text = json!({
            "attention_k_eq_v": d.k_eq_v,
            "bos_token_id": bos,
            "enable_moe_block": d.moe.is_some(),
            "eos_token_id": [eos, eot],
            "final_logit_softcapping": SOFTCAP,
            "global_head_dim": d.global_head_dim,
            "head_dim": d.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": d.hidden,
            "hidden_size_per_layer_input": d.per_layer_width,
            "intermediate_size": d.intermediate,
            "layer_types": kinds,
            "max_position_embeddings": d.max_positions,
            "model_type": "gemma4_text",
            "num_attention_heads": d.heads,
            "num_global_key_value_heads": d.global_kv_heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "num_kv_shared_layers": d.kv_shared,
            "pad_token_id": pad,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "full_attention": {
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1_000_000.0,
                    "rope_type": "proportional"
                },
                "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"}
            },
            "sliding_window": d.window,
            "tie_word_embeddings": true,
            "use_double_wide_mlp": true,
            "vocab_size": d.vocab,
            "vocab_size_per_layer_input": d.vocab,
        });
        if let Some(m) = &d.moe {
            let t = text.as_object_mut().expect("a JSON object");
            t.insert("num_experts".into(), m.experts.into());
            t.insert("top_k_experts".into(), m.top_k.into());
            t.insert("moe_intermediate_size".into(), m.width.into());
        }
        let mut config: Value = json!({
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "text_config": text,
            "tie_word_embeddings": true,
            "torch_dtype": spec.format.torch_dtype(),
            "transformers_version": "5.5.0",
            // mlx-lm's multimodal wrapper copies the root's vocabulary size into the text model.
            "vocab_size": d.vocab,
        });
        insert_quantization(&mut config, spec.format);
        if d.moe.is_some() {
            // mlx-lm's Gemma 4 `quant_predicate` keeps each `router.proj` at 8 bits.
            let routers: Vec<String> = (0..d.layers)
                .map(|l| format!("language_model.model.layers.{l}.router.proj"))
                .collect();
            insert_8bit_overrides(&mut config, &routers);
        }
        let generation_config = json!({
            "bos_token_id": bos,
            "do_sample": true,
            "eos_token_id": [eos, eot],
            "pad_token_id": pad,
            "temperature": 1.0,
            "top_k": 64,
            "top_p": 0.95,
        });
        Ok(ModelPlan {
            config,
            generation_config,
            tokenizer,
            tensors: tensors(&d, layout),
        })
    }
}

fn tensors(d: &Dims, layout: Layout) -> Vec<TensorPlan> {
    let mut out = Vec::new();
    // `path` is relative to the decoder; drawn under the mlx name so both layouts agree.
    let mut push = |path: String, shape: &[usize], init: Init, store: Store| {
        let mlx = format!("language_model.model.{path}");
        let name = match layout {
            Layout::Mlx => mlx.clone(),
            Layout::Hf => format!("model.language_model.{path}"),
        };
        out.push(TensorPlan::new(name, shape, init, store).seeded_as(mlx));
    };
    let linear = |inp: usize| Init::normal(1.0 / (inp as f32).sqrt());
    let norm = || Init::around(1.0, NORM_NOISE);
    let (h, w) = (d.hidden, d.per_layer_width);
    // The tied table enters the residual stream ×√hidden: rows of std 1/√hidden make that
    // unit-sized, no louder than a layer's output, and the final norm's gain (≈ LOGIT_STD)
    // brings the logits to the other families' spread. A louder table lets each token's own
    // embedding dominate the last hidden state, and greedy decoding repeats one token.
    push(
        "embed_tokens.weight".into(),
        &[d.vocab, h],
        Init::normal(1.0 / (h as f32).sqrt()),
        Store::Matrix,
    );
    push(
        "norm.weight".into(),
        &[h],
        Init::around(LOGIT_STD, LOGIT_STD * NORM_NOISE),
        Store::Float,
    );
    if w > 0 {
        push(
            "embed_tokens_per_layer.weight".into(),
            &[d.vocab, d.layers * w],
            Init::normal(0.25),
            Store::Matrix,
        );
        push(
            "per_layer_model_projection.weight".into(),
            &[d.layers * w, h],
            linear(h),
            Store::Matrix,
        );
        push(
            "per_layer_projection_norm.weight".into(),
            &[w],
            norm(),
            Store::Float,
        );
    }
    let first_shared = d.layers - d.kv_shared;
    for l in 0..d.layers {
        let p = format!("layers.{l}");
        let full = d.is_full(l);
        let (hd, kvh) = if full {
            (d.global_head_dim, d.global_kv_heads)
        } else {
            (d.head_dim, d.kv_heads)
        };
        let shared = l >= first_shared;
        let inter = if shared {
            2 * d.intermediate
        } else {
            d.intermediate
        };
        let mut lin = |name: &str, o: usize, i: usize| {
            push(
                format!("{p}.{name}.weight"),
                &[o, i],
                linear(i),
                Store::Matrix,
            )
        };
        lin("self_attn.q_proj", d.heads * hd, h);
        lin("self_attn.o_proj", h, d.heads * hd);
        // mlx-lm drops the K/V projections of KV-shared layers; original folders keep them.
        let has_kv = !shared || layout == Layout::Hf;
        if has_kv {
            lin("self_attn.k_proj", kvh * hd, h);
            if !(full && d.k_eq_v) {
                lin("self_attn.v_proj", kvh * hd, h);
            }
        }
        lin("mlp.gate_proj", inter, h);
        lin("mlp.up_proj", inter, h);
        lin("mlp.down_proj", h, inter);
        if w > 0 {
            lin("per_layer_input_gate", w, h);
            lin("per_layer_projection", h, w);
        }
        // Attention runs at scale 1 on normed q and k: gains of D^-¼ on each give the
        // usual 1/√D and keep the attention logits O(1), so f32 rounding is not amplified
        // through near-one-hot softmaxes over hundreds of positions.
        let qk_gain = (hd as f32).powf(-0.25);
        let mut qk = |name: &str| {
            push(
                format!("{p}.self_attn.{name}.weight"),
                &[hd],
                Init::around(qk_gain, qk_gain * NORM_NOISE),
                Store::Float,
            )
        };
        qk("q_norm");
        if has_kv {
            qk("k_norm");
        }
        let mut nrm =
            |name: &str, n: usize| push(format!("{p}.{name}.weight"), &[n], norm(), Store::Float);
        for name in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            nrm(name, h);
        }
        if w > 0 {
            nrm("post_per_layer_input_norm", h);
        }
        if d.moe.is_some() {
            for name in [
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_1",
                "post_feedforward_layernorm_2",
            ] {
                nrm(name, h);
            }
        }
        push(
            format!("{p}.layer_scalar"),
            &[1],
            Init::around(0.8, 0.2),
            Store::Float,
        );
    }
    if let Some(m) = &d.moe {
        for l in 0..d.layers {
            experts(&mut out, &format!("layers.{l}"), m, h, layout);
        }
    }
    out
}

/// One layer's router and stacked experts, drawn under the MLX names in both layouts.
fn experts(out: &mut Vec<TensorPlan>, p: &str, m: &MoeDims, h: usize, layout: Layout) {
    let mlx = |path: &str| format!("language_model.model.{p}.{path}");
    let name = |path: &str| match layout {
        Layout::Mlx => mlx(path),
        Layout::Hf => format!("model.language_model.{p}.{path}"),
    };
    let std = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let mut push = |path: &str, shape: &[usize], init: Init, store: Store| {
        out.push(TensorPlan::new(name(path), shape, init, store).seeded_as(mlx(path)));
    };
    // A router louder than unit scale separates the experts' scores, so routing is not decided
    // by rounding; per-expert scales around 1 make the branch's weights unequal.
    push(
        "router.proj.weight",
        &[m.experts, h],
        Init::normal(4.0 * std(h)),
        Store::Matrix8,
    );
    push(
        "router.scale",
        &[h],
        Init::around(1.0, NORM_NOISE),
        Store::Float,
    );
    push(
        "router.per_expert_scale",
        &[m.experts],
        Init::around(1.0, 0.2),
        Store::Float,
    );
    let (e, i) = (m.experts, m.width);
    match layout {
        Layout::Mlx => {
            for (proj, shape) in [
                ("gate_proj", [e, i, h]),
                ("up_proj", [e, i, h]),
                ("down_proj", [e, h, i]),
            ] {
                push(
                    &format!("experts.switch_glu.{proj}.weight"),
                    &shape,
                    Init::normal(std(shape[2])),
                    Store::Matrix,
                );
            }
        }
        Layout::Hf => {
            let seed = |proj: &str| mlx(&format!("experts.switch_glu.{proj}.weight"));
            out.push(
                TensorPlan::new(
                    name("experts.gate_up_proj"),
                    &[e, 2 * i, h],
                    Init::normal(std(h)),
                    Store::Matrix,
                )
                .fused_from(seed("gate_proj"), seed("up_proj")),
            );
            out.push(
                TensorPlan::new(
                    name("experts.down_proj"),
                    &[e, h, i],
                    Init::normal(std(i)),
                    Store::Matrix,
                )
                .seeded_as(seed("down_proj")),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Family;
    use super::*;
    use crate::Format;

    /// The bench MoE config says 26B-A4B's widths (restated from its published config), cut
    /// as the comment on [`moe_dims`] says.
    #[test]
    fn bench_moe_has_26b_a4b_widths() {
        let spec = SynthSpec::new("gemma4_moe", Size::Bench, Format::Q4);
        let plan = Gemma4 { moe: true }
            .plan(&spec, spec.resolved_layout())
            .unwrap();
        let c = &plan.config["text_config"];
        let get = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
        let widths = [
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_global_key_value_heads",
            "head_dim",
            "global_head_dim",
            "top_k_experts",
            "sliding_window",
        ]
        .map(get);
        assert_eq!(widths, [2816, 2112, 704, 16, 8, 2, 256, 512, 8, 1024]);
        assert_eq!((get("num_experts"), get("num_hidden_layers")), (64, 6));
        assert_eq!(c["attention_k_eq_v"], json!(true));
        let params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
        assert!((2_600_000_000..2_800_000_000).contains(&params), "{params}");
    }
}

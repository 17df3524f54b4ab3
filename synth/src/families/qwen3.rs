//! Qwen3 dense (`Qwen3ForCausalLM`): GQA attention with per-head RMSNorm on q and k, SwiGLU MLP,
//! RMSNorm everywhere, RoPE θ = 1e6. Qwen2/Qwen2.5 (`Qwen2ForCausalLM`) is the same skeleton
//! with biases on q, k and v instead of the q/k norms. Hugging Face and mlx-lm use the same tensor names, so the layout only
//! changes the safetensors metadata.

use anyhow::Result;
use serde_json::json;

use crate::plan::{Init, ModelPlan, Store, TensorPlan};
use crate::spec::{insert_quantization, Layout, Size, SynthSpec};
use crate::tokenizer::TokenizerPlan;

pub struct Qwen3;
pub struct Qwen2;

struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    tied: bool,
    max_positions: usize,
    /// Qwen2: q/k/v biases, no q/k norms.
    qwen2: bool,
}

fn qwen2_dims(size: Size) -> Dims {
    match size {
        // Untied like the tiny Qwen3: a tiny random model with a tied head repeats its last
        // token forever (its own embedding dominates the logits), a weak reference.
        Size::Tiny => Dims {
            qwen2: true,
            ..dims(Size::Tiny)
        },
        // Qwen2.5-0.5B.
        Size::Bench => Dims {
            hidden: 896,
            intermediate: 4864,
            layers: 24,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            vocab: 151_936,
            tied: true,
            max_positions: 32_768,
            qwen2: true,
        },
    }
}

fn dims(size: Size) -> Dims {
    match size {
        Size::Tiny => Dims {
            hidden: 128,
            intermediate: 256,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            vocab: 1024,
            tied: false,
            max_positions: 4096,
            qwen2: false,
        },
        // Qwen3-0.6B.
        Size::Bench => Dims {
            hidden: 1024,
            intermediate: 3072,
            layers: 28,
            heads: 16,
            kv_heads: 8,
            head_dim: 128,
            vocab: 151_936,
            tied: true,
            max_positions: 40_960,
            qwen2: false,
        },
    }
}

/// Standard deviation of the logits: the final norm's output has RMS ≈ 1, so lm_head rows of
/// std LOGIT_STD/√hidden give logits of std ≈ LOGIT_STD. Large enough that the top two logits are
/// rarely within rounding noise of each other (greedy paths should not hit near-ties), small
/// enough that sampling still sees more than one candidate.
const LOGIT_STD: f32 = 5.0;

/// Noise on RMSNorm weights around 1.
const NORM_NOISE: f32 = 0.05;

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Qwen2/Qwen3's pre-tokenizer split pattern (from their tokenizer.json).
pub(super) const SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen's plain ChatML template (no tools, no thinking blocks).
pub(super) const CHAT_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// The Qwen tokenizer shape shared by the Qwen families: byte-level BPE with Qwen2's split
/// rule, `specials` at the end of the vocabulary, ChatML template, eos `<|im_end|>`.
pub(super) fn qwen_tokenizer(
    vocab: usize,
    specials: &[&str],
    max_positions: usize,
) -> TokenizerPlan {
    TokenizerPlan {
        regular_tokens: vocab - specials.len(),
        specials: specials.iter().map(|s| s.to_string()).collect(),
        split_regex: SPLIT_REGEX.to_string(),
        chat_template: CHAT_TEMPLATE.to_string(),
        bos_token: None,
        eos_token: "<|im_end|>".into(),
        pad_token: "<|endoftext|>".into(),
        tokenizer_class: "Qwen2Tokenizer".into(),
        model_max_length: max_positions,
    }
}

impl super::Family for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3"
    }

    fn about(&self) -> &'static str {
        "Qwen3 dense (tiny: 2 layers, hidden 128; bench: Qwen3-0.6B widths)"
    }

    fn plan(&self, spec: &SynthSpec, _layout: Layout) -> Result<ModelPlan> {
        let d = dims(spec.size);
        let tokenizer = qwen_tokenizer(d.vocab, &SPECIALS, d.max_positions);
        let id = |t: &str| {
            tokenizer
                .special_id(t)
                .expect("Qwen3's specials are in the plan")
        };
        let (endoftext, im_end) = (id("<|endoftext|>"), id("<|im_end|>"));

        let mut config = json!({
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": endoftext,
            "eos_token_id": im_end,
            "head_dim": d.head_dim,
            "hidden_act": "silu",
            "hidden_size": d.hidden,
            "initializer_range": 0.02,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": d.max_positions,
            "max_window_layers": d.layers,
            "model_type": "qwen3",
            "num_attention_heads": d.heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "rms_norm_eps": 1e-6,
            "rope_scaling": null,
            "rope_theta": 1_000_000,
            "sliding_window": null,
            "tie_word_embeddings": d.tied,
            "torch_dtype": spec.format.torch_dtype(),
            "transformers_version": "4.51.0",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": d.vocab,
        });
        insert_quantization(&mut config, spec.format);
        let generation_config = json!({
            "bos_token_id": endoftext,
            "do_sample": true,
            "eos_token_id": [im_end, endoftext],
            "pad_token_id": endoftext,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "4.51.0",
        });

        Ok(ModelPlan {
            config,
            generation_config,
            tokenizer,
            tensors: tensors(&d),
        })
    }
}

impl super::Family for Qwen2 {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn about(&self) -> &'static str {
        "Qwen2/Qwen2.5 (tiny: 2 layers, hidden 128, q/k/v biases; bench: Qwen2.5-0.5B widths, tied head)"
    }

    fn plan(&self, spec: &SynthSpec, _layout: Layout) -> Result<ModelPlan> {
        let d = qwen2_dims(spec.size);
        let tokenizer = qwen_tokenizer(d.vocab, &SPECIALS, d.max_positions);
        let id = |t: &str| {
            tokenizer
                .special_id(t)
                .expect("Qwen2's specials are in the plan")
        };
        let (endoftext, im_end) = (id("<|endoftext|>"), id("<|im_end|>"));
        // As Qwen2.5's configs write it (no `head_dim`: it is hidden / heads).
        let mut config = json!({
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": endoftext,
            "eos_token_id": im_end,
            "hidden_act": "silu",
            "hidden_size": d.hidden,
            "initializer_range": 0.02,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": d.max_positions,
            "max_window_layers": d.layers,
            "model_type": "qwen2",
            "num_attention_heads": d.heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "rms_norm_eps": 1e-6,
            "rope_scaling": null,
            "rope_theta": 1_000_000.0,
            "sliding_window": d.max_positions,
            "tie_word_embeddings": d.tied,
            "torch_dtype": spec.format.torch_dtype(),
            "transformers_version": "4.43.1",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": d.vocab,
        });
        insert_quantization(&mut config, spec.format);
        let generation_config = json!({
            "bos_token_id": endoftext,
            "do_sample": true,
            "eos_token_id": [im_end, endoftext],
            "pad_token_id": endoftext,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
            "transformers_version": "4.43.1",
        });
        Ok(ModelPlan {
            config,
            generation_config,
            tokenizer,
            tensors: tensors(&d),
        })
    }
}

fn tensors(d: &Dims) -> Vec<TensorPlan> {
    let linear = TensorPlan::linear;
    let norm = |name: String, n: usize| TensorPlan::gain(name, n, 1.0, NORM_NOISE);
    let logit_std = LOGIT_STD / (d.hidden as f32).sqrt();
    // A tied embedding doubles as the lm_head, so it takes the lm_head's scale; an untied one
    // gets unit entries (its scale is normalised away by the first RMSNorm anyway).
    let embed_std = if d.tied { logit_std } else { 1.0 };
    let mut t = vec![
        TensorPlan::new(
            "model.embed_tokens.weight",
            &[d.vocab, d.hidden],
            Init::normal(embed_std),
            Store::Matrix,
        ),
        norm("model.norm.weight".into(), d.hidden),
    ];
    if !d.tied {
        t.push(TensorPlan::new(
            "lm_head.weight",
            &[d.vocab, d.hidden],
            Init::normal(logit_std),
            Store::Matrix,
        ));
    }
    let (q_dim, kv_dim) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        t.extend([
            norm(format!("{p}.input_layernorm.weight"), d.hidden),
            norm(format!("{p}.post_attention_layernorm.weight"), d.hidden),
            linear(format!("{p}.self_attn.q_proj.weight"), q_dim, d.hidden),
            linear(format!("{p}.self_attn.k_proj.weight"), kv_dim, d.hidden),
            linear(format!("{p}.self_attn.v_proj.weight"), kv_dim, d.hidden),
            linear(format!("{p}.self_attn.o_proj.weight"), d.hidden, q_dim),
        ]);
        if d.qwen2 {
            let bias = |name: String, n: usize| {
                TensorPlan::new(name, &[n], Init::normal(0.1), Store::Float)
            };
            t.extend([
                bias(format!("{p}.self_attn.q_proj.bias"), q_dim),
                bias(format!("{p}.self_attn.k_proj.bias"), kv_dim),
                bias(format!("{p}.self_attn.v_proj.bias"), kv_dim),
            ]);
        } else {
            t.extend([
                norm(format!("{p}.self_attn.q_norm.weight"), d.head_dim),
                norm(format!("{p}.self_attn.k_norm.weight"), d.head_dim),
            ]);
        }
        t.extend([
            linear(
                format!("{p}.mlp.gate_proj.weight"),
                d.intermediate,
                d.hidden,
            ),
            linear(format!("{p}.mlp.up_proj.weight"), d.intermediate, d.hidden),
            linear(
                format!("{p}.mlp.down_proj.weight"),
                d.hidden,
                d.intermediate,
            ),
        ]);
    }
    t
}

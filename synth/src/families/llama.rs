//! Llama 3 (`LlamaForCausalLM`) and MiniCPM (`MiniCPMForCausalLM`): the plain pre-norm GQA +
//! SwiGLU decoder. Hugging Face and mlx-lm use the same tensor names, so the layout only changes
//! the safetensors metadata.
//!
//! The tiny Llama exercises what Llama adds to the Qwen3 skeleton: attention biases, Llama 3
//! RoPE scaling (most of its frequencies are rescaled) and a sliding-window layer (window 32, so
//! the 70- and 300-token prompts run past it). The tiny MiniCPM exercises the μP scales, with
//! `dim_model_base` a quarter of the hidden size so the logit scale is not 1.

use anyhow::Result;
use serde_json::{json, Value};

use crate::plan::{Init, ModelPlan, Store, TensorPlan};
use crate::spec::{insert_quantization, Layout, Size, SynthSpec};
use crate::tokenizer::TokenizerPlan;

/// Llama 3 or MiniCPM.
pub struct Llama;
pub struct MiniCpm;

struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    vocab: usize,
    tied: bool,
    max_positions: usize,
    attention_bias: bool,
    /// The layer index that slides, and its window.
    sliding: Option<(usize, usize)>,
}

impl Dims {
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

fn llama_dims(size: Size) -> Dims {
    match size {
        Size::Tiny => Dims {
            hidden: 128,
            intermediate: 256,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            vocab: 1024,
            tied: false,
            max_positions: 4096,
            attention_bias: true,
            sliding: Some((1, 32)),
        },
        // Llama-3.2-1B.
        Size::Bench => Dims {
            hidden: 2048,
            intermediate: 8192,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            vocab: 128_256,
            tied: true,
            max_positions: 131_072,
            attention_bias: false,
            sliding: None,
        },
    }
}

/// MiniCPM's widths and its `dim_model_base`.
fn minicpm_dims(size: Size) -> (Dims, usize) {
    match size {
        Size::Tiny => (
            Dims {
                hidden: 128,
                intermediate: 256,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                vocab: 1024,
                tied: false,
                max_positions: 4096,
                attention_bias: false,
                sliding: None,
            },
            32,
        ),
        // MiniCPM-1B's widths, 24 of its 52 layers (about 0.8 B parameters).
        Size::Bench => (
            Dims {
                hidden: 1536,
                intermediate: 3840,
                layers: 24,
                heads: 24,
                kv_heads: 8,
                vocab: 73_440,
                tied: true,
                max_positions: 32_768,
                attention_bias: false,
                sliding: None,
            },
            256,
        ),
    }
}

/// MiniCPM's μP constants (MiniCPM-1B/2B use 12, 1.4 and 256).
const SCALE_EMB: f64 = 12.0;
const SCALE_DEPTH: f64 = 1.4;

/// See `qwen3.rs`: logits of standard deviation about this.
const LOGIT_STD: f32 = 5.0;
const NORM_NOISE: f32 = 0.05;

/// Llama 3's pre-tokenizer split (digits in groups of up to three).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const LLAMA3_SPECIALS: [&str; 5] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// Llama 3's header/eot chat shape (no system-prompt defaults, no tools).
const LLAMA3_TEMPLATE: &str = "{{- bos_token }}{%- for message in messages %}\
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

const MINICPM_SPECIALS: [&str; 5] = ["<unk>", "<s>", "</s>", "<用户>", "<AI>"];

/// MiniCPM's `<用户>…<AI>` turns.
const MINICPM_TEMPLATE: &str = "{{- bos_token }}{%- for message in messages %}\
{%- if message['role'] == 'user' %}{{- '<用户>' + message['content'] + '<AI>' }}\
{%- else %}{{- message['content'] }}{%- endif %}{%- endfor %}";

impl super::Family for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn about(&self) -> &'static str {
        "Llama 3 (tiny: 2 layers, biases, llama3 RoPE scaling, one sliding layer; bench: Llama-3.2-1B widths)"
    }

    fn plan(&self, spec: &SynthSpec, _layout: Layout) -> Result<ModelPlan> {
        let d = llama_dims(spec.size);
        let tokenizer = TokenizerPlan {
            regular_tokens: d.vocab - LLAMA3_SPECIALS.len(),
            specials: LLAMA3_SPECIALS.iter().map(|s| s.to_string()).collect(),
            split_regex: LLAMA3_SPLIT.to_string(),
            chat_template: LLAMA3_TEMPLATE.to_string(),
            bos_token: Some("<|begin_of_text|>".into()),
            eos_token: "<|eot_id|>".into(),
            pad_token: "<|end_of_text|>".into(),
            tokenizer_class: "PreTrainedTokenizerFast".into(),
            model_max_length: d.max_positions,
        };
        let id = |t: &str| {
            tokenizer
                .special_id(t)
                .expect("Llama's specials are in the plan")
        };
        let (bos, eot, eos) = (
            id("<|begin_of_text|>"),
            id("<|eot_id|>"),
            id("<|end_of_text|>"),
        );
        let mut config = json!({
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": d.attention_bias,
            "attention_dropout": 0.0,
            "bos_token_id": bos,
            "eos_token_id": [eos, eot],
            "head_dim": d.head_dim(),
            "hidden_act": "silu",
            "hidden_size": d.hidden,
            "initializer_range": 0.02,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": d.max_positions,
            "mlp_bias": false,
            "model_type": "llama",
            "num_attention_heads": d.heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3"
            },
            "rope_theta": 500_000.0,
            "tie_word_embeddings": d.tied,
            "torch_dtype": spec.format.torch_dtype(),
            "transformers_version": "4.45.0",
            "use_cache": true,
            "vocab_size": d.vocab,
        });
        if let Some((layer, window)) = d.sliding {
            let kinds: Vec<&str> = (0..d.layers)
                .map(|l| {
                    if l == layer {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            config["layer_types"] = json!(kinds);
            config["sliding_window"] = json!(window);
        }
        insert_quantization(&mut config, spec.format);
        let generation_config = json!({
            "bos_token_id": bos,
            "do_sample": true,
            "eos_token_id": [eos, eot],
            "temperature": 0.6,
            "top_p": 0.9,
            "transformers_version": "4.45.0",
        });
        Ok(ModelPlan {
            config,
            generation_config,
            tokenizer,
            tensors: tensors(&d, 1.0),
        })
    }
}

impl super::Family for MiniCpm {
    fn name(&self) -> &'static str {
        "minicpm"
    }

    fn about(&self) -> &'static str {
        "MiniCPM (Llama + μP scales; tiny: 2 layers, hidden 128; bench: MiniCPM-1B widths, 24 layers)"
    }

    fn plan(&self, spec: &SynthSpec, _layout: Layout) -> Result<ModelPlan> {
        let (d, base) = minicpm_dims(spec.size);
        let tokenizer = TokenizerPlan {
            regular_tokens: d.vocab - MINICPM_SPECIALS.len(),
            specials: MINICPM_SPECIALS.iter().map(|s| s.to_string()).collect(),
            split_regex: LLAMA3_SPLIT.to_string(),
            chat_template: MINICPM_TEMPLATE.to_string(),
            bos_token: Some("<s>".into()),
            eos_token: "</s>".into(),
            pad_token: "<unk>".into(),
            tokenizer_class: "LlamaTokenizerFast".into(),
            model_max_length: d.max_positions,
        };
        let id = |t: &str| {
            tokenizer
                .special_id(t)
                .expect("MiniCPM's specials are in the plan")
        };
        let (bos, eos) = (id("<s>"), id("</s>"));
        let mut config: Value = json!({
            "architectures": ["MiniCPMForCausalLM"],
            "bos_token_id": bos,
            "dim_model_base": base,
            "eos_token_id": eos,
            "hidden_act": "silu",
            "hidden_size": d.hidden,
            "initializer_range": 0.1,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": d.max_positions,
            "model_type": "minicpm",
            "num_attention_heads": d.heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "rms_norm_eps": 1e-5,
            "rope_scaling": null,
            "rope_theta": 10_000.0,
            "scale_depth": SCALE_DEPTH,
            "scale_emb": SCALE_EMB,
            "tie_word_embeddings": d.tied,
            "torch_dtype": spec.format.torch_dtype(),
            "transformers_version": "4.36.0",
            "use_cache": true,
            "vocab_size": d.vocab,
        });
        insert_quantization(&mut config, spec.format);
        let generation_config = json!({
            "bos_token_id": bos,
            "do_sample": true,
            "eos_token_id": eos,
            "temperature": 0.8,
            "top_p": 0.8,
        });
        // The head sees the hidden state divided by hidden/dim_model_base: widen its rows by as
        // much so the logits keep the spread the other families have.
        let head_gain = (d.hidden / base) as f32;
        Ok(ModelPlan {
            config,
            generation_config,
            tokenizer,
            tensors: tensors(&d, head_gain),
        })
    }
}

fn tensors(d: &Dims, head_gain: f32) -> Vec<TensorPlan> {
    let linear = TensorPlan::linear;
    let norm = |name: String, n: usize| TensorPlan::gain(name, n, 1.0, NORM_NOISE);
    let bias =
        |name: String, n: usize| TensorPlan::new(name, &[n], Init::normal(0.1), Store::Float);
    let logit_std = head_gain * LOGIT_STD / (d.hidden as f32).sqrt();
    // A tied embedding doubles as the lm_head, so it takes the lm_head's scale.
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
    let (q_dim, kv_dim) = (d.heads * d.head_dim(), d.kv_heads * d.head_dim());
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        t.extend([
            norm(format!("{p}.input_layernorm.weight"), d.hidden),
            norm(format!("{p}.post_attention_layernorm.weight"), d.hidden),
            linear(format!("{p}.self_attn.q_proj.weight"), q_dim, d.hidden),
            linear(format!("{p}.self_attn.k_proj.weight"), kv_dim, d.hidden),
            linear(format!("{p}.self_attn.v_proj.weight"), kv_dim, d.hidden),
            linear(format!("{p}.self_attn.o_proj.weight"), d.hidden, q_dim),
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
        if d.attention_bias {
            for (name, n) in [
                ("q_proj", q_dim),
                ("k_proj", kv_dim),
                ("v_proj", kv_dim),
                ("o_proj", d.hidden),
            ] {
                t.push(bias(format!("{p}.self_attn.{name}.bias"), n));
            }
        }
    }
    t
}

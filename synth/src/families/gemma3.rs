//! Gemma 3 text (`Gemma3ForCausalLM`, `model_type` `gemma3_text`): sliding and full attention
//! layers (every `sliding_window_pattern`-th full), per-head q/k RMSNorm, sandwich norms, GeGLU,
//! every RMSNorm `x̂ · (1 + w)` with `w` stored, embeddings × √hidden, tied head.
//!
//! The tiny model turns on what differs from the plain decoder: 4 layers `S F S F` with a
//! window of 32 (the 70- and 300-token prompts run past it), `query_pre_attn_scalar` 48 (not
//! the head dim), linear RoPE scaling ×8 on the full layers and a local base on the sliding
//! ones. Both layouts use the text-only names (`model.*`), as transformers and mlx-lm save
//! `gemma3_text`.

use anyhow::Result;
use serde_json::json;

use super::gemma4::gemma_tokenizer;
use crate::plan::{Init, ModelPlan, Store, TensorPlan};
use crate::spec::{insert_quantization, Layout, Size, SynthSpec};

pub struct Gemma3;

struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    window: usize,
    pattern: usize,
    query_pre_attn_scalar: usize,
    /// Linear RoPE scaling of the full layers.
    rope_factor: Option<f64>,
    max_positions: usize,
}

fn dims(size: Size) -> Dims {
    match size {
        Size::Tiny => Dims {
            hidden: 128,
            intermediate: 256,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            vocab: 1024,
            window: 32,
            pattern: 2,
            query_pre_attn_scalar: 48,
            rope_factor: Some(8.0),
            max_positions: 4096,
        },
        // Gemma 3 270M, its 262144-token vocabulary cut to 32768.
        Size::Bench => Dims {
            hidden: 640,
            intermediate: 2048,
            layers: 18,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            vocab: 32_768,
            window: 512,
            pattern: 6,
            query_pre_attn_scalar: 256,
            rope_factor: None,
            max_positions: 32_768,
        },
    }
}

const LOGIT_STD: f32 = 5.0;
/// Stored norm gains `w` around 0: the model multiplies by `1 + w`.
const NORM_NOISE: f32 = 0.05;

impl super::Family for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn about(&self) -> &'static str {
        "Gemma 3 text (tiny: 4 layers S F S F, window 32, scaled RoPE on full layers; bench: 270M widths, vocab 32768)"
    }

    fn plan(&self, spec: &SynthSpec, _layout: Layout) -> Result<ModelPlan> {
        let d = dims(spec.size);
        let (tokenizer, [pad, eos, bos, eot]) = gemma_tokenizer(d.vocab, d.max_positions);
        let rope_scaling = match d.rope_factor {
            Some(f) => json!({"factor": f, "rope_type": "linear"}),
            None => json!(null),
        };
        let mut config = json!({
            "architectures": ["Gemma3ForCausalLM"],
            "attention_bias": false,
            "attn_logit_softcapping": null,
            "bos_token_id": bos,
            "eos_token_id": [eos, eot],
            "final_logit_softcapping": null,
            "head_dim": d.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": d.hidden,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": d.max_positions,
            "model_type": "gemma3_text",
            "num_attention_heads": d.heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "pad_token_id": pad,
            "query_pre_attn_scalar": d.query_pre_attn_scalar,
            "rms_norm_eps": 1e-6,
            "rope_local_base_freq": 10_000.0,
            "rope_scaling": rope_scaling,
            "rope_theta": 1_000_000.0,
            "sliding_window": d.window,
            "sliding_window_pattern": d.pattern,
            "tie_word_embeddings": true,
            "torch_dtype": spec.format.torch_dtype(),
            "transformers_version": "4.55.0",
            "use_cache": true,
            "vocab_size": d.vocab,
        });
        insert_quantization(&mut config, spec.format);
        let generation_config = json!({
            "bos_token_id": bos,
            "do_sample": true,
            "eos_token_id": [eos, eot],
            "pad_token_id": pad,
            "top_k": 64,
            "top_p": 0.95,
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
    let norm = |name: String, n: usize| TensorPlan::gain(name, n, 0.0, NORM_NOISE);
    // The tied table enters the residual stream ×√hidden beside 2·layers normed branch
    // outputs of RMS ≈ 1 each. Each token's own row must not dominate the last hidden state
    // (greedy decoding would repeat the token): rows of norm EMBED_NORM make its logit about
    // √hidden·EMBED_NORM / √(2·layers) standard deviations above the rest, ≈ ½ here. The
    // final norm's gain 1 + w = LOGIT_STD / EMBED_NORM gives the logits the other families'
    // spread.
    const EMBED_NORM: f32 = 0.125;
    let mut t = vec![
        TensorPlan::new(
            "model.embed_tokens.weight",
            &[d.vocab, d.hidden],
            Init::normal(EMBED_NORM / (d.hidden as f32).sqrt()),
            Store::Matrix,
        ),
        TensorPlan::new(
            "model.norm.weight",
            &[d.hidden],
            Init::around(LOGIT_STD / EMBED_NORM - 1.0, NORM_NOISE),
            Store::Float,
        ),
    ];
    let (q_dim, kv_dim) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        t.extend([
            norm(format!("{p}.input_layernorm.weight"), d.hidden),
            norm(format!("{p}.post_attention_layernorm.weight"), d.hidden),
            norm(format!("{p}.pre_feedforward_layernorm.weight"), d.hidden),
            norm(format!("{p}.post_feedforward_layernorm.weight"), d.hidden),
            linear(format!("{p}.self_attn.q_proj.weight"), q_dim, d.hidden),
            linear(format!("{p}.self_attn.k_proj.weight"), kv_dim, d.hidden),
            linear(format!("{p}.self_attn.v_proj.weight"), kv_dim, d.hidden),
            linear(format!("{p}.self_attn.o_proj.weight"), d.hidden, q_dim),
            norm(format!("{p}.self_attn.q_norm.weight"), d.head_dim),
            norm(format!("{p}.self_attn.k_norm.weight"), d.head_dim),
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

//! A GGUF file as a Hugging Face-layout checkpoint folder: config.json from the metadata,
//! model.safetensors with every tensor dequantized and renamed, and llama.cpp's conversions
//! undone (the q/k row permutation of Llama attention, Gemma's `1 +` on norm gains).
//! tokenizer_config.json carries the chat template and special tokens; tokenizer.json comes
//! from a given folder, else is rebuilt from a byte-level BPE vocabulary ([`super::tokenizer`]).
//!
//! Names and keys follow llama.cpp's `convert_hf_to_gguf.py` and `gguf-py` (`constants.py`):
//! `token_embd`, `output_norm`, `output`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
//! attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down,
//! post_attention_norm, post_ffw_norm}`, and `<arch>.{block_count, embedding_length, …}`.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value as Json};

use super::{GgufFile, TensorInfo, Value};
use crate::weights::safetensors::OwnedTensor;
use kernels::DType;

/// The dtype of the written matrices (norm gains and biases are always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    F32,
    Bf16,
}

/// The architectures the importer maps, and the `model_type` each becomes.
const ARCHES: [(&str, &str); 4] = [
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("gemma3", "gemma3_text"),
];

/// Gemma 3's turn format, for files that carry no template: a system message opens the first
/// user turn, `assistant` is spelled `model`, each turn's text is trimmed.
const GEMMA_TURNS: &str = "{{ bos_token }}\
{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] ~ '\\n\\n' %}{% set turns = messages[1:] %}\
{%- else %}{% set system = '' %}{% set turns = messages %}{% endif %}\
{%- for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n\
{{ ((system if loop.first else '') ~ m['content']) | trim }}<end_of_turn>\n{% endfor %}\
{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

/// Where the written tokenizer.json came from.
#[derive(Debug)]
pub enum TokenizerSource {
    Given,
    Rebuilt,
    /// Neither given nor rebuildable: why.
    Missing(String),
}

/// Writes `gguf` as a checkpoint folder at `out` (which must not exist; nothing is left there
/// on failure), with tokenizer files copied from `tokenizer_from` when given.
pub fn import(
    gguf: &GgufFile,
    out: &Path,
    dtype: OutDtype,
    tokenizer_from: Option<&Path>,
) -> Result<TokenizerSource> {
    crate::files::write_new_folder(out, "importing", |tmp| {
        write_folder(gguf, tmp, dtype, tokenizer_from)
    })
    .with_context(|| format!("importing {}", gguf.path().display()))
}

fn write_folder(
    g: &GgufFile,
    dir: &Path,
    dtype: OutDtype,
    tokenizer_from: Option<&Path>,
) -> Result<TokenizerSource> {
    std::fs::create_dir_all(dir)?;
    let arch = g
        .get("general.architecture")
        .and_then(Value::as_str)
        .context("metadata `general.architecture` is missing")?;
    let Some(&(_, model_type)) = ARCHES.iter().find(|a| a.0 == arch) else {
        let known: Vec<&str> = ARCHES.iter().map(|a| a.0).collect();
        bail!(
            "metadata `general.architecture` = {arch:?} is not importable (supported: {})",
            known.join(", ")
        );
    };
    let config = config(g, arch, model_type)?;
    let heads = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(1) as usize;
    let mut tensors: Vec<OwnedTensor> = Vec::new();
    for t in &g.tensors {
        let name = hf_name(arch, &t.name)?;
        let mut values = g.dequantize(t)?;
        if arch == "llama" && name.ends_with("self_attn.q_proj.weight") {
            values = unpermute(&values, t, heads)?;
        }
        if arch == "llama" && name.ends_with("self_attn.k_proj.weight") {
            values = unpermute(&values, t, kv_heads)?;
        }
        if arch == "gemma3" && name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        let matrix = t.shape.len() == 2;
        let (bytes, st) = match (dtype, matrix) {
            (OutDtype::Bf16, true) => (
                values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::BF16,
            ),
            _ => (
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F32,
            ),
        };
        tensors.push((name, st, t.shape.clone(), bytes));
    }
    crate::weights::safetensors::write(&dir.join("model.safetensors"), &tensors, "pt")?;
    write_json(dir, "config.json", &config)?;
    let token = |key: &str| {
        g.get(&format!("tokenizer.ggml.{key}_token_id"))
            .and_then(Value::as_u64)
    };
    let mut generation = json!({});
    for key in ["bos", "eos"] {
        if let Some(id) = token(key) {
            generation[format!("{key}_token_id")] = json!(id);
        }
    }
    write_json(dir, "generation_config.json", &generation)?;
    let mut tok_config = super::tokenizer::special_tokens(g);
    match g.get("tokenizer.chat_template").and_then(Value::as_str) {
        Some(t) => tok_config["chat_template"] = json!(t),
        // Gemma 3 checkpoints share one turn format, which base-model files often leave out.
        None if arch == "gemma3" => tok_config["chat_template"] = json!(GEMMA_TURNS),
        None => {}
    }
    let source = if tokenizer_from.is_some() {
        TokenizerSource::Given
    } else {
        match super::tokenizer::tokenizer_json(g) {
            Ok(t) => {
                write_json(dir, "tokenizer.json", &t)?;
                TokenizerSource::Rebuilt
            }
            Err(e) => TokenizerSource::Missing(format!("{e:#}")),
        }
    };
    if let Some(src) = tokenizer_from {
        std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json"))
            .with_context(|| format!("copying {}", src.join("tokenizer.json").display()))?;
        if let Ok(text) = std::fs::read_to_string(src.join("tokenizer_config.json")) {
            let given: Json = serde_json::from_str(&text).with_context(|| {
                format!("{}: not JSON", src.join("tokenizer_config.json").display())
            })?;
            // The given file's settings, the GGUF's template where it has one.
            let template = tok_config.get("chat_template").cloned();
            tok_config = given;
            if let Some(t) = template {
                tok_config["chat_template"] = t;
            }
        }
    }
    write_json(dir, "tokenizer_config.json", &tok_config)?;
    Ok(source)
}

fn write_json(dir: &Path, name: &str, v: &Json) -> Result<()> {
    let text = serde_json::to_string_pretty(v)? + "\n";
    Ok(std::fs::write(dir.join(name), text)?)
}

/// config.json from `<arch>.*` metadata, the embedding's shape and whether a head is stored.
fn config(g: &GgufFile, arch: &str, model_type: &str) -> Result<Json> {
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |k: &str| -> Result<u64> {
        g.get(&key(k))
            .and_then(Value::as_u64)
            .with_context(|| format!("metadata `{}` is missing or not an integer", key(k)))
    };
    let float = |k: &str, default: f64| -> Result<f64> {
        match g.get(&key(k)) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .with_context(|| format!("metadata `{}` is not a number", key(k))),
        }
    };
    let embed = g
        .tensor("token_embd.weight")
        .context("tensor `token_embd.weight` is missing")?;
    ensure!(
        embed.shape.len() == 2,
        "tensor `token_embd.weight` has shape {:?}, not a matrix",
        embed.shape
    );
    let (hidden, heads) = (uint("embedding_length")?, uint("attention.head_count")?);
    ensure!(
        heads > 0,
        "metadata `{}` must be positive",
        key("attention.head_count")
    );
    let head_dim = match g.get(&key("attention.key_length")) {
        Some(_) => uint("attention.key_length")?,
        None => hidden / heads,
    };
    let mut c = json!({
        "architectures": [format!("{}ForCausalLM", display_name(arch))],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": uint("feed_forward_length")?,
        "num_hidden_layers": uint("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": match g.get(&key("attention.head_count_kv")) {
            Some(_) => uint("attention.head_count_kv")?,
            None => heads,
        },
        "head_dim": head_dim,
        "vocab_size": embed.shape[0],
        "rms_norm_eps": float("attention.layer_norm_rms_epsilon", 1e-6)?,
        "rope_theta": float("rope.freq_base", 10_000.0)?,
        "max_position_embeddings": uint("context_length")?,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
    });
    if let Some(kind) = g.get(&key("rope.scaling.type")).and_then(Value::as_str) {
        match kind {
            "none" => {}
            "linear" => {
                c["rope_scaling"] =
                    json!({"rope_type": "linear", "factor": float("rope.scaling.factor", 1.0)?})
            }
            other => bail!(
                "metadata `{}` = {other:?} is not supported (none, linear)",
                key("rope.scaling.type")
            ),
        }
    }
    if arch == "gemma3" {
        // What llama.cpp's loader assumes of Gemma 3 beyond the metadata: every sixth layer
        // global, the local RoPE base 1e4, attention scaled by 1/√head_dim.
        c["sliding_window"] = json!(uint("attention.sliding_window")?);
        c["sliding_window_pattern"] = json!(6);
        c["rope_local_base_freq"] = json!(10_000.0);
        c["query_pre_attn_scalar"] = json!(head_dim);
    }
    Ok(c)
}

fn display_name(arch: &str) -> &'static str {
    match arch {
        "llama" => "Llama",
        "qwen2" => "Qwen2",
        "qwen3" => "Qwen3",
        _ => "Gemma3",
    }
}

/// The Hugging Face name of GGUF tensor `name`.
fn hf_name(arch: &str, name: &str) -> Result<String> {
    let (base, kind) = name
        .rsplit_once('.')
        .with_context(|| format!("tensor `{name}`: no `.weight`/`.bias` suffix"))?;
    let whole = match base {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(w) = whole {
        return Ok(format!("{w}.{kind}"));
    }
    let mapped = base.strip_prefix("blk.").and_then(|rest| {
        let (layer, part) = rest.split_once('.')?;
        layer.parse::<usize>().ok()?;
        let hf = match (part, arch == "gemma3") {
            ("attn_norm", _) => "input_layernorm",
            ("attn_q", _) => "self_attn.q_proj",
            ("attn_k", _) => "self_attn.k_proj",
            ("attn_v", _) => "self_attn.v_proj",
            ("attn_output", _) => "self_attn.o_proj",
            ("attn_q_norm", _) => "self_attn.q_norm",
            ("attn_k_norm", _) => "self_attn.k_norm",
            ("ffn_gate", _) => "mlp.gate_proj",
            ("ffn_up", _) => "mlp.up_proj",
            ("ffn_down", _) => "mlp.down_proj",
            ("ffn_norm", false) => "post_attention_layernorm",
            ("ffn_norm", true) => "pre_feedforward_layernorm",
            ("post_attention_norm", true) => "post_attention_layernorm",
            ("post_ffw_norm", true) => "post_feedforward_layernorm",
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{hf}.{kind}"))
    });
    mapped.with_context(|| format!("tensor `{name}` has no counterpart in a {arch} checkpoint"))
}

/// Undoes llama.cpp's `LlamaModel.permute` of a q or k projection `[heads·d, in]`: its row
/// `h·d + 2j + c` holds the original row `h·d + c·d/2 + j`.
fn unpermute(values: &[f32], t: &TensorInfo, heads: usize) -> Result<Vec<f32>> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    ensure!(
        heads > 0 && rows.is_multiple_of(heads) && (rows / heads).is_multiple_of(2),
        "tensor `{}`: {rows} rows do not split into {heads} heads of even size",
        t.name
    );
    let d = rows / heads;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for j in 0..d / 2 {
            for c in 0..2 {
                let from = h * d + 2 * j + c;
                let to = h * d + c * (d / 2) + j;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    Ok(out)
}

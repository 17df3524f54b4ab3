//! tokenizer.json rebuilt from a GGUF file's vocabulary.
//!
//! - Byte-level BPE (`tokenizer.ggml.model` = `gpt2`): the tokens and merges as a `tokenizers`
//!   BPE model, control and user-defined tokens as added special tokens, and the pre-tokenizer
//!   that `tokenizer.ggml.pre` names (the rules llama.cpp's `llama-vocab.cpp` applies for it,
//!   written as the `tokenizers` library's pre-tokenizers).
//! - Gemma's SentencePiece BPE (`llama` in a `gemma*` file): see [`sentencepiece`].
//!
//! Other SentencePiece vocabularies are refused: pass a tokenizer.json.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value as Json};

use super::{GgufFile, Value};

mod sentencepiece;

/// Token types of `tokenizer.ggml.token_type` that are special (control, user-defined).
const SPECIAL_TYPES: [u64; 2] = [3, 4];

/// The regex split of Qwen2 and Llama 3 (`digits` is their only difference), then bytes.
fn split_then_bytes(digits: &str) -> Json {
    let pattern = format!(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|{digits}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    );
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
    ]})
}

/// The pre-tokenizers of the `pre` names this rebuild knows.
fn pre_tokenizer(pre: &str) -> Option<Json> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    Some(match pre {
        // GPT-2's rule.
        "gpt2" | "default" => byte_level(true),
        // Each digit on its own, then GPT-2's rule (SmolLM).
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]}),
        // Qwen2's split (digits one by one), then bytes.
        "qwen2" => split_then_bytes(r"\p{N}"),
        // Llama 3's: Qwen2's with digits in runs of up to three.
        "llama-bpe" => split_then_bytes(r"\p{N}{1,3}"),
        _ => return None,
    })
}

pub(super) fn strings(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    match g.get(key) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .with_context(|| format!("metadata `{key}` holds a value that is not a string")),
        _ => bail!("metadata `{key}` is missing or not an array"),
    }
}

/// The tokenizer.json of `g`'s vocabulary.
pub fn tokenizer_json(g: &GgufFile) -> Result<Json> {
    let model = g.get("tokenizer.ggml.model").and_then(Value::as_str);
    let arch = g
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("");
    match model {
        Some("gpt2") => byte_level(g),
        Some("llama") if arch.starts_with("gemma") => sentencepiece::gemma(g),
        _ => bail!(
            "metadata `tokenizer.ggml.model` = {model:?} (architecture {arch:?}): only byte-level BPE (`gpt2`) and Gemma's SentencePiece vocabularies are rebuilt; pass --tokenizer DIR with the model's tokenizer.json"
        ),
    }
}

/// tokenizer.json of a byte-level BPE vocabulary.
fn byte_level(g: &GgufFile) -> Result<Json> {
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let pre_tokenizer = pre_tokenizer(pre).with_context(|| {
        format!("metadata `tokenizer.ggml.pre` = {pre:?} is not a pre-tokenizer this import knows (gpt2, default, smollm, qwen2, llama-bpe); pass --tokenizer DIR")
    })?;
    // Llama 3's tokenizer takes a pre-token found whole in the vocabulary as is, before any
    // merge (its tokenizer.json sets `ignore_merges`; llama.cpp does the same for this `pre`):
    // " Việt" is one token there, three by merges.
    let ignore_merges = pre == "llama-bpe";
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let types = token_types(g, tokens.len());
    let vocab: serde_json::Map<String, Json> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let added: Vec<Json> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| SPECIAL_TYPES.contains(ty))
        .map(|(id, (t, _))| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        },
    }))
}

/// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte), or all
/// normal where the file has none.
pub(super) fn token_types(g: &GgufFile, n: usize) -> Vec<u64> {
    match g.get("tokenizer.ggml.token_type") {
        Some(Value::Array(t)) => t.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        _ => vec![1; n],
    }
}

/// The special-token settings tokenizer_config.json takes from the GGUF (bos, eos, pad).
pub fn special_tokens(g: &GgufFile) -> Json {
    let tokens = strings(g, "tokenizer.ggml.tokens").unwrap_or_default();
    let mut out = json!({});
    for (key, name) in [
        ("bos", "bos_token"),
        ("eos", "eos_token"),
        ("padding", "pad_token"),
    ] {
        let id = g
            .get(&format!("tokenizer.ggml.{key}_token_id"))
            .and_then(Value::as_u64);
        if let Some(t) = id.and_then(|i| tokens.get(i as usize)) {
            out[name] = json!(t);
        }
    }
    if let Some(add) = g.get("tokenizer.ggml.add_bos_token") {
        out["add_bos_token"] = json!(matches!(add, Value::Bool(true)));
    }
    out
}

//! Gemma's SentencePiece BPE vocabulary (`tokenizer.ggml.model` = `llama` in a `gemma*` file) as
//! a `tokenizers` BPE model, the way transformers builds one from a GGUF file (its
//! `gemma_tokenizer`), so that the two tokenize alike:
//!
//! - the file lists tokens and scores but no merges, so merges are recovered from the vocabulary:
//!   every way of cutting a token in two known pieces is a merge, ranked by the token's position
//!   in the file (Gemma's merge order; its scores do not follow it), then longer left pieces
//!   first;
//! - a token of spaces only is stored as spaces but looked up as `▁`s, so it is respelled;
//! - spaces become `▁` (no prefix space), unknown bytes fall back to `<0xNN>` tokens, and the
//!   decoder undoes both;
//! - control tokens are special added tokens, user-defined ones (newline and tab runs, HTML tags)
//!   plain added tokens, both matched whole in the text;
//! - `<bos>` is prepended when `tokenizer.ggml.add_bos_token` says so.

use std::collections::HashMap;

use anyhow::{ensure, Result};
use serde_json::{json, Value as Json};

use super::{strings, token_types, GgufFile, Value};

/// The longest token cut into merges; a vocabulary is untrusted input, and a longer token would
/// only cost time (no real vocabulary comes near it).
const MAX_TOKEN_CHARS: usize = 256;

/// tokenizer.json of a Gemma SentencePiece vocabulary.
pub fn gemma(g: &GgufFile) -> Result<Json> {
    let stored = strings(g, "tokenizer.ggml.tokens")?;
    let types = token_types(g, stored.len());
    ensure!(
        types.len() == stored.len(),
        "metadata `tokenizer.ggml.token_type` has {} entries for {} tokens",
        types.len(),
        stored.len()
    );
    let tokens: Vec<String> = stored.iter().map(|t| respell(t)).collect();
    // A token spelled twice keeps its last id, as a JSON vocabulary would.
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let merges = merges(&tokens, &ids);
    let id_of = |key: &str| {
        g.get(&format!("tokenizer.ggml.{key}_token_id"))
            .and_then(Value::as_u64)
            .and_then(|i| stored.get(i as usize))
    };
    let unk = id_of("unknown").map_or("<unk>", String::as_str);
    let added: Vec<Json> = stored
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (t, ty))| **ty == 3 || (**ty == 4 && ids.contains_key(t.as_str())))
        .map(|(id, (t, ty))| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": *ty == 3})
        })
        .collect();
    let add_bos = matches!(
        g.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    let post_processor = match id_of("bos") {
        Some(bos) if add_bos => {
            let bos_id = ids[bos.as_str()];
            let special = json!({"SpecialToken": {"id": bos, "type_id": 0}});
            let seq = |s: &str| json!({"Sequence": {"id": s, "type_id": 0}});
            json!({"type": "TemplateProcessing",
                   "single": [special, seq("A")],
                   "pair": [special, seq("A"), special, seq("B")],
                   "special_tokens": {bos.as_str(): {"id": bos, "ids": [bos_id], "tokens": [bos]}}})
        }
        _ => Json::Null,
    };
    // In id order (each spelling once, at the id it keeps), so the file is the same bytes on
    // every run: serde_json keeps insertion order here, and a HashMap's order is random.
    let vocab: serde_json::Map<String, Json> = tokens
        .iter()
        .enumerate()
        .filter(|&(i, t)| ids[t.as_str()] == i)
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let space = json!({"String": " "});
    let meta = json!({"String": "▁"});
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": space, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": space, "behavior": "MergedWithPrevious", "invert": false},
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": meta, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// A token of spaces only, as the `▁`s it is looked up by.
fn respell(t: &str) -> String {
    if !t.is_empty() && t.chars().all(|c| c == ' ') {
        "▁".repeat(t.chars().count())
    } else {
        t.to_string()
    }
}

/// Every cut of a token into two known pieces, best first: by the token's position (its last
/// one, for a token spelled twice), then longer left pieces first.
fn merges(tokens: &[String], ids: &HashMap<&str, usize>) -> Vec<Json> {
    let mut found: Vec<(usize, usize, &str, &str)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in tokens {
        // Each spelling once, ranked where its id is.
        if !seen.insert(t.as_str()) {
            continue;
        }
        let rank = ids[t.as_str()];
        let cuts: Vec<usize> = t.char_indices().map(|(i, _)| i).skip(1).collect();
        if cuts.len() >= MAX_TOKEN_CHARS {
            continue;
        }
        for &at in cuts.iter().rev() {
            let (l, r) = t.split_at(at);
            if ids.contains_key(l) && ids.contains_key(r) {
                found.push((rank, usize::MAX - l.chars().count(), l, r));
            }
        }
    }
    found.sort_by_key(|&(rank, left, _, _)| (rank, left));
    found
        .into_iter()
        .map(|(_, _, l, r)| json!([l, r]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_are_respelled_and_merges_follow_positions() {
        assert_eq!(respell("   "), "▁▁▁");
        assert_eq!(respell(" a"), " a");
        let tokens: Vec<String> = ["▁", "a", "b", "ab", "▁a", "▁ab", "▁▁"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let ids: HashMap<&str, usize> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i))
            .collect();
        let m = merges(&tokens, &ids);
        let want = json!([["a", "b"], ["▁", "a"], ["▁a", "b"], ["▁", "ab"], ["▁", "▁"]]);
        assert_eq!(Json::Array(m), want);
    }
}

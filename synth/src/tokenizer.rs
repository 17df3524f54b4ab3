//! A deterministic byte-level BPE tokenizer in Hugging Face's `tokenizer.json` format.
//!
//! The vocabulary starts with the 256 byte tokens spelled in GPT-2's byte-to-unicode alphabet (in
//! GPT-2's id order: printable bytes first), learns merges from a small embedded English text so
//! ordinary prose encodes into multi-byte tokens, then fills the requested size with seeded random
//! merges of short printable-ASCII tokens. Special tokens follow the ordinary ones. The JSON
//! mirrors Qwen's tokenizer (NFC normaliser, regex split + ByteLevel pre-tokenizer, ByteLevel
//! decoder) so it loads in the Rust `tokenizers` crate and in Python `tokenizers`/`transformers`
//! alike.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Result};
use serde_json::{json, Map, Value};

use super::rng::SplitMix64;

/// The text the first merges are learned from.
/// The English text the synthetic tokenizers learn their merges from (also a source of prompts).
pub const CORPUS: &str = include_str!("corpus.txt");

/// Random fill merges only combine tokens up to this many bytes, so tokens stay short (the
/// printable-ASCII candidates number ~10⁵ at this length: plenty for a 152k vocabulary).
const MAX_RANDOM_PART_BYTES: usize = 4;

/// Fixed seed of the random fill: the tokenizer of a size is the same for every weight seed,
/// like a real model family's.
const FILL_SEED: u64 = 0x746F_6B65_6E69_7A65;

/// What the family wants from its tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerPlan {
    /// Ordinary BPE tokens (256 bytes + merges), ids `0..regular_tokens`.
    pub regular_tokens: usize,
    /// Special added tokens, ids `regular_tokens..` in this order.
    pub specials: Vec<String>,
    /// The pre-tokenizer's split regex (the family's own, e.g. Qwen2's).
    pub split_regex: String,
    pub chat_template: String,
    pub bos_token: Option<String>,
    pub eos_token: String,
    pub pad_token: String,
    /// `tokenizer_class` of tokenizer_config.json, e.g. `Qwen2Tokenizer`.
    pub tokenizer_class: String,
    pub model_max_length: usize,
}

impl TokenizerPlan {
    /// The id of a special token.
    pub fn special_id(&self, token: &str) -> Option<u32> {
        self.specials
            .iter()
            .position(|s| s == token)
            .map(|i| (self.regular_tokens + i) as u32)
    }

    pub fn total_tokens(&self) -> usize {
        self.regular_tokens + self.specials.len()
    }
}

/// The two written files.
pub struct TokenizerFiles {
    pub tokenizer_json: Value,
    pub tokenizer_config: Value,
}

/// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes
/// are moved to U+0100.. so every byte is a visible, non-space character. Returned in GPT-2's
/// vocabulary order (printable bytes first) as (byte, char) pairs.
fn byte_alphabet() -> Vec<(u8, char)> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out: Vec<(u8, char)> = (0..=255u8)
        .filter(|&b| printable(b))
        .map(|b| (b, b as char))
        .collect();
    let shifted = (0..=255u8).filter(|&b| !printable(b));
    for (code, b) in (256u32..).zip(shifted) {
        out.push((
            b,
            char::from_u32(code).expect("U+0100..U+0143 are valid chars"),
        ));
    }
    out
}

/// A growing BPE vocabulary: token byte strings by id and the merge list.
struct Vocab {
    tokens: Vec<Vec<u8>>,
    ids: HashMap<Vec<u8>, u32>,
    merges: Vec<(u32, u32)>,
}

impl Vocab {
    fn bytes() -> Vocab {
        let mut v = Vocab {
            tokens: Vec::new(),
            ids: HashMap::new(),
            merges: Vec::new(),
        };
        for (b, _) in byte_alphabet() {
            v.insert(vec![b]);
        }
        v
    }

    fn insert(&mut self, bytes: Vec<u8>) -> u32 {
        let id = self.tokens.len() as u32;
        self.ids.insert(bytes.clone(), id);
        self.tokens.push(bytes);
        id
    }

    fn concat(&self, a: u32, b: u32) -> Vec<u8> {
        [
            self.tokens[a as usize].as_slice(),
            self.tokens[b as usize].as_slice(),
        ]
        .concat()
    }

    /// Records the merge `a b` and returns the id of the merged token (new or already known).
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        let bytes = self.concat(a, b);
        let id = match self.ids.get(&bytes) {
            Some(&id) => id,
            None => self.insert(bytes),
        };
        self.merges.push((a, b));
        id
    }

    /// Learns merges from `text` (most frequent adjacent pair first, ties to the smallest ids)
    /// until `target` tokens exist or no pair occurs twice.
    fn learn(&mut self, text: &str, target: usize) {
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for piece in pre_split(text) {
            *counts.entry(piece).or_default() += 1;
        }
        let mut words: Vec<(Vec<u32>, u64)> = counts
            .into_iter()
            .map(|(w, c)| (w.bytes().map(|b| self.ids[&vec![b]]).collect(), c))
            .collect();
        while self.tokens.len() < target {
            let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
            for (w, c) in &words {
                for p in w.windows(2) {
                    *pairs.entry((p[0], p[1])).or_default() += c;
                }
            }
            // The order is total, so the HashMap's iteration order cannot change the choice.
            let Some((&(a, b), &count)) = pairs
                .iter()
                .max_by(|x, y| x.1.cmp(y.1).then_with(|| y.0.cmp(x.0)))
            else {
                break;
            };
            if count < 2 {
                break;
            }
            let id = self.merge(a, b);
            for (w, _) in &mut words {
                let mut out = Vec::with_capacity(w.len());
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
                        out.push(id);
                        i += 2;
                    } else {
                        out.push(w[i]);
                        i += 1;
                    }
                }
                *w = out;
            }
        }
    }

    /// Adds random merges of short printable-ASCII tokens until `target` tokens exist, so the
    /// text a random model generates stays mostly readable.
    fn fill(&mut self, target: usize) {
        let mut rng = SplitMix64::new(FILL_SEED);
        let mut parts: Vec<u32> = (0..self.tokens.len() as u32)
            .filter(|&i| {
                let t = &self.tokens[i as usize];
                t.len() <= MAX_RANDOM_PART_BYTES && t.iter().all(|b| (b' '..=b'~').contains(b))
            })
            .collect();
        while self.tokens.len() < target {
            let a = parts[rng.below(parts.len())];
            let b = parts[rng.below(parts.len())];
            let bytes = self.concat(a, b);
            if self.ids.contains_key(&bytes) {
                continue;
            }
            let short = bytes.len() <= MAX_RANDOM_PART_BYTES;
            let id = self.merge(a, b);
            if short {
                parts.push(id);
            }
        }
    }
}

/// Splits training text roughly like the GPT-2/Qwen pre-tokenizer regex: a word with at most one
/// leading space, single digits, punctuation runs (with one leading space), whitespace runs. Only
/// used for learning merges, so it need not match the real regex exactly.
fn pre_split(text: &str) -> Vec<&str> {
    fn class(c: char) -> u8 {
        if c.is_alphabetic() {
            0
        } else if c.is_numeric() {
            1
        } else if c.is_whitespace() {
            2
        } else {
            3
        }
    }
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    // A space right before a word or punctuation belongs to that piece, not to a space run.
    let leads = |k: usize| {
        chars[k].1 == ' ' && k + 1 < chars.len() && matches!(class(chars[k + 1].1), 0 | 3)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let start = chars[i].0;
        let mut j = i;
        if leads(j) {
            j += 1;
        }
        let c = class(chars[j].1);
        j += 1;
        if c != 1 {
            while j < chars.len() && class(chars[j].1) == c && !(c == 2 && leads(j)) {
                j += 1;
            }
        }
        let end = chars.get(j).map_or(text.len(), |x| x.0);
        out.push(&text[start..end]);
        i = j;
    }
    out
}

/// Builds tokenizer.json and tokenizer_config.json for `plan`.
pub fn build(plan: &TokenizerPlan) -> Result<TokenizerFiles> {
    if plan.regular_tokens < 256 {
        bail!(
            "a byte-level tokenizer needs at least 256 ordinary tokens, the plan asks for {}",
            plan.regular_tokens
        );
    }
    for t in [&plan.eos_token, &plan.pad_token]
        .into_iter()
        .chain(plan.bos_token.as_ref())
    {
        if plan.special_id(t).is_none() {
            bail!("tokenizer plan: `{t}` is not one of the special tokens");
        }
    }
    let mut vocab = Vocab::bytes();
    vocab.learn(CORPUS, plan.regular_tokens);
    vocab.fill(plan.regular_tokens);

    let alphabet: HashMap<u8, char> = byte_alphabet().into_iter().collect();
    let spell = |bytes: &[u8]| -> String { bytes.iter().map(|b| alphabet[b]).collect() };
    let vocab_json: Map<String, Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (spell(t), json!(id)))
        .collect();
    // "a b" strings: byte-level tokens never contain a space (U+0020 is spelled `Ġ`), and every
    // tokenizers version reads this form.
    let merges: Vec<Value> = vocab
        .merges
        .iter()
        .map(|&(a, b)| {
            Value::String(format!(
                "{} {}",
                spell(&vocab.tokens[a as usize]),
                spell(&vocab.tokens[b as usize])
            ))
        })
        .collect();

    let added_tokens: Vec<Value> = plan
        .specials
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({
                "id": plan.regular_tokens + i,
                "content": content,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": true,
            })
        })
        .collect();
    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false,
    });
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": plan.split_regex},
                    "behavior": "Isolated",
                    "invert": false,
                },
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab_json,
            "merges": merges,
        },
    });

    let added_tokens_decoder: Map<String, Value> = plan
        .specials
        .iter()
        .enumerate()
        .map(|(i, content)| {
            (
                (plan.regular_tokens + i).to_string(),
                json!({
                    "content": content,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": true,
                }),
            )
        })
        .collect();
    let additional: Vec<&String> = plan
        .specials
        .iter()
        .filter(|s| **s != plan.pad_token && Some(*s) != plan.bos_token.as_ref())
        .collect();
    let tokenizer_config = json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": additional,
        "bos_token": plan.bos_token,
        "chat_template": plan.chat_template,
        "clean_up_tokenization_spaces": false,
        "eos_token": plan.eos_token,
        "errors": "replace",
        "model_max_length": plan.model_max_length,
        "pad_token": plan.pad_token,
        "split_special_tokens": false,
        "tokenizer_class": plan.tokenizer_class,
        "unk_token": null,
    });
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_gpt2s() {
        let a = byte_alphabet();
        assert_eq!(a.len(), 256);
        assert_eq!(a[0], (b'!', '!'));
        // Space is byte 32, the 33rd non-printable byte in order 0..=32 → U+0100 + 32 = 'Ġ'.
        assert!(a.contains(&(b' ', 'Ġ')));
        assert!(a.contains(&(b'\n', 'Ċ')));
        let chars: std::collections::HashSet<char> = a.iter().map(|x| x.1).collect();
        assert_eq!(chars.len(), 256);
    }

    #[test]
    fn learned_merges_cover_common_words() {
        let mut v = Vocab::bytes();
        v.learn(CORPUS, 2000);
        assert!(v.ids.contains_key(b" the".as_slice()));
        assert!(
            v.tokens.len() > 400,
            "only {} tokens learned",
            v.tokens.len()
        );
        v.fill(3000);
        assert_eq!(v.tokens.len(), 3000);
    }

    #[test]
    fn pre_split_attaches_one_space() {
        assert_eq!(
            pre_split("Hi  there, 42!"),
            vec!["Hi", " ", " there", ",", " ", "4", "2", "!"]
        );
    }
}

//! Benchmark prompts of an exact token length, built from ids rather than text: tokenizing text
//! cannot hit a length exactly, and ids can be kept clear of special tokens (which could stop
//! generation or trigger template-only behaviour).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use synth::rng::SplitMix64;

/// The ids a benchmark prompt may use: every id both the tokenizer and the model's embedding
/// know, minus the tokenizer's added (special and control) tokens.
#[derive(Debug, Clone)]
pub struct PromptIds {
    ids: Vec<u32>,
}

impl PromptIds {
    /// From a checkpoint folder's tokenizer.json and the model's vocabulary size.
    pub fn for_model(dir: &Path, tokenizer_vocab: usize, model_vocab: usize) -> Result<PromptIds> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let json: Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        let added: Vec<u32> = json
            .get("added_tokens")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.get("id")?.as_u64())
                    .map(|id| id as u32)
                    .collect()
            })
            .unwrap_or_default();
        PromptIds::new(tokenizer_vocab.min(model_vocab), &added)
    }

    /// Ids `0..vocab` without `excluded`.
    pub fn new(vocab: usize, excluded: &[u32]) -> Result<PromptIds> {
        let ids: Vec<u32> = (0..vocab as u32)
            .filter(|id| !excluded.contains(id))
            .collect();
        if ids.is_empty() {
            bail!("the vocabulary has no ordinary (non-special) token to build a prompt from");
        }
        Ok(PromptIds { ids })
    }

    /// `len` ids drawn from `seed`. The prompt of a shorter length is a prefix of a longer one,
    /// so lengths differ only in how much of the same text they hold.
    pub fn prompt(&self, len: usize, seed: u64) -> Vec<u32> {
        let mut rng = SplitMix64::new(seed);
        (0..len)
            .map(|_| self.ids[(rng.next_u64() % self.ids.len() as u64) as usize])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_exact_deterministic_prefixes_without_excluded_ids() {
        let p = PromptIds::new(50, &[0, 1, 2, 49]).unwrap();
        let a = p.prompt(300, 7);
        assert_eq!(a.len(), 300);
        assert!(a.iter().all(|&id| (3..49).contains(&id)));
        assert_eq!(p.prompt(300, 7), a);
        assert_eq!(p.prompt(64, 7), a[..64]);
        assert_ne!(p.prompt(64, 8), a[..64]);
        assert!(PromptIds::new(2, &[0, 1]).is_err());
    }
}

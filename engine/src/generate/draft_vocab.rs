//! The tokens an MTP head may draft: part of the vocabulary, so that each draft reads part of
//! the LM head (on the bench Qwen3.5 the whole head is a third of a plain step, and a round
//! at depth 2 ran two of them).
//!
//! Which part: ids below a bound, and every higher id the sequence already holds (its prompt
//! and output). Byte-level BPE vocabularies (Qwen's, Llama 3's) number their tokens in merge
//! order, so the low ids are the frequent ones; a text also repeats its own rarer tokens
//! (names, identifiers). On the Qwen2 vocabulary (151,936 ids) the first 32,768 ids hold
//! 92–93% of the tokens of English prose, Rust and Python, and 96–97% with the ids already
//! seen. A draft outside the set cannot be proposed, so acceptance drops by at most the share
//! of tokens outside it; the output does not change (greedy verification keeps only what the
//! model itself picks, and speculative sampling stays exact for any draft distribution).

use std::collections::HashSet;

use anyhow::Result;
use kernels::Tensor;

use super::sampler::{Dist, Sampler};

/// The draft vocabulary's default bound (`--mtp-draft-vocab`): the size EAGLE-3's draft
/// heads and FR-Spec's frequency-ranked heads use for 128k-token vocabularies.
pub const DEFAULT_DRAFT_VOCAB: usize = 32_768;

/// One sequence's draft vocabulary: ids `0..first`, then `extra` (ids at or above `first`
/// the sequence holds, in the order they came), as [`crate::models::SelfDrafter::draft_logits`]
/// lays out its columns.
#[derive(Debug, Clone)]
pub(crate) struct DraftVocab {
    first: usize,
    extra: Vec<u32>,
    seen: HashSet<u32>,
    /// How many output tokens [`DraftVocab::take`] has been given.
    taken: usize,
}

impl DraftVocab {
    /// The ids below `bound` (the whole vocabulary when `None` or larger) and the prompt's
    /// higher ids.
    pub fn new(bound: Option<usize>, vocab: usize, prompt: &[u32]) -> DraftVocab {
        let mut v = DraftVocab {
            first: bound.unwrap_or(vocab).min(vocab),
            extra: Vec::new(),
            seen: HashSet::new(),
            taken: 0,
        };
        v.add(prompt);
        v
    }

    fn add(&mut self, ids: &[u32]) {
        for &t in ids {
            if t as usize >= self.first && self.seen.insert(t) {
                self.extra.push(t);
            }
        }
    }

    /// Takes in the output tokens not seen yet (`output` is the whole output so far).
    pub fn take(&mut self, output: &[u32]) {
        let new = &output[self.taken.min(output.len())..];
        self.add(new);
        self.taken = output.len();
    }

    /// The ids `0..first` (a view of the LM head's leading rows).
    pub fn first(&self) -> usize {
        self.first
    }

    /// The higher ids after them.
    pub fn extra(&self) -> &[u32] {
        &self.extra
    }

    /// The token id of logits column `i`.
    pub fn token(&self, i: u32) -> u32 {
        match (i as usize).checked_sub(self.first) {
            None => i,
            Some(j) => self.extra[j],
        }
    }

    /// The draft from logits over this vocabulary: the argmax when greedy, else drawn (its
    /// distribution, over token ids, is returned beside for the acceptance test).
    pub fn pick(
        &self,
        logits: &Tensor,
        sampler: Option<&mut Sampler>,
    ) -> Result<(u32, Option<Dist>)> {
        Ok(match sampler {
            None => (self.token(kernels::ops::argmax(logits)?[0]), None),
            Some(s) => {
                let d = s.distribution(logits)?;
                let t = self.token(s.draw(&d));
                let d = Dist {
                    tokens: d.tokens.iter().map(|&i| self.token(i)).collect(),
                    ..d
                };
                (t, Some(d))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_map_to_the_leading_ids_then_the_seen_higher_ones_once() {
        let mut v = DraftVocab::new(Some(10), 100, &[3, 42, 7, 42, 11]);
        assert_eq!((v.first(), v.extra()), (10, &[42, 11][..]));
        v.take(&[5, 11, 99]);
        v.take(&[5, 11, 99, 12]);
        assert_eq!(v.extra(), &[42, 11, 99, 12]);
        let ids: Vec<u32> = (0..14).map(|i| v.token(i)).collect();
        let want: Vec<u32> = (0..10).chain([42, 11, 99, 12]).collect();
        assert_eq!(ids, want);
    }

    /// A draft over the columns names token ids: greedy, the id of the largest column; sampled,
    /// a distribution over the ids of the top columns, with each column's softmax weight.
    #[test]
    fn picks_name_the_token_ids_of_their_columns() {
        let v = DraftVocab::new(Some(4), 100, &[60, 2, 80]);
        // Columns: ids 0..4, then 60 and 80; the largest columns are 60, 3 and 80.
        let values = [0.5f32, -1.0, 0.0, 2.0, 3.0, 1.5];
        let logits = Tensor::from_f32(&[1, 6], values.to_vec()).unwrap();
        assert_eq!(v.pick(&logits, None).unwrap(), (60, None));
        let params = crate::generate::SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: 7,
        };
        let mut s = Sampler::new(params);
        let (t, d) = v.pick(&logits, Some(&mut s)).unwrap();
        let d = d.expect("a distribution");
        assert_eq!(d.tokens, [60, 3, 80]);
        assert!(d.tokens.contains(&t));
        let z: f64 = [3.0f64, 2.0, 1.5].iter().map(|x| x.exp()).sum();
        for (id, x) in [(60, 3.0f64), (3, 2.0), (80, 1.5), (0, f64::NEG_INFINITY)] {
            assert!(
                (d.prob(id) - x.exp() / z).abs() < 1e-6,
                "id {id}: {}",
                d.prob(id)
            );
        }
    }

    #[test]
    fn no_bound_or_a_bound_past_the_vocabulary_is_the_whole_vocabulary() {
        for bound in [None, Some(500)] {
            let v = DraftVocab::new(bound, 100, &[99, 3]);
            assert_eq!((v.first(), v.extra().len()), (100, 0));
        }
    }
}

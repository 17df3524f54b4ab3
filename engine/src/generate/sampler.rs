//! Turning one step's logits into a token: greedy at temperature 0, otherwise temperature,
//! top-k and top-p filtering followed by a seeded draw.

use anyhow::{ensure, Result};
use kernels::{ops, Tensor};

use super::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k limit.
    pub top_k: usize,
    /// 1 means no nucleus limit.
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingParams {
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be a finite number >= 0, got {}",
            self.temperature
        );
        ensure!(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top-p must be in (0, 1], got {}",
            self.top_p
        );
        Ok(())
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            params,
            rng: Rng::new(params.seed),
        }
    }

    /// Picks the next token from a `[V]` or `[1, V]` logits tensor.
    pub fn sample(&mut self, logits: &Tensor) -> Result<u32> {
        if self.params.temperature == 0.0 {
            return Ok(ops::argmax(logits)?[0]);
        }
        let d = self.distribution(logits)?;
        Ok(self.draw(&d))
    }

    /// The distribution a sampled step draws from (temperature > 0): the top-k candidates
    /// best first, softmax at the temperature, cut to the smallest prefix reaching top-p.
    pub fn distribution(&self, logits: &Tensor) -> Result<Dist> {
        let p = &self.params;
        let v = logits.dim(-1);
        let flat = logits.reshape(&[v])?;
        // Candidates best first; top-k = 0 keeps the whole vocabulary.
        let k = if p.top_k == 0 { v } else { p.top_k.min(v) };
        let cands = ops::top_k(&flat, k)?;
        let best = cands[0].1 as f64;
        let t = p.temperature as f64;
        let mut probs: Vec<f64> = cands
            .iter()
            .map(|&(_, l)| ((l as f64 - best) / t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        // Nucleus: the smallest prefix whose mass reaches top-p.
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        probs.truncate(keep);
        let mass = probs.iter().sum();
        Ok(Dist {
            tokens: cands[..keep].iter().map(|c| c.0).collect(),
            probs,
            mass,
        })
    }

    /// One seeded draw from `d`.
    pub fn draw(&mut self, d: &Dist) -> u32 {
        let mut u = self.rng.next_f64() * d.mass;
        for (i, &p) in d.probs.iter().enumerate() {
            u -= p;
            if u < 0.0 {
                return d.tokens[i];
            }
        }
        *d.tokens.last().expect("a distribution has a token")
    }

    /// A uniform draw in [0, 1) from the same seeded stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// A sampling distribution over a few tokens: `probs[i] / mass` is the probability of
/// `tokens[i]` (the weights are kept as [`Sampler::sample`] computed them, so draws stay
/// bit-identical to before the split).
#[derive(Debug, Clone, PartialEq)]
pub struct Dist {
    pub tokens: Vec<u32>,
    pub probs: Vec<f64>,
    pub mass: f64,
}

impl Dist {
    /// All mass on one token (a draft that was forced, not drawn).
    pub fn point(token: u32) -> Dist {
        Dist {
            tokens: vec![token],
            probs: vec![1.0],
            mass: 1.0,
        }
    }

    /// The probability of `token` (0 outside the support).
    pub fn prob(&self, token: u32) -> f64 {
        self.tokens
            .iter()
            .position(|&t| t == token)
            .map_or(0.0, |i| self.probs[i] / self.mass)
    }

    /// `max(0, self − other)`, renormalised: where speculative sampling draws after rejecting
    /// a draft from `other`. `None` when nothing is left (then `self ≤ other` everywhere, and
    /// a rejection could not have happened).
    pub fn residual(&self, other: &Dist) -> Option<Dist> {
        let probs: Vec<f64> = self
            .tokens
            .iter()
            .zip(&self.probs)
            .map(|(&t, &p)| (p / self.mass - other.prob(t)).max(0.0))
            .collect();
        let mass: f64 = probs.iter().sum();
        (mass > 0.0).then(|| Dist {
            tokens: self.tokens.clone(),
            probs,
            mass,
        })
    }
}

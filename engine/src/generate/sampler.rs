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
        let p = &self.params;
        if p.temperature == 0.0 {
            return Ok(ops::argmax(logits)?[0]);
        }
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
        let mass: f64 = probs[..keep].iter().sum();
        let mut u = self.rng.next_f64() * mass;
        for i in 0..keep {
            u -= probs[i];
            if u < 0.0 {
                return Ok(cands[i].0);
            }
        }
        Ok(cands[keep - 1].0)
    }
}

use anyhow::Result;
use kernels::{ops, ops::AttnParams, Tensor};

use super::params::params;
use super::{Linear, RmsNorm, Rope};
use crate::cache::KvCache;
use crate::weights::Scope;

#[derive(Debug, Clone)]
pub struct AttentionConfig {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// What a family's attention looks like: its shape and what it adds to the plain projections.
#[derive(Debug, Clone)]
pub struct AttentionSpec {
    pub cfg: AttentionConfig,
    pub hidden: usize,
    pub rope: Rope,
    /// Biases on `q_proj`, `k_proj` and `v_proj` (Llama's `attention_bias`; always in Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Names of the per-head q/k RMSNorms, when the family has them.
    pub qk_norm: Option<[&'static str; 2]>,
    pub eps: f32,
    /// The output projection's name (`o_proj`; LFM2's `out_proj`).
    pub out: &'static str,
    /// `q_proj` yields `[query | gate]` per head (Qwen3.5).
    pub output_gate: bool,
}

impl AttentionSpec {
    /// Plain GQA over `hidden`: `(heads, kv_heads, head_dim)`, no biases, no q/k norms, the
    /// output projection named `o_proj`, no output gate; families change what they add.
    pub fn plain(hidden: usize, (h, kv, d): (usize, usize, usize), rope: Rope, eps: f32) -> Self {
        AttentionSpec {
            cfg: AttentionConfig::gqa(h, kv, d),
            hidden,
            rope,
            qkv_bias: false,
            o_bias: false,
            qk_norm: None,
            eps,
            out: "o_proj",
            output_gate: false,
        }
    }
}

impl AttentionConfig {
    /// `heads` query heads over `kv_heads` K/V heads of `head_dim`, scaled by `1/√head_dim`,
    /// attending to every earlier position.
    pub fn gqa(heads: usize, kv_heads: usize, head_dim: usize) -> AttentionConfig {
        AttentionConfig {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }
}

/// Grouped-query attention with optional per-head q/k RMSNorm (Qwen3) and an optional
/// sigmoid output gate that `q_proj` emits beside the query (Qwen3.5's gated attention).
#[derive(Debug, Clone)]
pub struct GqaAttention {
    pub cfg: AttentionConfig,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Rope,
    /// When set, `q_proj` yields `[query | gate]` per head and the output is gated.
    pub output_gate: bool,
}

impl GqaAttention {
    /// Loads the projections (and per-head norms) under `s` (e.g. `model.layers.0.self_attn`).
    pub fn load(s: &Scope, spec: AttentionSpec) -> Result<GqaAttention> {
        let AttentionConfig {
            heads,
            kv_heads,
            head_dim,
            ..
        } = spec.cfg;
        let hidden = spec.hidden;
        let q_rows = heads * head_dim * if spec.output_gate { 2 } else { 1 };
        let lin = |name: &str, out, inp, bias| s.pp(name).linear_with_bias(out, inp, bias);
        let norm = |name: Option<&str>| name.map(|n| s.pp(n).norm(head_dim, spec.eps)).transpose();
        let [q_norm, k_norm] = spec.qk_norm.map_or([None, None], |n| n.map(Some));
        Ok(GqaAttention {
            q_proj: lin("q_proj", q_rows, hidden, spec.qkv_bias)?,
            k_proj: lin("k_proj", kv_heads * head_dim, hidden, spec.qkv_bias)?,
            v_proj: lin("v_proj", kv_heads * head_dim, hidden, spec.qkv_bias)?,
            o_proj: lin(spec.out, hidden, heads * head_dim, spec.o_bias)?,
            q_norm: norm(q_norm)?,
            k_norm: norm(k_norm)?,
            cfg: spec.cfg,
            rope: spec.rope,
            output_gate: spec.output_gate,
        })
    }

    /// `x` is `[T, hidden]` at absolute positions `cache.pos() ..`; appends to the cache.
    pub fn forward(&self, x: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        self.run(x, &mut [cache], false)
    }

    /// One decode step of several sequences: row `i` of `x` `[N, hidden]` is the new token of
    /// the sequence whose cache is `caches[i]`. Every row's result equals that sequence's
    /// [`GqaAttention::forward`] alone: projections run through `Linear::forward_rows`, and
    /// RoPE, the cache and attention per sequence.
    pub fn forward_batch(&self, x: &Tensor, caches: &mut [&mut KvCache]) -> Result<Tensor> {
        anyhow::ensure!(
            x.dim(0) == caches.len(),
            "a batched decode step has {} rows for {} sequences",
            x.dim(0),
            caches.len()
        );
        self.run(x, caches, true)
    }

    /// `rows`: one row per cache (a batch), else every row belongs to the only cache.
    fn run(&self, x: &Tensor, caches: &mut [&mut KvCache], rows: bool) -> Result<Tensor> {
        let c = &self.cfg;
        let t = x.dim(0);
        let proj = |l: &Linear, x: &Tensor| {
            if rows {
                l.forward_rows(x)
            } else {
                l.forward(x)
            }
        };
        let [q_all, k, v] = if rows {
            [
                proj(&self.q_proj, x)?,
                proj(&self.k_proj, x)?,
                proj(&self.v_proj, x)?,
            ]
        } else {
            Linear::forward_many([&self.q_proj, &self.k_proj, &self.v_proj], x)?
        };
        let (q, gate) = if self.output_gate {
            // Per head the projection holds [query (D) | gate (D)].
            let both = q_all.reshape(&[t * c.heads, 2, c.head_dim])?;
            let (q, g) = split_pairs(&both)?;
            (
                q.reshape(&[t, c.heads, c.head_dim])?,
                Some(g.reshape(&[t, c.heads * c.head_dim])?),
            )
        } else {
            (q_all.reshape(&[t, c.heads, c.head_dim])?, None)
        };
        let k = k.reshape(&[t, c.kv_heads, c.head_dim])?;
        let v = v.reshape(&[t, c.kv_heads, c.head_dim])?;
        let q = match &self.q_norm {
            Some(n) => n.forward(&q)?,
            None => q,
        };
        let k = match &self.k_norm {
            Some(n) => n.forward(&k)?,
            None => k,
        };
        let p = AttnParams {
            q_start: 0,
            kv_len: 0,
            scale: c.scale,
            window: c.window,
            softcap: c.softcap,
        };
        let per = if rows { 1 } else { t };
        let mut outs = Vec::with_capacity(caches.len());
        for (i, cache) in caches.iter_mut().enumerate() {
            let pick = |a: &Tensor| if rows { a.narrow0(i, 1) } else { Ok(a.clone()) };
            let start = cache.pos();
            let positions: Vec<usize> = (start..start + per).collect();
            let q = self.rope.forward(&pick(&q)?, &positions)?;
            let k = self.rope.forward(&pick(&k)?, &positions)?;
            cache.append(&k, &pick(&v)?)?;
            outs.push(cache.attend(&q, start, p)?);
        }
        let o = match outs.len() {
            1 => outs.pop().expect("one output"),
            _ => Tensor::cat0(&outs.iter().collect::<Vec<_>>())?,
        }
        .reshape(&[t, c.heads * c.head_dim])?;
        let o = match gate {
            Some(g) => ops::mul(&o, &ops::sigmoid(&g)?)?,
            None => o,
        };
        proj(&self.o_proj, &o)
    }
}

params!(GqaAttention: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm);

/// Splits `[N, 2, D]` into its two `[N, D]` halves (on whatever device `x` lives).
fn split_pairs(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let (n, d) = (x.dim(0), x.dim(2));
    let half = |i| -> Result<Tensor> { Ok(x.narrow(1, i, 1)?.reshape(&[n, d])?) };
    Ok((half(0)?, half(1)?))
}

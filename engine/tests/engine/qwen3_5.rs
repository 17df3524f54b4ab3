//! Qwen3.5 dense on hand-built checkpoints: the engine against a naive f64 reference written
//! here (one token at a time, straight from the formulas of mlx-lm's qwen3_5.py and
//! transformers' modeling_qwen3_5.py), both Gated DeltaNet paths, prefill in pieces,
//! multi-token forwards after a prefill, both name layouts, and loading errors.

use std::collections::BTreeMap;
use std::path::Path;

use engine::cache::{LayerState, ModelState};
use engine::generate::{self, GenerateRequest, SamplingParams};
use engine::layers::gated_delta::GDN_CHUNKED_MIN_TOKENS;
use engine::layers::GdnPath;
use engine::models::{self, CausalLm};
use kernels::Tensor;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// A tiny model: every size small, but with GQA in both mixers, partial RoPE and both layer kinds.

#[derive(Clone, Copy)]
struct Dims {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rot: usize,
    inter: usize,
    vocab: usize,
    k_heads: usize,
    v_heads: usize,
    dk: usize,
    dv: usize,
    conv_k: usize,
    interval: usize,
    theta: f64,
    eps: f64,
}

const D: Dims = Dims {
    hidden: 32,
    layers: 4,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    rot: 4, // head_dim · 0.25
    inter: 48,
    vocab: 64,
    k_heads: 2,
    v_heads: 4,
    dk: 16,
    dv: 8,
    conv_k: 4,
    interval: 2,
    theta: 10_000.0,
    eps: 1e-6,
};

impl Dims {
    fn full(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.interval)
    }
    fn conv_c(&self) -> usize {
        2 * self.k_heads * self.dk + self.v_heads * self.dv
    }
}

struct Rng(u64);

impl Rng {
    /// Uniform in [-1, 1).
    fn u(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// Logical weights by layout-free name (true norm values, conv taps `[C, K]`).
struct Weights {
    t: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
}

impl Weights {
    fn get(&self, name: &str) -> &[f64] {
        &self
            .t
            .get(name)
            .unwrap_or_else(|| panic!("test weight {name}"))
            .1
    }
}

struct Builder {
    rng: Rng,
    t: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
}

impl Builder {
    /// A tensor of `f(u)` for uniform `u` in [-1, 1).
    fn put(&mut self, name: String, shape: Vec<usize>, f: impl Fn(f64) -> f64) {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| f(self.rng.u())).collect();
        self.t.insert(name, (shape, v));
    }

    fn linear(&mut self, name: String, out: usize, inp: usize) {
        let s = 1.5 / (inp as f64).sqrt();
        self.put(name, vec![out, inp], |u| s * u);
    }

    fn norm(&mut self, name: String, n: usize) {
        self.put(name, vec![n], |u| 1.0 + 0.3 * u);
    }

    fn layer(&mut self, d: &Dims, p: &str, full: bool) {
        let h = d.hidden;
        self.norm(format!("{p}.input_layernorm.weight"), h);
        self.norm(format!("{p}.post_attention_layernorm.weight"), h);
        self.linear(format!("{p}.mlp.gate_proj.weight"), d.inter, h);
        self.linear(format!("{p}.mlp.up_proj.weight"), d.inter, h);
        self.linear(format!("{p}.mlp.down_proj.weight"), h, d.inter);
        if full {
            let a = format!("{p}.self_attn");
            self.linear(format!("{a}.q_proj.weight"), 2 * d.heads * d.head_dim, h);
            self.linear(format!("{a}.k_proj.weight"), d.kv_heads * d.head_dim, h);
            self.linear(format!("{a}.v_proj.weight"), d.kv_heads * d.head_dim, h);
            self.linear(format!("{a}.o_proj.weight"), h, d.heads * d.head_dim);
            self.norm(format!("{a}.q_norm.weight"), d.head_dim);
            self.norm(format!("{a}.k_norm.weight"), d.head_dim);
        } else {
            let a = format!("{p}.linear_attn");
            self.linear(format!("{a}.in_proj_qkv.weight"), d.conv_c(), h);
            self.linear(format!("{a}.in_proj_z.weight"), d.v_heads * d.dv, h);
            self.linear(format!("{a}.in_proj_b.weight"), d.v_heads, h);
            self.linear(format!("{a}.in_proj_a.weight"), d.v_heads, h);
            self.linear(format!("{a}.out_proj.weight"), h, d.v_heads * d.dv);
            self.put(
                format!("{a}.conv1d.weight"),
                vec![d.conv_c(), d.conv_k],
                |u| 0.6 * u,
            );
            // A = exp(A_log) in [0.5, 8]: decays from mild to strong.
            self.put(format!("{a}.A_log"), vec![d.v_heads], |u| {
                (4.25 + 3.75 * u).ln()
            });
            self.put(format!("{a}.dt_bias"), vec![d.v_heads], |u| 0.5 * u);
            self.norm(format!("{a}.norm.weight"), d.dv);
        }
    }
}

fn make_weights(d: &Dims, seed: u64) -> Weights {
    let mut b = Builder {
        rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        t: BTreeMap::new(),
    };
    let h = d.hidden;
    b.put("embed_tokens.weight".into(), vec![d.vocab, h], |u| u);
    for i in 0..d.layers {
        b.layer(d, &format!("layers.{i}"), d.full(i));
    }
    b.norm("norm.weight".into(), h);
    let s = 3.0 / (h as f64).sqrt();
    b.put("lm_head.weight".into(), vec![d.vocab, h], |u| s * u);
    b.linear("mtp.fc.weight".into(), h, 2 * h);
    b.norm("mtp.pre_fc_norm_embedding.weight".into(), h);
    b.norm("mtp.pre_fc_norm_hidden.weight".into(), h);
    b.norm("mtp.norm.weight".into(), h);
    b.layer(d, "mtp.layers.0", true);
    Weights { t: b.t }
}

// ---------------------------------------------------------------------------------------------
// Checkpoint writing: an f32 safetensors file built by hand, in either name layout.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    /// mlx-lm: `language_model.model.*`, conv `[C, K, 1]`, norms as is, no `mtp.*`, flat config.
    Mlx,
    /// Original: `model.language_model.*`, `lm_head`, `mtp.*`, conv `[C, 1, K]`, decoder norms
    /// as `w − 1`, config nested under `text_config`.
    Hf,
}

/// Decoder norms that original checkpoints store as `w − 1` (not the gated GDN norm).
fn is_offset_norm(name: &str) -> bool {
    [
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
    ]
    .iter()
    .any(|s| name.ends_with(s))
        || [
            "norm.weight",
            "mtp.norm.weight",
            "mtp.pre_fc_norm_embedding.weight",
            "mtp.pre_fc_norm_hidden.weight",
        ]
        .contains(&name)
}

fn stored(layout: Layout, name: &str) -> Option<String> {
    let mtp = name.starts_with("mtp.");
    Some(match layout {
        Layout::Mlx if mtp => return None,
        Layout::Mlx if name == "lm_head.weight" => "language_model.lm_head.weight".into(),
        Layout::Mlx => format!("language_model.model.{name}"),
        Layout::Hf if mtp || name == "lm_head.weight" => name.into(),
        Layout::Hf => format!("model.language_model.{name}"),
    })
}

fn config(d: &Dims, layout: Layout) -> Value {
    let mut text = json!({
        "hidden_size": d.hidden,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "intermediate_size": d.inter,
        "vocab_size": d.vocab,
        "rms_norm_eps": d.eps,
        "max_position_embeddings": 4096,
        "linear_num_key_heads": d.k_heads,
        "linear_num_value_heads": d.v_heads,
        "linear_key_head_dim": d.dk,
        "linear_value_head_dim": d.dv,
        "linear_conv_kernel_dim": d.conv_k,
        "full_attention_interval": d.interval,
        "tie_word_embeddings": false,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": d.theta,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": true
        }
    });
    match layout {
        Layout::Mlx => {
            text["model_type"] = json!("qwen3_5");
            text
        }
        Layout::Hf => {
            text["model_type"] = json!("qwen3_5_text");
            text["mtp_num_hidden_layers"] = json!(1);
            text["layer_types"] = json!((0..d.layers)
                .map(|i| if d.full(i) {
                    "full_attention"
                } else {
                    "linear_attention"
                })
                .collect::<Vec<_>>());
            json!({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": false})
        }
    }
}

/// A safetensors file of F32 tensors, written by the `safetensors` crate.
fn safetensors(entries: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = entries
        .iter()
        .map(|(_, _, data)| data.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = entries.iter().zip(&bytes).map(|((name, shape, _), b)| {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b);
        (name.clone(), view.unwrap())
    });
    safetensors::serialize(views, None).unwrap()
}

/// Writes `w` in `layout` to `dir`, leaving out the tensors named in `skip` (stored names).
fn write(dir: &Path, d: &Dims, w: &Weights, layout: Layout, skip: &[&str]) {
    let mut entries = Vec::new();
    for (name, (shape, vals)) in &w.t {
        let Some(sname) = stored(layout, name) else {
            continue;
        };
        if skip.contains(&sname.as_str()) {
            continue;
        }
        let mut shape = shape.clone();
        if name.ends_with("conv1d.weight") {
            shape = match layout {
                Layout::Mlx => vec![shape[0], shape[1], 1],
                Layout::Hf => vec![shape[0], 1, shape[1]],
            };
        }
        let offset = layout == Layout::Hf && is_offset_norm(name);
        let data = vals
            .iter()
            .map(|&v| if offset { (v - 1.0) as f32 } else { v as f32 })
            .collect();
        entries.push((sname, shape, data));
    }
    std::fs::write(dir.join("model.safetensors"), safetensors(&entries)).unwrap();
    std::fs::write(dir.join("config.json"), config(d, layout).to_string()).unwrap();
}

fn load(d: &Dims, w: &Weights, layout: Layout) -> (tempfile::TempDir, Box<dyn CausalLm>) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), d, w, layout, &[]);
    let m = models::load(dir.path()).unwrap_or_else(|e| panic!("loading {layout:?}: {e:#}"));
    (dir, m)
}

// ---------------------------------------------------------------------------------------------
// The reference: f64, one token at a time, every formula written out.

fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, v)| v * r * w.map_or(1.0, |w| w[i]))
        .collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

enum RefLayer {
    Linear { hist: Vec<Vec<f64>>, s: Vec<f64> },
    Full { k: Vec<Vec<f64>>, v: Vec<Vec<f64>> },
}

struct Reference<'a> {
    d: Dims,
    w: &'a Weights,
    layers: Vec<RefLayer>,
}

impl<'a> Reference<'a> {
    fn new(d: Dims, w: &'a Weights) -> Reference<'a> {
        let layers = (0..d.layers)
            .map(|i| {
                if d.full(i) {
                    RefLayer::Full {
                        k: vec![],
                        v: vec![],
                    }
                } else {
                    RefLayer::Linear {
                        hist: vec![vec![0.0; d.conv_c()]; d.conv_k - 1],
                        s: vec![0.0; d.v_heads * d.dv * d.dk],
                    }
                }
            })
            .collect();
        Reference { d, w, layers }
    }

    /// Logits after one more token.
    fn step(&mut self, tok: u32) -> Vec<f64> {
        let (d, w) = (self.d, self.w);
        let h = d.hidden;
        let mut x = w.get("embed_tokens.weight")[tok as usize * h..(tok as usize + 1) * h].to_vec();
        for (i, st) in self.layers.iter_mut().enumerate() {
            let p = format!("layers.{i}");
            let g = |n: &str| wt(w, &p, n);
            let xn = rms_norm(&x, Some(g("input_layernorm.weight")), d.eps);
            let r = match st {
                RefLayer::Linear { hist, s } => {
                    linear_attn(&d, w, &format!("{p}.linear_attn"), &xn, hist, s)
                }
                RefLayer::Full { k, v } => full_attn(&d, w, &format!("{p}.self_attn"), &xn, k, v),
            };
            x.iter_mut().zip(&r).for_each(|(a, b)| *a += b);
            let xn = rms_norm(&x, Some(g("post_attention_layernorm.weight")), d.eps);
            let gate = matvec(g("mlp.gate_proj.weight"), &xn);
            let up = matvec(g("mlp.up_proj.weight"), &xn);
            let act: Vec<f64> = gate.iter().zip(&up).map(|(a, b)| silu(*a) * b).collect();
            let r = matvec(g("mlp.down_proj.weight"), &act);
            x.iter_mut().zip(&r).for_each(|(a, b)| *a += b);
        }
        matvec(
            w.get("lm_head.weight"),
            &rms_norm(&x, Some(w.get("norm.weight")), d.eps),
        )
    }
}

/// The weight `<p>.<n>`.
fn wt<'w>(w: &'w Weights, p: &str, n: &str) -> &'w [f64] {
    w.get(&format!("{p}.{n}"))
}

fn linear_attn(
    d: &Dims,
    w: &Weights,
    p: &str,
    x: &[f64],
    hist: &mut Vec<Vec<f64>>,
    s: &mut [f64],
) -> Vec<f64> {
    let g = |n: &str| wt(w, p, n);
    let c = d.conv_c();
    let qkv = matvec(g("in_proj_qkv.weight"), x);
    let z = matvec(g("in_proj_z.weight"), x);
    let b = matvec(g("in_proj_b.weight"), x);
    let a = matvec(g("in_proj_a.weight"), x);
    // Depthwise causal conv: tap K−1 sees the current input, tap 0 the oldest.
    hist.push(qkv);
    let conv = g("conv1d.weight");
    let mixed: Vec<f64> = (0..c)
        .map(|ch| {
            silu(
                (0..d.conv_k)
                    .map(|j| conv[ch * d.conv_k + j] * hist[j][ch])
                    .sum(),
            )
        })
        .collect();
    hist.remove(0);
    let kw = d.k_heads * d.dk;
    let l2 = |v: &[f64]| -> Vec<f64> {
        let n = (v.iter().map(|x| x * x).sum::<f64>() + 1e-6).sqrt();
        v.iter().map(|x| x / n).collect()
    };
    let (a_log, dt_bias) = (g("A_log"), g("dt_bias"));
    let mut y = vec![0.0; d.v_heads * d.dv];
    for hv in 0..d.v_heads {
        let hk = hv / (d.v_heads / d.k_heads);
        let q: Vec<f64> = l2(&mixed[hk * d.dk..(hk + 1) * d.dk])
            .iter()
            .map(|v| v / (d.dk as f64).sqrt())
            .collect();
        let k = l2(&mixed[kw + hk * d.dk..kw + (hk + 1) * d.dk]);
        let v = &mixed[2 * kw + hv * d.dv..2 * kw + (hv + 1) * d.dv];
        let beta = sigmoid(b[hv]);
        let decay = (-a_log[hv].exp() * softplus(a[hv] + dt_bias[hv])).exp();
        let sh = &mut s[hv * d.dv * d.dk..(hv + 1) * d.dv * d.dk];
        for r in 0..d.dv {
            let row = &mut sh[r * d.dk..(r + 1) * d.dk];
            row.iter_mut().for_each(|e| *e *= decay);
            let kv: f64 = row.iter().zip(&k).map(|(a, b)| a * b).sum();
            let delta = beta * (v[r] - kv);
            row.iter_mut().zip(&k).for_each(|(e, kk)| *e += delta * kk);
            y[hv * d.dv + r] = row.iter().zip(&q).map(|(a, b)| a * b).sum();
        }
    }
    let nw = g("norm.weight");
    let mut out = Vec::with_capacity(y.len());
    for hv in 0..d.v_heads {
        let n = rms_norm(&y[hv * d.dv..(hv + 1) * d.dv], Some(nw), d.eps);
        out.extend(
            n.iter()
                .enumerate()
                .map(|(i, v)| v * silu(z[hv * d.dv + i])),
        );
    }
    matvec(g("out_proj.weight"), &out)
}

fn rope(v: &mut [f64], pos: usize, d: &Dims) {
    let half = d.rot / 2;
    for i in 0..half {
        let ang = pos as f64 * d.theta.powf(-2.0 * i as f64 / d.rot as f64);
        let (x0, x1) = (v[i], v[i + half]);
        v[i] = x0 * ang.cos() - x1 * ang.sin();
        v[i + half] = x1 * ang.cos() + x0 * ang.sin();
    }
}

fn full_attn(
    d: &Dims,
    w: &Weights,
    p: &str,
    x: &[f64],
    ks: &mut Vec<Vec<f64>>,
    vs: &mut Vec<Vec<f64>>,
) -> Vec<f64> {
    let g = |n: &str| wt(w, p, n);
    let hd = d.head_dim;
    let qg = matvec(g("q_proj.weight"), x);
    let kp = matvec(g("k_proj.weight"), x);
    let vp = matvec(g("v_proj.weight"), x);
    let pos = ks.len();
    let mut k = Vec::new();
    for kh in 0..d.kv_heads {
        let mut kk = rms_norm(&kp[kh * hd..(kh + 1) * hd], Some(g("k_norm.weight")), d.eps);
        rope(&mut kk, pos, d);
        k.extend(kk);
    }
    ks.push(k);
    vs.push(vp);
    let mut out = vec![0.0; d.heads * hd];
    for h in 0..d.heads {
        // Per head, q_proj holds [query | gate].
        let mut q = rms_norm(
            &qg[2 * h * hd..2 * h * hd + hd],
            Some(g("q_norm.weight")),
            d.eps,
        );
        rope(&mut q, pos, d);
        let gate = &qg[2 * h * hd + hd..2 * (h + 1) * hd];
        let kh = h / (d.heads / d.kv_heads);
        let scores: Vec<f64> = ks
            .iter()
            .map(|k| {
                q.iter()
                    .zip(&k[kh * hd..(kh + 1) * hd])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for j in 0..hd {
            let o: f64 = e
                .iter()
                .zip(vs.iter())
                .map(|(p, v)| p * v[kh * hd + j])
                .sum::<f64>()
                / z;
            out[h * hd + j] = o * sigmoid(gate[j]);
        }
    }
    matvec(g("o_proj.weight"), &out)
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut r = Rng(seed | 1);
    (0..n)
        .map(|_| ((r.u() + 1.0) * 0.5 * D.vocab as f64) as u32 % D.vocab as u32)
        .collect()
}

/// `rms(a − b) / rms(b)`.
fn err_ratio(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec_f32().unwrap().iter().map(|&v| v as f64).collect()
}

fn forward(m: &dyn CausalLm, ids: &[u32], st: &mut ModelState, all: bool) -> Vec<f32> {
    m.forward(ids, st, all).unwrap().to_vec_f32().unwrap()
}

fn state_with(m: &dyn CausalLm, path: GdnPath) -> ModelState {
    let mut s = m.new_state();
    s.gdn_path = path;
    s
}

/// Largest error ratio between two states' tensors (KV: the valid positions only).
fn state_err(a: &ModelState, b: &ModelState) -> f64 {
    assert_eq!(a.pos, b.pos);
    let mut worst: f64 = 0.0;
    for (la, lb) in a.layers.iter().zip(&b.layers) {
        let pairs: Vec<(Tensor, Tensor)> = match (la, lb) {
            (LayerState::Recurrent(x), LayerState::Recurrent(y)) => {
                vec![
                    (x.conv.clone(), y.conv.clone()),
                    (x.ssm.clone(), y.ssm.clone()),
                ]
            }
            (LayerState::Kv(x), LayerState::Kv(y)) => {
                assert_eq!(x.len, y.len);
                let valid = |t: &Tensor| t.narrow(1, 0, x.len).unwrap();
                vec![(valid(&x.k), valid(&y.k)), (valid(&x.v), valid(&y.v))]
            }
            _ => panic!("layer kinds differ"),
        };
        for (x, y) in pairs {
            worst = worst.max(err_ratio(&x.to_vec_f32().unwrap(), &f64s(&y)));
        }
    }
    worst
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn engine_matches_f64_reference_on_both_paths_and_layouts() {
    let w = make_weights(&D, 1);
    let ids = prompt(100, 7); // two chunks: 64 + a padded tail of 36
    let mut r = Reference::new(D, &w);
    let want: Vec<Vec<f64>> = ids.iter().map(|&t| r.step(t)).collect();
    for layout in [Layout::Mlx, Layout::Hf] {
        let (_dir, m) = load(&D, &w, layout);
        for path in [GdnPath::PerStep, GdnPath::Chunked] {
            let mut st = state_with(m.as_ref(), path);
            let got = forward(m.as_ref(), &ids, &mut st, true);
            for (t, row) in want.iter().enumerate() {
                let e = err_ratio(&got[t * D.vocab..(t + 1) * D.vocab], row);
                assert!(
                    e < 1e-4,
                    "{layout:?} {path}: position {t} logits off by error ratio {e:.2e}"
                );
            }
        }
    }
}

#[test]
fn layouts_are_detected_with_their_norm_convention_and_mtp() {
    let w = make_weights(&D, 2);
    for layout in [Layout::Mlx, Layout::Hf] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &D, &w, layout, &[]);
        let cfg = engine::config::ModelConfig::load(dir.path()).unwrap();
        let store = engine::weights::WeightStore::open(dir.path()).unwrap();
        let m = engine::models::qwen3_5::Qwen3_5::load(&cfg, &store).unwrap();
        let (want_layout, offset, mtp) = match layout {
            Layout::Mlx => (engine::models::qwen3_5::Layout::Mlx, false, false),
            Layout::Hf => (engine::models::qwen3_5::Layout::Hf, true, true),
        };
        assert_eq!(m.layout(), want_layout);
        assert_eq!(m.norms_offset(), offset, "{layout:?}");
        assert_eq!(m.mtp().is_some(), mtp, "{layout:?}");
        if let Some(mtp) = m.mtp() {
            assert_eq!(mtp.layers.len(), 1);
            // Offset undone: the stored w − 1 comes back as w.
            let got = mtp.norm.weight.to_vec_f32().unwrap();
            assert!(err_ratio(&got, w.get("mtp.norm.weight")) < 1e-6);
        }
        let kinds = &m.info().layer_kinds;
        assert_eq!(
            kinds,
            &[
                "linear_attention",
                "full_attention",
                "linear_attention",
                "full_attention"
            ]
        );
        assert_eq!(m.info().family, "qwen3_5");
    }
}

#[test]
fn hf_and_mlx_layouts_give_the_same_logits() {
    let w = make_weights(&D, 3);
    let ids = prompt(70, 5);
    let (_a, mlx) = load(&D, &w, Layout::Mlx);
    let (_b, hf) = load(&D, &w, Layout::Hf);
    let a = forward(mlx.as_ref(), &ids, &mut mlx.new_state(), true);
    let b = forward(hf.as_ref(), &ids, &mut hf.new_state(), true);
    let b: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    // Only the f32 rounding of the stored `w − 1` differs.
    let e = err_ratio(&a, &b);
    assert!(e < 1e-5, "layouts disagree: error ratio {e:.2e}");
}

#[test]
fn prefill_in_pieces_gives_the_state_of_one_piece() {
    let w = make_weights(&D, 4);
    let (_dir, m) = load(&D, &w, Layout::Hf);
    let ids = prompt(150, 11);
    let mut one = state_with(m.as_ref(), GdnPath::Auto); // 150 ≥ 64: chunked
    let want = forward(m.as_ref(), &ids, &mut one, false);
    let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
    // Pieces of 40 step under auto; pieces of 70 and 64 run chunked with a carried state.
    for (piece, path) in [
        (40, GdnPath::Auto),
        (70, GdnPath::Auto),
        (64, GdnPath::Chunked),
        (1, GdnPath::PerStep),
    ] {
        let mut st = state_with(m.as_ref(), path);
        let mut got = Vec::new();
        for p in ids.chunks(piece) {
            got = forward(m.as_ref(), p, &mut st, false);
        }
        let e = err_ratio(&got, &want);
        assert!(
            e < 1e-4,
            "pieces of {piece} ({path}): next-token logits off by {e:.2e}"
        );
        let e = state_err(&st, &one);
        assert!(e < 1e-4, "pieces of {piece} ({path}): state off by {e:.2e}");
    }
}

#[test]
fn multi_token_forward_after_prefill_equals_single_steps() {
    let w = make_weights(&D, 5);
    let (_dir, m) = load(&D, &w, Layout::Mlx);
    let ids = prompt(80, 13);
    let more = prompt(6, 17);
    for path in [GdnPath::Auto, GdnPath::Chunked, GdnPath::PerStep] {
        let mut base = state_with(m.as_ref(), path);
        forward(m.as_ref(), &ids, &mut base, false);
        let mut batch = base.clone();
        let all = forward(m.as_ref(), &more, &mut batch, true);
        let mut single = base.clone();
        for (i, &t) in more.iter().enumerate() {
            let row = forward(m.as_ref(), &[t], &mut single, false);
            let want: Vec<f64> = row.iter().map(|&v| v as f64).collect();
            let e = err_ratio(&all[i * D.vocab..(i + 1) * D.vocab], &want);
            assert!(
                e < 1e-4,
                "{path}: token {i} of the multi-token forward off by {e:.2e}"
            );
        }
        let e = state_err(&batch, &single);
        assert!(e < 1e-4, "{path}: states differ by {e:.2e}");
        // The snapshot taken before was not disturbed by either continuation.
        assert_eq!(base.pos, ids.len());
    }
}

#[test]
fn greedy_decode_after_a_300_token_prefill_agrees_across_paths_and_with_the_reference() {
    let w = make_weights(&D, 6);
    let (_dir, m) = load(&D, &w, Layout::Hf);
    let ids = prompt(300, 19);
    let run = |path: GdnPath, step: Option<usize>| {
        let req = GenerateRequest {
            prompt_ids: ids.clone(),
            max_tokens: 20,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            top_logprobs: 0,
            prefill_step: step,
            gdn_path: path,
            flat_kv: false,
            mtp: None,
            paged_kv: None,
            kernels: Default::default(),
        };
        generate::generate(m.as_ref(), &req, |_| {}).unwrap().tokens
    };
    let per_step = run(GdnPath::PerStep, None);
    let chunked = run(GdnPath::Chunked, None);
    let pieces = run(GdnPath::Auto, Some(100));
    assert_eq!(per_step.len(), 20);
    assert_eq!(per_step, chunked, "per-step vs chunked greedy tokens");
    assert_eq!(
        per_step, pieces,
        "per-step vs auto with 100-token prefill pieces"
    );

    let mut r = Reference::new(D, &w);
    let mut logits = ids.iter().map(|&t| r.step(t)).last().unwrap();
    let argmax = |l: &[f64]| {
        (0..l.len())
            .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
            .unwrap() as u32
    };
    let mut want = Vec::new();
    for _ in 0..20 {
        let t = argmax(&logits);
        want.push(t);
        logits = r.step(t);
    }
    assert_eq!(per_step, want, "engine vs f64 reference greedy tokens");
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let w = make_weights(&D, 7);
    let missing = "model.language_model.layers.2.linear_attn.A_log";
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &D, &w, Layout::Hf, &[missing]);
    let err = format!(
        "{:#}",
        models::load(dir.path()).err().expect("loading must fail")
    );
    assert!(
        err.contains(missing),
        "error does not name `{missing}`: {err}"
    );

    let missing = "language_model.model.layers.1.self_attn.q_norm.weight";
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &D, &w, Layout::Mlx, &[missing]);
    let err = format!(
        "{:#}",
        models::load(dir.path()).err().expect("loading must fail")
    );
    assert!(
        err.contains(missing),
        "error does not name `{missing}`: {err}"
    );

    // A config whose `layer_types` contradicts `full_attention_interval`.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &D, &w, Layout::Hf, &[]);
    let mut cfg = config(&D, Layout::Hf);
    cfg["text_config"]["layer_types"][0] = json!("full_attention");
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let err = format!(
        "{:#}",
        models::load(dir.path()).err().expect("loading must fail")
    );
    assert!(err.contains("layer_types"), "{err}");
}

#[test]
fn gdn_path_names_and_routing() {
    for (s, p) in [
        ("auto", GdnPath::Auto),
        ("perstep", GdnPath::PerStep),
        ("chunked", GdnPath::Chunked),
    ] {
        assert_eq!(s.parse::<GdnPath>().unwrap(), p);
        assert_eq!(p.to_string(), s);
    }
    let err = "fast".parse::<GdnPath>().unwrap_err();
    assert!(err.contains("auto, perstep, chunked"), "{err}");
    assert!(!GdnPath::Auto.chunked_for(GDN_CHUNKED_MIN_TOKENS - 1));
    assert!(GdnPath::Auto.chunked_for(GDN_CHUNKED_MIN_TOKENS));
    assert!(!GdnPath::Auto.chunked_for(1));
    assert!(GdnPath::Chunked.chunked_for(2) && !GdnPath::Chunked.chunked_for(1));
    assert!(!GdnPath::PerStep.chunked_for(4096));
    assert_eq!(
        GdnPath::resolve(Some(GdnPath::PerStep)).unwrap(),
        GdnPath::PerStep
    );
}

//! The sparse mixture-of-experts ops on the CPU backend against naive f64 references written
//! here from their definitions, in every weight format; unselected experts must never be read
//! (their weights poisoned with NaN leave the output bit-identical); same bits in pools of 1
//! and 2 threads.

use crate::common;

use common::{formats, poison, values, weight_in};
use kernels::ops::{self, MoeRoutes, Routing};
use kernels::{quant, Tensor, Weight};

/// The weight's values as the kernels see them (dense widened, quantized decoded), in f64.
fn dequantized(w: &Weight) -> Vec<f64> {
    match w {
        Weight::Dense(t) => t.to_vec_f32().unwrap().iter().map(|&v| v as f64).collect(),
        Weight::Quant(q) => quant::dequantize(q)
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
    }
}

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output");
        num += (g as f64 - w).powi(2);
        den += w * w;
    }
    num / den.max(1e-300)
}

/// A routing of `tokens` tokens to `k` distinct experts each, leaving experts ≥ `used` unused.
fn routes(tokens: usize, k: usize, used: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let r = values(tokens * k, seed);
    let mut rows = Vec::new();
    let mut ids = Vec::new();
    for t in 0..tokens {
        let first = ((r[t * k] + 1.0) * 0.5 * used as f32) as usize % used;
        for j in 0..k {
            rows.push(t as u32);
            ids.push(((first + j) % used) as u32);
        }
    }
    (rows, ids)
}

const E: usize = 8;
const N: usize = 32;
const K: usize = 128;

#[test]
fn gather_matmul_matches_naive_reference_in_every_format() {
    for (name, spec, dtype) in formats() {
        let w = weight_in(&values(E * N * K, 3), E * N, K, spec, dtype);
        let wv = dequantized(&w);
        // Decode-shaped (1 token) and prefill-shaped (many tokens per expert) inputs.
        for tokens in [1usize, 3, 40] {
            let x = values(tokens * K, 5 + tokens as u64);
            let (rows, ids) = routes(tokens, 2, 6, tokens as u64);
            let got = ops::gather_matmul(
                &Tensor::from_f32(&[tokens, K], x.clone()).unwrap(),
                &w,
                E,
                &rows,
                &ids,
            )
            .unwrap();
            assert_eq!(got.shape(), [rows.len(), N]);
            let mut want = vec![0.0f64; rows.len() * N];
            for p in 0..rows.len() {
                let (t, e) = (rows[p] as usize, ids[p] as usize);
                for n in 0..N {
                    let wr = &wv[(e * N + n) * K..(e * N + n + 1) * K];
                    want[p * N + n] = (0..K).map(|k| x[t * K + k] as f64 * wr[k]).sum();
                }
            }
            let err = nmse(got.f32s().unwrap(), &want);
            assert!(err < 1e-10, "{name}, {tokens} tokens: NMSE {err:e}");
        }
    }
}

#[test]
fn unselected_experts_are_never_read() {
    for (name, spec, dtype) in formats() {
        let w = weight_in(&values(E * N * K, 7), E * N, K, spec, dtype);
        let (rows, ids) = routes(40, 2, 5, 9);
        let used: Vec<usize> = (0..5).collect();
        let poisoned = poison(&w, E, &used);
        // The poison is real: the unused experts decode to non-finite values.
        let bad = dequantized(&poisoned);
        assert!(
            bad[5 * N * K..].iter().any(|v| !v.is_finite()),
            "{name}: poison not applied"
        );
        for tokens in [1usize, 40] {
            let x = Tensor::from_f32(&[40, K], values(40 * K, 11)).unwrap();
            let (r, i) = (&rows[..tokens * 2], &ids[..tokens * 2]);
            let clean = ops::gather_matmul(&x, &w, E, r, i).unwrap();
            let dirty = ops::gather_matmul(&x, &poisoned, E, r, i).unwrap();
            assert_eq!(
                clean.f32s().unwrap(),
                dirty.f32s().unwrap(),
                "{name}, {tokens} tokens: an unselected expert was read"
            );
        }
    }
}

#[test]
fn moe_route_takes_the_top_k_of_the_softmax() {
    let (t, e, k) = (9, 16, 4);
    let logits = values(t * e, 21)
        .iter()
        .map(|v| v * 6.0)
        .collect::<Vec<_>>();
    let x = Tensor::from_f32(&[t, e], logits.clone()).unwrap();
    for renorm in [false, true] {
        let r: MoeRoutes = ops::moe_route(&x, k, renorm).unwrap();
        assert_eq!((r.top_k, r.experts.len(), r.tokens()), (k, t * k, t));
        for row in 0..t {
            let l = &logits[row * e..(row + 1) * e];
            let m = l.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let z: f64 = l.iter().map(|&v| (v as f64 - m).exp()).sum();
            let p: Vec<f64> = l.iter().map(|&v| (v as f64 - m).exp() / z).collect();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
            let top = &order[..k];
            let sum: f64 = top.iter().map(|&i| p[i]).sum();
            for j in 0..k {
                assert_eq!(
                    r.experts[row * k + j] as usize,
                    top[j],
                    "row {row} rank {j}"
                );
                let want = if renorm { p[top[j]] / sum } else { p[top[j]] };
                let got = r.weights[row * k + j] as f64;
                assert!((got - want).abs() < 1e-6, "row {row}: {got} vs {want}");
            }
        }
    }
    assert!(ops::moe_route(&x, 0, true).is_err());
    assert!(ops::moe_route(&x, e + 1, true).is_err());
}

#[test]
fn moe_route_sigmoid_chooses_by_biased_score_and_weighs_by_unbiased() {
    let (t, e, k) = (9, 16, 4);
    let logits: Vec<f32> = values(t * e, 22).iter().map(|v| v * 6.0).collect();
    // A bias large enough to change the choice in most rows.
    let bias: Vec<f32> = values(e, 23).iter().map(|v| v * 0.5).collect();
    let x = Tensor::from_f32(&[t, e], logits.clone()).unwrap();
    let mut changed = 0;
    for (with_bias, renorm, scale) in [(false, false, 1.0), (true, true, 1.0), (true, true, 2.5)] {
        let routing = Routing {
            selection_bias: if with_bias { &bias } else { &[] },
            renormalize: renorm,
            renormalize_eps: 1e-6,
            scale,
        };
        let r = ops::moe_route_sigmoid(&x, k, routing).unwrap();
        for row in 0..t {
            let l = &logits[row * e..(row + 1) * e];
            let p: Vec<f64> = l.iter().map(|&v| 1.0 / (1.0 + (-v as f64).exp())).collect();
            let key = |i: usize| p[i] + if with_bias { bias[i] as f64 } else { 0.0 };
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| key(b).partial_cmp(&key(a)).unwrap());
            let top = &order[..k];
            let mut unbiased: Vec<usize> = (0..e).collect();
            unbiased.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
            changed += usize::from(with_bias && unbiased[..k] != *top);
            let sum: f64 = top.iter().map(|&i| p[i]).sum();
            for j in 0..k {
                assert_eq!(
                    r.experts[row * k + j] as usize,
                    top[j],
                    "row {row} rank {j}"
                );
                let w = if renorm {
                    p[top[j]] / (sum + 1e-6)
                } else {
                    p[top[j]]
                };
                let got = r.weights[row * k + j] as f64;
                assert!(
                    (got - w * scale as f64).abs() < 1e-6,
                    "row {row}: {got} vs {w}"
                );
            }
        }
    }
    assert!(
        changed > 0,
        "the bias never changed a choice: the test shows nothing"
    );
    let short = Routing {
        selection_bias: &bias[..3],
        ..Routing::plain(true)
    };
    assert!(ops::moe_route_sigmoid(&x, k, short).is_err());
    assert!(ops::moe_route_sigmoid(&x, e + 1, Routing::plain(true)).is_err());
}

#[test]
fn moe_combine_matches_naive_reference() {
    let (t, k, n) = (5, 3, 40);
    let y = values(t * k * n, 31);
    let w = values(t * k, 32);
    let s = values(t * n, 33);
    let g = values(t, 34);
    let yt = Tensor::from_f32(&[t * k, n], y.clone()).unwrap();
    let st = Tensor::from_f32(&[t, n], s.clone()).unwrap();
    let gt = Tensor::from_f32(&[t, 1], g.clone()).unwrap();
    for shared in [false, true] {
        let got = ops::moe_combine(&yt, &w, k, shared.then_some((&st, &gt))).unwrap();
        let mut want = vec![0.0f64; t * n];
        for r in 0..t {
            for c in 0..n {
                let mut acc: f64 = (0..k)
                    .map(|j| w[r * k + j] as f64 * y[(r * k + j) * n + c] as f64)
                    .sum();
                if shared {
                    acc += g[r] as f64 * s[r * n + c] as f64;
                }
                want[r * n + c] = acc;
            }
        }
        let err = nmse(got.f32s().unwrap(), &want);
        assert!(err < 1e-12, "shared {shared}: NMSE {err:e}");
    }
    assert!(ops::moe_combine(&yt, &w[1..], k, None).is_err());
    assert!(ops::moe_combine(&yt, &w, 2, None).is_err());
}

#[test]
fn gather_matmul_rejects_bad_inputs() {
    let w = weight_in(&values(E * N * K, 3), E * N, K, None, kernels::DType::F32);
    let x = Tensor::from_f32(&[2, K], values(2 * K, 1)).unwrap();
    assert!(
        ops::gather_matmul(&x, &w, E, &[0, 1], &[0, 8]).is_err(),
        "expert out of range"
    );
    assert!(
        ops::gather_matmul(&x, &w, E, &[0, 2], &[0, 1]).is_err(),
        "row out of range"
    );
    assert!(
        ops::gather_matmul(&x, &w, E, &[0], &[0, 1]).is_err(),
        "unpaired"
    );
    assert!(
        ops::gather_matmul(&x, &w, 7, &[0], &[0]).is_err(),
        "rows not a multiple"
    );
}

#[test]
fn moe_ops_are_bit_identical_across_thread_counts() {
    let pool = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let (t, k, e, n, kk) = (96, 2, 8, 256, 256);
    let w = weight_in(
        &values(e * n * kk, 3),
        e * n,
        kk,
        None,
        kernels::DType::BF16,
    );
    let x = Tensor::from_f32(&[t, kk], values(t * kk, 4)).unwrap();
    let logits = Tensor::from_f32(&[t, e], values(t * e, 5)).unwrap();
    let run = || {
        let r = ops::moe_route(&logits, k, true).unwrap();
        let y = ops::gather_matmul(&x, &w, e, &r.pair_tokens(), &r.experts).unwrap();
        ops::moe_combine(&y, &r.weights, k, None)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    };
    assert_eq!(pool(1).install(run), pool(2).install(run));
}

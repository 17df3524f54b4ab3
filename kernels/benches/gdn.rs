//! Gated DeltaNet prefill: per-step vs chunked on Qwen3.5-0.8B-like shapes (Hk = Hv = 16,
//! Dk = Dv = 128) at T = 64, 256, 1024, and 4096 with `GDN_BENCH_LONG=1`.
//!
//! `cargo bench -p kernels --bench gdn`; throughput is reported in tokens.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kernels::{ops, Tensor};

const HK: usize = 16;
const HV: usize = 16;
const D: usize = 128;

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Unit-norm rows scaled by `scale`, as the model feeds q and k.
fn unit_rows(n_rows: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut v = values(n_rows * D, seed);
    for row in v.chunks_mut(D) {
        let n = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        row.iter_mut().for_each(|x| *x *= scale / n);
    }
    v
}

struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
}

fn inputs(t: usize) -> Inputs {
    let f = |shape: &[usize], data: Vec<f32>| Tensor::from_f32(shape, data).unwrap();
    let a = f(&[t, HV], values(t * HV, 4));
    let a_log = f(&[HV], values(HV, 5).iter().map(|x| 1.0 + x).collect());
    let dt_bias = f(&[HV], vec![1.0; HV]);
    let b = f(&[t, HV], values(t * HV, 6));
    Inputs {
        q: f(&[t, HK, D], unit_rows(t * HK, 1, 1.0 / (D as f32).sqrt())),
        k: f(&[t, HK, D], unit_rows(t * HK, 2, 1.0)),
        v: f(&[t, HV, D], values(t * HV * D, 3)),
        g: ops::gdn_gate(&a, &a_log, &dt_bias).unwrap(),
        beta: ops::sigmoid(&b).unwrap(),
    }
}

fn bench(c: &mut Criterion) {
    let mut lens = vec![64, 256, 1024];
    if std::env::var("GDN_BENCH_LONG").is_ok_and(|v| v == "1") {
        lens.push(4096);
    }
    let mut group = c.benchmark_group("gdn_prefill");
    group.sample_size(10);
    for &t in &lens {
        let x = inputs(t);
        let state = Tensor::zeros(&[HV, D, D]);
        group.throughput(Throughput::Elements(t as u64));
        group.bench_with_input(BenchmarkId::new("per_step", t), &t, |b, _| {
            b.iter(|| {
                let mut s = state.clone();
                black_box(ops::gdn_recurrent(&x.q, &x.k, &x.v, &x.g, &x.beta, &mut s).unwrap())
            })
        });
        group.bench_with_input(BenchmarkId::new("chunked", t), &t, |b, _| {
            b.iter(|| {
                let mut s = state.clone();
                black_box(
                    ops::gdn_chunked(&x.q, &x.k, &x.v, &x.g, &x.beta, &mut s, ops::GDN_CHUNK)
                        .unwrap(),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

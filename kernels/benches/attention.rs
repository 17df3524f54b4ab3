//! `cargo bench -p kernels --bench attention`: decode-sized attention (one query position, and
//! the five of an MTP verification) against caches of 512 and 4096 keys, Qwen3-0.6B's heads
//! (16 query heads, 8 KV heads, D = 128), and a 128-position prefill chunk for comparison.
//! Throughput is the cache bytes the call reads (K and V, f32): decode attention should run at
//! memory speed. The last case runs 28 layers' caches in turn, so its keys come from memory.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kernels::ops::{self, AttnParams};
use kernels::Tensor;

#[path = "../tests/common/mod.rs"]
mod common;
use common::values as random;

fn bench(c: &mut Criterion) {
    let (hq, hk, d) = (16, 8, 128);
    let mut g = c.benchmark_group("attention");
    g.measurement_time(Duration::from_secs(3));
    for (t_len, keys) in [(1, 512), (5, 512), (1, 4096), (128, 512)] {
        let k = Tensor::from_f32(&[hk, keys, d], random(hk * keys * d, 1)).unwrap();
        let v = Tensor::from_f32(&[hk, keys, d], random(hk * keys * d, 2)).unwrap();
        let q = Tensor::from_f32(&[t_len, hq, d], random(t_len * hq * d, 3)).unwrap();
        let p = AttnParams {
            q_start: keys - t_len,
            kv_len: keys,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
            softcap: None,
        };
        g.throughput(Throughput::Bytes((2 * hk * keys * d * 4) as u64));
        g.bench_function(format!("T={t_len} keys={keys}"), |b| {
            b.iter(|| ops::attention(black_box(&q), &k, &v, &p).unwrap())
        });
    }
    // A decode step's attention as the model runs it: 28 layers, each with its own cache of
    // 512 keys (117 MB in all), so every call reads its keys from memory, not from L3.
    let (layers, keys) = (28, 512);
    let caches: Vec<(Tensor, Tensor)> = (0..layers)
        .map(|l| {
            let kv = |seed| Tensor::from_f32(&[hk, keys, d], random(hk * keys * d, seed)).unwrap();
            (kv(10 + 2 * l as u64), kv(11 + 2 * l as u64))
        })
        .collect();
    let q = Tensor::from_f32(&[1, hq, d], random(hq * d, 3)).unwrap();
    let p = AttnParams {
        q_start: keys - 1,
        kv_len: keys,
        scale: 1.0 / (d as f32).sqrt(),
        window: None,
        softcap: None,
    };
    g.throughput(Throughput::Bytes((layers * 2 * hk * keys * d * 4) as u64));
    g.bench_function(format!("T=1 keys={keys} layers={layers}"), |b| {
        b.iter(|| {
            for (k, v) in &caches {
                black_box(ops::attention(black_box(&q), k, v, &p).unwrap());
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Times causal attention at the Qwen3-0.6B shape (16 q heads, 8 kv heads, head_dim 128) for
//! prefill at several prompt lengths and for decode against a long cache. Prints numbers; run
//! with `cargo run --release -p kernels --example attention_timing [T...]`.

use std::time::Instant;

use kernels::ops::{attention, AttnParams};
use kernels::Tensor;

fn filled(shape: &[usize], seed: u32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    let data = (0..n)
        .map(|_| {
            // xorshift32: cheap, deterministic inputs in [-1, 1).
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_f32(shape, data).expect("shape matches data")
}

fn time<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() -> kernels::Result<()> {
    let (hq, hk, d) = (16, 8, 128);
    let lens: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lens = if lens.is_empty() {
        vec![128, 512, 1024, 2048, 4096]
    } else {
        lens
    };
    let scale = 1.0 / (d as f32).sqrt();
    println!("threads: {}", rayon::current_num_threads());
    for &t in &lens {
        let q = filled(&[t, hq, d], 1);
        let k = filled(&[hk, t, d], 2);
        let v = filled(&[hk, t, d], 3);
        let p = AttnParams {
            q_start: 0,
            kv_len: t,
            scale,
            window: None,
            softcap: None,
        };
        let reps = if t >= 2048 { 2 } else { 5 };
        let secs = time(reps, || {
            attention(&q, &k, &v, &p).expect("valid shapes");
        });
        // Causal: each of the T·(T+1)/2 (query, key) pairs costs 2·D flops for QKᵀ and 2·D for PV.
        let flops = (t * (t + 1) / 2 * hq * 4 * d) as f64;
        println!(
            "prefill T={t:5}: {:8.2} ms  {:6.1} GFLOP/s",
            secs * 1e3,
            flops / secs / 1e9
        );
    }
    for &cache in &[1024usize, 4096, 16384] {
        let q = filled(&[1, hq, d], 4);
        let k = filled(&[hk, cache, d], 5);
        let v = filled(&[hk, cache, d], 6);
        let p = AttnParams {
            q_start: cache - 1,
            kv_len: cache,
            scale,
            window: None,
            softcap: None,
        };
        let secs = time(20, || {
            attention(&q, &k, &v, &p).expect("valid shapes");
        });
        let bytes = (2 * hk * cache * d * 4) as f64;
        println!(
            "decode cache={cache:6}: {:8.3} ms  {:6.1} GB/s of K/V",
            secs * 1e3,
            bytes / secs / 1e9
        );
    }
    Ok(())
}

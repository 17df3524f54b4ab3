//! `cargo bench -p kernels --bench matmul`: our matmul against raw `gemm` (f32, parallel) on
//! the same shapes, in one run, with throughput in FLOP (2·M·N·K per call).
//!
//! Groups: square f32 1024³; a prefill shape (M=512, K=1024, N=3072) for f32 / bf16 / affine q4
//! weights; decode (M=1, K=1024, N=3072) for f32 / bf16 / q4, where memory bandwidth rules.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kernels::numerics::Numerics;
use kernels::quant::quantize;
use kernels::Settings;
use kernels::{ops, DType, Device, QuantMode, QuantSpec, Tensor, Weight};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Raw `gemm` on the same problem (`x [m,k] @ w[n,k]ᵀ`), using every rayon thread.
fn raw_gemm(x: &[f32], w: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    // SAFETY: the slices hold m·k, n·k and m·n elements with the strides given.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

struct Problem {
    m: usize,
    n: usize,
    k: usize,
    x: Tensor,
    w: Vec<f32>,
}

impl Problem {
    fn new(m: usize, n: usize, k: usize) -> Problem {
        Problem {
            m,
            n,
            k,
            x: Tensor::from_f32(&[m, k], random(m * k, 1)).unwrap(),
            w: random(n * k, 2),
        }
    }

    fn weight(&self, format: &str) -> Weight {
        let (n, k) = (self.n, self.k);
        match format {
            "f32" => Weight::Dense(Tensor::from_f32(&[n, k], self.w.clone()).unwrap()),
            "bf16" => {
                let h: Vec<half::bf16> = self.w.iter().map(|&v| half::bf16::from_f32(v)).collect();
                Weight::Dense(Tensor::from_slice(&[n, k], DType::BF16, &h).unwrap())
            }
            "q4g64" | "q8g64" => {
                let bits = if format == "q4g64" { 4 } else { 8 };
                let spec = QuantSpec::new(QuantMode::Affine, bits, 64).unwrap();
                Weight::Quant(quantize(&self.w, n, k, spec, DType::BF16).unwrap())
            }
            other => panic!("unknown format {other}"),
        }
    }

    fn flops(&self) -> u64 {
        2 * (self.m * self.n * self.k) as u64
    }
}

fn bench_group(c: &mut Criterion, name: &str, p: &Problem, formats: &[&str], with_raw: bool) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(p.flops()));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    if with_raw {
        let xs = p.x.f32s().unwrap().to_vec();
        let mut out = vec![0.0f32; p.m * p.n];
        g.bench_function("raw_gemm_f32", |b| {
            b.iter(|| raw_gemm(&xs, &p.w, &mut out, p.m, p.n, p.k))
        });
    }
    for &f in formats {
        let w = p.weight(f);
        // Both paths run as a forward runs them: on the kernels' pool with their settings.
        let on = |n| {
            let (x, w) = (&p.x, &w);
            move || {
                kernels::run(Device::Cpu, Settings::with_numerics(n), || {
                    ops::matmul(x, w)
                })
            }
        };
        let exact = on(Numerics::Exact);
        g.bench_function(format!("matmul_{f}"), |b| {
            b.iter(|| black_box(exact().unwrap()))
        });
        if f != "f32" {
            // The `fast` path: bf16 products / int8 activations against 4-bit codes.
            let fast = on(Numerics::Fast);
            g.bench_function(format!("matmul_{f}_fast"), |b| {
                b.iter(|| black_box(fast().unwrap()))
            });
        }
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_group(
        c,
        "square_1024",
        &Problem::new(1024, 1024, 1024),
        &["f32"],
        true,
    );
    let prefill = Problem::new(512, 3072, 1024);
    bench_group(
        c,
        "prefill_512x1024x3072",
        &prefill,
        &["f32", "bf16", "q4g64"],
        true,
    );
    let decode = Problem::new(1, 3072, 1024);
    bench_group(
        c,
        "decode_1x1024x3072",
        &decode,
        &["f32", "bf16", "q4g64"],
        true,
    );
    // Multi-row decode (MTP verification, batches): M rows against one weight should cost
    // little more than one row, since decode reads the weight once whatever M is. Run only
    // these with `cargo bench -p kernels --bench matmul -- decode_rows`.
    for m in [1, 2, 4, 8] {
        bench_group(
            c,
            &format!("decode_rows_{m}x1024x3072"),
            &Problem::new(m, 3072, 1024),
            &["bf16", "q4g64", "q8g64"],
            false,
        );
    }
    // A tied LM head of 151936 × 1024 (Qwen3-0.6B's): far past the caches, so decode streams
    // it from memory, as a whole model's weights are.
    // One row and eight (a batched step): here the rows share one pass over memory.
    for m in [1, 8] {
        bench_group(
            c,
            &format!("decode_lm_head_{m}x1024x151936"),
            &Problem::new(m, 151_936, 1024),
            &["bf16", "q4g64", "q8g64"],
            false,
        );
    }
}

criterion_group!(matmul, benches);
criterion_main!(matmul);

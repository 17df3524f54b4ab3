use kernels::quant::quantize;
use kernels::{ops, DType, QuantMode, QuantSpec, Tensor, Weight};
use std::time::Instant;
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 }).collect()
}
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps).map(|_| { let t = Instant::now(); f(); t.elapsed().as_secs_f64() }).fold(f64::INFINITY, f64::min)
}
fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (m, n, k) = (args[0], args[1], args[2]);
    let x = Tensor::from_f32(&[m, k], random(m * k, 1)).unwrap();
    let w = random(n * k, 2);
    let flops = 2.0 * (m * n * k) as f64;
    let xs = x.f32s().unwrap().to_vec();
    let mut out = vec![0f32; m * n];
    let t = best(5, || unsafe { gemm::gemm(m, n, k, out.as_mut_ptr(), 1, n as isize, false, xs.as_ptr(), 1, k as isize, w.as_ptr(), k as isize, 1, 0.0, 1.0, false, false, false, gemm::Parallelism::Rayon(0)) });
    println!("raw gemm      {:7.1} GFLOP/s  {:.3} ms", flops / t / 1e9, t * 1e3);
    let wf = Weight::Dense(Tensor::from_f32(&[n, k], w.clone()).unwrap());
    let h: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let wb = Weight::Dense(Tensor::from_slice(&[n, k], DType::BF16, &h).unwrap());
    let wq = Weight::Quant(quantize(&w, n, k, QuantSpec::new(QuantMode::Affine, 4, 64).unwrap(), DType::BF16).unwrap());
    let wm = Weight::Quant(quantize(&w, n, k, QuantSpec::new(QuantMode::Mxfp4, 4, 32).unwrap(), DType::F32).unwrap());
    for (name, ww) in [("f32", &wf), ("bf16", &wb), ("q4g64", &wq), ("mxfp4", &wm)] {
        let t = best(5, || { std::hint::black_box(ops::matmul(&x, ww).unwrap()); });
        println!("matmul {name:6} {:7.1} GFLOP/s  {:.3} ms", flops / t / 1e9, t * 1e3);
    }
}

//! The MLX backend's native path (`numerics=fast` on MLX): weights kept in their stored dtype,
//! activations in the weights' dtype, as mlx-lm runs. Checked against references computed
//! here in f64 from the same rounded inputs, and against the exact (f32) path.

use crate::common;
use common::{host_vec, mlx, values};

use half::bf16;
use kernels::numerics::Numerics;
use kernels::ops;
use kernels::{DType, Device, QuantMode, QuantSpec, Tensor, Weight};

fn bf16_tensor(shape: &[usize], seed: u64) -> Tensor {
    let v: Vec<bf16> = values(shape.iter().product(), seed)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    Tensor::from_slice(shape, DType::BF16, &v).unwrap()
}

fn f32_tensor(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap()
}

fn native<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    on_mlx(Numerics::Fast, f)
}

/// Runs `f` as a forward on MLX with numerics `n`.
fn on_mlx<R: Send>(n: Numerics, f: impl FnOnce() -> R + Send) -> R {
    kernels::run(Device::Mlx, kernels::Settings::with_numerics(n), f)
}

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

/// `x · wᵀ` in f64 from the given (already rounded) values.
fn matmul_f64(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k)
                .map(|j| x[r * k + j] as f64 * w[c * k + j] as f64)
                .sum()
        })
        .collect()
}

fn nmse_f64(reference: &[f64], got: &[f32]) -> f64 {
    assert_eq!(reference.len(), got.len());
    let num: f64 = reference
        .iter()
        .zip(got)
        .map(|(a, &b)| (a - b as f64).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|a| a * a).sum();
    num / den
}

#[test]
fn native_residents_keep_the_stored_dtype_and_bytes() {
    let dense = Weight::Dense(bf16_tensor(&[16, 64], 1));
    let on = native(|| dense.to_device(Device::Mlx)).unwrap();
    assert_eq!(on.stored_bytes(), dense.stored_bytes(), "bf16 stays bf16");
    let exact = dense.to_device(Device::Mlx).unwrap();
    assert_eq!(
        exact.stored_bytes(),
        2 * dense.stored_bytes(),
        "exact widens"
    );
    let (Weight::Dense(a), Weight::Dense(b)) = (&on, &dense) else {
        panic!("dense stays dense")
    };
    assert_eq!(a.dtype(), DType::BF16);
    let back = a.to_device(Device::Cpu).unwrap();
    assert_eq!(back.raw_bytes().unwrap(), b.raw_bytes().unwrap());

    let spec = QuantSpec::new(QuantMode::Affine, 4, 64).unwrap();
    let q = Weight::Quant(
        kernels::quant::quantize(&values(16 * 128, 2), 16, 128, spec, DType::BF16).unwrap(),
    );
    let on = native(|| q.to_device(Device::Mlx)).unwrap();
    assert_eq!(on.stored_bytes(), q.stored_bytes(), "scales stay bf16");
    let Weight::Quant(on) = on else {
        panic!("quantized stays quantized")
    };
    assert_eq!(on.scales.dtype(), DType::BF16);
    assert_eq!(on.biases.as_ref().unwrap().dtype(), DType::BF16);
}

#[test]
fn native_dense_matmul_is_a_bf16_product_of_bf16_inputs() {
    let (m, n, k) = (5, 24, 160);
    let w = bf16_tensor(&[n, k], 3);
    let x = f32_tensor(&[m, k], 4);
    let resident = native(|| Weight::Dense(w.clone()).to_device(Device::Mlx)).unwrap();
    for rows in [m, 1] {
        let xr = x.narrow0(0, rows).unwrap();
        let got = native(|| ops::matmul(&mlx(&xr), &resident)).unwrap();
        assert_eq!(got.device(), Device::Mlx);
        assert_eq!(
            got.dtype(),
            DType::BF16,
            "the product stays in the weight dtype"
        );
        // Reference: x rounded to bf16 (what the native path feeds), exact products and sums.
        let xv = round_bf16(&xr.to_vec_f32().unwrap());
        let reference = matmul_f64(&xv, &w.to_vec_f32().unwrap(), rows, n, k);
        let e = nmse_f64(&reference, &host_vec(&got));
        // One bf16 rounding of the output: relative error ≤ 2⁻⁹, NMSE well under 2⁻¹⁸.
        assert!(e < 4e-6, "{rows} rows: NMSE {e:e}");
        assert!(
            e > 0.0,
            "{rows} rows: a bf16 result cannot equal the f64 sum everywhere"
        );
    }
}

#[test]
fn native_affine_matmul_uses_the_stored_scales() {
    let (m, n, k) = (3, 32, 256);
    let spec = QuantSpec::new(QuantMode::Affine, 4, 64).unwrap();
    let q = kernels::quant::quantize(&values(n * k, 5), n, k, spec, DType::BF16).unwrap();
    let dequant = kernels::quant::dequantize(&q).unwrap();
    let w = Weight::Quant(q);
    let resident = native(|| w.to_device(Device::Mlx)).unwrap();
    let x = f32_tensor(&[m, k], 6);
    let got = native(|| ops::matmul(&mlx(&x), &resident)).unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    let xv = round_bf16(&x.to_vec_f32().unwrap());
    let reference = matmul_f64(&xv, &dequant, m, n, k);
    let e = nmse_f64(&reference, &host_vec(&got));
    // Looser than the dense product: MLX's quantized kernel on its CPU device sums in the
    // activation dtype (measured 2.8e-4 here; f32 activations give < 1e-10), which is what
    // mlx-lm gets from the same kernel. The exact path keeps f32 for goldens and parity.
    assert!(e < 1e-3, "NMSE {e:e}");
    let exact = ops::matmul(&mlx(&x), &w.to_device(Device::Mlx).unwrap()).unwrap();
    assert_eq!(exact.dtype(), DType::F32);
    let e = nmse_f64(
        &matmul_f64(&x.to_vec_f32().unwrap(), &dequant, m, n, k),
        &host_vec(&exact),
    );
    assert!(e < 1e-9, "exact path NMSE {e:e}");
}

#[test]
fn exact_requests_give_the_exact_bits_on_native_residents() {
    // A model loaded for the native path still serves an exact request: weights are widened
    // per call, which is exact, so the result is the exact path's bit for bit.
    let w = Weight::Dense(bf16_tensor(&[24, 96], 7));
    let x = mlx(&f32_tensor(&[4, 96], 8));
    let native_resident = native(|| w.to_device(Device::Mlx)).unwrap();
    let exact_resident = w.to_device(Device::Mlx).unwrap();
    let a = ops::matmul(&x, &native_resident).unwrap();
    let b = ops::matmul(&x, &exact_resident).unwrap();
    assert_eq!(a.dtype(), DType::F32);
    assert_eq!(host_vec(&a), host_vec(&b));
}

#[test]
fn native_activations_stay_bf16_through_the_elementwise_ops() {
    let x = mlx(&bf16_tensor(&[3, 64], 9));
    let g = mlx(&bf16_tensor(&[64], 10));
    for (numerics, want) in [(Numerics::Fast, DType::BF16), (Numerics::Exact, DType::F32)] {
        on_mlx(numerics, || {
            let outs = [
                ops::rms_norm(&x, Some(&g), 1e-6).unwrap(),
                ops::silu(&x).unwrap(),
                ops::add(&x, &g).unwrap(),
                ops::mul(&x, &g).unwrap(),
                ops::scale(&x, 0.5).unwrap(),
            ];
            for (i, y) in outs.iter().enumerate() {
                assert_eq!(y.dtype(), want, "{numerics}: op {i}");
            }
        });
    }
    // silu in bf16 against f64 from the same bf16 inputs: within bf16 rounding.
    let xv = x.to_device(Device::Cpu).unwrap().to_vec_f32().unwrap();
    let y = native(|| ops::silu(&x)).unwrap();
    let reference: Vec<f64> = xv
        .iter()
        .map(|&v| v as f64 / (1.0 + (-v as f64).exp()))
        .collect();
    let e = nmse_f64(&reference, &host_vec(&y));
    assert!(e < 1e-4, "silu NMSE {e:e}");
}

#[test]
fn native_embedding_rows_keep_the_table_dtype() {
    let table = bf16_tensor(&[40, 32], 11);
    let w = native(|| Weight::Dense(table.clone()).to_device(Device::Mlx)).unwrap();
    let ids = [3u32, 0, 39, 3];
    let rows = native(|| ops::embedding(&w, &ids)).unwrap();
    assert_eq!(rows.dtype(), DType::BF16);
    let all = table.to_vec_f32().unwrap();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| all[i as usize * 32..(i as usize + 1) * 32].to_vec())
        .collect();
    assert_eq!(host_vec(&rows), want);
}

/// Attention in f64 from the given values: `q` `[T, Hq, D]`, `k`/`v` `[Hk, cap, D]`, with
/// the causal and window rule of `ops::attention`.
fn attention_f64(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (t, hq, hk, d, cap): (usize, usize, usize, usize, usize),
    p: &ops::AttnParams,
) -> Vec<f64> {
    let mut out = vec![0.0f64; t * hq * d];
    for i in 0..t {
        let pos = p.q_start + i;
        let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..hq {
            let kh = h / (hq / hk);
            let qrow = &q[(i * hq + h) * d..][..d];
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    let krow = &k[(kh * cap + j) * d..][..d];
                    let dot: f64 = qrow
                        .iter()
                        .zip(krow)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    dot * p.scale as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = w.iter().sum();
            for (jj, wj) in w.iter().enumerate() {
                let vrow = &v[(kh * cap + lo + jj) * d..][..d];
                for c in 0..d {
                    out[(i * hq + h) * d + c] += wj / total * vrow[c] as f64;
                }
            }
        }
    }
    out
}

/// The native path's attention on MLX's CPU device runs in blocks of queries with f32 GEMMs:
/// a prompt of several blocks (continuing a cached one, GQA, with and without a sliding
/// window) and a decode step stay within bf16 rounding of an f64 attention of the same bf16
/// values, and the result keeps the activations' dtype.
#[test]
fn native_attention_in_query_blocks_matches_f64() {
    let (hq, hk, d, cap) = (4, 2, 16, 700);
    let k = bf16_tensor(&[hk, cap, d], 12);
    let v = bf16_tensor(&[hk, cap, d], 13);
    let (kv_host, vv_host) = (k.to_vec_f32().unwrap(), v.to_vec_f32().unwrap());
    let (km, vm) = (mlx(&k), mlx(&v));
    for (t, q_start, window) in [(600, 50, None), (600, 50, Some(100)), (1, 649, None)] {
        let q = bf16_tensor(&[t, hq, d], 14 + t as u64);
        let p = ops::AttnParams {
            q_start,
            kv_len: q_start + t,
            scale: 0.25,
            window,
            softcap: None,
        };
        let got = native(|| ops::attention(&mlx(&q), &km, &vm, &p)).unwrap();
        assert_eq!(got.dtype(), DType::BF16);
        assert_eq!(got.shape(), &[t, hq, d]);
        let reference = attention_f64(
            (&q.to_vec_f32().unwrap(), &kv_host, &vv_host),
            (t, hq, hk, d, cap),
            &p,
        );
        let e = nmse_f64(&reference, &host_vec(&got));
        // Scaled queries, scores, probabilities and the output are each rounded to bf16
        // (relative error 2⁻⁹ apiece), as MLX's own attention rounds them.
        assert!(e < 1e-4, "T={t} window {window:?}: NMSE {e:e}");
    }
}

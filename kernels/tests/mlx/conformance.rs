//! Op conformance of the MLX backend against the CPU reference (docs/design.md §3): the same inputs go
//! through `ops::*` once as host tensors and once as MLX tensors; the MLX results, copied back
//! to the host, must match within NMSE = Σ(a−b)²/Σa² ≤ 1e-7 (elementwise, norms, rope) or
//! ≤ 5e-4 (matmul), with no NaN and no one-sided inf.

use crate::common;
use common::{formats, mlx, poison, values, weight_in};

use half::bf16;
use kernels::ops::{self, RopeLayout};
use kernels::{DType, Device, Error, QuantMode, QuantSpec, QuantWeight, Tensor, Weight};

const ELEMENTWISE: f64 = 1e-7;
const MATMUL: f64 = 5e-4;

fn host(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap()
}

fn back(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.device(), Device::Mlx, "the op did not run on MLX");
    t.to_device(Device::Cpu).unwrap().to_vec_f32().unwrap()
}

/// Fails on NaN, on inf in one result but not the other, on NMSE above `limit`, and when the
/// op did not run on MLX.
fn check(what: &str, reference: &Tensor, got: &Tensor, limit: f64) {
    assert_eq!(
        got.device(),
        Device::Mlx,
        "{what}: the op did not run on MLX"
    );
    let nmse = common::nmse(what, reference, got);
    assert!(nmse <= limit, "{what}: NMSE {nmse:e} > {limit:e}");
}

fn to_bf16(t: &Tensor) -> Tensor {
    let v: Vec<bf16> = t
        .f32s()
        .unwrap()
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    Tensor::from_slice(t.shape(), DType::BF16, &v).unwrap()
}

/// Affine quantization as MLX lays it out, written here from the format's definition:
/// per group of `group` columns, `scale = (max − min) / (2^bits − 1)`, `bias = min`,
/// `q = round((w − bias) / scale)`, packed little-end-first into u32 words; scales and biases
/// stored as bf16 (the values the kernels must then use exactly).
fn quantize(rows: usize, cols: usize, bits: usize, group: usize, seed: u64) -> Weight {
    let w = values(rows * cols, seed);
    let levels = (1u32 << bits) - 1;
    let groups = cols / group;
    let (mut scales, mut biases) = (Vec::new(), Vec::new());
    let mut packed = vec![0u32; rows * cols * bits / 32];
    for r in 0..rows {
        for g in 0..groups {
            let chunk = &w[r * cols + g * group..r * cols + (g + 1) * group];
            let lo = chunk.iter().cloned().fold(f32::INFINITY, f32::min);
            let hi = chunk.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let scale = bf16::from_f32((hi - lo) / levels as f32);
            let bias = bf16::from_f32(lo);
            scales.push(scale);
            biases.push(bias);
            for (j, &x) in chunk.iter().enumerate() {
                let q = ((x - bias.to_f32()) / scale.to_f32())
                    .round()
                    .clamp(0.0, levels as f32) as u32;
                let bit = (r * cols + g * group + j) * bits;
                packed[bit / 32] |= q << (bit % 32);
            }
        }
    }
    let spec = QuantSpec::new(QuantMode::Affine, bits, group).unwrap();
    let packed = Tensor::from_slice(&[rows, cols * bits / 32], DType::U32, &packed).unwrap();
    let scales = Tensor::from_slice(&[rows, groups], DType::BF16, &scales).unwrap();
    let biases = Tensor::from_slice(&[rows, groups], DType::BF16, &biases).unwrap();
    Weight::Quant(QuantWeight::new(spec, packed, scales, Some(biases), "test weight").unwrap())
}

#[test]
fn round_trip_keeps_bits_of_every_dtype() {
    let x = host(&[3, 5], 1);
    assert_eq!(back(&mlx(&x)), x.to_vec_f32().unwrap());
    let b = to_bf16(&x);
    let back_b = mlx(&b).to_device(Device::Cpu).unwrap();
    assert_eq!(back_b.dtype(), DType::BF16);
    assert_eq!(back_b.raw_bytes().unwrap(), b.raw_bytes().unwrap());
    let u = Tensor::from_slice(&[4], DType::U32, &[0u32, 1, 0xdead_beef, u32::MAX]).unwrap();
    let back_u = mlx(&u).to_device(Device::Cpu).unwrap();
    assert_eq!(
        back_u.as_slice::<u32>().unwrap(),
        &[0u32, 1, 0xdead_beef, u32::MAX]
    );
}

#[test]
fn host_reads_of_an_mlx_tensor_fail_with_a_hint() {
    let m = mlx(&host(&[2, 2], 2));
    let err = m.f32s().unwrap_err().to_string();
    assert!(err.contains("to_device"), "{err}");
}

#[test]
fn matmul_dense_f32_and_bf16() {
    let x = host(&[7, 96], 3);
    for (name, w) in [
        ("f32", host(&[40, 96], 4)),
        ("bf16", to_bf16(&host(&[40, 96], 5))),
    ] {
        let w = Weight::Dense(w);
        let cpu = ops::matmul(&x, &w).unwrap();
        let got = ops::matmul(&mlx(&x), &w).unwrap();
        check(&format!("matmul {name}"), &cpu, &got, MATMUL);
    }
}

/// Every format `kernels::quant::quantize` writes (MLX's own quantizer, byte for byte): affine
/// at every bits × group, with f32 and bf16 scales, and the three fp modes.
fn every_quant_format() -> Vec<(QuantSpec, DType)> {
    let mut v = Vec::new();
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            for dt in [DType::F32, DType::BF16] {
                v.push((QuantSpec::new(QuantMode::Affine, bits, group).unwrap(), dt));
            }
        }
    }
    for mode in [QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8] {
        let (bits, group) = mode.fixed_bits_group().unwrap();
        v.push((QuantSpec::new(mode, bits, group).unwrap(), DType::U8));
    }
    v
}

fn quantized(rows: usize, cols: usize, spec: QuantSpec, dt: DType, seed: u64) -> Weight {
    let w = values(rows * cols, seed);
    Weight::Quant(kernels::quant::quantize(&w, rows, cols, spec, dt).unwrap())
}

#[test]
fn matmul_every_quant_format_dense_and_decode() {
    let x = host(&[5, 256], 6);
    let x1 = x.narrow0(0, 1).unwrap();
    for (i, (spec, dt)) in every_quant_format().into_iter().enumerate() {
        let w = quantized(48, 256, spec, dt, 100 + i as u64);
        let name = format!("{} {dt:?} scales", w.format_name());
        let resident = w.to_device(Device::Mlx).unwrap();
        assert_eq!(resident.device(), Device::Mlx, "{name}");
        // Host weight with an MLX input, and a resident weight (widened once at upload).
        // A single row too: MLX takes its matrix-vector path there.
        for (shape, x) in [("5 rows", &x), ("1 row", &x1)] {
            let cpu = ops::matmul(x, &w).unwrap();
            let got = ops::matmul(&mlx(x), &w).unwrap();
            check(&format!("matmul {name}, {shape}"), &cpu, &got, MATMUL);
            let got = ops::matmul(x, &resident).unwrap();
            check(
                &format!("matmul {name}, {shape}, resident"),
                &cpu,
                &got,
                MATMUL,
            );
        }
    }
}

#[test]
fn embedding_every_quant_format_is_exact() {
    let ids = [3u32, 0, 47, 3, 12];
    for (i, (spec, dt)) in every_quant_format().into_iter().enumerate() {
        let w = quantized(48, 256, spec, dt, 200 + i as u64);
        let name = format!("embedding {} {dt:?} scales", w.format_name());
        let cpu = ops::embedding(&w, &ids).unwrap();
        let got = ops::embedding(&w.to_device(Device::Mlx).unwrap(), &ids).unwrap();
        // Decoding is exact in f32 on both sides (codes times a scale, plus a bias).
        assert_eq!(back(&got), cpu.to_vec_f32().unwrap(), "{name}");
    }
}

#[test]
fn resident_weights_are_f32_on_mlx_with_the_same_values() {
    let dense = Weight::Dense(to_bf16(&host(&[8, 64], 80)));
    let Weight::Dense(on) = dense.to_device(Device::Mlx).unwrap() else {
        panic!("a dense weight stays dense");
    };
    assert_eq!(on.dtype(), DType::F32, "widened once at upload");
    let Weight::Dense(t) = &dense else {
        unreachable!()
    };
    assert_eq!(back(&on), t.to_vec_f32().unwrap(), "bf16 widens exactly");
    let affine = quantized(
        8,
        64,
        QuantSpec::new(QuantMode::Affine, 4, 32).unwrap(),
        DType::BF16,
        81,
    );
    let (Weight::Quant(q), Weight::Quant(h)) = (affine.to_device(Device::Mlx).unwrap(), &affine)
    else {
        panic!("a quantized weight stays quantized");
    };
    assert_eq!(q.scales.dtype(), DType::F32);
    assert_eq!(back(&q.scales), h.scales.to_vec_f32().unwrap());
    assert_eq!(
        back(q.biases.as_ref().unwrap()),
        h.biases.as_ref().unwrap().to_vec_f32().unwrap()
    );
    let packed = q.packed.to_device(Device::Cpu).unwrap();
    assert_eq!(packed.raw_bytes().unwrap(), h.packed.raw_bytes().unwrap());
    let fp = quantized(
        8,
        64,
        QuantSpec::new(QuantMode::Nvfp4, 4, 16).unwrap(),
        DType::U8,
        82,
    );
    let (Weight::Quant(q), Weight::Quant(h)) = (fp.to_device(Device::Mlx).unwrap(), &fp) else {
        panic!("a quantized weight stays quantized");
    };
    assert_eq!(q.scales.dtype(), DType::U8, "fp scales stay their u8 codes");
    let scales = q.scales.to_device(Device::Cpu).unwrap();
    assert_eq!(scales.raw_bytes().unwrap(), h.scales.raw_bytes().unwrap());
}

#[test]
fn rms_norm_with_and_without_weight() {
    let x = host(&[6, 64], 8);
    let w = to_bf16(&host(&[64], 9));
    for (name, w) in [("bf16 weight", Some(&w)), ("no weight", None)] {
        let cpu = ops::rms_norm(&x, w, 1e-6).unwrap();
        let got = ops::rms_norm(&mlx(&x), w, 1e-6).unwrap();
        check(&format!("rms_norm {name}"), &cpu, &got, ELEMENTWISE);
    }
}

#[test]
fn rope_both_layouts_full_and_partial() {
    let x = host(&[9, 4, 32], 10);
    let positions: Vec<usize> = (17..26).collect();
    for rotated in [16usize, 8] {
        // theta = 10000^(-2i/rotated), as Qwen/Llama configs give it.
        let inv_freq: Vec<f32> = (0..rotated / 2)
            .map(|i| 10000f64.powf(-((2 * i) as f64) / rotated as f64) as f32)
            .collect();
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            let cpu = ops::rope(&x, &positions, &inv_freq, layout).unwrap();
            let got = ops::rope(&mlx(&x), &positions, &inv_freq, layout).unwrap();
            check(
                &format!("rope {layout:?} rotating {rotated}"),
                &cpu,
                &got,
                ELEMENTWISE,
            );
        }
    }
}

#[test]
fn rope_with_scattered_positions_is_cleanly_unsupported() {
    let x = mlx(&host(&[2, 1, 8], 11));
    let err = ops::rope(&x, &[0, 5], &[1.0, 0.1], RopeLayout::HalfSplit).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn softmax_silu_add_mul() {
    let x = host(&[5, 33], 12);
    let scaled = ops::scale(&x, 8.0).unwrap();
    check(
        "softmax",
        &ops::softmax(&scaled).unwrap(),
        &ops::softmax(&mlx(&scaled)).unwrap(),
        ELEMENTWISE,
    );
    check(
        "silu",
        &ops::silu(&scaled).unwrap(),
        &ops::silu(&mlx(&scaled)).unwrap(),
        ELEMENTWISE,
    );
    let y = host(&[5, 33], 13);
    let row = host(&[33], 14);
    for (name, b) in [("same shape", &y), ("broadcast row", &row)] {
        check(
            &format!("add {name}"),
            &ops::add(&x, b).unwrap(),
            &ops::add(&mlx(&x), b).unwrap(),
            ELEMENTWISE,
        );
        check(
            &format!("mul {name}"),
            &ops::mul(&x, b).unwrap(),
            &ops::mul(&mlx(&x), &mlx(b)).unwrap(),
            ELEMENTWISE,
        );
    }
    let err = ops::add(&mlx(&x), &host(&[4], 15)).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
}

#[test]
fn a_lazy_chain_evaluates_once_at_the_host() {
    // rms_norm -> matmul -> silu -> mul stays on MLX until the final copy to the host.
    let x = host(&[4, 64], 16);
    let w = Weight::Dense(to_bf16(&host(&[32, 64], 17)));
    let g = host(&[32], 18);
    let run = |x: &Tensor| {
        let h = ops::rms_norm(x, None, 1e-5).unwrap();
        let h = ops::matmul(&h, &w).unwrap();
        ops::mul(&ops::silu(&h).unwrap(), &g).unwrap()
    };
    check("chain", &run(&x), &run(&mlx(&x)), MATMUL);
}

/// The largest and smallest finite f32 inputs and a few awkward ones, for the activations.
fn awkward(n: usize, seed: u64) -> Tensor {
    let mut v = values(n, seed);
    for (i, x) in [-90.0f32, -30.0, -5.0, 0.0, -0.0, 5.0, 30.0, 90.0]
        .into_iter()
        .enumerate()
    {
        v[i] = x;
    }
    Tensor::from_f32(&[n / 8, 8], v.iter().map(|x| x * 6.0).collect()).unwrap()
}

#[test]
fn embedding_dense_and_affine_with_resident_weights() {
    let ids = [3u32, 0, 47, 3, 12];
    let dense = Weight::Dense(to_bf16(&host(&[48, 64], 20)));
    for (name, w) in [
        ("bf16", dense),
        ("affine q4 g64", quantize(48, 256, 4, 64, 21)),
    ] {
        let on = w.to_device(Device::Mlx).unwrap();
        assert_eq!(on.device(), Device::Mlx);
        let cpu = ops::embedding(&w, &ids).unwrap();
        check(
            &format!("embedding {name}"),
            &cpu,
            &ops::embedding(&on, &ids).unwrap(),
            ELEMENTWISE,
        );
        // A resident weight moves matmul to MLX even for a host input.
        let x = host(&[3, w.cols()], 22);
        check(
            &format!("matmul, resident {name}"),
            &ops::matmul(&x, &w).unwrap(),
            &ops::matmul(&x, &on).unwrap(),
            MATMUL,
        );
        let err = ops::embedding(&on, &[48]).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }
}

#[test]
fn attention_causal_gqa_window_softcap_decode() {
    let (hq, hk, d, cap) = (8, 2, 16, 20);
    let k = host(&[hk, cap, d], 23);
    let v = host(&[hk, cap, d], 24);
    let cases = [
        ("prefill", 6, 0, 6, None, None),
        ("continued, windowed", 5, 7, 12, Some(4), None),
        ("softcap", 6, 2, 8, None, Some(0.5)),
        ("decode", 1, 11, 12, Some(3), Some(2.0)),
    ];
    for (name, t, q_start, kv_len, window, softcap) in cases {
        let q = host(&[t, hq, d], 25 + t as u64);
        let p = ops::AttnParams {
            q_start,
            kv_len,
            scale: 0.8,
            window,
            softcap,
        };
        let cpu = ops::attention(&q, &k, &v, &p).unwrap();
        let got = ops::attention(&mlx(&q), &mlx(&k), &v, &p).unwrap();
        check(&format!("attention {name}"), &cpu, &got, MATMUL);
    }
}

#[test]
fn paged_attention_reads_through_the_block_table() {
    // A pool of 6 blocks of 4 positions; the sequence's 12 keys live in blocks 4, 1, 3.
    let (hq, hk, d, b) = (4, 2, 8, 4);
    let table = [4u32, 1, 3];
    let k = host(&[hk, 6 * b, d], 41);
    let v = host(&[hk, 6 * b, d], 42);
    // The same keys laid flat, as the reference.
    let flat = |pool: &Tensor| {
        let src = pool.to_vec_f32().unwrap();
        let mut out = Vec::new();
        for h in 0..hk {
            for j in 0..12 {
                let slot = table[j / b] as usize * b + j % b;
                out.extend_from_slice(&src[(h * 6 * b + slot) * d..][..d]);
            }
        }
        Tensor::from_f32(&[hk, 12, d], out).unwrap()
    };
    for (t, q_start, window) in [(5, 0, None), (1, 11, Some(6)), (4, 8, None)] {
        let q = host(&[t, hq, d], 43 + t as u64);
        let p = ops::AttnParams {
            q_start,
            kv_len: q_start + t,
            scale: 0.7,
            window,
            softcap: None,
        };
        let cpu = ops::attention(&q, &flat(&k), &flat(&v), &p).unwrap();
        let got = ops::attention_paged(&mlx(&q), &mlx(&k), &mlx(&v), (&table, b), &p).unwrap();
        check(&format!("paged attention T={t}"), &cpu, &got, MATMUL);
    }
}

#[test]
fn kv_write_decode_steps_keep_earlier_rows() {
    // A prefill then single-row writes into the same cache, as decoding does.
    let (mut cpu, mut got) = (Tensor::zeros(&[2, 8, 4]), mlx(&Tensor::zeros(&[2, 8, 4])));
    for (pos, t) in [(0, 3), (3, 1), (4, 1), (5, 1), (7, 1)] {
        let new = host(&[t, 2, 4], 90 + pos as u64);
        ops::kv_write(&mut cpu, &new, pos).unwrap();
        ops::kv_write(&mut got, &new, pos).unwrap();
        assert_eq!(
            back(&got),
            cpu.to_vec_f32().unwrap(),
            "after writing at {pos}"
        );
    }
}

#[test]
fn kv_write_at_start_middle_and_end() {
    let base = host(&[2, 9, 4], 30);
    for (pos, t) in [(0, 3), (4, 2), (6, 3)] {
        let new = host(&[t, 2, 4], 31 + pos as u64);
        let mut cpu = base.clone();
        ops::kv_write(&mut cpu, &new, pos).unwrap();
        let mut got = mlx(&base);
        ops::kv_write(&mut got, &new, pos).unwrap();
        // A pure copy: bit-identical.
        assert_eq!(back(&got), cpu.to_vec_f32().unwrap(), "kv_write at {pos}");
    }
}

#[test]
fn activations_scale_swiglu() {
    let x = awkward(64, 32);
    let up = host(&[8, 8], 33);
    type Op = fn(&Tensor) -> kernels::Result<Tensor>;
    let cases: [(&str, Op); 5] = [
        ("sigmoid", ops::sigmoid),
        ("softplus", ops::softplus),
        ("gelu_tanh", ops::gelu_tanh),
        ("scale", |x| ops::scale(x, -1.5)),
        ("softcap", |x| ops::softcap(x, 3.0)),
    ];
    for (name, f) in cases {
        check(name, &f(&x).unwrap(), &f(&mlx(&x)).unwrap(), ELEMENTWISE);
    }
    check(
        "swiglu",
        &ops::swiglu(&x, &up).unwrap(),
        &ops::swiglu(&mlx(&x), &up).unwrap(),
        ELEMENTWISE,
    );
}

#[test]
fn log_softmax_argmax_top_k() {
    let mut v = values(4 * 50, 34)
        .iter()
        .map(|x| x * 20.0)
        .collect::<Vec<_>>();
    v[50..100].fill(f32::NEG_INFINITY); // a fully masked row stays -inf
    v[7] = f32::NEG_INFINITY; // a masked entry in a live row
    v[160] = v[170]; // a tie
    v[171] = 1e3;
    v[172] = 1e3;
    let x = Tensor::from_f32(&[4, 50], v).unwrap();
    check(
        "log_softmax",
        &ops::log_softmax(&x).unwrap(),
        &ops::log_softmax(&mlx(&x)).unwrap(),
        ELEMENTWISE,
    );
    assert_eq!(ops::argmax(&mlx(&x)).unwrap(), ops::argmax(&x).unwrap());
    let row = x.narrow0(3, 1).unwrap().reshape(&[50]).unwrap();
    assert_eq!(
        ops::top_k(&mlx(&row), 5).unwrap(),
        ops::top_k(&row, 5).unwrap()
    );
}

#[test]
fn gdn_gate_including_extremes() {
    let mut a = values(6 * 4, 35)
        .iter()
        .map(|x| x * 10.0)
        .collect::<Vec<_>>();
    a[0] = -1e4; // softplus underflows: ln softplus(x) = x
    a[1] = 80.0;
    a[2] = -40.0;
    let a = Tensor::from_f32(&[6, 4], a).unwrap();
    let a_log = Tensor::from_f32(&[4], vec![-2.0, 0.5, 100.0, 3.0]).unwrap();
    let dt = to_bf16(&host(&[4], 36));
    let cpu = ops::gdn_gate(&a, &a_log, &dt).unwrap();
    let got = ops::gdn_gate(&mlx(&a), &a_log, &dt).unwrap();
    check("gdn_gate", &cpu, &got, ELEMENTWISE);
}

/// GDN inputs as the model feeds them: unit-norm q, k (q scaled by 1/√Dk), β in (0, 1), a
/// log-decay from the gate.
fn gdn_inputs(t: usize, seed: u64) -> [Tensor; 5] {
    let (hk, hv, dk, dv) = (2, 4, 8, 6);
    let unit = |s: u64, scale: f32| {
        let mut v = values(t * hk * dk, s);
        for row in v.chunks_mut(dk) {
            let n = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            row.iter_mut().for_each(|x| *x *= scale / n);
        }
        Tensor::from_f32(&[t, hk, dk], v).unwrap()
    };
    let q = unit(seed, 1.0 / (dk as f32).sqrt());
    let k = unit(seed + 1, 1.0);
    let v = host(&[t, hv, dv], seed + 2);
    let beta = ops::sigmoid(&host(&[t, hv], seed + 3)).unwrap();
    let a_log = host(&[hv], seed + 4);
    let g = ops::gdn_gate(&host(&[t, hv], seed + 5), &a_log, &host(&[hv], seed + 6)).unwrap();
    [q, k, v, g, beta]
}

#[test]
fn gdn_recurrent_and_chunked_carry_state() {
    let state0 = host(&[4, 6, 8], 40);
    for (name, chunked) in [("recurrent", false), ("chunked (per step on MLX)", true)] {
        let (mut cpu_s, mut mlx_s) = (state0.clone(), mlx(&state0));
        // Two calls, so the state carried between them is checked too.
        for (t, seed) in [(9, 41), (1, 50)] {
            let [q, k, v, g, b] = gdn_inputs(t, seed);
            let run = |s: &mut Tensor, q: &Tensor| {
                if chunked {
                    ops::gdn_chunked(q, &k, &v, &g, &b, s, 4).unwrap()
                } else {
                    ops::gdn_recurrent(q, &k, &v, &g, &b, s).unwrap()
                }
            };
            let cpu = run(&mut cpu_s, &q);
            let got = run(&mut mlx_s, &mlx(&q));
            check(&format!("gdn {name} y, T={t}"), &cpu, &got, MATMUL);
            check(&format!("gdn {name} state, T={t}"), &cpu_s, &mlx_s, MATMUL);
        }
    }
}

#[test]
fn causal_conv1d_with_carried_state() {
    let (c, kw) = (10, 4);
    let w = to_bf16(&host(&[c, kw], 60));
    for silu in [false, true] {
        let (mut cpu_s, mut mlx_s) = (host(&[kw - 1, c], 61), mlx(&host(&[kw - 1, c], 61)));
        for (t, seed) in [(6, 62), (1, 63), (2, 64)] {
            let x = host(&[t, c], seed);
            let cpu = ops::causal_conv1d(&x, &w, &mut cpu_s, silu).unwrap();
            let got = ops::causal_conv1d(&mlx(&x), &w, &mut mlx_s, silu).unwrap();
            check(&format!("conv silu={silu} T={t}"), &cpu, &got, ELEMENTWISE);
            check(&format!("conv state T={t}"), &cpu_s, &mlx_s, ELEMENTWISE);
        }
    }
}

#[test]
fn narrow_on_mlx_stays_on_mlx_and_copies_the_same_values() {
    let x = host(&[4, 6, 3], 70);
    for (dim, start, len) in [(0, 1, 2), (1, 2, 3), (2, 1, 1)] {
        let cpu = x.narrow(dim, start, len).unwrap();
        let got = mlx(&x).narrow(dim, start, len).unwrap();
        assert_eq!(got.shape(), cpu.shape());
        assert_eq!(back(&got), cpu.to_vec_f32().unwrap(), "narrow {dim}");
    }
    let got = mlx(&x).narrow0(3, 1).unwrap();
    assert_eq!(back(&got), x.narrow0(3, 1).unwrap().to_vec_f32().unwrap());
}

/// The MoE ops: `gather_matmul` on MLX (its `gather_mm` / `gather_qmm`) against the CPU's
/// grouped matmuls in every weight format, decode- and prefill-shaped; the unselected experts
/// poisoned with NaN must leave MLX's result bit-identical too; routing and combine.
#[test]
fn moe_ops_every_format_and_only_selected_experts() {
    let (e, n, k) = (8, 32, 128);
    let x = host(&[40, k], 41);
    for (name, spec, dtype) in formats() {
        let w = weight_in(&values(e * n * k, 42), e * n, k, spec, dtype);
        let resident = w.to_device(Device::Mlx).unwrap();
        let poisoned = poison(&w, e, &[0, 1, 2, 3, 4])
            .to_device(Device::Mlx)
            .unwrap();
        for tokens in [1usize, 40] {
            let rows: Vec<u32> = (0..tokens as u32).flat_map(|t| [t, t]).collect();
            let ids: Vec<u32> = (0..tokens as u32)
                .flat_map(|t| [t % 5, (t + 2) % 5])
                .collect();
            let cpu = ops::gather_matmul(&x, &w, e, &rows, &ids).unwrap();
            let got = ops::gather_matmul(&mlx(&x), &resident, e, &rows, &ids).unwrap();
            check(
                &format!("gather_matmul {name}, {tokens} tokens"),
                &cpu,
                &got,
                MATMUL,
            );
            let dirty = ops::gather_matmul(&mlx(&x), &poisoned, e, &rows, &ids).unwrap();
            assert_eq!(
                back(&got),
                back(&dirty),
                "{name}: MLX read an unselected expert"
            );
        }
    }
    let logits = host(&[9, 16], 43);
    assert_eq!(
        ops::moe_route(&logits, 4, true).unwrap().experts,
        ops::moe_route(&mlx(&logits), 4, true).unwrap().experts
    );
    let bias = values(16, 48);
    let routing = ops::Routing {
        selection_bias: &bias,
        renormalize: true,
        renormalize_eps: 1e-6,
        scale: 1.0,
    };
    let (on_cpu, on_mlx) = (
        ops::moe_route_sigmoid(&logits, 4, routing).unwrap(),
        ops::moe_route_sigmoid(&mlx(&logits), 4, routing).unwrap(),
    );
    assert_eq!(on_cpu.experts, on_mlx.experts);
    for (a, b) in on_cpu.weights.iter().zip(&on_mlx.weights) {
        assert!((a - b).abs() < 1e-5, "sigmoid route weights {a} vs {b}");
    }
    let (y, s, g) = (host(&[12, 40], 44), host(&[4, 40], 45), host(&[4, 1], 46));
    let w = values(12, 47);
    let cpu = ops::moe_combine(&y, &w, 3, Some((&s, &g))).unwrap();
    let got = ops::moe_combine(&mlx(&y), &w, 3, Some((&mlx(&s), &mlx(&g)))).unwrap();
    check("moe_combine", &cpu, &got, ELEMENTWISE);
}

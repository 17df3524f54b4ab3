//! `ops::matmul` and `ops::embedding` for every weight format against a naive f64 reference
//! that decodes the formats from first principles (bit streams, E2M1/E4M3/E8M0 by formula),
//! plus thread-count determinism and refusals of bad shapes.

use half::{bf16, f16};
use kernels::{ops, DType, QuantMode, QuantSpec, QuantWeight, Tensor, Weight};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 32
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() & 0xFF_FFFF) as f32 / (1 << 23) as f32 - 1.0
    }
}

// ---- the formats, decoded from their definitions -----------------------------------------

fn e2m1(code: u32) -> f64 {
    let (s, e, m) = ((code >> 3) & 1, (code >> 1) & 3, code & 1);
    let mag = if e == 0 {
        0.5 * m as f64
    } else {
        (1.0 + 0.5 * m as f64) * 2f64.powi(e as i32 - 1)
    };
    if s == 1 {
        -mag
    } else {
        mag
    }
}

fn e4m3(code: u32) -> f64 {
    let (s, e, m) = ((code >> 7) & 1, (code >> 3) & 15, code & 7);
    assert!(!(e == 15 && m == 7), "test data must not hold E4M3 NaN");
    let mag = if e == 0 {
        m as f64 / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
    };
    if s == 1 {
        -mag
    } else {
        mag
    }
}

fn e8m0(code: u32) -> f64 {
    2f64.powi(code as i32 - 127)
}

fn floats_f64(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::BF16 => t
            .as_slice::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::F16 => t
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::U8 => t
            .as_slice::<u8>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        other => panic!("no reference for {other:?}"),
    }
}

/// The weight as f64 `[rows, cols]`.
fn reference(w: &Weight) -> Vec<f64> {
    let q = match w {
        Weight::Dense(t) => return floats_f64(t),
        Weight::Quant(q) => q,
    };
    let (bits, group) = (q.spec.bits, q.spec.group_size);
    let words = q.packed.as_slice::<u32>().unwrap();
    let scales = floats_f64(&q.scales);
    let biases = q.biases.as_ref().map(floats_f64);
    let per_row = q.cols * bits / 32;
    let mut out = Vec::with_capacity(q.rows * q.cols);
    for r in 0..q.rows {
        for c in 0..q.cols {
            // Bit i of the row's stream is bit i % 32 of word i / 32.
            let mut code = 0u32;
            for b in 0..bits {
                let i = c * bits + b;
                code |= ((words[r * per_row + i / 32] >> (i % 32)) & 1) << b;
            }
            let g = r * (q.cols / group) + c / group;
            out.push(match q.spec.mode {
                QuantMode::Affine => scales[g] * code as f64 + biases.as_ref().unwrap()[g],
                QuantMode::Mxfp4 => e2m1(code) * e8m0(scales[g] as u32),
                QuantMode::Nvfp4 => e2m1(code) * e4m3(scales[g] as u32),
                QuantMode::Mxfp8 => e4m3(code) * e8m0(scales[g] as u32),
            });
        }
    }
    out
}

// ---- random weights in every format ------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Format {
    Dense(DType),
    Affine(usize, usize, DType),
    Fp(QuantMode),
}

fn all_formats() -> Vec<Format> {
    let mut v = vec![
        Format::Dense(DType::F32),
        Format::Dense(DType::BF16),
        Format::Dense(DType::F16),
    ];
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            v.push(Format::Affine(bits, group, DType::F32));
        }
    }
    v.push(Format::Affine(4, 64, DType::BF16));
    v.push(Format::Affine(8, 32, DType::F16));
    v.extend([QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8].map(Format::Fp));
    v
}

fn float_tensor(shape: &[usize], dtype: DType, vals: &[f32]) -> Tensor {
    match dtype {
        DType::F32 => Tensor::from_slice(shape, dtype, vals).unwrap(),
        DType::BF16 => {
            let h: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
            Tensor::from_slice(shape, dtype, &h).unwrap()
        }
        DType::F16 => {
            let h: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
            Tensor::from_slice(shape, dtype, &h).unwrap()
        }
        _ => unreachable!(),
    }
}

/// A random `[n, k]` weight: random code bits and plausible scales, built directly (not by
/// the quantizer) so the reference shares no code with the kernels.
fn random_weight(f: Format, n: usize, k: usize, seed: u64) -> Weight {
    let mut g = Lcg(seed);
    let (mode, bits, group) = match f {
        Format::Dense(dt) => {
            let vals: Vec<f32> = (0..n * k).map(|_| g.unit()).collect();
            return Weight::Dense(float_tensor(&[n, k], dt, &vals));
        }
        Format::Affine(b, gs, _) => (QuantMode::Affine, b, gs),
        Format::Fp(m) => {
            let (b, gs) = m.fixed_bits_group().unwrap();
            (m, b, gs)
        }
    };
    let spec = QuantSpec::new(mode, bits, group).unwrap();
    let words: Vec<u32> = (0..n * k * bits / 32).map(|_| g.next() as u32).collect();
    let mut words = words;
    if mode == QuantMode::Mxfp8 {
        // Keep E4M3 codes off NaN (S.1111.111).
        for w in &mut words {
            for i in 0..4 {
                if (*w >> (8 * i + 3)) & 0xF == 0xF {
                    *w &= !(1 << (8 * i + 6));
                }
            }
        }
    }
    let packed = Tensor::from_slice(&[n, k * bits / 32], DType::U32, &words).unwrap();
    let groups = k / group;
    let (scales, biases) = match f {
        Format::Affine(_, _, dt) => {
            let s: Vec<f32> = (0..n * groups).map(|_| g.unit() * 0.1).collect();
            let b: Vec<f32> = (0..n * groups).map(|_| g.unit()).collect();
            (
                float_tensor(&[n, groups], dt, &s),
                Some(float_tensor(&[n, groups], dt, &b)),
            )
        }
        _ => {
            let codes: Vec<u8> = (0..n * groups)
                .map(|_| match mode {
                    // Positive E4M3 scales between 2^-4 and 2^2.
                    QuantMode::Nvfp4 => 0x18 + (g.next() % 0x30) as u8,
                    _ => 122 + (g.next() % 8) as u8,
                })
                .collect();
            (
                Tensor::from_slice(&[n, groups], DType::U8, &codes).unwrap(),
                None,
            )
        }
    };
    Weight::Quant(QuantWeight::new(spec, packed, scales, biases, "test weight").unwrap())
}

fn random_x(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut g = Lcg(seed);
    (0..m * k).map(|_| g.unit()).collect()
}

/// Checks `ops::matmul` against the f64 reference, element by element, with an f32 bound
/// relative to `Σ|x·w|` of that element.
/// `Σ x·w` in f64 and `Σ |x·w|` (the scale an error bound is relative to).
fn dot_f64(x: &[f32], w: &[f64]) -> (f64, f64) {
    x.iter().zip(w).fold((0.0, 0.0), |(sum, mag), (&a, &b)| {
        let p = a as f64 * b;
        (sum + p, mag + p.abs())
    })
}

fn check_matmul(f: Format, m: usize, n: usize, k: usize, seed: u64) {
    let w = random_weight(f, n, k, seed);
    let x = random_x(m, k, seed ^ 0x5EED);
    let xt = Tensor::from_f32(&[m, k], x.clone()).unwrap();
    let y = ops::matmul(&xt, &w).unwrap();
    assert_eq!(y.shape(), &[m, n], "{f:?}");
    let y = y.f32s().unwrap();
    let wr = reference(&w);
    for i in 0..m {
        for j in 0..n {
            let (want, mag) = dot_f64(&x[i * k..(i + 1) * k], &wr[j * k..(j + 1) * k]);
            let got = y[i * n + j] as f64;
            // Within 1e-5 of the sum of |x·w| (cancellation makes a relative bound meaningless).
            approx::assert_abs_diff_eq!(got, want, epsilon = 1e-5 * mag + 1e-30);
        }
    }
}

#[test]
fn every_format_matches_the_f64_reference() {
    // Decode shapes (m ≤ 8) and prefill shapes, odd n, and n crossing a 128-row tile.
    let shapes = [
        (1, 7, 128),
        (3, 33, 256),
        (4, 1, 128),
        (5, 130, 128),
        (8, 130, 128),
        (9, 130, 128),
        (17, 9, 256),
    ];
    for (fi, f) in all_formats().into_iter().enumerate() {
        for (si, &(m, n, k)) in shapes.iter().enumerate() {
            check_matmul(f, m, n, k, (fi * 31 + si) as u64);
        }
    }
}

/// Speculative verification runs up to 5 rows and a batched step up to 8 where plain decoding
/// runs one: in the decode kernel each row's result must not depend on the rows beside it, bit
/// for bit.
#[test]
fn decode_rows_do_not_depend_on_their_neighbours() {
    for (fi, f) in all_formats().into_iter().enumerate() {
        let (n, k) = (130, 256);
        let w = random_weight(f, n, k, 70 + fi as u64);
        let max = kernels::cpu::matmul::DECODE_MAX_M;
        let xs = random_x(max, k, 80 + fi as u64);
        for m in 1..=max {
            let x = Tensor::from_f32(&[m, k], xs[..m * k].to_vec()).unwrap();
            let together = ops::matmul(&x, &w).unwrap();
            for i in 0..m {
                let row = Tensor::from_f32(&[1, k], xs[i * k..(i + 1) * k].to_vec()).unwrap();
                let alone = ops::matmul(&row, &w).unwrap();
                assert_eq!(
                    &together.f32s().unwrap()[i * n..(i + 1) * n],
                    alone.f32s().unwrap(),
                    "format {fi}: row {i} of {m} differs from the row alone"
                );
            }
        }
    }
}

#[test]
fn matmul_rows_gives_each_row_its_one_row_result() {
    // 19 rows: two full groups of the decode kernel (8 rows) and a partial one.
    for (fi, f) in all_formats().into_iter().enumerate() {
        let (m, n, k) = (19, 70, 128);
        let w = random_weight(f, n, k, 170 + fi as u64);
        let xs = random_x(m, k, 180 + fi as u64);
        let x = Tensor::from_f32(&[m, k], xs.clone()).unwrap();
        let got = ops::matmul_rows(&x, &w).unwrap();
        assert_eq!(got.shape(), &[m, n]);
        for i in 0..m {
            let row = Tensor::from_f32(&[1, k], xs[i * k..(i + 1) * k].to_vec()).unwrap();
            assert_eq!(
                &got.f32s().unwrap()[i * n..(i + 1) * n],
                ops::matmul(&row, &w).unwrap().f32s().unwrap(),
                "format {fi}: row {i} of a batch differs from the row alone"
            );
        }
    }
}

#[test]
fn batched_input_keeps_leading_dims() {
    let w = random_weight(Format::Affine(4, 32, DType::F32), 5, 64, 1);
    let x = Tensor::from_f32(&[2, 3, 64], random_x(6, 64, 2)).unwrap();
    let y = ops::matmul(&x, &w).unwrap();
    assert_eq!(y.shape(), &[2, 3, 5]);
    let flat = ops::matmul(&x.reshape(&[6, 64]).unwrap(), &w).unwrap();
    assert_eq!(y.f32s().unwrap(), flat.f32s().unwrap());
}

#[test]
fn embedding_decodes_the_requested_rows() {
    for (fi, f) in all_formats().into_iter().enumerate() {
        let (vocab, d) = (11, 128);
        let w = random_weight(f, vocab, d, 100 + fi as u64);
        let ids = [3u32, 0, 10, 3];
        let e = ops::embedding(&w, &ids).unwrap();
        assert_eq!(e.shape(), &[4, d]);
        let wr = reference(&w);
        for (t, &id) in ids.iter().enumerate() {
            for c in 0..d {
                let want = wr[id as usize * d + c];
                let got = e.f32s().unwrap()[t * d + c] as f64;
                // Affine decodes scale·q + bias in f32; the others are exact.
                approx::assert_relative_eq!(got, want, epsilon = 1e-6, max_relative = 1e-6);
            }
        }
    }
}

#[test]
fn portable_and_vector_decoders_agree_bit_for_bit() {
    // `quant::dequantize` runs the portable decoders; `embedding` takes the vector ones where
    // the CPU has them. Every code value appears in these random weights.
    for (fi, f) in all_formats().into_iter().enumerate() {
        let Weight::Quant(q) = random_weight(f, 6, 256, 500 + fi as u64) else {
            continue;
        };
        let portable = kernels::quant::dequantize(&q).unwrap();
        let ids: Vec<u32> = (0..6).collect();
        let vector = ops::embedding(&Weight::Quant(q), &ids).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&portable), bits(vector.f32s().unwrap()), "{f:?}");
    }
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Large enough that both kernels really split work across threads.
    let cases = [
        (Format::Dense(DType::F32), 33, 300),
        (Format::Dense(DType::BF16), 2, 600),
        (Format::Affine(4, 64, DType::BF16), 40, 300),
        (Format::Affine(3, 32, DType::F32), 1, 600),
        (Format::Affine(4, 32, DType::F16), 4, 600),
        (Format::Fp(QuantMode::Nvfp4), 3, 600),
        (Format::Fp(QuantMode::Mxfp4), 9, 300),
    ];
    for (f, m, n) in cases {
        let k = 256;
        let w = random_weight(f, n, k, 9);
        let x = Tensor::from_f32(&[m, k], random_x(m, k, 10)).unwrap();
        let one = in_pool(1, || ops::matmul(&x, &w).unwrap());
        let two = in_pool(2, || ops::matmul(&x, &w).unwrap());
        let bits = |t: &Tensor| {
            t.f32s()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&one), bits(&two), "{f:?} m={m}");
        let ids: Vec<u32> = (0..200).map(|i| (i * 7 % n) as u32).collect();
        let e1 = in_pool(1, || ops::embedding(&w, &ids).unwrap());
        let e2 = in_pool(2, || ops::embedding(&w, &ids).unwrap());
        assert_eq!(bits(&e1), bits(&e2), "{f:?} embedding");
    }
}

#[test]
fn bad_shapes_are_errors() {
    let w = random_weight(Format::Affine(4, 64, DType::F32), 8, 128, 1);
    // Feature count mismatch.
    let x = Tensor::from_f32(&[2, 64], vec![0.0; 128]).unwrap();
    assert!(ops::matmul(&x, &w).is_err());
    // Non-f32 activations.
    let xb = float_tensor(&[1, 128], DType::BF16, &[0.0; 128]);
    assert!(ops::matmul(&xb, &w).is_err());
    // Token id past the vocabulary.
    assert!(ops::embedding(&w, &[8]).is_err());
    // A quantized weight whose parts were swapped after validation.
    let Weight::Quant(mut q) = w else {
        unreachable!()
    };
    q.scales = Tensor::from_slice(&[8, 1], DType::F32, &[0.0f32; 8]).unwrap();
    let bad = Weight::Quant(q);
    let x = Tensor::from_f32(&[1, 128], vec![0.0; 128]).unwrap();
    assert!(ops::matmul(&x, &bad).is_err());
    assert!(ops::embedding(&bad, &[0]).is_err());
    // Dense weights must be float.
    let wi = Weight::Dense(Tensor::from_slice(&[2, 128], DType::U32, &[0u32; 256]).unwrap());
    assert!(ops::matmul(&x, &wi).is_err());
    // QuantWeight::new refuses scales that do not fit.
    let spec = QuantSpec::new(QuantMode::Mxfp4, 4, 32).unwrap();
    let packed = Tensor::from_slice(&[2, 16], DType::U32, &[0u32; 32]).unwrap();
    let scales = Tensor::from_slice(&[2, 3], DType::U8, &[127u8; 6]).unwrap();
    assert!(QuantWeight::new(spec, packed, scales, None, "t").is_err());
}

#[test]
fn empty_inputs_give_empty_outputs() {
    let w = random_weight(Format::Dense(DType::F32), 4, 32, 1);
    let x = Tensor::from_f32(&[0, 32], vec![]).unwrap();
    assert_eq!(ops::matmul(&x, &w).unwrap().shape(), &[0, 4]);
    assert_eq!(ops::embedding(&w, &[]).unwrap().shape(), &[0, 32]);
}

// ---- instruction sets and the `fast` numerics -------------------------------------------

use kernels::cpu::isa;
use kernels::numerics::Numerics;
use kernels::Settings;

fn bits_of(t: &Tensor) -> Vec<u32> {
    t.f32s().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// `ops::matmul` with the kernels capped at `level` and on numerics `n`.
fn matmul_at(level: &str, n: Numerics, x: &Tensor, w: &Weight) -> Tensor {
    at(level, n, || ops::matmul(x, w).unwrap())
}

/// Runs `f` on the kernels' pool with the ISA capped at `level` and numerics `n`.
fn at<R: Send>(level: &str, n: Numerics, f: impl FnOnce() -> R + Send) -> R {
    let s = Settings {
        numerics: n,
        isa_cap: Some(level.parse().unwrap()),
    };
    kernels::run(kernels::Device::Cpu, s, f)
}

#[test]
fn every_instruction_set_gives_the_same_bits() {
    // Decode shapes (every row count the decode kernel takes) and a prefill shape; k values
    // that end in a partial block of 32 lanes (dense) or of 8 groups (the fast path).
    let cases = [
        (Format::Dense(DType::F32), 100),
        (Format::Dense(DType::BF16), 100),
        (Format::Dense(DType::BF16), 256),
        (Format::Dense(DType::F16), 96),
        (Format::Affine(4, 64, DType::BF16), 704),
        (Format::Affine(4, 64, DType::F32), 1024),
        // Whole blocks of 8 groups with bf16 and f16 scales: the vector float step of the
        // VNNI and AVX2 fast kernels.
        (Format::Affine(4, 64, DType::BF16), 1024),
        (Format::Affine(4, 64, DType::F16), 512),
        (Format::Affine(4, 32, DType::F16), 256),
        (Format::Affine(8, 64, DType::F32), 256),
        (Format::Fp(QuantMode::Mxfp4), 256),
    ];
    for (ci, (f, k)) in cases.into_iter().enumerate() {
        let w = random_weight(f, 37, k, 40 + ci as u64);
        for m in [1, 2, 3, 4, 5, 7, 8, 9, 14] {
            let x = Tensor::from_f32(&[m, k], random_x(m, k, 41 + m as u64)).unwrap();
            for n in [Numerics::Exact, Numerics::Fast] {
                let native = bits_of(&matmul_at("native", n, &x, &w));
                for &level in crate::common::isa_levels() {
                    // The fused 4- and 8-bit affine decode kernel for AVX2 and up rounds
                    // differently from the portable decode-then-dot (documented in
                    // qmatvec_avx2); 8-bit weights take it in both numerics.
                    let fused_exact = match f {
                        Format::Affine(4, g, _) => n == Numerics::Exact || g != 64,
                        Format::Affine(8, _, _) => true,
                        _ => false,
                    };
                    if level == "portable"
                        && fused_exact
                        && m <= kernels::cpu::matmul::DECODE_MAX_M
                        && isa::Isa::detected().avx2
                    {
                        continue;
                    }
                    let got = bits_of(&matmul_at(level, n, &x, &w));
                    assert_eq!(got, native, "{f:?} k={k} m={m} {n} at {level}");
                }
            }
        }
    }
}

#[test]
fn fast_numerics_change_only_4bit_group64_and_bf16_products() {
    for (f, m) in [
        (Format::Dense(DType::F32), 9),
        (Format::Dense(DType::F16), 1),
        (Format::Affine(4, 32, DType::F32), 2),
        (Format::Affine(4, 128, DType::F32), 8),
        (Format::Affine(8, 64, DType::F32), 1),
    ] {
        let w = random_weight(f, 19, 256, 60);
        let x = Tensor::from_f32(&[m, 256], random_x(m, 256, 61)).unwrap();
        let exact = bits_of(&matmul_at("native", Numerics::Exact, &x, &w));
        let fast = bits_of(&matmul_at("native", Numerics::Fast, &x, &w));
        assert_eq!(exact, fast, "{f:?} m={m}");
    }
    for f in [
        Format::Affine(4, 64, DType::BF16),
        Format::Dense(DType::BF16),
    ] {
        let w = random_weight(f, 19, 256, 60);
        for m in [1, 5, 6] {
            let x = Tensor::from_f32(&[m, 256], random_x(m, 256, 61)).unwrap();
            let exact = bits_of(&matmul_at("native", Numerics::Exact, &x, &w));
            let fast = bits_of(&matmul_at("native", Numerics::Fast, &x, &w));
            assert_ne!(exact, fast, "the fast path must run for {f:?} (m={m})");
        }
    }
}

#[test]
fn fast_numerics_stay_within_the_activation_rounding_bound() {
    // Quantizing x to int8 per group of 64 moves each element by at most amax_g / 254, so
    // |fast − exact| ≤ Σ_g amax_g/254 · Σ_{j∈g} |w_j| (plus f32 rounding). A wrong nibble or
    // lane order breaks this by orders of magnitude.
    let (n, k) = (29, 704);
    for dt in [DType::BF16, DType::F32] {
        let w = random_weight(Format::Affine(4, 64, dt), n, k, 70);
        let wr = reference(&w);
        for m in [1, 2, 3, 4, 5, 6, 9] {
            let mut x = random_x(m, k, 71 + m as u64);
            // One group with a large outlier and one all-zero group.
            x[5] = 40.0;
            x[64..128].iter_mut().for_each(|v| *v = 0.0);
            let xt = Tensor::from_f32(&[m, k], x.clone()).unwrap();
            let y = matmul_at("native", Numerics::Fast, &xt, &w);
            let y = y.f32s().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let (mut want, mut mag, mut bound) = (0.0f64, 0.0f64, 0.0f64);
                    for g in 0..k / 64 {
                        let xs = &x[i * k + g * 64..i * k + (g + 1) * 64];
                        let amax = xs.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64));
                        for (c, &xv) in xs.iter().enumerate() {
                            let wv = wr[j * k + g * 64 + c];
                            want += xv as f64 * wv;
                            mag += (xv as f64 * wv).abs();
                            bound += amax / 254.0 * wv.abs();
                        }
                    }
                    let got = y[i * n + j] as f64;
                    let tol = 1.001 * bound + 1e-5 * mag;
                    assert!(
                        (got - want).abs() <= tol,
                        "{dt:?} m={m} row {i} col {j}: {got} vs {want} (bound {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn fast_numerics_keep_nan_and_are_thread_independent() {
    let w = random_weight(Format::Affine(4, 64, DType::BF16), 300, 256, 80);
    let mut x = random_x(2, 256, 81);
    let xt = Tensor::from_f32(&[2, 256], x.clone()).unwrap();
    let one = in_pool(1, || matmul_at("native", Numerics::Fast, &xt, &w));
    let two = in_pool(2, || matmul_at("native", Numerics::Fast, &xt, &w));
    assert_eq!(bits_of(&one), bits_of(&two));
    x[300] = f32::NAN;
    let xt = Tensor::from_f32(&[2, 256], x).unwrap();
    let y = matmul_at("native", Numerics::Fast, &xt, &w);
    let y = y.f32s().unwrap();
    assert!(y[..300].iter().all(|v| v.is_finite()));
    assert!(
        y[300..].iter().all(|v| v.is_nan()),
        "a NaN input row must stay NaN"
    );
}

#[test]
fn fast_bf16_is_the_same_on_every_isa_even_with_subnormals() {
    // Weights and activations spanning normal, tiny and subnormal magnitudes (bf16 has f32's
    // exponent range), where the instruction's DAZ/FTZ decide the bits. Decode (m ≤ 5) and
    // prefill row counts; k = 90 has one whole decode block of 64 columns and a tail, k = 129
    // two blocks and an odd last column, k = 128 whole blocks only (AVX-512 BF16's blocked
    // kernel).
    for k in [90, 128, 129] {
        fast_bf16_isa_case(k);
    }
}

fn fast_bf16_isa_case(k: usize) {
    let n = 37;
    let mut g = Lcg(k as u64);
    let mag = |g: &mut Lcg| match g.next() % 4 {
        0 => 1.0,
        1 => 1e-20,
        2 => 1e-39, // subnormal in f32 and in bf16
        _ => 3e-38,
    };
    let wv: Vec<f32> = (0..n * k).map(|_| g.unit() * mag(&mut g)).collect();
    let w = Weight::Dense(float_tensor(&[n, k], DType::BF16, &wv));
    for m in [1, 2, 5, 6, 8, 13] {
        let xv: Vec<f32> = (0..m * k).map(|_| g.unit() * mag(&mut g)).collect();
        let x = Tensor::from_f32(&[m, k], xv).unwrap();
        let native = bits_of(&matmul_at("native", Numerics::Fast, &x, &w));
        for &level in crate::common::isa_levels() {
            let got = bits_of(&matmul_at(level, Numerics::Fast, &x, &w));
            assert_eq!(got, native, "k={k} m={m} at {level}");
        }
    }
}

#[test]
fn fast_bf16_decode_rows_are_independent() {
    // An input row gives the same bits alone as among the 5 rows of an MTP verification or the
    // 8 of a batched step, on every ISA level; k = 320 is whole blocks of 64 columns only.
    for (k, m) in [(300, 5), (320, 5), (320, 8)] {
        let n = 70;
        let w = random_weight(Format::Dense(DType::BF16), n, k, 97);
        let xs = random_x(m, k, 98);
        let all_rows = Tensor::from_f32(&[m, k], xs.clone()).unwrap();
        for &level in crate::common::isa_levels() {
            let all = bits_of(&matmul_at(level, Numerics::Fast, &all_rows, &w));
            for i in 0..m {
                let xi = Tensor::from_f32(&[1, k], xs[i * k..(i + 1) * k].to_vec()).unwrap();
                let one = bits_of(&matmul_at(level, Numerics::Fast, &xi, &w));
                assert_eq!(
                    one,
                    all[i * n..(i + 1) * n],
                    "k={k}: row {i} of {m} at {level}"
                );
            }
        }
    }
}

#[test]
fn fast_bf16_stays_within_the_activation_rounding_bound() {
    // Rounding x to bf16 moves each element by at most 2^-9 of itself; f32 accumulation adds
    // at most k·2^-24 of Σ|x·w|.
    let (n, k) = (29, 301);
    let w = random_weight(Format::Dense(DType::BF16), n, k, 95);
    let wr = reference(&w);
    for m in [1, 3, 5, 6, 9, 17] {
        let x = random_x(m, k, 96 + m as u64);
        let xt = Tensor::from_f32(&[m, k], x.clone()).unwrap();
        let fast = matmul_at("native", Numerics::Fast, &xt, &w);
        let exact = matmul_at("native", Numerics::Exact, &xt, &w);
        assert_ne!(
            bits_of(&fast),
            bits_of(&exact),
            "the bf16 fast path must run (m={m})"
        );
        let y = fast.f32s().unwrap();
        for i in 0..m {
            for j in 0..n {
                let (want, mag) = dot_f64(&x[i * k..(i + 1) * k], &wr[j * k..(j + 1) * k]);
                let tol = mag * (2f64.powi(-9) + k as f64 * 2f64.powi(-24));
                let got = y[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= tol,
                    "m={m} ({i}, {j}): {got} vs {want} (tol {tol})"
                );
            }
        }
    }
}

/// `matmul_many` (a layer's projections of one input in one parallel loop) must give each
/// weight exactly its own `matmul`, for every format, decode and prefill row counts, both
/// numerics and every ISA level; and refuse a weight of the wrong width.
#[test]
fn matmul_many_is_each_matmul_bit_for_bit() {
    let k = 1024;
    let ws = [
        random_weight(Format::Affine(4, 64, DType::BF16), 96, k, 61),
        random_weight(Format::Dense(DType::BF16), 40, k, 62),
        random_weight(Format::Dense(DType::F32), 7, k, 63),
        random_weight(Format::Affine(8, 64, DType::F32), 33, k, 64),
        random_weight(Format::Fp(QuantMode::Mxfp4), 64, k, 65),
    ];
    let refs: Vec<&Weight> = ws.iter().collect();
    for m in [1, 2, 5, 9] {
        let x = Tensor::from_f32(&[m, k], random_x(m, k, 70 + m as u64)).unwrap();
        for n in [Numerics::Exact, Numerics::Fast] {
            for &level in crate::common::isa_levels() {
                let many = at(level, n, || ops::matmul_many(&x, &refs).unwrap());
                assert_eq!(many.len(), ws.len());
                for (j, (got, w)) in many.iter().zip(&ws).enumerate() {
                    let one = matmul_at(level, n, &x, w);
                    assert_eq!(got.shape(), one.shape(), "weight {j} m={m} {n} at {level}");
                    assert_eq!(
                        bits_of(got),
                        bits_of(&one),
                        "weight {j} m={m} {n} at {level}"
                    );
                }
            }
        }
    }
    let narrow = random_weight(Format::Dense(DType::F32), 8, k - 64, 66);
    let x = Tensor::from_f32(&[1, k], random_x(1, k, 71)).unwrap();
    assert!(ops::matmul_many(&x, &[&ws[0], &narrow]).is_err());
}

//! Op conformance of the CUDA backend against the CPU reference (docs/design.md §3), in the style of
//! llama.cpp's test-backend-ops: one table of cases walking the whole op list, one comparison
//! routine, one line per verdict. Each case builds its inputs on the host, runs once with them
//! on the CPU and once with them on the GPU; results must match within NMSE = Σ(a−b)²/Σa² ≤ 1e-7
//! (elementwise, norms, RoPE, copies) or ≤ 5e-4 (matmul, attention, Gated DeltaNet), with no
//! NaN and no one-sided inf; argmax, top-k and flags must be equal.
//!
//! Without a usable GPU the test prints `SKIPPED` with the reason (no driver, no device, a
//! missing library) and checks that moving a tensor to the GPU fails with that reason instead
//! of panicking. `CUDA_CONFORMANCE_REQUIRED=1` (set by `ci/gpu-check.sh`) makes a skip a
//! failure.

use crate::common;
use common::values;

use half::{bf16, f16};
use kernels::ops::{self, AttnParams, RopeLayout};
use kernels::quant::quantize;
use kernels::{DType, Device, QuantMode, QuantSpec, Tensor, Weight};

const ELEMENTWISE: f64 = 1e-7;
const MATMUL: f64 = 5e-4;

/// What an op returned, on whichever device ran it.
enum Out {
    Tensors(Vec<Tensor>),
    Ids(Vec<u32>),
    TopK(Vec<(u32, f32)>),
    Flag(bool),
}

struct Case {
    name: String,
    /// NMSE limit for tensor outputs (ids, top-k and flags must be equal).
    limit: f64,
    run: Box<dyn Fn(Device) -> kernels::Result<Out>>,
}

fn case(
    name: impl Into<String>,
    limit: f64,
    run: impl Fn(Device) -> kernels::Result<Out> + 'static,
) -> Case {
    Case {
        name: name.into(),
        limit,
        run: Box::new(run),
    }
}

fn host(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap()
}

fn scaled(shape: &[usize], seed: u64, s: f32) -> Tensor {
    let v = values(shape.iter().product(), seed)
        .into_iter()
        .map(|x| x * s)
        .collect();
    Tensor::from_f32(shape, v).unwrap()
}

fn on(d: Device, t: &Tensor) -> Tensor {
    t.to_device(d).unwrap()
}

/// Every weight format the engine loads, `[n, k]`: dense f32/bf16/f16 and MLX's quantized
/// formats as `quant::quantize` writes them (affine scales in bf16, as mlx-lm saves them).
fn weights(n: usize, k: usize, seed: u64) -> Vec<(String, Weight)> {
    let w = values(n * k, seed);
    let dense16 = |dtype: DType| -> Tensor {
        match dtype {
            DType::BF16 => {
                let h: Vec<bf16> = w.iter().map(|&x| bf16::from_f32(x)).collect();
                Tensor::from_slice(&[n, k], DType::BF16, &h).unwrap()
            }
            _ => {
                let h: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
                Tensor::from_slice(&[n, k], DType::F16, &h).unwrap()
            }
        }
    };
    let mut out = vec![
        (
            "f32".into(),
            Weight::Dense(Tensor::from_f32(&[n, k], w.clone()).unwrap()),
        ),
        ("bf16".into(), Weight::Dense(dense16(DType::BF16))),
        ("f16".into(), Weight::Dense(dense16(DType::F16))),
    ];
    let q = |mode, bits, group, dtype| {
        let spec = QuantSpec::new(mode, bits, group).unwrap();
        Weight::Quant(quantize(&w, n, k, spec, dtype).unwrap())
    };
    for (bits, group) in [(2, 64), (3, 32), (4, 64), (5, 128), (6, 64), (8, 32)] {
        out.push((
            format!("affine-q{bits}-g{group}"),
            q(QuantMode::Affine, bits, group, DType::BF16),
        ));
    }
    for (name, mode, bits, group) in [
        ("mxfp4", QuantMode::Mxfp4, 4, 32),
        ("nvfp4", QuantMode::Nvfp4, 4, 16),
        ("mxfp8", QuantMode::Mxfp8, 8, 32),
    ] {
        out.push((name.into(), q(mode, bits, group, DType::U8)));
    }
    out
}

fn matmul_cases(cases: &mut Vec<Case>) {
    let (n, k) = (99, 256);
    for (fmt, w) in weights(n, k, 11) {
        // 3 rows take the decode matvec, 70 the prefill path (cuBLAS or the tiled kernel).
        for m in [3usize, 70] {
            let (w, x) = (w.clone(), host(&[m, k], 12));
            cases.push(case(format!("matmul {fmt} m={m}"), MATMUL, move |d| {
                let w = w.to_device(d)?;
                Ok(Out::Tensors(vec![ops::matmul(&on(d, &x), &w)?]))
            }));
        }
        let w = w.clone();
        cases.push(case(format!("embedding {fmt}"), ELEMENTWISE, move |d| {
            let w = w.to_device(d)?;
            Ok(Out::Tensors(vec![ops::embedding(&w, &[0, 98, 7, 7, 50])?]))
        }));
    }
}

fn row_cases(cases: &mut Vec<Case>) {
    let x = host(&[5, 300], 21);
    let gain = {
        let v: Vec<bf16> = values(300, 22).iter().map(|&x| bf16::from_f32(x)).collect();
        Tensor::from_slice(&[300], DType::BF16, &v).unwrap()
    };
    {
        let (x, gain) = (x.clone(), gain.clone());
        cases.push(case("rms_norm bf16 gain", ELEMENTWISE, move |d| {
            let g = on(d, &gain);
            Ok(Out::Tensors(vec![ops::rms_norm(
                &on(d, &x),
                Some(&g),
                1e-6,
            )?]))
        }));
    }
    {
        let x = x.clone();
        cases.push(case("rms_norm no gain", ELEMENTWISE, move |d| {
            Ok(Out::Tensors(vec![ops::rms_norm(&on(d, &x), None, 1e-5)?]))
        }));
    }
    // Row 0 fully masked, row 1 with a few -inf: the softmaxes' edge cases.
    let mut masked = values(5 * 300, 23);
    masked[..300].fill(f32::NEG_INFINITY);
    masked[300..310].fill(f32::NEG_INFINITY);
    let masked = Tensor::from_f32(&[5, 300], masked).unwrap();
    for (name, f) in [
        (
            "softmax",
            ops::softmax as fn(&Tensor) -> kernels::Result<Tensor>,
        ),
        ("log_softmax", ops::log_softmax),
    ] {
        for (what, x) in [("", x.clone()), (" masked rows", masked.clone())] {
            cases.push(case(format!("{name}{what}"), ELEMENTWISE, move |d| {
                Ok(Out::Tensors(vec![f(&on(d, &x))?]))
            }));
        }
    }
    // Ties and NaN in argmax / top-k: equal values at 3 and 9, a NaN at 0.
    let mut tied = values(3 * 5000, 24);
    tied[3] = 5.0;
    tied[9] = 5.0;
    tied[0] = f32::NAN;
    let tied = Tensor::from_f32(&[3, 5000], tied).unwrap();
    {
        let t = tied.clone();
        cases.push(case("argmax ties+NaN", 0.0, move |d| {
            Ok(Out::Ids(ops::argmax(&on(d, &t))?))
        }));
    }
    for k in [1usize, 5, 64, 100] {
        let row = tied.narrow0(0, 1).unwrap().reshape(&[5000]).unwrap();
        cases.push(case(format!("top_k k={k}"), 0.0, move |d| {
            Ok(Out::TopK(ops::top_k(&on(d, &row), k)?))
        }));
    }
    for (layout, name) in [
        (RopeLayout::HalfSplit, "half-split"),
        (RopeLayout::Interleaved, "interleaved"),
    ] {
        let x = host(&[7, 3, 64], 25);
        let freq: Vec<f32> = (0..16)
            .map(|i| 1.0 / 10000f32.powf(i as f32 / 16.0))
            .collect();
        cases.push(case(
            format!("rope {name} partial"),
            ELEMENTWISE,
            move |d| {
                let pos: Vec<usize> = (4000..4007).collect();
                Ok(Out::Tensors(vec![ops::rope(
                    &on(d, &x),
                    &pos,
                    &freq,
                    layout,
                )?]))
            },
        ));
    }
}

fn elementwise_cases(cases: &mut Vec<Case>) {
    let mut v = values(4 * 257, 31)
        .into_iter()
        .map(|x| x * 30.0)
        .collect::<Vec<_>>();
    v[0] = f32::NEG_INFINITY;
    v[1] = 100.0;
    v[2] = -100.0;
    let x = Tensor::from_f32(&[4, 257], v).unwrap();
    for (name, f) in [
        ("silu", ops::silu as fn(&Tensor) -> kernels::Result<Tensor>),
        ("gelu_tanh", ops::gelu_tanh),
        ("sigmoid", ops::sigmoid),
        ("softplus", ops::softplus),
        ("softcap", |x| ops::softcap(x, 30.0)),
    ] {
        let x = x.clone();
        cases.push(case(name, ELEMENTWISE, move |d| {
            Ok(Out::Tensors(vec![f(&on(d, &x))?]))
        }));
    }
    {
        let x = host(&[4, 257], 32);
        cases.push(case("scale", ELEMENTWISE, move |d| {
            Ok(Out::Tensors(vec![ops::scale(&on(d, &x), -0.37)?]))
        }));
    }
    let (a, b, row) = (host(&[6, 40], 33), host(&[6, 40], 34), host(&[40], 35));
    type Bin = fn(&Tensor, &Tensor) -> kernels::Result<Tensor>;
    for (name, f, b) in [
        ("add", ops::add as Bin, b.clone()),
        ("add broadcast", ops::add as Bin, row.clone()),
        ("mul", ops::mul as Bin, b.clone()),
        ("mul broadcast", ops::mul as Bin, row),
        ("swiglu", ops::swiglu as Bin, b),
    ] {
        let a = a.clone();
        cases.push(case(name, ELEMENTWISE, move |d| {
            Ok(Out::Tensors(vec![f(&on(d, &a), &on(d, &b))?]))
        }));
    }
    // Copies and views: narrow along an inner dim (a kernel) and along dim 0 (a view).
    let x = host(&[5, 12, 3], 36);
    cases.push(case("narrow dim 1 / narrow0", ELEMENTWISE, move |d| {
        let t = on(d, &x);
        Ok(Out::Tensors(vec![t.narrow(1, 4, 5)?, t.narrow0(2, 2)?]))
    }));
    let mut bad = values(1000, 37);
    for (i, v) in [(999usize, f32::NAN), (500, f32::INFINITY)] {
        let mut t = bad.clone();
        t[i] = v;
        let t = Tensor::from_f32(&[1000], t).unwrap();
        cases.push(case(format!("all_finite {v}"), 0.0, move |d| {
            Ok(Out::Flag(ops::all_finite(&on(d, &t))?))
        }));
    }
    bad.truncate(10);
    let fine = Tensor::from_f32(&[10], bad).unwrap();
    cases.push(case("all_finite finite", 0.0, move |d| {
        Ok(Out::Flag(ops::all_finite(&on(d, &fine))?))
    }));
}

fn attention_cases(cases: &mut Vec<Case>) {
    // GQA 8 query heads on 2 KV heads, D = 64; a prefill of 70 rows and a decode row at 129.
    for (name, t, q_start, window, softcap) in [
        ("prefill", 70usize, 0usize, None, None),
        ("prefill window 16", 70, 0, Some(16), None),
        ("prefill softcap 30", 70, 0, None, Some(30.0f32)),
        ("decode", 1, 129, None, None),
        ("decode window 64 softcap 50", 1, 129, Some(64), Some(50.0)),
    ] {
        let q = scaled(&[t, 8, 64], 41, 2.0);
        let (newk, newv) = (scaled(&[t, 2, 64], 42, 2.0), host(&[t, 2, 64], 43));
        let (oldk, oldv) = (
            scaled(&[q_start.max(1), 2, 64], 44, 2.0),
            host(&[q_start.max(1), 2, 64], 45),
        );
        cases.push(case(format!("attention {name}"), MATMUL, move |d| {
            // The caches start on the host (as the engine's do) and kv_write moves them.
            let cap = q_start + t + 5;
            let (mut kc, mut vc) = (Tensor::zeros(&[2, cap, 64]), Tensor::zeros(&[2, cap, 64]));
            if q_start > 0 {
                ops::kv_write(&mut kc, &on(d, &oldk.narrow0(0, q_start)?), 0)?;
                ops::kv_write(&mut vc, &on(d, &oldv.narrow0(0, q_start)?), 0)?;
            }
            ops::kv_write(&mut kc, &on(d, &newk), q_start)?;
            ops::kv_write(&mut vc, &on(d, &newv), q_start)?;
            let p = AttnParams {
                q_start,
                kv_len: q_start + t,
                scale: 0.125,
                window,
                softcap,
            };
            let o = ops::attention(&on(d, &q), &kc, &vc, &p)?;
            Ok(Out::Tensors(vec![o, kc]))
        }));
    }
}

fn gdn_cases(cases: &mut Vec<Case>) {
    // The gate over ordinary and extreme inputs (the floor, underflow to -0).
    let a = Tensor::from_f32(
        &[3, 4],
        vec![
            0.3, -1e4, 10.0, -50.0, 2.0, 0.0, -3.0, 40.0, 1.0, -1.0, 5.0, -8.0,
        ],
    )
    .unwrap();
    let a_log = Tensor::from_f32(&[4], vec![0.5, 100.0, 1e30, -2.0]).unwrap();
    let dt = Tensor::from_f32(&[4], vec![-0.1, 0.0, 0.2, 1.0]).unwrap();
    cases.push(case("gdn_gate", ELEMENTWISE, move |d| {
        Ok(Out::Tensors(vec![ops::gdn_gate(
            &on(d, &a),
            &on(d, &a_log),
            &on(d, &dt),
        )?]))
    }));
    // Per step and chunked, GQA 2 (Hv = 4 on Hk = 2), Dk = 32, Dv = 16, with a start state;
    // lengths around the chunk of 64, and a strong gate in one head.
    for t in [1usize, 63, 64, 65, 130] {
        let (hk, hv, dk, dv) = (2usize, 4usize, 32usize, 16usize);
        let unit = |x: Tensor| -> Tensor {
            // l2-normalised rows, as the model feeds q and k
            let v = x.to_vec_f32().unwrap();
            let mut out = Vec::with_capacity(v.len());
            for r in v.chunks(dk) {
                let n = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                out.extend(r.iter().map(|x| x / n));
            }
            Tensor::from_f32(x.shape(), out).unwrap()
        };
        let q = unit(host(&[t, hk, dk], 51));
        let k = unit(host(&[t, hk, dk], 52));
        let v = host(&[t, hv, dv], 53);
        let mut g = values(t * hv, 54)
            .into_iter()
            .map(|x| -0.5 * (x + 1.0))
            .collect::<Vec<_>>();
        if t > 40 {
            g[40 * hv + 1] = -1e30; // the floor: a full reset of head 1
        }
        let g = Tensor::from_f32(&[t, hv], g).unwrap();
        let beta = Tensor::from_f32(
            &[t, hv],
            values(t * hv, 55).iter().map(|x| 0.5 + 0.5 * x).collect(),
        )
        .unwrap();
        let s0 = scaled(&[hv, dv, dk], 56, 0.1);
        for chunked in [false, true] {
            let (q, k, v, g, beta, s0) = (
                q.clone(),
                k.clone(),
                v.clone(),
                g.clone(),
                beta.clone(),
                s0.clone(),
            );
            let name = format!(
                "gdn_{} T={t}",
                if chunked { "chunked" } else { "recurrent" }
            );
            cases.push(case(name, MATMUL, move |d| {
                let mut s = s0.clone(); // host state: the op moves it
                let (q, k, v, g, b) = (on(d, &q), on(d, &k), on(d, &v), on(d, &g), on(d, &beta));
                let y = if chunked {
                    ops::gdn_chunked(&q, &k, &v, &g, &b, &mut s, ops::GDN_CHUNK)?
                } else {
                    ops::gdn_recurrent(&q, &k, &v, &g, &b, &mut s)?
                };
                Ok(Out::Tensors(vec![y, s]))
            }));
        }
    }
    // With SiLU (Gated DeltaNet) and without (LFM2's short conv, 3 taps).
    for (t, silu, k) in [
        (1usize, true, 4),
        (2, true, 4),
        (9, true, 4),
        (1, false, 3),
        (9, false, 3),
    ] {
        let (x, w, st) = (
            host(&[t, 24], 61),
            host(&[24, k], 62),
            host(&[k - 1, 24], 63),
        );
        cases.push(case(
            format!("causal_conv1d T={t} K={k} silu={silu}"),
            ELEMENTWISE,
            move |d| {
                let mut s = on(d, &st);
                let y = ops::causal_conv1d(&on(d, &x), &on(d, &w), &mut s, silu)?;
                Ok(Out::Tensors(vec![y, s]))
            },
        ));
    }
}

/// One verdict: `None` when the GPU result matches the CPU's.
fn compare(c: &Case, reference: Out, got: Out) -> Option<String> {
    match (reference, got) {
        (Out::Tensors(r), Out::Tensors(g)) => {
            let mut worst = 0.0f64;
            for (i, (r, g)) in r.iter().zip(&g).enumerate() {
                if g.device() != Device::Cuda {
                    return Some(format!("output {i} is on {:?}, not the GPU", g.device()));
                }
                let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    common::nmse(&c.name, r, g)
                }));
                match e {
                    Ok(e) if e <= c.limit => worst = worst.max(e),
                    Ok(e) => return Some(format!("output {i}: NMSE {e:.3e} > {:.0e}", c.limit)),
                    Err(p) => return Some(format!("output {i}: {p:?}")),
                }
            }
            eprintln!("ok    {:<40} NMSE {worst:.2e}", c.name);
            None
        }
        (Out::Ids(r), Out::Ids(g)) if r == g => {
            eprintln!("ok    {:<40} equal", c.name);
            None
        }
        (Out::TopK(r), Out::TopK(g))
            if r.len() == g.len()
                && r.iter()
                    .zip(&g)
                    .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits()) =>
        {
            eprintln!("ok    {:<40} equal", c.name);
            None
        }
        (Out::Flag(r), Out::Flag(g)) if r == g => {
            eprintln!("ok    {:<40} equal ({r})", c.name);
            None
        }
        _ => Some("results differ".into()),
    }
}

/// The whole table of cases.
fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    matmul_cases(&mut cases);
    row_cases(&mut cases);
    elementwise_cases(&mut cases);
    attention_cases(&mut cases);
    gdn_cases(&mut cases);
    moe_cases(&mut cases);
    cases
}

/// The MoE ops: `gather_matmul` over a stacked weight of 8 experts in every format (CUDA runs
/// the grouped per-expert matmuls on the device), decode- and prefill-shaped, and the combine.
fn moe_cases(cases: &mut Vec<Case>) {
    let (e, n, k) = (8, 16, 256);
    for (fmt, w) in weights(e * n, k, 51) {
        for tokens in [1usize, 40] {
            let (w, x) = (w.clone(), host(&[tokens, k], 52));
            let rows: Vec<u32> = (0..tokens as u32).flat_map(|t| [t, t]).collect();
            let ids: Vec<u32> = (0..tokens as u32)
                .flat_map(|t| [t % 5, (t + 2) % 5])
                .collect();
            cases.push(case(
                format!("gather_matmul {fmt} t={tokens}"),
                MATMUL,
                move |d| {
                    let w = w.to_device(d)?;
                    Ok(Out::Tensors(vec![ops::gather_matmul(
                        &on(d, &x),
                        &w,
                        e,
                        &rows,
                        &ids,
                    )?]))
                },
            ));
        }
    }
    let (y, s, g) = (host(&[12, 40], 53), host(&[4, 40], 54), host(&[4, 1], 55));
    let w = values(12, 56);
    cases.push(case("moe_combine shared", ELEMENTWISE, move |d| {
        let (y, s, g) = (on(d, &y), on(d, &s), on(d, &g));
        Ok(Out::Tensors(vec![
            ops::moe_combine(&y, &w, 3, Some((&s, &g)))?,
            ops::moe_combine(&y, &w, 3, None)?,
        ]))
    }));
}

#[test]
fn every_op_on_cuda_matches_the_cpu_reference() {
    let cases = all_cases();
    if let Err(why) = kernels::cuda::probe() {
        // Up to the device: the error path must be an error naming the reason, not a panic,
        // and every case's CPU side must run (so the table is ready for a GPU).
        let e = Tensor::zeros(&[2])
            .to_device(Device::Cuda)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&why), "{e}");
        for c in &cases {
            if let Err(e) = (c.run)(Device::Cpu) {
                panic!("{}: the CPU side of the case fails: {e}", c.name);
            }
        }
        assert!(
            std::env::var("CUDA_CONFORMANCE_REQUIRED").as_deref() != Ok("1"),
            "no GPU: {why}"
        );
        eprintln!(
            "SKIPPED: CUDA op conformance ({} cases, CPU side checked): {why}",
            cases.len()
        );
        return;
    }
    eprintln!("device: {}", kernels::cuda::probe().unwrap());
    let mut failures = Vec::new();
    for c in &cases {
        let verdict = match ((c.run)(Device::Cpu), (c.run)(Device::Cuda)) {
            (Ok(r), Ok(g)) => compare(c, r, g),
            (Err(e), _) => Some(format!("CPU reference failed: {e}")),
            (_, Err(e)) => Some(format!("CUDA failed: {e}")),
        };
        if let Some(why) = verdict {
            eprintln!("FAIL  {:<40} {why}", c.name);
            failures.push(c.name.clone());
        }
    }
    eprintln!("{} cases, {} failed", cases.len(), failures.len());
    assert!(failures.is_empty(), "failed: {failures:?}");
}

//! The op-conformance table (docs/design.md §3): one list of cases walking the op list of
//! `kernels::ops` (and the tensor moves and views the ops rely on), run against every backend
//! this build has, in the style of llama.cpp's `test-backend-ops`: each case builds its inputs
//! on the host once and has one `run(device)`; [`check`] runs it on `Device::Cpu` (the
//! reference) and on the backend's device, puts the two results through one comparison
//! ([`compare`]) and prints one verdict line per case:
//!
//! ```text
//! ok    matmul affine-q4-g64 99x256 m=70     NMSE 3.1e-15
//! FAIL  attention decode at 129 (8/2 heads, D=64)   output 0: NMSE 2.0e-3 > 5e-4
//! n/a   attention_paged T=5 at 0 (4/2 heads, D=8)   not on cuda: <why> (<the error>)
//! known softmax 5x300 a masked row   differs on mlx: <why> (output 0: NaN at 0 ...)
//! ```
//!
//! then a count line, and fails the test if any case failed. Limits: NMSE = Σ(a−b)²/Σa² ≤ 1e-7
//! for elementwise ops, norms, RoPE and the softmaxes ([`ELEMENTWISE`]), ≤ 5e-4 for matmul,
//! attention and Gated DeltaNet ([`MATMUL`]), 0 for copies, views and weight decoding
//! ([`EXACT`]: the same bits up to the sign of zero); no NaN and no one-sided inf anywhere
//! (`common::try_nmse`, what `common::nmse` asserts, checks both); argmax ids, top-k, flags and MoE expert choices equal (route
//! weights within [`ROUTE_WEIGHTS`]). Every tensor output must live on the backend's device
//! ("output i is on Cpu, not mlx"), so an op that quietly fell back to the host fails.
//!
//! Inputs are placed as the engine places them and as each backend must accept them: most
//! cases move every input (`on(d, ..)`); some leave a weight, a gain, a cache or half of a
//! binary op on the host, or move only the weight (a resident weight moves a matmul to the
//! backend even for a host input). On the CPU every placement is the host, so the reference is
//! the same call.
//!
//! Nothing is skipped silently: a case a backend cannot match says so itself, per backend and
//! with the reason. `.not_on("cuda", why)`: the backend lacks the op; its verdict is `n/a` and
//! the backend must return an error (not a panic, not a result). `.differs_on("mlx", why)`: a
//! known difference of the backend's result; its verdict is `known` and the comparison must
//! still fail. A backend that gains the op or loses the difference fails the case until the
//! mark is removed, so the case is compared again.
//!
//! The cases are grouped ([`Group`]) so a failure points at an op family; each backend's test
//! binary has one test per group. A backend joins by adding its `Device` (and its backend in
//! `kernels/src/backend.rs`), its name in [`backend`], and a test binary whose module calls
//! `check(Device::New, group)` for every [`Group::ALL`] (see `kernels/tests/mlx/conformance.rs`
//! and, with the skip path for machines without the hardware, `kernels/tests/cuda/conformance.rs`).
//! Adding an op: its cases go in the group's function below, once, for every backend.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use half::{bf16, f16};
use kernels::ops::{self, AttnParams, RopeLayout, Routing};
use kernels::quant::quantize;
use kernels::{DType, Device, Error, QuantMode, QuantSpec, QuantWeight, Tensor, Weight};

use super::{formats, poison, values, weight_in};

/// NMSE limit of elementwise ops, norms, RoPE and the softmaxes.
pub const ELEMENTWISE: f64 = 1e-7;
/// NMSE limit of matmul, attention and Gated DeltaNet.
pub const MATMUL: f64 = 5e-4;
/// Copies, views and weight decoding: the same values.
pub const EXACT: f64 = 0.0;
/// Largest difference of one MoE route weight (the experts must be equal).
pub const ROUTE_WEIGHTS: f32 = 1e-5;

/// Width of the case-name column of the verdict lines.
const W: usize = 56;

/// The op families, one test each per backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// matmul in every weight format the engine loads and every placement, a chain of ops.
    Matmul,
    /// matmul in every format `quant::quantize` writes, in two placements.
    Quant,
    /// embedding lookups in every format.
    Embedding,
    /// Row ops: rms_norm, softmax, log_softmax, argmax, top_k, rope.
    Rows,
    /// Unary and binary elementwise ops, narrow, all_finite.
    Elementwise,
    /// attention (flat and paged) and kv_write.
    Attention,
    /// gdn_gate, the per-step and chunked Gated DeltaNet, causal_conv1d.
    Gdn,
    /// gather_matmul, moe_route, moe_route_sigmoid, moe_combine.
    Moe,
}

impl Group {
    pub const ALL: [Group; 8] = [
        Group::Matmul,
        Group::Quant,
        Group::Embedding,
        Group::Rows,
        Group::Elementwise,
        Group::Attention,
        Group::Gdn,
        Group::Moe,
    ];
}

/// What a case returned, on whichever device ran it.
pub enum Out {
    Tensors(Vec<Tensor>),
    Ids(Vec<u32>),
    TopK(Vec<(u32, f32)>),
    Flag(bool),
    Routes(ops::MoeRoutes),
}

pub struct Case {
    pub name: String,
    /// NMSE limit of tensor outputs (ids, top-k, flags and experts must be equal).
    pub limit: f64,
    /// Backends on which the case is known not to match the CPU, each with the reason.
    gaps: Vec<Gap>,
    run: Box<dyn Fn(Device) -> kernels::Result<Out>>,
}

/// A backend (by [`backend`] name) on which a case is known not to match the CPU.
struct Gap {
    backend: &'static str,
    kind: GapKind,
    why: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum GapKind {
    /// The backend lacks the op: it must return an error.
    Unsupported,
    /// The backend runs the op but its result differs: it must still differ.
    Differs,
}

fn case(
    name: impl Into<String>,
    limit: f64,
    run: impl Fn(Device) -> kernels::Result<Out> + 'static,
) -> Case {
    Case {
        name: name.into(),
        limit,
        gaps: Vec::new(),
        run: Box::new(run),
    }
}

impl Case {
    /// Marks the op as not implemented on `backend` (a [`backend`] name), for `why`.
    fn not_on(mut self, backend: &'static str, why: &'static str) -> Case {
        let kind = GapKind::Unsupported;
        self.gaps.push(Gap { backend, kind, why });
        self
    }

    /// Marks the case as known to give a different result on `backend`, for `why`.
    fn differs_on(mut self, backend: &'static str, why: &'static str) -> Case {
        let kind = GapKind::Differs;
        self.gaps.push(Gap { backend, kind, why });
        self
    }

    fn gap(&self, device: Device) -> Option<&Gap> {
        self.gaps.iter().find(|g| g.backend == backend(device))
    }

    /// The case on `device`; a panic inside it (a failed host read, say) is an error too.
    fn run(&self, device: Device) -> kernels::Result<Out> {
        catch_unwind(AssertUnwindSafe(|| (self.run)(device))).unwrap_or_else(|p| {
            Err(Error::Invalid {
                op: "case",
                msg: format!("panicked: {}", panic_text(&*p)),
            })
        })
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// A backend's name, as verdict lines and [`Case::not_on`] marks spell it.
pub fn backend(device: Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        #[cfg(feature = "mlx")]
        Device::Mlx => "mlx",
        #[cfg(feature = "cuda")]
        Device::Cuda => "cuda",
    }
}

/// The cases of one group, in table order.
pub fn cases(group: Group) -> Vec<Case> {
    let mut cases = Vec::new();
    match group {
        Group::Matmul => matmul_cases(&mut cases),
        Group::Quant => quant_cases(&mut cases),
        Group::Embedding => embedding_cases(&mut cases),
        Group::Rows => row_cases(&mut cases),
        Group::Elementwise => elementwise_cases(&mut cases),
        Group::Attention => attention_cases(&mut cases),
        Group::Gdn => gdn_cases(&mut cases),
        Group::Moe => moe_cases(&mut cases),
    }
    let mut seen = HashSet::new();
    for c in &cases {
        assert!(seen.insert(c.name.as_str()), "two cases named {:?}", c.name);
    }
    cases
}

/// How a backend's run of a case missed the CPU's result.
enum Miss {
    /// It returned an error.
    Error(String),
    /// Its result differs (the comparison's reason).
    Differs(String),
}

/// Runs every case of `group` on the CPU and on `device`, prints one verdict line per case and
/// a count, and fails if any case failed.
pub fn check(device: Device, group: Group) {
    let name = backend(device);
    let cases = cases(group);
    let (mut failed, mut gaps) = (Vec::new(), 0usize);
    for c in &cases {
        let reference = match c.run(Device::Cpu) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("FAIL  {:<W$} CPU reference failed: {e}", c.name);
                failed.push(c.name.clone());
                continue;
            }
        };
        let outcome = match c.run(device) {
            Ok(got) => compare(c, device, reference, got).map_err(Miss::Differs),
            Err(e) => Err(Miss::Error(format!("{name} failed: {e}"))),
        };
        let (tag, line) = match (c.gap(device), outcome) {
            (None, Ok(how)) => ("ok", how),
            (None, Err(Miss::Error(why) | Miss::Differs(why))) => ("FAIL", why),
            (Some(_), Ok(_)) => (
                "FAIL",
                format!("marked for {name}, but {name} matches the CPU now: remove the mark"),
            ),
            (Some(g), Err(miss)) => match (g.kind, miss) {
                (GapKind::Unsupported, Miss::Error(e)) => {
                    ("n/a", format!("not on {name}: {} ({e})", g.why))
                }
                (GapKind::Differs, Miss::Differs(how)) => {
                    ("known", format!("differs on {name}: {} ({how})", g.why))
                }
                (kind, Miss::Error(why) | Miss::Differs(why)) => {
                    let mark = match kind {
                        GapKind::Unsupported => "an error",
                        GapKind::Differs => "a result that differs",
                    };
                    ("FAIL", format!("{why} (its {name} mark expects {mark})"))
                }
            },
        };
        if tag == "n/a" || tag == "known" {
            gaps += 1;
        }
        eprintln!("{tag:<5} {:<W$} {line}", c.name);
        if tag == "FAIL" {
            failed.push(c.name.clone());
        }
    }
    eprintln!(
        "{group:?} on {name}: {} cases, {} failed, {gaps} marked as not implemented or known to differ there",
        cases.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{group:?} on {name}: failed: {failed:?}");
}

/// Runs the CPU side of every case of `group` (also of those some backend lacks), so the table
/// is ready for a device this machine does not have; returns the number of cases.
pub fn check_cpu_side(group: Group) -> usize {
    let cases = cases(group);
    for c in &cases {
        if let Err(e) = c.run(Device::Cpu) {
            panic!("{}: the CPU side of the case fails: {e}", c.name);
        }
    }
    cases.len()
}

/// The one comparison: `Ok` with what matched, or `Err` with why `got` (from `device`) does not
/// match the CPU's `reference`.
fn compare(c: &Case, device: Device, reference: Out, got: Out) -> Result<String, String> {
    match (reference, got) {
        (Out::Tensors(r), Out::Tensors(g)) => {
            if r.len() != g.len() {
                return Err(format!("{} outputs, the CPU gave {}", g.len(), r.len()));
            }
            let mut worst = 0.0f64;
            for (i, (r, g)) in r.iter().zip(&g).enumerate() {
                if g.device() != device {
                    return Err(format!(
                        "output {i} is on {:?}, not {}",
                        g.device(),
                        backend(device)
                    ));
                }
                match super::try_nmse(r, g) {
                    Ok(e) if e <= c.limit => worst = worst.max(e),
                    Ok(e) => return Err(format!("output {i}: NMSE {e:.3e} > {:.0e}", c.limit)),
                    Err(why) => return Err(format!("output {i}: {why}")),
                }
            }
            Ok(format!("NMSE {worst:.2e}"))
        }
        (Out::Ids(r), Out::Ids(g)) if r == g => Ok("equal".into()),
        (Out::TopK(r), Out::TopK(g))
            if r.len() == g.len()
                && r.iter()
                    .zip(&g)
                    .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits()) =>
        {
            Ok("equal".into())
        }
        (Out::Flag(r), Out::Flag(g)) if r == g => Ok(format!("equal ({r})")),
        (Out::Routes(r), Out::Routes(g)) => {
            if r.top_k != g.top_k || r.experts != g.experts {
                return Err(format!(
                    "experts {:?}, the CPU chose {:?}",
                    g.experts, r.experts
                ));
            }
            if r.weights.len() != g.weights.len() {
                return Err("a different number of route weights".into());
            }
            let mut worst = 0.0f32;
            for (i, (a, b)) in r.weights.iter().zip(&g.weights).enumerate() {
                let d = (a - b).abs();
                if d.is_nan() || d >= ROUTE_WEIGHTS {
                    return Err(format!("route weight {i}: {b} vs the CPU's {a}"));
                }
                worst = worst.max(d);
            }
            Ok(format!("experts equal, weights within {worst:.1e}"))
        }
        _ => Err("results differ".into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

/// Deterministic f32 values in [-1, 1) of `shape`.
pub fn host(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap()
}

fn scaled(shape: &[usize], seed: u64, s: f32) -> Tensor {
    let v = values(shape.iter().product(), seed)
        .into_iter()
        .map(|x| x * s)
        .collect();
    Tensor::from_f32(shape, v).unwrap()
}

fn on(d: Device, t: &Tensor) -> kernels::Result<Tensor> {
    t.to_device(d)
}

fn one(t: Tensor) -> Out {
    Out::Tensors(vec![t])
}

/// `t` (f32) rounded to bf16.
pub fn to_bf16(t: &Tensor) -> Tensor {
    let v: Vec<bf16> = t
        .f32s()
        .unwrap()
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    Tensor::from_slice(t.shape(), DType::BF16, &v).unwrap()
}

/// Affine quantization as MLX lays it out, written here from the format's definition (not by
/// `quant::quantize`): per group of `group` columns, `scale = (max − min) / (2^bits − 1)`,
/// `bias = min`, `q = round((w − bias) / scale)`, packed little-end-first into u32 words;
/// scales and biases stored as bf16 (the values the kernels must then use exactly).
pub fn mlx_affine(rows: usize, cols: usize, bits: usize, group: usize, seed: u64) -> Weight {
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

/// Every format `kernels::quant::quantize` writes (MLX's own quantizer, byte for byte): affine
/// at every bits × group with f32 and bf16 scales, and the three fp modes.
pub fn every_quant_format() -> Vec<(QuantSpec, DType)> {
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

/// A `[rows, cols]` weight of deterministic values quantized by `quant::quantize`.
pub fn quantized(rows: usize, cols: usize, spec: QuantSpec, dt: DType, seed: u64) -> Weight {
    let w = values(rows * cols, seed);
    Weight::Quant(quantize(&w, rows, cols, spec, dt).unwrap())
}

/// `<format> <scale dtype>-scales`, e.g. `affine-q4-g64 bf16-scales`.
fn format_of(w: &Weight, scales: DType) -> String {
    let scales = format!("{scales:?}").to_lowercase();
    format!("{} {scales}-scales", w.format_name())
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

/// The largest and smallest finite f32 inputs of the activations and a few awkward ones.
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

/// `[t, hk, dk]` rows of norm `scale` (q and k as the model feeds them).
fn unit_rows(shape: [usize; 3], seed: u64, scale: f32) -> Tensor {
    let mut v = values(shape.iter().product(), seed);
    for row in v.chunks_mut(shape[2]) {
        let n = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
        row.iter_mut().for_each(|x| *x *= scale / n);
    }
    Tensor::from_f32(&shape, v).unwrap()
}

/// Small GDN inputs as the model feeds them (Hk = 2, Hv = 4, Dk = 8, Dv = 6): unit-norm q, k
/// (q scaled by 1/√Dk), β in (0, 1), a log-decay from the gate.
fn gdn_inputs(t: usize, seed: u64) -> [Tensor; 5] {
    let (hk, hv, dk, dv) = (2, 4, 8, 6);
    let q = unit_rows([t, hk, dk], seed, 1.0 / (dk as f32).sqrt());
    let k = unit_rows([t, hk, dk], seed + 1, 1.0);
    let v = host(&[t, hv, dv], seed + 2);
    let beta = ops::sigmoid(&host(&[t, hv], seed + 3)).unwrap();
    let a_log = host(&[hv], seed + 4);
    let g = ops::gdn_gate(&host(&[t, hv], seed + 5), &a_log, &host(&[hv], seed + 6)).unwrap();
    [q, k, v, g, beta]
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

fn matmul_cases(cases: &mut Vec<Case>) {
    // Every format the engine loads, 99x256, weight and input moved: 3 rows take the decode
    // matvec, 70 the prefill path (cuBLAS or the tiled kernel on CUDA).
    let (n, k) = (99, 256);
    for (fmt, w) in weights(n, k, 11) {
        for m in [3usize, 70] {
            let (w, x) = (w.clone(), host(&[m, k], 12));
            cases.push(case(
                format!("matmul {fmt} 99x256 m={m}"),
                MATMUL,
                move |d| Ok(one(ops::matmul(&on(d, &x)?, &w.to_device(d)?)?)),
            ));
        }
    }
    // Dense f32 and bf16 weights left on the host, the input moved.
    let x = host(&[7, 96], 3);
    for (name, w) in [
        ("f32", host(&[40, 96], 4)),
        ("bf16", to_bf16(&host(&[40, 96], 5))),
    ] {
        let (x, w) = (x.clone(), Weight::Dense(w));
        cases.push(case(
            format!("matmul {name} 40x96 m=7, host weight"),
            MATMUL,
            move |d| Ok(one(ops::matmul(&on(d, &x)?, &w)?)),
        ));
    }
    // MLX's affine layout written by hand (mlx_affine) and a bf16 table, moved, with a host
    // input (the resident weight moves it to the backend).
    for (name, w) in [
        ("bf16 48x64", Weight::Dense(to_bf16(&host(&[48, 64], 20)))),
        ("mlx-affine-q4-g64 48x256", mlx_affine(48, 256, 4, 64, 21)),
    ] {
        let x = host(&[3, w.cols()], 22);
        cases.push(case(
            format!("matmul {name} m=3, host input"),
            MATMUL,
            move |d| Ok(one(ops::matmul(&x, &w.to_device(d)?)?)),
        ));
    }
    // A chain of ops on the backend (lazy on MLX until the host reads the result).
    let (x, w, g) = (
        host(&[4, 64], 16),
        Weight::Dense(to_bf16(&host(&[32, 64], 17))),
        host(&[32], 18),
    );
    cases.push(case(
        "chain rms_norm, matmul bf16, silu, mul",
        MATMUL,
        move |d| {
            let h = ops::rms_norm(&on(d, &x)?, None, 1e-5)?;
            let h = ops::matmul(&h, &w)?;
            Ok(one(ops::mul(&ops::silu(&h)?, &g)?))
        },
    ));
}

/// Every format `quant::quantize` writes: matmuls in two placements.
fn quant_cases(cases: &mut Vec<Case>) {
    // Every format quant::quantize writes, 48x256, five rows and one (MLX's matrix-vector
    // path), in two placements: the input moved with the weight on the host, and the weight
    // moved (widened once at upload) with the input on the host.
    let x5 = host(&[5, 256], 6);
    for (i, (spec, dt)) in every_quant_format().into_iter().enumerate() {
        let w = quantized(48, 256, spec, dt, 100 + i as u64);
        let fmt = format_of(&w, dt);
        for m in [5usize, 1] {
            let (w, x) = (w.clone(), x5.narrow0(0, m).unwrap());
            cases.push(case(
                format!("matmul {fmt} 48x256 m={m}, in | w moved"),
                MATMUL,
                move |d| {
                    Ok(Out::Tensors(vec![
                        ops::matmul(&on(d, &x)?, &w)?,
                        ops::matmul(&x, &w.to_device(d)?)?,
                    ]))
                },
            ));
        }
    }
}

/// Embedding lookups: every format the engine loads, every `quant::quantize` format (exact:
/// decoding is codes times a scale plus a bias, in f32), a bf16 table and MLX's own layout.
fn embedding_cases(cases: &mut Vec<Case>) {
    for (fmt, w) in weights(99, 256, 11) {
        cases.push(case(
            format!("embedding {fmt} 99x256"),
            ELEMENTWISE,
            move |d| Ok(one(ops::embedding(&w.to_device(d)?, &[0, 98, 7, 7, 50])?)),
        ));
    }
    // Embedding rows of every quantize format: decoding is exact in f32 (codes times a scale,
    // plus a bias), so the rows are equal.
    let ids = [3u32, 0, 47, 3, 12];
    for (i, (spec, dt)) in every_quant_format().into_iter().enumerate() {
        let w = quantized(48, 256, spec, dt, 200 + i as u64);
        cases.push(case(
            format!("embedding {} 48x256", format_of(&w, dt)),
            EXACT,
            move |d| Ok(one(ops::embedding(&w.to_device(d)?, &ids)?)),
        ));
    }
    // A bf16 table and MLX's affine layout written by hand (mlx_affine), moved.
    for (name, w) in [
        ("bf16 48x64", Weight::Dense(to_bf16(&host(&[48, 64], 20)))),
        ("mlx-affine-q4-g64 48x256", mlx_affine(48, 256, 4, 64, 21)),
    ] {
        cases.push(case(format!("embedding {name}"), ELEMENTWISE, move |d| {
            Ok(one(ops::embedding(&w.to_device(d)?, &ids)?))
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
        cases.push(case("rms_norm 5x300 bf16 gain", ELEMENTWISE, move |d| {
            Ok(one(ops::rms_norm(&on(d, &x)?, Some(&on(d, &gain)?), 1e-6)?))
        }));
    }
    {
        let x = x.clone();
        cases.push(case("rms_norm 5x300 no gain", ELEMENTWISE, move |d| {
            Ok(one(ops::rms_norm(&on(d, &x)?, None, 1e-5)?))
        }));
    }
    // A bf16 gain left on the host.
    let (x6, w6) = (host(&[6, 64], 8), to_bf16(&host(&[64], 9)));
    for (name, w) in [("bf16 host gain", Some(w6)), ("no gain", None)] {
        let x = x6.clone();
        cases.push(case(
            format!("rms_norm 6x64 {name}"),
            ELEMENTWISE,
            move |d| Ok(one(ops::rms_norm(&on(d, &x)?, w.as_ref(), 1e-6)?)),
        ));
    }
    // The softmaxes' edge cases: row 0 fully masked (softmax gives zeros, log_softmax stays
    // -inf), and row 1 with a few -inf.
    let masked = |rows: std::ops::Range<usize>| {
        let mut v = values(5 * 300, 23);
        v[rows].fill(f32::NEG_INFINITY);
        Tensor::from_f32(&[5, 300], v).unwrap()
    };
    for (name, f) in [
        (
            "softmax",
            ops::softmax as fn(&Tensor) -> kernels::Result<Tensor>,
        ),
        ("log_softmax", ops::log_softmax),
    ] {
        for (what, x) in [
            ("", x.clone()),
            (" a masked row", masked(0..300)),
            (" a partly masked row", masked(300..310)),
        ] {
            let c = case(format!("{name} 5x300{what}"), ELEMENTWISE, move |d| {
                Ok(one(f(&on(d, &x)?)?))
            });
            cases.push(match (name, what) {
                ("softmax", " a masked row") => c.differs_on(
                    "mlx",
                    "MLX gives NaN for a fully masked row; ops::softmax promises zeros",
                ),
                _ => c,
            });
        }
    }
    {
        let x = ops::scale(&host(&[5, 33], 12), 8.0).unwrap();
        cases.push(case("softmax 5x33 (x8)", ELEMENTWISE, move |d| {
            Ok(one(ops::softmax(&on(d, &x)?)?))
        }));
    }
    // A fully masked row (stays -inf), a masked entry in a live row, a tie, two equal maxima.
    let mut v = values(4 * 50, 34)
        .iter()
        .map(|x| x * 20.0)
        .collect::<Vec<_>>();
    v[50..100].fill(f32::NEG_INFINITY);
    v[7] = f32::NEG_INFINITY;
    v[160] = v[170];
    v[171] = 1e3;
    v[172] = 1e3;
    let x50 = Tensor::from_f32(&[4, 50], v).unwrap();
    {
        let x = x50.clone();
        cases.push(case(
            "log_softmax 4x50 masked, ties",
            ELEMENTWISE,
            move |d| Ok(one(ops::log_softmax(&on(d, &x)?)?)),
        ));
    }
    {
        let x = x50.clone();
        cases.push(case("argmax 4x50 masked, ties", 0.0, move |d| {
            Ok(Out::Ids(ops::argmax(&on(d, &x)?)?))
        }));
    }
    {
        let row = x50.narrow0(3, 1).unwrap().reshape(&[50]).unwrap();
        cases.push(case("top_k k=5 of 50, ties", 0.0, move |d| {
            Ok(Out::TopK(ops::top_k(&on(d, &row)?, 5)?))
        }));
    }
    // Ties and NaN in argmax / top-k: equal values at 3 and 9, a NaN at 0.
    let mut tied = values(3 * 5000, 24);
    tied[3] = 5.0;
    tied[9] = 5.0;
    tied[0] = f32::NAN;
    let tied = Tensor::from_f32(&[3, 5000], tied).unwrap();
    {
        let t = tied.clone();
        cases.push(case("argmax 3x5000 ties+NaN", 0.0, move |d| {
            Ok(Out::Ids(ops::argmax(&on(d, &t)?)?))
        }));
    }
    for k in [1usize, 5, 64, 100] {
        let row = tied.narrow0(0, 1).unwrap().reshape(&[5000]).unwrap();
        cases.push(case(
            format!("top_k k={k} of 5000, ties+NaN"),
            0.0,
            move |d| Ok(Out::TopK(ops::top_k(&on(d, &row)?, k)?)),
        ));
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
            format!("rope {name} 7x3x64 rotating 32 at 4000"),
            ELEMENTWISE,
            move |d| {
                let pos: Vec<usize> = (4000..4007).collect();
                Ok(one(ops::rope(&on(d, &x)?, &pos, &freq, layout)?))
            },
        ));
    }
    // theta = 10000^(-2i/rotated), as Qwen/Llama configs give it; half and a quarter of D.
    let x = host(&[9, 4, 32], 10);
    for rotated in [16usize, 8] {
        let freq: Vec<f32> = (0..rotated / 2)
            .map(|i| 10000f64.powf(-((2 * i) as f64) / rotated as f64) as f32)
            .collect();
        for (layout, name) in [
            (RopeLayout::HalfSplit, "half-split"),
            (RopeLayout::Interleaved, "interleaved"),
        ] {
            let (x, freq) = (x.clone(), freq.clone());
            cases.push(case(
                format!("rope {name} 9x4x32 rotating {rotated} at 17"),
                ELEMENTWISE,
                move |d| {
                    let pos: Vec<usize> = (17..26).collect();
                    Ok(one(ops::rope(&on(d, &x)?, &pos, &freq, layout)?))
                },
            ));
        }
    }
}

fn elementwise_cases(cases: &mut Vec<Case>) {
    type Op = fn(&Tensor) -> kernels::Result<Tensor>;
    type Bin = fn(&Tensor, &Tensor) -> kernels::Result<Tensor>;
    // Values up to ±30 with ±100, and -inf alone (its own case, so a backend's difference
    // there does not hide the finite values).
    let mut v = values(4 * 257, 31)
        .into_iter()
        .map(|x| x * 30.0)
        .collect::<Vec<_>>();
    v[1] = 100.0;
    v[2] = -100.0;
    let x = Tensor::from_f32(&[4, 257], v).unwrap();
    let minus_inf = Tensor::from_f32(&[1, 1], vec![f32::NEG_INFINITY]).unwrap();
    for (name, f) in [
        ("silu", ops::silu as Op),
        ("gelu_tanh", ops::gelu_tanh),
        ("sigmoid", ops::sigmoid),
        ("softplus", ops::softplus),
        ("softcap 30", |x| ops::softcap(x, 30.0)),
    ] {
        let x = x.clone();
        cases.push(case(
            format!("{name} 4x257 (±100)"),
            ELEMENTWISE,
            move |d| Ok(one(f(&on(d, &x)?)?)),
        ));
        let x = minus_inf.clone();
        let c = case(format!("{name} of -inf"), ELEMENTWISE, move |d| {
            Ok(one(f(&on(d, &x)?)?))
        });
        cases.push(match name {
            "silu" | "gelu_tanh" => c.differs_on(
                "mlx",
                "MLX gives NaN (-inf times a gate of 0) where the CPU gives -0",
            ),
            _ => c,
        });
    }
    // The largest and smallest finite inputs (±540) and signed zeros.
    let odd = awkward(64, 32);
    let awkward_ops: [(&str, Op); 5] = [
        ("sigmoid", ops::sigmoid),
        ("softplus", ops::softplus),
        ("gelu_tanh", ops::gelu_tanh),
        ("scale -1.5", |x| ops::scale(x, -1.5)),
        ("softcap 3", |x| ops::softcap(x, 3.0)),
    ];
    for (name, f) in awkward_ops {
        let x = odd.clone();
        cases.push(case(format!("{name} 8x8 awkward"), ELEMENTWISE, move |d| {
            Ok(one(f(&on(d, &x)?)?))
        }));
    }
    {
        let (x, up) = (odd.clone(), host(&[8, 8], 33));
        cases.push(case("swiglu 8x8 awkward, host up", ELEMENTWISE, move |d| {
            Ok(one(ops::swiglu(&on(d, &x)?, &up)?))
        }));
    }
    {
        let x = ops::scale(&host(&[5, 33], 12), 8.0).unwrap();
        cases.push(case("silu 5x33 (x8)", ELEMENTWISE, move |d| {
            Ok(one(ops::silu(&on(d, &x)?)?))
        }));
    }
    {
        let x = host(&[4, 257], 32);
        cases.push(case("scale -0.37 4x257", ELEMENTWISE, move |d| {
            Ok(one(ops::scale(&on(d, &x)?, -0.37)?))
        }));
    }
    let (a, b, row) = (host(&[6, 40], 33), host(&[6, 40], 34), host(&[40], 35));
    for (name, f, b) in [
        ("add", ops::add as Bin, b.clone()),
        ("add broadcast", ops::add as Bin, row.clone()),
        ("mul", ops::mul as Bin, b.clone()),
        ("mul broadcast", ops::mul as Bin, row),
        ("swiglu", ops::swiglu as Bin, b),
    ] {
        let a = a.clone();
        cases.push(case(format!("{name} 6x40"), ELEMENTWISE, move |d| {
            Ok(one(f(&on(d, &a)?, &on(d, &b)?)?))
        }));
    }
    // The second operand on the host for add, moved for mul.
    let (a, b, row) = (host(&[5, 33], 12), host(&[5, 33], 13), host(&[33], 14));
    for (name, b) in [("", b), (" broadcast", row)] {
        {
            let (a, b) = (a.clone(), b.clone());
            cases.push(case(
                format!("add{name} 5x33, host b"),
                ELEMENTWISE,
                move |d| Ok(one(ops::add(&on(d, &a)?, &b)?)),
            ));
        }
        let a = a.clone();
        cases.push(case(format!("mul{name} 5x33"), ELEMENTWISE, move |d| {
            Ok(one(ops::mul(&on(d, &a)?, &on(d, &b)?)?))
        }));
    }
    // Copies and views: narrow along an inner dim (a kernel) and along dim 0 (a view).
    let x = host(&[5, 12, 3], 36);
    cases.push(case(
        "narrow dim 1 / narrow0 5x12x3",
        ELEMENTWISE,
        move |d| {
            let t = on(d, &x)?;
            Ok(Out::Tensors(vec![t.narrow(1, 4, 5)?, t.narrow0(2, 2)?]))
        },
    ));
    let x = host(&[4, 6, 3], 70);
    cases.push(case(
        "narrow dims 0, 1, 2 and narrow0 4x6x3",
        EXACT,
        move |d| {
            let t = on(d, &x)?;
            let mut out = [(0, 1, 2), (1, 2, 3), (2, 1, 1)]
                .into_iter()
                .map(|(dim, start, len)| t.narrow(dim, start, len))
                .collect::<kernels::Result<Vec<_>>>()?;
            out.push(t.narrow0(3, 1)?);
            Ok(Out::Tensors(out))
        },
    ));
    let mut bad = values(1000, 37);
    for (i, v) in [(999usize, f32::NAN), (500, f32::INFINITY)] {
        let mut t = bad.clone();
        t[i] = v;
        let t = Tensor::from_f32(&[1000], t).unwrap();
        cases.push(case(format!("all_finite {v}"), 0.0, move |d| {
            Ok(Out::Flag(ops::all_finite(&on(d, &t)?)?))
        }));
    }
    bad.truncate(10);
    let fine = Tensor::from_f32(&[10], bad).unwrap();
    cases.push(case("all_finite finite", 0.0, move |d| {
        Ok(Out::Flag(ops::all_finite(&on(d, &fine)?)?))
    }));
}

fn attention_cases(cases: &mut Vec<Case>) {
    // GQA 8 query heads on 2 KV heads, D = 64; a prefill of 70 rows and a decode row at 129.
    for (name, t, q_start, window, softcap) in [
        ("prefill T=70", 70usize, 0usize, None, None),
        ("prefill T=70 window 16", 70, 0, Some(16), None),
        ("prefill T=70 softcap 30", 70, 0, None, Some(30.0f32)),
        ("decode at 129", 1, 129, None, None),
        (
            "decode at 129 window 64 softcap 50",
            1,
            129,
            Some(64),
            Some(50.0),
        ),
    ] {
        let q = scaled(&[t, 8, 64], 41, 2.0);
        let (newk, newv) = (scaled(&[t, 2, 64], 42, 2.0), host(&[t, 2, 64], 43));
        let (oldk, oldv) = (
            scaled(&[q_start.max(1), 2, 64], 44, 2.0),
            host(&[q_start.max(1), 2, 64], 45),
        );
        cases.push(case(
            format!("attention {name} (8/2 heads, D=64)"),
            MATMUL,
            move |d| {
                // The caches start on the host (as the engine's do) and kv_write moves them.
                let cap = q_start + t + 5;
                let (mut kc, mut vc) = (Tensor::zeros(&[2, cap, 64]), Tensor::zeros(&[2, cap, 64]));
                if q_start > 0 {
                    ops::kv_write(&mut kc, &on(d, &oldk.narrow0(0, q_start)?)?, 0)?;
                    ops::kv_write(&mut vc, &on(d, &oldv.narrow0(0, q_start)?)?, 0)?;
                }
                ops::kv_write(&mut kc, &on(d, &newk)?, q_start)?;
                ops::kv_write(&mut vc, &on(d, &newv)?, q_start)?;
                let p = AttnParams {
                    q_start,
                    kv_len: q_start + t,
                    scale: 0.125,
                    window,
                    softcap,
                };
                let o = ops::attention(&on(d, &q)?, &kc, &vc, &p)?;
                Ok(Out::Tensors(vec![o, kc]))
            },
        ));
    }
    // Caches given whole (k moved, v left on the host), 8/2 heads, D = 16, 20 slots.
    let (k, v) = (host(&[2, 20, 16], 23), host(&[2, 20, 16], 24));
    for (name, t, q_start, kv_len, window, softcap) in [
        ("prefill T=6", 6usize, 0usize, 6usize, None, None),
        ("continued T=5 at 7, window 4", 5, 7, 12, Some(4), None),
        ("T=6 at 2, softcap 0.5", 6, 2, 8, None, Some(0.5f32)),
        (
            "decode at 11, window 3 softcap 2",
            1,
            11,
            12,
            Some(3),
            Some(2.0),
        ),
    ] {
        let (q, k, v) = (host(&[t, 8, 16], 25 + t as u64), k.clone(), v.clone());
        cases.push(case(
            format!("attention {name} (8/2 heads, D=16)"),
            MATMUL,
            move |d| {
                let p = AttnParams {
                    q_start,
                    kv_len,
                    scale: 0.8,
                    window,
                    softcap,
                };
                Ok(one(ops::attention(&on(d, &q)?, &on(d, &k)?, &v, &p)?))
            },
        ));
    }
    // A pool of 6 blocks of 4 positions; the sequence's 12 keys live in blocks 4, 1, 3. The
    // CPU's paged attention equals its flat attention bit for bit (kernels/tests/kernels/ops.rs).
    let (hq, hk, dh, b) = (4, 2, 8, 4);
    let table = [4u32, 1, 3];
    let (k, v) = (host(&[hk, 6 * b, dh], 41), host(&[hk, 6 * b, dh], 42));
    for (t, q_start, window) in [(5usize, 0usize, None), (1, 11, Some(6)), (4, 8, None)] {
        let (q, k, v) = (host(&[t, hq, dh], 43 + t as u64), k.clone(), v.clone());
        cases.push(
            case(
                format!("attention_paged T={t} at {q_start} (4/2 heads, D=8)"),
                MATMUL,
                move |d| {
                    let p = AttnParams {
                        q_start,
                        kv_len: q_start + t,
                        scale: 0.7,
                        window,
                        softcap: None,
                    };
                    let (q, k, v) = (on(d, &q)?, on(d, &k)?, on(d, &v)?);
                    Ok(one(ops::attention_paged(&q, &k, &v, (&table, b), &p)?))
                },
            )
            .not_on("cuda", "paged KV has no CUDA kernel yet"),
        );
    }
    // A prefill, then single-row writes into the same moved cache, as decoding does: the
    // cache after every write.
    let writes: Vec<(usize, Tensor)> = [(0usize, 3usize), (3, 1), (4, 1), (5, 1), (7, 1)]
        .into_iter()
        .map(|(pos, t)| (pos, host(&[t, 2, 4], 90 + pos as u64)))
        .collect();
    cases.push(case(
        "kv_write 3 rows then 4 single rows, 2x8x4",
        EXACT,
        move |d| {
            let mut cache = on(d, &Tensor::zeros(&[2, 8, 4]))?;
            let mut out = Vec::new();
            for (pos, new) in &writes {
                ops::kv_write(&mut cache, new, *pos)?;
                out.push(cache.clone());
            }
            Ok(Out::Tensors(out))
        },
    ));
    // Host rows into a moved cache at its start, middle and end.
    let base = host(&[2, 9, 4], 30);
    for (pos, t) in [(0usize, 3usize), (4, 2), (6, 3)] {
        let (base, new) = (base.clone(), host(&[t, 2, 4], 31 + pos as u64));
        cases.push(case(
            format!("kv_write {t} host rows at {pos} of 9"),
            EXACT,
            move |d| {
                let mut cache = on(d, &base)?;
                ops::kv_write(&mut cache, &new, pos)?;
                Ok(one(cache))
            },
        ));
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
    cases.push(case("gdn_gate 3x4 extremes", ELEMENTWISE, move |d| {
        Ok(one(ops::gdn_gate(
            &on(d, &a)?,
            &on(d, &a_log)?,
            &on(d, &dt)?,
        )?))
    }));
    // softplus underflowing (ln softplus(x) = x), A_log and a bf16 dt_bias left on the host.
    let mut a = values(6 * 4, 35)
        .iter()
        .map(|x| x * 10.0)
        .collect::<Vec<_>>();
    a[0] = -1e4;
    a[1] = 80.0;
    a[2] = -40.0;
    let a = Tensor::from_f32(&[6, 4], a).unwrap();
    let a_log = Tensor::from_f32(&[4], vec![-2.0, 0.5, 100.0, 3.0]).unwrap();
    let dt = to_bf16(&host(&[4], 36));
    cases.push(case(
        "gdn_gate 6x4, host A_log and bf16 dt_bias",
        ELEMENTWISE,
        move |d| Ok(one(ops::gdn_gate(&on(d, &a)?, &a_log, &dt)?)),
    ));
    // Per step and chunked, GQA 2 (Hv = 4 on Hk = 2), Dk = 32, Dv = 16, with a start state;
    // lengths around the chunk of 64, and a strong gate in one head.
    for t in [1usize, 63, 64, 65, 130] {
        let (hk, hv, dk, dv) = (2usize, 4usize, 32usize, 16usize);
        let q = unit_rows([t, hk, dk], 51, 1.0);
        let k = unit_rows([t, hk, dk], 52, 1.0);
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
                "gdn_{} T={t} (Hv 4 on Hk 2, Dk 32, Dv 16)",
                if chunked { "chunked" } else { "recurrent" }
            );
            cases.push(case(name, MATMUL, move |d| {
                let mut s = s0.clone(); // host state: the op moves it
                let (q, k, v) = (on(d, &q)?, on(d, &k)?, on(d, &v)?);
                let (g, b) = (on(d, &g)?, on(d, &beta)?);
                let y = if chunked {
                    ops::gdn_chunked(&q, &k, &v, &g, &b, &mut s, ops::GDN_CHUNK)?
                } else {
                    ops::gdn_recurrent(&q, &k, &v, &g, &b, &mut s)?
                };
                Ok(Out::Tensors(vec![y, s]))
            }));
        }
    }
    // Two calls on one moved state (T = 9, then 1), chunk 4, only q moved: y and the state
    // after each call.
    let state0 = host(&[4, 6, 8], 40);
    let steps = [gdn_inputs(9, 41), gdn_inputs(1, 50)];
    for chunked in [false, true] {
        let (state0, steps) = (state0.clone(), steps.clone());
        let name = format!(
            "gdn_{} T=9 then T=1, state carried (Dk 8, Dv 6)",
            if chunked { "chunked 4" } else { "recurrent" }
        );
        cases.push(case(name, MATMUL, move |d| {
            let mut s = on(d, &state0)?;
            let mut out = Vec::new();
            for [q, k, v, g, b] in &steps {
                let q = on(d, q)?;
                let y = if chunked {
                    ops::gdn_chunked(&q, k, v, g, b, &mut s, 4)?
                } else {
                    ops::gdn_recurrent(&q, k, v, g, b, &mut s)?
                };
                out.push(y);
                out.push(s.clone());
            }
            Ok(Out::Tensors(out))
        }));
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
                let mut s = on(d, &st)?;
                let y = ops::causal_conv1d(&on(d, &x)?, &on(d, &w)?, &mut s, silu)?;
                Ok(Out::Tensors(vec![y, s]))
            },
        ));
    }
    // Three calls (T = 6, 1, 2) on one moved state, bf16 taps left on the host: y and the
    // state after each call.
    let (c, kw) = (10, 4);
    let w = to_bf16(&host(&[c, kw], 60));
    let st0 = host(&[kw - 1, c], 61);
    let xs = [host(&[6, c], 62), host(&[1, c], 63), host(&[2, c], 64)];
    for silu in [false, true] {
        let (w, st0, xs) = (w.clone(), st0.clone(), xs.clone());
        cases.push(case(
            format!("causal_conv1d T=6,1,2 K=4 silu={silu}, state carried"),
            ELEMENTWISE,
            move |d| {
                let mut s = on(d, &st0)?;
                let mut out = Vec::new();
                for x in &xs {
                    out.push(ops::causal_conv1d(&on(d, x)?, &w, &mut s, silu)?);
                    out.push(s.clone());
                }
                Ok(Out::Tensors(out))
            },
        ));
    }
}

/// `gather_matmul` of `x` (moved) against the stacked weight `w` of `experts` experts (moved),
/// each of `tokens` tokens routed to experts `t % 5` and `(t + 2) % 5`. The same product with
/// the unselected experts poisoned (NaN, or all-ones scale codes) must give the same bits: a
/// backend that reads an expert no pair selected fails the case.
fn gather_case(name: String, w: Weight, experts: usize, x: Tensor, tokens: usize) -> Case {
    let rows: Vec<u32> = (0..tokens as u32).flat_map(|t| [t, t]).collect();
    let ids: Vec<u32> = (0..tokens as u32)
        .flat_map(|t| [t % 5, (t + 2) % 5])
        .collect();
    let poisoned = poison(&w, experts, &[0, 1, 2, 3, 4]);
    case(name, MATMUL, move |d| {
        let x = on(d, &x)?;
        let y = ops::gather_matmul(&x, &w.to_device(d)?, experts, &rows, &ids)?;
        let dirty = ops::gather_matmul(&x, &poisoned.to_device(d)?, experts, &rows, &ids)?;
        let bits = |t: &Tensor| -> kernels::Result<Vec<u32>> {
            let v = t.to_device(Device::Cpu)?.to_vec_f32()?;
            Ok(v.iter().map(|v| v.to_bits()).collect())
        };
        if bits(&y)? != bits(&dirty)? {
            return Err(Error::Invalid {
                op: "gather_matmul",
                msg: "it read an unselected expert (poisoning one changed the result)".into(),
            });
        }
        Ok(one(y))
    })
}

/// The MoE ops: `gather_matmul` over stacked weights of 8 experts in every format (CUDA runs
/// the grouped per-expert matmuls on the device, MLX its `gather_mm` / `gather_qmm`), decode-
/// and prefill-shaped; routing; the combine.
fn moe_cases(cases: &mut Vec<Case>) {
    let (e, n, k) = (8, 16, 256);
    for (fmt, w) in weights(e * n, k, 51) {
        for tokens in [1usize, 40] {
            cases.push(gather_case(
                format!("gather_matmul {fmt} 8x16x256 t={tokens}"),
                w.clone(),
                e,
                host(&[tokens, k], 52),
                tokens,
            ));
        }
    }
    // common::formats (q4, q8 and the fp modes with bf16 scales), 8x32x128, 40 input rows.
    let (e, n, k) = (8, 32, 128);
    let x = host(&[40, k], 41);
    for (name, spec, dtype) in formats() {
        let w = weight_in(&values(e * n * k, 42), e * n, k, spec, dtype);
        for tokens in [1usize, 40] {
            cases.push(gather_case(
                format!("gather_matmul {name} 8x32x128 t={tokens}"),
                w.clone(),
                e,
                x.clone(),
                tokens,
            ));
        }
    }
    let logits = host(&[9, 16], 43);
    {
        let logits = logits.clone();
        cases.push(case("moe_route softmax top-4 of 16", 0.0, move |d| {
            Ok(Out::Routes(ops::moe_route(&on(d, &logits)?, 4, true)?))
        }));
    }
    let bias = values(16, 48);
    cases.push(case(
        "moe_route_sigmoid top-4 of 16, selection bias",
        0.0,
        move |d| {
            let routing = Routing {
                selection_bias: &bias,
                renormalize: true,
                renormalize_eps: 1e-6,
                scale: 1.0,
            };
            Ok(Out::Routes(ops::moe_route_sigmoid(
                &on(d, &logits)?,
                4,
                routing,
            )?))
        },
    ));
    let (y, s, g) = (host(&[12, 40], 53), host(&[4, 40], 54), host(&[4, 1], 55));
    let w = values(12, 56);
    cases.push(case(
        "moe_combine 4 tokens top-3, shared and not",
        ELEMENTWISE,
        move |d| {
            let (y, s, g) = (on(d, &y)?, on(d, &s)?, on(d, &g)?);
            Ok(Out::Tensors(vec![
                ops::moe_combine(&y, &w, 3, Some((&s, &g)))?,
                ops::moe_combine(&y, &w, 3, None)?,
            ]))
        },
    ));
}

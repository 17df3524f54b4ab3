//! Helpers shared by the MLX and CUDA test files: deterministic inputs, moving tensors between devices,
//! and the NMSE that conformance limits are stated in; `conformance` holds the op-conformance
//! table every backend binary runs.
#![allow(dead_code)] // each test file uses its own subset

#[cfg(any(feature = "mlx", feature = "cuda"))]
pub mod conformance;

use kernels::{Device, Tensor};

/// Deterministic values in [-1, 1) (a 64-bit LCG; no dependency on a RNG crate).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(feature = "mlx")]
pub fn mlx(t: &Tensor) -> Tensor {
    t.to_device(Device::Mlx).unwrap()
}

/// The values of a tensor on any device, as f32 on the host.
pub fn host_vec(t: &Tensor) -> Vec<f32> {
    t.to_device(Device::Cpu).unwrap().to_vec_f32().unwrap()
}

/// NMSE Σ(a−b)²/Σa² of `got` against `reference`; panics on a shape difference, on NaN and on
/// an inf in one result but not the other (equal infs are skipped).
pub fn nmse(what: &str, reference: &Tensor, got: &Tensor) -> f64 {
    try_nmse(reference, got).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// [`nmse`], with what it panics on as an `Err`.
pub fn try_nmse(reference: &Tensor, got: &Tensor) -> Result<f64, String> {
    if reference.shape() != got.shape() {
        return Err(format!(
            "shape {:?}, reference {:?}",
            got.shape(),
            reference.shape()
        ));
    }
    let values = |t: &Tensor| {
        t.to_device(Device::Cpu)
            .and_then(|t| t.to_vec_f32())
            .map_err(|e| format!("reading the values back: {e}"))
    };
    let (a, b) = (values(reference)?, values(got)?);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        if x.is_nan() || y.is_nan() {
            return Err(format!("NaN at {i} (reference {x}, got {y})"));
        }
        if x.is_infinite() || y.is_infinite() {
            if x != y {
                return Err(format!("one-sided inf at {i} (reference {x}, got {y})"));
            }
            continue;
        }
        num += (x as f64 - y as f64).powi(2);
        den += (x as f64).powi(2);
    }
    Ok(num / den.max(f64::MIN_POSITIVE))
}

/// Every weight format a model loads: the dense dtypes and each quantization mode.
pub fn formats() -> Vec<(&'static str, Option<kernels::QuantSpec>, kernels::DType)> {
    use kernels::{DType, QuantMode, QuantSpec};
    let q = |m, b, g| Some(QuantSpec::new(m, b, g).unwrap());
    vec![
        ("f32", None, DType::F32),
        ("bf16", None, DType::BF16),
        ("f16", None, DType::F16),
        ("q4", q(QuantMode::Affine, 4, 64), DType::BF16),
        ("q8", q(QuantMode::Affine, 8, 64), DType::BF16),
        ("mxfp4", q(QuantMode::Mxfp4, 4, 32), DType::BF16),
        ("nvfp4", q(QuantMode::Nvfp4, 4, 16), DType::BF16),
        ("mxfp8", q(QuantMode::Mxfp8, 8, 32), DType::BF16),
    ]
}

/// A `[rows, cols]` weight of `values` in a format of [`formats`].
pub fn weight_in(
    values: &[f32],
    rows: usize,
    cols: usize,
    spec: Option<kernels::QuantSpec>,
    dtype: kernels::DType,
) -> kernels::Weight {
    use kernels::{DType, Weight};
    match spec {
        Some(s) => Weight::Quant(kernels::quant::quantize(values, rows, cols, s, dtype).unwrap()),
        None => Weight::Dense(match dtype {
            DType::F32 => Tensor::from_f32(&[rows, cols], values.to_vec()).unwrap(),
            DType::BF16 => {
                let v: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
                Tensor::from_slice(&[rows, cols], DType::BF16, &v).unwrap()
            }
            _ => {
                let v: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
                Tensor::from_slice(&[rows, cols], DType::F16, &v).unwrap()
            }
        }),
    }
}

/// `w` (a stacked `[E·N, K]` weight of `experts` experts) with every expert not in `keep`
/// overwritten by non-finite values: NaN floats, NaN affine scales/biases, and all-ones scale
/// codes for the fp modes (NaN or inf once decoded). Any read of such an expert poisons the result.
pub fn poison(w: &kernels::Weight, experts: usize, keep: &[usize]) -> kernels::Weight {
    use kernels::{DType, Weight};
    let rows = w.rows() / experts;
    // Rows of a host tensor with its poisoned experts replaced by `bad` (one element's bytes).
    let spoil = |t: &Tensor, bad: &[u8]| -> Tensor {
        let mut bytes = t.raw_bytes().unwrap().to_vec();
        let per_row = bytes.len() / t.dim(0);
        for e in (0..experts).filter(|e| !keep.contains(e)) {
            for chunk in bytes[e * rows * per_row..(e + 1) * rows * per_row].chunks_mut(bad.len()) {
                chunk.copy_from_slice(bad);
            }
        }
        Tensor::from_bytes(t.shape(), t.dtype(), kernels::Bytes::from_vec(bytes)).unwrap()
    };
    let nan = |d: DType| -> Vec<u8> {
        match d {
            DType::F32 => f32::NAN.to_le_bytes().to_vec(),
            DType::BF16 => half::bf16::NAN.to_le_bytes().to_vec(),
            DType::F16 => half::f16::NAN.to_le_bytes().to_vec(),
            _ => vec![0xFF],
        }
    };
    match w {
        Weight::Dense(t) => Weight::Dense(spoil(t, &nan(t.dtype()))),
        Weight::Quant(q) => {
            let mut p = q.clone();
            p.scales = spoil(&q.scales, &nan(q.scales.dtype()));
            p.biases = q.biases.as_ref().map(|b| spoil(b, &nan(b.dtype())));
            Weight::Quant(p)
        }
    }
}

/// The instruction-set levels a test that walks them can exercise on this CPU
/// ([`kernels::cpu::isa::levels_here`]). The first call writes which levels those are to the
/// log, past the test harness's output capture (it writes to the stderr handle itself), so a
/// run on an AVX2-only host cannot be read as covering the AVX-512 kernels.
pub fn isa_levels() -> &'static [&'static str] {
    use std::io::Write;
    static NOTED: std::sync::Once = std::sync::Once::new();
    NOTED.call_once(|| {
        let line = kernels::cpu::isa::coverage();
        let _ = writeln!(std::io::stderr(), "ISA tests: {line}");
    });
    kernels::cpu::isa::levels_here()
}

//! Helpers shared by the MLX and CUDA test files: deterministic inputs, moving tensors between devices,
//! and the NMSE that conformance limits are stated in.
#![allow(dead_code)] // each test file uses its own subset

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
    assert_eq!(reference.shape(), got.shape(), "{what}: shape");
    let (a, b) = (host_vec(reference), host_vec(got));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        assert!(
            !x.is_nan() && !y.is_nan(),
            "{what}: NaN at {i} (reference {x}, got {y})"
        );
        if x.is_infinite() || y.is_infinite() {
            assert_eq!(x, y, "{what}: one-sided inf at {i}");
            continue;
        }
        num += (x as f64 - y as f64).powi(2);
        den += (x as f64).powi(2);
    }
    num / den.max(f64::MIN_POSITIVE)
}

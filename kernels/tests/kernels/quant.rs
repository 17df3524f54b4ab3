//! The quantizer and the small float codes: spec values of E2M1/E4M3/E8M0, round-trip error
//! bounds, and refusals of bad input. Byte-exact agreement with real `mx.quantize` is checked
//! in mlx_quant.rs against fixtures written by MLX itself.

use kernels::quant::minifloat::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, f32_to_e4m3, E4M3_TABLE};
use kernels::quant::{dequantize, quantize};
use kernels::{DType, QuantMode, QuantSpec};

/// A tiny LCG: test inputs only need to be deterministic.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

// ---- small float codes against the spec --------------------------------------------------

#[test]
fn e2m1_values_by_spec() {
    // sign | exponent (2 bits, bias 1) | mantissa (1 bit); exponent 0 is subnormal (m · 0.5).
    for code in 0u8..16 {
        let (s, e, m) = ((code >> 3) & 1, (code >> 1) & 3, code & 1);
        let mag = if e == 0 {
            m as f64 * 0.5
        } else {
            (1.0 + m as f64 * 0.5) * 2f64.powi(e as i32 - 1)
        };
        let want = if s == 1 { -mag } else { mag };
        assert_eq!(e2m1_to_f32(code) as f64, want, "code {code:#x}");
    }
    assert_eq!(e2m1_to_f32(0x7), 6.0);
    assert_eq!(e2m1_to_f32(0xD), -3.0);
}

#[test]
fn e4m3_values_by_spec() {
    let cases: &[(u8, f32)] = &[
        (0x00, 0.0),
        (0x01, 1.0 / 512.0), // smallest subnormal 2^-9
        (0x07, 7.0 / 512.0),
        (0x08, 1.0 / 64.0), // smallest normal 2^-6
        (0x38, 1.0),
        (0x3C, 1.5),
        (0x40, 2.0),
        (0x7E, 448.0), // largest finite
        (0xB8, -1.0),
        (0xFE, -448.0),
    ];
    for &(code, want) in cases {
        assert_eq!(e4m3_to_f32(code), want, "code {code:#x}");
        assert_eq!(f32_to_e4m3(want), code, "encode {want}");
    }
    assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    // Every finite code round-trips, and the table matches the function.
    for code in 0..=255u8 {
        let v = e4m3_to_f32(code);
        assert_eq!(E4M3_TABLE[code as usize].to_bits(), v.to_bits());
        if !v.is_nan() {
            assert_eq!(f32_to_e4m3(v), code, "round trip {code:#x}");
        }
    }
}

#[test]
fn e4m3_rounding_ties_to_even_and_saturates() {
    // 1.0625 lies halfway between 1.0 (mantissa 0, even) and 1.125: goes to 1.0.
    assert_eq!(f32_to_e4m3(1.0625), 0x38);
    // 1.1875 lies halfway between 1.125 (odd) and 1.25 (even): goes to 1.25.
    assert_eq!(f32_to_e4m3(1.1875), 0x3A);
    assert_eq!(f32_to_e4m3(1.07), 0x39);
    // Subnormal halfway 1.5 · 2^-9 goes to 2 · 2^-9.
    assert_eq!(f32_to_e4m3(1.5 / 512.0), 0x02);
    assert_eq!(f32_to_e4m3(0.4 / 512.0), 0x00);
    for big in [448.0, 460.0, 1e6, f32::INFINITY] {
        assert_eq!(f32_to_e4m3(big), 0x7E, "{big}");
        assert_eq!(f32_to_e4m3(-big), 0xFE, "-{big}");
    }
}

#[test]
fn e8m0_values_by_spec() {
    assert_eq!(e8m0_to_f32(127), 1.0);
    assert_eq!(e8m0_to_f32(128), 2.0);
    assert_eq!(e8m0_to_f32(120), 1.0 / 128.0);
    assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
    assert_eq!(e8m0_to_f32(1), 2f32.powi(-126));
    assert_eq!(e8m0_to_f32(0) as f64, 2f64.powi(-127));
}

// ---- round trips -------------------------------------------------------------------------

fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut g = Lcg(seed);
    (0..n)
        .map(|_| (g.next() & 0xFF_FFFF) as f32 / (1 << 24) as f32 * 2.0 - 1.0)
        .collect()
}

#[test]
fn affine_round_trip_error_is_within_one_step() {
    let (rows, cols) = (3, 256);
    let w = uniform(rows * cols, 7);
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            let spec = QuantSpec::new(QuantMode::Affine, bits, group).unwrap();
            let q = quantize(&w, rows, cols, spec, DType::F32).unwrap();
            let back = dequantize(&q).unwrap();
            for (gi, (orig, deq)) in w.chunks(group).zip(back.chunks(group)).enumerate() {
                let lo = orig.iter().cloned().fold(f32::INFINITY, f32::min);
                let hi = orig.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let step = (hi - lo) as f64 / ((1 << bits) - 1) as f64;
                for (a, b) in orig.iter().zip(deq) {
                    let err = (*a as f64 - *b as f64).abs();
                    // MLX anchors the larger-magnitude end exactly, which stretches or
                    // shrinks the step a little; a packing error would be off by many steps.
                    assert!(
                        err <= step + 1e-6,
                        "bits {bits} group {group} #{gi}: {a} -> {b}, step {step}"
                    );
                }
            }
        }
    }
}

#[test]
fn fp_round_trip_error_is_bounded_by_the_format() {
    let (rows, cols) = (2, 256);
    let w = uniform(rows * cols, 11);
    // Worst relative step of the value format near the group maximum, times the scale slack.
    for (mode, rel) in [
        (QuantMode::Mxfp4, 0.5),
        (QuantMode::Nvfp4, 0.25),
        (QuantMode::Mxfp8, 0.07),
    ] {
        let (bits, group) = mode.fixed_bits_group().unwrap();
        let spec = QuantSpec::new(mode, bits, group).unwrap();
        let q = quantize(&w, rows, cols, spec, DType::U8).unwrap();
        assert_eq!(q.scales.dtype(), DType::U8);
        assert!(q.biases.is_none());
        let back = dequantize(&q).unwrap();
        for (orig, deq) in w.chunks(group).zip(back.chunks(group)) {
            let amax = orig.iter().fold(0.0f32, |a, x| a.max(x.abs())) as f64;
            for (a, b) in orig.iter().zip(deq) {
                let err = (*a as f64 - *b as f64).abs();
                assert!(
                    err <= rel * amax,
                    "{}: {a} -> {b} (amax {amax})",
                    mode.name()
                );
            }
        }
    }
}

#[test]
fn bf16_scales_are_stored_in_bf16() {
    let w = uniform(64, 3);
    let spec = QuantSpec::new(QuantMode::Affine, 4, 64).unwrap();
    let q = quantize(&w, 1, 64, spec, DType::BF16).unwrap();
    assert_eq!(q.scales.dtype(), DType::BF16);
    assert_eq!(q.biases.as_ref().unwrap().dtype(), DType::BF16);
}

// ---- refusals ----------------------------------------------------------------------------

#[test]
fn bad_input_is_an_error() {
    let affine = QuantSpec::new(QuantMode::Affine, 4, 64).unwrap();
    // Wrong element count.
    assert!(quantize(&[0.0; 10], 1, 64, affine, DType::F32).is_err());
    // Columns not a multiple of the group.
    assert!(quantize(&[0.0; 96], 1, 96, affine, DType::F32).is_err());
    // Affine scales cannot be u8 codes; integer dtypes are refused.
    assert!(quantize(&[0.0; 64], 1, 64, affine, DType::U8).is_err());
    assert!(quantize(&[0.0; 64], 1, 64, affine, DType::I32).is_err());
    // A spec built by hand with an impossible combination.
    let bad = QuantSpec {
        mode: QuantMode::Mxfp4,
        bits: 4,
        group_size: 64,
    };
    assert!(quantize(&[0.0; 64], 1, 64, bad, DType::F32).is_err());
    assert!(QuantSpec::new(QuantMode::Affine, 7, 64).is_err());
    assert!(QuantSpec::new(QuantMode::Nvfp4, 4, 32).is_err());
}

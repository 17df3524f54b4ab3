//! Op conformance of the MLX backend against the CPU reference (docs/design.md §3): the shared
//! table of `common/conformance.rs` on `Device::Mlx`, one test per op group (on MLX's CPU
//! device here, on the GPU with `--features metal`). Below them, the MLX checks that are not
//! an op compared with the CPU: moving tensors and weights to MLX (bits, dtypes, placement)
//! and the error paths.

use crate::common;
use common::conformance::{check, every_quant_format, host, mlx_affine, quantized, to_bf16, Group};
use common::mlx;

use kernels::ops::{self, RopeLayout};
use kernels::{DType, Device, Error, QuantMode, QuantSpec, Tensor, Weight};

#[test]
fn matmul() {
    check(Device::Mlx, Group::Matmul)
}

#[test]
fn quant() {
    check(Device::Mlx, Group::Quant)
}

#[test]
fn embedding() {
    check(Device::Mlx, Group::Embedding)
}

#[test]
fn rows() {
    check(Device::Mlx, Group::Rows)
}

#[test]
fn elementwise() {
    check(Device::Mlx, Group::Elementwise)
}

#[test]
fn attention() {
    check(Device::Mlx, Group::Attention)
}

#[test]
fn gdn() {
    check(Device::Mlx, Group::Gdn)
}

#[test]
fn moe() {
    check(Device::Mlx, Group::Moe)
}

fn back(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.device(), Device::Mlx, "not on MLX");
    t.to_device(Device::Cpu).unwrap().to_vec_f32().unwrap()
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

/// Every weight the table moves lands on MLX (the table's placement check sees only the op
/// results).
#[test]
fn weights_of_every_format_move_to_mlx() {
    let mut ws: Vec<Weight> = every_quant_format()
        .into_iter()
        .map(|(spec, dt)| quantized(48, 256, spec, dt, 100))
        .collect();
    ws.push(Weight::Dense(to_bf16(&host(&[48, 64], 20))));
    ws.push(mlx_affine(48, 256, 4, 64, 21));
    for w in ws {
        let on = w.to_device(Device::Mlx).unwrap();
        assert_eq!(on.device(), Device::Mlx, "{}", w.format_name());
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
fn rope_with_scattered_positions_is_cleanly_unsupported() {
    let x = mlx(&host(&[2, 1, 8], 11));
    let err = ops::rope(&x, &[0, 5], &[1.0, 0.1], RopeLayout::HalfSplit).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn add_of_shapes_that_do_not_broadcast_is_a_shape_error() {
    let err = ops::add(&mlx(&host(&[5, 33], 12)), &host(&[4], 15)).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
}

#[test]
fn embedding_ids_outside_the_table_are_invalid_on_resident_weights() {
    for w in [
        Weight::Dense(to_bf16(&host(&[48, 64], 20))),
        mlx_affine(48, 256, 4, 64, 21),
    ] {
        let on = w.to_device(Device::Mlx).unwrap();
        let err = ops::embedding(&on, &[48]).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }
}

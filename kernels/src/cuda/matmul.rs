//! `x @ wᵀ` and embedding lookups on CUDA, for every weight format.
//!
//! - decode (at most [`launch::MATVEC_MAX_M`] input rows): the `matvec_<format>` kernel, which
//!   decodes each weight element in registers and keeps the activations in f32;
//! - prefill, dense weights: cuBLAS. f32 weights run in f32; bf16/f16 weights stay in their
//!   type, the activations are rounded to it, and cuBLAS accumulates and writes f32;
//! - prefill, quantized weights: the `tiled_<format>` kernel, which decodes weight tiles into
//!   shared memory (the CPU's values bit for bit: `weights.cu` mirrors `cpu/dequant.rs`).

use super::blas::{Gemm, In, Operand};
use super::context::gpu;
use super::launch::{self, int};
use super::sources::WEIGHTS;
use super::{empty, f32_on_device, ptr, upload, upload_slice};
use crate::error::{shape_err, Result};
use crate::quant::decode::WeightRows;
use crate::{DType, Error, QuantMode, QuantWeight, Tensor, Weight};

/// A weight as the kernels of `weights.cu` take it.
struct DeviceWeight {
    /// Kernel-name suffix: the storage format.
    format: &'static str,
    data: u64,
    scales: u64,
    biases: u64,
    bits: i32,
    group: i32,
    /// cuBLAS input type for dense weights.
    dense: Option<In>,
}

impl DeviceWeight {
    fn of(w: &Weight) -> Result<DeviceWeight> {
        Ok(match w {
            Weight::Dense(t) => {
                let (format, ty) = match t.dtype() {
                    DType::F32 => ("f32", In::F32),
                    DType::BF16 => ("bf16", In::BF16),
                    DType::F16 => ("f16", In::F16),
                    other => {
                        return Err(Error::DType {
                            op: "matmul",
                            dtype: other,
                            msg: "dense weights must be f32, bf16 or f16".into(),
                        })
                    }
                };
                DeviceWeight {
                    format,
                    data: ptr(t)?,
                    scales: 0,
                    biases: 0,
                    bits: 0,
                    group: 0,
                    dense: Some(ty),
                }
            }
            Weight::Quant(q) => DeviceWeight {
                format: match q.spec.mode {
                    QuantMode::Affine => "affine",
                    QuantMode::Mxfp4 => "mxfp4",
                    QuantMode::Nvfp4 => "nvfp4",
                    QuantMode::Mxfp8 => "mxfp8",
                },
                data: ptr(&q.packed)?,
                scales: ptr(&q.scales)?,
                biases: q.biases.as_ref().map(ptr).transpose()?.unwrap_or(0),
                bits: q.spec.bits as i32,
                group: q.spec.group_size as i32,
                dense: None,
            },
        })
    }
}

/// The weight as the CUDA kernels keep it, copied to the device once (checked on the host
/// first): dense weights in their stored type, packed codes as stored, affine scales and
/// biases widened to f32 (exact), fp scale codes as u8.
pub(crate) fn resident_weight(w: &Weight) -> Result<Weight> {
    if w.device() == crate::Device::Cuda {
        return Ok(w.clone());
    }
    let host = w.to_device(crate::Device::Cpu)?;
    WeightRows::new(&host)?;
    Ok(match &host {
        Weight::Dense(t) => Weight::Dense(upload(t)?),
        Weight::Quant(q) => {
            let floats = |t: &Tensor| upload(&t.to_f32()?);
            let scales = if q.spec.mode == QuantMode::Affine {
                floats(&q.scales)?
            } else {
                upload(&q.scales)?
            };
            Weight::Quant(QuantWeight {
                spec: q.spec,
                rows: q.rows,
                cols: q.cols,
                packed: upload(&q.packed)?,
                scales,
                biases: q.biases.as_ref().map(floats).transpose()?,
            })
        }
    })
}

pub(crate) fn matmul(x: &Tensor, w: &Weight) -> Result<Tensor> {
    let op = "matmul";
    let w = resident_weight(w)?;
    let (n, k) = (w.rows(), w.cols());
    if x.dims() == 0 || x.dim(-1) != k {
        return shape_err(
            op,
            format!("input {:?} must end in {k} features", x.shape()),
        );
    }
    let x = f32_on_device(op, x)?;
    let m = x.numel() / k.max(1);
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("checked dims above") = n;
    let out = empty(&shape, DType::F32)?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    if k == 0 {
        return super::zeros(&shape, DType::F32);
    }
    let dw = DeviceWeight::of(&w)?;
    let (xp, op_) = (ptr(&x)?, ptr(&out)?);
    let (mi, ni, ki) = (
        int(op, "rows", m)?,
        int(op, "out features", n)?,
        int(op, "in features", k)?,
    );
    let g = gpu()?;
    if m <= launch::MATVEC_MAX_M {
        let name = kernel_name("matvec", dw.format);
        g.launch(
            &WEIGHTS,
            name,
            launch::matvec(n)?,
            &[
                &dw.data, &dw.scales, &dw.biases, &dw.bits, &dw.group, &xp, &op_, &mi, &ni, &ki,
            ],
        )?;
        return Ok(out);
    }
    match dw.dense {
        Some(ty) => {
            // Activations in the weight's type for cuBLAS (f32 weights take them as they are).
            let x16 = match ty {
                In::F32 => None,
                In::BF16 => Some(cast(&x, "cast_f32_bf16", DType::BF16)?),
                In::F16 => Some(cast(&x, "cast_f32_f16", DType::F16)?),
            };
            let a = match &x16 {
                Some(t) => ptr(t)?,
                None => xp,
            };
            Gemm {
                m,
                n,
                k,
                batch: 1,
                a: Operand::rows(a, k),
                b: Operand::rows(dw.data, k).t(),
                c: Operand::rows(op_, n),
                alpha: 1.0,
                beta: 0.0,
            }
            .run(ty)?;
        }
        None => {
            let name = kernel_name("tiled", dw.format);
            g.launch(
                &WEIGHTS,
                name,
                launch::tiled(m, n)?,
                &[
                    &dw.data, &dw.scales, &dw.biases, &dw.bits, &dw.group, &xp, &op_, &mi, &ni, &ki,
                ],
            )?;
        }
    }
    Ok(out)
}

/// `x` rounded to a 16-bit float type (`kernel` = `cast_f32_bf16` or `cast_f32_f16`).
fn cast(x: &Tensor, kernel: &'static str, dtype: DType) -> Result<Tensor> {
    let out = empty(x.shape(), dtype)?;
    let (xp, op_, n) = (ptr(x)?, ptr(&out)?, x.numel() as i64);
    gpu()?.launch(
        &WEIGHTS,
        kernel,
        launch::elements("matmul", x.numel())?,
        &[&xp, &op_, &n],
    )?;
    Ok(out)
}

/// Rows `ids` of the table widened to f32, `[ids.len(), cols]` (ids checked by `ops`).
pub(crate) fn embedding(w: &Weight, ids: &[u32]) -> Result<Tensor> {
    let op = "embedding";
    let w = resident_weight(w)?;
    let d = w.cols();
    let out = empty(&[ids.len(), d], DType::F32)?;
    let total = ids.len() * d;
    if total == 0 {
        return Ok(out);
    }
    let dw = DeviceWeight::of(&w)?;
    let ids = upload_slice(&[ids.len()], DType::U32, ids)?;
    let (ip, op_, cols, total_i) = (ptr(&ids)?, ptr(&out)?, int(op, "columns", d)?, total as i64);
    gpu()?.launch(
        &WEIGHTS,
        kernel_name("embedding", dw.format),
        launch::elements(op, total)?,
        &[
            &dw.data, &dw.scales, &dw.biases, &dw.bits, &dw.group, &cols, &ip, &op_, &total_i,
        ],
    )?;
    Ok(out)
}

/// `<kind>_<format>`, the names `weights.cu`'s macros give its kernel instances.
fn kernel_name(kind: &str, format: &str) -> &'static str {
    match (kind, format) {
        ("matvec", "f32") => "matvec_f32",
        ("matvec", "bf16") => "matvec_bf16",
        ("matvec", "f16") => "matvec_f16",
        ("matvec", "affine") => "matvec_affine",
        ("matvec", "mxfp4") => "matvec_mxfp4",
        ("matvec", "nvfp4") => "matvec_nvfp4",
        ("matvec", "mxfp8") => "matvec_mxfp8",
        ("embedding", "f32") => "embedding_f32",
        ("embedding", "bf16") => "embedding_bf16",
        ("embedding", "f16") => "embedding_f16",
        ("embedding", "affine") => "embedding_affine",
        ("embedding", "mxfp4") => "embedding_mxfp4",
        ("embedding", "nvfp4") => "embedding_nvfp4",
        ("embedding", "mxfp8") => "embedding_mxfp8",
        ("tiled", "affine") => "tiled_affine",
        ("tiled", "mxfp4") => "tiled_mxfp4",
        ("tiled", "nvfp4") => "tiled_nvfp4",
        ("tiled", "mxfp8") => "tiled_mxfp8",
        _ => unreachable!("no {kind} kernel for {format}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel name the host may ask for is one `weights.cu` instantiates.
    #[test]
    fn every_weight_kernel_name_exists_in_the_source() {
        let src = WEIGHTS.text;
        let instances: Vec<String> = src
            .lines()
            .filter_map(|l| {
                let (mac, rest) = l.split_once('(')?;
                let name = rest.split(',').next()?;
                match mac {
                    "WEIGHT_KERNELS" => {
                        Some(vec![format!("matvec_{name}"), format!("embedding_{name}")])
                    }
                    "TILED_KERNEL" => Some(vec![format!("tiled_{name}")]),
                    _ => None,
                }
            })
            .flatten()
            .collect();
        for fmt in ["f32", "bf16", "f16", "affine", "mxfp4", "nvfp4", "mxfp8"] {
            for kind in ["matvec", "embedding"] {
                assert!(instances.contains(&kernel_name(kind, fmt).to_string()));
            }
        }
        for fmt in ["affine", "mxfp4", "nvfp4", "mxfp8"] {
            assert!(instances.contains(&kernel_name("tiled", fmt).to_string()));
        }
    }
}

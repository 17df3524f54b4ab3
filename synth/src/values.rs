//! Tensor values: drawn from the seed, then encoded into the bytes of the chosen format.
//!
//! Both steps run in parallel over fixed-size pieces (generation chunks, quantization row
//! blocks), and every piece depends only on its own index, so the bytes never depend on the
//! number of threads.

use anyhow::{bail, Context, Result};
use half::bf16;
use kernels::{DType, QuantMode, QuantSpec};
use rayon::prelude::*;

use super::plan::{Init, Store, TensorPlan};
use super::rng::{chunk_seed, tensor_seed, SplitMix64};
use super::safetensors_writer::TensorEntry;
use super::spec::Format;

/// Elements per generation chunk (each chunk has its own random stream).
const CHUNK: usize = 1 << 16;

/// About this many elements per quantization task.
const QUANT_BLOCK: usize = 1 << 20;

/// The values of `t` for checkpoint seed `seed`, in f32.
pub fn generate(t: &TensorPlan, seed: u64) -> Vec<f32> {
    if let Some([a, b]) = &t.fused_from {
        let mut half = t.clone();
        half.fused_from = None;
        half.shape[1] /= 2;
        let (x, y) = (
            generate(&half.clone().seeded_as(a.as_str()), seed),
            generate(&half.seeded_as(b.as_str()), seed),
        );
        let block = x.len() / t.shape[0].max(1);
        return x
            .chunks(block)
            .zip(y.chunks(block))
            .flat_map(|(x, y)| x.iter().chain(y).copied())
            .collect();
    }
    if let Some(names) = &t.stacked_from {
        let mut one = t.clone();
        one.stacked_from = None;
        one.shape.remove(0);
        return names
            .iter()
            .flat_map(|n| generate(&one.clone().seeded_as(n.as_str()), seed))
            .collect();
    }
    let base = tensor_seed(seed, t.value_name());
    let n = t.numel();
    let mut v = vec![0f32; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = SplitMix64::new(chunk_seed(base, i as u64));
        match t.init {
            Init::Gaussian { mean, std } => {
                for x in chunk {
                    *x = mean + std * rng.normal();
                }
            }
            Init::Ramp { start, end, shift } => {
                let steps = n.saturating_sub(1).max(1) as f64;
                for (j, x) in chunk.iter_mut().enumerate() {
                    let k = (i * CHUNK + j + shift) % n;
                    *x = (start as f64 + (end as f64 - start as f64) * k as f64 / steps) as f32;
                }
            }
        }
    });
    v
}

/// The dtype `t` is stored in when it is not quantized.
fn float_dtype(t: &TensorPlan, format: Format) -> DType {
    match t.store {
        Store::F32 => DType::F32,
        Store::Matrix | Store::Matrix8 | Store::Float => format.float_dtype(),
    }
}

/// The quantization `t` gets in `format`, following mlx-lm: Linear/Embedding weights whose input
/// dimension is a multiple of the group size.
fn quant_of(t: &TensorPlan, format: Format) -> Option<QuantSpec> {
    let q = format.quant_spec()?;
    let cols = *t.shape.last()?;
    // mlx-lm checks the folder's own group size before asking the family's predicate.
    let eligible = t.shape.len() >= 2 && cols % q.group_size == 0;
    match t.store {
        Store::Matrix if eligible => Some(q),
        Store::Matrix8 if eligible => Some(MATRIX8),
        _ => None,
    }
}

/// The quantization of [`Store::Matrix8`] tensors.
pub const MATRIX8: QuantSpec = QuantSpec {
    mode: QuantMode::Affine,
    bits: 8,
    group_size: 64,
};

fn quant_prefix(t: &TensorPlan) -> Result<&str> {
    match t.name.strip_suffix(".weight") {
        Some(p) => Ok(p),
        None => bail!(
            "matrix `{}` must be named `<module>.weight` to be quantized",
            t.name
        ),
    }
}

/// The tensors `t` is stored as in `format`: itself, or `.weight` (u32) + `.scales` (+ `.biases`).
pub fn stored_entries(t: &TensorPlan, format: Format) -> Result<Vec<TensorEntry>> {
    let Some(q) = quant_of(t, format) else {
        return Ok(vec![TensorEntry {
            name: t.name.clone(),
            dtype: float_dtype(t, format),
            shape: t.shape.clone(),
        }]);
    };
    let prefix = quant_prefix(t)?;
    let (lead, cols) = t.shape.split_at(t.shape.len() - 1);
    let with_last = |last: usize| [lead, &[last]].concat();
    let mut out = vec![
        TensorEntry {
            name: format!("{prefix}.weight"),
            dtype: DType::U32,
            shape: with_last(cols[0] * q.bits / 32),
        },
        TensorEntry {
            name: format!("{prefix}.scales"),
            dtype: scale_dtype(q),
            shape: with_last(cols[0] / q.group_size),
        },
    ];
    if q.mode.has_biases() {
        out.push(TensorEntry {
            name: format!("{prefix}.biases"),
            dtype: DType::BF16,
            shape: with_last(cols[0] / q.group_size),
        });
    }
    Ok(out)
}

/// Affine scales are floats in the model dtype (bf16); the fp modes store 8-bit scale codes.
fn scale_dtype(q: QuantSpec) -> DType {
    match q.mode {
        QuantMode::Affine => DType::BF16,
        _ => DType::U8,
    }
}

/// Encodes `values` of `t` into the bytes of each stored tensor, in the order of
/// [`stored_entries`].
pub fn encode(t: &TensorPlan, values: &[f32], format: Format) -> Result<Vec<Vec<u8>>> {
    let Some(q) = quant_of(t, format) else {
        return Ok(vec![match float_dtype(t, format) {
            DType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => to_bf16_bytes(values),
        }]);
    };
    let cols = *t.shape.last().expect("quantized tensors have a last dim");
    let rows = values.len() / cols;
    let block_rows = (QUANT_BLOCK / cols).max(1);
    let blocks: Vec<[Vec<u8>; 3]> = values
        .par_chunks(block_rows * cols)
        .map(|block| -> Result<[Vec<u8>; 3]> {
            let n = block.len() / cols;
            // In bf16, as mlx-lm quantizes a bf16 model: a quantized folder is what
            // `mlx_lm.convert -q` would make of the bf16 folder of the same seed.
            let w = kernels::quant::quantize(block, n, cols, q, DType::BF16)
                .with_context(|| format!("quantizing `{}` ({rows}x{cols})", t.name))?;
            let biases = match &w.biases {
                Some(b) => b.raw_bytes()?.to_vec(),
                None => Vec::new(),
            };
            Ok([
                w.packed.raw_bytes()?.to_vec(),
                w.scales.raw_bytes()?.to_vec(),
                biases,
            ])
        })
        .collect::<Result<_>>()?;
    let parts = if q.mode.has_biases() { 3 } else { 2 };
    Ok((0..parts)
        .map(|p| blocks.iter().flat_map(|b| b[p].iter().copied()).collect())
        .collect())
}

fn to_bf16_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * 2];
    out.par_chunks_mut(2 * CHUNK)
        .zip(values.par_chunks(CHUNK))
        .for_each(|(o, v)| {
            for (dst, x) in o.chunks_exact_mut(2).zip(v) {
                dst.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str, shape: &[usize], store: Store) -> TensorPlan {
        TensorPlan::new(name, shape, Init::normal(1.0), store)
    }

    #[test]
    fn values_depend_on_seed_and_name_only() {
        let a = plan("a.weight", &[3, CHUNK], Store::Matrix);
        let b = plan("b.weight", &[3, CHUNK], Store::Matrix);
        assert_eq!(generate(&a, 1), generate(&a, 1));
        assert_ne!(generate(&a, 1), generate(&a, 2));
        assert_ne!(generate(&a, 1), generate(&b, 1));
        // Bit-identical whatever the pool size.
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(one.install(|| generate(&a, 9)), generate(&a, 9));
    }

    #[test]
    fn quantized_entries_follow_mlx_naming() {
        let t = plan("m.q_proj.weight", &[8, 128], Store::Matrix);
        let e = stored_entries(&t, Format::Q4).unwrap();
        let got: Vec<(&str, DType, &[usize])> = e
            .iter()
            .map(|e| (e.name.as_str(), e.dtype, e.shape.as_slice()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("m.q_proj.weight", DType::U32, &[8usize, 16][..]),
                ("m.q_proj.scales", DType::BF16, &[8, 2][..]),
                ("m.q_proj.biases", DType::BF16, &[8, 2][..]),
            ]
        );
        let e = stored_entries(&t, Format::Nvfp4).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((e[1].dtype, e[1].shape.clone()), (DType::U8, vec![8, 8]));
        // Not a multiple of the group: kept in bf16, like mlx-lm does.
        let odd = plan("m.x.weight", &[8, 96], Store::Matrix);
        assert_eq!(
            stored_entries(&odd, Format::Q4).unwrap()[0].dtype,
            DType::BF16
        );
        let norm = plan("m.norm.weight", &[128], Store::Float);
        assert_eq!(
            stored_entries(&norm, Format::Q4).unwrap()[0].dtype,
            DType::BF16
        );
        assert_eq!(
            stored_entries(&norm, Format::F32).unwrap()[0].dtype,
            DType::F32
        );
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even → 1.0 (0x3F80).
        // 1 + 3·2^-9 rounds up to 0x3F81.
        let b = to_bf16_bytes(&[1.0 + 1.0 / 256.0, 1.0 + 3.0 / 512.0, -2.0]);
        assert_eq!(b, vec![0x80, 0x3F, 0x81, 0x3F, 0x00, 0xC0]);
    }

    #[test]
    fn ramp_is_an_evenly_spaced_rotated_table() {
        let t = TensorPlan::new(
            "a",
            &[4],
            Init::Ramp {
                start: 0.0,
                end: 3.0,
                shift: 1,
            },
            Store::F32,
        );
        assert_eq!(generate(&t, 0), vec![1.0, 2.0, 3.0, 0.0]);
        assert_eq!(generate(&t, 0), generate(&t, 99), "no randomness");
    }

    #[test]
    fn f32_store_and_seed_name() {
        let t = plan("m.A_log", &[4], Store::F32);
        for format in [Format::Bf16, Format::Q4] {
            let e = stored_entries(&t, format).unwrap();
            assert_eq!((e.len(), e[0].dtype), (1, DType::F32));
            assert_eq!(encode(&t, &[1.0; 4], format).unwrap()[0].len(), 16);
        }
        // Values follow the seed name, not the stored name.
        let a = plan("x.weight", &[64], Store::Float);
        let b = plan("y.weight", &[64], Store::Float).seeded_as("x.weight");
        assert_eq!(generate(&a, 3), generate(&b, 3));
    }

    #[test]
    fn stacked_values_are_the_parts_in_order() {
        let part = |n: &str| plan(n, &[3, 64], Store::Matrix);
        let names: Vec<String> = (0..4).map(|e| format!("experts.{e}.w1.weight")).collect();
        let stacked = plan("switch.weight", &[4, 3, 64], Store::Matrix).stacked_from(names.clone());
        let want: Vec<f32> = names.iter().flat_map(|n| generate(&part(n), 5)).collect();
        assert_eq!(generate(&stacked, 5), want);
    }
}

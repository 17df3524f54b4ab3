//! Conformance with MLX's own quantizer: fixtures written by mx.quantize / mx.dequantize (mlx
//! 0.32.4 on CPU, harness/oracle/make_quant_fixtures.py) for small matrices in every mode, with an
//! all-zero row, constant groups, a large dynamic range, tiny values and E2M1 rounding ties.
//! Our quantizer must reproduce MLX's packed words, scales and biases byte for byte; our
//! dequantisation (the embedding gather, which widens rows to f32) must match
//! `mx.dequantize(..., dtype=float32)` within one f32 ulp. Each test checks every case before
//! failing, so one run lists every mismatch.

use std::collections::HashMap;
use std::path::PathBuf;

use kernels::quant::{quantize, QuantMode, QuantSpec, QuantWeight, Weight};
use kernels::{ops, DType, Tensor};

struct Input {
    rows: usize,
    cols: usize,
    /// What MLX quantized: f32, or bf16 (values already bf16-rounded).
    dtype: DType,
    /// The matrix as MLX saw it, widened exactly to f32.
    values: Vec<f32>,
}

struct Case {
    input: String,
    spec: QuantSpec,
    scale_dtype: DType,
    packed: Vec<u8>,
    scales: Vec<u8>,
    biases: Option<Vec<u8>>,
    dequant: Vec<f32>,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{} b{} g{} on {}",
            self.spec.mode.name(),
            self.spec.bits,
            self.spec.group_size,
            self.input
        )
    }
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn dtype_named(s: &str) -> DType {
    match s {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "u8" => DType::U8,
        other => panic!("manifest.txt: unknown dtype {other}"),
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn load() -> (HashMap<String, Input>, Vec<Case>) {
    let dir = fixture_dir();
    let manifest = std::fs::read_to_string(dir.join("manifest.txt"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("manifest.txt").display()));
    let blob = std::fs::read(dir.join("quant.bin"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("quant.bin").display()));
    let slice = |off: &str, len: usize| -> Vec<u8> {
        let off: usize = off.parse().expect("manifest offset");
        blob[off..off + len].to_vec()
    };
    let mut inputs = HashMap::new();
    let mut cases = Vec::new();
    for line in manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[0] {
            "input" => {
                let (rows, cols): (usize, usize) = (f[2].parse().unwrap(), f[3].parse().unwrap());
                let values = f32s(&slice(f[5], rows * cols * 4));
                let dtype = dtype_named(f[4]);
                inputs.insert(
                    f[1].to_string(),
                    Input {
                        rows,
                        cols,
                        dtype,
                        values,
                    },
                );
            }
            "case" => {
                let input: &Input = &inputs[f[1]];
                let mode = QuantMode::parse(f[2]).expect("manifest mode");
                let (bits, group): (usize, usize) = (f[3].parse().unwrap(), f[4].parse().unwrap());
                let spec = QuantSpec::new(mode, bits, group).expect("MLX wrote this spec");
                let scale_dtype = dtype_named(f[5]);
                let n = input.rows * input.cols;
                let sbytes = n / group * scale_dtype.size_in_bytes();
                cases.push(Case {
                    input: f[1].to_string(),
                    spec,
                    scale_dtype,
                    packed: slice(f[6], n * bits / 8),
                    scales: slice(f[7], sbytes),
                    biases: (f[8] != "-").then(|| slice(f[8], sbytes)),
                    dequant: f32s(&slice(f[9], n * 4)),
                });
            }
            other => panic!("manifest.txt: unknown line kind {other}"),
        }
    }
    assert!(!cases.is_empty(), "no cases in {}", dir.display());
    (inputs, cases)
}

/// Distance in representable f32 values; +0 and -0 are the same point.
fn ulps(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            -((i & 0x7fff_ffff) as i64)
        } else {
            i as i64
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

/// The MLX arrays of one case as a `QuantWeight`, without going through our quantizer.
fn mlx_weight(case: &Case, input: &Input) -> QuantWeight {
    let words = input.cols * case.spec.bits / 32;
    let groups = input.cols / case.spec.group_size;
    let packed = Tensor::from_slice(&[input.rows, words], DType::U32, &case.packed).unwrap();
    let scales = Tensor::from_slice(&[input.rows, groups], case.scale_dtype, &case.scales).unwrap();
    let biases = case
        .biases
        .as_ref()
        .map(|b| Tensor::from_slice(&[input.rows, groups], case.scale_dtype, b).unwrap());
    QuantWeight::new(case.spec, packed, scales, biases, &case.name()).unwrap()
}

#[test]
fn dequantize_matches_mlx_within_one_ulp() {
    let (inputs, cases) = load();
    let mut failures = Vec::new();
    for case in &cases {
        let input = &inputs[&case.input];
        let w = Weight::Quant(mlx_weight(case, input));
        let ids: Vec<u32> = (0..input.rows as u32).collect();
        let ours = match ops::embedding(&w, &ids).and_then(|t| t.to_vec_f32()) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{}: dequantisation failed: {e}", case.name()));
                continue;
            }
        };
        let bad: Vec<usize> = (0..ours.len())
            .filter(|&i| ulps(ours[i], case.dequant[i]) > 1)
            .collect();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{}: {} of {} elements off by > 1 ulp; first at row {} col {}: ours {:e} mlx {:e}",
                case.name(),
                bad.len(),
                ours.len(),
                i / input.cols,
                i % input.cols,
                ours[i],
                case.dequant[i]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from mx.dequantize:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The `bits`-wide code of element (row, c) in little-endian packed words.
fn code_at(packed: &[u8], row_words: usize, row: usize, c: usize, bits: usize) -> u32 {
    let bit = row * row_words * 32 + c * bits;
    let mut v: u32 = 0;
    for k in 0..bits {
        let b = bit + k;
        v |= (((packed[b / 8] >> (b % 8)) & 1) as u32) << k;
    }
    v
}

fn show_scale(bytes: &[u8], i: usize, dtype: DType) -> String {
    match dtype {
        DType::F32 => format!("{:e}", f32s(&bytes[i * 4..i * 4 + 4])[0]),
        DType::BF16 => {
            let b = u16::from_le_bytes([bytes[i * 2], bytes[i * 2 + 1]]);
            format!("{:e} (0x{b:04x})", f32::from_bits((b as u32) << 16))
        }
        _ => format!("0x{:02x}", bytes[i]),
    }
}

/// Where `ours` and `mlx` (one tensor of one case) first differ, in the case's own terms.
fn first_difference(
    case: &Case,
    input: &Input,
    what: &str,
    ours: &[u8],
    mlx: &[u8],
) -> Option<String> {
    if ours.len() != mlx.len() {
        return Some(format!(
            "{what}: {} bytes, MLX has {}",
            ours.len(),
            mlx.len()
        ));
    }
    if ours == mlx {
        return None;
    }
    let groups = input.cols / case.spec.group_size;
    if what == "packed" {
        let bits = case.spec.bits;
        let words = input.cols * bits / 32;
        let mut n = 0;
        let mut first = None;
        for r in 0..input.rows {
            for c in 0..input.cols {
                let (a, b) = (
                    code_at(ours, words, r, c, bits),
                    code_at(mlx, words, r, c, bits),
                );
                if a != b {
                    n += 1;
                    first.get_or_insert((r, c, a, b));
                }
            }
        }
        let (r, c, a, b) = first?;
        return Some(format!(
            "packed: {n} codes differ; first at row {r} col {c} (input {:e}): ours {a} mlx {b}",
            input.values[r * input.cols + c]
        ));
    }
    let size = case.scale_dtype.size_in_bytes();
    let bad: Vec<usize> = (0..ours.len() / size)
        .filter(|&i| ours[i * size..(i + 1) * size] != mlx[i * size..(i + 1) * size])
        .collect();
    let i = bad[0];
    Some(format!(
        "{what}: {} of {} differ; first at row {} group {}: ours {} mlx {}",
        bad.len(),
        ours.len() / size,
        i / groups,
        i % groups,
        show_scale(ours, i, case.scale_dtype),
        show_scale(mlx, i, case.scale_dtype)
    ))
}

#[test]
fn quantize_matches_mlx_byte_for_byte() {
    let (inputs, cases) = load();
    let mut failures = Vec::new();
    for case in &cases {
        let input = &inputs[&case.input];
        // The dtype MLX was handed: it sets the affine scale dtype and the fp modes' arithmetic.
        let q = match quantize(
            &input.values,
            input.rows,
            input.cols,
            case.spec,
            input.dtype,
        ) {
            Ok(q) => q,
            Err(e) => {
                failures.push(format!("{}: quantize failed: {e}", case.name()));
                continue;
            }
        };
        if q.scales.dtype() != case.scale_dtype {
            failures.push(format!(
                "{}: scales are {:?}, MLX wrote {:?}",
                case.name(),
                q.scales.dtype(),
                case.scale_dtype
            ));
            continue;
        }
        let ours_biases = q.biases.as_ref().map(|b| b.raw_bytes().unwrap().to_vec());
        let mut diffs: Vec<String> = [
            (
                "packed",
                q.packed.raw_bytes().unwrap().to_vec(),
                case.packed.clone(),
            ),
            (
                "scales",
                q.scales.raw_bytes().unwrap().to_vec(),
                case.scales.clone(),
            ),
        ]
        .into_iter()
        .filter_map(|(what, ours, mlx)| first_difference(case, input, what, &ours, &mlx))
        .collect();
        match (&ours_biases, &case.biases) {
            (Some(a), Some(b)) => diffs.extend(first_difference(case, input, "biases", a, b)),
            (None, None) => {}
            (a, _) => diffs.push(format!(
                "biases: ours present={} mlx present={}",
                a.is_some(),
                case.biases.is_some()
            )),
        }
        if !diffs.is_empty() {
            failures.push(format!("{}:\n    {}", case.name(), diffs.join("\n    ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from mx.quantize:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

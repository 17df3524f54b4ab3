//! GGML's weight types, decoded to f32 in the order and with the f32 arithmetic of the `gguf`
//! package's dequantizer (engine/tests/fixtures/gguf holds its results for each type).
//!
//! Block layouts (bytes, little-endian; `d`, `m`, `dmin` are f16):
//! - `Q4_0` (32 values, 18 B): `d`, 16 bytes of nibbles; value `j` is the low nibble of byte
//!   `j`, value `j + 16` its high nibble; `d · (q − 8)`.
//! - `Q4_1` (32, 20 B): `d`, `m`, nibbles as `Q4_0`; `d · q + m`.
//! - `Q5_0` (32, 22 B): `d`, a 32-bit word of fifth bits (bit `j` for value `j`), nibbles as
//!   `Q4_0`; `d · (q − 16)`.
//! - `Q5_1` (32, 24 B): `d`, `m`, fifth bits and nibbles as `Q5_0`; `d · q + m`.
//! - `Q8_0` (32, 34 B): `d`, 32 signed bytes; `q · d`.
//! - `Q4_K` (256, 144 B): `d`, `dmin`, 12 bytes of eight 6-bit scales and mins, 128 bytes of
//!   nibbles: sub-block `2i` is the low nibbles of bytes `32i..32i + 32`, `2i + 1` their high
//!   nibbles; `(d · scale) · q − dmin · min`.
//! - `Q5_K` (256, 176 B): as `Q4_K` with 32 bytes of high bits before the nibbles: bit `s` of
//!   byte `l` is the fifth bit of value `l` of sub-block `s`.
//! - `Q6_K` (256, 210 B): 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed 8-bit scales
//!   (one per 16 values), `d`; `(d · scale) · (q − 32)`.

use anyhow::{bail, ensure, Result};
use half::{bf16, f16};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgmlType {
    /// The type with ggml's numeric id, when the engine reads it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// (values per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
        }
    }

    /// Bytes that `numel` values take; an error when they are not whole blocks.
    pub fn bytes_for(self, numel: usize) -> Result<usize> {
        let (values, bytes) = self.block();
        ensure!(
            numel.is_multiple_of(values),
            "{numel} values are not whole blocks of {values}"
        );
        match (numel / values).checked_mul(bytes) {
            Some(n) => Ok(n),
            None => bail!("{numel} values overflow the byte count"),
        }
    }
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `bytes` (exactly [`GgmlType::bytes_for`] `numel`) as `numel` f32 values.
pub fn to_f32(t: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>> {
    ensure!(
        bytes.len() == t.bytes_for(numel)?,
        "{} bytes for {numel} values of {t:?}",
        bytes.len()
    );
    let (values, size) = t.block();
    let mut out = Vec::with_capacity(numel);
    for b in bytes.chunks_exact(size) {
        match t {
            GgmlType::F32 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            GgmlType::F16 => out.push(h(b, 0)),
            GgmlType::Bf16 => out.push(bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let d = h(b, 0);
                let (m, qs) = match t {
                    GgmlType::Q4_1 => (Some(h(b, 2)), &b[4..]),
                    _ => (None, &b[2..]),
                };
                for shift in [0, 4] {
                    for &q in qs {
                        let q = (q >> shift) & 0x0F;
                        out.push(match m {
                            Some(m) => d * q as f32 + m,
                            None => d * (q as i8 - 8) as f32,
                        });
                    }
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let d = h(b, 0);
                let (m, rest) = match t {
                    GgmlType::Q5_1 => (Some(h(b, 2)), &b[4..]),
                    _ => (None, &b[2..]),
                };
                let high = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let qs = &rest[4..];
                for j in 0..32 {
                    let low = (qs[j % 16] >> (4 * (j / 16))) & 0x0F;
                    let q = low | ((((high >> j) & 1) as u8) << 4);
                    out.push(match m {
                        Some(m) => d * q as f32 + m,
                        None => d * (q as i8 - 16) as f32,
                    });
                }
            }
            GgmlType::Q8_0 => {
                let d = h(b, 0);
                out.extend(b[2..].iter().map(|&q| q as i8 as f32 * d));
            }
            GgmlType::Q4K | GgmlType::Q5K => k_block(t, b, &mut out),
            GgmlType::Q6K => q6k_block(b, &mut out),
        }
        debug_assert_eq!(out.len() % values, 0);
    }
    Ok(out)
}

/// The eight 6-bit (scale, min) pairs of a `Q4_K`/`Q5_K` block's 12 scale bytes.
fn scales_mins(s: &[u8]) -> [(u8, u8); 8] {
    std::array::from_fn(|j| {
        if j < 4 {
            (s[j] & 0x3F, s[j + 4] & 0x3F)
        } else {
            let k = j - 4;
            (
                (s[8 + k] & 0x0F) | ((s[k] >> 2) & 0x30),
                (s[8 + k] >> 4) | ((s[4 + k] >> 2) & 0x30),
            )
        }
    })
}

fn k_block(t: GgmlType, b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    let sm = scales_mins(&b[4..16]);
    let (qh, qs) = match t {
        GgmlType::Q5K => (Some(&b[16..48]), &b[48..]),
        _ => (None, &b[16..]),
    };
    for (sub, &(sc, mn)) in sm.iter().enumerate() {
        let (scale, min) = (d * sc as f32, dmin * mn as f32);
        let bytes = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
        for (l, &byte) in bytes.iter().enumerate() {
            let mut q = (byte >> (4 * (sub % 2))) & 0x0F;
            if let Some(qh) = qh {
                q |= ((qh[l] >> sub) & 1) << 4;
            }
            out.push(scale * q as f32 - min);
        }
    }
}

fn q6k_block(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = h(b, 208);
    for e in 0..256 {
        let (half, r) = (e / 128, e % 128);
        let low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = ((low | (high << 4)) as i8 - 32) as f32;
        out.push((d * scales[e / 16] as i8 as f32) * q);
    }
}

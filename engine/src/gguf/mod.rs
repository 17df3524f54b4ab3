//! GGUF files (llama.cpp's single-file checkpoints), read as untrusted input: the header's
//! metadata and tensor table, and each tensor's values dequantized to f32 ([`dequant`]).
//!
//! Layout (GGUF v2/v3, little-endian): magic `GGUF`, version u32, tensor count u64, metadata
//! count u64; metadata as (string key, u32 type, value); then per tensor its name, u32 rank,
//! u64 dims (innermost first: a `[rows, cols]` matrix is stored as `[cols, rows]`), u32 type and
//! u64 offset into the data section, which starts at the next multiple of
//! `general.alignment` (32 unless set). Every count, length and offset read here is checked
//! against the file before it sizes anything.

pub mod dequant;
pub mod import;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

pub use dequant::GgmlType;

/// Most tensors or metadata entries a file may declare.
const MAX_ENTRIES: u64 = 1 << 20;
/// Most dimensions of a tensor.
const MAX_RANK: u32 = 4;
/// Most nesting of metadata arrays.
const MAX_DEPTH: usize = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::UInt(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::UInt(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Outermost first, as Hugging Face writes shapes (the file stores them reversed).
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Byte range in the file.
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A GGUF file, memory-mapped.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = std::fs::File::open(path)
            .with_context(|| format!("{}: cannot open", path.display()))?;
        // SAFETY: the map is read-only; a file changed underneath gives wrong values, which
        // the bounds checks keep from going out of the mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("{}: cannot map", path.display()))?;
        let (version, metadata, tensors) =
            parse(&map).with_context(|| format!("{}: not a readable GGUF file", path.display()))?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The stored bytes of `t`.
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.start..t.start + t.len]
    }

    /// `t`'s values as f32, in row-major order of [`TensorInfo::shape`].
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        dequant::to_f32(t.ggml_type, self.bytes(t), t.numel())
            .with_context(|| format!("{}: tensor `{}`", self.path.display(), t.name))
    }
}

/// A bounds-checked reader over the header.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            bail!("the file ends inside {what} (at byte {})", self.at);
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into()?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into()?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.bytes.len() - self.at.min(self.bytes.len()));
        let Some(len) = len else {
            bail!(
                "{what} claims more bytes than the file has (at byte {})",
                self.at
            );
        };
        let s = self.take(len, what)?;
        String::from_utf8(s.to_vec()).with_context(|| format!("{what} is not UTF-8"))
    }

    fn value(&mut self, kind: u32, what: &str, depth: usize) -> Result<Value> {
        Ok(match kind {
            0 => Value::UInt(self.take(1, what)?[0] as u64),
            1 => Value::Int(self.take(1, what)?[0] as i8 as i64),
            2 => Value::UInt(u16::from_le_bytes(self.take(2, what)?.try_into()?) as u64),
            3 => Value::Int(i16::from_le_bytes(self.take(2, what)?.try_into()?) as i64),
            4 => Value::UInt(self.u32(what)? as u64),
            5 => Value::Int(self.u32(what)? as i32 as i64),
            // Through its shortest decimal form, so 1e-5 stays 1e-5 in config.json.
            6 => {
                let v = f32::from_le_bytes(self.take(4, what)?.try_into()?);
                Value::Float(v.to_string().parse().unwrap_or(v as f64))
            }
            7 => Value::Bool(self.take(1, what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 => {
                ensure!(
                    depth < MAX_DEPTH,
                    "{what}: arrays nested deeper than {MAX_DEPTH}"
                );
                let item = self.u32(what)?;
                let count = self.u64(what)?;
                // Every item takes at least one byte, so a count past the file's end is a lie.
                let left = (self.bytes.len() - self.at.min(self.bytes.len())) as u64;
                ensure!(
                    count <= left,
                    "{what}: an array of {count} items in {left} bytes"
                );
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::UInt(self.u64(what)?),
            11 => Value::Int(self.u64(what)? as i64),
            12 => Value::Float(f64::from_le_bytes(self.take(8, what)?.try_into()?)),
            other => bail!("{what} has value type {other}, which GGUF does not define"),
        })
    }
}

type Parsed = (u32, BTreeMap<String, Value>, Vec<TensorInfo>);

fn parse(bytes: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { bytes, at: 0 };
    ensure!(
        c.take(4, "the magic")? == b"GGUF",
        "the file does not start with `GGUF`"
    );
    let version = c.u32("the version")?;
    ensure!(
        version == 2 || version == 3,
        "GGUF version {version} is not supported (2 and 3 are)"
    );
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;
    ensure!(
        n_tensors <= MAX_ENTRIES && n_kv <= MAX_ENTRIES,
        "the header declares {n_tensors} tensors and {n_kv} metadata entries (at most {MAX_ENTRIES} each)"
    );
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key {i}"))?;
        let kind = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(kind, &format!("metadata `{key}`"), 0)?;
        metadata.insert(key, value);
    }
    let mut infos = Vec::new();
    for i in 0..n_tensors {
        let name = c.string(&format!("the name of tensor {i}"))?;
        let rank = c.u32(&format!("the rank of `{name}`"))?;
        ensure!(
            (1..=MAX_RANK).contains(&rank),
            "tensor `{name}` has rank {rank} (1 to {MAX_RANK})"
        );
        let mut shape = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let d = c.u64(&format!("the shape of `{name}`"))?;
            shape.push(usize::try_from(d).with_context(|| format!("`{name}`: dimension {d}"))?);
        }
        shape.reverse();
        let kind = c.u32(&format!("the type of `{name}`"))?;
        let ggml_type = GgmlType::from_id(kind)
            .with_context(|| format!("tensor `{name}`: ggml type {kind} is not supported"))?;
        let offset = c.u64(&format!("the offset of `{name}`"))?;
        infos.push((name, shape, ggml_type, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => v
            .as_u64()
            .filter(|a| a.is_power_of_two() && *a <= 1 << 16)
            .context("metadata `general.alignment` must be a power of two up to 65536")?,
    } as usize;
    let data_start = c.at.div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, shape, ggml_type, offset) in infos {
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .with_context(|| format!("tensor `{name}`: shape {shape:?} overflows"))?;
        let len = ggml_type
            .bytes_for(numel)
            .with_context(|| format!("tensor `{name}` ({ggml_type:?}, shape {shape:?})"))?;
        let start = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(data_start));
        let end = start.and_then(|s| s.checked_add(len));
        let (Some(start), Some(end)) = (start, end) else {
            bail!("tensor `{name}`: offset {offset} overflows");
        };
        ensure!(
            end <= bytes.len(),
            "tensor `{name}` ends at byte {end}, past the file's {} bytes (truncated?)",
            bytes.len()
        );
        tensors.push(TensorInfo {
            name,
            shape,
            ggml_type,
            start,
            len,
        });
    }
    Ok((version, metadata, tensors))
}

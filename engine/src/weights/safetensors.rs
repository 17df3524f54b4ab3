//! A safetensors reader (and a small writer for synthetic checkpoints). Written by hand rather
//! than taken from the `safetensors` crate so that every malformation is reported with the file
//! and the tensor it concerns.
//!
//! Layout: an 8-byte little-endian header length `n`, `n` bytes of JSON mapping each tensor name
//! to `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the byte after the
//! header) plus an optional `__metadata__` string map, then the data.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use kernels::{ByteOwner, Bytes, DType, Tensor};
use memmap2::Mmap;
use serde_json::Value;

/// A memory-mapped file as the owner of tensor bytes, so tensors view the page cache directly.
struct MappedFile(Mmap);

impl ByteOwner for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Where one tensor lives inside its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

/// One parsed safetensors file; tensor bytes stay in the mapping until viewed.
pub struct SafetensorsFile {
    pub path: PathBuf,
    pub metadata: BTreeMap<String, String>,
    pub tensors: BTreeMap<String, TensorInfo>,
    bytes: Bytes,
}

impl SafetensorsFile {
    /// Maps `path` and parses its header.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let size = file
            .metadata()
            .with_context(|| format!("{}: cannot read file size", path.display()))?
            .len();
        // Mapping an empty file fails on some systems; it is malformed anyway.
        let bytes = if size == 0 {
            Bytes::from_vec(Vec::new())
        } else {
            // SAFETY: the mapping is read-only. A checkpoint modified while mapped is outside
            // what any loader can defend against (the same holds for mlx and candle).
            let map = unsafe { Mmap::map(&file) }
                .with_context(|| format!("{}: cannot memory-map", path.display()))?;
            Bytes::new(Arc::new(MappedFile(map)))
        };
        SafetensorsFile::parse(path, bytes)
    }

    /// Parses a safetensors image held in `bytes`; `path` names it in errors.
    pub fn parse(path: &Path, bytes: Bytes) -> Result<SafetensorsFile> {
        let file = path.display();
        let data = bytes.as_slice();
        if data.len() < 8 {
            bail!(
                "{file}: {} bytes is too short for a safetensors file (needs an 8-byte header \
                 length)",
                data.len()
            );
        }
        let header_len = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
        let available = (data.len() - 8) as u64;
        if header_len > available {
            bail!(
                "{file}: header length {header_len} is larger than the {available} bytes that \
                 follow it (truncated file, or not a safetensors file)"
            );
        }
        let header_end = 8 + header_len as usize;
        let header: Value = serde_json::from_slice(&data[8..header_end])
            .map_err(|e| anyhow!("{file}: header is not valid JSON: {e}"))?;
        let Value::Object(entries) = header else {
            bail!("{file}: header must be a JSON object");
        };
        let data_len = data.len() - header_end;
        let mut metadata = BTreeMap::new();
        let mut tensors = BTreeMap::new();
        for (name, entry) in entries {
            if name == "__metadata__" {
                metadata = parse_metadata(&entry).map_err(|e| anyhow!("{file}: {e}"))?;
                continue;
            }
            let info = parse_entry(&entry, data_len)
                .map_err(|e| anyhow!("{file}: tensor `{name}`: {e}"))?;
            tensors.insert(
                name,
                TensorInfo {
                    start: header_end + info.start,
                    ..info
                },
            );
        }
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            metadata,
            tensors,
            bytes,
        })
    }

    /// A zero-copy view of `name` (copied only if its offset is misaligned for its dtype).
    pub fn tensor(&self, name: &str) -> Result<Option<Tensor>> {
        let Some(info) = self.tensors.get(name) else {
            return Ok(None);
        };
        let bytes = self
            .bytes
            .slice(info.start, info.len)
            .ok_or_else(|| anyhow!("{}: tensor `{name}` runs past the end", self.path.display()))?;
        let t = Tensor::from_bytes(&info.shape, info.dtype, bytes)
            .map_err(|e| anyhow!("{}: tensor `{name}`: {e}", self.path.display()))?;
        Ok(Some(t))
    }

    /// Size of the whole file in bytes.
    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
}

fn parse_metadata(v: &Value) -> Result<BTreeMap<String, String>> {
    let Value::Object(map) = v else {
        bail!("`__metadata__` must be an object of strings");
    };
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => bail!("`__metadata__.{k}` must be a string, got {other}"),
        })
        .collect()
}

/// Parses one header entry; `start` is relative to the data section.
fn parse_entry(v: &Value, data_len: usize) -> Result<TensorInfo> {
    let Value::Object(obj) = v else {
        bail!("entry must be an object with dtype, shape and data_offsets");
    };
    let dtype_name = match obj.get("dtype") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => bail!("`dtype` must be a string, got {other}"),
        None => bail!("`dtype` is missing"),
    };
    let dtype = DType::from_safetensors_name(dtype_name).ok_or_else(|| {
        anyhow!(
            "unsupported dtype `{dtype_name}` (supported: F32, F16, BF16, F64, U32, U8, I32, I64)"
        )
    })?;
    let shape = match obj.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        anyhow!("`shape` entries must be non-negative integers, got {d}")
                    })
            })
            .collect::<Result<Vec<usize>>>()?,
        Some(other) => bail!("`shape` must be a list of integers, got {other}"),
        None => bail!("`shape` is missing"),
    };
    let offsets = match obj.get("data_offsets") {
        Some(Value::Array(o)) if o.len() == 2 => {
            let mut ends = [0usize; 2];
            for (slot, v) in ends.iter_mut().zip(o) {
                *slot = v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        anyhow!("`data_offsets` must be two non-negative integers, got {v}")
                    })?;
            }
            ends
        }
        Some(other) => bail!("`data_offsets` must be [begin, end], got {other}"),
        None => bail!("`data_offsets` is missing"),
    };
    let [begin, end] = offsets;
    if begin > end {
        bail!("`data_offsets` [{begin}, {end}] end before they begin");
    }
    if end > data_len {
        bail!(
            "`data_offsets` [{begin}, {end}] run past the end of the data section ({data_len} \
             bytes; truncated file?)"
        );
    }
    let want = shape
        .iter()
        .try_fold(dtype.size_in_bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| anyhow!("shape {shape:?} is too large"))?;
    if end - begin != want {
        bail!(
            "`data_offsets` [{begin}, {end}] hold {} bytes, but {dtype_name} {shape:?} needs {want}",
            end - begin
        );
    }
    Ok(TensorInfo {
        dtype,
        shape,
        start: begin,
        len: end - begin,
    })
}

/// Writes `tensors` (in the given order) as one safetensors file; used for synthetic
/// checkpoints. Tensors of any dtype are written as stored.
pub fn write(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::to_value(metadata)?);
    }
    let mut blobs: Vec<&[u8]> = Vec::with_capacity(tensors.len());
    let mut offset = 0usize;
    for (name, t) in tensors {
        let raw = t
            .raw_bytes()
            .map_err(|e| anyhow!("{}: tensor `{name}`: {e}", path.display()))?;
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": t.dtype().safetensors_name(),
                "shape": t.shape(),
                "data_offsets": [offset, offset + raw.len()],
            }),
        );
        offset += raw.len();
        blobs.push(raw);
    }
    let mut json = serde_json::to_vec(&Value::Object(header))?;
    // Pad the header with spaces so the data starts 8-byte aligned and maps in place.
    while (8 + json.len()) % 8 != 0 {
        json.push(b' ');
    }
    let write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(File::create(path)?);
        f.write_all(&(json.len() as u64).to_le_bytes())?;
        f.write_all(&json)?;
        for b in &blobs {
            f.write_all(b)?;
        }
        f.flush()
    };
    write().with_context(|| format!("{}: cannot write", path.display()))
}

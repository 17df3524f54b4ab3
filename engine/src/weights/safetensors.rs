//! safetensors files read with the `safetensors` crate over a memory map: the crate validates
//! the header (its length, JSON, dtypes, offsets that tile the data section exactly with no
//! overlap, gap or trailing byte); tensors are then zero-copy views of the mapping. When the
//! crate refuses a file, [`explain`] turns its terse error into one naming the file and, where
//! one is to blame, the tensor and its field.
//!
//! Layout: an 8-byte little-endian header length `n`, `n` bytes of JSON mapping each tensor name
//! to `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the byte after the
//! header) plus an optional `__metadata__` string map, then the data.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use kernels::{Bytes, DType, Tensor};
use memmap2::Mmap;
use safetensors::tensor::{Metadata, SafeTensorError, TensorInfo as StInfo};
use safetensors::SafeTensors;
use serde_json::Value;

use super::pages::Pages;

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
    /// Maps `path` (a regular file) and parses its header; tensors view the map.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        SafetensorsFile::open_with(path, Pages::Mapped)
    }

    /// [`SafetensorsFile::open`], the bytes kept as `pages` asks.
    pub fn open_with(path: &Path, pages: Pages) -> Result<SafetensorsFile> {
        let file = crate::files::open_regular(path)?;
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
            super::pages::place(map, pages)
        };
        SafetensorsFile::parse(path, bytes)
    }

    /// Parses a safetensors image held in `bytes`; `path` names it in errors.
    pub fn parse(path: &Path, bytes: Bytes) -> Result<SafetensorsFile> {
        let file = path.display();
        let data = bytes.as_slice();
        // The crate keeps the last of two entries with one name; refuse them first.
        if let Some(name) = header_json(data).and_then(duplicate_name) {
            bail!("{file}: tensor `{name}` is listed twice in the header");
        }
        let (n, meta) = SafeTensors::read_metadata(data).map_err(|e| explain(path, data, e))?;
        let header_end = 8 + n;
        let mut tensors = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let st_name = info.dtype.to_string();
            let dtype = DType::from_safetensors_name(&st_name).ok_or_else(|| {
                anyhow!(
                    "{file}: tensor `{name}`: unsupported dtype `{st_name}` (supported: F32, F16, \
                     BF16, F64, U32, U8, I32, I64)"
                )
            })?;
            let (begin, end) = info.data_offsets;
            tensors.insert(
                name,
                TensorInfo {
                    dtype,
                    shape: info.shape.clone(),
                    start: header_end + begin,
                    len: end - begin,
                },
            );
        }
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            metadata: string_metadata(&meta),
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

fn string_metadata(meta: &Metadata) -> BTreeMap<String, String> {
    meta.metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The header's JSON bytes, when the length prefix points inside the file.
fn header_json(data: &[u8]) -> Option<&[u8]> {
    let n = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    data.get(8..8usize.checked_add(usize::try_from(n).ok()?)?)
}

/// The first name that appears twice among the header's top-level keys (serde_json and the
/// crate silently keep the last one).
fn duplicate_name(header: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(key.clone()) {
                    return Ok(Some(key));
                }
            }
            Ok(None)
        }
    }
    serde_json::Deserializer::from_slice(header)
        .deserialize_map(Keys)
        .ok()
        .flatten()
}

/// The crate's refusal of `data`, restated with the file and, where one is to blame, the tensor.
fn explain(path: &Path, data: &[u8], e: SafeTensorError) -> anyhow::Error {
    let file = path.display();
    let header = header_json(data);
    let declared = data
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    match e {
        SafeTensorError::HeaderTooSmall => anyhow!(
            "{file}: {} bytes is too short for a safetensors file (needs an 8-byte header length)",
            data.len()
        ),
        SafeTensorError::HeaderTooLarge | SafeTensorError::InvalidHeaderLength
            if header.is_none() =>
        {
            anyhow!(
                "{file}: header length {} is larger than the {} bytes that follow it (truncated \
                 file, or not a safetensors file)",
                declared.unwrap_or(0),
                data.len().saturating_sub(8)
            )
        }
        SafeTensorError::HeaderTooLarge => anyhow!(
            "{file}: header length {} is over the safetensors limit of 100 MB",
            declared.unwrap_or(0)
        ),
        SafeTensorError::InvalidHeader(u) => anyhow!("{file}: header is not UTF-8 text: {u}"),
        other => {
            let Some(header) = header else {
                return anyhow!("{file}: {other}");
            };
            let data_len = data.len() - 8 - header.len();
            match serde_json::from_slice::<Value>(header) {
                Err(e) => anyhow!("{file}: header is not valid JSON: {e}"),
                Ok(Value::Object(map)) => blame(&file.to_string(), &map, data_len)
                    .unwrap_or_else(|| anyhow!("{file}: {other}")),
                Ok(_) => anyhow!("{file}: header must be a JSON object"),
            }
        }
    }
}

/// Finds what is wrong in a header the crate refused: an entry that does not parse, a size that
/// does not match its dtype and shape, offsets that do not tile the data section, or a data
/// section of another length than the tensors cover.
fn blame(
    file: &str,
    map: &serde_json::Map<String, Value>,
    data_len: usize,
) -> Option<anyhow::Error> {
    let mut infos = Vec::new();
    for (name, v) in map {
        if name == "__metadata__" {
            if let Err(e) = serde_json::from_value::<BTreeMap<String, String>>(v.clone()) {
                return Some(anyhow!(
                    "{file}: `__metadata__` must map strings to strings: {e}"
                ));
            }
            continue;
        }
        match serde_json::from_value::<StInfo>(v.clone()) {
            Ok(info) => infos.push((name, info)),
            Err(e) => {
                return Some(anyhow!(
                    "{file}: tensor `{name}`: {e} (an entry is {{\"dtype\", \"shape\", \
                     \"data_offsets\": [begin, end]}})"
                ))
            }
        }
    }
    infos.sort_by_key(|(_, i)| i.data_offsets);
    let mut at = 0usize;
    for (name, info) in &infos {
        let (begin, end) = info.data_offsets;
        let shape = &info.shape;
        let dtype = info.dtype;
        if begin != at || end < begin {
            let why = if end < begin {
                "end before they begin".to_string()
            } else if begin < at {
                format!("overlap the tensor before, which ends at {at}")
            } else {
                format!("leave a gap after the tensor before, which ends at {at}")
            };
            return Some(anyhow!(
                "{file}: tensor `{name}`: `data_offsets` [{begin}, {end}] {why}"
            ));
        }
        let bits = shape
            .iter()
            .try_fold(dtype.bitsize(), |acc, &d| acc.checked_mul(d));
        match bits {
            None => {
                return Some(anyhow!(
                    "{file}: tensor `{name}`: shape {shape:?} of {dtype} overflows"
                ))
            }
            Some(b) if b % 8 != 0 || b / 8 != end - begin => {
                return Some(anyhow!(
                    "{file}: tensor `{name}`: `data_offsets` [{begin}, {end}] hold {} bytes, but \
                     {dtype} {shape:?} needs {}",
                    end - begin,
                    b as f64 / 8.0
                ))
            }
            Some(_) => {}
        }
        at = end;
    }
    if at > data_len {
        let name = infos.last().map_or("?", |(n, _)| n.as_str());
        return Some(anyhow!(
            "{file}: tensor `{name}`: `data_offsets` run to byte {at}, past the end of the data \
             section ({data_len} bytes; truncated file?)"
        ));
    }
    if at < data_len {
        return Some(anyhow!(
            "{file}: {} trailing bytes after the last tensor's data (the tensors cover {at} of \
             the {data_len} data bytes)",
            data_len - at
        ));
    }
    None
}

/// One tensor to write: name, dtype, shape and its little-endian bytes.
pub type OwnedTensor = (String, DType, Vec<usize>, Vec<u8>);

/// Writes `tensors` as one safetensors file at `path`, its `__metadata__` `{"format": format}`
/// (`pt` for a Hugging Face folder, `mlx` for an MLX-converted one).
pub fn write(path: &Path, tensors: &[OwnedTensor], format: &str) -> Result<()> {
    use safetensors::Dtype as St;
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let st = match dtype {
                DType::F32 => St::F32,
                DType::BF16 => St::BF16,
                DType::F16 => St::F16,
                DType::U32 => St::U32,
                DType::U8 => St::U8,
                DType::I32 => St::I32,
                DType::I64 => St::I64,
                DType::F64 => St::F64,
            };
            let view = safetensors::tensor::TensorView::new(st, shape.clone(), bytes)
                .with_context(|| format!("`{name}`: {dtype:?} {shape:?}"))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), format.to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path)
        .with_context(|| format!("{}: cannot write", path.display()))
}

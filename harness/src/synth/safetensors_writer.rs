//! A streaming safetensors writer with sharding.
//!
//! The format: an 8-byte little-endian header length, a JSON header mapping each tensor name to
//! `{dtype, shape, data_offsets}` (offsets relative to the end of the header), then the raw data.
//! Offsets depend only on names, dtypes and shapes, so the whole layout — shards included — is
//! planned before any value exists, and tensors are then streamed into place one at a time.
//! Headers are sorted by name and padded with spaces to a multiple of 8 (as the reference
//! implementation does, so the data that follows stays aligned).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kernels::DType;
use serde_json::{json, Map, Value};

/// One stored tensor: name, element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorEntry {
    pub fn nbytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size_in_bytes() as u64
    }
}

/// The planned layout of one `.safetensors` file.
#[derive(Debug, Clone)]
pub struct FileLayout {
    pub file_name: String,
    /// Tensors in data order (= header order, sorted by name).
    pub entries: Vec<TensorEntry>,
    header: Vec<u8>,
}

impl FileLayout {
    /// Lays out `entries` (any order; they are sorted here) with `metadata` as `__metadata__`.
    pub fn new(file_name: String, mut entries: Vec<TensorEntry>, metadata: &Value) -> Result<Self> {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = entries.windows(2).find(|w| w[0].name == w[1].name) {
            bail!("{file_name}: tensor `{}` planned twice", w[0].name);
        }
        let mut header = Map::new();
        header.insert("__metadata__".into(), metadata.clone());
        let mut offset = 0u64;
        for e in &entries {
            let end = offset + e.nbytes();
            header.insert(
                e.name.clone(),
                json!({
                    "dtype": e.dtype.safetensors_name(),
                    "shape": e.shape,
                    "data_offsets": [offset, end],
                }),
            );
            offset = end;
        }
        let mut header = serde_json::to_vec(&Value::Object(header))?;
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
        Ok(FileLayout {
            file_name,
            entries,
            header,
        })
    }

    pub fn data_bytes(&self) -> u64 {
        self.entries.iter().map(TensorEntry::nbytes).sum()
    }

    pub fn file_bytes(&self) -> u64 {
        8 + self.header.len() as u64 + self.data_bytes()
    }
}

/// Splits `entries` over files of at most `max_shard_bytes` of tensor data each (a tensor larger
/// than the limit gets a file of its own), in name order so each file holds a contiguous range
/// of names. One file is named `model.safetensors`; several are
/// `model-00001-of-0000N.safetensors`, as transformers and mlx-lm name them.
pub fn plan_shards(
    mut entries: Vec<TensorEntry>,
    max_shard_bytes: u64,
    metadata: &Value,
) -> Result<Vec<FileLayout>> {
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut groups: Vec<Vec<TensorEntry>> = vec![Vec::new()];
    let mut size = 0u64;
    for e in entries {
        let last = groups.last_mut().expect("groups is never empty");
        if !last.is_empty() && size + e.nbytes() > max_shard_bytes {
            groups.push(Vec::new());
            size = 0;
        }
        size += e.nbytes();
        groups.last_mut().expect("groups is never empty").push(e);
    }
    let n = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let name = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
            };
            FileLayout::new(name, g, metadata)
        })
        .collect()
}

/// `model.safetensors.index.json` for a sharded checkpoint: `metadata.total_size` (bytes of
/// tensor data) and a `weight_map` from each tensor name to its file, sorted by name.
pub fn index_json(files: &[FileLayout], total_parameters: u64) -> Value {
    let mut names: Vec<(&str, &str)> = files
        .iter()
        .flat_map(|f| {
            f.entries
                .iter()
                .map(|e| (e.name.as_str(), f.file_name.as_str()))
        })
        .collect();
    names.sort();
    let weight_map: Map<String, Value> = names
        .into_iter()
        .map(|(t, f)| (t.to_string(), Value::String(f.to_string())))
        .collect();
    let total_size: u64 = files.iter().map(FileLayout::data_bytes).sum();
    json!({
        "metadata": {"total_size": total_size, "total_parameters": total_parameters},
        "weight_map": weight_map,
    })
}

/// Writes one planned file: the header at creation, then each tensor's bytes in layout order.
pub struct FileWriter {
    path: PathBuf,
    out: BufWriter<File>,
    layout: FileLayout,
    next: usize,
}

impl FileWriter {
    pub fn create(dir: &Path, layout: FileLayout) -> Result<FileWriter> {
        let path = dir.join(&layout.file_name);
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(layout.header.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&layout.header))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(FileWriter {
            path,
            out,
            layout,
            next: 0,
        })
    }

    /// Appends the data of `name`, which must be the next tensor of the layout.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some(want) = self.layout.entries.get(self.next) else {
            bail!("{}: no room for tensor `{name}`", self.path.display());
        };
        if want.name != name || want.nbytes() != bytes.len() as u64 {
            bail!(
                "{}: expected tensor `{}` ({} bytes) next, got `{name}` ({} bytes)",
                self.path.display(),
                want.name,
                want.nbytes(),
                bytes.len()
            );
        }
        self.out
            .write_all(bytes)
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.next += 1;
        Ok(())
    }

    /// Flushes and syncs; fails if a planned tensor was never written.
    pub fn finish(self) -> Result<()> {
        if let Some(missing) = self.layout.entries.get(self.next) {
            bail!(
                "{}: tensor `{}` was planned but never written",
                self.path.display(),
                missing.name
            );
        }
        let file = self
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("flushing {}", self.path.display()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, dtype: DType, shape: &[usize]) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn header_is_sorted_padded_and_offsets_contiguous() {
        let meta = json!({"format": "pt"});
        let l = FileLayout::new(
            "x.safetensors".into(),
            vec![
                entry("b", DType::F32, &[3]),
                entry("a", DType::BF16, &[2, 3]),
            ],
            &meta,
        )
        .unwrap();
        assert_eq!(l.header.len() % 8, 0);
        let v: Value = serde_json::from_slice(&l.header).unwrap();
        assert_eq!(v["a"]["data_offsets"], json!([0, 12]));
        assert_eq!(v["b"]["data_offsets"], json!([12, 24]));
        assert_eq!(v["a"]["dtype"], "BF16");
        assert_eq!(v["__metadata__"]["format"], "pt");
    }

    #[test]
    fn shards_respect_the_limit_and_name_files() {
        let meta = json!({"format": "mlx"});
        let es = (0..5)
            .map(|i| entry(&format!("t{i}"), DType::F32, &[10]))
            .collect();
        let files = plan_shards(es, 80, &meta).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[0].file_name, "model-00001-of-00003.safetensors");
        assert_eq!(files[0].entries.len(), 2);
        let idx = index_json(&files, 50);
        assert_eq!(idx["weight_map"]["t4"], "model-00003-of-00003.safetensors");
        assert_eq!(idx["metadata"]["total_size"], 200);
    }
}

//! Sharded safetensors files written with the `safetensors` crate.
//!
//! Tensors are split over files by name (each file holds a contiguous range of the sorted
//! names), and each file is written by the crate, which lays it out (entries by descending
//! dtype alignment, then name; header padded to 8 bytes so the data maps in place) and asks each
//! tensor for its bytes only when it writes them. A [`Lazy`] view produces those bytes then, so
//! memory stays near the size of the largest tensor.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{anyhow, Result};
use kernels::DType;
use safetensors::tensor::{Dtype, View};
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

/// The tensors of one `.safetensors` file.
#[derive(Debug, Clone)]
pub struct Shard {
    pub file_name: String,
    /// Sorted by name.
    pub entries: Vec<TensorEntry>,
}

impl Shard {
    pub fn data_bytes(&self) -> u64 {
        self.entries.iter().map(TensorEntry::nbytes).sum()
    }
}

/// Splits `entries` over files of at most `max_shard_bytes` of tensor data each (a tensor larger
/// than the limit gets a file of its own), in name order. One file is named `model.safetensors`;
/// several are `model-00001-of-0000N.safetensors`, as transformers and mlx-lm name them.
pub fn plan_shards(mut entries: Vec<TensorEntry>, max_shard_bytes: u64) -> Vec<Shard> {
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
        .map(|(i, entries)| Shard {
            file_name: if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
            },
            entries,
        })
        .collect()
}

/// `model.safetensors.index.json` for a sharded checkpoint: `metadata.total_size` (bytes of
/// tensor data) and a `weight_map` from each tensor name to its file, sorted by name.
pub fn index_json(files: &[Shard], total_parameters: u64) -> Value {
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
    let total_size: u64 = files.iter().map(Shard::data_bytes).sum();
    json!({
        "metadata": {"total_size": total_size, "total_parameters": total_parameters},
        "weight_map": weight_map,
    })
}

/// Makes the bytes of a stored tensor when the writer reaches it.
pub type Source<'a> = dyn Fn(&TensorEntry) -> Result<Vec<u8>> + 'a;

/// A tensor whose bytes are made by `source` when the crate writes it. The crate's `View` cannot
/// fail, so the first error is kept in `failed` and reported once the file is written.
struct Lazy<'a> {
    entry: &'a TensorEntry,
    dtype: Dtype,
    source: &'a Source<'a>,
    failed: &'a Mutex<Option<anyhow::Error>>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.entry.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let want = self.entry.nbytes() as usize;
        let made = (self.source)(self.entry).and_then(|b| {
            if b.len() == want {
                Ok(b)
            } else {
                Err(anyhow!(
                    "tensor `{}`: made {} bytes, its dtype and shape need {want}",
                    self.entry.name,
                    b.len()
                ))
            }
        });
        match made {
            Ok(b) => Cow::Owned(b),
            Err(e) => {
                self.failed.lock().expect("not poisoned").get_or_insert(e);
                // Keeps the layout the header promised; the file is discarded anyway.
                Cow::Owned(vec![0; want])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.entry.nbytes() as usize
    }
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F64 => Dtype::F64,
        DType::U32 => Dtype::U32,
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
    }
}

/// Writes `shard` into `dir` with `metadata` as `__metadata__`, asking `source` for each
/// tensor's bytes in the order the crate writes them.
pub fn write_shard(
    dir: &Path,
    shard: &Shard,
    metadata: &HashMap<String, String>,
    source: &Source<'_>,
) -> Result<()> {
    let path = dir.join(&shard.file_name);
    let failed = Mutex::new(None);
    let views = shard.entries.iter().map(|entry| {
        let view = Lazy {
            entry,
            dtype: st_dtype(entry.dtype),
            source,
            failed: &failed,
        };
        (entry.name.as_str(), view)
    });
    safetensors::serialize_to_file(views, Some(metadata.clone()), &path)
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    match failed.into_inner().expect("not poisoned") {
        Some(e) => Err(e.context(format!("writing {}", path.display()))),
        None => Ok(()),
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
    fn files_read_back_with_contiguous_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard {
            file_name: "x.safetensors".into(),
            entries: vec![
                entry("a", DType::BF16, &[2, 3]),
                entry("b", DType::F32, &[3]),
            ],
        };
        let meta = [("format".to_string(), "pt".to_string())].into();
        let source = |e: &TensorEntry| Ok(vec![e.name.as_bytes()[0]; e.nbytes() as usize]);
        write_shard(dir.path(), &shard, &meta, &source).unwrap();
        let raw = std::fs::read(dir.path().join("x.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
        assert_eq!(st.tensor("a").unwrap().data(), &[b'a'; 12]);
        assert_eq!(st.tensor("b").unwrap().data(), &[b'b'; 12]);
        let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        let v: Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
        assert_eq!(v["__metadata__"]["format"], "pt");
    }

    #[test]
    fn a_failing_source_fails_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard {
            file_name: "x.safetensors".into(),
            entries: vec![entry("a", DType::F32, &[2])],
        };
        let source = |_: &TensorEntry| Ok(vec![0u8; 3]);
        let e = write_shard(dir.path(), &shard, &HashMap::new(), &source).unwrap_err();
        assert!(format!("{e:#}").contains("made 3 bytes"), "{e:#}");
    }

    #[test]
    fn shards_respect_the_limit_and_name_files() {
        let es = (0..5)
            .map(|i| entry(&format!("t{i}"), DType::F32, &[10]))
            .collect();
        let files = plan_shards(es, 80);
        assert_eq!(files.len(), 3);
        assert_eq!(files[0].file_name, "model-00001-of-00003.safetensors");
        assert_eq!(files[0].entries.len(), 2);
        let idx = index_json(&files, 50);
        assert_eq!(idx["weight_map"]["t4"], "model-00003-of-00003.safetensors");
        assert_eq!(idx["metadata"]["total_size"], 200);
    }
}

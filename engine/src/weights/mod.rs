//! Checkpoint tensors: every safetensors shard memory-mapped (or, for the CPU backend, copied
//! into huge pages: see [`pages`]), tensors handed out as zero-copy views of those bytes. Name
//! mapping between layouts belongs to each model family; this store only knows names as the
//! files spell them.

mod layout;
pub mod pages;
pub mod safetensors;
mod scope;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use kernels::{DType, QuantSpec, QuantWeight, Tensor, Weight};
use serde_json::Value;

use crate::config::short;
pub use layout::{norms_are_offset, Layout};
pub use pages::Pages;
use safetensors::SafetensorsFile;
pub use scope::Scope;

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

pub struct WeightStore {
    dir: PathBuf,
    files: Vec<SafetensorsFile>,
    /// Tensor name → index into `files`.
    location: HashMap<String, usize>,
}

impl WeightStore {
    /// Opens a checkpoint folder: `model.safetensors.index.json` and its shards, else
    /// `model.safetensors`, else every `model*.safetensors` (mlx-lm loads that glob), else every
    /// `*.safetensors`. Tensors view the memory maps.
    pub fn open(dir: &Path) -> Result<WeightStore> {
        WeightStore::open_with(dir, Pages::Mapped)
    }

    /// [`WeightStore::open`], each file's bytes kept as `pages` asks.
    pub fn open_with(dir: &Path, pages: Pages) -> Result<WeightStore> {
        if !dir.is_dir() {
            bail!(
                "{}: model folder does not exist or is not a folder",
                dir.display()
            );
        }
        let index_path = dir.join(INDEX);
        if crate::files::exists(&index_path) {
            return WeightStore::open_indexed(dir, &index_path, pages);
        }
        let paths = if crate::files::exists(&dir.join(SINGLE)) {
            vec![dir.join(SINGLE)]
        } else {
            let mut all = safetensors_in(dir)?;
            let model: Vec<PathBuf> = all
                .iter()
                .filter(|p| file_name(p).starts_with("model"))
                .cloned()
                .collect();
            if !model.is_empty() {
                all = model;
            }
            all
        };
        if paths.is_empty() {
            bail!(
                "{}: no weights found (expected {SINGLE}, {INDEX} with shards, or *.safetensors \
                 files)",
                dir.display()
            );
        }
        let mut store = WeightStore {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            location: HashMap::new(),
        };
        for path in paths {
            let file = SafetensorsFile::open_with(&path, pages)?;
            let idx = store.files.len();
            for name in file.tensors.keys() {
                if let Some(&other) = store.location.get(name) {
                    bail!(
                        "{}: tensor `{name}` is stored in both {} and {} and there is no {INDEX} \
                         to say which one counts",
                        dir.display(),
                        file_name(&store.files[other].path),
                        file_name(&path)
                    );
                }
                store.location.insert(name.clone(), idx);
            }
            store.files.push(file);
        }
        Ok(store)
    }

    fn open_indexed(dir: &Path, index_path: &Path, pages: Pages) -> Result<WeightStore> {
        let shown = index_path.display();
        let text = crate::files::read_text(index_path, crate::files::MAX_CONFIG_BYTES)?;
        let root: Value =
            serde_json::from_str(&text).with_context(|| format!("{shown}: not valid JSON"))?;
        let map = match root.get("weight_map") {
            Some(Value::Object(m)) => m,
            Some(other) => bail!(
                "{shown}: field `weight_map` must be an object of tensor → file, got {}",
                short(other)
            ),
            None => bail!("{shown}: field `weight_map` is missing"),
        };
        // Shards in first-mention order, each with one tensor that names it in errors.
        let mut shards: BTreeMap<String, String> = BTreeMap::new();
        let mut wanted: Vec<(String, String)> = Vec::with_capacity(map.len());
        for (name, file) in map {
            let Value::String(file) = file else {
                bail!(
                    "{shown}: field `weight_map.{name}` must be a file name, got {}",
                    short(file)
                );
            };
            if file.contains("..") || Path::new(file).is_absolute() {
                bail!("{shown}: field `weight_map.{name}` points outside the folder: {file}");
            }
            shards.entry(file.clone()).or_insert_with(|| name.clone());
            wanted.push((name.clone(), file.clone()));
        }
        let mut files = Vec::with_capacity(shards.len());
        let mut file_idx = HashMap::new();
        for (shard, example) in &shards {
            let path = dir.join(shard);
            if !crate::files::exists(&path) {
                bail!(
                    "{shown}: shard `{shard}` (holding `{example}` and others) is missing from {}",
                    dir.display()
                );
            }
            file_idx.insert(shard.clone(), files.len());
            files.push(SafetensorsFile::open_with(&path, pages)?);
        }
        let mut location = HashMap::with_capacity(wanted.len());
        for (name, shard) in wanted {
            let idx = file_idx[&shard];
            if !files[idx].tensors.contains_key(&name) {
                bail!(
                    "{shown}: lists tensor `{name}` in `{shard}`, but that shard does not hold it"
                );
            }
            location.insert(name, idx);
        }
        Ok(WeightStore {
            dir: dir.to_path_buf(),
            files,
            location,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.location.keys().cloned().collect();
        names.sort();
        names
    }

    /// Dtype and shape of `name` without viewing it.
    pub fn info(&self, name: &str) -> Option<(DType, &[usize])> {
        let file = &self.files[*self.location.get(name)?];
        file.tensors
            .get(name)
            .map(|i| (i.dtype, i.shape.as_slice()))
    }

    /// The file holding `name`, for error messages.
    fn file_of(&self, name: &str) -> PathBuf {
        match self.location.get(name) {
            Some(&i) => self.files[i].path.clone(),
            None => self.dir.clone(),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let Some(&idx) = self.location.get(name) else {
            return Err(self.missing(name));
        };
        self.files[idx]
            .tensor(name)?
            .ok_or_else(|| self.missing(name))
    }

    fn missing(&self, name: &str) -> anyhow::Error {
        // Suggest names sharing the last two components: usually the same tensor under another
        // layout's prefix (e.g. `model.language_model.norm.weight` for `model.norm.weight`).
        let tail: Vec<&str> = name.rsplit('.').take(2).collect();
        let suffix = format!(".{}", tail.into_iter().rev().collect::<Vec<_>>().join("."));
        let mut similar: Vec<&String> = self
            .location
            .keys()
            .filter(|k| k.ends_with(&suffix) || **k == suffix[1..])
            .collect();
        similar.sort();
        let hint = if similar.is_empty() {
            format!("{} tensors in the checkpoint", self.location.len())
        } else {
            let shown: Vec<String> = similar.iter().take(3).map(|s| format!("`{s}`")).collect();
            format!("similar: {}", shown.join(", "))
        };
        anyhow!(
            "{}: tensor `{name}` is missing ({hint})",
            self.dir.display()
        )
    }

    /// `name`, checked to have exactly `shape`.
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensor(name)?;
        if t.shape() != shape {
            bail!(
                "{}: tensor `{name}` has shape {:?}, expected {shape:?}",
                self.file_of(name).display(),
                t.shape()
            );
        }
        Ok(t)
    }

    /// `name`, checked to have `shape` and a float dtype (F32, BF16, F16 or F64), as stored:
    /// norms, biases, scales and dense weights. An integer tensor where a float one belongs is
    /// refused naming the file and the tensor (not later, deep in a kernel, naming neither).
    pub fn float_tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensor_shaped(name, shape)?;
        if !t.dtype().is_float() {
            bail!(
                "{}: tensor `{name}` is {:?}; it must be a float tensor (F32, BF16, F16 or F64)",
                self.file_of(name).display(),
                t.dtype()
            );
        }
        Ok(t)
    }

    /// [`WeightStore::float_tensor`] widened to f32.
    pub fn f32_tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.float_tensor(name, shape)?;
        t.to_f32()
            .with_context(|| format!("{}: tensor `{name}`", self.file_of(name).display()))
    }

    /// [`WeightStore::f32_tensor`]'s values.
    pub fn f32_values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.f32_tensor(name, shape)?.to_vec_f32()?)
    }

    /// The linear weight `prefix.weight` as a logical `[rows, cols]` matrix. A `prefix.scales`
    /// tensor beside it marks it quantized (as mlx-lm decides), read with `spec` and with
    /// `prefix.biases` for affine; without scales it must be a dense float matrix.
    pub fn weight(
        &self,
        prefix: &str,
        spec: Option<QuantSpec>,
        rows: usize,
        cols: usize,
    ) -> Result<Weight> {
        self.weight_stacked_as(prefix, spec, None, rows, cols)
    }

    /// A stack of `experts` matrices `[rows, cols]` stored as one `[experts, rows, cols]`
    /// tensor (mlx-lm's `SwitchLinear`; quantized along `cols` like a linear), returned as the
    /// flat `[experts·rows, cols]` weight whose rows `e·rows..` are expert `e`.
    pub fn stacked_weight(
        &self,
        prefix: &str,
        spec: Option<QuantSpec>,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Weight> {
        self.weight_stacked_as(prefix, spec, Some(experts), rows, cols)
    }

    fn weight_stacked_as(
        &self,
        prefix: &str,
        spec: Option<QuantSpec>,
        experts: Option<usize>,
        rows: usize,
        cols: usize,
    ) -> Result<Weight> {
        let lead: Vec<usize> = experts.into_iter().collect();
        let wname = format!("{prefix}.weight");
        let sname = format!("{prefix}.scales");
        let bname = format!("{prefix}.biases");
        let w = self.tensor(&wname)?;
        let file = self.file_of(&wname);
        let file = file.display();
        if !self.contains(&sname) {
            if !w.dtype().is_float() || w.dtype() == DType::F64 {
                let why = if w.dtype() == DType::U32 {
                    format!(" (packed like a quantized weight, but `{sname}` is missing)")
                } else {
                    String::new()
                };
                bail!(
                    "{file}: tensor `{wname}` is {:?}; a dense weight must be F32, BF16 or F16{why}",
                    w.dtype()
                );
            }
            let want = [&lead[..], &[rows, cols]].concat();
            if w.shape() != want {
                bail!(
                    "{file}: tensor `{wname}` has shape {:?}, expected {want:?}",
                    w.shape()
                );
            }
            let flat = lead.iter().product::<usize>() * rows;
            return Ok(Weight::Dense(w.reshape(&[flat, cols])?));
        }
        let Some(spec) = spec else {
            bail!(
                "{file}: `{sname}` marks `{prefix}` as quantized, but config.json has no \
                 `quantization` for it (add {{\"group_size\": .., \"bits\": ..}})"
            );
        };
        let scales = self.tensor(&sname)?;
        let biases = if spec.mode.has_biases() {
            if !self.contains(&bname) {
                bail!(
                    "{file}: `{prefix}` is {}-quantized but tensor `{bname}` is missing",
                    spec.mode.name()
                );
            }
            Some(self.tensor(&bname)?)
        } else {
            if self.contains(&bname) {
                bail!(
                    "{file}: `{prefix}` has tensor `{bname}`, but config.json says mode `{}`, \
                     which has no biases (is the mode right?)",
                    spec.mode.name()
                );
            }
            None
        };
        let want_lead = [&lead[..], &[rows]].concat();
        let stacked_ok =
            w.dims() == want_lead.len() + 1 && w.shape()[..want_lead.len()] == want_lead[..];
        if experts.is_some() && !stacked_ok {
            bail!(
                "{file}: tensor `{wname}` has shape {:?}, expected {want_lead:?} followed by \
                 the packed columns",
                w.shape()
            );
        }
        let rows_all = lead.iter().product::<usize>() * rows;
        let q = QuantWeight::new(spec, w, scales, biases, prefix).map_err(|e| {
            anyhow!(
                "{file}: `{prefix}` does not fit config.json's quantization (mode {}, bits {}, \
                 group_size {}): {e}",
                spec.mode.name(),
                spec.bits,
                spec.group_size
            )
        })?;
        if (q.rows, q.cols) != (rows_all, cols) {
            bail!(
                "{file}: `{prefix}` unpacks to [{}, {}] with {} bits, expected [{rows_all}, {cols}] \
                 (wrong `bits` in config.json's quantization, or a wrong model shape)",
                q.rows,
                q.cols,
                spec.bits
            );
        }
        Ok(Weight::Quant(q))
    }

    /// Bytes on disk over all shards.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size()).sum()
    }

    pub fn files(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `*.safetensors` directly inside `dir`, sorted by name.
fn safetensors_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("{}: cannot list", dir.display()))?
            .path();
        // Anything named *.safetensors is opened (and refused there if it is not a plain file).
        if !path.is_dir() && file_name(&path).ends_with(".safetensors") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

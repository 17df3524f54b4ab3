//! Writing a planned checkpoint folder: atomically (a temporary sibling renamed into place),
//! streaming one tensor at a time so memory stays at the size of the largest tensor.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use super::families;
use super::plan::ModelPlan;
use super::safetensors_writer::{index_json, plan_shards, write_shard, TensorEntry};
use super::spec::{Layout, SynthSpec};
use super::tokenizer;
use super::values::{encode, generate, stored_entries};

/// Checkpoints at least this big get a progress bar (when asked for and stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Tensor data per safetensors file before starting a new shard.
    pub max_shard_bytes: u64,
    /// Replace a non-empty output folder.
    pub force: bool,
    /// Show a progress bar on stderr for large checkpoints.
    pub progress: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            max_shard_bytes: 2048 << 20,
            force: false,
            progress: false,
        }
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    pub dir: PathBuf,
    /// File names inside `dir`.
    pub files: Vec<String>,
    /// Total bytes of all files.
    pub bytes: u64,
}

/// Writes the checkpoint folder of `spec` to `out`. `out` must be absent or empty unless
/// `opts.force`; on any error nothing is left behind.
pub fn write_checkpoint(spec: &SynthSpec, out: &Path, opts: &WriteOptions) -> Result<Written> {
    spec.check()?;
    if opts.max_shard_bytes == 0 {
        bail!("the maximum shard size must be at least 1 byte");
    }
    check_target(out, opts.force)?;
    let layout = spec.resolved_layout();
    let plan = families::find(&spec.family)?
        .plan(spec, layout)
        .with_context(|| format!("planning {spec}"))?;

    let tmp = TempDir::create(out)?;
    let (files, bytes) = write_folder(&plan, spec, layout, &tmp.0, opts)
        .with_context(|| format!("writing {spec} to {}", out.display()))?;
    tmp.commit(out, opts.force)?;
    Ok(Written {
        dir: out.to_path_buf(),
        files,
        bytes,
    })
}

fn is_empty_dir(p: &Path) -> Result<bool> {
    Ok(fs::read_dir(p)
        .with_context(|| format!("reading {}", p.display()))?
        .next()
        .is_none())
}

fn check_target(out: &Path, force: bool) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    if !out.is_dir() {
        bail!("{} exists and is not a folder", out.display());
    }
    if !force && !is_empty_dir(out)? {
        bail!(
            "{} is not empty; pass --force (WriteOptions::force) to replace it",
            out.display()
        );
    }
    Ok(())
}

/// A temporary sibling of the output folder, removed on drop unless committed.
struct TempDir(PathBuf);

impl TempDir {
    fn create(out: &Path) -> Result<TempDir> {
        // pid + counter: distinct for concurrent writers in and across processes.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let Some(name) = out.file_name() else {
            bail!("{}: give the output folder a name", out.display());
        };
        let tmp = out.with_file_name(format!(
            "{}.tmp-{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        if let Some(parent) = tmp.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(TempDir(tmp))
    }

    fn commit(self, out: &Path, force: bool) -> Result<()> {
        // Checked again: someone may have filled the folder while we wrote.
        check_target(out, force)?;
        if out.exists() {
            fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
        }
        fs::rename(&self.0, out)
            .with_context(|| format!("renaming {} to {}", self.0.display(), out.display()))?;
        std::mem::forget(self);
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Keys sorted, as mlx-lm's `save_config` writes config.json.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), m[k].clone()))
                    .collect::<Map<_, _>>(),
            )
        }
        other => other.clone(),
    }
}

fn write_json(dir: &Path, name: &str, v: &Value) -> Result<()> {
    let path = dir.join(name);
    let mut text = serde_json::to_string_pretty(v)?;
    text.push('\n');
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes every file of the folder into `dir`; returns the file names and total bytes.
fn write_folder(
    plan: &ModelPlan,
    spec: &SynthSpec,
    layout: Layout,
    dir: &Path,
    opts: &WriteOptions,
) -> Result<(Vec<String>, u64)> {
    let config = match layout {
        Layout::Mlx => sorted(&plan.config),
        Layout::Hf => plan.config.clone(),
    };
    write_json(dir, "config.json", &config)?;
    write_json(dir, "generation_config.json", &plan.generation_config)?;
    let tok = tokenizer::build(&plan.tokenizer)?;
    write_json(dir, "tokenizer.json", &tok.tokenizer_json)?;
    write_json(dir, "tokenizer_config.json", &tok.tokenizer_config)?;

    let mut stored = Vec::with_capacity(plan.tensors.len());
    for t in &plan.tensors {
        stored.push(stored_entries(t, spec.format)?);
    }
    let shards = plan_shards(
        stored.iter().flatten().cloned().collect(),
        opts.max_shard_bytes,
    );
    if shards.len() > 1 {
        let params = plan.tensors.iter().map(|t| t.numel() as u64).sum();
        write_json(
            dir,
            "model.safetensors.index.json",
            &index_json(&shards, params),
        )?;
    }
    let total: u64 = shards.iter().map(|f| f.data_bytes()).sum();
    let bar = progress_bar(opts.progress && total >= PROGRESS_MIN_BYTES, total, spec);
    // Stored name → the planned tensor it comes from. A quantized tensor is stored as several
    // parts of different dtypes, which the crate writes at different times: the parts not asked
    // for yet wait in `pending` (scales and biases: a small fraction of the weight bytes).
    let owner: HashMap<&str, usize> = stored
        .iter()
        .enumerate()
        .flat_map(|(i, parts)| parts.iter().map(move |e| (e.name.as_str(), i)))
        .collect();
    let pending: Mutex<HashMap<String, Vec<u8>>> = Mutex::new(HashMap::new());
    let source = |e: &TensorEntry| -> Result<Vec<u8>> {
        bar.inc(e.nbytes());
        if let Some(b) = pending.lock().expect("not poisoned").remove(&e.name) {
            return Ok(b);
        }
        let i = owner[e.name.as_str()];
        let t = &plan.tensors[i];
        let bytes = encode(t, &generate(t, spec.seed), spec.format)?;
        let mut mine = None;
        for (part, data) in stored[i].iter().zip(bytes) {
            if part.name == e.name {
                mine = Some(data);
            } else {
                pending
                    .lock()
                    .expect("not poisoned")
                    .insert(part.name.clone(), data);
            }
        }
        mine.ok_or_else(|| anyhow::anyhow!("`{}` made no part named `{}`", t.name, e.name))
    };
    let metadata = layout.safetensors_metadata();
    for shard in &shards {
        write_shard(dir, shard, &metadata, &source)?;
    }
    bar.finish_and_clear();

    let mut names = Vec::new();
    let mut bytes = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        bytes += e.metadata()?.len();
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok((names, bytes))
}

fn progress_bar(show: bool, total: u64, spec: &SynthSpec) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_message(format!("writing {spec}"));
    bar
}

//! Synthetic checkpoints made once and kept: a spec's folder is written the first time it is
//! asked for and read from the cache afterwards, so repeated runs and tests reuse the same
//! bytes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::{write_checkpoint, SynthSpec, WriteOptions};

/// The cache folder: `$HARNESS_CACHE`, else `harness-cache` in the target dir
/// (`$CARGO_TARGET_DIR`, else `target/` under the workspace).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HARNESS_CACHE") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("harness-cache")
}

/// The workspace root: the nearest ancestor of the current directory holding this workspace's
/// crates, else the directory this crate was built from.
pub fn workspace_root() -> PathBuf {
    if let Ok(cwd) = std::env::current_dir() {
        for d in cwd.ancestors() {
            if d.join("Cargo.toml").is_file()
                && d.join("kernels").is_dir()
                && d.join("synth").is_dir()
            {
                return d.to_path_buf();
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The folder of a synthetic checkpoint, written first if the cache does not hold it yet. The
/// key includes a fingerprint of the synthesiser's sources (see build.rs), so a changed
/// synthesiser never reads folders an older one wrote.
pub fn cached(spec: &SynthSpec) -> Result<PathBuf> {
    let key = format!(
        "{}-{}",
        spec.to_string().replace([':', '@'], "_"),
        &env!("SYNTH_SOURCE_HASH")[..8]
    );
    let dir = cache_dir().join(key);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache_dir())
        .with_context(|| format!("creating {}", cache_dir().display()))?;
    let opts = WriteOptions {
        progress: true,
        ..WriteOptions::default()
    };
    match write_checkpoint(spec, &dir, &opts) {
        Ok(_) => Ok(dir),
        // Another process (a parallel test) finished the same spec first: its bytes are ours.
        Err(_) if dir.join("config.json").is_file() => Ok(dir),
        Err(e) => Err(e).with_context(|| format!("synthesising {spec}")),
    }
}

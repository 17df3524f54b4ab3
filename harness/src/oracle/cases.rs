//! The stored oracle references, one table: which checkpoints have an mlx-lm reference and
//! where it and its folder live. Adding a family is one entry in [`FAMILIES`]; its folders
//! then need references (`bash harness/oracle/regenerate_all.sh`).

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use synth::{Format, Layout, Size, SynthSpec};

/// Families with references on synthetic checkpoints.
pub const FAMILIES: &[&str] = &[
    "qwen3",
    "qwen2",
    "qwen3_5",
    "qwen3_5_moe",
    "lfm2",
    "lfm2_moe",
    "llama",
    "minicpm",
    "gemma3",
    "gemma4",
    "gemma4_moe",
];

/// Families that also have folders written by mlx-lm's own save functions (the later families
/// share Qwen3's tensor names, so their synthetic folders already are mlx-lm's layout).
pub const MLX_WRITTEN_FAMILIES: &[&str] = &["qwen3", "qwen3_5", "lfm2"];

/// Every weight format; each has an mlx-written folder and a synthetic one in the mlx layout.
pub const FORMATS: &[Format] = Format::ALL;

/// The formats that also exist in the original Hugging Face layout (quantized folders are
/// only ever written by mlx-lm, in its layout).
pub const HF_FORMATS: &[Format] = &[Format::F32, Format::Bf16];

/// The seed of every synthetic reference checkpoint.
pub const SEED: u64 = 0;

/// `goldens/oracle` under the workspace.
pub fn goldens_dir(root: &Path) -> PathBuf {
    root.join("goldens").join("oracle")
}

/// Where a reference's checkpoint comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A folder written by mlx-lm's own save functions and committed under
    /// `engine/tests/fixtures/mlx-written/<name>` (e.g. `qwen3_5-q4`).
    MlxWritten(String),
    /// The same mlx-written folder against mlx-lm run in its stored dtypes
    /// (`goldens/oracle/mlx-written-native/<name>`): the reference of MLX's native path.
    MlxWrittenNative(String),
    /// A synthetic checkpoint, made on the fly (and cached) from its spec.
    Synth(SynthSpec),
}

impl Source {
    /// The reference file under `goldens/oracle/`.
    pub fn reference_file(&self, root: &Path) -> PathBuf {
        let dir = goldens_dir(root);
        match self {
            Source::MlxWritten(name) => dir.join("mlx-written").join(format!("{name}.json")),
            Source::MlxWrittenNative(name) => {
                dir.join("mlx-written-native").join(format!("{name}.json"))
            }
            Source::Synth(spec) => dir.join("synth").join(synth_file_name(spec)),
        }
    }

    /// The checkpoint folder; a synthetic one is written to the harness cache if absent.
    pub fn folder(&self, root: &Path) -> Result<PathBuf> {
        match self {
            Source::MlxWritten(name) | Source::MlxWrittenNative(name) => {
                let dir = root.join("engine/tests/fixtures/mlx-written").join(name);
                if !dir.join("config.json").is_file() {
                    bail!(
                        "{}: no config.json; the mlx-written fixtures are committed (regenerate them with bash harness/oracle/regenerate_all.sh)",
                        dir.display()
                    );
                }
                Ok(dir)
            }
            Source::Synth(spec) => synth::cached(spec),
        }
    }
}

/// `mlx-written/qwen3_5-q4` or `synth/qwen3_5:tiny:q4:mlx`: the first part of every case id.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::MlxWritten(name) => write!(f, "mlx-written/{name}"),
            Source::MlxWrittenNative(name) => write!(f, "mlx-written-native/{name}"),
            Source::Synth(spec) => write!(f, "synth/{spec}"),
        }
    }
}

/// `qwen3_5-tiny-q4-mlx.json`: the spec with `:` (not allowed in every file system) as `-`.
pub fn synth_file_name(spec: &SynthSpec) -> String {
    format!("{}.json", spec.to_string().replace([':', '@'], "-"))
}

/// The synthetic checkpoints with references: every family tiny, every format in the mlx
/// layout, and the float formats in the hf layout too.
pub fn synth_specs() -> Vec<SynthSpec> {
    let mut out = Vec::new();
    for family in FAMILIES {
        for (layout, formats) in [(Layout::Mlx, FORMATS), (Layout::Hf, HF_FORMATS)] {
            for &format in formats {
                out.push(SynthSpec {
                    layout: Some(layout),
                    seed: SEED,
                    ..SynthSpec::new(family, Size::Tiny, format)
                });
            }
        }
    }
    out
}

/// Every stored reference: the mlx-written folders, then the synthetic ones.
pub fn sources() -> Vec<Source> {
    let mut out = Vec::new();
    for family in MLX_WRITTEN_FAMILIES {
        for format in FORMATS {
            out.push(Source::MlxWritten(format!("{family}-{}", format.name())));
        }
    }
    out.extend(synth_specs().into_iter().map(Source::Synth));
    out
}

/// The native-dtype references (`regenerate_native.sh`): every mlx-written folder but the f32
/// ones (whose native dtype is f32, the references above).
pub fn native_sources() -> Vec<Source> {
    let mut out = Vec::new();
    for family in MLX_WRITTEN_FAMILIES {
        for format in FORMATS.iter().filter(|f| **f != Format::F32) {
            out.push(Source::MlxWrittenNative(format!(
                "{family}-{}",
                format.name()
            )));
        }
    }
    out
}

/// Reference files under `goldens/oracle/{mlx-written,synth}` that no source owns (left over
/// from a removed case).
pub fn orphans(root: &Path) -> Vec<PathBuf> {
    let known: Vec<PathBuf> = sources().iter().map(|s| s.reference_file(root)).collect();
    let mut out = Vec::new();
    for sub in ["mlx-written", "synth"] {
        let Ok(entries) = std::fs::read_dir(goldens_dir(root).join(sub)) else {
            continue;
        };
        out.extend(
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .filter(|p| !known.contains(p)),
        );
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_family_format_and_layout() {
        let specs: Vec<String> = synth_specs().iter().map(|s| s.to_string()).collect();
        assert_eq!(
            specs.len(),
            FAMILIES.len() * (FORMATS.len() + HF_FORMATS.len())
        );
        assert!(specs.contains(&"qwen3_5:tiny:bf16:hf".to_string()));
        assert!(specs.contains(&"qwen3:tiny:nvfp4:mlx".to_string()));
        assert_eq!(
            synth_file_name(&SynthSpec::parse("qwen3_5:tiny:q4").unwrap()),
            "qwen3_5-tiny-q4-mlx.json"
        );
    }
}

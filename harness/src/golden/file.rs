//! A golden on disk: one readable JSON file per case, written atomically; and the checkpoint
//! fingerprint that tells "the model changed" apart from "the numerics changed".

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What a golden records. Field order here is the order in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Golden {
    /// `SPEC/PATH/PROMPT`, as `--filter` matches it.
    pub case: String,
    /// The synthetic checkpoint, canonical `FAMILY:SIZE:FORMAT:LAYOUT`.
    pub synth: String,
    pub path: String,
    pub prompt: String,
    /// sha256 over the checkpoint folder's files (names and bytes, sorted by name).
    pub checkpoint_sha256: String,
    pub max_tokens: usize,
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// `generated_ids` decoded, special tokens kept.
    pub text: String,
    /// The engine that blessed this golden: version and git commit.
    pub engine_version: String,
}

impl Golden {
    /// Pretty JSON with one field per line and id lists kept on one line each, so a diff of a
    /// re-blessed golden shows which field moved.
    pub fn to_json(&self) -> Result<String> {
        let Value::Object(map) = serde_json::to_value(self)? else {
            unreachable!("a struct serialises to an object");
        };
        // serde_json's map sorts keys; the struct's declared order reads better.
        let order = [
            "case",
            "synth",
            "path",
            "prompt",
            "checkpoint_sha256",
            "max_tokens",
            "prompt_ids",
            "generated_ids",
            "text",
            "engine_version",
        ];
        debug_assert_eq!(order.len(), map.len());
        let mut s = String::from("{\n");
        for (i, key) in order.iter().enumerate() {
            let sep = if i + 1 == order.len() { "" } else { "," };
            s.push_str(&format!(
                "  \"{key}\": {}{sep}\n",
                serde_json::to_string(&map[*key])?
            ));
        }
        s.push_str("}\n");
        Ok(s)
    }

    pub fn read(file: &Path) -> Result<Golden> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a golden file", file.display()))
    }

    /// Writes to a temporary file beside `file`, then renames it into place, so a reader (or an
    /// interrupted bless) never sees half a golden.
    pub fn write_atomic(&self, file: &Path) -> Result<()> {
        let dir = file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("golden");
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(self.to_json()?.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, file)?;
            anyhow::Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.with_context(|| format!("writing {}", file.display()))
    }
}

/// sha256 over every file under `dir`, in sorted relative-path order; each file contributes its
/// relative path, its length and its bytes, so renames and moves change the hash too.
pub fn checkpoint_sha256(dir: &Path) -> Result<String> {
    let mut files = Vec::new();
    list_files(dir, dir, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for rel in &files {
        let path = dir.join(rel);
        let name = rel.to_string_lossy().replace('\\', "/");
        let mut f =
            std::fs::File::open(&path).with_context(|| format!("reading {}", path.display()))?;
        let len = f.metadata()?.len();
        h.update(name.as_bytes());
        h.update([0u8]);
        h.update(len.to_le_bytes());
        std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn list_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            list_files(root, &path, out)?;
        } else {
            out.push(path.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
    Ok(())
}

/// `VERSION (COMMIT)`: the workspace version (the engine shares it) and the git commit when
/// the source is a git checkout.
pub fn engine_version() -> String {
    let version = env!("CARGO_PKG_VERSION");
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(synth::workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty());
    match commit {
        Some(c) => format!("{version} ({c})"),
        None => version.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Golden {
        Golden {
            case: "qwen3:tiny:f32:hf/default/short".into(),
            synth: "qwen3:tiny:f32:hf".into(),
            path: "default".into(),
            prompt: "short".into(),
            checkpoint_sha256: "ab".into(),
            max_tokens: 3,
            prompt_ids: vec![1, 2],
            generated_ids: vec![3, 4, 5],
            text: "a \"quoted\"\nline".into(),
            engine_version: "0.1.0".into(),
        }
    }

    #[test]
    fn json_round_trips_with_ids_on_one_line() {
        let g = sample();
        let s = g.to_json().unwrap();
        assert!(s.contains("  \"generated_ids\": [3,4,5],\n"), "{s}");
        assert!(s.find("\"case\"").unwrap() < s.find("\"synth\"").unwrap());
        assert_eq!(serde_json::from_str::<Golden>(&s).unwrap(), g);
    }

    #[test]
    fn hash_covers_names_and_bytes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"xy").unwrap();
        std::fs::write(d.path().join("b"), b"z").unwrap();
        let h0 = checkpoint_sha256(d.path()).unwrap();
        assert_eq!(h0, checkpoint_sha256(d.path()).unwrap());
        std::fs::write(d.path().join("b"), b"w").unwrap();
        let h1 = checkpoint_sha256(d.path()).unwrap();
        assert_ne!(h0, h1);
        std::fs::rename(d.path().join("b"), d.path().join("c")).unwrap();
        assert_ne!(h1, checkpoint_sha256(d.path()).unwrap());
    }
}

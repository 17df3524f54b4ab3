//! `config.json` of a checkpoint folder: the model type, the text-model hyperparameters (nested
//! under `text_config` in multimodal checkpoints such as Qwen3.5) and the quantization block.

mod generation;
pub mod limits;
mod quant;

pub use generation::GenerationConfig;
pub use quant::QuantConfig;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// A parsed `config.json`. Models read their hyperparameters through the typed getters so a
/// missing or malformed field is reported with the file and field name.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub dir: PathBuf,
    pub model_type: String,
    /// The text-model object: `text_config` when present, else the root.
    pub text: Value,
    pub root: Value,
    pub quant: QuantConfig,
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        let root = read_json(&path)?;
        ModelConfig::from_value(dir, root)
    }

    /// Builds a config from an already-parsed `config.json` (used by synthetic checkpoints).
    pub fn from_value(dir: &Path, root: Value) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        if !root.is_object() {
            bail!(
                "{}: expected a JSON object at the top level",
                path.display()
            );
        }
        let text = match root.get("text_config") {
            None | Some(Value::Null) => root.clone(),
            Some(t @ Value::Object(_)) => t.clone(),
            Some(other) => bail!(
                "{}: field `text_config` must be an object, got {}",
                path.display(),
                short(other)
            ),
        };
        // The text model's type wins: a Qwen3.5 checkpoint says `qwen3_5` at the root and
        // `qwen3_5_text` inside; models are registered under the root's name, so prefer it.
        let model_type = match root.get("model_type").or_else(|| text.get("model_type")) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => bail!(
                "{}: field `model_type` must be a string, got {}",
                path.display(),
                short(other)
            ),
            None => bail!("{}: field `model_type` is missing", path.display()),
        };
        let quant = QuantConfig::from_root(&root, &path)?;
        Ok(ModelConfig {
            dir: dir.to_path_buf(),
            model_type,
            text,
            root,
            quant,
        })
    }

    /// `dir/config.json`, for error messages.
    pub fn path(&self) -> PathBuf {
        self.dir.join("config.json")
    }

    /// A field of the text config (falling back to the root for multimodal configs that keep
    /// some text fields at the top level); JSON `null` counts as absent.
    pub fn opt(&self, key: &str) -> Option<&Value> {
        self.text
            .get(key)
            .or_else(|| self.root.get(key))
            .filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> anyhow::Error {
        anyhow::anyhow!("{}: field `{key}` is missing", self.path().display())
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> anyhow::Error {
        anyhow::anyhow!(
            "{}: field `{key}` must be {want}, got {}",
            self.path().display(),
            short(got)
        )
    }

    /// A required non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.opt(key).ok_or_else(|| self.missing(key))?;
        as_usize(v).ok_or_else(|| self.wrong(key, "a non-negative integer", v))
    }

    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.opt(key) {
            None => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    /// A required number (integers are accepted).
    pub fn f64(&self, key: &str) -> Result<f64> {
        let v = self.opt(key).ok_or_else(|| self.missing(key))?;
        v.as_f64().ok_or_else(|| self.wrong(key, "a number", v))
    }

    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.opt(key) {
            None => Ok(default),
            Some(_) => self.f64(key),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.wrong(key, "true or false", v)),
        }
    }

    /// `layer_types` as one of `kinds` per layer, `None` when the config has no such field.
    pub fn layer_types<T: Copy>(
        &self,
        layers: usize,
        kinds: &[(&str, T)],
    ) -> Result<Option<Vec<T>>> {
        let Some(v) = self.opt("layer_types") else {
            return Ok(None);
        };
        let file = self.path();
        let Some(types) = v.as_array().filter(|t| t.len() == layers) else {
            anyhow::bail!(
                "{}: field `layer_types` must be a list of {layers} layer kinds",
                file.display()
            );
        };
        let names: Vec<&str> = kinds.iter().map(|k| k.0).collect();
        types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let kind = kinds.iter().find(|k| Some(k.0) == t.as_str());
                kind.map(|k| k.1).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: field `layer_types[{i}]` = {} is not a layer kind ({})",
                        file.display(),
                        short(t),
                        names.join(", ")
                    )
                })
            })
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }

    /// `eos_token_id` as an int or a list, from the text config or the root; entries that are
    /// not token ids are ignored (generation_config.json and the tokenizer add theirs too).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let mut ids = Vec::new();
        for obj in [&self.text, &self.root] {
            if let Some(v) = obj.get("eos_token_id") {
                for id in token_id_list(v) {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        ids
    }
}

/// Reads and parses a JSON file, naming it in every error.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = crate::files::read_text(path, crate::files::MAX_CONFIG_BYTES)?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

pub(crate) fn as_usize(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

/// Token ids from a JSON int or list of ints; other entries are skipped.
pub(crate) fn token_id_list(v: &Value) -> Vec<u32> {
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Value::Array(items) => items.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    }
}

/// A JSON value for an error message, cut short so a huge array does not flood the terminal.
pub(crate) fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

//! `generation_config.json`: sampling defaults and extra stop tokens. A request's value wins
//! over these, and these over the built-in defaults; the eos list adds to the stop set.

use std::path::Path;

use anyhow::{anyhow, Result};
use serde_json::Value;

use super::{read_json, short};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub max_new_tokens: Option<usize>,
    pub do_sample: Option<bool>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a missing file gives the empty defaults.
    pub fn load(dir: &Path) -> Result<GenerationConfig> {
        let path = dir.join("generation_config.json");
        if !crate::files::exists(&path) {
            return Ok(GenerationConfig::default());
        }
        let root = read_json(&path)?;
        let obj = root.as_object().ok_or_else(|| {
            anyhow!(
                "{}: expected a JSON object at the top level",
                path.display()
            )
        })?;
        let get = |key: &str| obj.get(key).filter(|v| !v.is_null());
        let wrong = |key: &str, want: &str, v: &Value| {
            anyhow!(
                "{}: field `{key}` must be {want}, got {}",
                path.display(),
                short(v)
            )
        };
        // Checked here, where the file can be named; the sampler checks a request's own values.
        let float = |key: &str, want: &str, ok: fn(f64) -> bool| -> Result<Option<f32>> {
            get(key)
                .map(|v| {
                    v.as_f64()
                        .filter(|x| x.is_finite() && ok(*x))
                        .map(|x| x as f32)
                        .ok_or_else(|| wrong(key, want, v))
                })
                .transpose()
        };
        let uint = |key: &str| -> Result<Option<usize>> {
            get(key)
                .map(|v| super::as_usize(v).ok_or_else(|| wrong(key, "a non-negative integer", v)))
                .transpose()
        };
        let eos_token_ids = match get("eos_token_id") {
            None => Vec::new(),
            Some(v) => parse_ids(v)
                .ok_or_else(|| wrong("eos_token_id", "a token id or a list of token ids", v))?,
        };
        Ok(GenerationConfig {
            eos_token_ids,
            temperature: float("temperature", "a number >= 0", |t| t >= 0.0)?,
            top_k: uint("top_k")?,
            top_p: float("top_p", "a number in (0, 1]", |p| p > 0.0 && p <= 1.0)?,
            // transformers spells it `max_new_tokens`; older files only have `max_length`,
            // which counts the prompt too, so it is not a substitute.
            max_new_tokens: uint("max_new_tokens")?,
            do_sample: get("do_sample")
                .map(|v| {
                    v.as_bool()
                        .ok_or_else(|| wrong("do_sample", "true or false", v))
                })
                .transpose()?,
        })
    }
}

/// Strict version of the id list: every entry must be a u32.
fn parse_ids(v: &Value) -> Option<Vec<u32>> {
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Value::Array(items) => items.iter().map(one).collect(),
        other => one(other).map(|id| vec![id]),
    }
}

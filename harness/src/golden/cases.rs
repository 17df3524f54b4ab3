//! The golden matrix: family × weight format × path × prompt, one table. Adding a family or a
//! path is one line in [`MATRIX`]; adding a prompt is one entry in [`PROMPTS`].

use std::fmt;

use anyhow::{bail, Result};
use engine::Pipeline;

use crate::paths::{parse_path, PathSpec};
use synth::families;
use synth::{Format, Size, SynthSpec};

/// Tokens generated per case (T=0, stop tokens ignored, so every case produces exactly this many).
pub const MAX_TOKENS: usize = 24;

/// One row of the matrix: a family on `tiny` checkpoints in each format, run on each path.
pub struct Row {
    pub family: &'static str,
    pub formats: &'static [Format],
    pub paths: &'static [&'static str],
}

pub const MATRIX: &[Row] = &[
    Row {
        family: "qwen3",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "qwen3_5",
        formats: Format::ALL,
        paths: &["gdn=perstep", "gdn=chunked"],
    },
    Row {
        family: "qwen3_5_moe",
        formats: Format::ALL,
        paths: &["gdn=perstep", "gdn=chunked"],
    },
    // Speculative decoding with the MTP head, which only the original (float) folders keep.
    Row {
        family: "qwen3_5",
        formats: &[Format::F32, Format::Bf16],
        paths: &["mtp=2"],
    },
    Row {
        family: "qwen3_5_moe",
        formats: &[Format::F32],
        paths: &["mtp=3"],
    },
    // Paged KV (full-attention layers in blocks of 16): an attention-only family, the Gated
    // DeltaNet hybrid, the conv hybrid, and Gemma 4 (paged full layers beside rotating ones).
    // Batches (the case's request among companions that join and leave around it) and
    // sessions (the case's prompt as the second turn, its first half cached by the first).
    Row {
        family: "qwen3",
        formats: &[Format::Bf16, Format::Q4],
        paths: &["kv=paged", "batch=8", "session=reuse"],
    },
    Row {
        family: "qwen3_5",
        formats: &[Format::F32],
        paths: &["kv=paged", "batch=4+kv=paged", "session=reuse"],
    },
    Row {
        family: "lfm2",
        formats: &[Format::Q4],
        paths: &["kv=paged", "batch=3"],
    },
    Row {
        family: "gemma4",
        formats: &[Format::F32],
        paths: &["kv=paged", "session=reuse"],
    },
    // The `fast` numerics, their own goldens: on the CPU int8 activations against 4-bit
    // weights and bf16 activations against bf16 weights (the same on every ISA); on MLX the
    // stored dtypes (mlx-lm's native bf16). No sparse MoE row: under `fast` a last-bit
    // difference elsewhere (f32 GEMM on x86 vs aarch64) flips an expert choice, so its tokens
    // are not the same across architectures.
    Row {
        family: "qwen3",
        formats: &[Format::Q4, Format::Bf16],
        paths: &["numerics=fast", "batch=4+numerics=fast"],
    },
    Row {
        family: "qwen3_5",
        formats: &[Format::Bf16],
        paths: &["gdn=chunked+numerics=fast"],
    },
    Row {
        family: "qwen3_5",
        formats: &[Format::Q4],
        paths: &["gdn=chunked+numerics=fast"],
    },
    Row {
        family: "lfm2",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "lfm2_moe",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "llama",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "qwen2",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "gemma3",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "minicpm",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "gemma4",
        formats: Format::ALL,
        paths: &["default"],
    },
    Row {
        family: "gemma4_moe",
        formats: Format::ALL,
        paths: &["default"],
    },
];

/// A fixed prompt: `text` encoded by the checkpoint's tokenizer (no chat template), repeated
/// until it reaches `tokens` ids and cut there, or used as encoded when `tokens` is `None`.
pub struct Prompt {
    pub name: &'static str,
    pub text: &'static str,
    pub tokens: Option<usize>,
}

pub const PROMPTS: &[Prompt] = &[
    Prompt {
        name: "short",
        text: "The engineers measured how long the engine took to answer, and wrote it down.",
        tokens: None,
    },
    // Longer than the Gated DeltaNet chunk (64) and not a multiple of it, so chunked prefill
    // runs two full chunks and a padded tail.
    Prompt {
        name: "long",
        text: "A lighthouse keeper kept a notebook of every ship that passed the point: the hour, \
               the wind, the colour of the hull and the name painted on the bow when the light \
               allowed him to read it. Over forty winters the notebook grew into a shelf of them, \
               and the harbour office came to trust his shelf more than its own ledgers. ",
        tokens: Some(150),
    },
];

impl Prompt {
    /// The prompt's ids under `pipeline`'s tokenizer.
    pub fn ids(&self, pipeline: &Pipeline) -> Result<Vec<u32>> {
        let once = pipeline.tokenizer.encode(self.text, true)?;
        let Some(n) = self.tokens else {
            return Ok(once);
        };
        if once.is_empty() {
            bail!("golden prompt `{}` encodes to no tokens", self.name);
        }
        Ok(once.iter().copied().cycle().take(n).collect())
    }
}

/// One golden: a synthetic checkpoint, a path and a prompt.
pub struct Case {
    pub spec: SynthSpec,
    pub path: PathSpec,
    pub prompt: &'static Prompt,
}

impl Case {
    /// `SPEC/PATH/PROMPT`, e.g. `qwen3:tiny:q4:mlx/default/short`; what `--filter` matches.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.spec, self.path, self.prompt.name)
    }

    /// The golden's file name: the id with only `[A-Za-z0-9_.-]`, e.g.
    /// `qwen3-tiny-q4-mlx.default.short.json`.
    pub fn file_name(&self) -> String {
        let clean = |s: String| {
            s.replace([':', '@'], "-")
                .replace('=', "-")
                .replace('+', "_")
        };
        format!(
            "{}.{}.{}.json",
            clean(self.spec.to_string()),
            clean(self.path.to_string()),
            self.prompt.name
        )
    }

    /// Whether the case belongs to `backend`'s goldens: a `numerics` path selects the CPU
    /// kernels' arithmetic and MLX's dtypes; CUDA has one arithmetic, so no `numerics` cases.
    pub fn runs_on(&self, backend: engine::Backend) -> bool {
        backend != engine::Backend::Cuda || self.path.numerics.is_none()
    }

    /// Whether `filter` (a substring; empty or `None` matches all) selects this case, by id or
    /// by file name.
    pub fn matches(&self, filter: Option<&str>) -> bool {
        match filter {
            None | Some("") => true,
            Some(f) => self.id().contains(f) || self.file_name().contains(f),
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

/// The cases `filter` selects, in table order, and one note per matrix row skipped because the
/// synthesiser does not know its family yet.
pub fn cases(filter: Option<&str>) -> Result<(Vec<Case>, Vec<String>)> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for row in MATRIX {
        if families::find(row.family).is_err() {
            skipped.push(format!(
                "family {} (harness synth cannot write it yet)",
                row.family
            ));
            continue;
        }
        for &format in row.formats {
            let spec = SynthSpec::new(row.family, Size::Tiny, format);
            for path in row.paths {
                let path = parse_path(path)?;
                for prompt in PROMPTS {
                    let case = Case {
                        spec: spec.clone(),
                        path,
                        prompt,
                    };
                    if case.matches(filter) {
                        out.push(case);
                    }
                }
            }
        }
    }
    Ok((out, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_file_names_are_unique_and_filterable() {
        let (all, _) = cases(None).unwrap();
        let mut names: Vec<String> = all.iter().map(Case::file_name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(names.iter().all(|n| n
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))));
        let (q4, _) = cases(Some("qwen3:tiny:q4")).unwrap();
        assert!(
            q4.iter().all(|c| c.id().starts_with("qwen3:tiny:q4:")),
            "only qwen3 (not qwen3_5) in q4"
        );
        let (q4, _) = cases(Some("qwen3:tiny:q4:mlx/default")).unwrap();
        assert_eq!(q4.len(), PROMPTS.len(), "one path");
        assert_eq!(q4[0].file_name(), "qwen3-tiny-q4-mlx.default.short.json");
    }
}

//! Where the harness gets its models: a folder the user names, or a synthetic checkpoint made
//! on the fly from a `FAMILY[:SIZE[:FORMAT[:LAYOUT]]]` spec (cached by the `synth` crate).

use std::path::{Path, PathBuf};

use anyhow::Result;
use synth::SynthSpec;

/// `--model DIR` or `--synth SPEC`, resolved to a folder.
pub fn resolve(model: Option<&Path>, synth: Option<&str>) -> Result<PathBuf> {
    match (model, synth) {
        (Some(dir), None) => Ok(dir.to_path_buf()),
        (None, Some(spec)) => synth::cached(&SynthSpec::parse(spec)?),
        _ => anyhow::bail!(
            "give exactly one of --model DIR or --synth SPEC (e.g. --synth qwen3:tiny:q4)"
        ),
    }
}

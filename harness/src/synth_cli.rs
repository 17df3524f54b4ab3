//! `harness synth`: the command-line face of [`synth::write_checkpoint`].

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use synth::{families, write_checkpoint, Format, Layout, Size, SynthSpec, WriteOptions};

/// Write a synthetic checkpoint folder (deterministic from the seed; no download).
///
/// The folder holds config.json, generation_config.json, tokenizer.json, tokenizer_config.json
/// and model.safetensors (or shards plus model.safetensors.index.json), loadable by the engine,
/// transformers and mlx-lm. The same arguments always give byte-identical files, on any machine
/// and thread count.
///
/// Examples:
///   harness synth --family qwen3 --size tiny --format f32 --out /tmp/qwen3-tiny
///   harness synth --family qwen3 --size bench --format q4 --seed 7 --out models/qwen3-bench-q4
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SynthArgs {
    /// Model family (see the list at the end of --help).
    #[arg(long, default_value = "qwen3")]
    pub family: String,

    /// Model widths.
    #[arg(long, value_enum, default_value = "tiny")]
    pub size: Size,

    /// Weight format. Quantized formats quantize every Linear and the embedding (when the input
    /// width is a multiple of the group) like mlx-lm, and store the rest in bfloat16.
    #[arg(long, value_enum, default_value = "f32")]
    pub format: Format,

    /// Tensor-name layout [default: mlx for quantized formats, hf otherwise].
    #[arg(long, value_enum)]
    pub layout: Option<Layout>,

    /// Seed of every weight value (the tokenizer is the same for every seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Output folder; written atomically (built next to it, then renamed into place).
    #[arg(long)]
    pub out: PathBuf,

    /// Start a new safetensors shard after this many MiB of tensor data.
    #[arg(long, default_value_t = 2048, value_name = "MB")]
    pub max_shard_mb: u64,

    /// Replace the output folder if it is not empty.
    #[arg(long)]
    pub force: bool,
}

/// The families, for the end of `--help`.
pub fn families_help() -> String {
    let mut s = String::from("Families:\n");
    for f in families::all() {
        s.push_str(&format!("  {:<10} {}\n", f.name(), f.about()));
    }
    s
}

impl SynthArgs {
    pub fn run(self) -> Result<()> {
        let spec = SynthSpec {
            family: self.family,
            size: self.size,
            format: self.format,
            layout: self.layout,
            seed: self.seed,
        };
        let opts = WriteOptions {
            max_shard_bytes: self.max_shard_mb.saturating_mul(1 << 20),
            force: self.force,
            progress: true,
        };
        let start = std::time::Instant::now();
        let w = write_checkpoint(&spec, &self.out, &opts)?;
        eprintln!(
            "wrote {spec} to {} ({} files, {:.1} MiB) in {:.1}s",
            w.dir.display(),
            w.files.len(),
            w.bytes as f64 / (1 << 20) as f64,
            start.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

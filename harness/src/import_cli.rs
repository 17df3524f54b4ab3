//! `harness import-gguf`: the command-line face of [`engine::gguf::import`].

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use engine::gguf::import::{import, OutDtype, TokenizerSource};
use engine::gguf::GgufFile;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Dtype {
    Bf16,
    F32,
}

/// Turn a GGUF file into a Hugging Face-layout checkpoint folder the engine loads.
///
/// Reads the file's metadata and tensors (llama, qwen2, qwen3 and gemma3 architectures),
/// dequantizes every tensor (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
/// and undoes llama.cpp's conversions (Llama's q/k row permutation, Gemma's norm offset).
/// Writes config.json, generation_config.json, tokenizer_config.json (with the file's chat
/// template and special tokens; a gemma3 file without one gets Gemma's turn format) and
/// model.safetensors; tokenizer.json comes from --tokenizer, else is rebuilt from the file's
/// vocabulary as transformers rebuilds it: byte-level BPE (gpt2, smollm and qwen2
/// pre-tokenizers) or Gemma's SentencePiece. OUT_DIR must not exist, and nothing is left there
/// when the import fails.
///
/// Examples:
///   harness import-gguf smollm2.gguf models/smollm2 --tokenizer ~/tokenizers/smollm2
///   harness import-gguf model.gguf models/m --dtype f32
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ImportArgs {
    /// The GGUF file.
    pub input: PathBuf,
    /// The folder to write (must not exist).
    pub out_dir: PathBuf,
    /// Dtype of the written matrices (norm gains and biases are f32 either way).
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: Dtype,
    /// A folder whose tokenizer.json (and tokenizer_config.json settings) the import takes.
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
}

impl ImportArgs {
    pub fn run(self) -> Result<()> {
        let g = GgufFile::open(&self.input)?;
        let dtype = match self.dtype {
            Dtype::Bf16 => OutDtype::Bf16,
            Dtype::F32 => OutDtype::F32,
        };
        let source = import(&g, &self.out_dir, dtype, self.tokenizer.as_deref())?;
        let tokenizer = match source {
            TokenizerSource::Given => "tokenizer.json copied".to_string(),
            TokenizerSource::Rebuilt => "tokenizer.json rebuilt from the GGUF vocabulary".into(),
            TokenizerSource::Missing(why) => format!("no tokenizer.json ({why})"),
        };
        println!(
            "wrote {} ({} tensors; {tokenizer})",
            self.out_dir.display(),
            g.tensors.len()
        );
        Ok(())
    }
}

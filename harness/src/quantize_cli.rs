//! `harness quantize`: a float checkpoint folder rewritten in MLX's affine quantized layout by
//! the engine's own quantizer ([`kernels::quant::quantize`], checked against MLX's), laid out
//! as `mlx_lm.convert -q` lays out its output, so that mlx-lm and the engine both load it.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use engine::weights::safetensors::{write, OwnedTensor};
use engine::weights::WeightStore;
use kernels::{DType, QuantMode, QuantSpec};

/// Quantize a float checkpoint folder (f32, bf16 or f16) to MLX's affine layout.
///
/// Every 2-D `*.weight` whose rows are a whole number of groups (the Linear layers and the
/// embedding; norms are 1-D) becomes `weight` (packed uint32), `scales` and `biases`, the
/// scales and biases in the dtype the weight had (so an f32 folder gives f32 scales, as
/// `mlx_lm.convert` gives for an f32 model); every other tensor is copied as it is.
/// config.json gains `quantization` and `quantization_config` as mlx-lm writes them; the
/// tokenizer and the other files are copied. OUT_DIR must not exist, and nothing is left
/// there when quantizing fails.
///
/// Examples:
///   harness quantize models/smollm2 models/smollm2-q4
///   harness quantize models/smollm2 models/smollm2-q8 --bits 8
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct QuantizeArgs {
    /// The float checkpoint folder.
    pub input: PathBuf,
    /// The folder to write (must not exist).
    pub out_dir: PathBuf,
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    #[arg(long, default_value_t = 4)]
    pub bits: usize,
    /// Weights per group, each with its own scale and bias: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    pub group_size: usize,
}

impl QuantizeArgs {
    pub fn run(self) -> Result<()> {
        let spec =
            QuantSpec::new(QuantMode::Affine, self.bits, self.group_size).with_context(|| {
                format!(
                    "--bits {} --group-size {}: bits 2, 3, 4, 5, 6 or 8 in groups of 32, 64 or 128",
                    self.bits, self.group_size
                )
            })?;
        let n = quantize_folder(&self.input, &self.out_dir, spec, true)?;
        println!(
            "wrote {} ({n} matrices quantized to {} bits in groups of {})",
            self.out_dir.display(),
            self.bits,
            self.group_size
        );
        Ok(())
    }
}

/// Writes `input` quantized to `out` (which must not exist; nothing is left there on
/// failure). Returns how many matrices were quantized.
pub fn quantize_folder(input: &Path, out: &Path, spec: QuantSpec, progress: bool) -> Result<usize> {
    engine::files::write_new_folder(out, "quantizing", |tmp| {
        write_quantized(input, tmp, spec, progress)
    })
    .with_context(|| format!("quantizing {}", input.display()))
}

fn write_quantized(input: &Path, dir: &Path, spec: QuantSpec, progress: bool) -> Result<usize> {
    let config_path = input.join("config.json");
    let mut config: Value = serde_json::from_str(
        &fs::read_to_string(&config_path)
            .with_context(|| format!("{}: cannot read", config_path.display()))?,
    )
    .with_context(|| format!("{}: not valid JSON", config_path.display()))?;
    if let Some(q) = config.get("quantization") {
        bail!(
            "{}: `quantization` is already set ({q}); quantize a float folder",
            config_path.display()
        );
    }
    let store = WeightStore::open(input)?;
    fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    copy_other_files(input, dir)?;

    let mut names = store.names();
    names.sort();
    let bar = if progress {
        ProgressBar::new(names.len() as u64).with_style(
            ProgressStyle::with_template("quantizing [{bar:40}] {pos}/{len} tensors ({eta})")
                .expect("the template is valid")
                .progress_chars("=> "),
        )
    } else {
        ProgressBar::hidden()
    };
    let mut stored: Vec<OwnedTensor> = Vec::new();
    let mut quantized = 0;
    for name in &names {
        let (dtype, shape) = store
            .info(name)
            .map(|(d, s)| (d, s.to_vec()))
            .with_context(|| format!("`{name}` is listed but not stored"))?;
        let t = store.tensor(name)?;
        let matrix = name.ends_with(".weight")
            && shape.len() == 2
            && shape[1].is_multiple_of(spec.group_size)
            && matches!(dtype, DType::F32 | DType::BF16 | DType::F16);
        if !matrix {
            stored.push((name.clone(), dtype, shape, t.raw_bytes()?.to_vec()));
            bar.inc(1);
            continue;
        }
        let values = t.to_vec_f32()?;
        let q = kernels::quant::quantize(&values, shape[0], shape[1], spec, dtype)
            .with_context(|| format!("quantizing `{name}` ({}x{})", shape[0], shape[1]))?;
        let prefix = name.trim_end_matches(".weight");
        let parts = [("weight", Some(&q.packed)), ("scales", Some(&q.scales))]
            .into_iter()
            .chain([("biases", q.biases.as_ref())]);
        for (part, t) in parts {
            let Some(t) = t else { continue };
            stored.push((
                format!("{prefix}.{part}"),
                t.dtype(),
                t.shape().to_vec(),
                t.raw_bytes()?.to_vec(),
            ));
        }
        quantized += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    ensure!(
        quantized > 0,
        "{}: no 2-D float `*.weight` whose rows hold whole groups of {}; nothing to quantize",
        input.display(),
        spec.group_size
    );

    write(&dir.join("model.safetensors"), &stored, "mlx")?;

    let block = json!({"group_size": spec.group_size, "bits": spec.bits, "mode": "affine"});
    let obj = config
        .as_object_mut()
        .with_context(|| format!("{}: not a JSON object", config_path.display()))?;
    obj.insert("quantization".into(), block.clone());
    obj.insert("quantization_config".into(), block);
    fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config)? + "\n",
    )?;
    Ok(quantized)
}

/// Copies every file of `input` but the weights and config.json (tokenizer, chat template,
/// generation config).
fn copy_other_files(input: &Path, dir: &Path) -> Result<()> {
    for e in fs::read_dir(input).with_context(|| format!("{}: cannot list", input.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let weights = name.ends_with(".safetensors") || name == "model.safetensors.index.json";
        if weights || name == "config.json" || !e.file_type()?.is_file() {
            continue;
        }
        fs::copy(e.path(), dir.join(&name))
            .with_context(|| format!("copying {}", e.path().display()))?;
    }
    Ok(())
}

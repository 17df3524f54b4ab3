//! `engine`: run a checkpoint folder from the command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use engine::layers::GdnPath;
use engine::{generate, Backend, Pipeline, RequestOptions};

#[derive(Parser)]
#[command(
    name = "engine",
    version,
    about = "Run LLM checkpoint folders (Hugging Face or MLX layout, dense or quantized) on the CPU or MLX.",
    long_about = "Run LLM checkpoint folders (Hugging Face or MLX layout, dense or quantized).\n\n\
A model folder holds config.json, tokenizer.json, tokenizer_config.json, optional\n\
generation_config.json and model.safetensors (or shards with model.safetensors.index.json).\n\
Make a synthetic one with `harness synth --family qwen3 --size tiny --format bf16 --seed 1 --out DIR`."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a continuation of a prompt.
    #[command(after_help = "Examples:\n  \
engine generate --model DIR --prompt \"Hello\" --max-tokens 32\n  \
engine generate --model DIR --prompt \"Why is the sky blue?\" --chat --temperature 0.7 --seed 3\n  \
engine generate --model DIR --prompt-ids 1,2,3 --max-tokens 8 --top-logprobs 5 --json")]
    Generate(GenerateArgs),
    /// Describe a checkpoint: family, parameters, weight formats, layer kinds, context length.
    Info {
        /// The checkpoint folder.
        #[arg(long)]
        model: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct GenerateArgs {
    /// The checkpoint folder.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (encoded with the folder's tokenizer).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, bypassing the tokenizer.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as a user message in the folder's chat template (with --prompt only:
    /// ids given with --prompt-ids go to the model as they are).
    #[arg(long, requires = "prompt", conflicts_with = "prompt_ids")]
    chat: bool,
    /// Most tokens to generate [default: generation_config's max_new_tokens, else 128].
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Sampling temperature; 0 is greedy [default: generation_config's, else 0].
    #[arg(long)]
    temperature: Option<f32>,
    /// Keep only the k most likely tokens; 0 keeps all [default: generation_config's, else 0].
    #[arg(long)]
    top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p [default: generation_config's, else 1].
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed of the sampler (same seed, same tokens).
    #[arg(long)]
    seed: Option<u64>,
    /// Compute backend: `cpu` (always built); `mlx`, MLX's default device (the GPU on a Mac or
    /// with MLX's CUDA wheel, the CPU elsewhere; build with `--features mlx`); `metal`, MLX on
    /// the Metal GPU with the Metal kernels (macOS, `--features metal`); `cuda`, the native
    /// CUDA backend on an NVIDIA GPU (build with `--features cuda`).
    #[arg(long, value_name = "cpu|mlx|metal|cuda", default_value = "cpu", value_parser = parse_backend)]
    backend: Backend,
    /// Also report the K best [token_id, logprob] pairs of every generated step.
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Prefill the prompt in pieces of at most N tokens (default: all at once).
    #[arg(long)]
    prefill_step: Option<usize>,
    /// Keep generating past stop tokens, up to --max-tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Gated DeltaNet path: `auto` (chunked for forwards of 64+ tokens, per step otherwise),
    /// `perstep`, or `chunked` (every multi-token forward) [default: $GDN_KERNEL, else auto].
    #[arg(long, value_name = "auto|perstep|chunked", value_parser = parse_gdn)]
    gdn: Option<GdnPath>,
    /// Keep every position in the KV caches of sliding-window layers (masking to the window)
    /// instead of rotating them; for comparisons, since it only costs memory.
    #[arg(long)]
    flat_kv: bool,
    /// Speculative decoding: the checkpoint's own MTP head (Qwen3.5 original folders) drafts D
    /// tokens (1-4) that the model verifies in one forward. Greedy output is unchanged and
    /// sampled output keeps the model's distribution (speculative sampling); it is only faster
    /// when drafts are accepted. --json adds the acceptance figures under `mtp`.
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u8).range(1..=4))]
    mtp: Option<u8>,
    /// Testing and benchmarking: instead of the head's drafts, use the plain greedy output's
    /// own tokens (`correct`), wrong ones (`wrong`), or the first K correct and the rest wrong
    /// (`first=K`); runs plain decoding first to know them.
    #[arg(
        long,
        value_name = "correct|wrong|first=K",
        requires = "mtp",
        hide = true
    )]
    mtp_force: Option<String>,
    /// Print one JSON object (prompt_ids, tokens, text, finish_reason, timings[, top_logprobs]).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Generate(a) => run_generate(a),
        Cmd::Info { model, json } => run_info(model, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_generate(a: GenerateArgs) -> Result<()> {
    // Before the (slow) load, so a backend this build lacks or a bad GDN_KERNEL fails fast.
    a.backend.require()?;
    let gdn_path = GdnPath::resolve(a.gdn)?;
    let p = Pipeline::load_on(&a.model, a.backend)?;
    let prompt_ids = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => p.encode_prompt(text, a.chat)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let opts = RequestOptions {
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        top_logprobs: a.top_logprobs,
        prefill_step: a.prefill_step,
        ignore_eos: a.ignore_eos,
        gdn_path: Some(gdn_path),
        flat_kv: a.flat_kv,
        mtp: None,
    };
    let mut req = p.request(prompt_ids, &opts);
    if let Some(depth) = a.mtp {
        let depth = depth as usize;
        let forced = match a.mtp_force.as_deref() {
            None => None,
            Some(how) => {
                let correct = match how {
                    "correct" => depth,
                    "wrong" => 0,
                    _ => match how.strip_prefix("first=").map(str::parse::<usize>) {
                        Some(Ok(k)) if k <= depth => k,
                        _ => bail!("--mtp-force takes correct, wrong or first=K with K <= {depth}, got {how:?}"),
                    },
                };
                // The plain greedy output is the reference the forced drafts copy.
                let plain = generate::generate(p.model.as_ref(), &req, |_| {})?;
                Some(generate::ForcedDrafts {
                    reference: plain.tokens,
                    correct,
                })
            }
        };
        req.mtp = Some(generate::MtpOptions { depth, forced });
    }
    let mut streamed = String::new();
    let mut so_far = Vec::new();
    let out = generate::generate(p.model.as_ref(), &req, |tok| {
        if a.json {
            return;
        }
        so_far.push(tok);
        // Print only whole characters: a token may end inside a multi-byte character.
        if let Ok(text) = p.tokenizer.decode(&so_far, true) {
            if !text.ends_with('\u{FFFD}') && text.starts_with(&streamed) {
                print!("{}", &text[streamed.len()..]);
                let _ = std::io::stdout().flush();
                streamed = text;
            }
        }
    })?;
    let text = p.tokenizer.decode(&out.tokens, true)?;
    if a.json {
        let mut v = serde_json::to_value(&out)?;
        v["text"] = serde_json::Value::String(text);
        println!("{}", serde_json::to_string(&v)?);
    } else {
        if text.starts_with(&streamed) {
            print!("{}", &text[streamed.len()..]);
        }
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {:?}; TTFT {:.1} ms, prefill {:.1} tok/s, decode {:.1} tok/s; KV cache {:.1} MiB]",
            out.prompt_ids.len(),
            out.tokens.len(),
            out.finish_reason,
            out.ttft_ms,
            out.prefill_tokens_per_s,
            out.decode_tokens_per_s,
            out.kv_cache_bytes as f64 / (1024.0 * 1024.0)
        );
        if let Some(m) = &out.mtp {
            eprintln!(
                "[mtp {}: {} of {} drafts accepted ({:.0}%), {:.2} per round over {} rounds, {} replays]",
                m.depth,
                m.accepted,
                m.drafted,
                100.0 * m.acceptance_rate,
                m.mean_accepted_length,
                m.rounds,
                m.replays
            );
        }
    }
    Ok(())
}

fn parse_gdn(s: &str) -> std::result::Result<GdnPath, String> {
    s.parse()
}

fn parse_backend(s: &str) -> std::result::Result<Backend, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

fn run_info(model: PathBuf, json: bool) -> Result<()> {
    let cfg = engine::config::ModelConfig::load(&model)?;
    let store = engine::weights::WeightStore::open(&model)?;
    let m = engine::models::load(&model).with_context(|| format!("loading {}", model.display()))?;
    let info = m.info();
    if json {
        let mut v = serde_json::to_value(info)?;
        v["weight_bytes"] = store.total_bytes().into();
        v["model_type"] = cfg.model_type.clone().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for k in &info.layer_kinds {
        match kinds.last_mut() {
            Some((last, n)) if last == k => *n += 1,
            _ => kinds.push((k.clone(), 1)),
        }
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
    println!("folder:          {}", model.display());
    println!(
        "family:          {} (model_type {})",
        info.family, cfg.model_type
    );
    println!(
        "parameters:      {} ({:.3} B)",
        info.parameters,
        info.parameters as f64 / 1e9
    );
    println!("weight formats:  {}", info.weight_formats.join(", "));
    println!(
        "weight bytes:    {:.1} MiB in {} file(s)",
        store.total_bytes() as f64 / (1 << 20) as f64,
        store.files().len()
    );
    println!(
        "layers:          {} ({})",
        info.layer_kinds.len(),
        kinds.join(", ")
    );
    println!("hidden size:     {}", info.hidden_size);
    println!("vocab size:      {}", info.vocab_size);
    println!("context length:  {}", info.context_length);
    if let Some(m) = &info.moe {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        println!(
            "experts:         {} per layer, {} routed per token, width {}; shared expert width {}",
            m.experts, m.experts_per_token, m.expert_width, m.shared_expert_width
        );
        println!(
            "active params:   {} of {} per token ({:.1}%)",
            m.active_parameters,
            info.parameters,
            100.0 * m.active_parameters as f64 / info.parameters.max(1) as f64
        );
        println!(
            "decode reads:    {:.1} of {:.1} MiB of weights per token",
            mib(m.active_weight_bytes),
            mib(m.weight_bytes)
        );
    }
    Ok(())
}

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
    /// Chat in the terminal through the folder's chat template: one line is one user message;
    /// the answer streams as it is generated. The cache is kept across turns, so each turn
    /// prefills only the new part of the conversation.
    #[command(after_help = "Commands inside the chat:\n  \
/reset   forget the conversation (and the cache)\n  \
/exit    leave (so does end of input, Ctrl-D)\n\n\
Examples:\n  \
engine chat --model DIR\n  \
engine chat --model DIR --system \"Answer briefly.\" --temperature 0.7 --seed 1\n  \
printf 'Hi\\nWhat did I say?\\n' | engine chat --model DIR --max-tokens 32")]
    Chat(ChatArgs),
    /// Serve the checkpoint over HTTP with the OpenAI API: POST /v1/chat/completions and
    /// /v1/completions (streamed as server-sent events with "stream": true), GET /v1/models,
    /// /health and /metrics (Prometheus). Requests share one continuously batched decode and
    /// reuse cached prompt prefixes; the request flags below are the defaults a request
    /// overrides. SIGTERM or Ctrl-C lets the requests in flight finish, then exits.
    #[cfg(feature = "serve")]
    #[command(after_help = "Examples:\n  \
engine serve --model DIR\n  \
engine serve --model DIR --port 0 --max-concurrent 16 --max-queue 256\n  \
curl -s localhost:8080/v1/chat/completions -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 16}'")]
    Serve(ServeArgs),
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
        conflicts_with_all = ["prompt_ids", "prompts"],
        required_unless_present_any = ["prompt_ids", "prompts"]
    )]
    prompt: Option<String>,
    /// A file of prompts, one JSON object per line: {"prompt": "Hi"} or {"prompt_ids": [1, 2]},
    /// optionally with "chat", "max_tokens", "temperature", "top_k", "top_p", "seed" (the
    /// command line's values otherwise). They run as one batch (continuous batching:
    /// finished sequences leave, waiting ones join), each with the result it gets alone;
    /// --json prints one line per prompt, in file order. With --mtp each sequence runs its own
    /// speculative rounds beside the batch's step.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt_ids", "top_logprobs"])]
    prompts: Option<PathBuf>,
    /// Sequences decoding together at most, with --prompts.
    #[arg(long, default_value_t = 8, requires = "prompts", value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_batch: u32,
    /// Prompt as comma-separated token ids, bypassing the tokenizer.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as a user message in the folder's chat template (with --prompt only:
    /// ids given with --prompt-ids go to the model as they are).
    #[arg(long, requires = "prompt", conflicts_with = "prompt_ids")]
    chat: bool,
    #[command(flatten)]
    run: RunArgs,
    /// Also report the K best [token_id, logprob] pairs of every generated step.
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Prefill the prompt in pieces of at most N tokens (default: all at once).
    #[arg(long)]
    prefill_step: Option<usize>,
    /// Keep generating past stop tokens, up to --max-tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Speculative decoding: the checkpoint's own MTP head (Qwen3.5 original folders) drafts D
    /// tokens (1-4) that the model verifies in one forward. Greedy output is unchanged and
    /// sampled output keeps the model's distribution (speculative sampling); it is only faster
    /// when drafts are accepted. --json adds the acceptance figures under `mtp`.
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u8).range(1..=4))]
    mtp: Option<u8>,
    #[command(flatten)]
    draft_vocab: DraftVocabArg,
    /// Testing and benchmarking: instead of the head's drafts, use the plain greedy output's
    /// own tokens (`correct`), wrong ones (`wrong`), or the first K correct and the rest wrong
    /// (`first=K`); runs plain decoding first to know them.
    #[arg(
        long,
        value_name = "correct|wrong|first=K",
        requires = "mtp",
        conflicts_with = "prompts",
        hide = true
    )]
    mtp_force: Option<String>,
    /// Print one JSON object (prompt_ids, tokens, text, finish_reason, timings[, top_logprobs]).
    #[arg(long)]
    json: bool,
}

/// What `generate` and `chat` share: the request's flags, the backend and the cache layout.
#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    request: RequestOptions,
    /// Compute backend: `cpu` (always built); `mlx`, MLX's default device (the GPU on a Mac or
    /// with MLX's CUDA wheel, the CPU elsewhere; build with `--features mlx`); `metal`, MLX on
    /// the Metal GPU with the Metal kernels (macOS, `--features metal`); `cuda`, the native
    /// CUDA backend on an NVIDIA GPU (build with `--features cuda`).
    #[arg(long, value_name = "cpu|mlx|metal|cuda", default_value = "cpu", value_parser = parse_backend)]
    backend: Backend,
    /// KV layout of full-attention layers: `flat` (one buffer per layer, grown by doubling) or
    /// `paged` (blocks of --block-size positions in a pool per layer, read through block
    /// tables; full blocks with equal contents are shared). Same tokens either way.
    #[arg(long, value_name = "flat|paged", default_value = "flat", value_parser = ["flat", "paged"])]
    kv: String,
    /// Positions per KV block with --kv paged.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    block_size: u32,
    /// The most blocks each layer's pool hands out with --kv paged; running out is an error
    /// [default: enough for the whole context; with --prompts, for every prompt and budget at once].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)))]
    kv_blocks: Option<u64>,
    /// Arithmetic: `exact` (f32 activations everywhere; what the goldens hold) or `fast`.
    /// On the CPU, `fast` quantizes activations to int8 per group against 4-bit group-64
    /// weights (integer dot products, as llama.cpp does) and rounds them to bf16 against bf16
    /// weights (bf16 dot products); close to exact but not bit-equal. On MLX, `fast` keeps weights in
    /// their stored dtype (bf16 stays bf16, quantized keeps its bf16 scales) with activations
    /// in that dtype, as mlx-lm runs. Default: `fast` on metal; on the CPU `fast` for bf16
    /// weights (top-1 log-probs within 0.15 nats of an f32 reference on real checkpoints;
    /// prefill about 1.7× faster), `exact` for f32 and quantized weights; `exact` elsewhere. The CPU's
    /// instruction set is detected at run time; ENGINE_CPU_ISA=avx2 (or portable, avx512,
    /// avx512vnni, avx512bf16; neon, dotprod, i8mm on aarch64) caps it.
    #[arg(long, value_name = "exact|fast")]
    numerics: Option<kernels::numerics::Numerics>,
    /// Cap the CPU kernels' instruction set for this run (portable, avx2, avx512, avx512vnni,
    /// avx512bf16; neon, dotprod, i8mm on aarch64; native = no cap), to measure or check a
    /// lower path (avx2 gives the native tokens). ENGINE_CPU_ISA caps the whole process.
    #[arg(long, value_name = "LEVEL")]
    isa: Option<kernels::settings::IsaCap>,
}

impl RunArgs {
    /// Checks what can fail before the (slow) load: a backend this build lacks, a bad
    /// GDN_KERNEL. Then loads the folder on the backend, and settles `--numerics` when it was
    /// not given: the default for the backend and the model's weight formats.
    fn load(&mut self, model: &std::path::Path) -> Result<(Pipeline, GdnPath)> {
        self.backend.require()?;
        kernels::cpu::isa::env_cap().map_err(anyhow::Error::msg)?;
        let gdn_path = GdnPath::resolve(self.request.gdn_path)?;
        let p = Pipeline::load_for(model, self.backend, self.numerics())?;
        let formats = &p.model.info().weight_formats;
        self.numerics = Some(
            self.numerics
                .unwrap_or_else(|| self.backend.default_numerics_for(formats)),
        );
        Ok((p, gdn_path))
    }

    /// `--numerics`, else (before [`RunArgs::load`] settles it) the backend's default.
    fn numerics(&self) -> kernels::numerics::Numerics {
        self.numerics
            .unwrap_or_else(|| self.backend.default_numerics())
    }

    /// The request the flags state, with the resolved GDN path and what the flags of the
    /// backend and cache layout add.
    fn options(&self, gdn_path: GdnPath) -> RequestOptions {
        RequestOptions {
            gdn_path: Some(gdn_path),
            kernels: kernels::Settings {
                numerics: self.numerics(),
                isa_cap: self.isa,
            },
            paged_kv: (self.kv == "paged").then_some(generate::PagedKv {
                block_size: self.block_size as usize,
                blocks: self.kv_blocks.map(|b| b as usize),
            }),
            ..self.request.clone()
        }
    }
}

/// Arguments of `engine serve`.
#[cfg(feature = "serve")]
#[derive(Args)]
struct ServeArgs {
    /// The checkpoint folder.
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoding together at most (continuous batching: requests join and leave at
    /// token boundaries).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_concurrent: u32,
    /// Requests that may wait for a place in the batch; beyond that a request gets 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=65536))]
    max_queue: u32,
    /// MiB of KV cache the running requests and the prefix cache may hold. A request reserves
    /// what its prompt and max_tokens may need (twice that with flat KV, which grows by
    /// doubling) and waits until it fits; one that can never fit gets 400.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    kv_budget_mib: u64,
    /// Finished requests whose caches are kept so that a new prompt starting the same way (a
    /// shared system prompt, the next turn of a chat) prefills only the rest (flat KV only).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=4096))]
    prefix_cache: u32,
    /// Largest request body, in KiB.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=(1 << 20)))]
    max_body_kib: u64,
    /// Speculative decoding for every request: the checkpoint's own MTP head (Qwen3.5 original
    /// folders) drafts up to D tokens (1-4) that the model verifies in one forward. Each such
    /// request runs its own rounds beside the batch's step; its output is what `engine
    /// generate --mtp D` gives (greedy: plain decoding's tokens).
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u8).range(1..=4))]
    mtp: Option<u8>,
    #[command(flatten)]
    draft_vocab: DraftVocabArg,
    #[command(flatten)]
    run: RunArgs,
}

/// `--mtp-draft-vocab`, shared by `generate` and `serve`.
#[derive(Args, Debug)]
struct DraftVocabArg {
    /// With --mtp: drafts come from the token ids below N and the higher ids the prompt and
    /// output already hold, so each draft reads that part of the LM head (a third of the bench
    /// Qwen3.5's weights); 0 drafts from the whole vocabulary. Output never changes; only
    /// acceptance can (the ids below 32768 hold 92-93% of English, Rust and Python text's
    /// Qwen2 tokens, 96-97% with the ids already seen).
    #[arg(long, value_name = "N", default_value_t = generate::DEFAULT_DRAFT_VOCAB, requires = "mtp")]
    mtp_draft_vocab: usize,
}

impl DraftVocabArg {
    /// `--mtp D` with this draft vocabulary (0: the whole vocabulary).
    fn mtp(&self, depth: u8) -> generate::MtpOptions {
        let n = self.mtp_draft_vocab;
        generate::MtpOptions {
            draft_vocab: (n > 0).then_some(n),
            ..generate::MtpOptions::new(depth as usize)
        }
    }
}

#[cfg(feature = "serve")]
fn run_serve(mut a: ServeArgs) -> Result<()> {
    let (p, gdn_path) = a.run.load(&a.model)?;
    if a.mtp.is_some() && p.model.drafter().is_none() {
        bail!(
            "--mtp needs a checkpoint with its own draft head (Qwen3.5's `mtp.*` tensors, kept in original folders; mlx-lm conversions drop them); {} has none",
            a.model.display()
        );
    }
    let defaults = RequestOptions {
        mtp: a.mtp.map(|depth| a.draft_vocab.mtp(depth)),
        ..a.run.options(gdn_path)
    };
    let kv_budget = (a.kv_budget_mib as usize).saturating_mul(1 << 20);
    let paged = defaults.paged_kv.map(|pk| {
        let per_block = p.model.new_state().kv_bytes_per_position() * pk.block_size;
        let blocks = pk
            .blocks
            .unwrap_or_else(|| (kv_budget / per_block.max(1)).max(1));
        (pk.block_size, blocks)
    });
    let model_id = a
        .model
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let opts = engine::serve::ServeOptions {
        host: a.host.clone(),
        port: a.port,
        max_concurrent: a.max_concurrent as usize,
        max_queue: a.max_queue as usize,
        kv_budget: Some(kv_budget),
        prefix_cache: a.prefix_cache as usize,
        paged,
        // Each request sets its own; the server's answer is per request.
        defaults: RequestOptions {
            paged_kv: None,
            ..defaults
        },
        model_id,
        max_body_bytes: (a.max_body_kib as usize) << 10,
        body_timeout: std::time::Duration::from_secs(30),
    };
    engine::serve::serve(p, opts)
}

/// Arguments of `engine chat`.
#[derive(Args)]
struct ChatArgs {
    /// The checkpoint folder (its tokenizer_config.json must hold a chat template).
    #[arg(long)]
    model: PathBuf,
    /// A system message that opens the conversation (and survives /reset).
    #[arg(long)]
    system: Option<String>,
    /// Do not reuse the cache across turns: every turn prefills the whole conversation (for
    /// comparisons; the output is the same).
    #[arg(long)]
    no_reuse: bool,
    #[command(flatten)]
    run: RunArgs,
}

/// Prints generated tokens as text while they come, whole characters only.
struct Streamer<'t> {
    tokenizer: &'t engine::tokenizer::Tokenizer,
    text: engine::tokenizer::TextStream,
}

impl<'t> Streamer<'t> {
    fn new(tokenizer: &'t engine::tokenizer::Tokenizer) -> Streamer<'t> {
        Streamer {
            tokenizer,
            text: engine::tokenizer::TextStream::new(),
        }
    }

    fn push(&mut self, tok: u32) {
        let new = self.text.push(self.tokenizer, tok);
        if !new.is_empty() {
            print!("{new}");
            let _ = std::io::stdout().flush();
        }
    }

    /// Prints what is left of the final decode and ends the line.
    fn finish(&mut self) {
        println!("{}", self.text.finish(self.tokenizer).unwrap_or_default());
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Generate(a) => run_generate(a),
        Cmd::Chat(a) => run_chat(a),
        #[cfg(feature = "serve")]
        Cmd::Serve(a) => run_serve(a),
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

fn run_generate(mut a: GenerateArgs) -> Result<()> {
    let (p, gdn_path) = a.run.load(&a.model)?;
    if let Some(file) = &a.prompts {
        return run_batch(&p, &a, file, gdn_path);
    }
    let prompt_ids = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => p.encode_prompt(text, a.chat, a.run.request.thinking)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let opts = RequestOptions {
        top_logprobs: a.top_logprobs,
        prefill_step: a.prefill_step,
        ignore_eos: a.ignore_eos,
        ..a.run.options(gdn_path)
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
        req.mtp = Some(generate::MtpOptions {
            forced,
            ..a.draft_vocab.mtp(depth as u8)
        });
    }
    let mut streamer = Streamer::new(&p.tokenizer);
    let out = generate::generate(p.model.as_ref(), &req, |tok| {
        if !a.json {
            streamer.push(tok);
        }
    })?;
    let text = p.tokenizer.decode(&out.tokens, true)?;
    if a.json {
        let mut v = serde_json::to_value(&out)?;
        v["text"] = serde_json::Value::String(text);
        v["numerics"] = opts.kernels.numerics.name().into();
        println!("{}", serde_json::to_string(&v)?);
    } else {
        streamer.finish();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {:?}; numerics {}; TTFT {:.1} ms, prefill {:.1} tok/s, decode {:.1} tok/s; KV cache {:.1} MiB]",
            out.prompt_ids.len(),
            out.tokens.len(),
            out.finish_reason,
            opts.kernels.numerics,
            out.ttft_ms,
            out.prefill_tokens_per_s,
            out.decode_tokens_per_s,
            out.kv_cache_bytes as f64 / (1024.0 * 1024.0)
        );
        if let Some(m) = &out.mtp {
            eprintln!(
                "[mtp {}: {} of {} drafts accepted ({:.0}%), {:.2} per round over {} rounds; {} rollbacks, {} replays; {} plain steps]",
                m.depth,
                m.accepted,
                m.drafted,
                100.0 * m.acceptance_rate,
                m.mean_accepted_length,
                m.rounds,
                m.rollbacks,
                m.replays,
                m.plain_steps
            );
        }
    }
    Ok(())
}

/// `engine generate --prompts FILE`: the file's requests as one batch.
fn run_batch(
    p: &Pipeline,
    a: &GenerateArgs,
    file: &std::path::Path,
    gdn_path: GdnPath,
) -> Result<()> {
    let opts = RequestOptions {
        prefill_step: a.prefill_step,
        ignore_eos: a.ignore_eos,
        mtp: a.mtp.map(|depth| a.draft_vocab.mtp(depth)),
        ..a.run.options(gdn_path)
    };
    let reqs = p.requests_from_file(file, &opts)?;
    let batch = generate::BatchOptions {
        max_batch: a.max_batch as usize,
    };
    let start = std::time::Instant::now();
    let outs = generate::generate_batch(p.model.as_ref(), &reqs, batch, |_, _| {})?;
    let secs = start.elapsed().as_secs_f64();
    let generated: usize = outs.iter().map(|o| o.tokens.len()).sum();
    for (i, out) in outs.iter().enumerate() {
        let text = p.tokenizer.decode(&out.tokens, true)?;
        if a.json {
            let mut v = serde_json::to_value(out)?;
            v["index"] = i.into();
            v["text"] = serde_json::Value::String(text);
            println!("{}", serde_json::to_string(&v)?);
        } else {
            println!("[{}] {text}", i + 1);
        }
    }
    eprintln!(
        "[{} prompts, batch of up to {}: {generated} tokens generated in {:.2} s, {:.1} tok/s together]",
        reqs.len(),
        a.max_batch,
        secs,
        generated as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// The terminal chat: reads user lines, answers each through a [`engine::Session`].
fn run_chat(mut a: ChatArgs) -> Result<()> {
    use engine::tokenizer::ChatMessage;
    use std::io::{BufRead, IsTerminal};
    let (p, gdn_path) = a.run.load(&a.model)?;
    if !p.tokenizer.has_chat_template() {
        bail!(
            "{}: the folder has no chat template (tokenizer_config.json `chat_template`); use `engine generate --prompt` instead",
            a.model.display()
        );
    }
    let opts = a.run.options(gdn_path);
    let opening: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let mut messages = opening.clone();
    let mut session = engine::Session::new(p.model.as_ref());
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "[{}: /reset forgets the conversation, /exit or Ctrl-D leaves]",
            a.model.display()
        );
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading standard input")?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = opening.clone();
                session.reset();
                eprintln!("[conversation reset]");
                continue;
            }
            cmd if cmd.starts_with('/') => {
                eprintln!("[unknown command {cmd}: /reset or /exit]");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line));
        let req = p.request(p.encode_chat(&messages, a.run.request.thinking)?, &opts);
        if a.no_reuse {
            session.reset();
        }
        let mut streamer = Streamer::new(&p.tokenizer);
        let turn = match session.generate(&req, |tok| streamer.push(tok)) {
            Ok(t) => t,
            Err(e) => {
                // The conversation goes on without the message that failed (e.g. the context
                // is full: /reset makes room).
                println!();
                eprintln!("error: {e:#}");
                messages.pop();
                session.reset();
                continue;
            }
        };
        let text = p.tokenizer.decode(&turn.output.tokens, true)?;
        streamer.finish();
        eprintln!(
            "[{} prompt tokens, {} from the cache; {} generated; TTFT {:.1} ms, decode {:.1} tok/s]",
            req.prompt_ids.len(),
            turn.reused,
            turn.output.tokens.len(),
            turn.output.ttft_ms,
            turn.output.decode_tokens_per_s
        );
        messages.push(ChatMessage::new("assistant", text));
    }
    Ok(())
}

fn parse_backend(s: &str) -> std::result::Result<Backend, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

fn run_info(model: PathBuf, json: bool) -> Result<()> {
    let cfg = engine::config::ModelConfig::load(&model)?;
    let store = engine::weights::WeightStore::open(&model)?;
    let m = engine::models::load(&model).with_context(|| format!("loading {}", model.display()))?;
    let info = m.info();
    // What a run that names no `--numerics` gets on each backend built here (tools such as the
    // peer benchmark read it to measure the defaults a user gets).
    let defaults: Vec<(&str, &str)> = Backend::ALL
        .iter()
        .filter(|b| b.is_built())
        .map(|b| {
            (
                b.name(),
                b.default_numerics_for(&info.weight_formats).name(),
            )
        })
        .collect();
    if json {
        let mut v = serde_json::to_value(info)?;
        v["weight_bytes"] = store.total_bytes().into();
        v["model_type"] = cfg.model_type.clone().into();
        v["default_numerics"] = defaults
            .iter()
            .map(|(b, n)| (b.to_string(), serde_json::Value::from(*n)))
            .collect::<serde_json::Map<_, _>>()
            .into();
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
    let defaults: Vec<String> = defaults
        .iter()
        .map(|(b, n)| format!("{n} on {b}"))
        .collect();
    println!(
        "numerics:        {} (without --numerics)",
        defaults.join(", ")
    );
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

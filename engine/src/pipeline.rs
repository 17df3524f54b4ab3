//! A loaded checkpoint folder: the model, its tokenizer and its generation defaults, and the
//! rules that turn a user's request into a `GenerateRequest`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::{GenerationConfig, ModelConfig};
use crate::generate::{GenerateRequest, MtpOptions, PagedKv, SamplingParams};
use crate::layers::GdnPath;
use crate::models::{self, CausalLm};
use crate::tokenizer::{ChatMessage, Tokenizer};
use crate::weights::Pages;

pub struct Pipeline {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub generation: GenerationConfig,
    pub tokenizer: Tokenizer,
    pub model: Box<dyn CausalLm>,
}

/// A request as a user states it, the one spelling from every front end: the flags of
/// `engine generate` and `engine chat` are its fields (clap), a line of a prompts file sets its
/// sampling fields by the same names (serde), and the harness's path keys set the rest.
/// `None` falls back to generation_config.json, then the built-in; [`Pipeline::request`]
/// resolves it with the prompt into the [`GenerateRequest`] that generation runs.
#[derive(Debug, Clone, Default, clap::Args, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestOptions {
    /// Most tokens to generate [default: generation_config's max_new_tokens, else 128].
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Sampling temperature; 0 is greedy [default: generation_config's, else 0].
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens; 0 keeps all [default: generation_config's, else 0].
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p [default: generation_config's, else 1].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Seed of the sampler (same seed, same tokens).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Record the best K [token, log-prob] pairs of every step (`engine generate --top-logprobs`).
    #[arg(skip)]
    #[serde(skip)]
    pub top_logprobs: usize,
    /// Prefill in pieces of at most this many tokens (`engine generate --prefill-step`).
    #[arg(skip)]
    #[serde(skip)]
    pub prefill_step: Option<usize>,
    /// Generate the full budget even past a stop token (for comparisons with fixed lengths).
    #[arg(skip)]
    #[serde(skip)]
    pub ignore_eos: bool,
    /// Gated DeltaNet path: `auto` (chunked for forwards of 64+ tokens, per step otherwise),
    /// `perstep`, or `chunked` (every multi-token forward) [default: $GDN_KERNEL, else auto].
    #[arg(long = "gdn", value_name = "auto|perstep|chunked")]
    #[serde(skip)]
    pub gdn_path: Option<GdnPath>,
    /// Render chat prompts with the template's `enable_thinking` on or off (Qwen3 and Qwen3.5
    /// templates: `off` opens the answer with an empty think block) [default: the template's].
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    #[serde(skip)]
    pub thinking: Option<bool>,
    /// Keep every position in the KV caches of sliding-window layers (masking to the window)
    /// instead of rotating them; for comparisons, since it only costs memory.
    #[arg(long)]
    #[serde(skip)]
    pub flat_kv: bool,
    /// Speculative decoding with the checkpoint's own draft head (`engine generate --mtp`).
    #[arg(skip)]
    #[serde(skip)]
    pub mtp: Option<MtpOptions>,
    /// Paged KV for full-attention layers (`--kv paged`).
    #[arg(skip)]
    #[serde(skip)]
    pub paged_kv: Option<PagedKv>,
    /// How the kernels compute (`--numerics`, `--isa`; numerics `exact` and no ISA cap unless
    /// asked).
    #[arg(skip)]
    #[serde(skip)]
    pub kernels: kernels::Settings,
}

fn parse_on_off(s: &str) -> std::result::Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

impl RequestOptions {
    /// These options with what they leave unset taken from `base` (a prompts-file line over
    /// the command line). Only the fields a line may set can be unset here.
    pub fn over(self, base: &RequestOptions) -> RequestOptions {
        RequestOptions {
            max_tokens: self.max_tokens.or(base.max_tokens),
            temperature: self.temperature.or(base.temperature),
            top_k: self.top_k.or(base.top_k),
            top_p: self.top_p.or(base.top_p),
            seed: self.seed.or(base.seed),
            ..base.clone()
        }
    }
}

/// Built-in defaults when neither the request nor generation_config.json says.
pub const DEFAULT_MAX_TOKENS: usize = 128;

impl Pipeline {
    /// Loads a checkpoint folder for the CPU backend.
    pub fn load(dir: &Path) -> Result<Pipeline> {
        Pipeline::load_with(dir, Pages::for_cpu()?)
    }

    /// [`Pipeline::load`] with the weights' bytes kept as `pages` asks.
    pub fn load_with(dir: &Path, pages: Pages) -> Result<Pipeline> {
        let config = ModelConfig::load(dir)?;
        let generation = GenerationConfig::load(dir)?;
        let tokenizer = Tokenizer::load(dir)?;
        let model = models::load_with(dir, pages)?;
        Ok(Pipeline {
            dir: dir.to_path_buf(),
            config,
            generation,
            tokenizer,
            model,
        })
    }

    /// Prompt text to ids, through the chat template when `chat` is set (with `thinking` as
    /// the template's `enable_thinking`, undefined when `None`).
    pub fn encode_prompt(
        &self,
        text: &str,
        chat: bool,
        thinking: Option<bool>,
    ) -> Result<Vec<u32>> {
        if chat {
            self.encode_chat(&[ChatMessage::new("user", text)], thinking)
        } else {
            self.tokenizer.encode(text, true)
        }
    }

    /// A conversation to ids through the chat template, ready for the assistant's answer.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        thinking: Option<bool>,
    ) -> Result<Vec<u32>> {
        let rendered = self
            .tokenizer
            .apply_chat_template_thinking(messages, true, thinking)
            .with_context(|| format!("{}: applying the chat template", self.dir.display()))?;
        // The template already wrote any special tokens it wants.
        self.tokenizer.encode(&rendered, false)
    }

    /// The stop set: config.json's eos ∪ generation_config.json's eos.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = self.config.eos_token_ids();
        ids.extend(&self.generation.eos_token_ids);
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Resolves a request: the request's value, else generation_config's, else built-in
    /// (greedy; generation_config's `do_sample: false` also means greedy).
    pub fn request(&self, prompt_ids: Vec<u32>, o: &RequestOptions) -> GenerateRequest {
        let g = &self.generation;
        let sampled_by_default = g.do_sample.unwrap_or(g.temperature.is_some());
        let temperature = o
            .temperature
            .or(if sampled_by_default {
                g.temperature
            } else {
                Some(0.0)
            })
            .unwrap_or(0.0);
        GenerateRequest {
            prompt_ids,
            max_tokens: o
                .max_tokens
                .or(g.max_new_tokens)
                .unwrap_or(DEFAULT_MAX_TOKENS),
            sampling: SamplingParams {
                temperature,
                top_k: o.top_k.or(g.top_k).unwrap_or(0),
                top_p: o.top_p.or(g.top_p).unwrap_or(1.0),
                seed: o.seed.unwrap_or(0),
            },
            stop_ids: if o.ignore_eos {
                Vec::new()
            } else {
                self.stop_ids()
            },
            top_logprobs: o.top_logprobs,
            prefill_step: o.prefill_step,
            // A bad GDN_KERNEL is an error at the CLI, which resolves it first; here it warns.
            gdn_path: GdnPath::resolve(o.gdn_path).unwrap_or_else(|e| {
                eprintln!("warning: {e:#}; using auto");
                GdnPath::Auto
            }),
            flat_kv: o.flat_kv,
            mtp: o.mtp.clone(),
            paged_kv: o.paged_kv,
            kernels: o.kernels,
        }
    }
}

/// The prompt part of a prompts-file line: text (optionally through the chat template) or ids.
/// The rest of the line is [`RequestOptions`] fields.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct LinePrompt {
    prompt: Option<String>,
    prompt_ids: Option<Vec<u32>>,
    #[serde(default)]
    chat: bool,
}

/// Most lines a prompts file may hold (each becomes a sequence held until it finishes).
pub const MAX_PROMPT_LINES: usize = 100_000;

impl Pipeline {
    /// Reads a prompts file, one JSON object per line (the prompt, then any sampling fields of
    /// [`RequestOptions`]; blank lines skipped),
    /// into requests with `base`'s settings under each line's own. Errors name the file and
    /// the line.
    pub fn requests_from_file(
        &self,
        path: &Path,
        base: &RequestOptions,
    ) -> Result<Vec<GenerateRequest>> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the prompts file {}", path.display()))?;
        let mut reqs = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let at = || format!("{} line {}", path.display(), n + 1);
            anyhow::ensure!(
                reqs.len() < MAX_PROMPT_LINES,
                "{}: more than {MAX_PROMPT_LINES} prompts",
                path.display()
            );
            let mut fields: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(line).with_context(|| {
                    format!(
                        "{}: not a prompt object like {{\"prompt\": \"Hello\", \"max_tokens\": 16}}",
                        at()
                    )
                })?;
            let mut prompt = serde_json::Map::new();
            for key in ["prompt", "prompt_ids", "chat"] {
                if let Some(v) = fields.remove(key) {
                    prompt.insert(key.into(), v);
                }
            }
            let l: LinePrompt = serde_json::from_value(prompt.into()).with_context(at)?;
            let own: RequestOptions = serde_json::from_value(fields.into()).with_context(|| {
                format!(
                    "{}: a line sets `prompt` or `prompt_ids`, optionally `chat`, and the fields max_tokens, temperature, top_k, top_p, seed",
                    at()
                )
            })?;
            let ids = match (&l.prompt, &l.prompt_ids) {
                (Some(text), None) => self
                    .encode_prompt(text, l.chat, base.thinking)
                    .with_context(at)?,
                (None, Some(ids)) => ids.clone(),
                _ => anyhow::bail!("{}: give exactly one of `prompt` and `prompt_ids`", at()),
            };
            reqs.push(self.request(ids, &own.over(base)));
        }
        anyhow::ensure!(
            !reqs.is_empty(),
            "{}: no prompts in the file",
            path.display()
        );
        Ok(reqs)
    }
}

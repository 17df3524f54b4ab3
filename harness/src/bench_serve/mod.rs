//! `harness bench-serve`: load on an OpenAI-compatible server (`engine serve`, llama-server,
//! vLLM, ...) at several concurrency levels, one JSON line per request, and a summary of each
//! level: time to first token, inter-token latency and end-to-end latency (p50, p90, p99),
//! request and token throughput, and the prefix-cache hit rate.

pub mod client;
pub mod summary;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::machine::{self, Machine};

/// Measure an OpenAI-compatible server under concurrent load.
///
/// For each --concurrency level, --requests streamed /v1/completions requests run with that
/// many in flight (closed loop: a finished request starts the next), or, with --rate, start
/// at that many per second (seeded Poisson arrivals) with at most the level in flight. Prompts
/// are seeded text of about --prompt-words words (uniform within ±--prompt-spread), optionally
/// opening with --shared-prefix-words words common to all (a system prompt, for prefix
/// caches); each asks for --max-tokens greedy tokens with EOS ignored, so every server
/// generates the same count. Text prompts, not token ids, so servers with different
/// tokenizers get the same load.
///
/// One JSON line per request is appended to --out (kind "serve": TTFT, inter-token gaps,
/// end-to-end time, tokens, cached prompt tokens); a table per level is printed.
/// `harness report FILE` turns the file into tables and plots (throughput and TTFT against
/// concurrency, one curve per --label).
///
/// Examples:
///   engine serve --model DIR --port 8080 --max-concurrent 16 &
///   harness bench-serve --url http://127.0.0.1:8080 --concurrency 1,4,16 --label engine
///   harness bench-serve --url http://127.0.0.1:8081 --concurrency 1,4,16 --label llama-server
///   harness report bench-serve.jsonl --out reports/serve
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchServeArgs {
    /// The server's base URL (what comes before /v1).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Concurrency levels: requests in flight at once.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub concurrency: Vec<usize>,
    /// Requests per level [default: 4 × the level, at least 8].
    #[arg(long)]
    pub requests: Option<usize>,
    /// Start requests at this many per second (open loop) instead of one per finished request.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Mean prompt length in words.
    #[arg(long, default_value_t = 128)]
    pub prompt_words: usize,
    /// Relative spread of prompt lengths (0: all the same).
    #[arg(long, default_value_t = 0.5)]
    pub prompt_spread: f64,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Words every prompt opens with (0: none).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_words: usize,
    /// Seed of the prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Name of this server in the results [default: the model id it lists].
    #[arg(long)]
    pub label: Option<String>,
    /// Untimed requests before the first level (loads caches, spins up threads).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Seconds before a request is given up.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// The jsonl file results are appended to.
    #[arg(long, default_value = "bench-serve.jsonl")]
    pub out: PathBuf,
}

/// One request's line in the output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServeRecord {
    /// Always "serve" (tells `harness report` what the file holds).
    pub kind: String,
    pub label: String,
    pub url: String,
    pub model: String,
    pub machine: Machine,
    pub commit: Option<String>,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub index: usize,
    pub prompt_words: usize,
    pub max_tokens: usize,
    /// Seconds from the level's start to this request's start.
    pub start_s: f64,
    #[serde(flatten)]
    pub timing: client::Timing,
    /// Why the request failed (its timing is then all zeros).
    pub error: Option<String>,
}

/// The records of a bench-serve file; `None` when the file holds something else (a sweep).
pub fn read(path: &std::path::Path) -> Result<Option<Vec<ServeRecord>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .peekable();
    let is_serve = lines.peek().is_some_and(|(_, l)| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["kind"] == "serve")
    });
    if !is_serve {
        return Ok(None);
    }
    lines
        .map(|(n, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{} line {}: not a bench-serve record",
                    path.display(),
                    n + 1
                )
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Words prompts are drawn from: common English, so that every tokenizer splits them into
/// about one token each.
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family",
    "student", "group",
];

fn words(rng: &mut ChaCha8Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[(rng.next_u32() as usize) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

impl BenchServeArgs {
    /// Request `i`'s prompt: the shared prefix, then its own words.
    fn prompt(&self, i: usize) -> String {
        let mut shared = ChaCha8Rng::seed_from_u64(self.seed);
        let prefix = words(&mut shared, self.shared_prefix_words);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ (0x9e37_79b9 * (i as u64 + 1)));
        let u = (rng.next_u32() as f64) / (u32::MAX as f64);
        let spread = self.prompt_spread.clamp(0.0, 1.0);
        let n = ((self.prompt_words as f64) * (1.0 + spread * (2.0 * u - 1.0))).round() as usize;
        let own = words(&mut rng, n.max(1));
        if prefix.is_empty() {
            own
        } else {
            format!("{prefix} {own}")
        }
    }

    fn check(&self) -> Result<()> {
        if self.concurrency.is_empty() || self.concurrency.contains(&0) {
            bail!("--concurrency takes levels of at least 1, like 1,4,16");
        }
        if self.concurrency.iter().any(|&c| c > 1024) {
            bail!("--concurrency above 1024 is not supported (one thread per request in flight)");
        }
        if self.max_tokens == 0 || self.prompt_words == 0 {
            bail!("--max-tokens and --prompt-words must be at least 1");
        }
        if let Some(r) = self.rate {
            if !(r > 0.0 && r.is_finite()) {
                bail!("--rate must be a positive number of requests per second, got {r}");
            }
        }
        Ok(())
    }

    pub fn run(self) -> Result<()> {
        self.check()?;
        let url = self.url.trim_end_matches('/').to_string();
        let agent = client::agent(Duration::from_secs(self.timeout));
        let model = client::model_id(&agent, &url)?;
        let label = self.label.clone().unwrap_or_else(|| model.clone());
        let machine = Machine::current();
        let commit = machine::commit();
        eprintln!("bench-serve: {url} ({model}), label {label}");
        for i in 0..self.warmup {
            client::run(&agent, &url, &self.prompt(usize::MAX - i), self.max_tokens)
                .context("a warm-up request failed")?;
        }
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.out)
            .with_context(|| format!("opening {}", self.out.display()))?;
        let mut all = Vec::new();
        for &level in &self.concurrency {
            let n = self.requests.unwrap_or((4 * level).max(8));
            let records = self.level(&agent, &url, level, n, |index, start_s, t| ServeRecord {
                kind: "serve".into(),
                label: label.clone(),
                url: url.clone(),
                model: model.clone(),
                machine: machine.clone(),
                commit: commit.clone(),
                concurrency: level,
                rate: self.rate,
                index,
                prompt_words: self.prompt_words,
                max_tokens: self.max_tokens,
                start_s,
                timing: t.as_ref().cloned().unwrap_or_default(),
                error: t.as_ref().err().map(|e| format!("{e:#}")),
            });
            for r in &records {
                writeln!(out, "{}", serde_json::to_string(r)?)?;
            }
            out.flush()?;
            let s = summary::Level::of(&records);
            eprintln!("{}", summary::one_line(&s));
            all.extend(records);
        }
        println!("{}", summary::markdown(&summary::levels(&all)));
        eprintln!("appended {} requests to {}", all.len(), self.out.display());
        Ok(())
    }

    /// Runs `n` requests with at most `level` in flight; `record` makes each one's line.
    fn level(
        &self,
        agent: &ureq::Agent,
        url: &str,
        level: usize,
        n: usize,
        record: impl Fn(usize, f64, &Result<client::Timing>) -> ServeRecord + Sync,
    ) -> Vec<ServeRecord> {
        // Open loop: each request's start time, from seeded exponential gaps.
        let starts: Option<Vec<f64>> = self.rate.map(|rate| {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x5eed);
            let mut t = 0.0;
            (0..n)
                .map(|_| {
                    let u = ((rng.next_u32() as f64) + 1.0) / (u32::MAX as f64 + 2.0);
                    t += -u.ln() / rate;
                    t
                })
                .collect()
        });
        let next = AtomicUsize::new(0);
        let done = Mutex::new(Vec::with_capacity(n));
        let begin = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..level.min(n) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    if let Some(starts) = &starts {
                        let at = Duration::from_secs_f64(starts[i]);
                        if let Some(wait) = at.checked_sub(begin.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                    let start_s = begin.elapsed().as_secs_f64();
                    // Each level has prompts of its own: a prefix cache must not serve one
                    // level's prompts from the previous level's.
                    let prompt = self.prompt(i + (level << 32));
                    let t = client::run(agent, url, &prompt, self.max_tokens);
                    let r = record(i, start_s, &t);
                    done.lock().expect("no panics hold it").push(r);
                });
            }
        });
        let mut records = done.into_inner().expect("no panics hold it");
        records.sort_by_key(|r| r.index);
        records
    }
}

//! One streamed request to an OpenAI-compatible `/v1/completions`, timed as a user sees it:
//! the time to the first text, the gaps between the chunks that carry text, the whole request.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// What one request measured (a failed request's record holds the default: zeros).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Timing {
    pub ttft_ms: f64,
    /// Gaps between consecutive text chunks.
    pub itl_ms: Vec<f64>,
    pub e2e_ms: f64,
    /// From `usage` when the server sends it, else the text chunks counted.
    pub completion_tokens: usize,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
}

/// An agent whose requests give up after `timeout`, and which reads error statuses as bodies.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// The model id the server lists first (`GET /v1/models`).
pub fn model_id(agent: &ureq::Agent, url: &str) -> Result<String> {
    let mut r = agent
        .get(format!("{url}/v1/models"))
        .call()
        .with_context(|| format!("GET {url}/v1/models: is the server running?"))?;
    let text = r.body_mut().read_to_string()?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{url}/v1/models did not answer JSON: {text}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{url}/v1/models lists no model: {text}"))
}

/// Sends `prompt` for exactly `max_tokens` greedy tokens (`ignore_eos`, which vLLM,
/// llama-server and `engine serve` take) and times the stream.
pub fn run(agent: &ureq::Agent, url: &str, prompt: &str, max_tokens: usize) -> Result<Timing> {
    let body = json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let start = Instant::now();
    let resp = agent
        .post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .with_context(|| format!("POST {url}/v1/completions"))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let text = resp.into_body().read_to_string().unwrap_or_default();
        bail!("HTTP {status}: {text}");
    }
    let mut t = Timing::default();
    let mut last: Option<Instant> = None;
    let mut chunks = 0;
    let reader = BufReader::new(resp.into_body().into_reader());
    for line in reader.lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value =
            serde_json::from_str(data).with_context(|| format!("a stream event: {data}"))?;
        if let Some(e) = v.get("error") {
            bail!("the stream failed: {e}");
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let n = |k: &str| u[k].as_u64().map(|x| x as usize);
            t.prompt_tokens = n("prompt_tokens");
            t.completion_tokens = n("completion_tokens").unwrap_or(0);
            t.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .map(|x| x as usize);
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or_default();
        if text.is_empty() {
            continue;
        }
        let now = Instant::now();
        match last {
            None => t.ttft_ms = ms(now - start),
            Some(prev) => t.itl_ms.push(ms(now - prev)),
        }
        last = Some(now);
        chunks += 1;
    }
    t.e2e_ms = ms(start.elapsed());
    if last.is_none() {
        bail!("the stream carried no text");
    }
    if t.completion_tokens == 0 {
        t.completion_tokens = chunks;
    }
    Ok(t)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

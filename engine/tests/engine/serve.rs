//! `engine serve` over HTTP, end to end: 16 concurrent greedy requests return exactly what 16
//! separate `engine generate` runs return; a stream's pieces join to the whole answer; bad
//! requests get 4xx error objects and the server keeps serving; a client that goes away
//! mid-stream is cancelled; `/metrics` counts it all; SIGTERM ends the process cleanly.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use synth::cached as synth_cached;
use synth::SynthSpec;

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
            .args(["serve", "--model", model, "--port", "0"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the server exited before listening")
                .unwrap();
            if let Some(at) = line.find("http://") {
                let addr = line[at..].split_whitespace().next().unwrap();
                break addr.to_string();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Server { child, url }
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into()
    }

    /// POSTs `body` (a string, sent as is) and returns the status and the body.
    fn post(&self, path: &str, body: &str) -> (u16, String) {
        let mut r = Server::agent()
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .send(body)
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }

    fn post_json(&self, path: &str, body: &Value) -> Value {
        let (status, text) = self.post(path, &body.to_string());
        assert_eq!(status, 200, "{path} {body}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    fn get(&self, path: &str) -> (u16, String) {
        let mut r = Server::agent()
            .get(format!("{}{path}", self.url))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }

    /// Starts a long greedy stream and reads its first event; the stream stays open until the
    /// reader is dropped.
    fn open_long_stream(&self) -> impl BufRead {
        let body =
            json!({"prompt": [1, 2, 3], "max_tokens": 3000, "stream": true, "temperature": 0});
        let resp = Server::agent()
            .post(format!("{}/v1/completions", self.url))
            .send(body.to_string())
            .unwrap();
        let mut reader = BufReader::new(resp.into_body().into_reader());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("data: "), "{line}");
        reader
    }

    /// A metric's value from `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{name} not in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Sends SIGTERM and waits for a clean exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "the server exited with {status}");
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn model() -> String {
    let spec = SynthSpec::parse("qwen3:tiny:bf16:hf").unwrap();
    synth_cached(&spec).unwrap().display().to_string()
}

/// `engine generate`'s greedy output for `ids` (JSON: text, tokens, finish_reason).
fn generate_json(model: &str, ids: &[u32], max_tokens: usize) -> Value {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["generate", "--model", model, "--json", "--temperature", "0"])
        .args(["--max-tokens", &max_tokens.to_string()])
        .args(["--prompt-ids", &ids.join(",")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Sends every prompt at once as a greedy text completion of `max_tokens(i)` tokens and checks
/// each answer (text, finish reason, usage) against a separate `engine generate` run.
fn answers_equal_generate(
    server: &Server,
    model: &str,
    prompts: &[Vec<u32>],
    max_tokens: impl Fn(usize) -> usize + Sync,
) {
    let max_tokens = &max_tokens;
    let answers: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, ids)| {
                s.spawn(move || {
                    let body =
                        json!({"prompt": ids, "max_tokens": max_tokens(i), "temperature": 0});
                    server.post_json("/v1/completions", &body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (ids, answer)) in prompts.iter().zip(&answers).enumerate() {
        let want = generate_json(model, ids, max_tokens(i));
        let choice = &answer["choices"][0];
        assert_eq!(choice["text"], want["text"], "request {i}");
        assert_eq!(
            choice["finish_reason"], want["finish_reason"],
            "request {i}"
        );
        let n = want["tokens"].as_array().unwrap().len();
        assert_eq!(answer["usage"]["completion_tokens"], n, "request {i}");
        assert_eq!(answer["usage"]["prompt_tokens"], ids.len(), "request {i}");
    }
}

#[test]
fn concurrent_greedy_requests_equal_separate_generate_runs() {
    let model = model();
    let server = Server::start(&model, &["--max-concurrent", "16"]);
    let prompts: Vec<Vec<u32>> = (0..16u32)
        .map(|i| {
            (0..3 + 2 * i)
                .map(|j| (j * 131 + i * 17 + 5) % 1000)
                .collect()
        })
        .collect();
    answers_equal_generate(&server, &model, &prompts, |i| 4 + i % 5);
    assert_eq!(server.metric("engine_requests_total{outcome=\"ok\"}"), 16.0);
    server.stop();
}

/// The `data:` payloads of a server-sent event stream, up to `[DONE]`.
fn sse_payloads(body: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for line in body.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            if data == "[DONE]" {
                return out;
            }
            out.push(serde_json::from_str(data).unwrap());
        }
    }
    panic!("the stream did not end with [DONE]:\n{body}");
}

#[test]
fn streams_errors_cancellation_and_metrics() {
    let model = model();
    let server = Server::start(&model, &["--max-concurrent", "4"]);
    let chat = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 2,
    });
    let whole = server.post_json("/v1/chat/completions", &chat);
    let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
    let lps = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(lps.len(), 12);
    for lp in lps {
        // Greedy: the chosen token is the best one, and its log-prob is the best's.
        assert_eq!(lp["top_logprobs"][0]["logprob"], lp["logprob"], "{lp}");
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
    }
    // The same request streamed: the pieces join to the same text, and the last chunk with
    // usage reports the prompt as cached (the first request's state).
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, body) = server.post("/v1/chat/completions", &streamed.to_string());
    assert_eq!(status, 200);
    let chunks = sse_payloads(&body);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, content);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], prompt - 1);
    assert_eq!(
        chunks.iter().rev().nth(1).unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // A stop string cuts the text before it.
    if content.chars().count() > 4 {
        let cut: String = content.chars().skip(2).take(2).collect();
        let mut stopped = chat.clone();
        stopped["stop"] = json!([cut]);
        let a = server.post_json("/v1/chat/completions", &stopped);
        let want = &content[..content.find(&cut).unwrap()];
        assert_eq!(a["choices"][0]["message"]["content"], want);
        assert_eq!(a["choices"][0]["finish_reason"], "stop");
    }

    // Bad requests: a 4xx with an OpenAI error object, and the server goes on.
    let bad: [(&str, &str, u16); 7] = [
        ("/v1/chat/completions", "{not json", 400),
        ("/v1/chat/completions", r#"{"messages": "hi"}"#, 400),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "max_tokens": "ten"}"#,
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "temperature": -1}"#,
            400,
        ),
        ("/v1/completions", r#"{"prompt": [4000000000]}"#, 400),
        ("/v1/completions", r#"{"prompt": "hi", "n": 3}"#, 400),
        ("/v1/nothing", "{}", 404),
    ];
    for (path, body, want) in bad {
        let (status, text) = server.post(path, body);
        assert_eq!(status, want, "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().len() > 10, "{text}");
    }
    let long: Vec<u32> = vec![7; 5000];
    let (status, text) = server.post("/v1/completions", &json!({"prompt": long}).to_string());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("context"), "{text}");
    assert_eq!(server.get("/health").0, 200);

    // A client that reads one chunk of a long stream and goes away is cancelled.
    drop(server.open_long_stream());
    let start = Instant::now();
    // The worker counts the cancellation, then updates the gauges at the end of its step.
    while server.metric("engine_requests_total{outcome=\"cancelled\"}") < 1.0
        || server.metric("engine_running_sequences") > 0.0
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the stream was not cancelled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let generated = server.metric("engine_generated_tokens_total");
    assert!(
        generated < 1000.0,
        "the cancelled sequence ran on: {generated} tokens"
    );
    server.stop();
}

#[test]
fn a_full_server_answers_429() {
    let model = model();
    // One running sequence and no queue: a second request at the same time is refused.
    let server = Server::start(&model, &["--max-concurrent", "1", "--max-queue", "0"]);
    let reader = server.open_long_stream();
    let (status, text) = server.post("/v1/completions", r#"{"prompt": "hi", "max_tokens": 2}"#);
    assert_eq!(status, 429, "{text}");
    assert_eq!(
        server.metric("engine_requests_total{outcome=\"rejected\"}"),
        1.0
    );
    drop(reader);
    server.stop();
}

#[test]
fn a_request_that_can_never_fit_the_kv_budget_gets_400_streamed_or_not() {
    let model = model();
    let server = Server::start(&model, &["--kv-budget-mib", "1"]);
    for stream in [false, true] {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 4000, "stream": stream});
        let (status, text) = server.post("/v1/completions", &body.to_string());
        assert_eq!(status, 400, "stream={stream}: {text}");
        assert!(text.contains("--kv-budget-mib"), "{text}");
    }
    // A request that fits still runs.
    let small = json!({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0});
    let a = server.post_json("/v1/completions", &small);
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    server.stop();
}

/// `--mtp 2` on a Qwen3.5 checkpoint with its head: concurrent greedy requests run their
/// speculative rounds beside each other and return plain `engine generate`'s answers (greedy
/// MTP keeps the model's own tokens); `/metrics` counts the drafts. A checkpoint without a
/// head refuses `--mtp` at startup, naming the folder.
#[test]
fn speculative_serving_answers_as_plain_greedy_decoding() {
    let spec = SynthSpec::parse("qwen3_5:tiny:f32:hf").unwrap();
    let model = synth_cached(&spec).unwrap().display().to_string();
    let server = Server::start(&model, &["--mtp", "2", "--max-concurrent", "3"]);
    let prompts: Vec<Vec<u32>> = (0..5u32)
        .map(|i| {
            (0..4 + 9 * i)
                .map(|j| (j * 211 + i * 7 + 3) % 900)
                .collect()
        })
        .collect();
    answers_equal_generate(&server, &model, &prompts, |i| 6 + 2 * i);
    let drafted = server.metric("engine_mtp_drafted_tokens_total");
    assert!(drafted > 0.0, "no drafts counted");
    assert!(server.metric("engine_mtp_accepted_tokens_total") <= drafted);
    server.stop();

    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args([
            "serve",
            "--model",
            &self::model(),
            "--mtp",
            "2",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("draft head") && err.contains("--mtp"), "{err}");
}

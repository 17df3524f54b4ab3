//! A request's answer from its stream of engine events: text through the detokenizer and the
//! stop strings, log-probs, `usage`; whole (one JSON body) or streamed (server-sent events in
//! the OpenAI chunk format, ending with `data: [DONE]`).
//!
//! Dropping the answer (the client went away, or a stop string ended the text) drops the
//! event receiver, which tells the engine thread to take the sequence out of the batch.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{self, ApiError};
use super::stop::StopText;
use super::worker::{Event, Job};
use super::{refuse, App, InFlight};
use crate::generate::{FinishReason, GenerateRequest};
use crate::tokenizer::TextStream;

/// Which endpoint answers, and the log-probs it reports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// `/v1/completions`; `logprobs` when the request gave `logprobs`.
    Completion { logprobs: bool },
    /// `/v1/chat/completions`; `top`: the alternatives per token, when `logprobs` is on.
    Chat { top: Option<usize> },
}

/// One generated token's log-probs, as text.
struct TokenLp {
    token: String,
    logprob: f32,
    top: Vec<(String, f32)>,
}

/// What a request's events amount to, one at a time.
enum Step {
    /// Text to show (maybe empty) and the token's log-probs.
    Piece(String, Option<TokenLp>),
    /// The last text, and why generation ended.
    End(String, &'static str),
    Error(ApiError),
}

struct Run {
    app: Arc<App>,
    _ticket: InFlight,
    events: UnboundedReceiver<Event>,
    text: TextStream,
    stop: StopText,
    kind: Kind,
    id: String,
    created: u64,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_prompt_tokens: usize,
    include_usage: bool,
    ended: bool,
}

/// Admits `req` and answers it whole or as a stream.
pub(crate) async fn respond(
    app: Arc<App>,
    req: GenerateRequest,
    stops: Vec<String>,
    kind: Kind,
    stream: bool,
    include_usage: bool,
) -> Response {
    let ticket = match app.admit() {
        Ok(t) => t,
        Err(e) => return refuse(&app, e),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_tokens = req.prompt_ids.len();
    let job = Job {
        req,
        events: tx,
        arrived: Instant::now(),
    };
    if let Err(e) = app.submit(job) {
        return refuse(&app, e);
    }
    let prefix = match kind {
        Kind::Completion { .. } => "cmpl",
        Kind::Chat { .. } => "chatcmpl",
    };
    let mut run = Run {
        id: format!("{prefix}-{}", app.next_id()),
        created: super::unix_now(),
        app,
        _ticket: ticket,
        events: rx,
        text: TextStream::new(),
        stop: StopText::new(stops),
        kind,
        prompt_tokens,
        completion_tokens: 0,
        cached_prompt_tokens: 0,
        include_usage,
        ended: false,
    };
    if !stream {
        return whole(run).await;
    }
    // A stream's status goes out with its headers: wait until the request has joined the
    // batch, so that one the engine refuses (it can never fit the KV budget) still gets a 4xx.
    if let Err(e) = run.started().await {
        return refuse(&run.app, e);
    }
    streamed(run)
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

impl Run {
    /// Waits for the request to join the batch; the engine's refusal as an error.
    async fn started(&mut self) -> Result<(), ApiError> {
        match self.events.recv().await {
            Some(Event::Started {
                cached_prompt_tokens,
            }) => {
                self.cached_prompt_tokens = cached_prompt_tokens;
                Ok(())
            }
            Some(Event::Failed { message, client }) => Err(ApiError::with(
                if client {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                },
                message,
            )),
            Some(other) => Err(ApiError::with(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal: the engine sent {other:?} before the request started"),
            )),
            None => Err(ApiError::with(
                StatusCode::SERVICE_UNAVAILABLE,
                "the engine stopped before the request started",
            )),
        }
    }

    /// The next step of the answer, from the next engine events.
    async fn step(&mut self) -> Step {
        let tokenizer = &self.app.pipeline.tokenizer;
        loop {
            let Some(event) = self.events.recv().await else {
                return Step::Error(ApiError::with(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the engine stopped before the answer was complete",
                ));
            };
            match event {
                Event::Started {
                    cached_prompt_tokens,
                } => self.cached_prompt_tokens = cached_prompt_tokens,
                Event::Token { token, logprobs } => {
                    self.completion_tokens += 1;
                    let piece = self.text.push(tokenizer, token);
                    let shown = self.stop.feed(&piece);
                    if self.stop.hit() {
                        return Step::End(shown, "stop");
                    }
                    let name = |t: u32| tokenizer.decode(&[t], false).unwrap_or_default();
                    let lp = logprobs.map(|l| TokenLp {
                        token: name(token),
                        logprob: l.logprob,
                        top: l.top.iter().map(|&(t, lp)| (name(t), lp)).collect(),
                    });
                    return Step::Piece(shown, lp);
                }
                Event::Done { finish, .. } => {
                    let rest = self.text.finish(tokenizer).unwrap_or_default();
                    let mut shown = self.stop.feed(&rest);
                    if self.stop.hit() {
                        return Step::End(shown, "stop");
                    }
                    shown += &self.stop.flush();
                    return Step::End(shown, finish_name(finish));
                }
                Event::Failed { message, client } => {
                    let status = if client {
                        StatusCode::BAD_REQUEST
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    return Step::Error(ApiError::with(status, message));
                }
            }
        }
    }

    fn usage(&self) -> Value {
        api::usage(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_prompt_tokens,
        )
    }

    fn head(&self, object: &str) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("id".into(), self.id.clone().into());
        m.insert("object".into(), object.into());
        m.insert("created".into(), self.created.into());
        m.insert("model".into(), self.app.opts.model_id.clone().into());
        m
    }

    /// The log-probs object of a choice, for the tokens `lps` (`None` when not asked).
    fn logprobs(&self, lps: &[TokenLp]) -> Value {
        let with_bytes =
            |t: &str, lp: f32| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
        match self.kind {
            Kind::Completion { logprobs: false } | Kind::Chat { top: None } => Value::Null,
            Kind::Completion { logprobs: true } => {
                let mut offset = 0;
                let mut offsets = Vec::new();
                for l in lps {
                    offsets.push(offset);
                    offset += l.token.len();
                }
                json!({
                    "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
                    "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                    "top_logprobs": lps.iter().map(|l| {
                        l.top.iter().map(|(t, lp)| (t.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
            Kind::Chat { top: Some(k) } => json!({
                "content": lps.iter().map(|l| {
                    let mut entry = with_bytes(&l.token, l.logprob);
                    entry["top_logprobs"] = l.top.iter().take(k).map(|(t, lp)| with_bytes(t, *lp)).collect();
                    entry
                }).collect::<Vec<_>>(),
            }),
        }
    }

    /// A choice carrying `text` (a message or a delta for chat).
    fn choice(&self, text: String, lps: &[TokenLp], finish: Option<&str>, delta: bool) -> Value {
        let mut c = json!({"index": 0, "finish_reason": finish, "logprobs": self.logprobs(lps)});
        match (self.kind, delta) {
            (Kind::Completion { .. }, _) => c["text"] = text.into(),
            (Kind::Chat { .. }, false) => {
                c["message"] = json!({"role": "assistant", "content": text})
            }
            (Kind::Chat { .. }, true) if finish.is_some() && text.is_empty() => {
                c["delta"] = json!({})
            }
            (Kind::Chat { .. }, true) => c["delta"] = json!({"content": text}),
        }
        c
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion { .. }, _) => "text_completion",
            (Kind::Chat { .. }, false) => "chat.completion",
            (Kind::Chat { .. }, true) => "chat.completion.chunk",
        }
    }

    /// A streamed chunk of one choice.
    fn chunk(&self, choice: Value) -> Sse {
        let mut m = self.head(self.object(true));
        m.insert("choices".into(), json!([choice]));
        if self.include_usage {
            m.insert("usage".into(), Value::Null);
        }
        Sse::default().data(Value::Object(m).to_string())
    }
}

async fn whole(mut run: Run) -> Response {
    let mut text = String::new();
    let mut lps = Vec::new();
    loop {
        match run.step().await {
            Step::Piece(piece, lp) => {
                text += &piece;
                lps.extend(lp);
            }
            Step::End(piece, finish) => {
                run.app.metrics.ok.fetch_add(1, Relaxed);
                text += &piece;
                let mut m = run.head(run.object(false));
                m.insert(
                    "choices".into(),
                    json!([run.choice(text, &lps, Some(finish), false)]),
                );
                m.insert("usage".into(), run.usage());
                return axum::Json(Value::Object(m)).into_response();
            }
            Step::Error(e) => {
                run.app.metrics.count_error(e.status.as_u16());
                return e.into_response();
            }
        }
    }
}

fn streamed(run: Run) -> Response {
    let mut first = VecDeque::new();
    if let Kind::Chat { .. } = run.kind {
        let mut c = run.choice(String::new(), &[], None, true);
        c["delta"] = json!({"role": "assistant", "content": ""});
        first.push_back(run.chunk(c));
    }
    let events = futures_util::stream::unfold((run, first), |(mut run, mut queue)| async move {
        loop {
            if let Some(ev) = queue.pop_front() {
                return Some((Ok::<_, Infallible>(ev), (run, queue)));
            }
            if run.ended {
                return None;
            }
            match run.step().await {
                Step::Piece(piece, lp) => {
                    if !piece.is_empty() || lp.is_some() {
                        let lps: Vec<TokenLp> = lp.into_iter().collect();
                        queue.push_back(run.chunk(run.choice(piece, &lps, None, true)));
                    }
                }
                Step::End(piece, finish) => {
                    run.app.metrics.ok.fetch_add(1, Relaxed);
                    run.ended = true;
                    if !piece.is_empty() {
                        queue.push_back(run.chunk(run.choice(piece, &[], None, true)));
                    }
                    queue.push_back(run.chunk(run.choice(String::new(), &[], Some(finish), true)));
                    if run.include_usage {
                        let mut m = run.head(run.object(true));
                        m.insert("choices".into(), json!([]));
                        m.insert("usage".into(), run.usage());
                        queue.push_back(Sse::default().data(Value::Object(m).to_string()));
                    }
                    queue.push_back(Sse::default().data("[DONE]"));
                }
                Step::Error(e) => {
                    run.app.metrics.count_error(e.status.as_u16());
                    run.ended = true;
                    // Headers are gone already: the error travels as an event.
                    queue.push_back(Sse::default().data(e.body().to_string()));
                    queue.push_back(Sse::default().data("[DONE]"));
                }
            }
        }
    });
    axum::response::Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

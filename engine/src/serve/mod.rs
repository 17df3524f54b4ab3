//! `engine serve`: an OpenAI-compatible HTTP server over one checkpoint.
//!
//! - `POST /v1/completions` and `POST /v1/chat/completions`, streamed as server-sent events
//!   (`"stream": true`) or answered whole;
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//!
//! Every admitted request becomes a job for the engine thread ([`worker`]), where one
//! scheduler runs them all with continuous batching and a prefix cache. Admission is bounded:
//! `max_concurrent` sequences decode together, `max_queue` more may wait, and a request beyond
//! that gets a 429 at once; the KV budget defers a request until running ones leave (or
//! refuses one that could never fit). Bad input gets an OpenAI-style error object with a 4xx
//! status, and the server goes on. SIGTERM or Ctrl-C stops accepting connections, lets the
//! requests in flight finish, then exits.

pub mod api;
pub mod metrics;
mod respond;
pub mod stop;
pub mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::generate::scheduler::{Scheduler, SchedulerOptions};
use crate::generate::{self, GenerateRequest};
use crate::pipeline::{Pipeline, RequestOptions};
use crate::tokenizer::ChatMessage;
use api::{ApiError, ChatRequest, CompletionRequest, Prompt, Sampling};
use metrics::Metrics;
use worker::Job;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (the address is printed on stderr).
    pub port: u16,
    /// Sequences decoding together at most.
    pub max_concurrent: usize,
    /// Requests that may wait for a place in the batch; more get a 429.
    pub max_queue: usize,
    /// Bytes of KV cache the running sequences and the prefix cache may hold (flat KV).
    pub kv_budget: Option<usize>,
    /// Finished sequences kept for prefix reuse (flat KV only).
    pub prefix_cache: usize,
    /// Paged KV: (positions per block, blocks per layer); the prefix cache is then off.
    pub paged: Option<(usize, usize)>,
    /// What a request leaves unset (the command line's request flags, numerics, GDN path).
    pub defaults: RequestOptions,
    /// The id `/v1/models` lists and responses name.
    pub model_id: String,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Longest a client may take to send its body.
    pub body_timeout: Duration,
}

/// Most stop strings a request may give (as OpenAI's API).
const MAX_STOPS: usize = 4;
/// Most alternatives per token a request may ask for.
const MAX_TOP_LOGPROBS: usize = 20;

pub(crate) struct App {
    pipeline: Arc<Pipeline>,
    opts: ServeOptions,
    jobs: Mutex<mpsc::Sender<Job>>,
    metrics: Arc<Metrics>,
    /// Requests admitted and not yet answered (waiting or running).
    in_flight: AtomicUsize,
    next_id: AtomicU64,
    started: u64,
}

/// Serves `pipeline` until SIGTERM or Ctrl-C.
pub fn serve(pipeline: Pipeline, opts: ServeOptions) -> Result<()> {
    anyhow::ensure!(
        opts.max_concurrent > 0,
        "--max-concurrent must be at least 1"
    );
    let pipeline = Arc::new(pipeline);
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = mpsc::channel::<Job>();
    let sched_opts = SchedulerOptions {
        max_batch: opts.max_concurrent,
        prefix_cache: opts.prefix_cache,
        kv_budget: opts.kv_budget,
    };
    let paged = opts.paged;
    // The engine thread builds the scheduler (its KV pool, with --kv paged) once and says
    // whether it could, before the port opens.
    let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<()>>(1);
    let engine = {
        let (pipeline, metrics) = (pipeline.clone(), metrics.clone());
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(
                move || match scheduler(pipeline.model.as_ref(), sched_opts, paged) {
                    Ok(sched) => {
                        let _ = ready_tx.send(Ok(()));
                        worker::run(sched, rx, &metrics);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                },
            )?
    };
    ready_rx
        .recv()
        .context("the engine thread ended before it started")??;
    let app = Arc::new(App {
        pipeline,
        jobs: Mutex::new(tx),
        metrics,
        in_flight: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        started: unix_now(),
        opts: opts.clone(),
    });
    let router = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(app.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
            .await
            .with_context(|| format!("binding {}:{}", opts.host, opts.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        eprintln!(
            "engine serve: {} listening on http://{addr} (OpenAI API under /v1)",
            opts.model_id
        );
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("serving HTTP")
    })?;
    // The last sender goes with the app: the engine thread finishes what it holds and ends.
    drop(app);
    engine
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))
}

fn scheduler(
    model: &dyn crate::models::CausalLm,
    opts: SchedulerOptions,
    paged: Option<(usize, usize)>,
) -> Result<Scheduler<'_>> {
    let sched = Scheduler::new(model, opts)?;
    match paged {
        Some((block, blocks)) => sched.with_pool(block, blocks),
        None => Ok(sched),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("engine serve: shutting down after the requests in flight");
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.opts.model_id,
            "object": "model",
            "created": app.started,
            "owned_by": "engine",
            "max_model_len": app.pipeline.model.info().context_length,
        }],
    }))
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::with(
        StatusCode::NOT_FOUND,
        "no such route: this server answers POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics",
    )
}

/// The body, within the size limit and the time limit.
async fn read_body(app: &App, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let limit = app.opts.max_body_bytes;
    match tokio::time::timeout(app.opts.body_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(ApiError::with(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                app.opts.body_timeout.as_secs()
            ),
        )),
        Ok(Err(e)) if format!("{e:#}").contains("length limit") => Err(ApiError::with(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        )),
        Ok(Err(e)) => Err(ApiError::bad(format!("reading the request body: {e}"))),
        Ok(Ok(b)) => Ok(b),
    }
}

/// Counts an error answer in the metrics and answers it.
fn refuse(app: &App, e: ApiError) -> Response {
    app.metrics.count_error(e.status.as_u16());
    e.into_response()
}

async fn completions(State(app): State<Arc<App>>, body: Body) -> Response {
    let run = async {
        let bytes = read_body(&app, body).await?;
        let r: CompletionRequest = api::parse(&bytes)?;
        let tokenizer = &app.pipeline.tokenizer;
        let encode = |t: &str| {
            tokenizer
                .encode(t, true)
                .map_err(|e| ApiError::field("prompt", format!("{e:#}")))
        };
        let ids = match r.prompt {
            Prompt::Text(t) => encode(&t)?,
            Prompt::Ids(ids) => ids,
            Prompt::Texts(v) if v.len() == 1 => encode(&v[0])?,
            Prompt::IdLists(mut v) if v.len() == 1 => v.remove(0),
            _ => {
                return Err(ApiError::field(
                    "prompt",
                    "give one prompt per request (a string or a list of token ids)",
                ))
            }
        };
        let top = r.logprobs;
        let (req, stops) = app.request(ids, &r.sampling, top)?;
        Ok((req, stops, r.sampling, top.is_some()))
    };
    match run.await {
        Ok((req, stops, s, logprobs)) => {
            let kind = respond::Kind::Completion { logprobs };
            let usage = s.stream_options.is_some_and(|o| o.include_usage);
            respond::respond(app, req, stops, kind, s.stream, usage).await
        }
        Err(e) => refuse(&app, e),
    }
}

async fn chat_completions(State(app): State<Arc<App>>, body: Body) -> Response {
    let run = async {
        let bytes = read_body(&app, body).await?;
        let r: ChatRequest = api::parse(&bytes)?;
        if r.messages.is_empty() {
            return Err(ApiError::field("messages", "give at least one message"));
        }
        let messages = r
            .messages
            .iter()
            .map(|m| Ok(ChatMessage::new(m.role.clone(), m.content.text()?)))
            .collect::<Result<Vec<_>, ApiError>>()?;
        let thinking = r
            .chat_template_kwargs
            .as_ref()
            .and_then(|k| k.enable_thinking)
            .or(app.opts.defaults.thinking);
        let ids = app
            .pipeline
            .encode_chat(&messages, thinking)
            .map_err(|e| ApiError::field("messages", format!("{e:#}")))?;
        if r.top_logprobs.is_some() && !r.logprobs {
            return Err(ApiError::field(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        let top = r.logprobs.then(|| r.top_logprobs.unwrap_or(0));
        let (req, stops) = app.request(ids, &r.sampling, top)?;
        Ok((req, stops, r.sampling, top))
    };
    match run.await {
        Ok((req, stops, s, top)) => {
            let kind = respond::Kind::Chat { top };
            let usage = s.stream_options.is_some_and(|o| o.include_usage);
            respond::respond(app, req, stops, kind, s.stream, usage).await
        }
        Err(e) => refuse(&app, e),
    }
}

impl App {
    /// The generation request for `prompt` with `s`'s sampling over the server's defaults,
    /// checked against the model; and the stop strings.
    fn request(
        &self,
        prompt: Vec<u32>,
        s: &Sampling,
        top_logprobs: Option<usize>,
    ) -> Result<(GenerateRequest, Vec<String>), ApiError> {
        if s.n.is_some_and(|n| n != 1) {
            return Err(ApiError::field(
                "n",
                "this server generates one choice per request (n = 1)",
            ));
        }
        let max_tokens = s.max_completion_tokens.or(s.max_tokens);
        if max_tokens == Some(0) {
            return Err(ApiError::field(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        if let Some(t) = s.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::field(
                    "temperature",
                    format!("temperature must be between 0 and 2, got {t}"),
                ));
            }
        }
        if let Some(p) = s.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::field(
                    "top_p",
                    format!("top_p must be in (0, 1], got {p}"),
                ));
            }
        }
        if let Some(k) = top_logprobs {
            if k > MAX_TOP_LOGPROBS {
                return Err(ApiError::field(
                    "top_logprobs",
                    format!("at most {MAX_TOP_LOGPROBS} alternatives per token, got {k}"),
                ));
            }
        }
        let stops = s
            .stop
            .clone()
            .map(api::Strings::into_vec)
            .unwrap_or_default();
        if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
            return Err(ApiError::field(
                "stop",
                format!("give at most {MAX_STOPS} non-empty stop strings"),
            ));
        }
        let opts = RequestOptions {
            max_tokens: max_tokens.or(self.opts.defaults.max_tokens),
            temperature: s.temperature.or(self.opts.defaults.temperature),
            top_k: s.top_k.or(self.opts.defaults.top_k),
            top_p: s.top_p.or(self.opts.defaults.top_p),
            seed: s.seed.or(self.opts.defaults.seed),
            // The chosen token's log-prob is recorded with at least one alternative.
            top_logprobs: top_logprobs.map_or(0, |k| k.max(1)),
            ignore_eos: s.ignore_eos || self.opts.defaults.ignore_eos,
            ..self.opts.defaults.clone()
        };
        let req = self.pipeline.request(prompt, &opts);
        generate::validate(self.pipeline.model.as_ref(), &req).map_err(|e| {
            let text = format!("{e:#}");
            let param = if text.contains("prompt") {
                "prompt"
            } else {
                "sampling"
            };
            ApiError::field(param, text)
        })?;
        Ok((req, stops))
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Relaxed)
    }

    /// Admits a request, or refuses it when the batch and the queue are full.
    fn admit(self: &Arc<Self>) -> Result<InFlight, ApiError> {
        let limit = self.opts.max_concurrent + self.opts.max_queue;
        let now = self.in_flight.fetch_add(1, Relaxed);
        let ticket = InFlight(self.clone());
        if now >= limit {
            return Err(ApiError::with(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the server is full: {} requests running and {} waiting (--max-concurrent, --max-queue); retry later",
                    self.opts.max_concurrent, self.opts.max_queue
                ),
            ));
        }
        Ok(ticket)
    }

    fn submit(&self, job: Job) -> Result<(), ApiError> {
        let sent = self
            .jobs
            .lock()
            .map_err(|_| ApiError::with(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped"))?
            .send(job);
        sent.map_err(|_| ApiError::with(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped"))
    }
}

/// A request counted in flight until it is dropped (answered, or its client went away).
pub(crate) struct InFlight(Arc<App>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

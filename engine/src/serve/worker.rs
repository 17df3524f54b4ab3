//! The engine thread: one [`Scheduler`] for every request the server admits. Jobs arrive on a
//! channel; at each token boundary waiting jobs join while the batch and the KV budget have
//! room, every running sequence decodes one token, and each token goes to its request's
//! stream. A request whose stream is gone (the client disconnected) leaves the batch at the
//! next boundary, freeing its caches.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use crate::generate::scheduler::{Room, Scheduler, SeqId, TokenLogprobs, Update};
use crate::generate::{FinishReason, GenerateRequest};

/// A request admitted by the HTTP side.
pub struct Job {
    pub req: GenerateRequest,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// What a request's stream receives.
#[derive(Debug)]
pub enum Event {
    /// It joined the batch, with this many prompt tokens from the prefix cache.
    Started { cached_prompt_tokens: usize },
    Token {
        token: u32,
        logprobs: Option<TokenLogprobs>,
    },
    Done {
        finish: FinishReason,
        cached_prompt_tokens: usize,
    },
    /// The request cannot run (it needs more KV than the whole budget) or failed midway.
    Failed { message: String, client: bool },
}

struct Live {
    events: UnboundedSender<Event>,
    arrived: Instant,
    last_token: Option<Instant>,
}

/// Runs jobs until the channel closes and every admitted job has finished.
pub fn run(mut sched: Scheduler, jobs: Receiver<Job>, metrics: &Metrics) {
    let mut waiting: VecDeque<(SeqId, Job)> = VecDeque::new();
    let mut live: HashMap<SeqId, Live> = HashMap::new();
    let mut next_id: SeqId = 0;
    let mut open = true;
    loop {
        // Take new jobs: wait for one when there is nothing to do.
        if sched.running() == 0 && waiting.is_empty() {
            if !open {
                return;
            }
            match jobs.recv() {
                Ok(job) => {
                    waiting.push_back((next_id, job));
                    next_id += 1;
                }
                Err(_) => return,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(job) => {
                    waiting.push_back((next_id, job));
                    next_id += 1;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // Clients that went away: waiting ones are dropped, running ones cancelled.
        waiting.retain(|(_, job)| !job.events.is_closed());
        let gone: Vec<SeqId> = live
            .iter()
            .filter(|(_, l)| l.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            sched.cancel(id);
            live.remove(&id);
            metrics.cancelled.fetch_add(1, Relaxed);
        }
        // Join while there is room.
        while let Some((_, job)) = waiting.front() {
            match sched.room_for(&job.req) {
                Room::Later => break,
                Room::Never => {
                    let (_, job) = waiting.pop_front().expect("front exists");
                    let _ = job.events.send(Event::Failed {
                        message: "the prompt and max_tokens need more KV cache than the server's whole budget (--kv-budget-mib); ask for fewer tokens".into(),
                        client: true,
                    });
                }
                Room::Now => {
                    let (id, job) = waiting.pop_front().expect("front exists");
                    let prompt = job.req.prompt_ids.len();
                    match sched.join(id, job.req) {
                        Ok(cached_prompt_tokens) => {
                            metrics.prompt_tokens.fetch_add(prompt as u64, Relaxed);
                            metrics
                                .cached_prompt_tokens
                                .fetch_add(cached_prompt_tokens as u64, Relaxed);
                            let _ = job.events.send(Event::Started {
                                cached_prompt_tokens,
                            });
                            live.insert(
                                id,
                                Live {
                                    events: job.events,
                                    arrived: job.arrived,
                                    last_token: None,
                                },
                            );
                        }
                        Err(e) => {
                            let _ = job.events.send(Event::Failed {
                                message: format!("{e:#}"),
                                client: false,
                            });
                        }
                    }
                }
            }
        }
        metrics.queued.store(waiting.len(), Relaxed);
        // One token for every running sequence.
        let mut gone = Vec::new();
        sched.step(|id, update| {
            let Some(l) = live.get_mut(&id) else {
                return;
            };
            let now = Instant::now();
            let event = match update {
                Update::Token { token, logprobs } => {
                    metrics.generated_tokens.fetch_add(1, Relaxed);
                    match l.last_token {
                        None => metrics.observe_ttft((now - l.arrived).as_secs_f64()),
                        Some(t) => metrics.observe_inter_token((now - t).as_secs_f64()),
                    }
                    l.last_token = Some(now);
                    Event::Token { token, logprobs }
                }
                Update::Finished(f) => {
                    gone.push(id);
                    if let Some(m) = &f.output.mtp {
                        metrics.drafted_tokens.fetch_add(m.drafted as u64, Relaxed);
                        metrics
                            .accepted_tokens
                            .fetch_add(m.accepted as u64, Relaxed);
                    }
                    Event::Done {
                        finish: f.output.finish_reason,
                        cached_prompt_tokens: f.cached_prompt_tokens,
                    }
                }
                Update::Failed(e) => {
                    gone.push(id);
                    Event::Failed {
                        message: format!("{e:#}"),
                        client: false,
                    }
                }
            };
            if l.events.send(event).is_err() {
                gone.push(id);
            }
        });
        for id in gone {
            // A sequence that finished has left already; one whose client went away leaves now.
            if sched.cancel(id) {
                metrics.cancelled.fetch_add(1, Relaxed);
            }
            live.remove(&id);
        }
        metrics.running.store(sched.running(), Relaxed);
        metrics.kv_bytes.store(sched.kv_bytes(), Relaxed);
        metrics
            .cached_prefixes
            .store(sched.cached_prefixes(), Relaxed);
    }
}

//! What `GET /metrics` reports, in the Prometheus text format (version 0.0.4): counters of
//! requests and tokens, gauges of the queue and the batch, and histograms of the time to first
//! token and between tokens.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (c, &le) in self.counts.iter_mut().zip(&BUCKETS) {
            if secs <= le {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, le) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Default)]
pub struct Metrics {
    pub ok: AtomicU64,
    pub client_errors: AtomicU64,
    pub rejected: AtomicU64,
    pub server_errors: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Speculative decoding (`--mtp`): tokens the draft head proposed, and those the model
    /// kept, over finished requests.
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Requests waiting to join the batch.
    pub queued: AtomicUsize,
    /// Sequences in the batch.
    pub running: AtomicUsize,
    /// Bytes the KV caches of the running sequences hold.
    pub kv_bytes: AtomicUsize,
    /// Finished states kept for prefix reuse.
    pub cached_prefixes: AtomicUsize,
    ttft: Mutex<Histogram>,
    inter_token: Mutex<Histogram>,
}

impl Metrics {
    /// Counts an error answer by its status: 429 and 503 (the server is full or stopping) as
    /// rejected, other 4xx as client errors, the rest as server errors.
    pub fn count_error(&self, status: u16) {
        let c = match status {
            429 | 503 => &self.rejected,
            400..=499 => &self.client_errors,
            _ => &self.server_errors,
        };
        c.fetch_add(1, Relaxed);
    }

    pub fn observe_ttft(&self, secs: f64) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(secs);
        }
    }

    pub fn observe_inter_token(&self, secs: f64) {
        if let Ok(mut h) = self.inter_token.lock() {
            h.observe(secs);
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP engine_requests_total Requests answered, by outcome.\n# TYPE engine_requests_total counter"
        );
        for (outcome, c) in [
            ("ok", &self.ok),
            ("client_error", &self.client_errors),
            ("rejected", &self.rejected),
            ("server_error", &self.server_errors),
            ("cancelled", &self.cancelled),
        ] {
            let _ = writeln!(
                out,
                "engine_requests_total{{outcome=\"{outcome}\"}} {}",
                c.load(Relaxed)
            );
        }
        for (name, help, c) in [
            (
                "engine_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                &self.prompt_tokens,
            ),
            (
                "engine_cached_prompt_tokens_total",
                "Prompt tokens taken from the prefix cache instead of prefilled.",
                &self.cached_prompt_tokens,
            ),
            (
                "engine_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "engine_mtp_drafted_tokens_total",
                "Tokens the MTP head drafted (--mtp), over finished requests.",
                &self.drafted_tokens,
            ),
            (
                "engine_mtp_accepted_tokens_total",
                "Drafted tokens the model kept, over finished requests.",
                &self.accepted_tokens,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.load(Relaxed)
            );
        }
        for (name, help, g) in [
            (
                "engine_queue_depth",
                "Requests waiting to join the batch.",
                &self.queued,
            ),
            (
                "engine_running_sequences",
                "Sequences decoding in the batch.",
                &self.running,
            ),
            (
                "engine_kv_cache_bytes",
                "Bytes held by the KV caches of running sequences.",
                &self.kv_bytes,
            ),
            (
                "engine_cached_prefixes",
                "Finished sequences' states kept for prefix reuse.",
                &self.cached_prefixes,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                g.load(Relaxed)
            );
        }
        if let Ok(h) = self.ttft.lock() {
            h.render(
                &mut out,
                "engine_time_to_first_token_seconds",
                "From a request's arrival to its first token.",
            );
        }
        if let Ok(h) = self.inter_token.lock() {
            h.render(
                &mut out,
                "engine_inter_token_seconds",
                "Between consecutive tokens of one request.",
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counts_add_up() {
        let m = Metrics::default();
        for s in [0.001, 0.02, 0.02, 3.0, 500.0] {
            m.observe_ttft(s);
        }
        m.ok.fetch_add(2, Relaxed);
        let text = m.render();
        let value = |line: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(line))
                .unwrap_or_else(|| panic!("{line} missing in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(
            value("engine_time_to_first_token_seconds_bucket{le=\"0.005\"}"),
            1.0
        );
        assert_eq!(
            value("engine_time_to_first_token_seconds_bucket{le=\"0.025\"}"),
            3.0
        );
        assert_eq!(
            value("engine_time_to_first_token_seconds_bucket{le=\"5\"}"),
            4.0
        );
        assert_eq!(
            value("engine_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
            5.0
        );
        assert_eq!(value("engine_time_to_first_token_seconds_count"), 5.0);
        assert!((value("engine_time_to_first_token_seconds_sum") - 503.041).abs() < 1e-9);
        assert_eq!(value("engine_requests_total{outcome=\"ok\"}"), 2.0);
        // Every sample line belongs to a family declared by a TYPE line before it.
        let mut declared = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(
                    declared.iter().any(|d| name.starts_with(d.as_str())),
                    "{line}"
                );
            }
        }
    }
}

//! Summaries of `harness bench-serve`'s records, one per (label, concurrency, rate) level:
//! latency percentiles, throughput, prefix-cache hits; as a markdown table, CSV, JSON and two
//! plots (output throughput and median TTFT against concurrency, one curve per label).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::ServeRecord;
use crate::report::plot::{write_chart, ChartPoint, ChartSeries, LineChart};
use crate::report::stats::percentile;

/// p50, p90 and p99 of a set of times (ms).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    fn of(mut values: Vec<f64>) -> Percentiles {
        values.sort_by(f64::total_cmp);
        Percentiles {
            p50: percentile(&values, 0.50),
            p90: percentile(&values, 0.90),
            p99: percentile(&values, 0.99),
        }
    }
}

/// One level's summary.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    pub label: String,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub requests: usize,
    pub failed: usize,
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Finished requests per second over the level's wall time (first start to last end).
    pub requests_per_s: f64,
    /// Generated tokens per second over the same time.
    pub output_tokens_per_s: f64,
    /// Cached prompt tokens over prompt tokens, where the server reports both.
    pub prefix_hit_rate: Option<f64>,
}

impl Level {
    /// The summary of one level's records (all of one label, concurrency and rate).
    pub fn of(records: &[ServeRecord]) -> Level {
        let ok: Vec<&ServeRecord> = records.iter().filter(|r| r.error.is_none()).collect();
        let first = records.first();
        let begin = ok.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
        let end = ok
            .iter()
            .map(|r| r.start_s + r.timing.e2e_ms / 1e3)
            .fold(0.0, f64::max);
        let wall = (end - begin).max(1e-9);
        let tokens: usize = ok.iter().map(|r| r.timing.completion_tokens).sum();
        let (prompt, cached) = ok.iter().fold((0, 0), |(p, c), r| {
            match (r.timing.prompt_tokens, r.timing.cached_tokens) {
                (Some(pt), Some(ct)) => (p + pt, c + ct),
                _ => (p, c),
            }
        });
        Level {
            label: first.map_or_else(String::new, |r| r.label.clone()),
            concurrency: first.map_or(0, |r| r.concurrency),
            rate: first.and_then(|r| r.rate),
            requests: records.len(),
            failed: records.len() - ok.len(),
            ttft_ms: Percentiles::of(ok.iter().map(|r| r.timing.ttft_ms).collect()),
            itl_ms: Percentiles::of(
                ok.iter()
                    .flat_map(|r| r.timing.itl_ms.iter().copied())
                    .collect(),
            ),
            e2e_ms: Percentiles::of(ok.iter().map(|r| r.timing.e2e_ms).collect()),
            requests_per_s: if ok.is_empty() {
                0.0
            } else {
                ok.len() as f64 / wall
            },
            output_tokens_per_s: if ok.is_empty() {
                0.0
            } else {
                tokens as f64 / wall
            },
            prefix_hit_rate: (prompt > 0).then(|| cached as f64 / prompt as f64),
        }
    }
}

/// The levels in `records`, ordered by label then concurrency.
pub fn levels(records: &[ServeRecord]) -> Vec<Level> {
    let mut groups: BTreeMap<(String, usize, String), Vec<ServeRecord>> = BTreeMap::new();
    for r in records {
        let rate = r.rate.map_or_else(String::new, |x| format!("{x}"));
        groups
            .entry((r.label.clone(), r.concurrency, rate))
            .or_default()
            .push(r.clone());
    }
    groups.values().map(|g| Level::of(g)).collect()
}

fn p(x: &Percentiles) -> String {
    format!("{:.1} / {:.1} / {:.1}", x.p50, x.p90, x.p99)
}

/// A one-line progress summary of a level.
pub fn one_line(l: &Level) -> String {
    format!(
        "{} c={}: {} requests ({} failed), TTFT p50 {:.1} ms, ITL p50 {:.1} ms, {:.1} tok/s",
        l.label,
        l.concurrency,
        l.requests,
        l.failed,
        l.ttft_ms.p50,
        l.itl_ms.p50,
        l.output_tokens_per_s
    )
}

/// The levels as a markdown table; a speedup column against each label's concurrency 1.
pub fn markdown(levels: &[Level]) -> String {
    let mut s = String::from(
        "| label | concurrency | rate | requests (failed) | TTFT ms p50 / p90 / p99 | ITL ms p50 / p90 / p99 | E2E ms p50 / p90 / p99 | req/s | output tok/s | vs concurrency 1 | prefix hits |\n|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|\n",
    );
    for l in levels {
        let base = levels
            .iter()
            .find(|b| b.label == l.label && b.concurrency == 1 && b.rate == l.rate)
            .map(|b| b.output_tokens_per_s);
        s += &format!(
            "| {} | {} | {} | {} ({}) | {} | {} | {} | {:.2} | {:.1} | {} | {} |\n",
            l.label,
            l.concurrency,
            l.rate.map_or("closed".into(), |r| format!("{r}/s")),
            l.requests,
            l.failed,
            p(&l.ttft_ms),
            p(&l.itl_ms),
            p(&l.e2e_ms),
            l.requests_per_s,
            l.output_tokens_per_s,
            base.filter(|&b| b > 0.0)
                .map_or("".into(), |b| format!("{:.2}×", l.output_tokens_per_s / b)),
            l.prefix_hit_rate
                .map_or("n/a".into(), |h| format!("{:.0}%", 100.0 * h)),
        );
    }
    s
}

/// Writes serve.md, serve.csv, serve.json and the throughput and TTFT plots into `dir`.
pub fn write(records: &[ServeRecord], dir: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let levels = levels(records);
    let md = markdown(&levels);
    let mut files = Vec::new();
    let mut put = |name: &str, text: String| -> Result<()> {
        std::fs::write(dir.join(name), text)
            .with_context(|| format!("writing {}", dir.join(name).display()))?;
        files.push(name.to_string());
        Ok(())
    };
    put(
        "serve.md",
        format!(
            "# Serving benchmark\n\n{md}\n![output throughput](throughput.svg)\n\n![TTFT](ttft.svg)\n"
        ),
    )?;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "label",
        "concurrency",
        "rate",
        "requests",
        "failed",
        "ttft_p50_ms",
        "ttft_p90_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p90_ms",
        "itl_p99_ms",
        "e2e_p50_ms",
        "e2e_p90_ms",
        "e2e_p99_ms",
        "requests_per_s",
        "output_tokens_per_s",
        "prefix_hit_rate",
    ])?;
    for l in &levels {
        let f = |x: f64| format!("{x:.3}");
        w.write_record([
            l.label.clone(),
            l.concurrency.to_string(),
            l.rate.map_or(String::new(), |r| r.to_string()),
            l.requests.to_string(),
            l.failed.to_string(),
            f(l.ttft_ms.p50),
            f(l.ttft_ms.p90),
            f(l.ttft_ms.p99),
            f(l.itl_ms.p50),
            f(l.itl_ms.p90),
            f(l.itl_ms.p99),
            f(l.e2e_ms.p50),
            f(l.e2e_ms.p90),
            f(l.e2e_ms.p99),
            f(l.requests_per_s),
            f(l.output_tokens_per_s),
            l.prefix_hit_rate.map_or(String::new(), f),
        ])?;
    }
    put("serve.csv", String::from_utf8(w.into_inner()?)?)?;
    put("serve.json", serde_json::to_string_pretty(&levels)?)?;
    let mut by_label: BTreeMap<&str, Vec<&Level>> = BTreeMap::new();
    for l in &levels {
        by_label.entry(&l.label).or_default().push(l);
    }
    let curve = |y: &dyn Fn(&Level) -> (f64, f64, f64)| -> Vec<ChartSeries> {
        by_label
            .iter()
            .map(|(name, ls)| ChartSeries {
                name: name.to_string(),
                points: ls
                    .iter()
                    .map(|l| {
                        let (y, lo, hi) = y(l);
                        ChartPoint {
                            x: l.concurrency as f64,
                            y,
                            lo,
                            hi,
                        }
                    })
                    .collect(),
            })
            .collect()
    };
    let throughput = LineChart {
        title: "Output throughput vs concurrency".into(),
        x_label: "requests in flight (log scale)".into(),
        y_label: "generated tokens/s (all requests)".into(),
        y_log: false,
        series: curve(&|l| {
            (
                l.output_tokens_per_s,
                l.output_tokens_per_s,
                l.output_tokens_per_s,
            )
        }),
        reference: None,
    };
    write_chart(&throughput, dir, "throughput")?;
    let ttft = LineChart {
        title: "Time to first token vs concurrency".into(),
        x_label: "requests in flight (log scale)".into(),
        y_label: "TTFT ms (p50, bar to p90; log)".into(),
        y_log: true,
        series: curve(&|l| (l.ttft_ms.p50, l.ttft_ms.p50, l.ttft_ms.p90)),
        reference: None,
    };
    write_chart(&ttft, dir, "ttft")?;
    files.extend(["throughput.svg", "throughput.png", "ttft.svg", "ttft.png"].map(String::from));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Machine;

    fn record(concurrency: usize, start_s: f64, e2e_ms: f64, ttft_ms: f64) -> ServeRecord {
        ServeRecord {
            kind: "serve".into(),
            label: "x".into(),
            url: String::new(),
            model: String::new(),
            machine: Machine::current(),
            commit: None,
            concurrency,
            rate: None,
            index: 0,
            prompt_words: 1,
            max_tokens: 4,
            start_s,
            timing: crate::bench_serve::client::Timing {
                ttft_ms,
                itl_ms: vec![1.0, 3.0],
                e2e_ms,
                completion_tokens: 4,
                prompt_tokens: Some(10),
                cached_tokens: Some(5),
            },
            error: None,
        }
    }

    #[test]
    fn throughput_is_over_the_levels_wall_time_and_percentiles_interpolate() {
        // Two requests from 0 s to 1 s and from 0.5 s to 2 s: 8 tokens in 2 s.
        let mut rs = vec![record(2, 0.0, 1000.0, 10.0), record(2, 0.5, 1500.0, 30.0)];
        let mut failed = record(2, 0.1, 0.0, 0.0);
        failed.error = Some("HTTP 500".into());
        rs.push(failed);
        let l = Level::of(&rs);
        assert_eq!((l.requests, l.failed), (3, 1));
        assert!(
            (l.output_tokens_per_s - 4.0).abs() < 1e-9,
            "{}",
            l.output_tokens_per_s
        );
        assert!((l.requests_per_s - 1.0).abs() < 1e-9);
        assert!((l.ttft_ms.p50 - 20.0).abs() < 1e-9);
        assert!((l.ttft_ms.p90 - 28.0).abs() < 1e-9);
        assert!((l.itl_ms.p50 - 2.0).abs() < 1e-9);
        assert_eq!(l.prefix_hit_rate, Some(0.5));
        // The speedup column compares with the same label's concurrency 1.
        let one = Level::of(&[record(1, 0.0, 2000.0, 5.0)]);
        let table = markdown(&[one, l]);
        assert!(table.contains("| 2.00× |"), "{table}");
    }
}

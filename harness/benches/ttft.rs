//! TTFT per execution path over prompt lengths on a synthetic checkpoint (docs/design.md §8), timed
//! exactly as `harness sweep` times it: the engine's own TTFT (prompt in → first logits on the
//! host) of a greedy one-token request. Throughput is in prompt tokens, so criterion also
//! prints prefill tokens/s.
//!
//! `cargo bench -p harness --bench ttft`; `harness report --criterion target/criterion` turns
//! the results into the report's tables and plots.
//!
//! Environment:
//! - `TTFT_BENCH_MODEL`: synth spec (default `qwen3_5:bench:bf16`);
//! - `TTFT_BENCH_PATHS`: comma-separated paths (default `gdn=perstep,gdn=chunked`);
//! - `TTFT_BENCH_LONG=1`: add 1024 and 4096 tokens to the default 64 and 256.

use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use harness::paths::parse_paths;
use harness::report::criterion::GROUP_PREFIX;
use harness::sweep::TtftRunner;
use synth::cached as synth_cached;
use synth::SynthSpec;

const DEFAULT_MODEL: &str = "qwen3_5:bench:bf16";
const DEFAULT_PATHS: &str = "gdn=perstep,gdn=chunked";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Setup errors end the bench with a message instead of a panic backtrace.
fn or_exit<T>(r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("ttft bench: {e:#}");
        std::process::exit(2)
    })
}

fn ttft(c: &mut Criterion) {
    let spec = or_exit(SynthSpec::parse(&env_or("TTFT_BENCH_MODEL", DEFAULT_MODEL)));
    let paths = or_exit(parse_paths(&env_or("TTFT_BENCH_PATHS", DEFAULT_PATHS)));
    let mut lengths = vec![64, 256];
    if std::env::var("TTFT_BENCH_LONG").is_ok_and(|v| v == "1") {
        lengths.extend([1024, 4096]);
    }
    let runner = or_exit(synth_cached(&spec).and_then(|dir| TtftRunner::load(&dir)));
    for &len in &lengths {
        or_exit(runner.check_length(len, 1));
    }

    let mut group = c.benchmark_group(format!("{GROUP_PREFIX}{spec}"));
    // A prefill takes milliseconds to seconds: few, flat samples keep the run to minutes.
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for &len in &lengths {
        let ids = runner.prompt(len, 0);
        group.throughput(Throughput::Elements(len as u64));
        // Paths side by side inside each length, as the sweep interleaves them.
        for path in &paths {
            group.bench_with_input(BenchmarkId::new(path.to_string(), len), &ids, |b, ids| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let out = runner
                            .run(ids.clone(), path, 1)
                            .expect("a validated request runs");
                        total += Duration::from_secs_f64(out.ttft_ms / 1e3);
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, ttft);
criterion_main!(benches);

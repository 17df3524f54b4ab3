//! The greedy output of a synthetic Qwen3 is the same for every run and thread count, in every
//! weight format (docs/design.md §3: work is split over output elements only).

use engine::{generate, Pipeline, RequestOptions};
use synth::cached as synth_cached;
use synth::SynthSpec;

const FORMATS: [&str; 7] = ["f32", "bf16", "q4", "q8", "mxfp4", "nvfp4", "mxfp8"];

fn greedy(p: &Pipeline, prompt: &str, prefill_step: Option<usize>) -> Vec<u32> {
    let ids = p.encode_prompt(prompt, false, None).unwrap();
    let opts = RequestOptions {
        max_tokens: Some(16),
        temperature: Some(0.0),
        ignore_eos: true,
        prefill_step,
        ..Default::default()
    };
    generate::generate(p.model.as_ref(), &p.request(ids, &opts), |_| {})
        .unwrap()
        .tokens
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn greedy_tokens_identical_across_runs_and_thread_counts_in_every_format() {
    let prompt = "The quick brown fox jumps over the lazy dog, and then it keeps running far away into the hills.";
    for fmt in FORMATS {
        let dir = synth_cached(&SynthSpec::parse(&format!("qwen3:tiny:{fmt}")).unwrap()).unwrap();
        let p = Pipeline::load(&dir).unwrap();
        let one = in_pool(1, || greedy(&p, prompt, None));
        let two = in_pool(2, || greedy(&p, prompt, None));
        let again = in_pool(2, || greedy(&p, prompt, None));
        assert_eq!(one.len(), 16, "{fmt}");
        assert_eq!(one, two, "{fmt}: 1 vs 2 threads");
        assert_eq!(two, again, "{fmt}: run to run");
        // Prefill in pieces reaches the same state (same greedy continuation).
        let pieces = in_pool(2, || greedy(&p, prompt, Some(5)));
        assert_eq!(one, pieces, "{fmt}: prefill in pieces of 5");
    }
}

//! Batches (issue 12): eight different requests (lengths, budgets, greedy and sampled) run as
//! one continuous batch give each request exactly what it gets alone — tokens and log-probs —
//! for every family (each decodes its rows together: the Llama family, Qwen3.5 dense and MoE,
//! LFM2's short convs, Gemma 4's shared KV and per-layer inputs), with flat and paged KV, with
//! a batch smaller than the request count (so sequences leave and join midway) and one that
//! holds all.

use engine::generate::{self, BatchOptions, GenerateRequest, PagedKv};
use engine::{Pipeline, RequestOptions};
use synth::cached as synth_cached;
use synth::SynthSpec;

fn load(spec: &str) -> Pipeline {
    Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap()
}

/// Eight requests of different prompt lengths and budgets; every third one sampled.
fn requests(p: &Pipeline, paged: bool) -> Vec<GenerateRequest> {
    let vocab = p.tokenizer.vocab_size() as u32 - 8;
    (0..8u32)
        .map(|i| {
            let n = 5 + 9 * i;
            let ids = (0..n)
                .map(|j| (j * 7919 + i * 104_729 + 13) % vocab)
                .collect();
            let opts = RequestOptions {
                max_tokens: Some(4 + 3 * i as usize),
                temperature: Some(if i % 3 == 2 { 0.8 } else { 0.0 }),
                seed: Some(i as u64),
                top_logprobs: 2,
                ignore_eos: true,
                paged_kv: paged.then_some(PagedKv {
                    block_size: 8,
                    blocks: None,
                }),
                ..Default::default()
            };
            p.request(ids, &opts)
        })
        .collect()
}

#[test]
fn a_batch_of_eight_equals_eight_single_runs() {
    for spec in [
        "qwen3:tiny:q4:mlx",
        "llama:tiny:bf16:hf",
        "qwen2:tiny:q8:mlx",
        "gemma3:tiny:bf16:hf",
        "minicpm:tiny:f32:hf",
        "qwen3_5:tiny:f32:hf",
        "qwen3_5:tiny:bf16:hf",
        "qwen3_5_moe:tiny:q4:mlx",
        "gemma4:tiny:f32:hf",
        "gemma4_moe:tiny:bf16:hf",
        "lfm2:tiny:bf16:hf",
        "lfm2_moe:tiny:q4:mlx",
    ] {
        let p = load(spec);
        for paged in [false, true] {
            let reqs = requests(&p, paged);
            let alone: Vec<_> = reqs
                .iter()
                .map(|r| generate::generate(p.model.as_ref(), r, |_| {}).unwrap())
                .collect();
            for max_batch in [3, 8] {
                let mut streamed = vec![Vec::new(); reqs.len()];
                let outs = generate::generate_batch(
                    p.model.as_ref(),
                    &reqs,
                    BatchOptions { max_batch },
                    |i, t| streamed[i].push(t),
                )
                .unwrap();
                for (i, (got, want)) in outs.iter().zip(&alone).enumerate() {
                    let what = format!("{spec} paged={paged} batch {max_batch}, request {i}");
                    assert_eq!(got.tokens.len(), 4 + 3 * i, "{what}");
                    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
                    assert_eq!(got.top_logprobs, want.top_logprobs, "{what}: log-probs");
                    assert_eq!(streamed[i], want.tokens, "{what}: streamed");
                }
            }
        }
    }
}

#[test]
fn a_batch_refuses_what_it_cannot_run() {
    let p = load("qwen3:tiny:f32:hf");
    let mut reqs = requests(&p, true);
    // A pool smaller than the largest request.
    for r in &mut reqs {
        r.paged_kv = Some(PagedKv {
            block_size: 8,
            blocks: Some(3),
        });
    }
    let err = generate::generate_batch(
        p.model.as_ref(),
        &reqs,
        BatchOptions { max_batch: 8 },
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--kv-blocks"), "{err}");
    // Mixed KV layouts.
    let mut reqs = requests(&p, false);
    reqs[3].flat_kv = true;
    let err = generate::generate_batch(
        p.model.as_ref(),
        &reqs,
        BatchOptions { max_batch: 8 },
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("request 4") && err.contains("same KV layout"),
        "{err}"
    );
    // A bad token id names its request.
    let mut reqs = requests(&p, false);
    reqs[1].prompt_ids[0] = 1 << 30;
    let err = format!(
        "{:#}",
        generate::generate_batch(
            p.model.as_ref(),
            &reqs,
            BatchOptions { max_batch: 8 },
            |_, _| {}
        )
        .unwrap_err()
    );
    assert!(
        err.contains("request 2") && err.contains("vocabulary"),
        "{err}"
    );
}

#[test]
fn a_small_pool_makes_requests_wait_instead_of_failing() {
    // The pool holds what two of the largest requests need, not eight: the batch runs them
    // as blocks free up, with the same results.
    let p = load("qwen3:tiny:f32:hf");
    let mut reqs = requests(&p, true);
    for r in &mut reqs {
        r.paged_kv = Some(PagedKv {
            block_size: 8,
            blocks: Some(2 * (68 + 25_usize).div_ceil(8)),
        });
    }
    let outs = generate::generate_batch(
        p.model.as_ref(),
        &reqs,
        BatchOptions { max_batch: 8 },
        |_, _| {},
    )
    .unwrap();
    for (got, r) in outs.iter().zip(&reqs) {
        let want = generate::generate(p.model.as_ref(), r, |_| {}).unwrap();
        assert_eq!(got.tokens, want.tokens);
    }
}

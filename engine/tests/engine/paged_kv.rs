//! Paged KV (issue 12): full-attention layers keep their keys and values in blocks of a pool,
//! read through block tables. Paged decoding gives the flat cache's tokens for every family
//! (whole and pieced prefill, with rotating sliding-window layers beside paged full ones, and
//! through MTP rollbacks); blocks with equal contents are shared across sequences and freed
//! with their last user; running out of blocks is an error that leaves the pool consistent.

use engine::cache::{KvPool, LayerState, ModelState};
use engine::generate::{self, ForcedDrafts, GenerateOutput, MtpOptions, PagedKv};
use engine::models::CausalLm;
use engine::{Pipeline, RequestOptions};
use synth::cached as synth_cached;
use synth::SynthSpec;

fn load(spec: &str) -> Pipeline {
    Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap()
}

fn prompt(p: &Pipeline, n: u32, salt: u32) -> Vec<u32> {
    let vocab = p.tokenizer.vocab_size() as u32 - 8;
    (0..n)
        .map(|i| (i * 7919 + salt * 31 + 13) % vocab)
        .collect()
}

fn run(p: &Pipeline, ids: &[u32], opts: RequestOptions) -> GenerateOutput {
    let opts = RequestOptions {
        max_tokens: Some(20),
        temperature: Some(0.0),
        ignore_eos: true,
        top_logprobs: 3,
        ..opts
    };
    generate::generate(p.model.as_ref(), &p.request(ids.to_vec(), &opts), |_| {}).unwrap()
}

fn paged(block_size: usize) -> Option<PagedKv> {
    Some(PagedKv {
        block_size,
        blocks: None,
    })
}

#[test]
fn paged_equals_flat_for_every_family() {
    for spec in [
        "qwen3:tiny:f32:hf",
        "qwen3_5:tiny:f32:hf",
        "qwen3_5_moe:tiny:q4:mlx",
        "lfm2:tiny:bf16:hf",
        "lfm2_moe:tiny:q4:mlx",
        "gemma4:tiny:f32:hf",
        "gemma4_moe:tiny:q4:mlx",
        "llama:tiny:q8:mlx",
        "minicpm:tiny:f32:hf",
    ] {
        let p = load(spec);
        // Longer than the tiny Gemma 4 window (32), so its rotating layers wrap beside the
        // paged full ones.
        let ids = prompt(&p, 75, 1);
        for (block, step) in [(16, None), (16, Some(7)), (5, Some(33)), (1, None)] {
            let flat = run(
                &p,
                &ids,
                RequestOptions {
                    prefill_step: step,
                    ..Default::default()
                },
            );
            let got = run(
                &p,
                &ids,
                RequestOptions {
                    paged_kv: paged(block),
                    prefill_step: step,
                    ..Default::default()
                },
            );
            assert_eq!(
                got.tokens, flat.tokens,
                "{spec}: paged (blocks of {block}, prefill step {step:?}) differs from flat"
            );
            // The CPU reads paged keys in the same tiles and order: bit for bit equal.
            assert_eq!(got.top_logprobs, flat.top_logprobs, "{spec}: log-probs");
        }
    }
}

#[test]
fn paged_mtp_rollbacks_equal_plain_decoding() {
    let p = load("qwen3_5:tiny:f32:hf");
    let ids = prompt(&p, 40, 2);
    let plain = run(&p, &ids, RequestOptions::default());
    for correct in [0, 1, 3] {
        let out = run(
            &p,
            &ids,
            RequestOptions {
                paged_kv: paged(4),
                mtp: Some(MtpOptions {
                    forced: Some(ForcedDrafts {
                        reference: plain.tokens.clone(),
                        correct,
                    }),
                    ..MtpOptions::new(3)
                }),
                ..Default::default()
            },
        );
        assert_eq!(out.tokens, plain.tokens, "forced {correct} of 3 correct");
    }
}

/// The first paged KV layer's block table of `state`.
fn table(state: &ModelState) -> Vec<u32> {
    state
        .layers
        .iter()
        .find_map(|l| match l {
            LayerState::Kv(c) => c.pages.as_ref().map(|p| p.table().0),
            _ => None,
        })
        .expect("a paged layer")
}

fn paged_state(m: &dyn CausalLm, pool: &KvPool) -> ModelState {
    m.new_state().with_paged_kv(pool).unwrap()
}

#[test]
fn equal_prefixes_share_blocks_and_the_last_user_frees_them() {
    let p = load("qwen3:tiny:f32:hf");
    let m = p.model.as_ref();
    let pool = KvPool::for_state(&m.new_state(), 8, 64).unwrap();
    let ids = prompt(&p, 30, 3);
    let mut a = paged_state(m, &pool);
    m.forward(&ids, &mut a, false).unwrap();
    // 30 positions: three full blocks of 8 and a partial one.
    assert!(pool.usage().iter().all(|u| (u.used, u.shared) == (4, 0)));

    // The same 30 tokens, then a different tail: the three full blocks are shared.
    let mut b = paged_state(m, &pool);
    m.forward(&ids, &mut b, false).unwrap();
    m.forward(&prompt(&p, 5, 9), &mut b, false).unwrap();
    assert_eq!(table(&a)[..3], table(&b)[..3], "full prefix blocks shared");
    assert_ne!(
        table(&a)[3],
        table(&b)[3],
        "the partial block is each one's own"
    );
    // a: 4 blocks; b: the 3 shared + its own 4th and 5th (35 positions).
    assert!(
        pool.usage().iter().all(|u| (u.used, u.shared) == (6, 3)),
        "{:?}",
        pool.usage()
    );

    // A different prompt shares nothing.
    let mut c = paged_state(m, &pool);
    m.forward(&prompt(&p, 16, 4), &mut c, false).unwrap();
    assert!(pool.usage().iter().all(|u| (u.used, u.shared) == (8, 3)));

    drop(a);
    assert!(pool.usage().iter().all(|u| (u.used, u.shared) == (7, 0)));
    // b still reads its (formerly shared) prefix: its next token is what a flat cache gives.
    let mut flat = m.new_state();
    m.forward(&ids, &mut flat, false).unwrap();
    m.forward(&prompt(&p, 5, 9), &mut flat, false).unwrap();
    assert_eq!(
        m.forward(&[7], &mut b, false)
            .unwrap()
            .to_vec_f32()
            .unwrap(),
        m.forward(&[7], &mut flat, false)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    );
    drop((b, c));
    assert!(pool.usage().iter().all(|u| u.used == 0));
    pool.check_consistent().unwrap();
}

#[test]
fn a_trim_into_a_shared_block_copies_it_before_writing() {
    let p = load("qwen3:tiny:f32:hf");
    let m = p.model.as_ref();
    let pool = KvPool::for_state(&m.new_state(), 8, 64).unwrap();
    let ids = prompt(&p, 24, 5);
    let (mut a, mut b) = (paged_state(m, &pool), paged_state(m, &pool));
    m.forward(&ids, &mut a, false).unwrap();
    m.forward(&ids, &mut b, false).unwrap();
    assert_eq!(table(&a), table(&b), "three full blocks, all shared");
    // b rolls back into its last (shared) block and writes other tokens there.
    assert!(b.trim_to(20).unwrap());
    let other = prompt(&p, 4, 6);
    let got = m
        .forward(&other, &mut b, false)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_ne!(table(&a)[2], table(&b)[2], "copied on write");
    // a is untouched: its continuation equals a flat cache's, and so is b's.
    let mut flat = m.new_state();
    m.forward(&ids[..20], &mut flat, false).unwrap();
    let want = m
        .forward(&other, &mut flat, false)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_eq!(got, want);
    let mut flat_a = m.new_state();
    m.forward(&ids, &mut flat_a, false).unwrap();
    assert_eq!(
        m.forward(&[3], &mut a, false)
            .unwrap()
            .to_vec_f32()
            .unwrap(),
        m.forward(&[3], &mut flat_a, false)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    );
    pool.check_consistent().unwrap();
}

#[test]
fn an_exhausted_pool_is_an_error_that_leaves_it_consistent() {
    let p = load("qwen3:tiny:f32:hf");
    let m = p.model.as_ref();
    let pool = KvPool::for_state(&m.new_state(), 4, 6).unwrap();
    let mut a = paged_state(m, &pool);
    m.forward(&prompt(&p, 18, 7), &mut a, false).unwrap();
    let before = pool.usage();
    assert!(before.iter().all(|u| u.used == 5));
    // Another sequence needs 3 blocks where 1 is free.
    let mut b = paged_state(m, &pool);
    let err = m
        .forward(&prompt(&p, 10, 8), &mut b, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("KV block pool of layer")
            && err.contains("exhausted")
            && err.contains("--kv-blocks"),
        "{err}"
    );
    pool.check_consistent().unwrap();
    drop(b);
    assert_eq!(pool.usage(), before, "the failed sequence holds nothing");
    // The first sequence goes on (two more positions fit its last block and the free one).
    m.forward(&[1, 2], &mut a, false).unwrap();
    pool.check_consistent().unwrap();
    drop(a);
    assert!(pool.usage().iter().all(|u| u.used == 0));
}

#[test]
fn a_request_larger_than_its_pool_is_refused() {
    // What `engine generate --kv paged --kv-blocks 2` runs.
    let p = load("qwen3:tiny:f32:hf");
    let opts = RequestOptions {
        max_tokens: Some(40),
        ignore_eos: true,
        paged_kv: Some(PagedKv {
            block_size: 16,
            blocks: Some(2),
        }),
        ..Default::default()
    };
    let req = p.request(prompt(&p, 20, 1), &opts);
    let err = generate::generate(p.model.as_ref(), &req, |_| {}).unwrap_err();
    assert!(format!("{err:#}").contains("exhausted"), "{err:#}");
}

//! MTP speculative decoding (issue 12, greedy part) on synthetic Qwen3.5 dense and MoE
//! checkpoints with their `mtp.*` head: the output equals plain greedy decoding for every draft
//! depth, with the head's own drafts and with forced ones (all correct, all wrong, the first
//! one correct), so full, partial and zero acceptance and every rollback run; a rollback then
//! replay leaves the state bit-identical to running the kept tokens alone.

use std::collections::HashMap;

use engine::cache::ModelState;
use engine::generate::{self, ForcedDrafts, GenerateOutput, MtpOptions};
use engine::layers::gated_delta::GdnPath;
use engine::models::CausalLm;
use engine::{Pipeline, RequestOptions};
use synth::cached as synth_cached;
use synth::SynthSpec;

fn load(spec: &str) -> Pipeline {
    Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap()
}

fn prompt(p: &Pipeline, n: u32) -> Vec<u32> {
    let vocab = p.tokenizer.vocab_size() as u32 - 8;
    (0..n).map(|i| (i * 7919 + 13) % vocab).collect()
}

fn run(p: &Pipeline, ids: &[u32], gdn: GdnPath, mtp: Option<MtpOptions>) -> GenerateOutput {
    let opts = RequestOptions {
        max_tokens: Some(24),
        temperature: Some(0.0),
        ignore_eos: true,
        gdn_path: Some(gdn),
        mtp,
        ..Default::default()
    };
    generate::generate(p.model.as_ref(), &p.request(ids.to_vec(), &opts), |_| {}).unwrap()
}

/// Every depth, the head's drafts and three forced patterns: tokens equal plain decoding.
fn mtp_equals_plain(spec: &str, gdn: GdnPath) {
    let p = load(spec);
    let ids = prompt(&p, 70);
    let plain = run(&p, &ids, gdn, None);
    assert_eq!(plain.tokens.len(), 24);
    for depth in 1..=4 {
        let forced = |correct| {
            Some(ForcedDrafts {
                reference: plain.tokens.clone(),
                correct,
            })
        };
        for (what, forced) in [
            ("own drafts", None),
            ("all correct", forced(depth)),
            ("all wrong", forced(0)),
            ("first correct", forced(1)),
        ] {
            let opts = MtpOptions {
                forced,
                ..MtpOptions::new(depth)
            };
            let out = run(&p, &ids, gdn, Some(opts));
            assert_eq!(
                out.tokens, plain.tokens,
                "{spec} {gdn:?} --mtp {depth}, {what}: output differs from plain decoding"
            );
            let m = out.mtp.expect("MTP stats");
            // Rejections return to the kept position from the recorded states (no replay).
            assert_eq!(m.replays, 0, "{what}: {m:?}");
            match what {
                "all correct" => {
                    assert_eq!((m.accepted, m.rollbacks), (m.drafted, 0), "{what}: {m:?}");
                    assert_eq!(m.plain_steps, 0, "{what}: {m:?}");
                    // Every round drafts the full depth (the budget's end aside).
                    assert!(m.drafted + depth > m.rounds * depth, "{what}: {m:?}");
                }
                "all wrong" => {
                    assert_eq!((m.accepted, m.rollbacks), (0, m.rounds), "{m:?}");
                    // Drafting backs off: most tokens come from plain steps.
                    assert!(m.plain_steps > 24 / 2, "{what}: {m:?}");
                }
                "first correct" if depth > 1 => {
                    assert!(
                        m.accepted > 0 && m.rollbacks > 0,
                        "partial acceptance: {m:?}"
                    );
                    // Depth settles at the one kept draft plus one.
                    assert!(m.drafted <= 2 * m.rounds + depth, "{what}: {m:?}");
                }
                _ => {}
            }
        }
        // Drafts from 16 ids and the sequence's own: the output is still plain decoding's.
        let small = MtpOptions {
            draft_vocab: Some(16),
            ..MtpOptions::new(depth)
        };
        let out = run(&p, &ids, gdn, Some(small));
        assert_eq!(
            out.tokens, plain.tokens,
            "{spec} {gdn:?} --mtp {depth} over a 16-id draft vocabulary"
        );
    }
}

/// The head's logits over part of the vocabulary (leading ids, then gathered ones) are its
/// logits over the whole vocabulary at those ids.
#[test]
fn draft_logits_over_part_of_the_vocabulary_are_the_whole_ones_at_those_ids() {
    for spec in ["qwen3_5:tiny:f32:hf", "qwen3_5:tiny:bf16:hf"] {
        let p = load(spec);
        let m: &dyn CausalLm = p.model.as_ref();
        let drafter = m.drafter().expect("a head");
        let ids = prompt(&p, 12);
        let mut state = m.new_state();
        let (_, hidden) = drafter
            .forward_hidden(&ids[..11], &mut state, false)
            .unwrap();
        let mut draft_state = drafter.new_draft_state();
        let out = drafter.draft(&ids[1..], &hidden, &mut draft_state).unwrap();
        let head = out.narrow0(out.dim(0) - 1, 1).unwrap();
        let vocab = m.info().vocab_size;
        let whole = drafter.draft_logits(&head, vocab, &[]).unwrap();
        let whole = whole.to_vec_f32().unwrap();
        assert_eq!(whole.len(), vocab);
        let extra = [vocab as u32 - 1, 500, 37];
        let part = drafter.draft_logits(&head, 20, &extra).unwrap();
        let part = part.to_vec_f32().unwrap();
        let want: Vec<f32> = (0..20)
            .chain(extra.iter().map(|&t| t as usize))
            .map(|i| whole[i])
            .collect();
        assert_eq!(part.len(), want.len(), "{spec}");
        for (i, (a, b)) in part.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{spec}: column {i}: {a} against the whole vocabulary's {b}"
            );
        }
        // The leading ids are a view of the same rows: the same bits.
        assert_eq!(part[..20], whole[..20], "{spec}");
    }
}

#[test]
fn qwen3_5_mtp_equals_plain_decoding() {
    mtp_equals_plain("qwen3_5:tiny:f32:hf", GdnPath::Auto);
    mtp_equals_plain("qwen3_5:tiny:bf16:hf", GdnPath::PerStep);
}

#[test]
fn qwen3_5_moe_mtp_equals_plain_decoding() {
    mtp_equals_plain("qwen3_5_moe:tiny:f32:hf", GdnPath::Auto);
}

/// Every tensor of a state, on the host.
fn snapshot(s: &ModelState) -> Vec<Vec<f32>> {
    use engine::cache::LayerState;
    let host = |t: &kernels::Tensor| {
        t.to_device(kernels::Device::Cpu)
            .unwrap()
            .to_f32()
            .unwrap()
            .f32s()
            .unwrap()
            .to_vec()
    };
    s.layers
        .iter()
        .flat_map(|l| match l {
            // Only the valid slots: slots past `len` are scratch after a rollback.
            LayerState::Kv(c) => {
                let (h, cap, d) = (c.k.dim(0), c.k.dim(1), c.k.dim(2));
                [&c.k, &c.v]
                    .map(|t| {
                        let all = host(t);
                        (0..h)
                            .flat_map(|i| all[i * cap * d..(i * cap + c.len) * d].to_vec())
                            .collect()
                    })
                    .to_vec()
            }
            LayerState::Recurrent(r) => vec![host(&r.conv), host(&r.ssm)],
            LayerState::Conv(t) => vec![host(t)],
        })
        .collect()
}

/// Verify four drafts, roll back, replay the first two: the state and the next logits are
/// the bits of a state that ran only those tokens.
#[test]
fn rollback_then_replay_is_bit_identical_to_running_the_kept_tokens() {
    let p = load("qwen3_5:tiny:f32:hf");
    let m: &dyn CausalLm = p.model.as_ref();
    let ids = prompt(&p, 40);
    let mut state = m.new_state();
    state.gdn_path = GdnPath::PerStep;
    m.forward(&ids, &mut state, false).unwrap();
    let mut reference = state.clone();
    let mark = state.mark();
    let step = [17u32, 3, 250, 9, 41];
    m.forward(&step, &mut state, true).unwrap();
    state.rollback(&mark).unwrap();
    assert_eq!(state.pos, ids.len());
    let replayed = m.forward(&step[..3], &mut state, false).unwrap();
    let alone = m.forward(&step[..3], &mut reference, false).unwrap();
    assert_eq!(state.pos, reference.pos);
    assert_eq!(snapshot(&state), snapshot(&reference));
    assert_eq!(replayed.to_vec_f32().unwrap(), alone.to_vec_f32().unwrap());
    // A mark of the same model's layers fits; one of other layers is refused.
    let other = m.new_state().mark();
    let mut s = m.new_state();
    m.forward(&ids[..3], &mut s, false).unwrap();
    assert!(
        s.rollback(&other).is_ok(),
        "a fresh state's mark fits any state of the model"
    );
    assert!(ModelState::new(Vec::new()).rollback(&mark).is_err());
}

/// Verify five tokens while recording, keep the first `n`: for every `n` the state and the
/// next logits are the bits of a state that ran only those tokens, with no forward run again;
/// recording stops afterwards.
#[test]
fn keeping_recorded_steps_is_bit_identical_to_running_the_kept_tokens() {
    let p = load("qwen3_5:tiny:f32:hf");
    let m: &dyn CausalLm = p.model.as_ref();
    let ids = prompt(&p, 40);
    let mut start = m.new_state();
    start.gdn_path = GdnPath::PerStep;
    m.forward(&ids, &mut start, false).unwrap();
    let step = [17u32, 3, 250, 9, 41];
    for n in 1..=step.len() {
        let mut state = start.clone();
        let mut reference = start.clone();
        let mark = state.mark();
        state.record_steps();
        let verify = m.forward(&step, &mut state, true).unwrap();
        assert!(state.keep_recorded(&mark, n).unwrap(), "n = {n}");
        let alone = m.forward(&step[..n], &mut reference, true).unwrap();
        assert_eq!(state.pos, ids.len() + n);
        assert_eq!(snapshot(&state), snapshot(&reference), "n = {n}");
        // The verification's rows up to n are the kept tokens' own logits.
        assert_eq!(
            verify.narrow0(0, n).unwrap().to_vec_f32().unwrap(),
            alone.to_vec_f32().unwrap(),
            "n = {n}"
        );
        let next = m.forward(&[5], &mut state, false).unwrap();
        let want = m.forward(&[5], &mut reference, false).unwrap();
        assert_eq!(next.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
        assert!(
            state.layers.iter().all(|l| match l {
                engine::cache::LayerState::Recurrent(r) => r.record.is_none(),
                _ => true,
            }),
            "recording stops"
        );
    }
    // Keeping more than ran, or nothing, is refused; an unrecorded forward is not kept.
    let mut state = start.clone();
    let mark = state.mark();
    state.record_steps();
    m.forward(&step[..2], &mut state, true).unwrap();
    assert!(state.keep_recorded(&mark, 3).is_err());
    assert!(state.keep_recorded(&mark, 0).is_err());
    let mut plain = start.clone();
    let mark = plain.mark();
    m.forward(&step[..2], &mut plain, true).unwrap();
    assert!(
        !plain.keep_recorded(&mark, 1).unwrap(),
        "nothing was recorded"
    );
    assert_eq!(
        plain.pos,
        ids.len() + 2,
        "an unkept state is left as it was"
    );
}

#[test]
fn mtp_is_refused_where_it_cannot_run() {
    // mlx-lm conversions drop `mtp.*`.
    let p = load("qwen3_5:tiny:f32:mlx");
    let opts = RequestOptions {
        temperature: Some(0.0),
        mtp: Some(MtpOptions::new(2)),
        ..Default::default()
    };
    let err = generate::generate(p.model.as_ref(), &p.request(vec![1, 2, 3], &opts), |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("mtp"), "{err}");
    let p = load("qwen3_5:tiny:f32:hf");
    let deep = RequestOptions {
        mtp: Some(MtpOptions::new(5)),
        ..opts
    };
    let err = generate::generate(p.model.as_ref(), &p.request(vec![1, 2, 3], &deep), |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("1 to 4"), "{err}");
}

/// The first three sampled tokens of `runs` seeds, counted per sequence.
fn sampled_counts(
    p: &Pipeline,
    ids: &[u32],
    runs: u64,
    mtp: impl Fn() -> Option<MtpOptions>,
) -> (HashMap<Vec<u32>, u64>, usize) {
    let mut counts = HashMap::new();
    let mut accepted = 0;
    for seed in 0..runs {
        let opts = RequestOptions {
            max_tokens: Some(3),
            temperature: Some(1.0),
            top_k: Some(3),
            top_p: Some(1.0),
            seed: Some(seed),
            ignore_eos: true,
            mtp: mtp(),
            ..Default::default()
        };
        let out =
            generate::generate(p.model.as_ref(), &p.request(ids.to_vec(), &opts), |_| {}).unwrap();
        accepted += out.mtp.map_or(0, |m| m.accepted);
        *counts.entry(out.tokens).or_insert(0) += 1;
    }
    (counts, accepted)
}

/// The exact probability of every 3-token continuation under top-3 sampling at T = 1.
fn exact_joint(p: &Pipeline, ids: &[u32]) -> HashMap<Vec<u32>, f64> {
    let params = engine::generate::SamplingParams {
        temperature: 1.0,
        top_k: 3,
        top_p: 1.0,
        seed: 0,
    };
    let sampler = engine::generate::Sampler::new(params);
    let m = p.model.as_ref();
    let dist = |prefix: &[u32]| {
        let mut s = m.new_state();
        let logits = m.forward(prefix, &mut s, false).unwrap();
        sampler.distribution(&logits).unwrap()
    };
    let mut joint = HashMap::new();
    let d1 = dist(ids);
    for &a in &d1.tokens {
        let ctx_a = [ids, &[a]].concat();
        let d2 = dist(&ctx_a);
        for &b in &d2.tokens {
            let d3 = dist(&[&ctx_a[..], &[b]].concat());
            for &c in &d3.tokens {
                joint.insert(vec![a, b, c], d1.prob(a) * d2.prob(b) * d3.prob(c));
            }
        }
    }
    joint
}

/// Pearson's statistic with cells of expected count < 5 pooled, and the 0.1% critical value
/// (Wilson–Hilferty) for its degrees of freedom.
fn chi_square(
    counts: &HashMap<Vec<u32>, u64>,
    exact: &HashMap<Vec<u32>, f64>,
    n: u64,
) -> (f64, f64) {
    let outside: u64 = counts
        .iter()
        .filter(|(k, _)| !exact.contains_key(*k))
        .map(|(_, c)| c)
        .sum();
    assert_eq!(
        outside, 0,
        "a sequence outside the top-3 support was sampled"
    );
    let (mut stat, mut cells, mut pooled_e, mut pooled_o) = (0.0, 0usize, 0.0, 0.0);
    for (k, &p) in exact {
        let e = p * n as f64;
        let o = *counts.get(k).unwrap_or(&0) as f64;
        if e < 5.0 {
            pooled_e += e;
            pooled_o += o;
        } else {
            stat += (o - e) * (o - e) / e;
            cells += 1;
        }
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        cells += 1;
    }
    let k = (cells - 1) as f64;
    let z = 3.09;
    let crit = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    (stat, crit)
}

/// Speculative sampling keeps the model's distribution: over 2000 seeds the joint counts of
/// the first three tokens with `--mtp 2` (the head's own drafts, and drafts forced to the
/// greedy tokens, which are often kept) pass a chi-square test against the exact
/// probabilities, as plain sampling does; a wrong expectation (the first token's distribution
/// with a draft always kept) fails it, so the test can fail.
#[test]
fn mtp_sampling_matches_the_model_distribution() {
    let p = load("qwen3_5:tiny:f32:hf");
    let ids = prompt(&p, 8);
    let exact = exact_joint(&p, &ids);
    let n = 2000;
    let greedy = run(&p, &ids, GdnPath::Auto, None).tokens;
    let (plain, _) = sampled_counts(&p, &ids, n, || None);
    let (own, _) = sampled_counts(&p, &ids, n, || Some(MtpOptions::new(2)));
    // Drafts from a few ids only: often outside the model's top 3, so rejections and the
    // residual draw carry the distribution.
    let (small, _) = sampled_counts(&p, &ids, n, || {
        Some(MtpOptions {
            draft_vocab: Some(16),
            ..MtpOptions::new(2)
        })
    });
    let (forced, kept) = sampled_counts(&p, &ids, n, || {
        Some(MtpOptions {
            forced: Some(ForcedDrafts {
                reference: greedy.clone(),
                correct: 2,
            }),
            ..MtpOptions::new(2)
        })
    });
    println!("forced drafts kept: {kept}");
    assert!(
        kept > 100,
        "forced drafts were kept {kept} times: acceptance barely ran"
    );
    for (what, counts) in [
        ("plain", &plain),
        ("mtp own", &own),
        ("mtp own, 16-id draft vocabulary", &small),
        ("mtp forced", &forced),
    ] {
        let (stat, crit) = chi_square(counts, &exact, n);
        println!("{what}: chi-square {stat:.1}, 0.1% critical value {crit:.1}");
        assert!(stat < crit, "{what}: chi-square {stat:.1} above {crit:.1}");
    }
    // The same counts against a wrong expectation (the probabilities handed out in reverse
    // order of size) are rejected.
    let mut keys: Vec<&Vec<u32>> = exact.keys().collect();
    keys.sort_by(|a, b| exact[*a].total_cmp(&exact[*b]).then(a.cmp(b)));
    let skewed: HashMap<Vec<u32>, f64> = keys
        .iter()
        .zip(keys.iter().rev())
        .map(|(k, r)| ((*k).clone(), exact[*r]))
        .collect();
    let (stat, crit) = chi_square(&plain, &skewed, n);
    println!("plain against a wrong expectation: chi-square {stat:.1}, critical {crit:.1}");
    assert!(
        stat > crit,
        "a wrong expectation passed: {stat:.1} <= {crit:.1}"
    );
}

/// On MLX (its CPU device here): the same equality, through MLX's ops.
#[cfg(feature = "mlx")]
mod on_mlx {
    use super::*;

    #[test]
    fn mtp_equals_plain_decoding() {
        engine::Backend::Mlx.activate().unwrap();
        let dir = synth_cached(&SynthSpec::parse("qwen3_5:tiny:f32:hf").unwrap()).unwrap();
        let p = Pipeline::load_on(&dir, engine::Backend::Mlx).unwrap();
        let ids = prompt(&p, 70);
        let plain = run(&p, &ids, GdnPath::Auto, None);
        for depth in [1, 3] {
            let out = run(&p, &ids, GdnPath::Auto, Some(MtpOptions::new(depth)));
            assert_eq!(out.tokens, plain.tokens, "--mtp {depth} on MLX");
        }
    }
}

/// A batched decode step that also gives the hidden rows (what a speculative sequence's plain
/// step in the server's batch reads): each row's logits and hidden state are the bits of
/// `forward_hidden` on that sequence alone, and the states end where the lone runs leave them.
#[test]
fn batched_hidden_rows_equal_each_sequence_alone() {
    for spec in ["qwen3_5:tiny:f32:hf", "qwen3_5_moe:tiny:bf16:hf"] {
        let p = load(spec);
        let m: &dyn CausalLm = p.model.as_ref();
        let drafter = m.drafter().expect("a head");
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(&p, 5 + 7 * i)).collect();
        let next = [11u32, 12, 13];
        let prefilled = || -> Vec<ModelState> {
            prompts
                .iter()
                .map(|ids| {
                    let mut s = m.new_state();
                    m.forward(ids, &mut s, false).unwrap();
                    s
                })
                .collect()
        };
        let host = |t: &kernels::Tensor| t.to_f32().unwrap().f32s().unwrap().to_vec();
        let mut alone = prefilled();
        let want: Vec<_> = alone
            .iter_mut()
            .zip(next)
            .map(|(s, id)| drafter.forward_hidden(&[id], s, false).unwrap())
            .collect();
        let mut batch = prefilled();
        let mut refs: Vec<&mut ModelState> = batch.iter_mut().collect();
        let (logits, hidden) = drafter.decode_batch_hidden(&next, &mut refs).unwrap();
        for (i, (l, h)) in want.iter().enumerate() {
            assert_eq!(
                host(&logits.narrow0(i, 1).unwrap()),
                host(l),
                "{spec} row {i}: logits"
            );
            assert_eq!(
                host(&hidden.narrow0(i, 1).unwrap()),
                host(h),
                "{spec} row {i}: hidden"
            );
            assert_eq!(
                snapshot(&batch[i]),
                snapshot(&alone[i]),
                "{spec} row {i}: state"
            );
        }
    }
}

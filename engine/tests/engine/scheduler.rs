//! The scheduler under `engine serve`: requests that join a running batch at token boundaries
//! and resume from cached prefixes get exactly what they get alone; cancellation frees the
//! room a sequence held; the KV budget refuses what can never fit and defers what does not
//! fit yet.

use engine::generate::scheduler::{Room, Scheduler, SchedulerOptions, Update};
use engine::generate::{self, GenerateOutput, GenerateRequest};
use engine::{Pipeline, RequestOptions};
use synth::cached as synth_cached;
use synth::SynthSpec;

fn load(spec: &str) -> Pipeline {
    Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap()
}

fn request(p: &Pipeline, ids: Vec<u32>, max_tokens: usize, temperature: f32) -> GenerateRequest {
    let opts = RequestOptions {
        max_tokens: Some(max_tokens),
        temperature: Some(temperature),
        seed: Some(ids.len() as u64),
        top_logprobs: 2,
        ignore_eos: true,
        ..Default::default()
    };
    p.request(ids, &opts)
}

/// Runs `sched` until it is idle, collecting each sequence's finished output.
fn drain(sched: &mut Scheduler, outs: &mut [Option<(GenerateOutput, usize)>]) {
    while sched.running() > 0 {
        sched.step(|id, u| match u {
            Update::Token { .. } => {}
            Update::Finished(f) => {
                outs[id as usize] = Some((f.output, f.cached_prompt_tokens));
            }
            Update::Failed(e) => panic!("sequence {id} failed: {e:#}"),
        });
    }
}

#[test]
fn cached_prefixes_and_late_joins_give_what_requests_get_alone() {
    // Attention-only (trims to any common prefix) and hybrid (resumes only where the state
    // can return: an extension of what it saw, or its prompt boundary).
    for spec in [
        "qwen3:tiny:bf16:hf",
        "qwen3_5:tiny:f32:hf",
        "lfm2:tiny:bf16:hf",
    ] {
        let p = load(spec);
        let vocab = p.tokenizer.vocab_size() as u32 - 8;
        let system: Vec<u32> = (0..24).map(|j| (j * 7919 + 13) % vocab).collect();
        let with = |tail: &[u32]| [system.as_slice(), tail].concat();
        let first = request(&p, with(&[5, 6, 7]), 6, 0.0);
        // After `first` finishes: its whole conversation plus a new turn (an extension of
        // every position its state saw), the same system prompt with another question (a
        // common prefix only), and an unrelated prompt.
        let mut turn2 = first.prompt_ids.clone();
        let alone_first = generate::generate(p.model.as_ref(), &first, |_| {}).unwrap();
        turn2.extend(&alone_first.tokens);
        turn2.extend([9, 10]);
        let reqs = [
            first.clone(),
            request(&p, turn2, 5, 0.0),
            request(&p, with(&[40, 41]), 5, 0.7),
            request(&p, (100..120).collect(), 4, 0.0),
        ];
        let alone: Vec<_> = reqs
            .iter()
            .map(|r| generate::generate(p.model.as_ref(), r, |_| {}).unwrap())
            .collect();
        let opts = SchedulerOptions {
            max_batch: 4,
            prefix_cache: 4,
            kv_budget: None,
        };
        let mut sched = Scheduler::new(p.model.as_ref(), opts).unwrap();
        let mut outs = vec![None; reqs.len()];
        sched.join(0, reqs[0].clone()).unwrap();
        drain(&mut sched, &mut outs);
        assert_eq!(sched.cached_prefixes(), 1, "{spec}");
        // The other three join one token boundary apart.
        for (i, r) in reqs.iter().enumerate().skip(1) {
            assert_eq!(sched.room_for(r), Room::Now);
            sched.join(i as u64, r.clone()).unwrap();
            sched.step(|id, u| {
                if let Update::Finished(f) = u {
                    outs[id as usize] = Some((f.output, f.cached_prompt_tokens));
                }
            });
        }
        drain(&mut sched, &mut outs);
        for (i, want) in alone.iter().enumerate() {
            let (got, cached) = outs[i].as_ref().unwrap();
            assert_eq!(got.tokens, want.tokens, "{spec} request {i}: tokens");
            let (got_lp, want_lp) = (got.top_logprobs.as_ref(), want.top_logprobs.as_ref());
            if *cached == 0 {
                assert_eq!(got_lp, want_lp, "{spec} request {i}: log-probs");
                continue;
            }
            // A resumed prompt is prefilled in two forwards (the cached part, then the rest),
            // whose matrix products round in another order than one forward's: the values
            // agree to float rounding, not bit for bit.
            for (g, w) in got_lp
                .unwrap()
                .iter()
                .flatten()
                .zip(want_lp.unwrap().iter().flatten())
            {
                assert_eq!(g.0, w.0, "{spec} request {i}: top tokens");
                assert!(
                    (g.1 - w.1).abs() < 1e-4,
                    "{spec} request {i}: {g:?} vs {w:?}"
                );
            }
        }
        let cached: Vec<usize> = outs.iter().map(|o| o.as_ref().unwrap().1).collect();
        // The second turn resumes everything the first one's state saw: its prompt and all
        // its tokens but the last (which was sampled, never fed).
        let seen = reqs[0].prompt_ids.len() + alone[0].tokens.len() - 1;
        assert_eq!(cached[0], 0, "{spec}");
        assert_eq!(cached[1], seen, "{spec}: the next turn");
        if spec.starts_with("qwen3:") {
            assert_eq!(cached[2], system.len(), "{spec}: the shared system prompt");
        } else {
            assert_eq!(cached[2], 0, "{spec}: a recurrent state cannot trim");
        }
        assert_eq!(cached[3], 0, "{spec}: an unrelated prompt");
    }
}

#[test]
fn cancelling_frees_the_room_and_the_budget_defers_or_refuses() {
    let p = load("qwen3:tiny:f32:hf");
    let per_position = p.model.new_state().kv_bytes_per_position();
    assert!(per_position > 0);
    let req = request(&p, (1..30).collect(), 20, 0.0);
    // Room for one such sequence (its caches may double): a second one waits, a request
    // larger than the whole budget never fits.
    let budget = per_position * 2 * (29 + 20) + per_position;
    let opts = SchedulerOptions {
        max_batch: 8,
        prefix_cache: 0,
        kv_budget: Some(budget),
    };
    let mut sched = Scheduler::new(p.model.as_ref(), opts).unwrap();
    assert_eq!(sched.room_for(&req), Room::Now);
    sched.join(7, req.clone()).unwrap();
    assert_eq!(sched.room_for(&req), Room::Later);
    let huge = request(&p, (1..30).collect(), 200, 0.0);
    assert_eq!(sched.room_for(&huge), Room::Never);
    let mut tokens = 0;
    sched.step(|id, u| {
        assert_eq!(id, 7);
        assert!(matches!(u, Update::Token { .. }));
        tokens += 1;
    });
    assert_eq!(tokens, 1);
    assert!(sched.cancel(7));
    assert!(!sched.cancel(7), "a cancelled sequence is gone");
    assert_eq!(sched.running(), 0);
    assert_eq!(
        sched.room_for(&req),
        Room::Now,
        "cancelling gave the room back"
    );
    // A bad request is refused at the door and leaves the batch as it was.
    let bad = request(&p, vec![u32::MAX], 4, 0.0);
    let err = sched.join(1, bad).unwrap_err();
    assert!(
        format!("{err:#}").contains("outside the model's vocabulary"),
        "{err:#}"
    );
    assert_eq!(sched.running(), 0);
}

#[test]
fn the_kv_budget_gives_back_cached_prefixes_least_recently_used_first() {
    let p = load("qwen3:tiny:f32:hf");
    let per_position = p.model.new_state().kv_bytes_per_position();
    let req = |seed: u32| request(&p, (1..30).map(|j| j * 7 + seed).collect(), 20, 0.0);
    // Room for two running sequences' reservations (each twice its 49 positions), while a
    // finished state holds its cache's 64 slots: one finished state fits beside a new
    // reservation, two do not.
    let reservation = per_position * 2 * (29 + 20);
    let opts = SchedulerOptions {
        max_batch: 4,
        prefix_cache: 8,
        kv_budget: Some(2 * reservation),
    };
    let mut sched = Scheduler::new(p.model.as_ref(), opts).unwrap();
    let mut outs = vec![None; 3];
    for id in 0..2u64 {
        assert_eq!(sched.room_for(&req(id as u32)), Room::Now);
        sched.join(id, req(id as u32)).unwrap();
        drain(&mut sched, &mut outs);
    }
    assert_eq!(sched.cached_prefixes(), 2);
    // The next sequence's reservation does not fit beside both cached states: the older one
    // goes (what is left must fit the budget with the reservation).
    assert_eq!(sched.room_for(&req(2)), Room::Now);
    assert!(
        sched.cached_prefixes() < 2,
        "no cached state was given back"
    );
    // The one kept is the most recent: request 1's prompt resumes from it.
    let cached = sched.join(2, req(1)).unwrap();
    assert_eq!(cached, 28, "the most recently cached state was kept");
}

/// Speculative requests (`mtp`) in a running batch, beside plain ones: each gets exactly what
/// it gets alone (tokens, log-probs, finish reason and MTP figures), greedy and sampled, with
/// the head's own drafts and with forced ones (full and zero acceptance), on flat KV under a
/// budget and on a shared paged pool. Their plain steps run in the batch's forward; a greedy
/// one defers its drafting rounds to plain steps there while others run (same tokens, other
/// MTP figures), a sampled one drafts as it would alone.
#[test]
fn speculative_requests_in_a_batch_give_what_they_get_alone() {
    use engine::generate::{ForcedDrafts, MtpOptions};
    let p = load("qwen3_5:tiny:f32:hf");
    let vocab = p.tokenizer.vocab_size() as u32 - 8;
    let ids = |n: u32, salt: u32| -> Vec<u32> {
        (0..n)
            .map(|j| (j * 7919 + salt * 31 + 13) % vocab)
            .collect()
    };
    let with_mtp = |mut r: GenerateRequest, depth: usize, forced: Option<ForcedDrafts>| {
        r.mtp = Some(MtpOptions {
            forced,
            ..MtpOptions::new(depth)
        });
        r
    };
    let plain_of = |r: &GenerateRequest| generate::generate(p.model.as_ref(), r, |_| {}).unwrap();
    let greedy = request(&p, ids(70, 1), 24, 0.0);
    let reference = plain_of(&greedy).tokens;
    let forced = |correct| {
        Some(ForcedDrafts {
            reference: reference.clone(),
            correct,
        })
    };
    let reqs = [
        request(&p, ids(9, 2), 10, 0.0),
        with_mtp(greedy.clone(), 2, None),
        with_mtp(greedy.clone(), 3, forced(3)),
        with_mtp(greedy.clone(), 2, forced(0)),
        with_mtp(request(&p, ids(20, 3), 24, 0.8), 2, None),
        request(&p, ids(33, 4), 7, 0.7),
        with_mtp(request(&p, ids(12, 5), 24, 1.0), 1, None),
    ];
    let alone: Vec<_> = reqs.iter().map(plain_of).collect();
    let greedy_mtp = [1, 2, 3];
    // Greedy MTP is plain decoding's output whatever the drafts.
    for (i, out) in alone.iter().enumerate().take(4).skip(1) {
        assert_eq!(out.tokens, reference, "request {i} alone");
    }
    for paged in [false, true] {
        let opts = SchedulerOptions {
            max_batch: 4,
            prefix_cache: 4,
            kv_budget: (!paged).then_some(64 << 20),
        };
        let mut sched = Scheduler::new(p.model.as_ref(), opts).unwrap();
        if paged {
            sched = sched.with_pool(16, 64).unwrap();
        }
        let mut outs = vec![None; reqs.len()];
        // Four join one token boundary apart; the rest join as places free up.
        let mut waiting: Vec<usize> = (0..reqs.len()).collect();
        while !waiting.is_empty() || sched.running() > 0 {
            if let Some(&i) = waiting.first() {
                if sched.room_for(&reqs[i]) == Room::Now {
                    sched.join(i as u64, reqs[i].clone()).unwrap();
                    waiting.remove(0);
                }
            }
            sched.step(|id, u| match u {
                Update::Token { .. } => {}
                Update::Finished(f) => outs[id as usize] = Some(f.output),
                Update::Failed(e) => panic!("sequence {id} failed: {e:#}"),
            });
        }
        for (i, want) in alone.iter().enumerate() {
            let got = outs[i].as_ref().unwrap();
            let at = format!("paged {paged}, request {i}");
            assert_eq!(got.tokens, want.tokens, "{at}: tokens");
            assert_eq!(got.finish_reason, want.finish_reason, "{at}");
            if !greedy_mtp.contains(&i) {
                assert_eq!(got.top_logprobs, want.top_logprobs, "{at}: log-probs");
                assert_eq!(got.mtp, want.mtp, "{at}: MTP figures");
                continue;
            }
            // A greedy speculative sequence takes plain steps in the batch where alone it
            // drafts: the same tokens, each log-prob from a one-row step instead of a
            // verification row (which agree to float rounding).
            for (g, w) in got
                .top_logprobs
                .iter()
                .flatten()
                .flatten()
                .zip(want.top_logprobs.iter().flatten().flatten())
            {
                assert_eq!(g.0, w.0, "{at}: top tokens");
                assert!((g.1 - w.1).abs() <= 1e-5, "{at}: {g:?} vs {w:?}");
            }
        }
        let m = |i: usize| outs[i].as_ref().unwrap().mtp.clone().unwrap();
        assert_eq!(m(2).accepted, m(2).drafted, "forced correct: {:?}", m(2));
        assert_eq!(m(3).accepted, 0, "forced wrong: {:?}", m(3));
        // Alone, forced-correct drafts leave no plain step; in the batch it deferred rounds.
        assert_eq!(alone[2].mtp.as_ref().unwrap().plain_steps, 0);
        assert!(
            m(2).plain_steps > 0,
            "no round deferred to the batch: {:?}",
            m(2)
        );
        assert!(alone[3].mtp.as_ref().unwrap().rollbacks > 0);
    }
}

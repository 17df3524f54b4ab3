//! MTP speculative decoding (issue 12, greedy part) on synthetic Qwen3.5 dense and MoE
//! checkpoints with their `mtp.*` head: the output equals plain greedy decoding for every draft
//! depth, with the head's own drafts and with forced ones (all correct, all wrong, the first
//! one correct), so full, partial and zero acceptance and every rollback run; a rollback then
//! replay leaves the state bit-identical to running the kept tokens alone.

use engine::cache::ModelState;
use engine::generate::{self, ForcedDrafts, GenerateOutput, MtpOptions};
use engine::layers::gated_delta::GdnPath;
use engine::models::CausalLm;
use engine::{Pipeline, RequestOptions};
use harness::models::synth_cached;
use harness::synth::SynthSpec;

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
            let out = run(&p, &ids, gdn, Some(MtpOptions { depth, forced }));
            assert_eq!(
                out.tokens, plain.tokens,
                "{spec} {gdn:?} --mtp {depth}, {what}: output differs from plain decoding"
            );
            let m = out.mtp.expect("MTP stats");
            match what {
                "all correct" => {
                    assert_eq!((m.accepted, m.replays), (m.drafted, 0), "{what}: {m:?}");
                    assert!(m.rounds < 24, "full acceptance takes fewer rounds: {m:?}");
                }
                "all wrong" => assert_eq!((m.accepted, m.replays), (0, m.rounds), "{m:?}"),
                "first correct" if depth > 1 => {
                    assert!(m.accepted > 0 && m.replays > 0, "partial acceptance: {m:?}")
                }
                _ => {}
            }
        }
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

#[test]
fn mtp_is_refused_where_it_cannot_run() {
    // mlx-lm conversions drop `mtp.*`.
    let p = load("qwen3_5:tiny:f32:mlx");
    let opts = RequestOptions {
        temperature: Some(0.0),
        mtp: Some(MtpOptions {
            depth: 2,
            forced: None,
        }),
        ..Default::default()
    };
    let err = generate::generate(p.model.as_ref(), &p.request(vec![1, 2, 3], &opts), |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("mtp"), "{err}");
    let p = load("qwen3_5:tiny:f32:hf");
    let sampled = RequestOptions {
        temperature: Some(0.7),
        ..opts
    };
    let err = generate::generate(
        p.model.as_ref(),
        &p.request(vec![1, 2, 3], &sampled),
        |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--temperature 0"), "{err}");
}

/// On MLX (its CPU device here): the same equality, through MLX's ops.
#[cfg(feature = "mlx")]
#[test]
fn mtp_equals_plain_decoding_on_mlx() {
    engine::Backend::Mlx.activate().unwrap();
    let dir = synth_cached(&SynthSpec::parse("qwen3_5:tiny:f32:hf").unwrap()).unwrap();
    let p = Pipeline::load_on(&dir, engine::Backend::Mlx).unwrap();
    let ids = prompt(&p, 70);
    let plain = run(&p, &ids, GdnPath::Auto, None);
    for depth in [1, 3] {
        let out = run(
            &p,
            &ids,
            GdnPath::Auto,
            Some(MtpOptions {
                depth,
                forced: None,
            }),
        );
        assert_eq!(out.tokens, plain.tokens, "--mtp {depth} on MLX");
    }
}

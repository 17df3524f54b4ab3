//! Sessions (issue 12): a conversation run turn by turn through one `Session`, which reuses its
//! cache, gives the same tokens as prefilling every turn's whole prompt from scratch, for an
//! attention-only family (trimmable KV), the Gated DeltaNet hybrid (all-or-nothing plus the
//! turn-boundary snapshot), LFM2 (conv state) and Gemma 4 (rotating and KV-shared caches). The
//! reuse counts show which case ran, so a session that silently prefilled everything again
//! would fail too.

use engine::generate::{self, GenerateOutput, GenerateRequest};
use engine::{Pipeline, RequestOptions, Session};
use synth::cached as synth_cached;
use synth::SynthSpec;

const FAMILIES: [&str; 5] = [
    "qwen3:tiny:f32:hf",
    "qwen3_5:tiny:f32:hf",
    "qwen3_5_moe:tiny:q4:mlx",
    "lfm2:tiny:bf16:hf",
    "gemma4:tiny:f32:hf",
];

fn load(spec: &str) -> Pipeline {
    Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap()
}

/// `n` token ids that differ with `salt`, away from the special tokens at the vocabulary's end.
fn user(p: &Pipeline, n: u32, salt: u32) -> Vec<u32> {
    let vocab = p.tokenizer.vocab_size() as u32 - 8;
    (0..n)
        .map(|i| (i * 7919 + salt * 104_729 + 13) % vocab)
        .collect()
}

fn request(p: &Pipeline, ids: Vec<u32>) -> GenerateRequest {
    let opts = RequestOptions {
        max_tokens: Some(12),
        temperature: Some(0.0),
        ignore_eos: true,
        ..Default::default()
    };
    p.request(ids, &opts)
}

fn fresh(p: &Pipeline, req: &GenerateRequest) -> GenerateOutput {
    generate::generate(p.model.as_ref(), req, |_| {}).unwrap()
}

#[test]
fn three_turns_with_reuse_equal_fresh_prefills() {
    for spec in FAMILIES {
        let p = load(spec);
        let mut session = Session::new(p.model.as_ref());
        let mut history: Vec<u32> = Vec::new();
        let mut cached = 0;
        for turn in 0..3u32 {
            history.extend(user(&p, 30 - 7 * turn, turn));
            let req = request(&p, history.clone());
            let mut streamed = Vec::new();
            let t = session.generate(&req, |tok| streamed.push(tok)).unwrap();
            let want = fresh(&p, &req);
            assert_eq!(
                t.output.tokens, want.tokens,
                "{spec} turn {turn}: a reused cache changed the output"
            );
            assert_eq!(streamed, want.tokens, "{spec}: streamed tokens");
            // Everything the last turn fed is reused: its prompt and all answer tokens but
            // the last (which was never fed back).
            assert_eq!(
                t.reused, cached,
                "{spec} turn {turn}: tokens taken from the cache"
            );
            history.extend(&t.output.tokens);
            cached = history.len() - 1;
            assert_eq!(session.cached_tokens(), cached);
        }
    }
}

#[test]
fn an_edited_history_reuses_what_it_can_and_still_equals_fresh_prefills() {
    for spec in FAMILIES {
        let p = load(spec);
        let trimmable = !spec.starts_with("qwen3_5") && !spec.starts_with("lfm2");
        let mut session = Session::new(p.model.as_ref());
        let first = user(&p, 40, 1);
        let t = session
            .generate(&request(&p, first.clone()), |_| {})
            .unwrap();
        assert_eq!(t.reused, 0);

        // The answer is replaced (a template that re-renders it): the previous prompt is
        // still a prefix, so every family returns there (KV by trimming, hybrids to the
        // snapshot taken at the turn boundary).
        let mut edited = first.clone();
        edited.extend(user(&p, 9, 7));
        let req = request(&p, edited);
        let t = session.generate(&req, |_| {}).unwrap();
        assert_eq!(
            t.output.tokens,
            fresh(&p, &req).tokens,
            "{spec}: edited answer"
        );
        assert_eq!(t.reused, first.len(), "{spec}: back to the turn boundary");

        // The history changes inside the first prompt: KV caches trim to the common prefix,
        // recurrent states cannot go back there and prefill from scratch.
        let mut changed = first[..25].to_vec();
        changed.extend(user(&p, 10, 9));
        let req = request(&p, changed);
        let t = session.generate(&req, |_| {}).unwrap();
        assert_eq!(
            t.output.tokens,
            fresh(&p, &req).tokens,
            "{spec}: changed prefix"
        );
        assert_eq!(t.reused, if trimmable { 25 } else { 0 }, "{spec}");

        // The same prompt again: all but its last token come from the cache.
        let t2 = session.generate(&req, |_| {}).unwrap();
        assert_eq!(
            t2.output.tokens, t.output.tokens,
            "{spec}: same prompt twice"
        );
        let expect = if trimmable {
            req.prompt_ids.len() - 1
        } else {
            0
        };
        assert_eq!(t2.reused, expect, "{spec}: same prompt twice");

        // After a reset nothing is reused.
        session.reset();
        let t3 = session.generate(&req, |_| {}).unwrap();
        assert_eq!((t3.reused, &t3.output.tokens), (0, &t.output.tokens));
    }
}

//! Path parity: verdict boundaries, a path against itself, and per-step vs chunked Gated
//! DeltaNet on a tiny Qwen3.5.

use engine::Pipeline;
use harness::models::synth_cached;
use harness::parity::{builtin_prompts, classify, run, Verdict, EARLY_DIVERGE_TOKENS};
use harness::paths::parse_path;
use harness::synth::SynthSpec;

/// `n` tokens of agreement, then one different token, then more.
fn diverging_at(n: usize) -> (Vec<u32>, Vec<u32>) {
    let a: Vec<u32> = (0..32).collect();
    let mut b = a.clone();
    b[n] = 1000;
    (a, b)
}

#[test]
fn verdict_boundaries() {
    assert_eq!(EARLY_DIVERGE_TOKENS, 16);
    let same: Vec<u32> = (0..32).collect();
    assert_eq!(classify(&same, &same), Verdict::Identical);
    assert_eq!(classify(&[], &[]), Verdict::Identical);
    let (a, b) = diverging_at(0);
    assert_eq!(classify(&a, &b), Verdict::EarlyDiverge(0));
    let (a, b) = diverging_at(15);
    assert_eq!(classify(&a, &b), Verdict::EarlyDiverge(15));
    assert_eq!(classify(&a, &b).to_string(), "EARLY-DIVERGE@15");
    let (a, b) = diverging_at(16);
    assert_eq!(classify(&a, &b), Verdict::LateDrift(16));
    assert_eq!(classify(&a, &b).to_string(), "late-drift@16");
    let (a, b) = diverging_at(31);
    assert_eq!(classify(&a, &b), Verdict::LateDrift(31));
    // One side stopping early counts as a difference where it stopped.
    assert_eq!(classify(&same[..10], &same), Verdict::EarlyDiverge(10));
    assert_eq!(classify(&same, &same[..20]), Verdict::LateDrift(20));
}

fn pipeline(spec: &str) -> Pipeline {
    Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap()
}

#[test]
fn a_path_against_itself_is_identical_with_zero_nmse() {
    let p = pipeline("qwen3:tiny");
    let prompts = builtin_prompts(&p, 6).unwrap();
    assert!(prompts.iter().any(|p| p.len() > 64));
    let d = parse_path("default").unwrap();
    let report = run(&p, "qwen3:tiny", &prompts, d, d, 20, |_| {}).unwrap();
    assert_eq!(report.results.len(), 6);
    for r in &report.results {
        assert_eq!(r.verdict, Verdict::Identical, "prompt {}", r.index);
        assert_eq!(r.logits_nmse, 0.0, "prompt {}", r.index);
        assert_eq!(r.tokens_a.len(), 20);
    }
    assert!(report.passed());
}

#[test]
fn perstep_and_chunked_gdn_do_not_diverge_early() {
    let p = pipeline("qwen3_5:tiny");
    let prompts = builtin_prompts(&p, 8).unwrap();
    assert!(
        prompts.iter().any(|p| p.len() > 128),
        "some prompt spans several chunks"
    );
    let a = parse_path("gdn=perstep").unwrap();
    let b = parse_path("gdn=chunked").unwrap();
    let report = run(&p, "qwen3_5:tiny", &prompts, a, b, 24, |r| {
        eprintln!(
            "prompt {} ({} tokens): {} NMSE {:.3e}",
            r.index, r.prompt_tokens, r.verdict, r.logits_nmse
        )
    })
    .unwrap();
    for r in &report.results {
        assert!(!r.verdict.is_early(), "prompt {}: {}", r.index, r.verdict);
        // The design's tolerance for GDN against its reference.
        assert!(
            r.logits_nmse <= 5e-4,
            "prompt {}: logits NMSE {}",
            r.index,
            r.logits_nmse
        );
    }
    // The two paths really are different code: their float rounding differs somewhere.
    assert!(
        report.results.iter().any(|r| r.logits_nmse > 0.0),
        "per-step and chunked gave bit-identical logits on every prompt: is the path applied?"
    );
}

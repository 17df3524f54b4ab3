//! Issue 3's end-to-end bar: on a synthetic Qwen3.5 (dense and MoE) with a 300-token prompt,
//! greedy decoding with the per-step and the chunked Gated DeltaNet prefill agrees for at least
//! 16 tokens, in every weight format.

use engine::layers::gated_delta::GdnPath;
use engine::{generate, Pipeline, RequestOptions};
use synth::cached as synth_cached;
use synth::SynthSpec;

fn greedy(p: &Pipeline, ids: &[u32], gdn: GdnPath) -> Vec<u32> {
    let opts = RequestOptions {
        max_tokens: Some(20),
        temperature: Some(0.0),
        ignore_eos: true,
        gdn_path: Some(gdn),
        ..Default::default()
    };
    generate::generate(p.model.as_ref(), &p.request(ids.to_vec(), &opts), |_| {})
        .unwrap()
        .tokens
}

#[test]
fn perstep_and_chunked_agree_for_16_tokens_on_a_300_token_prompt() {
    let formats = ["f32", "bf16", "q4", "q8", "mxfp4", "nvfp4", "mxfp8"];
    for (family, fmt) in ["qwen3_5", "qwen3_5_moe"]
        .into_iter()
        .flat_map(|f| formats.map(|fmt| (f, fmt)))
    {
        let dir =
            synth_cached(&SynthSpec::parse(&format!("{family}:tiny:{fmt}")).unwrap()).unwrap();
        let p = Pipeline::load(&dir).unwrap();
        // 300 ids spread over the ordinary (non-special) part of the vocabulary.
        let vocab = p.tokenizer.vocab_size() as u32 - 3;
        let ids: Vec<u32> = (0..300u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let a = greedy(&p, &ids, GdnPath::PerStep);
        let b = greedy(&p, &ids, GdnPath::Chunked);
        assert_eq!(a.len(), 20);
        assert_eq!(
            a[..16],
            b[..16],
            "{family} {fmt}: per-step {a:?} vs chunked {b:?}"
        );
    }
}

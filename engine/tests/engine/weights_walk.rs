//! The one walk over a model's weights (`layers::params`): what `engine info` counts must be
//! what the folder stores, for every family, with a tied head counted once.

use engine::layers::params::{summarize, Param};
use synth::{cached, SynthSpec};

/// Σ elements of every tensor in the folder's safetensors files, read with the safetensors
/// crate (independent of the engine's loader).
fn stored_elements(dir: &std::path::Path) -> usize {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&p).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for (_, t) in st.tensors() {
                total += t.shape().iter().product::<usize>();
            }
        }
    }
    total
}

#[test]
fn parameters_are_the_stored_elements_for_every_family() {
    // f32, MLX layout: every stored tensor is a parameter the model loads (no MTP head, no
    // unused K/V of KV-shared layers).
    for spec in [
        "qwen3:tiny:f32",
        "llama:tiny:f32",
        "minicpm:tiny:f32",
        "lfm2:tiny:f32",
        "lfm2_moe:tiny:f32",
        "gemma4:tiny:f32:mlx",
        "gemma4_moe:tiny:f32:mlx",
        "qwen3_5:tiny:f32:mlx",
        "qwen3_5_moe:tiny:f32:mlx",
    ] {
        let dir = cached(&SynthSpec::parse(spec).unwrap()).unwrap();
        let m = engine::models::load(&dir).unwrap();
        assert_eq!(
            m.info().parameters,
            stored_elements(&dir),
            "{spec}: parameters counted by the walk"
        );
    }
}

#[test]
fn a_tied_head_is_walked_twice_and_counted_once() {
    let dir = cached(&SynthSpec::parse("qwen3:tiny:f32").unwrap()).unwrap();
    let mut m = engine::models::load(&dir).unwrap();
    let (mut matrices, mut embed_sized) = (0, 0);
    let vocab = m.info().vocab_size;
    m.params(&mut |p| {
        if let Param::Matrix { w, .. } = p {
            matrices += 1;
            embed_sized += usize::from(w.rows() == vocab);
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(embed_sized, 2, "the embedding and the tied head");
    let s = summarize(&mut *m).unwrap();
    assert_eq!(s.parameters, m.info().parameters);
    assert!(matrices > 2);
}

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
        "qwen2:tiny:f32",
        "gemma3:tiny:f32",
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

/// `spec`'s folder with its `lm_head.weight` dropped and the head tied, written with the
/// safetensors crate.
fn tied_copy(spec: &str, out: &std::path::Path) {
    let dir = cached(&SynthSpec::parse(spec).unwrap()).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&p).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let kept: Vec<(String, safetensors::tensor::TensorView)> = st
                .tensors()
                .into_iter()
                .filter(|(n, _)| n != "lm_head.weight")
                .collect();
            let data = safetensors::serialize(kept, None).unwrap();
            std::fs::write(out.join(p.file_name().unwrap()), data).unwrap();
        } else if p.is_file() {
            std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
        }
    }
    let cfg = out.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c["tie_word_embeddings"] = true.into();
    std::fs::write(&cfg, c.to_string()).unwrap();
}

#[test]
fn a_tied_head_is_walked_twice_and_counted_once() {
    let tmp = tempfile::tempdir().unwrap();
    tied_copy("qwen2:tiny:f32", tmp.path());
    let untied = cached(&SynthSpec::parse("qwen2:tiny:f32").unwrap()).unwrap();
    for (dir, tied) in [(tmp.path().to_path_buf(), true), (untied, false)] {
        let mut m = engine::models::load(&dir).unwrap();
        let (vocab, hidden) = (m.info().vocab_size, m.info().hidden_size);
        let (mut walked, mut head_sized) = (0, 0);
        m.params(&mut |p| {
            match p {
                Param::Matrix { w, .. } => {
                    walked += w.numel();
                    head_sized += usize::from(w.rows() == vocab && w.cols() == hidden);
                }
                Param::Tensor(t) => walked += t.numel(),
                Param::Host(n) => walked += n,
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(
            head_sized, 2,
            "tied {tied}: the embedding and the head are both walked"
        );
        let counted = summarize(&mut *m).unwrap().parameters;
        let twice = if tied { vocab * hidden } else { 0 };
        assert_eq!(
            walked - counted,
            twice,
            "tied {tied}: a tied head counts once"
        );
        assert_eq!(counted, m.info().parameters);
        // Counted once, the parameters are what the folder stores.
        assert_eq!(counted, stored_elements(&dir), "tied {tied}");
    }
}

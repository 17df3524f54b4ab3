//! Gemma 3 as multimodal checkpoints write it: `model_type: gemma3` with the text model's
//! fields under `text_config`, loading to the same model as the text-only `gemma3_text` folder.

use synth::{cached, SynthSpec};

fn logits(dir: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let m = engine::models::load(dir).unwrap();
    let mut state = m.new_state();
    m.forward(ids, &mut state, true)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

#[test]
fn a_nested_gemma3_config_is_the_same_model_as_gemma3_text() {
    let dir = cached(&SynthSpec::parse("gemma3:tiny:f32").unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let nested = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
    });
    std::fs::write(tmp.path().join("config.json"), nested.to_string()).unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 1000).collect();
    let m = engine::models::load(tmp.path()).unwrap();
    assert_eq!(m.info().family, "gemma3");
    // 4 layers, every second one full, the others sliding over 32 positions.
    assert_eq!(
        m.info().layer_kinds,
        [
            "sliding_attention(32)",
            "full_attention",
            "sliding_attention(32)",
            "full_attention"
        ]
    );
    assert_eq!(logits(tmp.path(), &ids), logits(&dir, &ids));
}

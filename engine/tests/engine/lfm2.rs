//! LFM2 on the folders mlx-lm wrote itself (`tests/fixtures/mlx-written/lfm2-*`; their
//! agreement with mlx-lm's own outputs is the harness's oracle check): the conv state carried
//! between forwards gives the logits of one whole-prompt forward, multi-token forwards give
//! every position's logits, and malformed folders are refused with the file and the field.

use std::path::{Path, PathBuf};

use engine::cache::LayerState;
use engine::models::{self, CausalLm};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mlx-written")
        .join(name)
}

/// A fixed prompt of `n` ids below the fixtures' vocabulary of 512.
fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 197 + 31) % 509).collect()
}

fn last_logits(m: &dyn CausalLm, pieces: &[&[u32]]) -> Vec<f32> {
    let mut s = m.new_state();
    let mut out = Vec::new();
    for p in pieces {
        out = m.forward(p, &mut s, false).unwrap().to_vec_f32().unwrap();
    }
    out
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prefill in pieces of 1, 2 and the rest (each piece shorter than the conv's 3 taps at first,
/// so the state alone supplies the history) equals one forward over the whole prompt, for the
/// conv-first folder with biases and the attention-first one without.
#[test]
fn prefill_in_pieces_equals_one_forward() {
    for name in ["lfm2-f32", "lfm2-bf16", "lfm2-q4"] {
        let m = models::load(&fixture(name)).unwrap();
        let ids = prompt(40);
        let whole = last_logits(m.as_ref(), &[&ids]);
        let pieces = last_logits(m.as_ref(), &[&ids[..1], &ids[1..3], &ids[3..]]);
        let steps: Vec<&[u32]> = ids.chunks(1).collect();
        let one_by_one = last_logits(m.as_ref(), &steps);
        let scale = whole.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (what, got) in [
            ("pieces 1+2+37", &pieces),
            ("one token at a time", &one_by_one),
        ] {
            let d = max_abs_diff(&whole, got);
            assert!(
                d <= 1e-4 * scale,
                "{name} {what}: max |Δ logit| {d} (scale {scale})"
            );
        }
    }
}

/// The state holds a `[K − 1, hidden]` conv history for each conv block and a KV cache for
/// each attention block, and a multi-token forward's last row is the last-position logits.
#[test]
fn state_kinds_and_all_logits() {
    let m = models::load(&fixture("lfm2-f32")).unwrap();
    assert_eq!(m.info().layer_kinds, ["conv", "full_attention"]);
    let s = m.new_state();
    match (&s.layers[0], &s.layers[1]) {
        (LayerState::Conv(c), LayerState::Kv(_)) => assert_eq!(c.shape(), [2, 64]),
        other => panic!("unexpected layer states {other:?}"),
    }
    let ids = prompt(9);
    let mut s = m.new_state();
    let all = m.forward(&ids, &mut s, true).unwrap();
    assert_eq!(all.shape(), [9, 512]);
    assert_eq!(s.pos, 9);
    let last = last_logits(m.as_ref(), &[&ids]);
    let row = all.narrow0(8, 1).unwrap().to_vec_f32().unwrap();
    assert!(max_abs_diff(&row, &last) <= 1e-4);
}

/// A copy of a fixture with config.json edited by `edit`.
fn with_config(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    tmp
}

fn load_error(dir: &Path) -> String {
    match models::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn malformed_folders_are_refused_with_file_and_field() {
    // (fixture, edit, what the error must name)
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &[&str]); 6] = [
        (
            "lfm2-bf16",
            |c| c["conv_bias"] = true.into(),
            &["model.layers.1.conv.in_proj.bias"],
        ),
        (
            "lfm2-f32",
            |c| c["full_attn_idxs"] = serde_json::json!([0]),
            &["model.layers.0.self_attn"],
        ),
        (
            "lfm2-f32",
            |c| c["layer_types"] = serde_json::json!(["conv", "conv"]),
            &["config.json", "`layer_types` and `full_attn_idxs`"],
        ),
        (
            "lfm2-bf16",
            |c| c["layer_types"] = serde_json::json!(["full_attention", "mamba"]),
            &["config.json", "`layer_types[1]`"],
        ),
        (
            "lfm2-f32",
            |c| c["block_ff_dim"] = 300.into(),
            &["config.json", "`w1` has 64 rows"],
        ),
        (
            "lfm2-f32",
            |c| c["conv_L_cache"] = 4.into(),
            &["model.layers.0.conv.conv.weight", "[64, 1, 4]"],
        ),
    ];
    for (name, edit, want) in cases {
        let dir = with_config(name, edit);
        let err = load_error(dir.path());
        for w in want {
            assert!(err.contains(w), "{name}: error {err:?} does not name {w:?}");
        }
    }
}

// The width and layer-kind rules against both references' behaviour.

use engine::models::lfm2::{ff_width, layer_kinds};

fn lfm2_config(extra: serde_json::Value) -> engine::config::ModelConfig {
    let mut root = serde_json::json!({"model_type": "lfm2", "num_hidden_layers": 4});
    for (k, v) in extra.as_object().unwrap() {
        root[k] = v.clone();
    }
    engine::config::ModelConfig::from_value(std::path::Path::new("/x"), root).unwrap()
}

#[test]
fn ff_width_follows_both_references() {
    // LFM2-350M: int(2·6656/3) = 4437, ×1.0, rounded up to 256.
    let c = lfm2_config(
        serde_json::json!({"block_ff_dim": 6656, "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": true}),
    );
    assert_eq!(ff_width(&c, None).unwrap(), 4608);
    assert_eq!(ff_width(&c, Some(4608)).unwrap(), 4608);
    assert!(ff_width(&c, Some(4437)).is_err());
    // No multiplier: mlx-lm rounds (4608), transformers does not (4437); w1 decides.
    let c =
        lfm2_config(serde_json::json!({"block_ff_dim": 6656, "block_auto_adjust_ff_dim": true}));
    assert_eq!(ff_width(&c, Some(4437)).unwrap(), 4437);
    assert_eq!(ff_width(&c, Some(4608)).unwrap(), 4608);
    // Not adjusted: the width as given; `block_ff_dim` wins over `intermediate_size`.
    let c = lfm2_config(
        serde_json::json!({"block_ff_dim": 10752, "intermediate_size": 1,
        "block_auto_adjust_ff_dim": false}),
    );
    assert_eq!(ff_width(&c, None).unwrap(), 10752);
}

#[test]
fn layer_kinds_from_either_field() {
    let idxs = lfm2_config(serde_json::json!({"full_attn_idxs": [1, 3]}));
    assert_eq!(layer_kinds(&idxs, 4).unwrap(), [false, true, false, true]);
    let types =
        lfm2_config(serde_json::json!({"layer_types": ["conv", "full_attention", "conv", "conv"]}));
    assert_eq!(layer_kinds(&types, 4).unwrap(), [false, true, false, false]);
    let both = lfm2_config(serde_json::json!({"full_attn_idxs": [1],
        "layer_types": ["conv", "full_attention", "conv", "full_attention"]}));
    assert!(layer_kinds(&both, 4).is_err());
    let bad = lfm2_config(serde_json::json!({"full_attn_idxs": [4]}));
    assert!(layer_kinds(&bad, 4).is_err());
    assert_eq!(
        layer_kinds(&lfm2_config(serde_json::json!({})), 4).unwrap(),
        [true; 4]
    );
}

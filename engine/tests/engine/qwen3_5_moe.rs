//! Qwen3.5 MoE end to end on synthetic checkpoints: the original layout (fused `gate_up_proj`,
//! the MTP head with its own sparse MLP) and the MLX layout hold the same model; `engine info`'s
//! expert facts; and a strong-decay model (one head per Gated DeltaNet layer gated at the
//! floor, `g_log = −1e30`) stays finite and agrees on both prefill paths.

use std::collections::HashMap;

use engine::cache::ModelState;
use engine::layers::GdnPath;
use engine::models::qwen3_5::Qwen3_5;
use engine::models::CausalLm;
use engine::{config::ModelConfig, weights::WeightStore};
use kernels::ops;
use synth::cached as synth_cached;
use synth::SynthSpec;

fn load(spec: &str) -> Qwen3_5 {
    let dir = synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap();
    Qwen3_5::load(
        &ModelConfig::load(&dir).unwrap(),
        &WeightStore::open(&dir).unwrap(),
    )
    .unwrap()
}

fn greedy(m: &dyn CausalLm, ids: &[u32], n: usize, gdn: GdnPath) -> Vec<u32> {
    let mut state: ModelState = m.new_state();
    state.gdn_path = gdn;
    let mut logits = m.forward(ids, &mut state, false).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        assert!(ops::all_finite(&logits).unwrap(), "non-finite logits");
        let t = ops::argmax(&logits).unwrap()[0];
        out.push(t);
        logits = m.forward(&[t], &mut state, false).unwrap();
    }
    out
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 7919 + 13) % 1000).collect()
}

#[test]
fn original_and_mlx_layouts_are_the_same_model_and_mtp_loads() {
    let hf = load("qwen3_5_moe:tiny:f32:hf");
    let mlx = load("qwen3_5_moe:tiny:f32:mlx");
    let mtp = hf.mtp().expect("the original layout has mtp.*");
    assert_eq!(mtp.layers.len(), 1);
    assert!(matches!(mtp.layers[0].mlp, engine::layers::Mlp::Sparse(_)));
    assert!(mlx.mtp().is_none());
    let ids = prompt(70);
    assert_eq!(
        greedy(&hf, &ids, 12, GdnPath::PerStep),
        greedy(&mlx, &ids, 12, GdnPath::PerStep)
    );
}

#[test]
fn info_counts_experts_and_active_parameters() {
    let m = load("qwen3_5_moe:tiny:q4:mlx");
    let info = m.info();
    assert_eq!(info.family, "qwen3_5_moe");
    let moe = info.moe.as_ref().expect("MoE facts");
    // Tiny: 8 experts of width 64, top-2, a shared expert of 64 (restated from the brief).
    assert_eq!(
        (
            moe.experts,
            moe.experts_per_token,
            moe.expert_width,
            moe.shared_expert_width
        ),
        (8, 2, 64, 64)
    );
    // Each of 4 layers leaves 6 experts × 3 matrices of 64×128 unread.
    assert_eq!(
        info.parameters - moe.active_parameters,
        4 * 6 * 3 * 64 * 128
    );
    assert!(moe.active_weight_bytes < moe.weight_bytes);
}

/// Rewrites `A_log` of head 0 in every Gated DeltaNet layer to 80 (`A = e^80 ≈ 5.5e34`), so its
/// log decay `−A·softplus(·)` is below the gate floor at every step.
fn strong_decay_copy(spec: &str, out: &std::path::Path) {
    let dir = synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            continue;
        }
        std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut data: HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> = HashMap::new();
    let mut hit = 0;
    for (name, view) in st.tensors() {
        let mut raw = view.data().to_vec();
        if name.ends_with("linear_attn.A_log") {
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            raw[..4].copy_from_slice(&80f32.to_le_bytes());
            hit += 1;
        }
        data.insert(name, (view.dtype(), view.shape().to_vec(), raw));
    }
    assert_eq!(hit, 3, "three Gated DeltaNet layers");
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, (d, s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
}

#[test]
fn strong_decay_in_every_gdn_layer_stays_finite_on_both_paths() {
    let tmp = tempfile::tempdir().unwrap();
    strong_decay_copy("qwen3_5_moe:tiny:f32:mlx", tmp.path());
    let m = engine::models::load(tmp.path()).unwrap();
    // The floor is really reached: the gate of head 0 is clamped for a typical input.
    let a = kernels::Tensor::from_f32(&[1, 4], vec![0.0; 4]).unwrap();
    let a_log = kernels::Tensor::from_f32(&[4], vec![80.0, 0.0, 0.0, 0.0]).unwrap();
    let g = ops::gdn_gate(
        &a,
        &a_log,
        &kernels::Tensor::from_f32(&[4], vec![0.0; 4]).unwrap(),
    )
    .unwrap();
    assert_eq!(g.to_vec_f32().unwrap()[0], kernels::params::GATE_FLOOR);
    // 300 tokens: the chunked path runs four chunks (the last one short).
    let ids = prompt(300);
    let a = greedy(m.as_ref(), &ids, 16, GdnPath::PerStep);
    let b = greedy(m.as_ref(), &ids, 16, GdnPath::Chunked);
    assert_eq!(a, b, "per-step vs chunked under strong decay");
}

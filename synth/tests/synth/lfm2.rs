//! Synthetic LFM2 and LFM2-MoE: the bench sizes have LFM2-350M's and LFM2-8B-A1B's (cut)
//! shapes, and the two layouts (which differ in the conv weight's axis order, how config.json
//! lists the layer kinds and, for LFM2-MoE, how experts are stored) hold one model.

use engine::models;
use engine::weights::WeightStore;
use synth::cached as synth_cached;
use synth::{families, Format, Layout, Size, SynthSpec};

#[test]
fn bench_size_has_lfm2_350m_shapes() {
    let s = SynthSpec::new("lfm2", Size::Bench, Format::Bf16);
    let plan = families::find("lfm2")
        .unwrap()
        .plan(&s, s.resolved_layout())
        .unwrap();
    let params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
    // LFM2-350M's config: embedding 65536 × 1024 (tied), 10 conv blocks of 4,197,376, 6
    // attention blocks of 3,145,856, 16 feed-forwards of 3 × 4608 × 1024 and 2 norms of 1024,
    // and the final norm: 354,483,968.
    assert_eq!(params, 354_483_968);
    assert!(!plan.tensors.iter().any(|t| t.name == "lm_head.weight"));
    let w1 = plan
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.0.feed_forward.w1.weight")
        .unwrap();
    assert_eq!(w1.shape, [4608, 1024]);
}

#[test]
fn both_layouts_hold_one_model() {
    let folder = |layout| {
        let spec = SynthSpec {
            layout: Some(layout),
            ..SynthSpec::new("lfm2", Size::Tiny, Format::F32)
        };
        synth_cached(&spec).unwrap()
    };
    let (hf, mlx) = (folder(Layout::Hf), folder(Layout::Mlx));
    let conv = "model.layers.0.conv.conv.weight";
    let shape = |dir| {
        WeightStore::open(dir)
            .unwrap()
            .info(conv)
            .unwrap()
            .1
            .to_vec()
    };
    assert_eq!(shape(&hf), [128, 1, 3]);
    assert_eq!(shape(&mlx), [128, 3, 1]);
    let ids: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 1000).collect();
    let logits = |dir| {
        let m = models::load(dir).unwrap();
        assert_eq!(
            m.info().layer_kinds,
            ["conv", "full_attention", "conv", "full_attention"]
        );
        let mut s = m.new_state();
        m.forward(&ids, &mut s, true).unwrap().to_vec_f32().unwrap()
    };
    assert_eq!(logits(&hf), logits(&mlx));
}

#[test]
fn lfm2_moe_bench_has_lfm2_8b_a1b_widths() {
    let s = SynthSpec::new("lfm2_moe", Size::Bench, Format::Bf16);
    let plan = families::find("lfm2_moe")
        .unwrap()
        .plan(&s, s.resolved_layout())
        .unwrap();
    let params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
    // LFM2-8B-A1B's widths cut to 8 layers: embedding 65536 × 2048 (tied) and the final norm;
    // 6 conv blocks of 16,783,360 and 2 attention blocks (32 q / 8 KV heads of 64) of
    // 10,485,888; 8 × 2 norms of 2048; 2 dense feed-forwards of 3 × 7168 × 2048; 6 sparse ones
    // of router 32 × 2048, bias 32 and 32 experts of 3 × 1792 × 2048.
    let want = 65_536 * 2048
        + 2048
        + 6 * (3 * 2048 * 2048 + 2048 * 3 + 2048 * 2048)
        + 2 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 2 * 64)
        + 8 * 2 * 2048
        + 2 * 3 * 7168 * 2048
        + 6 * (32 * 2048 + 32 + 32 * 3 * 1792 * 2048);
    assert_eq!(params, want);
    let c = &plan.config;
    assert_eq!(
        (
            c["num_experts"].as_u64(),
            c["num_experts_per_tok"].as_u64(),
            c["moe_intermediate_size"].as_u64(),
            c["num_dense_layers"].as_u64()
        ),
        (Some(32), Some(4), Some(1792), Some(2))
    );
}

/// The original layout (one tensor per expert, `w1/w3/w2` everywhere) and mlx-lm's (stacked
/// `switch_mlp.*`, dense `gate_proj/up_proj/down_proj`) hold one model; `engine info` counts
/// the experts a token leaves unread.
#[test]
fn lfm2_moe_layouts_hold_one_model_and_info_counts_experts() {
    let folder = |layout| {
        let spec = SynthSpec {
            layout: Some(layout),
            ..SynthSpec::new("lfm2_moe", Size::Tiny, Format::F32)
        };
        synth_cached(&spec).unwrap()
    };
    let (hf, mlx) = (folder(Layout::Hf), folder(Layout::Mlx));
    let names = |dir| WeightStore::open(dir).unwrap().names();
    let (hf_names, mlx_names) = (names(&hf), names(&mlx));
    assert!(hf_names.contains(&"model.layers.1.feed_forward.experts.7.w2.weight".to_string()));
    assert!(
        mlx_names.contains(&"model.layers.1.feed_forward.switch_mlp.down_proj.weight".to_string())
    );
    assert!(mlx_names.contains(&"model.layers.0.feed_forward.gate_proj.weight".to_string()));
    let ids: Vec<u32> = (0..40).map(|i| (i * 53 + 11) % 1000).collect();
    let run = |dir| {
        let m = models::load(dir).unwrap();
        let mut s = m.new_state();
        let logits = m.forward(&ids, &mut s, true).unwrap().to_vec_f32().unwrap();
        (m.info().clone(), logits)
    };
    let ((info, a), (_, b)) = (run(&hf), run(&mlx));
    assert_eq!(a, b);
    assert_eq!(info.family, "lfm2_moe");
    let moe = info.moe.expect("MoE facts");
    assert_eq!(
        (moe.experts, moe.experts_per_token, moe.expert_width),
        (8, 2, 64)
    );
    // Layers 1..4 are sparse; each leaves 6 experts × 3 matrices of 64 × 128 unread.
    assert_eq!(
        info.parameters - moe.active_parameters,
        3 * 6 * 3 * 64 * 128
    );
}

//! Synthetic LFM2: the bench size has LFM2-350M's shapes, and the two layouts (which differ in
//! the conv weight's axis order and in how config.json lists the layer kinds) hold one model.

use engine::models;
use engine::weights::WeightStore;
use harness::models::synth_cached;
use harness::synth::{families, Format, Layout, Size, SynthSpec};

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

//! Synthetic Qwen3.5 checkpoints: determinism, the mlx layout against a folder mlx-lm itself
//! wrote (engine/tests/fixtures/mlx-written/qwen3_5-*), the hf layout's own conventions (MTP head,
//! offset norms, PyTorch conv1d shape), loading through the engine, and the published 0.8B widths.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use engine::config::ModelConfig;
use engine::models::qwen3_5::{Layout as EngineLayout, Qwen3_5};
use engine::models::CausalLm;
use engine::weights::WeightStore;
use kernels::DType;
use serde_json::Value;
use synth::{families, write_checkpoint, Format, Layout, Size, SynthSpec, WriteOptions};

const FORMATS: [Format; 7] = [
    Format::F32,
    Format::Bf16,
    Format::Q4,
    Format::Q8,
    Format::Mxfp4,
    Format::Nvfp4,
    Format::Mxfp8,
];

/// Tiny widths, restated from the brief (not read from the code under test).
const H: usize = 128;
const LAYERS: usize = 4;
const HK: usize = 2;
const HV: usize = 4;
const DK: usize = 32;
const DV: usize = 32;
const K: usize = 4;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HD: usize = 64;
const INTER: usize = 256;
const VOCAB: usize = 1024;

fn spec(format: Format, layout: Layout, seed: u64) -> SynthSpec {
    SynthSpec {
        layout: Some(layout),
        seed,
        ..SynthSpec::new("qwen3_5", Size::Tiny, format)
    }
}

fn write(spec: &SynthSpec, dir: &Path) -> PathBuf {
    let out = dir.join(spec.to_string().replace([':', '@'], "_"));
    write_checkpoint(spec, &out, &WriteOptions::default()).unwrap();
    out
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn config(dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap()
}

fn f32s(store: &WeightStore, name: &str) -> Vec<f32> {
    store.tensor(name).unwrap().to_vec_f32().unwrap()
}

fn fixture(format: Format) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/mlx-written")
        .join(format!("qwen3_5-{}", format.name()))
}

#[test]
fn same_arguments_give_identical_bytes() {
    for (format, layout) in [
        (Format::F32, Layout::Hf),
        (Format::Bf16, Layout::Mlx),
        (Format::Q4, Layout::Mlx),
        (Format::Nvfp4, Layout::Mlx),
    ] {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let s = spec(format, layout, 3);
        let first = files(&write(&s, a.path()));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let second = files(&pool.install(|| write(&s, b.path())));
        assert!(first == second, "{s}: files differ between runs");
    }
    // Another seed changes the weights only.
    let dir = tempfile::tempdir().unwrap();
    let a = files(&write(&spec(Format::Bf16, Layout::Hf, 1), dir.path()));
    let b = files(&write(&spec(Format::Bf16, Layout::Hf, 2), dir.path()));
    assert_ne!(a["model.safetensors"], b["model.safetensors"]);
    assert_eq!(a["config.json"], b["config.json"]);
    assert_eq!(a["tokenizer.json"], b["tokenizer.json"]);
}

/// Every key path of a JSON object, with the JSON type of its value.
fn key_types(v: &Value, prefix: &str, out: &mut BTreeMap<String, &'static str>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            let path = format!("{prefix}{k}");
            let kind = match x {
                Value::Null => "null",
                Value::Bool(_) => "bool",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            };
            out.insert(path.clone(), kind);
            key_types(x, &format!("{path}."), out);
        }
    }
}

/// (dtype, rank, conv1d stored `[C, K, 1]`) per tensor name, without the lm_head (the fixtures
/// tie it in some formats).
fn structure(store: &WeightStore) -> BTreeMap<String, (DType, usize, bool)> {
    store
        .names()
        .into_iter()
        .filter(|n| !n.contains("lm_head"))
        .map(|n| {
            let (dtype, shape) = store.info(&n).unwrap();
            let conv_mlx = n.contains("conv1d") && shape.last() == Some(&1);
            (n.clone(), (dtype, shape.len(), conv_mlx))
        })
        .collect()
}

#[test]
fn mlx_layout_has_the_structure_mlx_lm_writes() {
    let dir = tempfile::tempdir().unwrap();
    for format in FORMATS {
        let ours_dir = write(&spec(format, Layout::Mlx, 0), dir.path());
        let theirs = WeightStore::open(&fixture(format)).unwrap();
        let ours = WeightStore::open(&ours_dir).unwrap();
        // Same layer count and pattern as the fixtures, so the very same names and dtypes.
        assert_eq!(structure(&ours), structure(&theirs), "{format:?}");
        assert!(ours.contains("language_model.lm_head.weight"));
        assert!(!ours.names().iter().any(|n| n.contains("mtp")));

        let (ours_cfg, theirs_cfg) = (config(&ours_dir), config(&fixture(format)));
        let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
        key_types(&ours_cfg, "", &mut a);
        key_types(&theirs_cfg, "", &mut b);
        for (key, kind) in &b {
            // `dtype` follows the format; every other key the fixture has, we have, same type.
            assert_eq!(a.get(key), Some(kind), "{format:?}: config key {key}");
        }
        for key in [
            "/architectures",
            "/model_type",
            "/quantization",
            "/quantization_config",
            "/text_config/model_type",
            "/text_config/attn_output_gate",
            "/text_config/full_attention_interval",
            "/text_config/layer_types",
            "/text_config/linear_conv_kernel_dim",
            "/text_config/linear_num_key_heads",
            "/text_config/linear_num_value_heads",
            "/text_config/linear_key_head_dim",
            "/text_config/linear_value_head_dim",
            "/text_config/num_hidden_layers",
            "/text_config/rope_parameters/partial_rotary_factor",
            "/text_config/rope_parameters/type",
            "/text_config/rope_parameters/mrope_interleaved",
            "/text_config/rms_norm_eps",
            "/text_config/dtype",
        ] {
            assert_eq!(
                ours_cfg.pointer(key),
                theirs_cfg.pointer(key),
                "{format:?}: {key}"
            );
        }
        assert_eq!(
            ours_cfg["text_config"]["rope_parameters"]["rope_theta"].as_f64(),
            Some(1e7)
        );
        // mlx-lm's save_config sorts the top level.
        let top: Vec<&String> = ours_cfg.as_object().unwrap().keys().collect();
        let mut sorted = top.clone();
        sorted.sort();
        assert_eq!(top, sorted);
    }
}

/// The 1-D norms transformers' `Qwen3_5RMSNorm` applies as `1 + w` (names relative to the text
/// model), per the published checkpoint's modelling code.
fn offset_norms() -> Vec<String> {
    let mut n = vec!["norm.weight".to_string()];
    for l in 0..LAYERS {
        n.push(format!("layers.{l}.input_layernorm.weight"));
        n.push(format!("layers.{l}.post_attention_layernorm.weight"));
        if (l + 1) % 4 == 0 {
            n.push(format!("layers.{l}.self_attn.q_norm.weight"));
            n.push(format!("layers.{l}.self_attn.k_norm.weight"));
        }
    }
    n
}

fn mtp_names() -> BTreeMap<String, Vec<usize>> {
    [
        ("mtp.fc.weight", vec![H, 2 * H]),
        ("mtp.pre_fc_norm_embedding.weight", vec![H]),
        ("mtp.pre_fc_norm_hidden.weight", vec![H]),
        ("mtp.norm.weight", vec![H]),
        ("mtp.layers.0.input_layernorm.weight", vec![H]),
        ("mtp.layers.0.post_attention_layernorm.weight", vec![H]),
        (
            "mtp.layers.0.self_attn.q_proj.weight",
            vec![2 * HEADS * HD, H],
        ),
        (
            "mtp.layers.0.self_attn.k_proj.weight",
            vec![KV_HEADS * HD, H],
        ),
        (
            "mtp.layers.0.self_attn.v_proj.weight",
            vec![KV_HEADS * HD, H],
        ),
        ("mtp.layers.0.self_attn.o_proj.weight", vec![H, HEADS * HD]),
        ("mtp.layers.0.self_attn.q_norm.weight", vec![HD]),
        ("mtp.layers.0.self_attn.k_norm.weight", vec![HD]),
        ("mtp.layers.0.mlp.gate_proj.weight", vec![INTER, H]),
        ("mtp.layers.0.mlp.up_proj.weight", vec![INTER, H]),
        ("mtp.layers.0.mlp.down_proj.weight", vec![H, INTER]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[test]
fn hf_layout_follows_the_published_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let hf_dir = write(&spec(Format::F32, Layout::Hf, 9), dir.path());
    let mlx_dir = write(&spec(Format::F32, Layout::Mlx, 9), dir.path());
    let (hf, mlx) = (
        WeightStore::open(&hf_dir).unwrap(),
        WeightStore::open(&mlx_dir).unwrap(),
    );
    let names = hf.names();
    // Text model under model.language_model, lm_head at the top, MTP head present.
    for n in &names {
        assert!(
            n.starts_with("model.language_model.")
                || n == "lm_head.weight"
                || n.starts_with("mtp."),
            "{n}"
        );
    }
    let mtp: BTreeSet<&String> = names.iter().filter(|n| n.starts_with("mtp.")).collect();
    let want = mtp_names();
    assert_eq!(mtp, want.keys().collect::<BTreeSet<_>>());
    for (name, shape) in &want {
        assert_eq!(hf.info(name).unwrap().1, &shape[..], "{name}");
    }
    // Same text tensors as the mlx folder, renamed, plus the MTP head.
    let text: BTreeSet<String> = names
        .iter()
        .filter(|n| !n.starts_with("mtp."))
        .map(|n| match n.as_str() {
            "lm_head.weight" => "language_model.lm_head.weight".to_string(),
            _ => n.replace("model.language_model.", "language_model.model."),
        })
        .collect();
    assert_eq!(text, mlx.names().into_iter().collect::<BTreeSet<_>>());

    let hf_name = |rest: &str| format!("model.language_model.{rest}");
    let mlx_name = |rest: &str| format!("language_model.model.{rest}");
    for l in (0..LAYERS).filter(|l| (l + 1) % 4 != 0) {
        let conv = format!("layers.{l}.linear_attn.conv1d.weight");
        let c = 2 * HK * DK + HV * DV;
        assert_eq!(hf.info(&hf_name(&conv)).unwrap().1, &[c, 1, K][..]);
        assert_eq!(mlx.info(&mlx_name(&conv)).unwrap().1, &[c, K, 1][..]);
        // Same taps in both layouts (the size-1 axis does not move any element).
        assert_eq!(f32s(&hf, &hf_name(&conv)), f32s(&mlx, &mlx_name(&conv)));
        // The gated output norm is the multiplier in both layouts.
        let gated = format!("layers.{l}.linear_attn.norm.weight");
        let g = f32s(&hf, &hf_name(&gated));
        assert_eq!(g, f32s(&mlx, &mlx_name(&gated)));
        assert!(g.iter().all(|x| (0.5..1.5).contains(x)), "{gated}: {g:?}");
    }
    // Offset norms: hf = mlx − 1, i.e. hf + 1 is exactly mlx's multiplier (1 + noise).
    for rest in offset_norms() {
        let (o, m) = (f32s(&hf, &hf_name(&rest)), f32s(&mlx, &mlx_name(&rest)));
        assert!(o.iter().all(|x| x.abs() < 0.6), "{rest}: {o:?}");
        let back: Vec<f32> = o.iter().map(|x| x + 1.0).collect();
        assert_eq!(back, m, "{rest}");
    }
    // MTP norms are Qwen3_5RMSNorm too: offsets around 0.
    for (name, shape) in &want {
        if shape.len() == 1 {
            let v = f32s(&hf, name);
            let mean = v.iter().sum::<f32>() / v.len() as f32;
            assert!(mean.abs() < 0.1, "{name}: mean {mean}");
        }
    }
    assert_eq!(config(&hf_dir)["text_config"]["mtp_num_hidden_layers"], 1);
    assert_eq!(
        config(&hf_dir)["text_config"]["rope_parameters"]["rope_type"],
        "default"
    );
    assert!(config(&hf_dir)["vision_config"].is_object());

    // bf16 folders keep A_log in f32 in both layouts, and the gated norm in f32 in the hf one
    // (as the published Qwen3.5-0.8B stores them); everything else is bf16.
    for layout in [Layout::Hf, Layout::Mlx] {
        let store = WeightStore::open(&write(&spec(Format::Bf16, layout, 9), dir.path())).unwrap();
        for n in store.names() {
            let dtype = store.info(&n).unwrap().0;
            let f32_expected = n.ends_with("A_log")
                || (layout == Layout::Hf && n.ends_with("linear_attn.norm.weight"));
            let want = if f32_expected {
                DType::F32
            } else {
                DType::BF16
            };
            assert_eq!(dtype, want, "{layout:?} {n}");
        }
    }
}

#[test]
fn decays_span_weak_to_strong() {
    let dir = tempfile::tempdir().unwrap();
    let store = WeightStore::open(&write(&spec(Format::F32, Layout::Mlx, 0), dir.path())).unwrap();
    let mut per_layer = Vec::new();
    for l in (0..LAYERS).filter(|l| (l + 1) % 4 != 0) {
        let p = format!("language_model.model.layers.{l}.linear_attn");
        let a: Vec<f64> = f32s(&store, &format!("{p}.A_log"))
            .iter()
            .map(|&x| (x as f64).exp())
            .collect();
        let mut sorted = a.clone();
        sorted.sort_by(f64::total_cmp);
        approx::assert_relative_eq!(sorted[0], 0.002, max_relative = 1e-4);
        approx::assert_relative_eq!(sorted[HV - 1], 60.0, max_relative = 1e-4);
        // Log-spaced: equal ratios between neighbours.
        let ratio = (60.0f64 / 0.002).powf(1.0 / (HV - 1) as f64);
        for w in sorted.windows(2) {
            approx::assert_relative_eq!(w[1] / w[0], ratio, max_relative = 1e-4);
        }
        let dt = f32s(&store, &format!("{p}.dt_bias"));
        assert!(dt.iter().all(|x| (-1.0..=1.5).contains(x)), "{p}: {dt:?}");
        per_layer.push(a);
    }
    // Layers differ in which head decays how fast.
    assert_ne!(per_layer[0], per_layer[1]);
}

#[test]
fn every_format_and_layout_loads_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(Format, Layout)> = FORMATS.iter().map(|&f| (f, Layout::Mlx)).collect();
    cases.extend([(Format::F32, Layout::Hf), (Format::Bf16, Layout::Hf)]);
    for (format, layout) in cases {
        let out = write(&spec(format, layout, 0), dir.path());
        let cfg = ModelConfig::load(&out).unwrap();
        assert_eq!(cfg.model_type, "qwen3_5", "{format:?} {layout:?}");
        for (key, want) in [
            ("hidden_size", H),
            ("num_hidden_layers", LAYERS),
            ("linear_num_key_heads", HK),
            ("linear_num_value_heads", HV),
            ("linear_key_head_dim", DK),
            ("linear_value_head_dim", DV),
            ("linear_conv_kernel_dim", K),
            ("num_attention_heads", HEADS),
            ("num_key_value_heads", KV_HEADS),
            ("head_dim", HD),
            ("intermediate_size", INTER),
            ("vocab_size", VOCAB),
        ] {
            assert_eq!(cfg.usize(key).unwrap(), want, "{format:?} {layout:?} {key}");
        }
        assert_eq!(cfg.quant.default, format.quant_spec(), "{format:?}");

        let store = WeightStore::open(&out).unwrap();
        let model = Qwen3_5::load(&cfg, &store).unwrap();
        let (want_layout, offset, mtp) = match layout {
            Layout::Hf => (EngineLayout::Hf, true, true),
            Layout::Mlx => (EngineLayout::Mlx, false, false),
        };
        assert_eq!(model.layout(), want_layout, "{format:?} {layout:?}");
        assert_eq!(model.norms_offset(), offset, "{format:?} {layout:?}");
        assert_eq!(model.mtp().is_some(), mtp, "{format:?} {layout:?}");
        assert_eq!(
            model.info().layer_kinds,
            [
                "linear_attention",
                "linear_attention",
                "linear_attention",
                "full_attention"
            ]
        );
    }
}

#[test]
fn both_layouts_hold_the_same_model() {
    // The engine undoes the hf layout's conventions at load; the two f32 folders of one seed must
    // then give the same logits.
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 1000).collect();
    let mut logits = Vec::new();
    for layout in [Layout::Hf, Layout::Mlx] {
        let model =
            engine::models::load(&write(&spec(Format::F32, layout, 4), dir.path())).unwrap();
        let mut state = model.new_state();
        let out = model.forward(&ids, &mut state, true).unwrap();
        logits.push(out.to_vec_f32().unwrap());
    }
    let (a, b) = (&logits[0], &logits[1]);
    assert_eq!(a.len(), ids.len() * VOCAB);
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    assert!(
        (num / den).sqrt() < 1e-5,
        "relative difference {}",
        (num / den).sqrt()
    );
    // Peaky logits: std about 5 (LOGIT_STD), so greedy decoding has margins.
    let last = &a[(ids.len() - 1) * VOCAB..];
    let mean = last.iter().map(|&x| x as f64).sum::<f64>() / VOCAB as f64;
    let std = (last.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / VOCAB as f64).sqrt();
    assert!((3.0..8.0).contains(&std), "logit std {std}");
}

#[test]
fn bench_size_has_the_qwen3_5_0_8b_widths() {
    let s = SynthSpec::new("qwen3_5", Size::Bench, Format::Bf16);
    let family = families::find("qwen3_5").unwrap();
    let hf = family.plan(&s, Layout::Hf).unwrap();
    let t = &hf.config["text_config"];
    // Published Qwen/Qwen3.5-0.8B text_config.
    for (key, want) in [
        ("hidden_size", 1024),
        ("num_hidden_layers", 24),
        ("full_attention_interval", 4),
        ("linear_num_key_heads", 16),
        ("linear_num_value_heads", 16),
        ("linear_key_head_dim", 128),
        ("linear_value_head_dim", 128),
        ("linear_conv_kernel_dim", 4),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 2),
        ("head_dim", 256),
        ("intermediate_size", 3584),
        ("vocab_size", 248_320),
        ("max_position_embeddings", 262_144),
    ] {
        assert_eq!(t[key], want, "{key}");
    }
    assert_eq!(t["tie_word_embeddings"], true);
    assert_eq!(
        t["rope_parameters"]["mrope_section"],
        serde_json::json!([11, 11, 10])
    );

    // Parameter count from the widths, computed here independently.
    let (h, i, v) = (1024usize, 3584usize, 248_320usize);
    let gdn = (2 * 16 * 128 + 16 * 128) * h // in_proj_qkv
        + 16 * 128 * h // in_proj_z
        + 2 * 16 * h // in_proj_a, in_proj_b
        + (2 * 16 * 128 + 16 * 128) * 4 // conv1d
        + 2 * 16 // A_log, dt_bias
        + 128 // gated norm
        + h * 16 * 128; // out_proj
    let attn = 2 * 8 * 256 * h + 2 * 2 * 256 * h + h * 8 * 256 + 2 * 256;
    let mlp_norms = 3 * h * i + 2 * h;
    let text = v * h + h + 18 * gdn + 6 * attn + 24 * mlp_norms;
    let mtp = h * 2 * h + 3 * h + attn + mlp_norms;
    let params =
        |p: &synth::plan::ModelPlan| -> usize { p.tensors.iter().map(|t| t.numel()).sum() };
    assert_eq!(params(&hf), text + mtp);
    let mlx = family.plan(&s, Layout::Mlx).unwrap();
    assert_eq!(params(&mlx), text);
    // About 0.75B for the text model (0.8B with the vision tower the real checkpoint adds).
    assert!((700_000_000..800_000_000).contains(&text), "{text}");
    assert!(!hf.tensors.iter().any(|t| t.name.contains("lm_head")));
}

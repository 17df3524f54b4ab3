//! Synthetic checkpoints: determinism, loading through the engine, agreement between formats,
//! sharding, tokenizer round trips and safe writing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use engine::config::{GenerationConfig, ModelConfig};
use engine::tokenizer::{ChatMessage, Tokenizer};
use engine::weights::WeightStore;
use kernels::{DType, Weight};
use synth::{families, write_checkpoint, Format, Layout, Size, SynthSpec, WriteOptions};

const TINY: (usize, usize, usize, usize, usize, usize, usize) = (128, 256, 2, 4, 2, 32, 1024);

fn spec(format: Format, seed: u64) -> SynthSpec {
    SynthSpec {
        seed,
        ..SynthSpec::new("qwen3", Size::Tiny, format)
    }
}

fn write(spec: &SynthSpec, dir: &Path) -> PathBuf {
    write_with(spec, dir, &WriteOptions::default())
}

fn write_with(spec: &SynthSpec, dir: &Path, opts: &WriteOptions) -> PathBuf {
    let out = dir.join(spec.to_string().replace([':', '@'], "_"));
    write_checkpoint(spec, &out, opts).unwrap();
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

#[test]
fn same_arguments_give_identical_bytes() {
    for format in [Format::F32, Format::Q4, Format::Nvfp4] {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let s = spec(format, 3);
        let first = files(&write(&s, a.path()));
        // A different pool size must not change a byte.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let second = files(&pool.install(|| write(&s, b.path())));
        assert_eq!(
            first.keys().collect::<Vec<_>>(),
            [
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        assert!(first == second, "{format:?}: files differ between runs");
    }
}

#[test]
fn different_seed_changes_weights_only() {
    let dir = tempfile::tempdir().unwrap();
    let a = files(&write(&spec(Format::Bf16, 1), dir.path()));
    let b = files(&write(&spec(Format::Bf16, 2), dir.path()));
    assert_ne!(a["model.safetensors"], b["model.safetensors"]);
    assert_eq!(a["model.safetensors"].len(), b["model.safetensors"].len());
    assert_eq!(a["tokenizer.json"], b["tokenizer.json"]);
    assert_eq!(a["config.json"], b["config.json"]);
}

/// Every projection of the tiny model as (module prefix, rows, cols).
fn matrices() -> Vec<(String, usize, usize)> {
    let (h, i, layers, heads, kv, hd, v) = TINY;
    let mut m = vec![
        ("model.embed_tokens".to_string(), v, h),
        ("lm_head".to_string(), v, h),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        m.extend([
            (format!("{p}.self_attn.q_proj"), heads * hd, h),
            (format!("{p}.self_attn.k_proj"), kv * hd, h),
            (format!("{p}.self_attn.v_proj"), kv * hd, h),
            (format!("{p}.self_attn.o_proj"), h, heads * hd),
            (format!("{p}.mlp.gate_proj"), i, h),
            (format!("{p}.mlp.up_proj"), i, h),
            (format!("{p}.mlp.down_proj"), h, i),
        ]);
    }
    m
}

fn norms() -> Vec<(String, usize)> {
    let (h, _, layers, _, _, hd, _) = TINY;
    let mut n = vec![("model.norm.weight".to_string(), h)];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        n.extend([
            (format!("{p}.input_layernorm.weight"), h),
            (format!("{p}.post_attention_layernorm.weight"), h),
            (format!("{p}.self_attn.q_norm.weight"), hd),
            (format!("{p}.self_attn.k_norm.weight"), hd),
        ]);
    }
    n
}

fn dense_f32(w: &Weight) -> Vec<f32> {
    let mut out = vec![0f32; w.rows() * w.cols()];
    kernels::quant::decode::dequant_rows(w, 0, w.rows(), &mut out).unwrap();
    out
}

fn f32s(t: &kernels::Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

#[test]
fn every_format_loads_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let (h, i, layers, heads, kv, hd, v) = TINY;
    for format in [
        Format::F32,
        Format::Bf16,
        Format::Q4,
        Format::Q8,
        Format::Mxfp4,
        Format::Nvfp4,
        Format::Mxfp8,
    ] {
        let out = write(&spec(format, 0), dir.path());
        let cfg = ModelConfig::load(&out).unwrap();
        assert_eq!(cfg.model_type, "qwen3");
        for (key, want) in [
            ("hidden_size", h),
            ("intermediate_size", i),
            ("num_hidden_layers", layers),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv),
            ("head_dim", hd),
            ("vocab_size", v),
        ] {
            assert_eq!(cfg.usize(key).unwrap(), want, "{format:?} {key}");
        }
        assert_eq!(cfg.f64("rms_norm_eps").unwrap(), 1e-6);
        assert_eq!(cfg.f64("rope_theta").unwrap(), 1e6);
        assert!(!cfg.bool_or("tie_word_embeddings", true).unwrap());
        assert_eq!(cfg.quant.default, format.quant_spec(), "{format:?}");

        let gen = GenerationConfig::load(&out).unwrap();
        assert_eq!(gen.eos_token_ids, vec![1023, 1021]);
        assert_eq!(
            (gen.temperature, gen.top_k, gen.top_p),
            (Some(0.6), Some(20), Some(0.95))
        );

        let store = WeightStore::open(&out).unwrap();
        let float = if format == Format::F32 {
            DType::F32
        } else {
            DType::BF16
        };
        for (prefix, rows, cols) in matrices() {
            let w = store
                .weight(&prefix, cfg.quant.spec_for(&prefix), rows, cols)
                .unwrap();
            assert_eq!((w.rows(), w.cols()), (rows, cols), "{prefix}");
            match (&w, format.quant_spec()) {
                (Weight::Dense(t), None) => assert_eq!(t.dtype(), float, "{prefix}"),
                (Weight::Quant(q), Some(spec)) => assert_eq!(q.spec, spec, "{prefix}"),
                _ => panic!("{format:?}: {prefix} stored as {}", w.format_name()),
            }
        }
        for (name, n) in norms() {
            assert_eq!(
                store.tensor_shaped(&name, &[n]).unwrap().dtype(),
                float,
                "{name}"
            );
        }
        let mut want: Vec<String> = norms().into_iter().map(|n| n.0).collect();
        for (p, _, _) in matrices() {
            want.push(format!("{p}.weight"));
            if let Some(q) = format.quant_spec() {
                want.push(format!("{p}.scales"));
                if q.mode.has_biases() {
                    want.push(format!("{p}.biases"));
                }
            }
        }
        want.sort();
        assert_eq!(store.names(), want, "{format:?}: unexpected tensor set");
    }
}

/// rms(a − b) / rms(a).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn formats_store_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 11;
    let reference = WeightStore::open(&write(&spec(Format::F32, seed), dir.path())).unwrap();

    // bf16 = the f32 values rounded to nearest even, element for element.
    let bf = WeightStore::open(&write(&spec(Format::Bf16, seed), dir.path())).unwrap();
    for name in reference.names() {
        let want: Vec<f32> = f32s(&reference.tensor(&name).unwrap())
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(f32s(&bf.tensor(&name).unwrap()), want, "{name}");
    }

    // Quantized formats: close to the f32 values, each within its format's typical error on
    // Gaussian weights.
    for (format, bound) in [
        (Format::Q8, 0.01),
        (Format::Q4, 0.15),
        (Format::Mxfp8, 0.05),
        (Format::Nvfp4, 0.15),
        (Format::Mxfp4, 0.25),
    ] {
        let out = write(&spec(format, seed), dir.path());
        let cfg = ModelConfig::load(&out).unwrap();
        let q = WeightStore::open(&out).unwrap();
        for (prefix, rows, cols) in matrices() {
            let want = f32s(&reference.tensor(&format!("{prefix}.weight")).unwrap());
            let got = dense_f32(
                &q.weight(&prefix, cfg.quant.spec_for(&prefix), rows, cols)
                    .unwrap(),
            );
            let e = rel_err(&want, &got);
            assert!(e < bound, "{format:?} {prefix}: relative error {e}");
            assert!(e > 0.0, "{format:?} {prefix}: suspiciously exact");
        }
    }
}

#[test]
fn values_have_the_intended_scales() {
    let dir = tempfile::tempdir().unwrap();
    let store = WeightStore::open(&write(&spec(Format::F32, 5), dir.path())).unwrap();
    for (name, _) in norms() {
        let v = f32s(&store.tensor(&name).unwrap());
        assert!(v.iter().all(|x| (0.8..1.2).contains(x)), "{name}: {v:?}");
    }
    for (prefix, _, cols) in matrices() {
        let v = f32s(&store.tensor(&format!("{prefix}.weight")).unwrap());
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let std =
            (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        let want = match prefix.as_str() {
            "model.embed_tokens" => 1.0,
            "lm_head" => 5.0 / (cols as f64).sqrt(),
            _ => 1.0 / (cols as f64).sqrt(),
        };
        assert!(mean.abs() < 0.05 * want, "{prefix}: mean {mean}");
        assert!(
            approx::relative_eq!(std, want, max_relative = 0.05),
            "{prefix}: std {std}, want {want}"
        );
    }
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(Format::Q4, 4);
    let single = WeightStore::open(&write(&s, dir.path())).unwrap();
    let sharded_dir = dir.path().join("sharded");
    let opts = WriteOptions {
        max_shard_bytes: 64 << 10,
        ..WriteOptions::default()
    };
    write_checkpoint(&s, &sharded_dir, &opts).unwrap();
    let names = files(&sharded_dir);
    let shards: Vec<&String> = names
        .keys()
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert!(shards.len() > 2, "{shards:?}");
    assert!(!names.contains_key("model.safetensors"));
    let n = shards.len();
    assert_eq!(*shards[0], format!("model-00001-of-{n:05}.safetensors"));
    for (name, bytes) in &names {
        // A shard exceeds the limit only when it holds a single tensor larger than it.
        if name.ends_with(".safetensors") && bytes.len() > 64 << 10 {
            let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value =
                serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
            assert_eq!(
                header.as_object().unwrap().len(),
                2,
                "{name}: oversized shard"
            );
        }
    }
    let index: serde_json::Value =
        serde_json::from_slice(&names["model.safetensors.index.json"]).unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.keys().cloned().collect::<Vec<_>>(), single.names());

    let sharded = WeightStore::open(&sharded_dir).unwrap();
    assert_eq!(sharded.files().len(), n);
    for name in single.names() {
        let (a, b) = (
            single.tensor(&name).unwrap(),
            sharded.tensor(&name).unwrap(),
        );
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.raw_bytes().unwrap(), b.raw_bytes().unwrap(), "{name}");
    }
}

#[test]
fn safetensors_header_follows_the_format() {
    let dir = tempfile::tempdir().unwrap();
    for (format, layout, meta) in [
        (Format::F32, Layout::Hf, "pt"),
        (Format::Bf16, Layout::Mlx, "mlx"),
        (Format::Mxfp4, Layout::Mlx, "mlx"),
    ] {
        let s = SynthSpec {
            layout: Some(layout),
            ..spec(format, 0)
        };
        let bytes = fs::read(write(&s, dir.path()).join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text.trim_end_matches(' ')).unwrap();
        assert_eq!(header["__metadata__"]["format"], meta);
        // The safetensors crate's layout: by descending dtype alignment, then by name; data
        // contiguous from 0 to the end of the file.
        safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut end = 0u64;
        let mut prev: Option<(std::cmp::Reverse<safetensors::Dtype>, String)> = None;
        for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
            let dtype: safetensors::Dtype = serde_json::from_value(info["dtype"].clone()).unwrap();
            let key = (std::cmp::Reverse(dtype), name.clone());
            assert!(
                prev.as_ref().is_none_or(|p| key > *p),
                "{name} after {prev:?}"
            );
            prev = Some(key);
            let off = info["data_offsets"].as_array().unwrap();
            assert_eq!(off[0].as_u64().unwrap(), end, "{name}");
            end = off[1].as_u64().unwrap();
        }
        assert_eq!(8 + n as u64 + end, bytes.len() as u64);
    }
}

#[test]
fn tokenizer_round_trips_text() {
    let dir = tempfile::tempdir().unwrap();
    let out = write(&spec(Format::F32, 0), dir.path());
    let text =
        "Hello, world! The lighthouse keeper counted 128 steps.\n\tGrüße aus Köln — 日本語 🙂  end";

    let raw = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    assert_eq!(raw.get_vocab_size(true), 1024);
    let ids = raw.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(raw.decode(&ids, false).unwrap(), text);
    // Merges learned from English prose are used: clearly fewer tokens than bytes.
    let prose = "The lighthouse keeper counted the steps, and the town settled into the night.";
    let n = raw.encode(prose, false).unwrap().get_ids().len();
    assert!(n * 2 < prose.len(), "{n} ids for {} bytes", prose.len());

    let tok = Tokenizer::load(&out).unwrap();
    assert_eq!(tok.encode(text, false).unwrap(), ids);
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.token_id("<|im_end|>"), Some(1023));
    assert_eq!(tok.token_id("<|endoftext|>"), Some(1021));
    assert_eq!(tok.encode("<|im_start|>user", false).unwrap()[0], 1022);
    let prompt = tok
        .apply_chat_template(&[ChatMessage::new("user", "Hi there")], true)
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn refuses_to_overwrite_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("keep.txt"), "mine").unwrap();
    let s = spec(Format::F32, 0);
    let err = write_checkpoint(&s, &out, &WriteOptions::default()).unwrap_err();
    assert!(format!("{err:#}").contains("--force"), "{err:#}");
    assert!(out.join("keep.txt").exists());

    let forced = WriteOptions {
        force: true,
        ..WriteOptions::default()
    };
    write_checkpoint(&s, &out, &forced).unwrap();
    assert!(!out.join("keep.txt").exists());
    assert!(out.join("model.safetensors").exists());

    // An empty folder is fine without --force; no temporary folder is left beside it.
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    write_checkpoint(&s, &empty, &WriteOptions::default()).unwrap();
    let mut left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["empty", "model"]);

    // A failing write (hf layout is refused for quantized formats) leaves nothing behind.
    let bad = SynthSpec {
        layout: Some(Layout::Hf),
        ..spec(Format::Q4, 0)
    };
    assert!(write_checkpoint(&bad, &dir.path().join("bad"), &WriteOptions::default()).is_err());
    assert!(!dir.path().join("bad").exists());
}

#[test]
fn bench_size_has_qwen3_0_6b_parameter_count() {
    let s = SynthSpec::new("qwen3", Size::Bench, Format::Bf16);
    let plan = families::find("qwen3")
        .unwrap()
        .plan(&s, s.resolved_layout())
        .unwrap();
    let params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
    // Qwen3-0.6B: 596,049,920 parameters with the tied embedding (0.44B without it).
    assert_eq!(params, 596_049_920);
    assert!(!plan.tensors.iter().any(|t| t.name == "lm_head.weight"));
    assert_eq!(plan.config["tie_word_embeddings"], true);
}

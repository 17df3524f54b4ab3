//! Checkpoint loading: safetensors (hand-built files, every dtype, shards, malformations),
//! config.json, generation_config.json, tokenizer and chat template.

use std::path::Path;

use engine::config::{GenerationConfig, ModelConfig};
use engine::tokenizer::{ChatMessage, Tokenizer};
use engine::weights::{Pages, WeightStore};
use kernels::{DType, QuantMode, QuantSpec, Weight};
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// A safetensors writer independent of the library's: the header is built as text and the data
// appended in order, optionally with a header length that leaves the data misaligned.

struct Entry {
    name: &'static str,
    dtype: &'static str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn entry(name: &'static str, dtype: &'static str, shape: &[usize], data: Vec<u8>) -> Entry {
    Entry {
        name,
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

fn safetensors_bytes(entries: &[Entry], pad_to_8: bool) -> Vec<u8> {
    let mut parts = vec![r#""__metadata__":{"format":"pt"}"#.to_string()];
    let mut offset = 0;
    for e in entries {
        let shape: Vec<String> = e.shape.iter().map(|d| d.to_string()).collect();
        parts.push(format!(
            r#""{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}}"#,
            e.name,
            e.dtype,
            shape.join(","),
            offset,
            offset + e.data.len()
        ));
        offset += e.data.len();
    }
    let mut header = format!("{{{}}}", parts.join(",")).into_bytes();
    if pad_to_8 {
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
    } else if header.len() % 8 == 0 {
        header.push(b' '); // force a misaligned data section
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    for e in entries {
        out.extend_from_slice(&e.data);
    }
    out
}

fn write_st(dir: &Path, file: &str, entries: &[Entry]) {
    std::fs::write(dir.join(file), safetensors_bytes(entries, true)).unwrap();
}

fn le<T: Copy, const N: usize>(xs: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    xs.iter().flat_map(|&x| f(x)).collect()
}

/// bf16 of values exactly representable in bf16: the top half of the f32 bits.
fn bf16_bits(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

fn err_text<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} should mention {p:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors

#[test]
fn every_dtype_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let f32s = [1.5f32, -2.25, 0.0, 3.0e-3, 7.0, -0.5];
    let exact = [1.5f32, -2.25, 0.0, 0.125, 7.0, -0.5]; // exact in f16 and bf16
    let f16_bits: Vec<u16> = vec![0x3E00, 0xC080, 0x0000, 0x3000, 0x4700, 0xB800];
    let entries = vec![
        entry("a.f32", "F32", &[2, 3], le(&f32s, f32::to_le_bytes)),
        entry("a.f16", "F16", &[3, 2], le(&f16_bits, u16::to_le_bytes)),
        entry(
            "a.bf16",
            "BF16",
            &[6],
            le(&exact.map(bf16_bits), u16::to_le_bytes),
        ),
        entry(
            "a.f64",
            "F64",
            &[2],
            le(&[0.1f64, -1e300], f64::to_le_bytes),
        ),
        entry(
            "a.u32",
            "U32",
            &[2, 2],
            le(&[1u32, 0xdead_beef, 7, 0], u32::to_le_bytes),
        ),
        entry("a.u8", "U8", &[5], vec![0, 1, 2, 254, 255]),
        entry(
            "a.i32",
            "I32",
            &[3],
            le(&[-1i32, i32::MAX, 5], i32::to_le_bytes),
        ),
        entry(
            "a.i64",
            "I64",
            &[1, 2],
            le(&[-7i64, i64::MIN], i64::to_le_bytes),
        ),
        entry("a.empty", "F32", &[0, 4], vec![]),
    ];
    // Both an aligned and a deliberately misaligned data section must read the same values,
    // from the memory map and from the CPU backend's copy in huge pages.
    let file = "model.safetensors";
    for (pad, pages) in [true, false]
        .into_iter()
        .flat_map(|pad| [Pages::Mapped, Pages::Huge].map(|p| (pad, p)))
    {
        std::fs::write(dir.path().join(file), safetensors_bytes(&entries, pad)).unwrap();
        let store = WeightStore::open_with(dir.path(), pages).unwrap();
        let names = store.names();
        let mut want: Vec<String> = entries.iter().map(|e| e.name.to_string()).collect();
        want.sort();
        assert_eq!(names, want);
        for e in &entries {
            let t = store.tensor(e.name).unwrap();
            assert_eq!(t.shape(), e.shape.as_slice(), "{}", e.name);
            assert_eq!(t.dtype().safetensors_name(), e.dtype, "{}", e.name);
            assert_eq!(t.raw_bytes().unwrap(), e.data.as_slice(), "{}", e.name);
        }
        assert_eq!(store.tensor("a.f32").unwrap().to_vec_f32().unwrap(), f32s);
        assert_eq!(store.tensor("a.f16").unwrap().to_vec_f32().unwrap(), exact);
        assert_eq!(store.tensor("a.bf16").unwrap().to_vec_f32().unwrap(), exact);
        assert_eq!(
            store.tensor("a.i64").unwrap().as_slice::<i64>().unwrap(),
            &[-7, i64::MIN]
        );
        assert_eq!(store.info("a.u32"), Some((DType::U32, &[2usize, 2][..])));
        let size = std::fs::metadata(dir.path().join(file)).unwrap().len();
        assert_eq!(store.total_bytes(), size);
        assert_eq!(store.files(), vec![dir.path().join(file)]);
    }
}

#[test]
fn loaded_objects_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<WeightStore>();
    send_sync::<Tokenizer>();
    send_sync::<ModelConfig>();
}

#[test]
fn crate_written_file_reads_back() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = tempfile::tempdir().unwrap();
    let w = le(&[1.0f32, 2.0, 3.0, 4.0], f32::to_le_bytes);
    let u = [9u8, 8, 7];
    let views = [
        ("w", TensorView::new(Dtype::F32, vec![2, 2], &w).unwrap()),
        ("u", TensorView::new(Dtype::U8, vec![3], &u).unwrap()),
    ];
    let meta = [("format".to_string(), "mlx".to_string())].into();
    let path = dir.path().join("model.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
    // Check the bytes with the independent reading of the format: header length, JSON, data.
    let raw = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + n) % 8, 0, "data section should start 8-byte aligned");
    let header: serde_json::Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    assert_eq!(header["__metadata__"]["format"], "mlx");
    assert_eq!(header["w"]["data_offsets"], json!([0, 16]));
    assert_eq!(header["u"]["data_offsets"], json!([16, 19]));
    assert_eq!(&raw[8 + n + 16..], &[9, 8, 7]);
    let store = WeightStore::open(dir.path()).unwrap();
    assert_eq!(
        store.tensor("w").unwrap().to_vec_f32().unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
}

fn small_f32(name: &'static str, v: f32) -> Entry {
    entry(name, "F32", &[2], le(&[v, v + 1.0], f32::to_le_bytes))
}

#[test]
fn sharded_index_loads_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_st(
        dir.path(),
        "model-00001-of-00002.safetensors",
        &[small_f32("x.a", 1.0), small_f32("x.b", 3.0)],
    );
    write_st(
        dir.path(),
        "model-00002-of-00002.safetensors",
        &[small_f32("x.c", 5.0)],
    );
    let index = json!({
        "metadata": {"total_size": 24},
        "weight_map": {
            "x.a": "model-00001-of-00002.safetensors",
            "x.b": "model-00001-of-00002.safetensors",
            "x.c": "model-00002-of-00002.safetensors",
        }
    });
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let store = WeightStore::open_with(dir.path(), Pages::Huge).unwrap();
    assert_eq!(store.names(), ["x.a", "x.b", "x.c"]);
    assert_eq!(store.files().len(), 2);
    assert_eq!(
        store.tensor("x.c").unwrap().to_vec_f32().unwrap(),
        [5.0, 6.0]
    );
    assert_eq!(
        store.tensor("x.b").unwrap().to_vec_f32().unwrap(),
        [3.0, 4.0]
    );
    let sizes: u64 = store
        .files()
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(store.total_bytes(), sizes);
}

#[test]
fn shards_without_index_load_like_mlx_lm() {
    let dir = tempfile::tempdir().unwrap();
    write_st(
        dir.path(),
        "model-00001-of-00002.safetensors",
        &[small_f32("p", 1.0)],
    );
    write_st(
        dir.path(),
        "model-00002-of-00002.safetensors",
        &[small_f32("q", 2.0)],
    );
    let store = WeightStore::open(dir.path()).unwrap();
    assert_eq!(store.names(), ["p", "q"]);

    // The same tensor in two shards with no index to arbitrate is an error naming both.
    write_st(
        dir.path(),
        "model-00002-of-00002.safetensors",
        &[small_f32("p", 2.0)],
    );
    let msg = err_text(WeightStore::open(dir.path()));
    assert_contains(
        &msg,
        &["`p`", "model-00001-of-00002", "model-00002-of-00002"],
    );
}

#[test]
fn index_errors_name_index_and_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_st(
        dir.path(),
        "model-00001-of-00002.safetensors",
        &[small_f32("x.a", 1.0)],
    );
    let index = json!({"weight_map": {
        "x.a": "model-00001-of-00002.safetensors",
        "x.z": "model-00002-of-00002.safetensors",
    }});
    let index_path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).unwrap();
    let msg = err_text(WeightStore::open(dir.path()));
    assert_contains(
        &msg,
        &[
            "model.safetensors.index.json",
            "model-00002-of-00002.safetensors",
            "x.z",
        ],
    );

    let index = json!({"weight_map": {"x.a": "model-00001-of-00002.safetensors",
                                      "x.b": "model-00001-of-00002.safetensors"}});
    std::fs::write(&index_path, index.to_string()).unwrap();
    let msg = err_text(WeightStore::open(dir.path()));
    assert_contains(
        &msg,
        &[
            "model.safetensors.index.json",
            "`x.b`",
            "model-00001-of-00002",
        ],
    );

    std::fs::write(&index_path, r#"{"metadata": {}}"#).unwrap();
    let msg = err_text(WeightStore::open(dir.path()));
    assert_contains(&msg, &["model.safetensors.index.json", "weight_map"]);
}

#[test]
fn malformed_files_name_file_and_field() {
    let good = safetensors_bytes(&[small_f32("w.ok", 1.0)], true);
    let header_of = |json: &str| {
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        b.extend_from_slice(&[0u8; 8]);
        b
    };
    let mut huge_len = good.clone();
    huge_len[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("too short", vec![1, 2, 3], vec!["too short"]),
        ("header length past end", huge_len, vec!["header length"]),
        (
            "not json",
            header_of("{\"w\": [1, 2"),
            vec!["not valid JSON"],
        ),
        ("not an object", header_of("[1, 2]"), vec!["JSON object"]),
        (
            "unknown dtype",
            header_of(r#"{"w.fp8":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}}"#),
            vec!["`w.fp8`", "F8_E4M3"],
        ),
        (
            "offsets past end",
            header_of(r#"{"w.big":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#),
            vec!["`w.big`", "past the end"],
        ),
        (
            "offsets do not match shape",
            header_of(r#"{"w.odd":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#),
            vec!["`w.odd`", "needs 12"],
        ),
        (
            "reversed offsets",
            header_of(r#"{"w.rev":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#),
            vec!["`w.rev`", "data_offsets"],
        ),
        (
            "missing shape",
            header_of(r#"{"w.ns":{"dtype":"U8","data_offsets":[0,1]}}"#),
            vec!["`w.ns`", "`shape`"],
        ),
        (
            "overlapping offsets",
            header_of(
                r#"{"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#,
            ),
            vec!["`b`", "overlap"],
        ),
        (
            "a gap between tensors",
            header_of(
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#,
            ),
            vec!["`b`", "gap"],
        ),
        (
            "trailing bytes",
            header_of(r#"{"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]}}"#),
            vec!["2 trailing bytes"],
        ),
        (
            "duplicate names",
            header_of(
                r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}"#,
            ),
            vec!["`a`", "twice"],
        ),
        (
            "bad metadata",
            header_of(r#"{"__metadata__":{"n":1}}"#),
            vec!["__metadata__"],
        ),
    ];
    for (what, bytes, parts) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
        let msg = err_text(WeightStore::open(dir.path()));
        assert!(msg.contains("model.safetensors"), "{what}: {msg}");
        assert_contains(&msg, &parts);
    }
}

#[test]
fn missing_folder_and_missing_weights() {
    let dir = tempfile::tempdir().unwrap();
    let msg = err_text(WeightStore::open(&dir.path().join("nope")));
    assert_contains(&msg, &["nope", "does not exist"]);
    let msg = err_text(WeightStore::open(dir.path()));
    assert_contains(&msg, &["model.safetensors", "no weights"]);
}

#[test]
fn missing_tensor_and_wrong_shape_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_st(
        dir.path(),
        "model.safetensors",
        &[small_f32("model.language_model.norm.weight", 1.0)],
    );
    let store = WeightStore::open(dir.path()).unwrap();
    assert!(store.contains("model.language_model.norm.weight"));
    assert!(!store.contains("model.norm.weight"));
    let msg = err_text(store.tensor("model.norm.weight"));
    assert_contains(
        &msg,
        &[
            &dir.path().display().to_string(),
            "`model.norm.weight` is missing",
            "model.language_model.norm.weight",
        ],
    );
    let msg = err_text(store.tensor_shaped("model.language_model.norm.weight", &[3]));
    assert_contains(&msg, &["model.safetensors", "norm.weight", "[2]", "[3]"]);
    assert!(store
        .tensor_shaped("model.language_model.norm.weight", &[2])
        .is_ok());
}

/// Packs 4-bit values little-end-first into u32 words, as MLX does.
fn pack4(q: &[u32]) -> Vec<u32> {
    q.chunks(8)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u32, |w, (i, &v)| w | (v << (4 * i)))
        })
        .collect()
}

#[test]
fn dense_and_quantized_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols, group) = (2usize, 64usize, 32usize);
    let q: Vec<u32> = (0..rows * cols).map(|i| (i % 16) as u32).collect();
    let packed = pack4(&q);
    let scales: Vec<u16> = [0.5f32, 1.0, 2.0, 0.25].map(bf16_bits).to_vec();
    let biases: Vec<u16> = [-1.0f32, 0.0, 1.0, 2.0].map(bf16_bits).to_vec();
    let dense: Vec<u16> = (0..rows * cols).map(|i| bf16_bits(i as f32)).collect();
    write_st(
        dir.path(),
        "model.safetensors",
        &[
            entry(
                "q.weight",
                "U32",
                &[rows, cols / 8],
                le(&packed, u32::to_le_bytes),
            ),
            entry(
                "q.scales",
                "BF16",
                &[rows, cols / group],
                le(&scales, u16::to_le_bytes),
            ),
            entry(
                "q.biases",
                "BF16",
                &[rows, cols / group],
                le(&biases, u16::to_le_bytes),
            ),
            entry(
                "nb.weight",
                "U32",
                &[rows, cols / 8],
                le(&packed, u32::to_le_bytes),
            ),
            entry(
                "nb.scales",
                "BF16",
                &[rows, cols / group],
                le(&scales, u16::to_le_bytes),
            ),
            entry(
                "d.weight",
                "BF16",
                &[rows, cols],
                le(&dense, u16::to_le_bytes),
            ),
            entry(
                "raw.weight",
                "U32",
                &[rows, cols / 8],
                le(&packed, u32::to_le_bytes),
            ),
        ],
    );
    let store = WeightStore::open(dir.path()).unwrap();
    let spec = QuantSpec::new(QuantMode::Affine, 4, group).unwrap();

    match store.weight("d", Some(spec), rows, cols).unwrap() {
        Weight::Dense(t) => assert_eq!(t.shape(), [rows, cols]),
        Weight::Quant(_) => panic!("d has no scales, so it is dense"),
    }
    let msg = err_text(store.weight("d", None, cols, rows));
    assert_contains(
        &msg,
        &["model.safetensors", "d.weight", "[2, 64]", "[64, 2]"],
    );

    match store.weight("q", Some(spec), rows, cols).unwrap() {
        Weight::Quant(w) => {
            assert_eq!((w.rows, w.cols, w.spec), (rows, cols, spec));
            assert_eq!(w.packed.raw_bytes().unwrap(), le(&packed, u32::to_le_bytes));
            assert!(w.biases.is_some());
        }
        Weight::Dense(_) => panic!("q has scales, so it is quantized"),
    }
    let msg = err_text(store.weight("q", None, rows, cols));
    assert_contains(&msg, &["q.scales", "quantization"]);
    // 8 bits would unpack the same words to half the columns.
    let spec8 = QuantSpec::new(QuantMode::Affine, 8, group).unwrap();
    let msg = err_text(store.weight("q", Some(spec8), rows, cols));
    assert_contains(&msg, &["model.safetensors", "`q`", "bits"]);
    let msg = err_text(store.weight("nb", Some(spec), rows, cols));
    assert_contains(&msg, &["model.safetensors", "nb.biases", "missing"]);
    let mx = QuantSpec::new(QuantMode::Mxfp4, 4, 32).unwrap();
    let msg = err_text(store.weight("q", Some(mx), rows, cols));
    assert_contains(&msg, &["q.biases", "mxfp4"]);
    let msg = err_text(store.weight("raw", Some(spec), rows, cols));
    assert_contains(&msg, &["raw.weight", "raw.scales", "missing"]);
}

// ---------------------------------------------------------------------------------------------
// config.json

fn write_json(dir: &Path, file: &str, v: &serde_json::Value) {
    std::fs::write(dir.join(file), serde_json::to_string_pretty(v).unwrap()).unwrap();
}

#[test]
fn config_reads_nested_text_config() {
    let dir = tempfile::tempdir().unwrap();
    write_json(
        dir.path(),
        "config.json",
        &json!({
            "model_type": "qwen3_5",
            "eos_token_id": 7,
            "tie_word_embeddings": false,
            "text_config": {
                "model_type": "qwen3_5_text",
                "hidden_size": 64,
                "rms_norm_eps": 1e-6,
                "rope_theta": 10000,
                "eos_token_id": [5, 7],
                "head_dim": "abc",
                "attention_bias": null
            }
        }),
    );
    let cfg = ModelConfig::load(dir.path()).unwrap();
    assert_eq!(cfg.model_type, "qwen3_5");
    assert_eq!(cfg.usize("hidden_size").unwrap(), 64);
    assert_eq!(cfg.f64("rms_norm_eps").unwrap(), 1e-6);
    assert_eq!(cfg.f64("rope_theta").unwrap(), 10000.0);
    assert_eq!(cfg.usize_or("num_experts", 0).unwrap(), 0);
    assert_eq!(cfg.f64_or("partial_rotary_factor", 1.0).unwrap(), 1.0);
    // Root-level fields are visible when the text config lacks them.
    assert!(!cfg.bool_or("tie_word_embeddings", true).unwrap());
    assert!(
        cfg.bool_or("attention_bias", true).unwrap(),
        "null counts as absent"
    );
    assert_eq!(cfg.eos_token_ids(), [5, 7]);
    assert_eq!(cfg.text["model_type"], "qwen3_5_text");
    assert!(cfg.quant.default.is_none());

    let path = dir.path().join("config.json").display().to_string();
    let msg = err_text(cfg.usize("num_hidden_layers"));
    assert_eq!(msg, format!("{path}: field `num_hidden_layers` is missing"));
    let msg = err_text(cfg.usize("head_dim"));
    assert_eq!(
        msg,
        format!("{path}: field `head_dim` must be a non-negative integer, got \"abc\"")
    );
    let msg = err_text(cfg.usize_or("head_dim", 8));
    assert_contains(&msg, &[&path, "head_dim"]);
    let msg = err_text(cfg.f64("head_dim"));
    assert_contains(&msg, &[&path, "head_dim", "a number"]);
}

#[test]
fn config_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let msg = err_text(ModelConfig::load(dir.path()));
    assert_contains(&msg, &["config.json", "cannot read"]);
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": ").unwrap();
    let msg = err_text(ModelConfig::load(dir.path()));
    assert_contains(&msg, &["config.json", "not valid JSON"]);
    write_json(dir.path(), "config.json", &json!({"hidden_size": 4}));
    let msg = err_text(ModelConfig::load(dir.path()));
    assert_contains(&msg, &["config.json", "`model_type` is missing"]);
}

#[test]
fn quantization_block_with_overrides() {
    let dir = tempfile::tempdir().unwrap();
    write_json(
        dir.path(),
        "config.json",
        &json!({
            "model_type": "qwen3",
            "quantization": {
                "group_size": 64,
                "bits": 4,
                "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
                "model.layers.0.self_attn.q_proj": {"bits": 4, "group_size": 16, "mode": "nvfp4"},
                "model.layers.1.mlp.down_proj": {"mode": "mxfp8"},
                "lm_head": false,
                "model.embed_tokens": true
            },
            "quantization_config": {"group_size": 64, "bits": 4}
        }),
    );
    let cfg = ModelConfig::load(dir.path()).unwrap();
    let q = &cfg.quant;
    let affine4 = QuantSpec {
        mode: QuantMode::Affine,
        bits: 4,
        group_size: 64,
    };
    assert_eq!(q.default, Some(affine4));
    assert_eq!(q.spec_for("model.layers.3.mlp.up_proj"), Some(affine4));
    assert_eq!(q.spec_for("model.embed_tokens"), Some(affine4));
    assert_eq!(q.spec_for("lm_head"), None);
    assert!(q.is_excluded("lm_head"));
    assert_eq!(
        q.spec_for("model.layers.0.mlp.gate"),
        Some(QuantSpec {
            mode: QuantMode::Affine,
            bits: 8,
            group_size: 64
        })
    );
    assert_eq!(
        q.spec_for("model.layers.0.self_attn.q_proj"),
        Some(QuantSpec {
            mode: QuantMode::Nvfp4,
            bits: 4,
            group_size: 16
        })
    );
    // A dict naming only the mode takes that mode's sizes, not the top-level ones (as MLX).
    assert_eq!(
        q.spec_for("model.layers.1.mlp.down_proj"),
        Some(QuantSpec {
            mode: QuantMode::Mxfp8,
            bits: 8,
            group_size: 32
        })
    );

    // fp modes at the top level; sizes default per mode.
    write_json(
        dir.path(),
        "config.json",
        &json!({"model_type": "qwen3", "quantization": {"mode": "mxfp4", "group_size": 32, "bits": 4}}),
    );
    let cfg = ModelConfig::load(dir.path()).unwrap();
    assert_eq!(cfg.quant.default.unwrap().mode, QuantMode::Mxfp4);

    // Only `quantization_config` (older conversions), nested in text_config.
    write_json(
        dir.path(),
        "config.json",
        &json!({"model_type": "x", "text_config": {"quantization_config": {"group_size": 32, "bits": 8}}}),
    );
    let cfg = ModelConfig::load(dir.path()).unwrap();
    assert_eq!(
        cfg.quant.default,
        Some(QuantSpec {
            mode: QuantMode::Affine,
            bits: 8,
            group_size: 32
        })
    );
}

#[test]
fn quantization_errors_name_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            json!({"group_size": 64, "bits": 4,
                   "model.layers.0.self_attn.q_proj": {"bits": 4, "group_size": 32, "mode": "nvfp4"}}),
            vec!["quantization.model.layers.0.self_attn.q_proj", "nvfp4"],
        ),
        (
            json!({"group_size": 64, "bits": 7}),
            vec!["field `quantization`", "bits=7"],
        ),
        (
            json!({"group_size": "64", "bits": 4}),
            vec!["quantization.group_size", "\"64\""],
        ),
        (
            json!({"group_size": 64, "bits": 4, "mode": "fp3"}),
            vec!["quantization.mode", "fp3"],
        ),
        (
            json!({"group_size": 64, "bits": 4, "lm_head": 3}),
            vec!["quantization.lm_head"],
        ),
    ];
    for (block, parts) in cases {
        write_json(
            dir.path(),
            "config.json",
            &json!({"model_type": "qwen3", "quantization": block}),
        );
        let msg = err_text(ModelConfig::load(dir.path()));
        assert!(msg.contains("config.json"), "{msg}");
        assert_contains(&msg, &parts);
    }
    write_json(
        dir.path(),
        "config.json",
        &json!({"model_type": "qwen3", "quantization_config": {"quant_method": "awq", "bits": 4}}),
    );
    let msg = err_text(ModelConfig::load(dir.path()));
    assert_contains(
        &msg,
        &["config.json", "quantization_config.quant_method", "awq"],
    );
}

// ---------------------------------------------------------------------------------------------
// generation_config.json

#[test]
fn generation_config_defaults_and_eos_forms() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        GenerationConfig::load(dir.path()).unwrap(),
        GenerationConfig::default()
    );
    write_json(
        dir.path(),
        "generation_config.json",
        &json!({"eos_token_id": 151645, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
                "do_sample": true, "max_new_tokens": 128, "bos_token_id": 1}),
    );
    let g = GenerationConfig::load(dir.path()).unwrap();
    assert_eq!(g.eos_token_ids, [151645]);
    assert_eq!(g.temperature, Some(0.7));
    assert_eq!(g.top_k, Some(20));
    assert_eq!(g.top_p, Some(0.8));
    assert_eq!(g.do_sample, Some(true));
    assert_eq!(g.max_new_tokens, Some(128));

    write_json(
        dir.path(),
        "generation_config.json",
        &json!({"eos_token_id": [151645, 151643], "temperature": null}),
    );
    let g = GenerationConfig::load(dir.path()).unwrap();
    assert_eq!(g.eos_token_ids, [151645, 151643]);
    assert_eq!(g.temperature, None);

    for (bad, field) in [
        (json!({"eos_token_id": "</s>"}), "eos_token_id"),
        (json!({"eos_token_id": [1, -2]}), "eos_token_id"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"top_k": 1.5}), "top_k"),
        (json!({"do_sample": 1}), "do_sample"),
    ] {
        write_json(dir.path(), "generation_config.json", &bad);
        let msg = err_text(GenerationConfig::load(dir.path()));
        assert_contains(&msg, &["generation_config.json", &format!("`{field}`")]);
    }
    std::fs::write(dir.path().join("generation_config.json"), "{").unwrap();
    let msg = err_text(GenerationConfig::load(dir.path()));
    assert_contains(&msg, &["generation_config.json", "JSON"]);
}

// ---------------------------------------------------------------------------------------------
// tokenizer

/// GPT-2's byte → printable character table, written from its definition: printable Latin-1
/// bytes map to themselves, the rest to U+0100 onwards in byte order.
fn byte_chars() -> Vec<char> {
    let keep = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut next = 0x100;
    (0u32..256)
        .map(|b| {
            if keep(b) {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            }
        })
        .collect()
}

const MERGES: [(&str, &str); 5] = [
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("Ġ", "w"),
];
const IM_START: u32 = 261;
const IM_END: u32 = 262;

/// A byte-level BPE tokenizer: ids 0..256 are the byte characters, then one id per merge.
fn write_tokenizer(dir: &Path) {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    for (i, (a, b)) in MERGES.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(256 + i));
    }
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let added = |id: u32, s: &str| {
        json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(IM_START, "<|im_start|>"), added(IM_END, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    });
    write_json(dir, "tokenizer.json", &tok);
}

const CHATML: &str = "{% for message in messages %}\
{% if message.content.startswith('!') %}{{ raise_exception('no commands: ' ~ message.content) }}{% endif %}\
<|im_start|>{{ message.role }}\n{{ message.content.strip() }}<|im_end|>\n\
{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[test]
fn tokenizer_round_trips_bytes_and_specials() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    write_json(
        dir.path(),
        "tokenizer_config.json",
        &json!({"eos_token": {"content": "<|im_end|>", "special": true}, "bos_token": null,
                "chat_template": CHATML}),
    );
    let tok = Tokenizer::load(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 263);
    assert_eq!(tok.token_id("<|im_end|>"), Some(IM_END));
    assert_eq!(tok.eos_token_ids(), [IM_END]);

    // "hello" merges fully; " world" is Ġw + single bytes (no other merges apply).
    let b = |c: char| c as u32; // printable ASCII ids are their byte values
    let ids = tok.encode("hello world", false).unwrap();
    assert_eq!(ids, [259, 260, b('o'), b('r'), b('l'), b('d')]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello world");

    // Arbitrary UTF-8 survives through byte tokens.
    let text = "héllo ✓\n\ttabs";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let e_acute: Vec<u32> = "é".bytes().map(u32::from).collect(); // ≥ 0xA1: identity bytes
    assert!(ids.windows(2).any(|w| w == e_acute.as_slice()));

    let ids = tok.encode("<|im_start|>hello<|im_end|>", false).unwrap();
    assert_eq!(ids, [IM_START, 259, IM_END]);
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello");
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>hello<|im_end|>"
    );

    // Ids past the tokenizer's vocabulary (padding rows of the embedding) decode to nothing.
    assert_eq!(tok.decode(&[259, 5000, 260], false).unwrap(), "hello w");
}

#[test]
fn chat_template_renders_like_transformers() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    write_json(
        dir.path(),
        "tokenizer_config.json",
        &json!({"eos_token": "<|im_end|>", "chat_template": CHATML}),
    );
    let tok = Tokenizer::load(dir.path()).unwrap();
    let msgs = [
        ChatMessage::new("system", "  Be brief.\n"),
        ChatMessage::new("user", "hello"),
    ];
    let text = tok.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    );
    let text = tok.apply_chat_template(&msgs[1..], false).unwrap();
    assert_eq!(text, "<|im_start|>user\nhello<|im_end|>\n");
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(ids.first(), Some(&IM_START));
    assert_eq!(ids[ids.len() - 2], IM_END);

    let msg = err_text(tok.apply_chat_template(&[ChatMessage::new("user", "!rm")], true));
    assert_contains(
        &msg,
        &["tokenizer_config.json", "chat_template", "no commands: !rm"],
    );
}

/// `enable_thinking` as transformers passes it: undefined unless given, so a Qwen3-style
/// template opens the answer with an empty think block only for `off`.
#[test]
fn chat_template_sees_enable_thinking_only_when_given() {
    const THINKING: &str = "{%- for m in messages %}\
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\
{%- if enable_thinking is defined and enable_thinking is false %}\
{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    write_json(
        dir.path(),
        "tokenizer_config.json",
        &json!({"eos_token": "<|im_end|>", "chat_template": THINKING}),
    );
    let tok = Tokenizer::load(dir.path()).unwrap();
    let msgs = [ChatMessage::new("user", "hi")];
    let plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(tok.apply_chat_template(&msgs, true).unwrap(), plain);
    let on = tok.apply_chat_template_thinking(&msgs, true, Some(true));
    assert_eq!(on.unwrap(), plain);
    let off = tok.apply_chat_template_thinking(&msgs, true, Some(false));
    assert_eq!(off.unwrap(), format!("{plain}<think>\n\n</think>\n\n"));
}

#[test]
fn chat_template_jinja2_whitespace_and_sources() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    // Block tags on their own lines vanish with their newline (trim_blocks + lstrip_blocks),
    // `break` works (loopcontrols), Python methods on strings and dicts work (pycompat).
    let template = "{% for m in messages %}\n    {% if loop.index > 2 %}\n        {% break %}\n    {% endif %}\n{{ m.role.upper() }}: {{ m.content.split(':')[-1].lstrip() }}|{{ m.get('role') }}\n{% endfor %}\n{{ bos_token }}{{ eos_token }}{% if tools is none %}!{% endif %}";
    write_json(
        dir.path(),
        "tokenizer_config.json",
        &json!({"bos_token": "<s>", "eos_token": "</s>",
                "chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": template}]}),
    );
    let tok = Tokenizer::load(dir.path()).unwrap();
    let msgs = [
        ChatMessage::new("user", "a: b"),
        ChatMessage::new("assistant", "c"),
        ChatMessage::new("user", "never shown"),
    ];
    assert_eq!(
        tok.apply_chat_template(&msgs, false).unwrap(),
        "USER: b|user\nASSISTANT: c|assistant\n<s></s>!"
    );

    // chat_template.jinja takes precedence over tokenizer_config.json.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages | length }}",
    )
    .unwrap();
    let tok = Tokenizer::load(dir.path()).unwrap();
    assert_eq!(tok.apply_chat_template(&msgs, false).unwrap(), "3");

    // A template that does not parse is reported at load time with its file.
    std::fs::write(dir.path().join("chat_template.jinja"), "{% for %}").unwrap();
    let msg = err_text(Tokenizer::load(dir.path()));
    assert_contains(&msg, &["chat_template.jinja", "does not parse"]);

    // No template at all: rendering says so and names the folder.
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let tok = Tokenizer::load(dir.path()).unwrap();
    assert!(!tok.has_chat_template());
    let msg = err_text(tok.apply_chat_template(&msgs, true));
    assert_contains(
        &msg,
        &[&dir.path().display().to_string(), "no chat template"],
    );
}

#[test]
fn tokenizer_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let msg = err_text(Tokenizer::load(dir.path()));
    assert_contains(&msg, &["tokenizer.json", "missing"]);
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let msg = err_text(Tokenizer::load(dir.path()));
    assert_contains(&msg, &["tokenizer.json", "cannot load"]);
    write_tokenizer(dir.path());
    write_json(
        dir.path(),
        "tokenizer_config.json",
        &json!({"chat_template": 5}),
    );
    let msg = err_text(Tokenizer::load(dir.path()));
    assert_contains(&msg, &["tokenizer_config.json", "`chat_template`"]);
}

/// Qwen3's chat template (as shipped in its tokenizer_config.json): namespaces, reversed
/// slices, `is string`, `in`, and chained Python string methods.
const QWEN3_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

#[test]
fn qwen3_chat_template_renders() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    write_json(
        dir.path(),
        "tokenizer_config.json",
        &json!({"eos_token": "<|im_end|>", "chat_template": QWEN3_TEMPLATE}),
    );
    let tok = Tokenizer::load(dir.path()).unwrap();
    let turn = [
        ChatMessage::new("system", "S"),
        ChatMessage::new("user", "q1"),
        ChatMessage::new("assistant", "<think>\nmull\n</think>\n\nA1"),
        ChatMessage::new("user", "q2"),
    ];
    // Reasoning of turns before the last query is dropped.
    assert_eq!(
        tok.apply_chat_template(&turn, true).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n\
         <|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // An assistant turn after the last query keeps its reasoning, re-wrapped.
    assert_eq!(
        tok.apply_chat_template(&turn[1..3], false).unwrap(),
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nmull\n</think>\n\nA1<|im_end|>\n"
    );
}

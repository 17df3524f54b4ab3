//! Mutation fuzzing of the loaders with proptest, run by `cargo test`: safetensors headers,
//! config.json values, tokenizer.json trees and chat templates, each mutated at random from a
//! valid start. Every input must give `Ok` or an `Err` — never a panic, and never a hang or a
//! runaway allocation (the run would time out or abort). Longer runs: `PROPTEST_CASES=N`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use engine::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use engine::weights::safetensors::SafetensorsFile;
use kernels::Bytes;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

/// `default` cases, or `PROPTEST_CASES` when set (`with_cases` alone would override it).
fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig::with_cases(n)
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlx-written/qwen3-bf16")
}

/// Values that have broken parsers before: extremes, wrong types, empty containers.
fn weird_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(null)),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1u64 << 40)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(1e-320)),
        Just(json!(0.5)),
        Just(json!(-0.0)),
        Just(json!("")),
        Just(json!("x")),
        Just(json!([])),
        Just(json!({})),
        Just(json!(true)),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |x| x.is_finite())
            .prop_map(Value::from),
        "[a-z_]{0,12}".prop_map(Value::from),
        prop::collection::vec(any::<u32>(), 0..4).prop_map(Value::from),
    ]
}

/// Every node of a JSON tree as a path of keys and indices (the root is the empty path).
fn paths(v: &Value, at: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                at.push(Value::from(k.as_str()));
                paths(c, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate().take(64) {
                at.push(Value::from(i));
                paths(c, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k {
        Value::String(s) => &mut v[s.as_str()],
        k => &mut v[k.as_u64().unwrap() as usize],
    })
}

/// `v` with the nodes picked by `picks` replaced by the given values.
fn mutate(v: &Value, picks: &[(Index, Value)]) -> Value {
    let mut v = v.clone();
    for (idx, new) in picks {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let path = idx.get(&all).clone();
        *node_mut(&mut v, &path) = new.clone();
    }
    v
}

// ---------------------------------------------------------------------------------------------
// safetensors headers

fn dtype_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("F32".to_string()),
        Just("BF16".to_string()),
        Just("U8".to_string()),
        Just("U32".to_string()),
        Just("F4".to_string()),
        Just("BOOL".to_string()),
        "[A-Z0-9_]{0,6}",
    ]
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..64, Just(u64::MAX), Just(1 << 62), any::<u64>()]
}

/// A header of a few random entries over a random data section.
fn random_file() -> impl Strategy<Value = Vec<u8>> {
    let entry = (
        "[a-z.]{1,8}",
        dtype_name(),
        prop::collection::vec(prop_oneof![0u64..6, Just(u64::MAX), Just(1 << 40)], 0..4),
        offset(),
        offset(),
    );
    (
        prop::collection::vec(entry, 0..5),
        prop::collection::vec(any::<u8>(), 0..96),
        any::<bool>(),
    )
        .prop_map(|(entries, data, meta)| {
            let mut h = serde_json::Map::new();
            if meta {
                h.insert("__metadata__".into(), json!({"format": "pt"}));
            }
            for (name, dtype, shape, a, b) in entries {
                h.insert(
                    name,
                    json!({"dtype": dtype, "shape": shape, "data_offsets": [a, b]}),
                );
            }
            let text = serde_json::to_vec(&Value::Object(h)).unwrap();
            let mut out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend(text);
            out.extend(data);
            out
        })
}

fn valid_file() -> Vec<u8> {
    let header = br#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"c":{"dtype":"U8","shape":[2],"data_offsets":[22,24]}}"#;
    let mut h = header.to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend((0..24u8).collect::<Vec<_>>());
    out
}

/// Parsing must not panic; what parses must view and widen without panicking.
fn check_safetensors(bytes: Vec<u8>) {
    let path = Path::new("fuzz.safetensors");
    if let Ok(f) = SafetensorsFile::parse(path, Bytes::from_vec(bytes)) {
        for name in f.tensors.keys() {
            if let Ok(Some(t)) = f.tensor(name) {
                if t.dtype().is_float() {
                    let _ = t.to_vec_f32();
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn safetensors_random_headers_never_panic(bytes in random_file()) {
        check_safetensors(bytes);
    }

    #[test]
    fn safetensors_byte_flips_never_panic(
        flips in prop::collection::vec((any::<Index>(), any::<u8>()), 1..6),
        cut in any::<Index>(),
        cut_it in any::<bool>(),
    ) {
        let mut b = valid_file();
        for (i, v) in flips {
            let at = i.index(b.len());
            b[at] = v;
        }
        if cut_it {
            b.truncate(cut.index(b.len() + 1));
        }
        check_safetensors(b);
    }
}

// ---------------------------------------------------------------------------------------------
// config.json

/// A private copy of the fixture whose config.json each case rewrites.
fn model_dir() -> &'static (tempfile::TempDir, Value) {
    static DIR: OnceLock<(tempfile::TempDir, Value)> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(fixture()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
        }
        let cfg =
            serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
                .unwrap();
        (tmp, cfg)
    })
}

/// The keys the families read, so mutations hit them more often than chance would.
const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "model_type",
    "quantization",
    "text_config",
    "eos_token_id",
];

proptest! {
    #![proptest_config(cases(96))]

    /// Loads run one after another (they share the folder), each followed by a one-token
    /// forward when the load succeeds.
    #[test]
    fn config_mutations_never_panic(
        named in prop::collection::vec((prop::sample::select(CONFIG_KEYS), weird_value()), 0..3),
        anywhere in prop::collection::vec((any::<Index>(), weird_value()), 0..2),
    ) {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (dir, base) = model_dir();
        let mut cfg = mutate(base, &anywhere);
        if let Some(obj) = cfg.as_object_mut() {
            for (k, v) in named {
                obj.insert(k.to_string(), v);
            }
        }
        std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
        if let Ok(m) = engine::models::load(dir.path()) {
            let mut state = m.new_state();
            let _ = m.forward(&[1], &mut state, false);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json and chat templates

fn tokenizer_json() -> &'static Value {
    static TOK: OnceLock<Value> = OnceLock::new();
    TOK.get_or_init(|| {
        serde_json::from_str(&std::fs::read_to_string(fixture().join("tokenizer.json")).unwrap())
            .unwrap()
    })
}

/// Pieces of Jinja, some well-formed and some not, that combine into templates.
fn template_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{{ messages[0].content }}".to_string()),
        Just("{% for m in messages %}".to_string()),
        Just("{% endfor %}".to_string()),
        Just("{% for i in range(100000) %}".to_string()),
        Just("{% if add_generation_prompt %}".to_string()),
        Just("{% endif %}".to_string()),
        Just("{{ 'ab' * 40000000 }}".to_string()),
        Just("{% set ns = namespace(s='x') %}".to_string()),
        Just("{% set ns.s = ns.s ~ ns.s %}".to_string()),
        Just("{{ ns.s }}".to_string()),
        Just("{{ raise_exception('no') }}".to_string()),
        Just("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".to_string()),
        Just("{{ messages[99].content.upper() }}".to_string()),
        Just("{{ bos_token ~ eos_token }}".to_string()),
        Just("{{ strftime_now('%Y-%m-%d %-d %B') }}".to_string()),
        Just("{{ messages | tojson }}".to_string()),
        Just("{%".to_string()),
        Just("}}".to_string()),
        "[ -~]{0,12}",
    ]
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn chat_templates_never_panic_and_stay_bounded(
        pieces in prop::collection::vec(template_piece(), 0..8),
        content in "[ -~]{0,40}",
    ) {
        let source = pieces.concat();
        if let Ok(t) = ChatTemplate::new(source, "fuzz".into()) {
            let msgs = [ChatMessage::new("user", content)];
            if let Ok(out) = t.render(&msgs, true, (Some("<s>"), Some("</s>")), None) {
                prop_assert!(out.len() <= (1 << 20) + 2 * 80);
            }
        }
    }

    #[test]
    fn tokenizer_mutations_never_panic(
        picks in prop::collection::vec((any::<Index>(), weird_value()), 1..3),
        ids in prop::collection::vec(any::<u32>(), 0..6),
    ) {
        let tok = mutate(tokenizer_json(), &picks);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
        if let Ok(t) = Tokenizer::load(dir.path()) {
            let _ = t.encode("Hello, world! 123 éè", true);
            let _ = t.decode(&ids, false);
        }
    }
}

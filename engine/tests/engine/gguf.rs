//! The GGUF reader and dequantizer against the `gguf` package: a committed file with one
//! tensor per weight type and the package's own dequantization of each
//! (fixtures/gguf/make_fixture.py), then the malformed files a reader must refuse.

use std::path::PathBuf;

use engine::gguf::{GgmlType, GgufFile, Value};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

#[test]
fn every_type_dequantizes_as_the_gguf_package_does() {
    let f = GgufFile::open(&fixture().join("blocks.gguf")).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(
        f.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    assert_eq!(f.get("test.count").and_then(Value::as_u64), Some(7));
    let tokens = match f.get("test.tokens") {
        Some(Value::Array(v)) => v.iter().map(|t| t.as_str().unwrap()).collect::<Vec<_>>(),
        other => panic!("test.tokens: {other:?}"),
    };
    assert_eq!(tokens, ["a", "bc", "<s>"]);

    let bytes = std::fs::read(fixture().join("blocks.expected.f32")).unwrap();
    let expected: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let types = [
        ("f32", GgmlType::F32),
        ("f16", GgmlType::F16),
        ("bf16", GgmlType::Bf16),
        ("q4_0", GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1),
        ("q8_0", GgmlType::Q8_0),
        ("q4_k", GgmlType::Q4K),
        ("q5_k", GgmlType::Q5K),
        ("q6_k", GgmlType::Q6K),
        ("q5_0", GgmlType::Q5_0),
        ("q5_1", GgmlType::Q5_1),
    ];
    assert_eq!(expected.len(), types.len() * 3 * 256);
    for (i, (name, ty)) in types.into_iter().enumerate() {
        let t = f.tensor(name).unwrap();
        assert_eq!(
            (t.ggml_type, t.shape.as_slice()),
            (ty, &[3, 256][..]),
            "{name}"
        );
        let got = f.dequantize(t).unwrap();
        let want = &expected[i * 768..(i + 1) * 768];
        let differ = got
            .iter()
            .zip(want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(differ, None, "{name}: first differing value");
    }
}

/// A change to the fixture's bytes.
type Edit = Box<dyn FnOnce(&mut Vec<u8>)>;

/// The fixture with `edit` applied, written to a temporary file and opened.
fn open_edited(edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut bytes = std::fs::read(fixture().join("blocks.gguf")).unwrap();
    edit(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edited.gguf");
    std::fs::write(&path, bytes).unwrap();
    match GgufFile::open(&path) {
        Ok(_) => "opened".into(),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn malformed_files_are_refused_with_the_reason() {
    let cases: [(&str, Edit, &[&str]); 6] = [
        ("magic", Box::new(|b| b[0] = b'X'), &["edited.gguf", "GGUF"]),
        (
            "version",
            Box::new(|b| b[4..8].copy_from_slice(&9u32.to_le_bytes())),
            &["version 9"],
        ),
        (
            "tensor count",
            Box::new(|b| b[8..16].copy_from_slice(&u64::MAX.to_le_bytes())),
            &["tensors"],
        ),
        (
            "metadata count",
            Box::new(|b| b[16..24].copy_from_slice(&(1u64 << 19).to_le_bytes())),
            &["metadata key 5", "more bytes than the file has"],
        ),
        (
            "truncated data",
            Box::new(|b| b.truncate(b.len() - 100)),
            &["`q5_1`", "truncated"],
        ),
        (
            "truncated header",
            Box::new(|b| b.truncate(28)),
            &["the file ends inside metadata key 0"],
        ),
    ];
    for (what, edit, expect) in cases {
        let err = open_edited(edit);
        for e in expect {
            assert!(err.contains(e), "{what}: {err:?} should mention {e:?}");
        }
    }
}

fn logits(dir: &std::path::Path) -> Vec<f32> {
    let m = engine::models::load(dir).unwrap();
    let mut state = m.new_state();
    let ids: Vec<u32> = (0..20).map(|i| (i * 13 + 3) % 64).collect();
    m.forward(&ids, &mut state, true)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

/// Tiny random models written both as a folder and as llama.cpp would convert them
/// (fixtures/gguf/make_models.py): imported, the GGUF gives the folder's model bit for bit
/// (f32 throughout), so names, metadata, Llama's q/k permutation and Gemma's norm shift are
/// all undone.
#[test]
fn imported_gguf_files_are_the_models_they_came_from() {
    use engine::gguf::import::{import, OutDtype};
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let src = fixture().join("models").join(arch);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("imported");
        let g = GgufFile::open(&src.join("model.gguf")).unwrap();
        import(&g, &out, OutDtype::F32, None).unwrap();
        assert_eq!(logits(&out), logits(&src), "{arch}");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        for key in [
            "model_type",
            "num_key_value_heads",
            "tie_word_embeddings",
            "vocab_size",
        ] {
            assert_eq!(cfg[key], want[key], "{arch}: {key}");
        }
        // The folder exists now: a second import is refused and changes nothing.
        let err = format!("{:#}", import(&g, &out, OutDtype::F32, None).unwrap_err());
        assert!(err.contains("already exists"), "{err}");
    }
}

#[test]
fn a_failed_import_leaves_nothing_behind() {
    use engine::gguf::import::{import, OutDtype};
    // The block fixture says `llama` but has no `llama.*` metadata and no embedding.
    let g = GgufFile::open(&fixture().join("blocks.gguf")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("imported");
    let err = format!("{:#}", import(&g, &out, OutDtype::Bf16, None).unwrap_err());
    assert!(
        err.contains("blocks.gguf") && err.contains("token_embd.weight"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

/// The Qwen2 fixture carries its byte-level BPE vocabulary as llama.cpp stores it: the
/// rebuilt tokenizer.json must tokenize like the one it came from.
#[test]
fn a_rebuilt_bpe_tokenizer_tokenizes_like_the_original() {
    use engine::gguf::import::{import, OutDtype, TokenizerSource};
    use engine::tokenizer::Tokenizer;
    let src = fixture().join("models").join("qwen2");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("imported");
    let g = GgufFile::open(&src.join("model.gguf")).unwrap();
    let source = import(&g, &out, OutDtype::Bf16, None).unwrap();
    assert!(matches!(source, TokenizerSource::Rebuilt), "{source:?}");
    let (rebuilt, original) = (
        Tokenizer::load(&out).unwrap(),
        Tokenizer::load(&src).unwrap(),
    );
    let mut texts: Vec<String> = synth::tokenizer::CORPUS
        .lines()
        .map(str::to_string)
        .collect();
    texts.extend([
        "  two spaces, 12345 digits and\ttabs\n\nnew lines".to_string(),
        "<|im_start|>user\nhé, 你好 👋<|im_end|>".to_string(),
    ]);
    for text in &texts {
        let ids = original.encode(text, false).unwrap();
        assert_eq!(rebuilt.encode(text, false).unwrap(), ids, "{text:?}");
        assert_eq!(
            rebuilt.decode(&ids, false).unwrap(),
            original.decode(&ids, false).unwrap()
        );
    }
    // A vocabulary it does not rebuild is said, not guessed.
    let other = tmp.path().join("other");
    let g = GgufFile::open(&fixture().join("models/qwen3/model.gguf")).unwrap();
    let source = import(&g, &other, OutDtype::Bf16, None).unwrap();
    assert!(
        matches!(&source, TokenizerSource::Missing(why) if why.contains("tokenizer.ggml.model")),
        "{source:?}"
    );
}

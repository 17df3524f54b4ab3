//! `harness quantize` against mlx-lm's own quantizer: the committed folders that mlx-lm wrote
//! from one set of weights (engine/tests/fixtures/mlx-written, by `quantize_model`), bf16 in,
//! 4-bit groups of 64 out, must come out of our command tensor for tensor, byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use harness::quantize_cli::quantize_folder;
use kernels::{QuantMode, QuantSpec};

fn fixture(name: &str) -> PathBuf {
    synth::workspace_root()
        .join("engine/tests/fixtures/mlx-written")
        .join(name)
}

/// Every tensor of a folder's model.safetensors: name → (dtype, shape, bytes).
fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            let info = (
                format!("{:?}", v.dtype()),
                v.shape().to_vec(),
                v.data().to_vec(),
            );
            (n, info)
        })
        .collect()
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn quantize_gives_mlx_lms_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("q4");
    let spec = QuantSpec::new(QuantMode::Affine, 4, 64).unwrap();
    let n = quantize_folder(&fixture("qwen3-bf16"), &out, spec, false).unwrap();
    let (ours, theirs) = (tensors(&out), tensors(&fixture("qwen3-q4")));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "tensor names"
    );
    for (name, want) in &theirs {
        let got = &ours[name];
        assert_eq!((&got.0, &got.1), (&want.0, &want.1), "{name}: dtype, shape");
        assert!(got.2 == want.2, "{name}: bytes differ from mlx-lm's");
    }
    assert_eq!(n, theirs.keys().filter(|k| k.ends_with(".scales")).count());
    for key in ["quantization", "quantization_config"] {
        assert_eq!(
            config(&out)[key],
            config(&fixture("qwen3-q4"))[key],
            "config.json {key}"
        );
    }
    // The tokenizer files come along unchanged.
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(out.join(f)).unwrap(),
            std::fs::read(fixture("qwen3-bf16").join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn quantize_refuses_what_it_cannot_do_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = QuantSpec::new(QuantMode::Affine, 4, 64).unwrap();
    let err = |input: &Path, out: &Path| {
        let e = quantize_folder(input, out, spec, false).unwrap_err();
        assert!(!out.exists(), "{} was left behind", out.display());
        format!("{e:#}")
    };
    // An already quantized folder.
    let out = tmp.path().join("again");
    let e = err(&fixture("qwen3-q4"), &out);
    assert!(e.contains("`quantization` is already set"), "{e}");
    // A folder without weights.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("config.json"), "{\"model_type\": \"qwen3\"}").unwrap();
    let e = err(&empty, &tmp.path().join("out"));
    assert!(e.contains("quantizing"), "{e}");
    // An existing output folder is never written into.
    let e = quantize_folder(&fixture("qwen3-bf16"), &empty, spec, false).unwrap_err();
    assert!(format!("{e:#}").contains("already exists"), "{e:#}");
    // Bits the format does not have.
    assert!(QuantSpec::new(QuantMode::Affine, 7, 64).is_err());
}

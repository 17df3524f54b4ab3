//! Bad input through the `engine` CLI: every case exits non-zero with a message that names the
//! file and the field or tensor, and never panics.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlx-written/qwen3-bf16")
}

/// A private copy of the fixture folder that a test may break.
fn copy_fixture(tmp: &Path) -> PathBuf {
    let dir = tmp.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

fn engine(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "engine panicked: {stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

fn expect_error(args: &[&str], needles: &[&str]) {
    let (ok, stdout, stderr) = engine(args);
    assert!(!ok, "expected failure for {args:?}, got stdout {stdout}");
    for n in needles {
        assert!(
            stderr.contains(n),
            "stderr for {args:?} lacks {n:?}:\n{stderr}"
        );
    }
}

#[test]
fn good_fixture_generates_json() {
    let dir = fixture();
    let (ok, stdout, stderr) = engine(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "4",
        "--top-logprobs",
        "3",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for key in [
        "prompt_ids",
        "tokens",
        "text",
        "finish_reason",
        "ttft_ms",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "top_logprobs",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {stdout}");
    }
    let steps = v["top_logprobs"].as_array().unwrap();
    assert_eq!(steps.len(), v["tokens"].as_array().unwrap().len());
    // Best first, and each pair is [id, logprob <= 0].
    let first = steps[0].as_array().unwrap();
    assert_eq!(first.len(), 3);
    assert!(first[0][1].as_f64().unwrap() >= first[1][1].as_f64().unwrap());
    assert!(first[0][1].as_f64().unwrap() <= 0.0);
}

/// `engine info` names the numerics a run without `--numerics` gets, and `engine generate`
/// then runs exactly those: bf16 weights get `fast` on the CPU, quantized ones `exact`.
#[test]
fn info_names_the_numerics_generate_runs_by_default() {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlx-written");
    for (name, expected) in [("qwen3-bf16", "fast"), ("qwen3-q4", "exact")] {
        let dir = base.join(name);
        let d = dir.to_str().unwrap();
        let (ok, stdout, stderr) = engine(&["info", "--model", d, "--json"]);
        assert!(ok, "{stderr}");
        let info: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(
            info["default_numerics"]["cpu"], expected,
            "{name}: {stdout}"
        );
        let (ok, text, stderr) = engine(&["info", "--model", d]);
        assert!(ok, "{stderr}");
        assert!(
            text.contains(&format!("{expected} on cpu")),
            "{name}: {text}"
        );
        let args = [
            "generate",
            "--model",
            d,
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
        ];
        let (ok, stdout, stderr) = engine(&[&args[..], &["--json"]].concat());
        assert!(ok, "{stderr}");
        let run: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(run["numerics"], expected, "{name}: {stdout}");
    }
}

#[test]
fn missing_and_malformed_config() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture(tmp.path());
    let d = dir.to_str().unwrap();
    std::fs::remove_file(dir.join("config.json")).unwrap();
    expect_error(&["info", "--model", d], &["config.json"]);
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    expect_error(&["info", "--model", d], &["config.json"]);
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "qwen3", "hidden_size": "wide"}"#,
    )
    .unwrap();
    expect_error(&["info", "--model", d], &["config.json", "hidden_size"]);
}

#[test]
fn unknown_model_type() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture(tmp.path());
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"qwen3\"", "\"mystery\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    expect_error(
        &["info", "--model", dir.to_str().unwrap()],
        &["config.json", "model_type", "mystery"],
    );
}

#[test]
fn truncated_and_corrupt_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture(tmp.path());
    let d = dir.to_str().unwrap();
    let st = dir.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    // Truncated data: offsets now run past the end.
    std::fs::write(&st, &bytes[..bytes.len() - 100]).unwrap();
    expect_error(&["info", "--model", d], &["model.safetensors"]);
    // A header length larger than the file.
    let mut bad = bytes.clone();
    bad[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&st, &bad).unwrap();
    expect_error(&["info", "--model", d], &["model.safetensors", "header"]);
}

#[test]
fn missing_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture(tmp.path());
    // Point the config at a layer the weights do not have.
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    expect_error(
        &["info", "--model", dir.to_str().unwrap()],
        &["model.layers.2"],
    );
}

#[test]
fn bad_prompts() {
    let dir = fixture();
    let d = dir.to_str().unwrap();
    expect_error(
        &["generate", "--model", d, "--prompt-ids", "1,99999"],
        &["99999", "vocab"],
    );
    let long: Vec<String> = (0..4096).map(|i| (i % 500).to_string()).collect();
    expect_error(
        &["generate", "--model", d, "--prompt-ids", &long.join(",")],
        &["4096", "context"],
    );
    expect_error(
        &[
            "generate",
            "--model",
            d,
            "--prompt-ids",
            "1",
            "--top-p",
            "0",
        ],
        &["top-p"],
    );
    // Ids bypass the tokenizer, so they cannot be wrapped in a chat template.
    expect_error(
        &["generate", "--model", d, "--prompt-ids", "1,2", "--chat"],
        &["--chat", "--prompt-ids"],
    );
}

/// `--backend cuda` where it cannot run exits non-zero with a message that says why: a build
/// without the feature names the rebuild command; a build with it on a machine without a usable
/// GPU (here, CI) names what is missing (the driver, a device, NVRTC or cuBLAS). Never a panic.
#[test]
fn backend_cuda_without_a_gpu_is_a_clear_error() {
    let dir = fixture();
    let args = [
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--backend",
        "cuda",
    ];
    #[cfg(feature = "cuda")]
    {
        match kernels::cuda::probe() {
            Ok(gpu) => eprintln!("a usable GPU is here ({gpu}): nothing to check"),
            Err(why) => expect_error(&args, &["backend cuda", &why]),
        }
    }
    #[cfg(not(feature = "cuda"))]
    expect_error(&args, &["backend cuda", "--features cuda"]);
}

//! `engine generate` prints the same tokens, text and logprobs with one and two threads, for
//! checkpoints in every weight format (written by mlx-lm, so the loader is exercised on folders
//! it did not write).

use std::path::PathBuf;
use std::process::Command;

fn run(dir: &str, threads: &str) -> serde_json::Value {
    run_with(dir, threads, &[])
}

/// `engine generate --json` on the fixture prompt with `extra` flags, timings removed.
fn run_with(dir: &str, threads: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("RAYON_NUM_THREADS", threads)
        .args([
            "generate",
            "--model",
            dir,
            "--prompt",
            "Once upon a time, far away",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--json",
            "--top-logprobs",
            "4",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for timing in ["ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"] {
        v.as_object_mut().unwrap().remove(timing);
    }
    v
}

#[test]
fn cli_output_identical_for_one_and_two_threads_in_every_format() {
    for fmt in ["f32", "bf16", "q4", "q8", "mxfp4", "nvfp4", "mxfp8"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/mlx-written/qwen3-{fmt}"));
        let d = dir.to_str().unwrap();
        let one = run(d, "1");
        assert_eq!(one["tokens"].as_array().unwrap().len(), 12, "{fmt}");
        assert_eq!(one, run(d, "2"), "{fmt}: 1 vs 2 threads");
    }
}

/// `--isa` caps the kernels for the run as a value carried with the request: the AVX2 path
/// gives the native path's output (as the goldens hold for `ENGINE_CPU_ISA=avx2`; on aarch64
/// the name is refused like any unknown one), and a level that does not exist is refused.
#[test]
fn cli_isa_cap_gives_the_same_output_and_refuses_unknown_levels() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlx-written/qwen3-q4");
    let d = dir.to_str().unwrap();
    let native = run(d, "2");
    // `generate --isa LEVEL`: the flag belongs to the subcommand.
    let capped = |level: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_engine"))
            .args(["generate", "--isa", level, "--model", d, "--prompt"])
            .args([
                "Once upon a time, far away",
                "--max-tokens",
                "12",
                "--ignore-eos",
            ])
            .args(["--json", "--top-logprobs", "4"])
            .output()
            .unwrap();
        (out.status.success(), out)
    };
    let (ok, out) = capped("sse9");
    assert!(!ok);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sse9") && err.contains("portable"), "{err}");
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let (ok, out) = capped("avx2");
    assert!(ok, "{}", String::from_utf8_lossy(&out.stderr));
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for timing in ["ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"] {
        v.as_object_mut().unwrap().remove(timing);
    }
    assert_eq!(v, native, "--isa avx2 vs native");
}

/// With no `--numerics`, bf16 weights run `fast` on the CPU and f32 or quantized ones `exact`:
/// the default's output is that of the named mode, and the JSON says which ran.
#[test]
fn default_numerics_follow_the_weight_format() {
    let generate = |fmt: &str, numerics: Option<&str>| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/mlx-written/qwen3-{fmt}"));
        let flag = numerics.map(|n| ["--numerics", n]);
        run_with(
            dir.to_str().unwrap(),
            "2",
            flag.as_ref().map_or(&[], |f| &f[..]),
        )
    };
    for (fmt, want) in [
        ("bf16", "fast"),
        ("f32", "exact"),
        ("q4", "exact"),
        ("q8", "exact"),
    ] {
        let default = generate(fmt, None);
        assert_eq!(default["numerics"], want, "{fmt}");
        assert_eq!(
            default,
            generate(fmt, Some(want)),
            "{fmt}: default vs --numerics {want}"
        );
    }
    // The two modes do differ on bf16 weights (the comparison above can fail).
    let exact = generate("bf16", Some("exact"));
    let fast = generate("bf16", Some("fast"));
    assert_ne!(exact["top_logprobs"], fast["top_logprobs"]);
}

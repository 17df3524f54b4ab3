//! The CPU goldens hold (and, built with `--features mlx`, the MLX ones), and the check can fail: a tampered copy is caught at the tampered
//! token, a changed checkpoint hash is reported as staleness, a missing file as missing.

use std::path::Path;

use harness::golden::{bless, check, Backend, BlessChange, Golden, Options, Verdict};

#[test]
fn cpu_goldens_match() {
    goldens_match(Backend::Cpu);
}

/// MLX on its CPU device: `goldens/mlx-cpu`, blessed on Linux x86-64. Goldens are exact, so
/// they belong to one device and platform: on a Mac MLX runs on the GPU (and its CPU path uses
/// another BLAS), which parity and the oracle cover instead.
#[cfg(all(feature = "mlx", not(target_os = "macos")))]
mod on_mlx {
    #[test]
    fn goldens_match() {
        super::goldens_match(super::Backend::Mlx);
    }
}

/// CUDA: `goldens/cuda-<gpu model>` (e.g. `cuda-h200`), blessed on that GPU model by
/// `ci/gpu-check.sh` (`GPU_CHECK_BLESS=1`). Without a usable GPU the test says why and passes,
/// unless `CUDA_CONFORMANCE_REQUIRED=1` (the GPU job) makes that a failure. On a GPU, goldens
/// missing for its model are a failure: a run that compared nothing must not pass.
#[cfg(feature = "cuda")]
mod on_cuda {
    use super::*;

    #[test]
    fn goldens_match() {
        if let Err(why) = kernels::cuda::probe() {
            assert!(
                std::env::var("CUDA_CONFORMANCE_REQUIRED").as_deref() != Ok("1"),
                "no GPU: {why}"
            );
            eprintln!("SKIPPED: CUDA goldens: {why}");
            return;
        }
        let opts = Options::for_backend(Backend::Cuda);
        assert!(
            opts.dir.exists(),
            "no CUDA goldens for this GPU ({}): bless them with `GPU_CHECK_BLESS=1 bash \
             ci/gpu-check.sh` (or `cargo run --release -p harness --features cuda -- golden \
             bless --backend cuda`) and commit the folder",
            opts.dir.display()
        );
        super::goldens_match(Backend::Cuda);
    }
}

fn goldens_match(backend: Backend) {
    backend.activate().unwrap();
    let opts = Options::for_backend(backend);
    let report = check(&opts, |r| {
        eprintln!(
            "{:<48} {} {}",
            r.case,
            r.verdict.label(),
            r.verdict.detail()
        )
    })
    .unwrap();
    assert!(!report.results.is_empty(), "no golden cases ran");
    // Every family of the matrix must be synthesisable: a dropped family is a failure here.
    assert!(
        report.skipped.is_empty(),
        "golden rows skipped: {:?}",
        report.skipped
    );
    let failed: Vec<String> = report
        .failures()
        .map(|r| format!("{}: {} {}", r.case, r.verdict.label(), r.verdict.detail()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} golden case(s) in {} failed (if the model changed on purpose: cargo run --release -p harness -- golden bless --backend {backend}):\n{}",
        failed.len(),
        opts.dir.display(),
        failed.join("\n")
    );
}

const CASE: &str = "qwen3:tiny:f32:hf/default/short";

fn only(dir: &Path) -> Options {
    Options {
        backend: Backend::Cpu,
        dir: dir.to_path_buf(),
        filter: Some(CASE.to_string()),
    }
}

fn verdict(opts: &Options) -> Verdict {
    let report = check(opts, |_| {}).unwrap();
    assert_eq!(
        report.results.len(),
        1,
        "the filter selects exactly one case"
    );
    report.results[0].verdict.clone()
}

#[test]
fn check_reports_tampering_missing_files_and_stale_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let opts = only(dir.path());
    assert_eq!(verdict(&opts), Verdict::Missing);

    let changes = bless(&opts, |_, _, _| {}).unwrap();
    assert_eq!(changes, vec![(CASE.to_string(), BlessChange::New)]);
    assert_eq!(verdict(&opts), Verdict::Pass);
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let good = Golden::read(&file).unwrap();

    // One generated id off at index 7: reported at 7, with both texts.
    let mut bad = good.clone();
    bad.generated_ids[7] ^= 1;
    bad.write_atomic(&file).unwrap();
    match verdict(&opts) {
        Verdict::Mismatch {
            index,
            expected_id,
            actual_id,
            expected_text,
            actual_text,
        } => {
            assert_eq!(index, 7);
            assert_eq!(expected_id, Some(good.generated_ids[7] ^ 1));
            assert_eq!(actual_id, Some(good.generated_ids[7]));
            assert_eq!(expected_text, good.text);
            assert_eq!(actual_text, good.text);
        }
        v => panic!("expected a mismatch at 7, got {v:?}"),
    }
    // Bless sees the same index, rewrites, and a second bless changes nothing.
    let changes = bless(&opts, |_, _, _| {}).unwrap();
    assert_eq!(changes[0].1, BlessChange::ChangedAt(7));
    assert_eq!(
        Golden::read(&file).unwrap().generated_ids,
        good.generated_ids
    );
    assert_eq!(
        bless(&opts, |_, _, _| {}).unwrap()[0].1,
        BlessChange::Unchanged
    );

    // A shorter golden diverges where it ends.
    let mut bad = good.clone();
    bad.generated_ids.truncate(20);
    bad.write_atomic(&file).unwrap();
    assert!(matches!(
        verdict(&opts),
        Verdict::Mismatch { index: 20, .. }
    ));

    // Same ids, different text: a text mismatch.
    let mut bad = good.clone();
    bad.text.push('!');
    bad.write_atomic(&file).unwrap();
    assert!(matches!(verdict(&opts), Verdict::TextMismatch { .. }));

    // A different checkpoint hash is staleness, even when the tokens are also off.
    let mut bad = good.clone();
    bad.checkpoint_sha256 = "0".repeat(64);
    bad.generated_ids[0] ^= 1;
    bad.write_atomic(&file).unwrap();
    let v = verdict(&opts);
    assert!(matches!(v, Verdict::CheckpointChanged { .. }), "{v:?}");
    assert!(v.detail().contains("checkpoint changed, re-bless"));
    assert!(!v.passed());

    // A different prompt is staleness too.
    let mut bad = good.clone();
    bad.prompt_ids.push(1);
    bad.write_atomic(&file).unwrap();
    assert_eq!(verdict(&opts), Verdict::CaseChanged("prompt".into()));
}

#[test]
fn goldens_record_what_they_promise() {
    let dir = harness::golden::default_dir(Backend::Cpu);
    let file = dir.join("qwen3-tiny-f32-hf.default.long.json");
    let g = Golden::read(&file).unwrap();
    assert_eq!(g.case, "qwen3:tiny:f32:hf/default/long");
    assert_eq!(g.synth, "qwen3:tiny:f32:hf");
    assert_eq!(
        g.prompt_ids.len(),
        150,
        "the long prompt is longer than a GDN chunk"
    );
    assert_eq!(g.generated_ids.len(), g.max_tokens);
    assert_eq!(g.checkpoint_sha256.len(), 64);
    assert!(g.engine_version.starts_with(env!("CARGO_PKG_VERSION")));
}

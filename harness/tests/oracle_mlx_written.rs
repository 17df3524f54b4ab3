//! Checkpoints written by mlx-lm's own save functions (MLX layout, every weight format) must
//! load and generate what mlx-lm generates (stored references, no Python at test time).

use std::path::PathBuf;

use engine::layers::gated_delta::GdnPath;
use harness::oracle::{check_reference, compare};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

const FORMATS: [&str; 7] = ["f32", "bf16", "q4", "q8", "mxfp4", "nvfp4", "mxfp8"];

/// Checks every format of one family's mlx-written fixtures with one Gated DeltaNet path.
fn check_family(family: &str, gdn: Option<GdnPath>) {
    let mut failures = Vec::new();
    for fmt in FORMATS {
        let dir = root().join(format!("engine/tests/fixtures/mlx-written/{family}-{fmt}"));
        let reference = root().join(format!("goldens/oracle/mlx-written/{family}-{fmt}.json"));
        let verdicts = check_reference(&dir, &reference, gdn).unwrap_or_else(|e| panic!("{fmt}: {e:#}"));
        for v in verdicts {
            println!(
                "{family}-{fmt:6} gdn={gdn:?} prompt {:3}: matched {:2}/{} mismatch {:?} max |Δ top-1 logprob| {:.2e} {}",
                v.prompt_tokens,
                v.matched,
                v.steps,
                v.mismatch,
                v.max_logprob_diff,
                if v.pass { "ok" } else { "FAIL" }
            );
            // f32 arithmetic on both sides: logprobs of matched steps agree closely.
            if !v.pass || v.max_logprob_diff > 1e-3 {
                failures.push(format!("{fmt}: {v:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "oracle mismatches:\n{}",
        failures.join("\n")
    );
}

#[test]
fn compare_fails_when_a_divergent_token_is_outside_the_top5() {
    let top = |ids: &[u32]| vec![ids.iter().map(|&i| (i, -1.0)).collect::<Vec<_>>()];
    // Within each other's top-5: a tolerated near-tie.
    assert!(compare(&[1], &top(&[1, 2]), &[2], &top(&[2, 1])).pass);
    // The engine's token is not among the reference's best five.
    assert!(!compare(&[9], &top(&[9, 2]), &[2], &top(&[2, 3, 4, 5, 6, 9])).pass);
    // Identical runs pass.
    assert!(
        compare(
            &[3, 4],
            &[vec![(3, -0.5)], vec![(4, -0.1)]],
            &[3, 4],
            &[vec![(3, -0.5)], vec![(4, -0.1)]]
        )
        .pass
    );
}

#[test]
fn mlx_written_qwen3_matches_mlx_lm_in_every_format() {
    check_family("qwen3", None);
}

#[test]
fn mlx_written_qwen3_5_matches_mlx_lm_per_step() {
    check_family("qwen3_5", Some(GdnPath::PerStep));
}

#[test]
fn mlx_written_qwen3_5_matches_mlx_lm_chunked() {
    check_family("qwen3_5", Some(GdnPath::Chunked));
}

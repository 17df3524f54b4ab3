//! End-to-end checks on a real checkpoint, run by the `model-e2e` CI workflow
//! (`ci/github/model-e2e.yml`) once per family's smallest published folder. Every test is
//! `#[ignore]`d and reads the folder from `E2E_MODEL_DIR`; without it a test prints
//! `E2E-SKIPPED: <test>: ...` and returns. That is loud on purpose: the CI leg runs them with
//! `--ignored --nocapture` and fails when the marker appears, so a leg cannot pass by skipping.
//! A check that does not apply to the folder's family (per step vs chunked on a model without
//! Gated DeltaNet) passes and says why, without the marker.
//!
//! Environment: `E2E_MODEL_DIR` (the folder), `E2E_MODEL_KEY` (names its goldens; default: the
//! folder's name), `E2E_GOLDEN_DIR` (default: `goldens/e2e` in the workspace), `E2E_BLESS=1`
//! (rewrite the goldens).
//!
//! Adding a check is one function: `#[test] #[ignore] fn x() { let Some(m) = model("x") else
//! { return }; ... }`, comparing two ways of running with [`no_early_divergence`]. Paged ≡ flat
//! KV, greedy MTP ≡ plain decoding and session reuse ≡ fresh go here once the engine has them.

use std::path::PathBuf;
use std::sync::OnceLock;

use engine::layers::GdnPath;
use engine::{generate, Pipeline, RequestOptions};
use harness::parity::classify;
use serde_json::{json, Value};

/// Generated tokens per prompt: past the early-divergence horizon (16).
const TOKENS: usize = 32;

/// The loaded checkpoint, shared by the tests of one run.
struct Model {
    key: String,
    pipeline: Pipeline,
}

fn loaded() -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = PathBuf::from(std::env::var_os("E2E_MODEL_DIR")?);
            let key = std::env::var("E2E_MODEL_KEY").unwrap_or_else(|_| {
                dir.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
            let pipeline =
                Pipeline::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e:#}", dir.display()));
            Some(Model { key, pipeline })
        })
        .as_ref()
}

/// The checkpoint, or `None` after printing the skip marker.
fn model(test: &str) -> Option<&'static Model> {
    let m = loaded();
    if m.is_none() {
        println!("E2E-SKIPPED: {test}: E2E_MODEL_DIR is not set (see ci/github/model-e2e.yml)");
    }
    m
}

/// Greedy tokens of `ids`, `n` of them whatever the stop tokens.
fn greedy(p: &Pipeline, ids: &[u32], n: usize, tweak: impl Fn(&mut RequestOptions)) -> Vec<u32> {
    let mut o = RequestOptions {
        max_tokens: Some(n),
        temperature: Some(0.0),
        ignore_eos: true,
        ..Default::default()
    };
    tweak(&mut o);
    let req = p.request(ids.to_vec(), &o);
    generate::generate(p.model.as_ref(), &req, |_| {})
        .unwrap_or_else(|e| panic!("generate: {e:#}"))
        .tokens
}

/// The prompts of the goldens: plain text, code, and a chat turn when the folder has a template.
fn prompts(p: &Pipeline) -> Vec<(String, Vec<u32>)> {
    let mut out: Vec<(String, Vec<u32>)> = [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    ]
    .iter()
    .map(|t| (t.to_string(), p.encode_prompt(t, false).unwrap()))
    .collect();
    if p.tokenizer.has_chat_template() {
        let t = "Why is the sky blue? Answer in one sentence.";
        out.push((format!("chat: {t}"), p.encode_prompt(t, true).unwrap()));
    }
    out
}

/// A prompt of about `n` tokens of ordinary prose (past the chunked-prefill threshold).
fn long_prompt(p: &Pipeline, n: usize) -> Vec<u32> {
    let para = "The river bends around the old mill, where the miller keeps a ledger of every \
                sack of grain that passes through his door, and the children count the boats. ";
    let mut ids = Vec::new();
    while ids.len() < n {
        ids.extend(p.encode_prompt(para, false).unwrap());
    }
    ids.truncate(n);
    ids
}

/// Two token streams of one prompt agree for at least the early-divergence horizon.
fn no_early_divergence(what: &str, a: &[u32], b: &[u32]) {
    let v = classify(a, b);
    println!("{what}: {v}");
    assert!(!v.is_early(), "{what}: {v}\n a: {a:?}\n b: {b:?}");
}

fn golden_path(m: &Model, backend: &str) -> PathBuf {
    let dir = std::env::var_os("E2E_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| harness::models::workspace_root().join("goldens/e2e"));
    // Goldens are exact, so they belong to a backend and an instruction set (DESIGN §3).
    dir.join(&m.key)
        .join(format!("{backend}-{}.json", std::env::consts::ARCH))
}

#[test]
#[ignore = "needs E2E_MODEL_DIR (a real checkpoint); run by the model-e2e workflow"]
fn greedy_goldens() {
    let Some(m) = model("greedy_goldens") else {
        return;
    };
    let p = &m.pipeline;
    let cases: Vec<Value> = prompts(p)
        .into_iter()
        .map(|(prompt, ids)| {
            let tokens = greedy(p, &ids, TOKENS, |_| {});
            let text = p.tokenizer.decode(&tokens, false).unwrap();
            json!({"prompt": prompt, "prompt_ids": ids, "tokens": tokens, "text": text})
        })
        .collect();
    let now = json!({"model": m.key, "max_tokens": TOKENS, "cases": cases});
    let path = golden_path(m, "cpu");
    let bless = std::env::var("E2E_BLESS").is_ok_and(|v| v == "1");
    if bless || !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(&now).unwrap() + "\n").unwrap();
        // Not a skip: the tokens were computed; the workflow uploads the file for committing.
        println!(
            "E2E-BLESSED: {} (commit it to check later runs)",
            path.display()
        );
        return;
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (w, g) in want["cases"].as_array().unwrap().iter().zip(&cases) {
        assert_eq!(
            w["prompt_ids"], g["prompt_ids"],
            "{}: the tokenizer changed",
            w["prompt"]
        );
        assert_eq!(
            w["tokens"],
            g["tokens"],
            "{}: greedy tokens differ from {}\n want {}\n got  {}",
            w["prompt"],
            path.display(),
            w["text"],
            g["text"]
        );
    }
    println!(
        "greedy_goldens: {} prompts equal {}",
        cases.len(),
        path.display()
    );
}

#[test]
#[ignore = "needs E2E_MODEL_DIR (a real checkpoint); run by the model-e2e workflow"]
fn gdn_per_step_matches_chunked() {
    let Some(m) = model("gdn_per_step_matches_chunked") else {
        return;
    };
    let p = &m.pipeline;
    if !p
        .model
        .info()
        .layer_kinds
        .iter()
        .any(|k| k == "linear_attention")
    {
        println!(
            "gdn_per_step_matches_chunked: not applicable ({} has no Gated DeltaNet layers)",
            p.model.info().family
        );
        return;
    }
    let ids = long_prompt(p, 300);
    let per_step = greedy(p, &ids, TOKENS, |o| o.gdn_path = Some(GdnPath::PerStep));
    let chunked = greedy(p, &ids, TOKENS, |o| o.gdn_path = Some(GdnPath::Chunked));
    no_early_divergence("per step vs chunked, 300-token prompt", &per_step, &chunked);
}

#[test]
#[ignore = "needs E2E_MODEL_DIR (a real checkpoint); run by the model-e2e workflow"]
fn prefill_in_pieces_matches_whole() {
    let Some(m) = model("prefill_in_pieces_matches_whole") else {
        return;
    };
    let p = &m.pipeline;
    let ids = long_prompt(p, 200);
    let whole = greedy(p, &ids, TOKENS, |_| {});
    let pieces = greedy(p, &ids, TOKENS, |o| o.prefill_step = Some(37));
    no_early_divergence("prefill whole vs in 37-token pieces", &whole, &pieces);
}

#[cfg(feature = "metal")]
#[test]
#[ignore = "needs E2E_MODEL_DIR (a real checkpoint); run by the model-e2e workflow"]
fn cpu_matches_metal() {
    let Some(m) = model("cpu_matches_metal") else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os("E2E_MODEL_DIR").unwrap());
    let metal = Pipeline::load_on(&dir, engine::Backend::Metal).unwrap();
    for (prompt, ids) in prompts(&m.pipeline) {
        let cpu = greedy(&m.pipeline, &ids, TOKENS, |_| {});
        let gpu = greedy(&metal, &ids, TOKENS, |_| {});
        no_early_divergence(&format!("cpu vs metal: {prompt}"), &cpu, &gpu);
    }
}

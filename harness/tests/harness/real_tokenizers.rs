//! Real vocabularies and chat templates, run by `.ci/run`'s `real` stage (ci/real/test.sh) on
//! what ci/real/fetch.sh unpacks from llama.cpp's source (the pinned llama-cpp-python sdist) into
//! `target/real/vocab/` (or `REAL_VOCAB_DIR`):
//!
//! - the Qwen2 vocabulary (the byte-level BPE that Qwen2.5 and Qwen3 also use) and Llama 3's, as
//!   tensor-less GGUF files, rebuilt into tokenizer.json by our GGUF import, must give the ids
//!   Hugging Face's tokenizer gave llama.cpp's test texts (the `.inp`/`.out` files beside them),
//!   and transformers' ids and decoded text on our corpus (goldens/real/tokenizers/);
//! - the real chat templates of the families the engine runs (Qwen3, Qwen3.5, Qwen2.5, Gemma 4,
//!   LFM2.5, MiniCPM5, SmolLM3) must render as transformers renders them, with `enable_thinking`
//!   unset, on and off (goldens/real/templates/, made by ci/real/tokenizer_reference.py).
//!
//! Without the folder a test prints `E2E-SKIPPED: ...` and returns, which fails the stage.

use std::path::{Path, PathBuf};

use engine::gguf::{tokenizer, GgufFile};
use engine::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde::Deserialize;

/// The vocabularies checked, by their GGUF file's name in llama.cpp's `models/`.
const VOCABS: [&str; 2] = ["ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf"];

fn vocab_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("REAL_VOCAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/real/vocab"));
    if dir.join(VOCABS[0]).is_file() {
        Some(dir)
    } else {
        println!(
            "E2E-SKIPPED: {test}: no {} (run ci/real/fetch.sh)",
            dir.join(VOCABS[0]).display()
        );
        None
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sha256(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// Our tokenizer for a GGUF vocabulary, as `harness import-gguf` writes it.
fn rebuilt(gguf: &Path, scratch: &Path) -> Tokenizer {
    let g = GgufFile::open(gguf).unwrap_or_else(|e| panic!("{}: {e:#}", gguf.display()));
    let json = tokenizer::tokenizer_json(&g).unwrap_or_else(|e| panic!("{e:#}"));
    std::fs::write(scratch.join("tokenizer.json"), json.to_string()).unwrap();
    let config = tokenizer::special_tokens(&g);
    std::fs::write(scratch.join("tokenizer_config.json"), config.to_string()).unwrap();
    Tokenizer::load(scratch).unwrap_or_else(|e| panic!("{e:#}"))
}

/// llama.cpp's test texts and the ids Hugging Face's tokenizer gave them.
fn llama_cpp_cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let p = PathBuf::from(format!("{}.{ext}", gguf.display()));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let texts: Vec<&str> = inp
        .strip_suffix("\n__ggml_vocab_test__\n")
        .unwrap_or(&inp)
        .split("\n__ggml_vocab_test__\n")
        .collect();
    let ids: Vec<Vec<u32>> = out
        .strip_suffix('\n')
        .unwrap_or(&out)
        .split('\n')
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{}: .inp and .out disagree in length",
        gguf.display()
    );
    texts.into_iter().map(str::to_string).zip(ids).collect()
}

#[test]
#[ignore = "needs ci/real/fetch.sh's target/real/vocab"]
fn vocabularies_give_llama_cpp_recorded_ids() {
    let Some(dir) = vocab_dir("vocabularies_give_llama_cpp_recorded_ids") else {
        return;
    };
    for name in VOCABS {
        let scratch = tempfile::tempdir().unwrap();
        let tok = rebuilt(&dir.join(name), scratch.path());
        let cases = llama_cpp_cases(&dir.join(name));
        assert!(cases.len() >= 40, "{name}: only {} cases", cases.len());
        for (text, want) in &cases {
            let got = tok.encode(text, false).unwrap();
            assert_eq!(&got, want, "{name}: ids of {text:?}");
            assert_eq!(
                &tok.decode(&got, false).unwrap(),
                text,
                "{name}: decode of {text:?}"
            );
        }
        println!(
            "{name}: {} of llama.cpp's texts give the recorded ids",
            cases.len()
        );
    }
}

#[derive(Deserialize)]
struct VocabReference {
    gguf: String,
    gguf_sha256: String,
    cases: Vec<VocabCase>,
}

#[derive(Deserialize)]
struct VocabCase {
    text: String,
    ids: Vec<u32>,
    ids_with_specials: Vec<u32>,
    decoded: String,
}

#[test]
#[ignore = "needs ci/real/fetch.sh's target/real/vocab"]
fn vocabularies_match_transformers() {
    let Some(dir) = vocab_dir("vocabularies_match_transformers") else {
        return;
    };
    let refs = json_files(&workspace().join("goldens/real/tokenizers"));
    assert_eq!(refs.len(), VOCABS.len(), "one reference per vocabulary");
    for path in refs {
        let r: VocabReference = read_json(&path);
        let gguf = dir.join(&r.gguf);
        assert_eq!(
            sha256(&gguf),
            r.gguf_sha256,
            "{}: not the file of {}",
            gguf.display(),
            path.display()
        );
        let scratch = tempfile::tempdir().unwrap();
        let tok = rebuilt(&gguf, scratch.path());
        for c in &r.cases {
            assert_eq!(
                tok.encode(&c.text, false).unwrap(),
                c.ids,
                "{}: ids of {:?}",
                r.gguf,
                c.text
            );
            assert_eq!(
                tok.encode(&c.text, true).unwrap(),
                c.ids_with_specials,
                "{}: ids with special tokens of {:?}",
                r.gguf,
                c.text
            );
            assert_eq!(
                tok.decode(&c.ids, false).unwrap(),
                c.decoded,
                "{}: decode of {:?}",
                r.gguf,
                c.text
            );
        }
        println!(
            "{}: {} texts as transformers tokenizes them",
            r.gguf,
            r.cases.len()
        );
    }
}

#[derive(Deserialize)]
struct TemplateReference {
    template: String,
    template_sha256: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    cases: Vec<TemplateCase>,
}

#[derive(Deserialize)]
struct TemplateCase {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
    /// The text, or `{"refused": why}` where the template raised.
    rendered: serde_json::Value,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

#[test]
#[ignore = "needs ci/real/fetch.sh's target/real/vocab"]
fn chat_templates_render_as_transformers() {
    let Some(dir) = vocab_dir("chat_templates_render_as_transformers") else {
        return;
    };
    let refs = json_files(&workspace().join("goldens/real/templates"));
    assert!(refs.len() >= 7, "only {} template references", refs.len());
    for path in refs {
        let r: TemplateReference = read_json(&path);
        // `models/templates/X.jinja` in llama.cpp; fetch.sh keeps the `templates/X.jinja` part.
        let file = dir.join(r.template.trim_start_matches("models/"));
        assert_eq!(
            sha256(&file),
            r.template_sha256,
            "{}: not the template of {}",
            file.display(),
            path.display()
        );
        let source = std::fs::read_to_string(&file).unwrap();
        let template = ChatTemplate::new(source, file.display().to_string())
            .unwrap_or_else(|e| panic!("{e:#}"));
        for c in &r.cases {
            let messages: Vec<ChatMessage> = c
                .messages
                .iter()
                .map(|m| ChatMessage::new(&m.role, &m.content))
                .collect();
            let got = template.render(
                &messages,
                c.add_generation_prompt,
                (r.bos_token.as_deref(), r.eos_token.as_deref()),
                c.enable_thinking,
            );
            let what = format!(
                "{}: {} messages, generation prompt {}, enable_thinking {:?}",
                r.template,
                messages.len(),
                c.add_generation_prompt,
                c.enable_thinking
            );
            match (&c.rendered, got) {
                (serde_json::Value::String(want), Ok(got)) => assert_eq!(&got, want, "{what}"),
                (serde_json::Value::String(_), Err(e)) => panic!("{what}: {e:#}"),
                (refused, Ok(got)) => {
                    panic!("{what}: transformers refused ({refused}), we rendered {got:?}")
                }
                (_, Err(_)) => {}
            }
        }
        println!(
            "{}: {} renders as transformers's",
            r.template,
            r.cases.len()
        );
    }
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

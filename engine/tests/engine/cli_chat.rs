//! `engine chat`: the cache kept across turns changes nothing the user sees (the same answers
//! as with `--no-reuse`, which prefills every turn whole), turns after the first take tokens
//! from the cache, `/reset` forgets them, and a folder without a chat template is refused.

use std::io::Write;
use std::process::{Command, Stdio};

fn fixture() -> String {
    format!(
        "{}/tests/fixtures/mlx-written/qwen3-bf16",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Runs a chat fed `input`; returns (stdout, stderr).
fn chat(model: &str, input: &str, extra: &[&str]) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["chat", "--model", model, "--max-tokens", "6"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

/// The "N from the cache" figure of every turn.
fn reused(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|l| l.split(" prompt tokens, ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn chat_reuses_the_cache_without_changing_the_answers() {
    let input = "Hello there\nWhat did I say?\nAnd then?\n/reset\nHello there\n/exit\nnever read\n";
    let (with, log) = chat(&fixture(), input, &["--system", "Be brief."]);
    let (without, log_fresh) = chat(&fixture(), input, &["--system", "Be brief.", "--no-reuse"]);
    assert_eq!(with, without, "reuse changed an answer");
    assert_eq!(
        with.lines().count(),
        4,
        "four answers, nothing after /exit: {with:?}"
    );
    let r = reused(&log);
    assert_eq!(r.len(), 4, "{log}");
    assert!(
        r[0] == 0 && r[1] > 0 && r[2] > r[1] && r[3] == 0,
        "reuse per turn: {r:?}"
    );
    assert_eq!(reused(&log_fresh), vec![0; 4]);
    assert!(log.contains("[conversation reset]"));
}

#[test]
fn chat_refuses_a_folder_without_a_template() {
    let dir = std::env::temp_dir().join(format!("cli-chat-no-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(fixture()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let cfg = dir.join("tokenizer_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&cfg, v.to_string()).unwrap();
    let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["chat", "--model", dir.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no chat template"), "{err}");
}

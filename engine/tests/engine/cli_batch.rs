//! `engine generate --prompts FILE`: every line's result (printed as one JSON line, in file
//! order) equals the same request run alone, with paged KV and a batch smaller than the file;
//! a malformed line is refused naming the file and the line.

use std::process::Command;

fn fixture() -> String {
    format!(
        "{}/tests/fixtures/mlx-written/qwen3-q4",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn engine(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tokens(json: &str) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn prompts_file_results_equal_single_runs() {
    let dir = std::env::temp_dir().join(format!("cli-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompts.jsonl");
    std::fs::write(
        &file,
        concat!(
            "{\"prompt\": \"Once upon a time\"}\n",
            "\n",
            "{\"prompt_ids\": [5, 6, 7, 8, 9, 10, 11], \"max_tokens\": 3}\n",
            "{\"prompt\": \"Hello there\", \"chat\": true, \"temperature\": 0.9, \"seed\": 4}\n",
            "{\"prompt\": \"The sky is\", \"max_tokens\": 9}\n",
        ),
    )
    .unwrap();
    let model = fixture();
    let base = ["--model", &model, "--ignore-eos", "--json"];
    let (ok, out, err) = engine(
        &[
            &["generate"][..],
            &base,
            &[
                "--prompts",
                file.to_str().unwrap(),
                "--kv",
                "paged",
                "--max-tokens",
                "6",
                "--max-batch",
                "2",
            ],
        ]
        .concat(),
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("4 prompts") && err.contains("tok/s together"),
        "{err}"
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let singles: [&[&str]; 4] = [
        &["--prompt", "Once upon a time", "--max-tokens", "6"],
        &["--prompt-ids", "5,6,7,8,9,10,11", "--max-tokens", "3"],
        &[
            "--max-tokens",
            "6",
            "--prompt",
            "Hello there",
            "--chat",
            "--temperature",
            "0.9",
            "--seed",
            "4",
        ],
        &["--prompt", "The sky is", "--max-tokens", "9"],
    ];
    for (i, (line, single)) in lines.iter().zip(singles).enumerate() {
        let (ok, alone, err) = engine(&[&["generate"][..], &base, single].concat());
        assert!(ok, "{err}");
        assert_eq!(tokens(line), tokens(&alone), "prompt {}", i + 1);
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["index"], i);
    }

    std::fs::write(&file, "{\"prompt\": \"ok\"}\n{\"promt\": \"typo\"}\n").unwrap();
    let (ok, _, err) = engine(&[
        "generate",
        "--model",
        &model,
        "--prompts",
        file.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("prompts.jsonl line 2"), "{err}");

    // A line sets the request's sampling fields by their names; a misspelt one, or a field a
    // line may not set, is refused naming the line and the field.
    for bad in ["\"temprature\": 0.5", "\"gdn_path\": \"chunked\""] {
        std::fs::write(&file, format!("{{\"prompt\": \"ok\", {bad}}}\n")).unwrap();
        let (ok, _, err) = engine(&[
            "generate",
            "--model",
            &model,
            "--prompts",
            file.to_str().unwrap(),
        ]);
        assert!(!ok);
        let field = bad.split('"').nth(1).unwrap();
        assert!(
            err.contains("prompts.jsonl line 1") && err.contains(field),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The malformed-folder corpus (`tests/malformed/corpus.json`): each case is a synthetic
//! checkpoint broken by a few declared edits, then loaded (and run) through the engine, which
//! must answer with an error naming the file and the field or tensor — no panic, no abort, no
//! hang. The folders are made here from the spec and the edits (the corpus holds no binary
//! files); `MALFORMED_KEEP=DIR` keeps them for inspection.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use engine::pipeline::{Pipeline, RequestOptions};
use serde_json::{Map, Value};
use synth::SynthSpec;

/// Longer than any case needs on a loaded 2-core machine; a case past it hangs.
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

fn corpus() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/malformed/corpus.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

/// Sets `dotted.key` in `obj` (creating objects on the way); `null` removes it.
fn set_dotted(obj: &mut Value, key: &str, value: &Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap();
    let mut at = obj;
    for p in parts {
        at = at
            .as_object_mut()
            .unwrap()
            .entry(p)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    let map = at.as_object_mut().unwrap();
    if value.is_null() {
        map.remove(last);
    } else {
        map.insert(last.to_string(), value.clone());
    }
}

fn edit_json(path: &Path, fields: &Value, text_config: bool) {
    let mut v = if path.exists() {
        read_json(path)
    } else {
        Value::Object(Map::new())
    };
    for (k, val) in fields.as_object().unwrap() {
        let target = if text_config && v.get("text_config").is_some() {
            v.get_mut("text_config").unwrap()
        } else {
            &mut v
        };
        set_dotted(target, k, val);
    }
    write_json(path, &v);
}

/// The header (as ordered JSON) and the data section of a safetensors file.
fn split_safetensors(bytes: &[u8]) -> (Map<String, Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

/// A file from header text and data, the header padded with spaces to 8 bytes.
fn join_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

fn edit_header(file: &Path, f: impl FnOnce(&mut Map<String, Value>) -> String) {
    let (mut header, data) = split_safetensors(&std::fs::read(file).unwrap());
    let text = f(&mut header);
    std::fs::write(file, join_safetensors(&text, &data)).unwrap();
}

/// Rewrites the file with the safetensors crate, `name` replaced by a tensor of `dtype` and
/// `shape` filled with `fill`.
fn replace_tensor(file: &Path, spec: &Value) {
    use safetensors::tensor::{Dtype, TensorView};
    let raw = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
    let name = spec["name"].as_str().unwrap();
    assert!(st.names().contains(&name), "no tensor {name} to replace");
    let dtype: Dtype = serde_json::from_value(spec["dtype"].clone()).unwrap();
    let shape: Vec<usize> = serde_json::from_value(spec["shape"].clone()).unwrap();
    let n: usize = shape.iter().product();
    let one: Vec<u8> = match (spec["fill"].as_str().unwrap(), dtype) {
        ("zero", d) => vec![0; d.bitsize() / 8],
        ("nan", Dtype::BF16) => vec![0xc0, 0x7f],
        ("nan", Dtype::F32) => f32::NAN.to_le_bytes().to_vec(),
        ("inf", Dtype::BF16) => vec![0x80, 0x7f],
        ("inf", Dtype::F32) => f32::INFINITY.to_le_bytes().to_vec(),
        other => panic!("fill {other:?} not supported"),
    };
    let data = one.repeat(n);
    let meta = st_metadata(&raw);
    let mut views: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != name)
        .collect();
    views.push((
        name.to_string(),
        TensorView::new(dtype, shape, &data).unwrap(),
    ));
    let bytes = safetensors::serialize(views, meta).unwrap();
    std::fs::write(file, bytes).unwrap();
}

fn st_metadata(raw: &[u8]) -> Option<std::collections::HashMap<String, String>> {
    let (_, meta) = safetensors::SafeTensors::read_metadata(raw).unwrap();
    meta.metadata().clone()
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

fn apply(dir: &Path, edit: &Value) {
    let (op, arg) = edit.as_object().unwrap().iter().next().unwrap();
    let st = dir.join("model.safetensors");
    match op.as_str() {
        "config" => edit_json(&dir.join("config.json"), arg, true),
        "config_root" => edit_json(&dir.join("config.json"), arg, false),
        "generation" => edit_json(&dir.join("generation_config.json"), arg, false),
        "tokenizer_config" => edit_json(&dir.join("tokenizer_config.json"), arg, false),
        "write" => std::fs::write(
            dir.join(arg["file"].as_str().unwrap()),
            arg["text"].as_str().unwrap(),
        )
        .unwrap(),
        "fifo" => mkfifo(&dir.join(arg.as_str().unwrap())),
        "symlink" => {
            let link = dir.join(arg["file"].as_str().unwrap());
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(arg["to"].as_str().unwrap(), link).unwrap();
        }
        "header_set" => edit_header(&st, |h| {
            let t = h.get_mut(arg["tensor"].as_str().unwrap()).unwrap();
            t[arg["field"].as_str().unwrap()] = arg["value"].clone();
            serde_json::to_string(h).unwrap()
        }),
        "header_shift" => edit_header(&st, |h| {
            let by = arg["by"].as_i64().unwrap();
            let t = h.get_mut(arg["tensor"].as_str().unwrap()).unwrap();
            for o in t["data_offsets"].as_array_mut().unwrap() {
                *o = Value::from(o.as_i64().unwrap() + by);
            }
            serde_json::to_string(h).unwrap()
        }),
        "header_duplicate" => edit_header(&st, |h| {
            let name = arg.as_str().unwrap();
            let entry = serde_json::to_string(&h[name]).unwrap();
            let rest = serde_json::to_string(h).unwrap();
            // serde_json maps cannot hold two equal keys: write the second one as text.
            format!("{{\"{name}\":{entry},{}", &rest[1..])
        }),
        "header_len" => {
            let mut b = std::fs::read(&st).unwrap();
            b[..8].copy_from_slice(&arg.as_u64().unwrap().to_le_bytes());
            std::fs::write(&st, b).unwrap();
        }
        "append" => {
            let mut b = std::fs::read(&st).unwrap();
            b.extend(vec![0u8; arg.as_u64().unwrap() as usize]);
            std::fs::write(&st, b).unwrap();
        }
        "truncate" => {
            let b = std::fs::read(&st).unwrap();
            std::fs::write(&st, &b[..b.len() - arg.as_u64().unwrap() as usize]).unwrap();
        }
        "tensor" => replace_tensor(&st, arg),
        other => panic!("unknown edit {other}"),
    }
}

/// Loads (and runs, for later stages) the folder; the error text of the first failure.
fn run_case(dir: &Path, stage: &str) -> Result<(), String> {
    let p = Pipeline::load(dir).map_err(|e| format!("{e:#}"))?;
    let ids = match stage {
        "load" => return Ok(()),
        "chat" => p
            .encode_prompt("Hello", true, None)
            .map_err(|e| format!("{e:#}"))?,
        _ => vec![1, 2, 3],
    };
    let req = p.request(
        ids,
        &RequestOptions {
            max_tokens: (stage == "chat").then_some(2),
            ..Default::default()
        },
    );
    engine::generate::generate(p.model.as_ref(), &req, |_| {})
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

/// Runs a case on its own thread: a panic or a hang is reported as such.
fn guarded(dir: PathBuf, stage: String) -> Result<Result<(), String>, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| run_case(&dir, &stage));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(CASE_TIMEOUT) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(_)) => Err("panicked".into()),
        Err(_) => Err(format!("did not finish within {CASE_TIMEOUT:?} (hang)")),
    }
}

#[test]
fn every_malformed_folder_gets_a_clear_error() {
    let keep = std::env::var_os("MALFORMED_KEEP").map(PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let root = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let mut failures = Vec::new();
    let cases = corpus();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let spec = SynthSpec::parse(case["synth"].as_str().unwrap()).unwrap();
        let base = synth::cached(&spec).unwrap();
        let dir = root.join(name.replace([' ', '/'], "_"));
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&base, &dir);
        for edit in case["edits"].as_array().unwrap() {
            apply(&dir, edit);
        }
        let stage = case["stage"].as_str().unwrap().to_string();
        let outcome = guarded(dir.clone(), stage.clone());
        let want_ok = case["ok"].as_bool().unwrap_or(false);
        let verdict = match (outcome, want_ok) {
            (Err(fatal), _) => Err(fatal),
            (Ok(Ok(())), true) => Ok("ok".to_string()),
            (Ok(Err(msg)), true) => Err(format!("expected success, got: {msg}")),
            (Ok(Ok(())), false) => Err(format!("expected an error at {stage}, got none")),
            (Ok(Err(msg)), false) => {
                let missing: Vec<&str> = case["expect"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .filter(|n| !msg.contains(n))
                    .collect();
                if missing.is_empty() {
                    Ok(msg)
                } else {
                    Err(format!("message lacks {missing:?}: {msg}"))
                }
            }
        };
        match verdict {
            Ok(msg) => println!("ok    {name}: {msg}"),
            Err(why) => {
                println!("FAIL  {name}: {why}");
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} malformed cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

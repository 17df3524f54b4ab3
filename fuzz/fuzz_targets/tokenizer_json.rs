//! Any bytes as tokenizer.json: it loads or not; a loaded tokenizer encodes and decodes
//! without panicking.
#![no_main]
use std::sync::OnceLock;

use engine::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let d = dir().path();
    std::fs::write(d.join("tokenizer.json"), data).unwrap();
    if let Ok(t) = Tokenizer::load(d) {
        let _ = t.encode("Hello, world! 123 éè 日本", true);
        let _ = t.decode(&[0, 1, 2, 3, 100_000], false);
    }
});

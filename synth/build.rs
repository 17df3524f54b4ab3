//! Fingerprints the synthesiser's sources so cached synthetic checkpoints are keyed by the code
//! that wrote them: after any change to `src/`, the cache misses and rewrites the folder instead
//! of serving bytes from an older synthesiser.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let root = Path::new("src");
    println!("cargo:rerun-if-changed=src");
    let mut all = Vec::new();
    files(root, &mut all);
    all.sort();
    // FNV-1a over names and contents: stable, dependency-free, plenty for a cache key.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in &all {
        let name = p.to_string_lossy().replace('\\', "/");
        for b in name.bytes().chain(std::fs::read(p).unwrap_or_default()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rustc-env=SYNTH_SOURCE_HASH={h:016x}");
}

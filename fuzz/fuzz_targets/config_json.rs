//! Any bytes as config.json over the weights of a real (tiny, mlx-lm-written) Qwen3 folder: the
//! family loads or refuses, and a loaded model runs one token without panicking.
#![no_main]
use std::path::Path;
use std::sync::OnceLock;

use engine::config::ModelConfig;
use engine::weights::WeightStore;
use libfuzzer_sys::fuzz_target;

fn store() -> &'static WeightStore {
    static STORE: OnceLock<WeightStore> = OnceLock::new();
    STORE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../engine/tests/fixtures/mlx-written/qwen3-bf16");
        WeightStore::open(&dir).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(root) = serde_json::from_slice(data) else {
        return;
    };
    let store = store();
    let Ok(cfg) = ModelConfig::from_value(store.dir(), root) else {
        return;
    };
    if let Ok(m) = engine::models::from_parts(&cfg, store) {
        let mut state = m.new_state();
        let _ = m.forward(&[1], &mut state, false);
    }
});

//! Any bytes as a safetensors file: parsing returns Ok or Err; what parses views and widens.
#![no_main]
use std::path::Path;

use engine::weights::safetensors::SafetensorsFile;
use kernels::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = SafetensorsFile::parse(
        Path::new("fuzz.safetensors"),
        Bytes::from_vec(data.to_vec()),
    ) else {
        return;
    };
    for name in f.tensors.keys() {
        if let Ok(Some(t)) = f.tensor(name) {
            if t.dtype().is_float() {
                let _ = t.to_vec_f32();
            }
        }
    }
});

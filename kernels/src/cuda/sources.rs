//! The CUDA C sources of `kernels/cuda/` and their compilation by NVRTC.
//!
//! Each `.cu` file is one NVRTC program: `common.cuh` is prepended (a `#line` directive keeps
//! error messages pointing into the right file), so no include paths or CUDA headers are
//! needed. The backend compiles a file the first time one of its kernels runs, for the
//! device's own compute capability, and keeps the module for the life of the process. The
//! NVRTC compile test (`tests/cuda/nvrtc.rs`) compiles every file for 8.0, 9.0 and 12.1.
//!
//! Adding an op: write its kernel in the `.cu` file of its kind (or a new file listed in
//! [`SOURCES`]), then call it by `(file, kernel name)` from the op's Rust side.

use std::ffi::{c_char, CStr, CString};

/// One CUDA source file.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// The file name under `kernels/cuda/`, also the key of its compiled module.
    pub name: &'static str,
    pub text: &'static str,
}

/// Helpers every file sees (types, conversions, reductions, activations).
pub const COMMON: Source = Source {
    name: "common.cuh",
    text: include_str!("../../cuda/common.cuh"),
};

pub const ELEMENTWISE: Source = Source {
    name: "elementwise.cu",
    text: include_str!("../../cuda/elementwise.cu"),
};
pub const ROWS: Source = Source {
    name: "rows.cu",
    text: include_str!("../../cuda/rows.cu"),
};
pub const ATTENTION: Source = Source {
    name: "attention.cu",
    text: include_str!("../../cuda/attention.cu"),
};
pub const WEIGHTS: Source = Source {
    name: "weights.cu",
    text: include_str!("../../cuda/weights.cu"),
};
pub const GDN: Source = Source {
    name: "gdn.cu",
    text: include_str!("../../cuda/gdn.cu"),
};

/// Every kernel file.
pub const SOURCES: [Source; 5] = [ELEMENTWISE, ROWS, ATTENTION, WEIGHTS, GDN];

/// The compute capabilities the compile test covers: A100 (8.0), H100/H200 (9.0) and DGX
/// Spark's GB10 (12.1).
pub const TESTED_ARCHS: [(u32, u32); 3] = [(8, 0), (9, 0), (12, 1)];

/// The translation unit NVRTC compiles for `src`.
pub fn program_text(src: &Source) -> String {
    format!(
        "#line 1 \"{}\"\n{}\n#line 1 \"{}\"\n{}",
        COMMON.name, COMMON.text, src.name, src.text
    )
}

/// NVRTC options: virtual architecture `compute_XY` (PTX the driver finishes for the exact GPU),
/// C++17, and IEEE division and square root (the CPU reference rounds them exactly).
pub fn options((major, minor): (u32, u32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{major}{minor}"),
        "--std=c++17".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
    ]
}

/// A compiled file: its PTX and NVRTC's log (warnings; empty when clean).
pub struct Compiled {
    pub ptx: CString,
    pub log: String,
}

/// Whether this machine has an NVRTC library cudarc can load (`libnvrtc.so.13`, or the CUDA 12
/// name, on the library path).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library; nothing is called through it.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `src` for compute capability `arch`. The error carries NVRTC's log. Call only when
/// [`nvrtc_present`] (cudarc panics when the library is missing).
pub fn compile(src: &Source, arch: (u32, u32)) -> Result<Compiled, String> {
    use cudarc::nvrtc::result;
    let text = CString::new(program_text(src))
        .map_err(|_| format!("{}: source holds a NUL byte", src.name))?;
    let name = CString::new(src.name).expect("file names hold no NUL");
    let prog = result::create_program(&text, Some(&name))
        .map_err(|e| format!("{}: nvrtcCreateProgram: {e:?}", src.name))?;
    // SAFETY: `prog` is a live program from create_program, destroyed exactly once below.
    unsafe {
        let compiled = result::compile_program(prog, &options(arch));
        let log = result::get_program_log(prog)
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        let out = match compiled {
            Ok(()) => result::get_ptx(prog)
                .map(|p| Compiled {
                    ptx: CString::new(c_chars_to_string(&p)).expect("PTX text holds no NUL"),
                    log: log.clone(),
                })
                .map_err(|e| format!("{}: nvrtcGetPTX: {e:?}", src.name)),
            Err(e) => Err(format!(
                "{} for compute_{}{}: {e:?}\n{log}",
                src.name, arch.0, arch.1
            )),
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// NVRTC returns NUL-terminated `c_char` buffers.
fn c_chars_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().trim().to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_listed_once_and_has_kernels() {
        let mut names: Vec<&str> = SOURCES.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SOURCES.len());
        for s in SOURCES {
            assert!(s.text.contains("extern \"C\" __global__"), "{}", s.name);
        }
    }

    #[test]
    fn the_program_starts_with_the_common_helpers_and_resets_line_numbers() {
        let p = program_text(&GDN);
        assert!(p.starts_with("#line 1 \"common.cuh\""));
        assert!(p.contains("#line 1 \"gdn.cu\"\n// Gated DeltaNet"));
        assert_eq!(
            options((12, 1))[0],
            "--gpu-architecture=compute_121",
            "GB10 is compute capability 12.1"
        );
    }
}

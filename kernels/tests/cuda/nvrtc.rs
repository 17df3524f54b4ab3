//! Every CUDA source compiles with NVRTC to PTX for compute capability 8.0, 9.0 and 12.1, with
//! no warnings — no GPU needed, only the NVRTC library (`ci/backends/test.sh` installs NVIDIA's
//! `nvidia-cuda-nvrtc` wheel into a venv and puts it on LD_LIBRARY_PATH).
//!
//! Without the library the test says so and passes, unless `CUDA_NVRTC_REQUIRED=1` (set by CI,
//! where the library is always installed), which turns a missing library into a failure.

use kernels::cuda::sources::{self, SOURCES, TESTED_ARCHS};

#[test]
fn every_kernel_source_compiles_cleanly_for_every_tested_arch() {
    if !sources::nvrtc_present() {
        let msg = "NVRTC (libnvrtc.so.13) is not on the library path: CUDA kernels NOT compiled. \
                   Run `bash ci/backends/test.sh`, or `bash ci/cuda/setup.sh` and put the lib \
                   directory it prints on LD_LIBRARY_PATH";
        if std::env::var("CUDA_NVRTC_REQUIRED").is_ok_and(|v| v == "1") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
        return;
    }
    let mut failures = Vec::new();
    for arch in TESTED_ARCHS {
        for src in SOURCES {
            match sources::compile(&src, arch) {
                Ok(c) => {
                    let ptx = c.ptx.to_string_lossy();
                    let target = format!(".target sm_{}{}", arch.0, arch.1);
                    assert!(
                        ptx.contains(&target),
                        "{} for {arch:?}: PTX lacks `{target}`",
                        src.name
                    );
                    let kernels = ptx.matches(".entry ").count();
                    eprintln!(
                        "ok   {:<16} compute_{}{}  {kernels} kernels, {} bytes of PTX",
                        src.name,
                        arch.0,
                        arch.1,
                        ptx.len()
                    );
                    if !c.log.is_empty() {
                        failures.push(format!(
                            "{} for compute_{}{}: warnings:\n{}",
                            src.name, arch.0, arch.1, c.log
                        ));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "NVRTC:\n{}", failures.join("\n---\n"));
}

/// A kernel with an error is reported with NVRTC's message naming the file and line (so the
/// test above can fail, and says where).
#[test]
fn a_broken_kernel_fails_with_the_file_and_line() {
    if !sources::nvrtc_present() {
        eprintln!("SKIPPED: NVRTC not on the library path");
        return;
    }
    let broken = sources::Source {
        name: "broken.cu",
        text: "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n",
    };
    let err = match sources::compile(&broken, (9, 0)) {
        Ok(_) => panic!("a kernel using an undefined name compiled"),
        Err(e) => e,
    };
    assert!(err.contains("broken.cu(2)"), "{err}");
    assert!(err.contains("undefined_name"), "{err}");
}

/// NVRTC's warnings reach the log the first test fails on.
#[test]
fn warnings_reach_the_log() {
    if !sources::nvrtc_present() {
        eprintln!("SKIPPED: NVRTC not on the library path");
        return;
    }
    let noisy = sources::Source {
        name: "noisy.cu",
        text: "extern \"C\" __global__ void k(float* x) {\n  int unused;\n  x[0] = 1.0f;\n}\n",
    };
    let c = sources::compile(&noisy, (9, 0)).expect("compiles");
    assert!(c.log.contains("noisy.cu(2)"), "log: {:?}", c.log);
}

//! Builds mlx-c against the MLX library shipped in PyPI's MLX wheel and generates its bindings.
//!
//! Inputs (all optional; `ci/mlx/setup.sh` prepares the defaults):
//! - `MLX_C_DIR`: mlx-c's source tree. Default: `src/mlx-c` of the published mlx-sys 0.7.0 in
//!   the cargo registry (`cargo fetch` of a throwaway manifest puts it there).
//! - `MLX_CMAKE_DIR`: the wheel's prefix (`python -m mlx --cmake-dir`). Default: asked of
//!   `MLX_PYTHON`, else of `<workspace>/target/mlx-venv/bin/python`.
//! - `CMAKE`: the cmake binary. Default: the venv's `bin/cmake` when present, else `cmake`.
//! - `MLX_SYS_BINDINGS_ONLY=1`: generate bindings only, build and link nothing. Also chosen
//!   for the `metal` feature on non-Apple targets, so `cargo check --features metal` type-checks
//!   Metal-only code on Linux (such a build cannot link).
//! - feature `cuda`: the prefix is MLX's CUDA wheel (`mlx-cuda-13`). Its `MLXConfig.cmake`
//!   requires the CUDA toolkit and cuDNN before it will describe libmlx, yet mlx-c includes no
//!   CUDA header and links nothing of either: those two lookups are answered by stubs written
//!   to OUT_DIR (a `FindCUDAToolkit.cmake` and an empty cuDNN tree), so mlx-c configures with or
//!   without a toolkit. libmlx finds its real CUDA libraries at run time through its own RPATH
//!   (the `nvidia-*` wheels beside it) and the driver's `libcuda.so.1`.
//!
//! Output for dependents (`DEP_MLX_*` in their build scripts): `LIBDIR`, the directory holding
//! `libmlx`, which binaries need as an rpath; Cargo cannot add it for them.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_C_VERSION: &str = "0.7.0";

fn main() {
    for var in [
        "MLX_C_DIR",
        "MLX_CMAKE_DIR",
        "MLX_PYTHON",
        "CMAKE",
        "MLX_SYS_BINDINGS_ONLY",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=shim");
    println!("cargo::rustc-check-cfg=cfg(mlx_sys_half_shim)");
    if let Err(e) = run() {
        // A build script's panic message is what the user sees; make it the actionable part.
        panic!("\n\nmlx-sys: {e}\n\n");
    }
}

fn run() -> Result<(), String> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let vendor = env::var("CARGO_CFG_TARGET_VENDOR").unwrap_or_default();
    let apple = vendor == "apple";
    let metal = env::var_os("CARGO_FEATURE_METAL").is_some();

    let mlx_c = mlx_c_dir()?;
    println!("cargo:rerun-if-changed={}", mlx_c.join("mlx/c").display());
    let shim = manifest.join("shim");
    // Off aarch64, mlx-c's half.h declares no float16/bfloat16 types; ours replaces it.
    let half_shim = arch != "aarch64";
    if half_shim {
        println!("cargo:rustc-cfg=mlx_sys_half_shim");
    }

    let bindings_only =
        env::var("MLX_SYS_BINDINGS_ONLY").is_ok_and(|v| v == "1") || (metal && !apple);
    if bindings_only {
        println!(
            "cargo:warning=mlx-sys: bindings-only mode (nothing built or linked){}",
            if metal && !apple {
                ": the metal feature needs macOS; this build type-checks but cannot link"
            } else {
                ""
            }
        );
    } else {
        build_mlx_c(&mlx_c, &shim, half_shim, apple, &manifest)?;
    }
    generate_bindings(&mlx_c, &shim, half_shim, &out)
}

/// mlx-c's sources: `MLX_C_DIR`, or the published mlx-sys crate's copy in the cargo registry.
fn mlx_c_dir() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("MLX_C_DIR") {
        let dir = PathBuf::from(dir);
        return if dir.join("mlx/c/mlx.h").exists() {
            Ok(dir)
        } else {
            Err(format!(
                "MLX_C_DIR={} does not hold mlx-c (no mlx/c/mlx.h)",
                dir.display()
            ))
        };
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set; set MLX_C_DIR to mlx-c's sources")?;
    let registry = cargo_home.join("registry/src");
    let crate_dir = format!("mlx-sys-{MLX_C_VERSION}");
    if let Ok(indexes) = fs::read_dir(&registry) {
        for index in indexes.flatten() {
            let dir = index.path().join(&crate_dir).join("src/mlx-c");
            if dir.join("mlx/c/mlx.h").exists() {
                return Ok(dir);
            }
        }
    }
    Err(format!(
        "mlx-c sources not found under {}/*/{crate_dir}/src/mlx-c. Run ci/mlx/setup.sh \
         (it fetches the published mlx-sys {MLX_C_VERSION} crate, which ships them), or set \
         MLX_C_DIR",
        registry.display()
    ))
}

/// The venv `ci/mlx/setup.sh` creates: `<workspace>/target/mlx-venv`.
fn default_venv(manifest: &Path) -> PathBuf {
    manifest.join("../target/mlx-venv")
}

/// The MLX wheel's prefix, which holds `include/`, `lib/libmlx.*` and `share/cmake/MLX`.
fn mlx_prefix(manifest: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("MLX_CMAKE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let python = env::var_os("MLX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| default_venv(manifest).join("bin/python"));
    let output = Command::new(&python)
        .args(["-m", "mlx", "--cmake-dir"])
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} to locate the MLX wheel ({e}). Run ci/mlx/setup.sh, or set \
                 MLX_CMAKE_DIR to the output of `python -m mlx --cmake-dir`",
                python.display()
            )
        })?;
    if !output.status.success() {
        return Err(format!(
            "`{} -m mlx --cmake-dir` failed: {}. Install the MLX wheel (ci/mlx/setup.sh)",
            python.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim().to_string(),
    ))
}

fn build_mlx_c(
    mlx_c: &Path,
    shim: &Path,
    half_shim: bool,
    apple: bool,
    manifest: &Path,
) -> Result<(), String> {
    let prefix = mlx_prefix(manifest)?;
    if !prefix.join("share/cmake/MLX/MLXConfig.cmake").exists() {
        return Err(format!(
            "{} is not an MLX prefix (no share/cmake/MLX/MLXConfig.cmake)",
            prefix.display()
        ));
    }
    let libdir = prefix.join("lib");
    if env::var_os("CMAKE").is_none() {
        let venv_cmake = default_venv(manifest).join("bin/cmake");
        if venv_cmake.exists() {
            // The cmake crate reads CMAKE; this process is single-threaded here.
            env::set_var("CMAKE", venv_cmake);
        }
    }

    let mut cfg = cmake::Config::new(mlx_c);
    cfg.define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        .define("CMAKE_PREFIX_PATH", &prefix)
        // mlx-c is glue; a debug build of it buys nothing and the library it calls is Release.
        .profile("Release");
    if !apple {
        cfg.cxxflag(format!("-include{}", shim.join("format_shim.h").display()));
    }
    if half_shim {
        // The shim includes MLX's half types; cmake's compiler probe sees these flags too.
        cfg.cxxflag(format!("-I{}", prefix.join("include").display()));
        cfg.cxxflag(format!("-include{}", shim.join("half_x86.h").display()));
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let stubs = cuda_config_stubs()?;
        cfg.define("CMAKE_MODULE_PATH", stubs.join("cmake"))
            .define("CUDNN_INCLUDE_PATH", stubs.join("include"))
            .define("CUDNN_LIBRARY_PATH", stubs.join("lib"));
    }
    let dst = cfg.build();

    for lib in ["lib", "lib64"] {
        println!("cargo:rustc-link-search=native={}", dst.join(lib).display());
    }
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!(
        "cargo:rustc-link-lib=dylib={}",
        if apple { "c++" } else { "stdc++" }
    );
    // Dependents add this as an rpath to their binaries (see kernels/build.rs).
    println!("cargo:libdir={}", libdir.display());
    // Our own tests and examples.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", libdir.display());
    Ok(())
}

/// What MLX's CUDA `MLXConfig.cmake` looks up before it describes libmlx: a CUDA toolkit
/// (`find_dependency(CUDAToolkit)`, answered by our `FindCUDAToolkit.cmake`, which defines the
/// `CUDA::cuda_driver` target libmlx's import names) and cuDNN 9 (MLX's own `FindCUDNN.cmake`,
/// pointed at a header carrying only the major version and empty library files). Nothing here
/// is compiled against or linked.
fn cuda_config_stubs() -> Result<PathBuf, String> {
    let root = PathBuf::from(env::var("OUT_DIR").unwrap()).join("cuda-config-stubs");
    let write = |rel: &str, text: &str| -> Result<(), String> {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap())
            .and_then(|_| fs::write(&path, text))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write(
        "cmake/FindCUDAToolkit.cmake",
        "# Stub written by mlx-sys/build.rs: mlx-c needs no CUDA toolkit (see there).\n\
         set(CUDAToolkit_FOUND TRUE)\n\
         set(CUDAToolkit_VERSION_MAJOR 13)\n\
         set(CUDAToolkit_INCLUDE_DIRS \"\")\n\
         set(CUDAToolkit_LIBRARY_DIR \"\")\n\
         if(NOT TARGET CUDA::cuda_driver)\n\
         \x20 add_library(CUDA::cuda_driver INTERFACE IMPORTED)\n\
         endif()\n",
    )?;
    write("include/cudnn.h", "/* stub: see mlx-sys/build.rs */\n")?;
    write(
        "include/cudnn_version.h",
        "/* stub: see mlx-sys/build.rs */\n#define CUDNN_MAJOR 9\n",
    )?;
    for lib in ["cudnn", "cudnn_graph", "cudnn_engines_runtime_compiled"] {
        write(&format!("lib/lib{lib}.so"), "")?;
    }
    Ok(root)
}

fn generate_bindings(mlx_c: &Path, shim: &Path, half_shim: bool, out: &Path) -> Result<(), String> {
    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .map_err(|e| format!("cannot list {}: {e}", mlx_c.join("mlx/c").display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    let mut builder = bindgen::Builder::default()
        .rust_target("1.73.0".parse().map_err(|e| format!("{e:?}"))?)
        .clang_arg(format!("-I{}", mlx_c.display()))
        // Rust declares these itself and they clash with bindgen's `c_ulong` sizes.
        .blocklist_function("malloc")
        .blocklist_function("realloc");
    if half_shim {
        builder = builder
            .clang_arg(format!("-include{}", shim.join("half_x86.h").display()))
            .blocklist_type("float16_t")
            .blocklist_type("bfloat16_t");
    }
    for h in &headers {
        builder = builder.header(h.to_string_lossy());
    }
    let bindings = builder.generate().map_err(|e| {
        format!(
            "bindgen failed on mlx-c's headers ({e}). bindgen needs libclang: on Debian/Ubuntu \
             `apt-get install libclang-dev`, or set LIBCLANG_PATH"
        )
    })?;
    bindings
        .write_to_file(out.join("bindings.rs"))
        .map_err(|e| format!("cannot write bindings: {e}"))
}

//! Under the `mlx` feature, adds an rpath to the MLX wheel's `lib/` (mlx-sys publishes it as
//! DEP_MLX_LIBDIR), so the harness binaries and tests find `libmlx` at run time.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if std::env::var_os("CARGO_FEATURE_MLX").is_some() {
        if let Some(dir) = std::env::var_os("DEP_MLX_LIBDIR") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
        }
    }
}

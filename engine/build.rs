//! Only the `mlx` feature needs this: binaries that link MLX must find the wheel's `libmlx` at
//! run time, and only the crate that builds them can add the rpath (mlx-sys publishes the
//! directory as DEP_MLX_LIBDIR). Without the feature it does nothing.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if std::env::var_os("CARGO_FEATURE_MLX").is_none() {
        return;
    }
    if let Some(dir) = std::env::var_os("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
}

//! The CPU's two arithmetic paths for products with weights:
//! - `exact` (the default): activations stay f32, every product is an f32 product; the path the
//!   goldens, parity and the oracle were made on;
//! - `fast`: products with 4-bit affine weights in groups of 64 quantize the activations to
//!   int8 per group of 64 (scale = max|x| / 127, round half to even) and sum integer products,
//!   as llama.cpp's Q8 activations do: decode shapes in `qmatvec_q8`, prefill in `qgemm_q8`.
//!   Its results differ from `exact` (its own goldens, key `numerics=fast`; against mlx-lm it
//!   holds the top-5 walk with top-1 log-probs within 1 nat), but not between instruction
//!   sets: the integer sums are exact, and the float steps after them run in one fixed order
//!   on every ISA (VNNI, AVX2 and portable code give the same bits). Dense bf16 weights meet
//!   activations rounded to bf16, their pairs summed as AVX-512 BF16's `vdpbf16ps` sums them
//!   (its DAZ/FTZ emulated where it is missing): prefill in `bgemm_bf16`, decode in
//!   `bmatvec_bf16`. Other weight formats run as in `exact`.
//!
//! On the MLX backend the same switch picks MLX's two modes (`mlx::ops::native`): `exact` runs
//! in f32, `fast` keeps weights in their stored dtype with activations in it, as mlx-lm runs.
//!
//! The path is a value in [`crate::Settings`], handed to [`crate::run`] with each
//! forward and read once per op on the thread that runs it, so two requests on two threads may
//! use different paths.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Numerics {
    #[default]
    Exact,
    Fast,
}

impl Numerics {
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Fast => "fast",
        }
    }

    /// This thread's path.
    pub fn current() -> Numerics {
        CURRENT.with(Cell::get)
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Numerics {
    type Err = String;
    fn from_str(s: &str) -> Result<Numerics, String> {
        match s.trim() {
            "exact" => Ok(Numerics::Exact),
            "fast" => Ok(Numerics::Fast),
            other => Err(format!(
                "unknown CPU numerics {other:?} (valid: exact, fast)"
            )),
        }
    }
}

thread_local! {
    static CURRENT: Cell<Numerics> = const { Cell::new(Numerics::Exact) };
}

/// Runs `f` with this thread's CPU kernels on path `n`, restoring the previous path afterwards
/// (even if `f` panics).
pub(crate) fn with<R>(n: Numerics, f: impl FnOnce() -> R) -> R {
    struct Restore(Numerics);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(n)));
    f()
}

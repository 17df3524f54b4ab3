//! How the kernels compute, as a value the caller hands to every forward: the CPU numerics
//! path (see [`crate::numerics`]) and an instruction-set cap (see [`crate::cpu::isa`]). The
//! engine keeps one in each sequence's state and passes it to [`crate::run`].
//!
//! Inside this crate the value travels as a thread-local for the duration of [`crate::run`], and only
//! there: a forward runs on a pool worker (see [`crate::cpu::pool`]), its ops are hundreds of
//! calls deep, and each CPU kernel reads the two settings once per op on the worker that runs
//! it. Setting them on that worker for the span of one forward keeps every op's signature
//! free of them, and two forwards on two threads can still use different settings.

use std::fmt;
use std::str::FromStr;

use crate::cpu::isa;
use crate::numerics::{self, Numerics};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    /// `exact` (the default) or `fast`; MLX reads it too (`fast` runs in the stored dtype).
    pub numerics: Numerics,
    /// The highest instruction set the CPU kernels may use (`None`: what the machine has, or
    /// the `KERNELS_ISA` environment cap).
    pub isa_cap: Option<IsaCap>,
}

impl Settings {
    pub fn with_numerics(numerics: Numerics) -> Settings {
        Settings {
            numerics,
            ..Settings::default()
        }
    }
}

/// A level of [`isa::LEVELS`] (`portable`, `avx2`, … on x86-64; `neon`, … on aarch64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsaCap(usize);

impl FromStr for IsaCap {
    type Err = String;
    fn from_str(s: &str) -> Result<IsaCap, String> {
        isa::parse_level(s).map(IsaCap)
    }
}

impl fmt::Display for IsaCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(isa::LEVELS.get(self.0).copied().unwrap_or("native"))
    }
}

/// Runs `f` on this thread with `settings` in force, restoring the previous ones afterwards.
pub(crate) fn install<R>(settings: Settings, f: impl FnOnce() -> R) -> R {
    let cap = settings.isa_cap.map(|c| c.0);
    isa::with_thread_cap(cap, || numerics::with(settings.numerics, f))
}

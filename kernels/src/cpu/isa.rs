//! Which instruction set the CPU kernels use, decided at run time (never at build time: one
//! binary serves every machine of a kind, and machines of one kind differ).
//!
//! The CPU's features are detected once. `ENGINE_CPU_ISA` caps them at a named level, so a
//! machine with AVX-512 can measure and test its AVX2 path too; a `Settings::isa_cap` does the
//! same for one forward (tests run both paths in one process). Kernels read [`Isa::current`] once per op,
//! on the calling thread, and hand it to their workers, so a cap applies to the whole op.
//!
//! Levels, lowest first (each includes those before it):
//! - x86-64: `portable`, `avx2` (AVX2 + FMA), `avx512` (F, BW, VL), `avx512vnni` (+ VNNI),
//!   `avx512bf16` (+ BF16);
//! - aarch64: `portable`, `neon`, `dotprod`, `i8mm`.
//!
//! `native` (or an unset variable) means no cap.

use std::cell::Cell;
use std::sync::OnceLock;

/// The environment variable that caps the instruction set.
pub const ENV: &str = "ENGINE_CPU_ISA";

/// The level names this architecture accepts, lowest first.
#[cfg(target_arch = "x86_64")]
pub const LEVELS: &[&str] = &["portable", "avx2", "avx512", "avx512vnni", "avx512bf16"];
#[cfg(target_arch = "aarch64")]
pub const LEVELS: &[&str] = &["portable", "neon", "dotprod", "i8mm"];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const LEVELS: &[&str] = &["portable"];

/// The levels of [`LEVELS`] this CPU reaches, lowest first. A cap above them changes nothing, so
/// a test that walks these is all a machine can exercise: on an AVX2-only host the AVX-512
/// kernels are not run, whatever the test's name says.
pub fn levels_here() -> &'static [&'static str] {
    let top = LEVELS
        .iter()
        .position(|&l| l == Isa::detected().name())
        .unwrap_or(0);
    &LEVELS[..=top]
}

/// One line for logs: the levels [`levels_here`] covers and those this CPU cannot run.
pub fn coverage() -> String {
    let here = levels_here();
    let missing = &LEVELS[here.len()..];
    let mut line = format!(
        "instruction-set levels run on this CPU: {}",
        here.join(", ")
    );
    if !missing.is_empty() {
        line += &format!(" (not run here: {})", missing.join(", "));
    }
    line
}

/// The features kernels may use: what the CPU has, less what the cap removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Isa {
    /// x86-64: AVX2, FMA and F16C.
    pub avx2: bool,
    /// x86-64: AVX-512 F, BW and VL.
    pub avx512: bool,
    /// x86-64: AVX-512 VNNI (`vpdpbusd`, u8 × i8 dot products).
    pub vnni: bool,
    /// x86-64: AVX-512 BF16 (`vdpbf16ps`).
    pub bf16: bool,
    /// x86-64: `vdpbf16ps` does fewer multiply-adds per cycle than two AVX-512 FMAs, so the bf16
    /// GEMM emulates it with FMAs (same bits). Intel's cores issue it at half an instruction per
    /// cycle against two FMAs (measured on Sapphire Rapids: 16 against 32 multiply-adds per
    /// cycle); AMD's Zen 4 issues it as fast as an FMA. A speed choice only, never a numerics one.
    pub bf16_dot_slow: bool,
    /// aarch64: Advanced SIMD.
    pub neon: bool,
    /// aarch64: `sdot`/`udot`.
    pub dotprod: bool,
    /// aarch64: `smmla` and friends.
    pub i8mm: bool,
}

impl Isa {
    /// Everything the CPU has, uncapped.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// What kernels should use now: detected, capped by `ENGINE_CPU_ISA` and by this thread's
    /// [`with_cap`].
    pub fn current() -> Isa {
        let mut isa = Isa::detected().capped(env_level());
        if let Some(level) = THREAD_CAP.with(Cell::get) {
            isa = isa.capped(level);
        }
        isa
    }

    /// The highest level this set reaches, by name (for reports and `--help`).
    pub fn name(&self) -> &'static str {
        let reached = [
            true,
            self.avx2 || self.neon,
            self.avx512 || self.dotprod,
            self.vnni || self.i8mm,
            self.bf16,
        ];
        let top = reached.iter().take_while(|&&r| r).count() - 1;
        LEVELS[top.min(LEVELS.len() - 1)]
    }

    /// Drops every feature above `level` (an index into [`LEVELS`]).
    fn capped(mut self, level: usize) -> Isa {
        let keep = |rank: usize| level >= rank;
        self.avx2 &= keep(1);
        self.avx512 &= keep(2) && self.avx2;
        self.vnni &= keep(3) && self.avx512;
        self.bf16 &= keep(4) && self.vnni;
        self.bf16_dot_slow &= self.bf16;
        self.neon &= keep(1);
        self.dotprod &= keep(2) && self.neon;
        self.i8mm &= keep(3) && self.dotprod;
        self
    }
}

fn detect() -> Isa {
    #[allow(unused_mut)]
    let mut isa = Isa::default();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        // Every AVX2 CPU also has F16C; kernels at this level use it for f16 scales.
        isa.avx2 = has!("avx2") && has!("fma") && has!("f16c");
        isa.avx512 = isa.avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        isa.vnni = isa.avx512 && has!("avx512vnni");
        isa.bf16 = isa.vnni && has!("avx512bf16");
        isa.bf16_dot_slow = isa.bf16 && is_intel();
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        isa.neon = has!("neon");
        isa.dotprod = isa.neon && has!("dotprod");
        isa.i8mm = isa.dotprod && has!("i8mm");
    }
    isa
}

/// Whether the CPU's vendor string is Intel's.
#[cfg(target_arch = "x86_64")]
fn is_intel() -> bool {
    let r = std::arch::x86_64::__cpuid(0);
    [r.ebx, r.edx, r.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e] // "Genu" "ineI" "ntel"
}

/// The index in [`LEVELS`] that `name` names; `native` is the top.
pub fn parse_level(name: &str) -> Result<usize, String> {
    let name = name.trim().to_ascii_lowercase();
    if name == "native" {
        return Ok(LEVELS.len() - 1);
    }
    LEVELS.iter().position(|&l| l == name).ok_or_else(|| {
        format!(
            "{ENV}={name:?} is not an instruction-set level of this CPU architecture; valid: native, {}",
            LEVELS.join(", ")
        )
    })
}

/// The cap `ENGINE_CPU_ISA` sets, checked: front ends call this at start-up so a misspelt level
/// is an error rather than a silently uncapped run.
pub fn env_cap() -> Result<Option<usize>, String> {
    match std::env::var(ENV) {
        Ok(v) if !v.trim().is_empty() => parse_level(&v).map(Some),
        _ => Ok(None),
    }
}

fn env_level() -> usize {
    static LEVEL: OnceLock<usize> = OnceLock::new();
    *LEVEL.get_or_init(|| match env_cap() {
        Ok(level) => level.unwrap_or(LEVELS.len() - 1),
        Err(e) => {
            eprintln!("warning: {e}; using the native level");
            LEVELS.len() - 1
        }
    })
}

thread_local! {
    static THREAD_CAP: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `f` with kernels on this thread capped at `level` (a name from [`LEVELS`] or
/// `native`), restoring the previous cap afterwards, even if `f` panics.
#[cfg(test)]
pub(crate) fn with_cap<R>(level: &str, f: impl FnOnce() -> R) -> Result<R, String> {
    Ok(with_thread_cap(Some(parse_level(level)?), f))
}

/// Runs `f` with this thread's cap set to `level` (`None`: no cap but the environment's),
/// restoring the previous cap afterwards, even if `f` panics.
pub(crate) fn with_thread_cap<R>(level: Option<usize>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_CAP.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(THREAD_CAP.with(|c| c.replace(level)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_ordered_and_named() {
        #[cfg(target_arch = "x86_64")]
        {
            let all = Isa {
                avx2: true,
                avx512: true,
                vnni: true,
                bf16: true,
                ..Isa::default()
            };
            assert_eq!(all.name(), "avx512bf16");
            assert_eq!(all.capped(0), Isa::default());
            assert_eq!(all.capped(1).name(), "avx2");
            assert!(!all.capped(2).vnni && all.capped(2).avx512);
            assert_eq!(all.capped(3).name(), "avx512vnni");
        }
        #[cfg(target_arch = "aarch64")]
        {
            let all = Isa {
                neon: true,
                dotprod: true,
                i8mm: true,
                ..Isa::default()
            };
            assert_eq!(all.name(), "i8mm");
            assert_eq!(all.capped(0), Isa::default());
            assert_eq!(all.capped(1).name(), "neon");
            assert!(!all.capped(1).dotprod && all.capped(2).dotprod && !all.capped(2).i8mm);
        }
        assert!(parse_level("AVX9000")
            .unwrap_err()
            .contains("valid: native"));
        assert_eq!(parse_level("native"), Ok(LEVELS.len() - 1));
    }

    #[test]
    fn thread_cap_applies_and_restores() {
        let before = Isa::current();
        let inside = with_cap("portable", Isa::current).unwrap();
        assert_eq!(inside.name(), "portable");
        assert_eq!(Isa::current(), before);
        assert!(with_cap("nope", || ()).is_err());
    }
}

//! Running a whole forward pass on a rayon worker.
//!
//! A parallel loop started from a thread outside rayon's pool hands its job to the pool and
//! sleeps on a lock until a worker finishes it: two thread hand-offs per loop. A decode step
//! runs hundreds of such loops (one per matmul, norm and attention call), and on a small
//! machine those hand-offs cost a fifth of the step. Started from a worker, a loop runs its
//! first half on the calling thread and leaves the rest for the other workers to steal, which
//! they do while still spinning from the previous loop. So the forward pass moves into the
//! pool once, and its loops start there.
//!
//! The kernels read the caller's [`Settings`] (the ISA cap and the numerics path) on the
//! worker that runs them; they are set there for the span of the work (see
//! [`crate::settings`]). Results do not depend on which thread runs them (see the module docs
//! of [`super`]).

use crate::settings::{install, Settings};
use crate::Device;

/// Runs `f`, one forward of a model whose weights live on `device`, with `settings`: on the
/// CPU kernels' worker pool for the host; other devices keep it on the calling thread, which
/// their contexts are bound to.
pub fn run<R: Send>(device: Device, settings: Settings, f: impl FnOnce() -> R + Send) -> R {
    if device == Device::Cpu {
        on_pool(settings, f)
    } else {
        install(settings, f)
    }
}

/// Runs `f` on a worker of rayon's global pool (directly when this thread already is one),
/// with `settings` in force.
pub fn on_pool<R: Send>(settings: Settings, f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return install(settings, f);
    }
    // `scope` runs its body on a worker of the global pool and waits for it.
    rayon::scope(move |_| install(settings, f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::isa::{self, Isa};
    use crate::numerics::Numerics;

    /// The work sees the settings it was given, though it runs on another thread, and the
    /// caller's own are untouched.
    #[test]
    fn the_settings_reach_the_worker() {
        let caller = std::thread::current().id();
        let settings = Settings {
            numerics: Numerics::Fast,
            isa_cap: Some("portable".parse().unwrap()),
        };
        let (thread, isa, path) = on_pool(settings, || {
            (
                std::thread::current().id(),
                Isa::current(),
                Numerics::current(),
            )
        });
        assert_ne!(thread, caller, "the work should run on a pool worker");
        assert_eq!(isa, isa::with_cap("portable", Isa::current).unwrap());
        assert_eq!(path, Numerics::Fast);
        assert_eq!(Numerics::current(), Numerics::Exact);
    }
}

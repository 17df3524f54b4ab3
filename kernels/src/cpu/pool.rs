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
//! The kernels read two per-thread settings (the ISA cap and the numerics path) on the
//! calling thread; they are carried over to the worker, so the work runs exactly as it would
//! have on the caller. Results do not depend on which thread runs them (see the module docs
//! of [`super`]).

use super::isa;
use crate::numerics;

/// Runs `f` on a worker of rayon's global pool (directly when this thread already is one),
/// with this thread's ISA cap and numerics path.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let (cap, path) = (isa::thread_cap(), numerics::Numerics::current());
    // `scope` runs its body on a worker of the global pool and waits for it.
    rayon::scope(move |_| isa::with_thread_cap(cap, || numerics::with(path, f)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::isa::Isa;
    use crate::numerics::Numerics;

    /// The work sees the caller's ISA cap and numerics path, though it runs on another thread.
    #[test]
    fn the_callers_settings_travel_to_the_worker() {
        let caller = std::thread::current().id();
        isa::with_cap("portable", || {
            numerics::with(Numerics::Fast, || {
                let (thread, isa, path) = on_pool(|| {
                    (
                        std::thread::current().id(),
                        Isa::current(),
                        Numerics::current(),
                    )
                });
                assert_ne!(thread, caller, "the work should run on a pool worker");
                assert_eq!(isa, Isa::current());
                assert_eq!(path, Numerics::Fast);
            })
        })
        .unwrap();
    }
}

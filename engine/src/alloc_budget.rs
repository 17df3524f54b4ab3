//! A memory budget for work that untrusted input drives: chat templates from checkpoint folders.
//!
//! An instruction budget (minijinja's fuel) does not bound memory: `{% set s = s ~ s %}` in a
//! loop of 40 steps is 160 instructions and a terabyte of string. minijinja has no hook on the
//! size of the strings it builds, so the bound is kept where every byte passes: the global
//! allocator. [`BudgetAlloc`] (the engine's global allocator under the default feature
//! `alloc-budget`) charges each allocation of a thread that runs under [`run_within`] to that
//! thread's budget, and threads outside it pay one thread-local read per allocation.
//!
//! An allocator cannot fail gracefully: Rust aborts the process when one returns null, and it
//! must not unwind. So the budgeted work runs on a thread of its own, and an allocation past the
//! budget never returns: it tells the waiting caller, which returns an error, and parks that
//! thread for good. The parked thread keeps what it had allocated (at most the budget) and its
//! stack; the process lives on with memory bounded, which is the point. Work run this way must
//! not hold a lock another thread needs while it allocates (a parked holder would never release
//! it): a template render touches only its own state. A panicking thread is let through (it may
//! hold the output lock while it prints its message).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;

/// The system allocator, charging budgeted threads (see the module docs).
pub struct BudgetAlloc;

/// `LEFT`'s value on a thread with no budget.
const UNLIMITED: usize = usize::MAX;

thread_local! {
    /// Bytes this thread may still allocate (net of what it frees), or [`UNLIMITED`].
    static LEFT: Cell<usize> = const { Cell::new(UNLIMITED) };
    /// The run to tell when this thread goes over its budget.
    static RUN: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
}

fn charge(bytes: usize) {
    // `try_with`: a thread being torn down may still free; it is never budgeted by then.
    let over = LEFT
        .try_with(|left| {
            let l = left.get();
            if l == UNLIMITED {
                return false;
            }
            if bytes > l {
                // A panicking thread is printing its message, perhaps holding the lock of the
                // test harness's capture buffer: stopping it there would stop whoever waits on
                // that lock too. Let it finish; the unwinding ends the budgeted work anyway.
                if std::thread::panicking() {
                    left.set(0);
                    return false;
                }
                return true;
            }
            left.set(l - bytes);
            false
        })
        .unwrap_or(false);
    if over {
        over_budget();
    }
}

fn refund(bytes: usize) {
    let _ = LEFT.try_with(|left| {
        let l = left.get();
        if l != UNLIMITED {
            // Freeing memory from before the budget started may credit past the start.
            left.set(l.saturating_add(bytes).min(UNLIMITED - 1));
        }
    });
}

/// Stops this thread for good after telling its caller. Allocates nothing: everything it
/// touches was made before the budgeted work began.
fn over_budget() -> ! {
    LEFT.with(|l| l.set(UNLIMITED));
    let run = RUN.with(Cell::get);
    if !run.is_null() {
        // SAFETY: the `Arc<Shared>` this points into is held by this thread's closure, which
        // never returns from here, so it outlives the pointer.
        let run = unsafe { &*run };
        run.state.store(OVER, Ordering::Release);
        run.caller.unpark();
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

// SAFETY: every method forwards to `System` with the same arguments; the budget bookkeeping
// only reads and writes this thread's cells, and `charge` either returns or never returns
// (it does not unwind).
unsafe impl GlobalAlloc for BudgetAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        refund(layout.size());
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            refund(layout.size() - new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}

const RUNNING: u8 = 0;
const DONE: u8 = 1;
const OVER: u8 = 2;

struct Shared {
    state: AtomicU8,
    caller: Thread,
}

/// Why [`run_within`] gave no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The work allocated more than its budget (net) and was stopped.
    OverBudget,
    /// The work panicked (the panic message went to stderr).
    Panicked,
    /// No thread could be started for it.
    NoThread,
}

/// Whether [`BudgetAlloc`] is the process's global allocator (it is under the engine's
/// default feature `alloc-budget`; a program that links the engine with its own allocator
/// turns that feature off, and budgets then cannot be kept).
pub fn enforced() -> bool {
    static ENFORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENFORCED.get_or_init(|| {
        const PROBE: usize = 1 << 40;
        LEFT.with(|l| l.set(PROBE));
        let probe = std::hint::black_box(Box::new(0u64));
        let charged = LEFT.with(Cell::get) != PROBE;
        LEFT.with(|l| l.set(UNLIMITED));
        drop(probe);
        charged
    })
}

/// Runs `work` on a thread of its own whose allocations, net of what it frees, may not exceed
/// `bytes`. Past that the work is stopped and [`Stopped::OverBudget`] returned (its thread stays
/// parked, holding at most `bytes`). Where the budget cannot be enforced (see [`enforced`]) the
/// work runs without one.
pub fn run_within<R: Send + 'static>(
    bytes: usize,
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, Stopped> {
    if !enforced() {
        return Ok(work());
    }
    let shared = Arc::new(Shared {
        state: AtomicU8::new(RUNNING),
        caller: std::thread::current(),
    });
    let slot: Arc<Mutex<Option<R>>> = Arc::new(Mutex::new(None));
    let (in_thread, out) = (Arc::clone(&shared), Arc::clone(&slot));
    let spawned = std::thread::Builder::new()
        .name("budgeted".into())
        .stack_size(8 << 20)
        .spawn(move || {
            RUN.with(|r| r.set(Arc::as_ptr(&in_thread)));
            LEFT.with(|l| l.set(bytes.min(UNLIMITED - 1)));
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            LEFT.with(|l| l.set(UNLIMITED));
            if let Ok(r) = result {
                *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            }
            in_thread.state.store(DONE, Ordering::Release);
            in_thread.caller.unpark();
        });
    let Ok(handle) = spawned else {
        return Err(Stopped::NoThread);
    };
    loop {
        match shared.state.load(Ordering::Acquire) {
            RUNNING => std::thread::park(),
            DONE => {
                let _ = handle.join();
                return slot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .ok_or(Stopped::Panicked);
            }
            _ => return Err(Stopped::OverBudget),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_within_its_budget_returns_and_work_past_it_is_stopped() {
        assert!(enforced(), "the test binary links the engine's allocator");
        // A megabyte under a 4 MiB budget: fine; the thread's budget is gone afterwards.
        let n = run_within(4 << 20, || vec![1u8; 1 << 20].len()).unwrap();
        assert_eq!(n, 1 << 20);
        // Doubling a string: stopped at the budget, long before the 2^40 bytes it asks for.
        let grown = run_within(4 << 20, || {
            let mut s = String::from("x");
            for _ in 0..40 {
                s = s.repeat(2);
            }
            s.len()
        });
        assert_eq!(grown, Err(Stopped::OverBudget));
        // Freeing returns budget: many short-lived megabytes under a 4 MiB budget.
        let total = run_within(4 << 20, || {
            (0..64).map(|_| vec![0u8; 1 << 20].len()).sum::<usize>()
        });
        assert_eq!(total, Ok(64 << 20));
        // This thread was never budgeted.
        assert_eq!(vec![0u8; 16 << 20].len(), 16 << 20);
    }

    #[test]
    fn a_panic_inside_is_reported_not_propagated() {
        let r = run_within(1 << 20, || -> usize { panic!("inside the budget") });
        assert_eq!(r, Err(Stopped::Panicked));
    }
}

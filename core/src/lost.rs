//! Errors with nobody left to report them to.
//!
//! A lease that fails while returning its handle parks the error in its pool
//! (`take_error`). Some errors have nobody to park with: those of a pool's own
//! drop (destroying what it pooled, or an error parked and never taken), of a
//! scratchpad's drop (releasing its blocks), and the second and later errors
//! of a scratchpad call that returns only its first (`release`, `reset`,
//! `to_contiguous_device`). Drops never panic; each such error is counted here,
//! process-wide, and handed to the hook set by [`set_lost_error_hook`], if any,
//! on the thread that met it.
//! Call the fallible form first where one exists
//! ([`Scratchpad::release`](crate::Scratchpad::release),
//! [`StreamPool::purge`](crate::StreamPool::purge),
//! [`EventPool::purge`](crate::EventPool::purge)) to get the errors as values.
//!
//! ```
//! use gpupool_core::{lost_errors, set_lost_error_hook, BackendOp, StreamPool};
//! use gpupool_mock::MockBackend;
//!
//! fn log(e: &dyn core::fmt::Display) {
//!     eprintln!("gpupool: {e:#}"); // `#`: with its causes
//! }
//! set_lost_error_hook(Some(log));
//!
//! let gpu = MockBackend::new(1);
//! let pool = StreamPool::new(gpu.clone());
//! drop(pool.get(0)?); // one idle stream, pooled
//! gpu.fail_nth(BackendOp::DestroyStream, 1);
//! let before = lost_errors();
//! drop(pool); // its destroy fails: handed to `log` and counted
//! assert_eq!(lost_errors(), before + 1);
//! assert_eq!(gpu.live_streams(), 1);
//! # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
//! ```
//!
//! The two statics are plain `core` atomics in every build (loom included):
//! they are process-wide, and a loom model would not reset them between its
//! executions.

use core::fmt;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// What [`set_lost_error_hook`] takes: called with each error a drop met.
///
/// The error is handed over as itself ([`Error`](crate::Error)), whose plain
/// `Display` stops at its own level (its cause is its `source()`, not part of
/// its message). Format it with `{:#}` to print the whole chain, each cause
/// once ("backend call DestroyStream failed: injected failure of a
/// DestroyStream call").
pub type LostErrorHook = fn(&dyn fmt::Display);

static LOST: AtomicUsize = AtomicUsize::new(0);
/// Null, or a [`LostErrorHook`] cast to a data pointer.
static HOOK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// How many errors, since the process started, had nobody to report them to:
/// those of a pool's own drop (destroying what it pooled, or a parked error
/// never taken), of a scratchpad's drop (releasing its blocks), and the second
/// and later errors of a scratchpad call that returns only its first. (A
/// lease's drop parks its error in its pool instead: `take_error`.) Call the fallible form first where one exists
/// ([`Scratchpad::release`](crate::Scratchpad::release),
/// [`StreamPool::purge`](crate::StreamPool::purge),
/// [`EventPool::purge`](crate::EventPool::purge)) to get such errors as values.
pub fn lost_errors() -> usize {
    // Relaxed: a tally; nothing is published with it.
    LOST.load(Ordering::Relaxed)
}

/// Sets the function called with each error a drop meets with no owner to
/// report it to (`None` removes it); returns the previous one. The hook runs on
/// the dropping thread, inside the drop. Under `std` a panic in the hook is
/// caught and ignored (drops never panic); without `std` the hook must not
/// panic.
pub fn set_lost_error_hook(hook: Option<LostErrorHook>) -> Option<LostErrorHook> {
    let p = hook.map_or(core::ptr::null_mut(), |f| f as *mut ());
    // AcqRel: Release publishes the new hook to `report`'s Acquire load; Acquire
    // pairs with the Release of whoever set the previous one.
    let old = HOOK.swap(p, Ordering::AcqRel);
    // SAFETY: HOOK holds only null or a `LostErrorHook` cast to `*mut ()` above.
    unsafe { as_hook(old) }
}

/// # Safety
/// `p` is null or a `LostErrorHook` cast to `*mut ()`.
unsafe fn as_hook(p: *mut ()) -> Option<LostErrorHook> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller guarantees `p` came from a `LostErrorHook`; a
        // function pointer round-trips through a data pointer of the same size.
        Some(unsafe { core::mem::transmute::<*mut (), LostErrorHook>(p) })
    }
}

/// Counts `e` and hands it to the hook. Never panics under `std`.
pub(crate) fn report(e: &dyn fmt::Display) {
    // Relaxed: a tally.
    LOST.fetch_add(1, Ordering::Relaxed);
    // Acquire: pairs with the Release in `set_lost_error_hook`.
    // SAFETY: HOOK holds only null or a `LostErrorHook` (see above).
    let Some(hook) = (unsafe { as_hook(HOOK.load(Ordering::Acquire)) }) else {
        return;
    };
    #[cfg(feature = "std")]
    {
        // A panicking hook must not unwind out of a drop.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(e)));
    }
    #[cfg(not(feature = "std"))]
    hook(e);
}

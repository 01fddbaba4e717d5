//! The one place that names atomics, `Arc`, `Mutex`, thread-locals and the
//! epoch crate.
//!
//! Everything else in the crate imports these through `crate::sync`, so a build
//! with `--cfg loom` swaps every shared-memory primitive, and the thread-locals
//! behind the per-thread caches, for loom's model-checked twins at once: the
//! code above this module has one body in every build, and the loom models run
//! the code that ships. crossbeam-epoch switches itself to loom when it is
//! built with its `loom` feature and `--cfg crossbeam_loom` (the loom-tests
//! crate sets both).

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

#[cfg(all(not(loom), target_has_atomic = "64"))]
pub(crate) use core::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;

// Only the `std` parts (the per-thread caches, the completion engine) use
// these.
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use core::sync::atomic::{fence, AtomicBool};
#[cfg(all(feature = "std", loom))]
pub(crate) use loom::sync::atomic::{fence, AtomicBool};

#[cfg(all(feature = "std", loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Declares thread-locals with constant initial values: `std`'s
/// `thread_local!` with `const` initializers (no lazy-initialization check on
/// access), or under `cfg(loom)` loom's, which gives each model thread its
/// own, made on first use and dropped when the thread ends (the main
/// thread's too), as the operating system's are. Without `std` there are no
/// thread-locals (the pools then have no per-thread caches, see
/// `thread_cache`).
#[cfg(feature = "std")]
macro_rules! const_thread_local {
    ($($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;)+) => {
        #[cfg(not(loom))]
        std::thread_local! { $($(#[$attr])* static $name: $t = const { $init };)+ }
        #[cfg(loom)]
        loom::thread_local! { $($(#[$attr])* static $name: $t = $init;)+ }
    };
}
#[cfg(feature = "std")]
pub(crate) use const_thread_local;

#[cfg(not(loom))]
pub(crate) use alloc::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

pub(crate) use crossbeam_epoch as epoch;

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's `with`/`with_mut` interface, so code
/// written against it is checked by loom under `cfg(loom)` and costs nothing
/// otherwise.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[inline]
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a shared-access pointer to the value.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with an exclusive-access pointer to the value.
    #[inline]
    #[allow(dead_code)] // part of loom's interface; not every build uses it
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Threads for the completion engine: `std`'s, or loom's under `cfg(loom)`
/// (where a timed park is a yield: loom has no clock).
#[cfg(feature = "std")]
pub(crate) mod thread {
    #[cfg(loom)]
    pub(crate) use loom::thread::{current, park, yield_now, Builder, JoinHandle, Thread};
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, park, park_timeout, Builder, JoinHandle, Thread};

    /// A timed park: loom cannot model time, so there it lets the other
    /// threads run instead.
    #[cfg(loom)]
    pub(crate) fn park_timeout(_: std::time::Duration) {
        yield_now();
    }
}

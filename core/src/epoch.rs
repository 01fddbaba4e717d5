//! How the pools pin crossbeam-epoch.
//!
//! A pool remembers the [`Collector`] its stacks retire nodes into. With `std`,
//! the default is crossbeam-epoch's global collector, pinned through its
//! thread-local handle (~13 ns), so `get()` needs no argument. Without `std`
//! there are no thread-locals: a runtime registers each worker once
//! ([`Collector::register`], ~450 ns) and passes the worker's guard to the
//! `*_in` calls, which check that the guard belongs to the pool's collector.

use crate::sync::epoch::{Collector, Guard};

/// The collector a pool's stacks use.
#[derive(Clone, Debug)]
pub(crate) struct Pinning {
    collector: Collector,
}

impl Pinning {
    /// Pins crossbeam-epoch's global collector.
    #[cfg(feature = "std")]
    pub(crate) fn global() -> Self {
        Pinning {
            collector: crate::sync::epoch::default_collector().clone(),
        }
    }

    /// Pins `collector`.
    pub(crate) fn with(collector: Collector) -> Self {
        Pinning { collector }
    }

    /// The collector.
    pub(crate) fn collector(&self) -> &Collector {
        &self.collector
    }

    /// Whether `guard` is pinned in this collector (the unprotected guard is not).
    #[inline]
    pub(crate) fn owns(&self, guard: &Guard) -> bool {
        guard.collector() == Some(&self.collector)
    }

    /// Pins the calling thread: through the thread-local handle for the global
    /// collector, or by registering a handle for this one call otherwise (slow;
    /// a runtime with its own collector should keep a handle per worker and use
    /// the `*_in` calls).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn pin<R>(&self, f: impl FnOnce(&Guard) -> R) -> R {
        if self.collector == *crate::sync::epoch::default_collector() {
            f(&crate::sync::epoch::pin())
        } else {
            let handle = self.collector.register();
            let guard = handle.pin();
            f(&guard)
        }
    }
}

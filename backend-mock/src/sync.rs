//! The one place that names `Arc` and `Mutex`.
//!
//! The rest of the crate imports them through `crate::sync`, so a build with
//! `--cfg loom` swaps them for loom's model-checked twins at once. The mock
//! keeps all of its state behind a single mutex, so it needs no atomics.
//!
//! Under loom, a [`MockBackend`](crate::MockBackend) must be created inside
//! `loom::model`, like every other loom object.

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// Locks `mutex`, recovering the data if a thread panicked while holding it.
///
/// The mock never panics while it holds its lock, so the state behind a
/// poisoned mutex is still consistent; a test thread that panicked elsewhere
/// must not turn every later call into a second panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

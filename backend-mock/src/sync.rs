//! The one place that names `Arc`, `RwLock` and the atomics.
//!
//! The rest of the crate imports them through `crate::sync`, so a build with
//! `--cfg loom` swaps them for loom's model-checked twins at once. The mock
//! keeps all of its state behind a single reader-writer lock: every call takes
//! it for writing, except the read-only backend calls' fast path (see
//! `MockBackend::read_call_on`), which takes it for reading and counts itself
//! in an atomic counter.
//!
//! Under loom, a [`MockBackend`](crate::MockBackend) must be created inside
//! `loom::model`, like every other loom object.

#[cfg(not(loom))]
pub(crate) use std::sync::{atomic::AtomicU64, Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(loom)]
pub(crate) use loom::sync::{atomic::AtomicU64, Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

// loom re-exports std's `Ordering`.
pub(crate) use std::sync::atomic::Ordering;

#[cfg(not(loom))]
pub(crate) use std::thread::ThreadId;

#[cfg(loom)]
pub(crate) use loom::thread::ThreadId;

/// The calling thread's id (loom's model thread under loom, whose threads
/// share one operating-system thread): what a thread-local capture mode
/// compares.
pub(crate) fn current_thread() -> ThreadId {
    #[cfg(not(loom))]
    return std::thread::current().id();
    #[cfg(loom)]
    return loom::thread::current().id();
}

/// Declares a thread-local `Cell<bool>` flag, false on every new thread:
/// per operating-system thread, or under loom per loom thread (and per
/// execution), since loom's threads share one operating-system thread.
macro_rules! thread_flag {
    ($(#[$doc:meta])* static $name:ident;) => {
        #[cfg(not(loom))]
        std::thread_local! {
            $(#[$doc])*
            static $name: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
        }

        #[cfg(loom)]
        loom::thread_local! {
            $(#[$doc])*
            static $name: core::cell::Cell<bool> = core::cell::Cell::new(false);
        }
    };
}
pub(crate) use thread_flag;

/// Locks `lock` for writing, recovering the data if a thread panicked while
/// holding it.
///
/// The mock never panics while it holds its lock, so the state behind a
/// poisoned lock is still consistent; a test thread that panicked elsewhere
/// must not turn every later call into a second panic.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks `lock` for reading, recovering the data as [`write()`] does.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

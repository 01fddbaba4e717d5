//! The one place that names atomics, `Arc` and the epoch crate.
//!
//! Everything else in the crate imports these through `crate::sync`, so a build
//! with `--cfg loom` swaps every shared-memory primitive for loom's model-checked
//! twin at once. crossbeam-epoch switches itself to loom when it is built with
//! its `loom` feature and `--cfg crossbeam_loom` (the loom-tests crate sets both).

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

#[cfg(all(feature = "std", not(loom)))]
pub(crate) use core::sync::atomic::AtomicBool;
#[cfg(all(feature = "std", loom))]
pub(crate) use loom::sync::atomic::AtomicBool;

#[cfg(all(feature = "std", loom))]
pub(crate) use loom::sync::Mutex;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::sync::Mutex;

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

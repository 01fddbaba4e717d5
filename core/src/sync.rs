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

#[cfg(not(loom))]
pub(crate) use alloc::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

pub(crate) use crossbeam_epoch as epoch;

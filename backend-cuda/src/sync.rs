//! The one place that names the lock of the pinned and managed block pools.
//!
//! [`crate::block_pool`] imports its `Mutex` from here, so a build with
//! `--cfg loom` (the loom-tests crate) swaps it for loom's model-checked twin
//! and the models can explore every order in which threads take the pool's
//! lock. The rest of the crate keeps std's primitives in every build: its
//! shared state is the process-wide driver and memory tables (`OnceLock`s
//! filled by driver calls, which loom cannot run) and relaxed tallies.
//!
//! Under loom, a pool must be created inside `loom::model`, like every other
//! loom object; the CUDA pools never are (no model calls the driver).

#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

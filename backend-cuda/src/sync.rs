//! The one place that names the locks, atomics and shared pointers of the
//! pinned and managed block pools and of the per-thread shards.
//!
//! [`crate::block_pool`] and [`crate::shards`] import them from here, so a
//! build with `--cfg loom` (the loom-tests crate) swaps them for loom's
//! model-checked twins and the models can explore every order in which
//! threads take the locks. The rest of the crate keeps std's primitives in
//! every build: its shared state is the process-wide driver and memory tables
//! (`OnceLock`s filled by driver calls, which loom cannot run) and relaxed
//! tallies.
//!
//! Under loom, a pool or a shard registry must be created inside
//! `loom::model`, like every other loom object; the CUDA ones never are (no
//! model calls the driver).

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex, MutexGuard,
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex, MutexGuard,
};

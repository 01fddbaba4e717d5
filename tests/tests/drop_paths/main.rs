//! Mock-only: every `Drop` that can meet a backend failure, with failures
//! injected into each path: the pools' (`pools.rs`) and the scratchpad's
//! (`scratchpad.rs`).
//!
//! Both compare deltas of the process-wide [`lost_errors`] counter and install
//! the process-wide lost-error hook, so they share this binary (no test of
//! another file can lose an error meanwhile) and run one test at a time under
//! [`SERIAL`].
//!
//! Under Miri the scratchpad's paths run with strict provenance (they take
//! their streams from the mock, no pool pins crossbeam-epoch), the pools'
//! with permissive provenance: `.ci/run` selects them by module.
//!
//! [`lost_errors`]: gpupool_core::lost_errors
#![cfg(not(feature = "cuda"))]

use std::fmt::Display;
use std::sync::{Mutex, MutexGuard, PoisonError};

mod pools;
mod scratchpad;

/// Serialises every test that reads `lost_errors` or installs the hook: both
/// are process-wide, and tests run on parallel threads.
static SERIAL: Mutex<()> = Mutex::new(());
/// What the recording hook saw during the current test.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Locks `m`, ignoring poison (a failed test must not fail the ones after it).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The recording lost-error hook: keeps each error's text in [`SEEN`].
fn record(e: &dyn Display) {
    lock(&SEEN).push(e.to_string());
}

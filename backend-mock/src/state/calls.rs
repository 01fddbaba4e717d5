//! [`Calls`]: the machine's call counters.

use std::collections::HashMap;

use gpupool_core::BackendOp as CallKind;

use crate::sync::{AtomicU64, Ordering};

/// Calls made, per kind, failed ones included.
///
/// The read-only kinds that may be counted under the read lock
/// ([`Calls::shared_slot`]) have atomic counters; the others are plain
/// numbers, changed only under the write lock.
///
/// Every counter changes only while the state's lock is held (read or write),
/// so the lock orders each increment before every later write-locked section:
/// the write-locked reads (faults being armed or fired, the accessors) see
/// every call made so far and none in flight. The atomics only keep
/// increments made concurrently under the read lock from being lost, so they
/// need no ordering of their own: `Relaxed` throughout.
#[derive(Debug)]
pub(crate) struct Calls {
    shared: [AtomicU64; SHARED_KINDS.len()],
    exclusive: HashMap<CallKind, u64>,
}

/// The kinds counted in [`Calls`]'s atomics, in slot order.
const SHARED_KINDS: [CallKind; 6] = [
    CallKind::DeviceCount,
    CallKind::CurrentDevice,
    CallKind::QueryStream,
    CallKind::StreamDevice,
    CallKind::QueryEvent,
    CallKind::CaptureStatus,
];

impl Calls {
    pub(super) fn new() -> Self {
        Calls {
            shared: core::array::from_fn(|_| AtomicU64::new(0)),
            exclusive: HashMap::new(),
        }
    }

    /// The atomic counter of `kind`, if it is one of the kinds a call may
    /// count under the read lock.
    pub(super) fn shared_slot(&self, kind: CallKind) -> Option<&AtomicU64> {
        SHARED_KINDS
            .iter()
            .position(|&k| k == kind)
            .map(|i| &self.shared[i])
    }

    /// Counts a call of `kind` through a shared reference, under the read
    /// lock; `false` (nothing counted) for a kind without an atomic counter.
    pub(crate) fn count_shared(&self, kind: CallKind) -> bool {
        match self.shared_slot(kind) {
            Some(count) => {
                // Relaxed: see the type's documentation (the lock orders it).
                count.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Counts a call of `kind` under the write lock; returns the new count.
    pub(super) fn count(&mut self, kind: CallKind) -> u64 {
        match self.shared_slot(kind) {
            // Relaxed: see the type's documentation (the lock orders it).
            Some(count) => count.fetch_add(1, Ordering::Relaxed) + 1,
            None => {
                let count = self.exclusive.entry(kind).or_insert(0);
                *count += 1;
                *count
            }
        }
    }

    /// Calls of `kind` so far (exact under the write lock).
    pub(crate) fn get(&self, kind: CallKind) -> u64 {
        match self.shared_slot(kind) {
            // Relaxed: see the type's documentation (the lock orders it).
            Some(count) => count.load(Ordering::Relaxed),
            None => self.exclusive.get(&kind).copied().unwrap_or(0),
        }
    }

    /// Calls of every kind so far (exact under the write lock).
    pub(crate) fn total(&self) -> u64 {
        // Relaxed: see the type's documentation (the lock orders it).
        let shared: u64 = self.shared.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        shared + self.exclusive.values().sum::<u64>()
    }
}

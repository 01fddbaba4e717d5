//! [`ScratchSizes`], the first block sizes scratchpads learn, and [`fitted`], the
//! one block that holds a round.

// Plain atomics, under loom too: `ScratchSizes` holds independent relaxed
// hints that order nothing, and its constructor is `const`.
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::backend::MemoryKind;

// For the intra-doc link to `Scratchpad::learn_sizes`.
#[cfg(doc)]
use super::Scratchpad;

/// First block sizes learned from earlier scratchpads: a runtime that makes a
/// new scratchpad for every run of an operation keeps one `ScratchSizes` for
/// that operation and builds each scratchpad with
/// [`learn_sizes`](Scratchpad::learn_sizes).
///
/// A scratchpad made that way starts each kind with one block that holds the
/// largest round any earlier one handed out of that kind (the bytes, alignment
/// padding included, plus a sixteenth, rounded up to 4 KiB; or its configured
/// first block, if larger), and records its own largest round when it is
/// released or dropped. A run that needs what the last one needed then takes one block per
/// kind from upstream instead of a chain of doubling blocks (a 16-allocation
/// round of 1 B – 64 KiB: one block instead of four). The sizes only grow:
/// one large run makes every later scratchpad start large (its blocks come
/// from the backend's pools, but are held while it lives);
/// [`forget`](Self::forget) starts over.
///
/// It is `Sync` (four relaxed atomic sizes), so scratchpads on several threads
/// may share one.
///
/// ```
/// use gpupool_core::{AccessOrder, MemoryKind, Scratchpad, ScratchSizes};
/// use gpupool_mock::MockBackend;
///
/// let gpu = MockBackend::new(1);
/// let sizes = ScratchSizes::new();
/// for _run in 0..3 {
///     let pad = Scratchpad::new(&gpu, AccessOrder::host()).unwrap().learn_sizes(&sizes);
///     for n in [1000usize, 60_000, 60_000] {
///         pad.host::<u8>(n).unwrap();
///     }
/// } // the first run took two blocks (64 + 128 KiB); the others one of 128 KiB
/// assert_eq!(sizes.get()[MemoryKind::Host.index()], 128 * 1024);
/// ```
#[derive(Debug, Default)]
pub struct ScratchSizes {
    /// Per kind, indexed by [`MemoryKind::index`]; 0: nothing learned.
    sizes: [AtomicUsize; 4],
}

impl ScratchSizes {
    /// Nothing learned yet: scratchpads start with their configured first
    /// blocks.
    pub const fn new() -> Self {
        ScratchSizes {
            sizes: [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ],
        }
    }

    /// The learned first block size per kind (indexed by
    /// [`MemoryKind::index`]; 0: none yet).
    #[inline]
    pub fn get(&self) -> [usize; 4] {
        // Relaxed: each size is an independent hint; no other memory is
        // published through it.
        core::array::from_fn(|i| self.sizes[i].load(Ordering::Relaxed))
    }

    /// Forgets what was learned.
    pub fn forget(&self) {
        for s in &self.sizes {
            // Relaxed: as in `get`.
            s.store(0, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(super) fn learn(&self, kind: MemoryKind, bytes: usize) {
        let size = &self.sizes[kind.index()];
        // Relaxed: as in `get`. A load first: once learned, the size rarely
        // grows, and a `ScratchSizes` shared by the threads of an operation
        // would otherwise take a read-modify-write of one cache line from
        // every scratchpad's drop. `fetch_max` keeps the largest of racing
        // scratchpads. A stale load only sends a smaller size to it, or, racing
        // `forget`, skips one lesson (the next drop learns it).
        if bytes != 0 && bytes > size.load(Ordering::Relaxed) {
            size.fetch_max(bytes, Ordering::Relaxed);
        }
    }
}

/// The one block that holds a round of `used` bytes again: a sixteenth more
/// (alignment padding may fall differently in one block than across
/// several), rounded up to 4 KiB.
pub(super) fn fitted(used: usize) -> usize {
    let with_slack = used.saturating_add(used / 16);
    with_slack
        .checked_next_multiple_of(4096)
        .unwrap_or(with_slack)
}

//! A scratchpad's statistics: [`ScratchStats`], and the upstream wrapper that
//! counts its calls.

use core::cell::Cell;
use core::ptr::NonNull;

use crate::error::Error;
use crate::monotonic::{Block, Upstream};

/// Per-kind statistics of a scratchpad.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ScratchStats {
    /// Bytes held from upstream, per kind.
    pub reserved: [usize; 4],
    /// Blocks held, per kind.
    pub blocks: [usize; 4],
    /// Bytes requested since the last reset, per kind.
    pub requested: [usize; 4],
    /// The most bytes held at once, per kind.
    pub high_water: [usize; 4],
    /// Blocks taken from upstream, over the scratchpad's life.
    pub upstream_allocations: usize,
    /// Blocks given back to upstream, over the scratchpad's life (those
    /// kept for graphs included).
    pub upstream_releases: usize,
    /// Blocks given to graph captures, or kept because a capture that may
    /// use them has ended, over the scratchpad's life (see
    /// [`MemoryBackend::keep_for_ended_captures`](crate::MemoryBackend::keep_for_ended_captures)).
    pub kept_for_graphs: usize,
}

/// Counts the upstream calls a scratchpad makes.
pub(super) struct Counting<'c, U> {
    pub(super) inner: U,
    pub(super) allocations: &'c Cell<usize>,
    pub(super) releases: &'c Cell<usize>,
}

impl<U: Upstream> Upstream for Counting<'_, U> {
    type Error = U::Error;

    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, Error<U::Error>> {
        let p = self.inner.allocate(size, align)?;
        self.allocations.set(self.allocations.get() + 1);
        Ok(p)
    }

    unsafe fn release(&self, block: Block) -> Result<(), Error<U::Error>> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.inner.release(block)? };
        self.releases.set(self.releases.get() + 1);
        Ok(())
    }
}

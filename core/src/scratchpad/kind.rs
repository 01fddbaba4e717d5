//! [`KindState`]: one memory kind's resource in a scratchpad, its fence and
//! what it has learned of the rounds.

use core::cell::Cell;

use super::fence::Fence;
use super::sizes::fitted;
use crate::monotonic::MonotonicResource;

/// One kind's resource and what goes with it. Every field is usable through
/// `&self`.
pub(super) struct KindState {
    pub(super) res: MonotonicResource,
    pub(super) fence: Cell<Option<Fence>>,
    /// Resets left before `reset` asks the release stream whether it is idle
    /// again (0: ask at the next one). See `reset_kind`.
    pub(super) skip_probes: Cell<u8>,
    pub(super) high_water: Cell<usize>,
    /// The most bytes one round handed out (alignment padding included),
    /// recorded at each reset and at release: what one block must hold.
    pub(super) peak_used: Cell<usize>,
}

impl KindState {
    pub(super) const fn new(first_block: usize) -> Self {
        KindState {
            res: MonotonicResource::new(first_block),
            fence: Cell::new(None),
            skip_probes: Cell::new(0),
            high_water: Cell::new(0),
            peak_used: Cell::new(0),
        }
    }
}

impl KindState {
    /// Records the bytes this round handed out; returns the block size that
    /// holds the largest round so far.
    #[inline]
    pub(super) fn note_round(&self) -> usize {
        let peak = self.peak_used.get().max(self.res.used());
        self.peak_used.set(peak);
        fitted(peak)
    }
}

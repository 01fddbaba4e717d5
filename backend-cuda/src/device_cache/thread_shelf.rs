//! [`ThreadShelf`]: one thread's shard of a device cache.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Shelf, MAX_BLOCKS, MAX_BYTES, RESERVE_CHUNK};
use crate::shards::ShardState;

/// What one thread's shard of a device cache holds (and the orphans of the
/// threads that exited): blocks by stream id and size, the bytes reserved
/// from the device's budget for them, and what the shard has done.
#[derive(Debug)]
pub(crate) struct ThreadShelf {
    pub(super) shelf: Shelf<usize>,
    /// Bytes of the device's budget ([`MAX_BYTES`]) this shard holds: at
    /// least `shelf.bytes()`, in whole [`RESERVE_CHUNK`]s while the thread
    /// lives (exactly the bytes held, for the orphans).
    pub(super) reserved: usize,
    pub(super) tallies: CacheTallies,
}

/// What a device cache (one thread's shard, or all of them summed) has done:
/// allocations it answered and did not, and blocks it evicted.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheTallies {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) evictions: u64,
}

impl core::ops::AddAssign for CacheTallies {
    fn add_assign(&mut self, other: CacheTallies) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.evictions += other.evictions;
    }
}

impl Default for ThreadShelf {
    fn default() -> Self {
        ThreadShelf {
            shelf: Shelf::new(MAX_BLOCKS, 0),
            reserved: 0,
            tallies: CacheTallies::default(),
        }
    }
}

impl ShardState for ThreadShelf {
    /// The bytes reserved by the shards and the orphans, at most
    /// [`MAX_BYTES`]; touched only when a shard's reservation crosses a
    /// chunk.
    type Shared = AtomicUsize;

    fn is_empty(&self) -> bool {
        self.shelf.len() == 0
    }

    /// The orphans keep exactly the bytes of their blocks reserved: the
    /// exiting thread's spare chunk goes back to the budget.
    fn absorb(&mut self, from: &mut Self, budget: &AtomicUsize) {
        for (stream, size, addr) in from.shelf.drain() {
            self.shelf.force(stream, size, addr);
        }
        self.reserved += core::mem::take(&mut from.reserved);
        self.tallies += core::mem::take(&mut from.tallies);
        self.release_surplus(0, budget);
    }
}

/// Reservations from a device's byte budget.
impl ThreadShelf {
    /// Reserves room for `more` bytes beyond what the shelf holds, in whole
    /// chunks, if the budget has them. Returns the shelf's byte bound.
    pub(super) fn reserve_for(&mut self, more: usize, budget: &AtomicUsize) -> usize {
        let need = self.shelf.bytes().saturating_add(more);
        if need > self.reserved {
            let grow = (need - self.reserved).div_ceil(RESERVE_CHUNK) * RESERVE_CHUNK;
            // Relaxed: a counter of bytes; no memory is published through
            // it (the blocks themselves stay in this shard).
            let reserved = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                r.checked_add(grow).filter(|&r| r <= MAX_BYTES)
            });
            if reserved.is_ok() {
                self.reserved += grow;
            }
        }
        self.shelf.set_max_bytes(self.reserved);
        self.reserved
    }

    /// Gives back what the shard reserved beyond one spare chunk (`keep`:
    /// the chunks it holds blocks in, plus `spare` more).
    pub(super) fn release_surplus(&mut self, spare: usize, budget: &AtomicUsize) {
        let keep = self.shelf.bytes().div_ceil(RESERVE_CHUNK) * RESERVE_CHUNK + spare;
        if self.reserved > keep {
            // Relaxed: see `reserve_for`.
            budget.fetch_sub(self.reserved - keep, Ordering::Relaxed);
            self.reserved = keep;
            self.shelf.set_max_bytes(keep);
        }
    }

    /// Takes out every block (stream id, size, address), giving back its
    /// reservation.
    pub(super) fn drain_all(&mut self, budget: &AtomicUsize) -> Vec<(u64, usize, usize)> {
        let blocks = self.shelf.drain();
        self.release_surplus(0, budget);
        blocks
    }

    /// Takes out every block of `stream` (size, address), giving back what
    /// the shard no longer needs reserved.
    pub(super) fn drain_stream(
        &mut self,
        stream: u64,
        budget: &AtomicUsize,
    ) -> Vec<(usize, usize)> {
        let blocks = self.shelf.drain_stream(stream);
        self.release_surplus(RESERVE_CHUNK, budget);
        blocks
    }
}

//! [`Quarantine`]: the blocks the mock has reclaimed and still remembers,
//! their memory kept allocated, so that a later call naming a freed range
//! is refused instead of reading or writing freed memory.
//!
//! Remembering an address range is only sound while the memory behind it is
//! still the mock's: once it goes back to `std::alloc`, the allocator may
//! hand it to anything (a `Vec` the caller then gives `copy_async` as a
//! source), and the mock could no longer tell a stale pointer from a fresh
//! foreign one. So a record and its memory live and die together: a
//! reclaimed block's [`Allocation`] moves in here, and only eviction drops
//! it. The quarantine is bounded (first in, first out): a use after free is
//! caught for the last [`MAX_BLOCKS`] reclaimed blocks, up to [`MAX_BYTES`]
//! in all; older ones are really freed and forgotten, and their ranges are
//! foreign again.

use std::collections::{BTreeMap, VecDeque};

use crate::heap::Allocation;

/// At most this many reclaimed blocks are remembered.
pub(crate) const MAX_BLOCKS: usize = if cfg!(miri) { 64 } else { 256 };

/// At most this many bytes of reclaimed blocks are kept allocated; a block
/// larger than this on its own is freed at once and not remembered. (Small
/// under Miri, whose memory costs more.)
pub(crate) const MAX_BYTES: usize = if cfg!(miri) { 4 << 20 } else { 16 << 20 };

/// The reclaimed blocks still remembered, oldest first.
///
/// Invariants: `by_addr` and `order` hold the same start addresses, `bytes`
/// is the sum of their sizes, and `by_addr.len() <= MAX_BLOCKS`,
/// `bytes <= MAX_BYTES`. The ranges are disjoint from each other and from
/// every block the mock tracks (live or free-pending): the memory is still
/// allocated, so the allocator cannot have handed any of it out again.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    /// By start address: the memory, kept allocated until evicted. Never
    /// read or written while here.
    by_addr: BTreeMap<usize, Allocation>,
    /// Start addresses in the order the blocks came in.
    order: VecDeque<usize>,
    bytes: usize,
}

impl Quarantine {
    /// Remembers a reclaimed block, keeping its memory allocated; evicts
    /// (frees) the oldest ones beyond the bounds. A block larger than
    /// [`MAX_BYTES`] is freed at once.
    pub(crate) fn admit(&mut self, memory: Allocation) {
        let size = memory.layout().size();
        if size > MAX_BYTES {
            return; // `memory` drops here: freed, not remembered.
        }
        while self.order.len() >= MAX_BLOCKS || self.bytes + size > MAX_BYTES {
            self.evict_oldest();
        }
        self.bytes += size;
        self.order.push_back(memory.addr());
        self.by_addr.insert(memory.addr(), memory);
        debug_assert_eq!(self.by_addr.len(), self.order.len());
    }

    /// Frees the oldest block and forgets it.
    fn evict_oldest(&mut self) {
        let Some(addr) = self.order.pop_front() else {
            return;
        };
        if let Some(memory) = self.by_addr.remove(&addr) {
            self.bytes -= memory.layout().size();
        }
    }

    /// Whether `[addr, end)` (nonempty) overlaps a remembered block.
    pub(crate) fn overlaps(&self, addr: usize, end: usize) -> bool {
        let before = self
            .by_addr
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, m)| start + m.layout().size() > addr);
        // `addr < end`, so the range `addr + 1..end` is well formed.
        before || self.by_addr.range(addr + 1..end).next().is_some()
    }

    /// Whether a remembered block starts at `addr` (a free naming it is a
    /// double free).
    pub(crate) fn starts_at(&self, addr: usize) -> bool {
        self.by_addr.contains_key(&addr)
    }

    /// How many blocks are remembered.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// How many bytes they hold.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

//! The simulated memory: blocks of real host memory tagged with a kind and a
//! device, the ranges that queued simulated work uses, stream-ordered frees,
//! byte accounting, and the hazard detector.
//!
//! A block is *live* from its allocation to its free; a block freed in stream
//! order is *free-pending* until its stream reaches the free, and is then
//! *reclaimed*: it is no longer tracked, and its memory goes to the
//! [`Quarantine`], which keeps it allocated and remembers its range for a
//! while, so that a later use of the range is refused rather than reading
//! freed memory (a synchronous free reclaims at once). Each queued work item that touches a block (a
//! [`use_memory`](crate::MockBackend::use_memory) or a `copy_async`) leaves a
//! [`Use`] on the block: the range, whether it writes, and the item's [`Point`]
//! (reached when the item has completed). A use is *pending* until its point
//! is reached, and *ordered before* a later item or free on another stream when
//! that stream's [`Frontier`] covers its point.

use core::fmt;
use core::ptr::NonNull;
use std::collections::{BTreeMap, VecDeque};

use gpupool_core::{DeviceId, MemoryKind, StreamHandle};

use crate::error::BlockLayout;
use crate::error::MockError;
use crate::heap::Allocation;
use crate::quarantine::Quarantine;
use crate::queue::{Frontier, Point, StreamKey, Streams};

/// What went wrong, in a [`Hazard`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HazardKind {
    /// A block was freed while queued work not ordered before the free still
    /// uses it: a synchronous free with any use pending, or a stream-ordered
    /// free on one stream with a use pending on another stream that the
    /// freeing stream has not waited for. `conflict` names the stream using it.
    FreedWhileInUse,
    /// Work or the host used a range that is not inside a live block: the block
    /// is freed or free-pending, or the range is no memory of this mock. A
    /// harness call refuses a range of a block already reclaimed (see
    /// [Refusals](crate#refusals)) and records this.
    UsedAfterFree,
    /// Work used a range that overlaps a live block without lying inside it.
    OutOfBounds,
    /// Work used a range that queued work on another stream (`conflict`) also
    /// uses, with no wait ordering the two, and at least one of them writes.
    ConcurrentUse,
    /// The host accessed a range that queued work (on `conflict`) still uses.
    HostAccessWhileInUse,
    /// The host accessed [`MemoryKind::Device`] memory, which a real host
    /// cannot dereference.
    HostAccessToDevice,
    /// Work outside a graph, or the host, used a block that a graph holds
    /// (see [Capture](crate#capture)): for work, a graph allocation (made in
    /// stream order in the graph's capture) or a block freed inside the
    /// capture; for the host, a block freed inside the capture (a free
    /// node), which stays reserved for the graph's replays until the graph
    /// is dropped. A replay may read or write it at any time. A harness call
    /// refuses such a use (see [Refusals](crate#refusals)) and records this.
    HeldByGraph,
}

/// A stream-order hazard found by the mock: something a real GPU would turn
/// into a data race or a use of freed memory. Recorded, and the operation
/// goes ahead, but for the harness calls' [refusals](crate#refusals), which
/// return an error and are recorded here too. See
/// [`MockBackend::hazards`](crate::MockBackend::hazards).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hazard {
    /// What happened.
    pub kind: HazardKind,
    /// The start of the range the operation was about (a whole block, for a free).
    pub addr: usize,
    /// The length of that range.
    pub len: usize,
    /// The stream of the operation that found the hazard: the using stream for
    /// `use_memory` and `copy_async`, the freeing stream for a stream-ordered
    /// free; `None` for the host (a synchronous free, `host_access`). An
    /// implicit stream is reported as [`StreamHandle::NULL`].
    pub stream: Option<StreamHandle>,
    /// The stream whose pending work the operation conflicts with, if any.
    pub conflict: Option<StreamHandle>,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} on {} bytes at {:#x}",
            self.kind, self.len, self.addr
        )?;
        if let Some(s) = self.stream {
            write!(f, " by stream {:#x}", s.as_raw())?;
        }
        if let Some(s) = self.conflict {
            write!(f, " against stream {:#x}", s.as_raw())?;
        }
        Ok(())
    }
}

/// A range used by one queued work item.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Use {
    /// Reached once the item has completed.
    pub(crate) at: Point,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    /// Whether the item may write the range (a copy's source is only read).
    pub(crate) write: bool,
}

impl Use {
    pub(crate) fn overlaps(&self, addr: usize, len: usize) -> bool {
        self.addr < addr + len && addr < self.addr + self.len
    }
}

/// Which graph capture, or graph, a block belongs to (see
/// [Capture](crate#capture)). A capture and the graph it ends in share one
/// id, never reused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// An ordinary block: no graph has any claim on it.
    Nobody,
    /// Allocated in stream order inside capture `graph` (a graph
    /// allocation): only the capture's items and the graph's launches may
    /// use it. `freed`: a free node of that capture freed it, so it is
    /// reserved for the graph's replays. Unfreed, it may be freed like any
    /// block; the graph frees it when dropped if nobody has.
    Graph { graph: u64, freed: bool },
    /// A block freed inside capture `graph` that it had not allocated:
    /// reserved for the graph's replays.
    Held(u64),
    /// A block given to
    /// [`keep_for_ended_captures`](gpupool_core::MemoryBackend::keep_for_ended_captures):
    /// graphs captured earlier may use it, so only graphs' work may touch
    /// it, and it is freed once no graph (nor an open capture) uses its
    /// range any more (see `State::release_unused_kept`).
    Kept,
}

impl Holder {
    /// The graph the block is reserved for (freed inside its capture), if
    /// any: nothing else may use it, and it is freed when the graph drops.
    pub(crate) fn reserved_for(self) -> Option<u64> {
        match self {
            Holder::Graph { graph, freed: true } | Holder::Held(graph) => Some(graph),
            _ => None,
        }
    }

    /// Whether the block is reserved for graphs' work: for one graph, or
    /// kept for the graphs that may use it.
    pub(crate) fn is_reserved(self) -> bool {
        self.reserved_for().is_some() || self == Holder::Kept
    }

    /// The graph whose memory the block is, if any: its graph allocation
    /// (freed in the capture or not) or a block reserved for it. Work that is
    /// not that graph's (an item of its capture, a launch of it) may not use
    /// it.
    pub(crate) fn graph(self) -> Option<u64> {
        match self {
            Holder::Graph { graph, .. } | Holder::Held(graph) => Some(graph),
            Holder::Nobody | Holder::Kept => None,
        }
    }

    /// Whether the graph `id` owns the block (allocated or freed it in its
    /// capture), so that the graph's end frees it.
    pub(crate) fn owned_by(self, id: u64) -> bool {
        matches!(self, Holder::Graph { graph, .. } | Holder::Held(graph) if graph == id)
    }
}

/// One block of simulated memory.
///
/// Freed (not live) when `free_at` is set or `released` is: then no new use
/// is allowed and the block awaits its reclaim.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) memory: Allocation,
    pub(crate) kind: MemoryKind,
    pub(crate) device: DeviceId,
    /// `None` while live; the point of a stream-ordered free once freed.
    pub(crate) free_at: Option<Point>,
    /// Released by the end of the graph that owned it, while work of the
    /// graph's launches still used it: reclaimed once that work completes
    /// (listed in [`Memory::after_uses`]).
    pub(crate) released: bool,
    /// Which capture or graph, if any, the block belongs to.
    pub(crate) holder: Holder,
    /// Uses by queued work; may hold completed ones until [`Block::prune`].
    pub(crate) uses: Vec<Use>,
}

impl Block {
    fn layout(&self) -> BlockLayout {
        BlockLayout {
            kind: self.kind,
            device: self.device,
            size: self.memory.layout().size(),
            align: self.memory.layout().align(),
        }
    }

    pub(crate) fn size(&self) -> usize {
        self.memory.layout().size()
    }

    fn end(&self) -> usize {
        self.memory.addr() + self.size()
    }

    /// Whether the block was freed (in stream order, or by its graph's end)
    /// and awaits its reclaim.
    pub(crate) fn is_freed(&self) -> bool {
        self.free_at.is_some() || self.released
    }

    /// Forgets the uses whose work has completed.
    pub(crate) fn prune(&mut self, streams: &Streams) {
        self.uses.retain(|u| !streams.reached(u.at));
    }

    /// The first pending use on another stream than `frontier`'s that
    /// overlaps the range, conflicts with `write`, and is not ordered before
    /// the frontier. Call after [`prune`](Self::prune).
    pub(crate) fn unordered_use(
        &self,
        frontier: &Frontier,
        addr: usize,
        len: usize,
        write: bool,
    ) -> Option<StreamKey> {
        self.uses
            .iter()
            .find(|u| (u.write || write) && u.overlaps(addr, len) && !frontier.covers(u.at))
            .map(|u| u.at.stream)
    }
}

/// Where a range lies with respect to the blocks, in this order of
/// precedence.
pub(crate) enum Place {
    /// Inside the live block starting at this address.
    Inside(usize),
    /// Not inside a live block, and overlapping a reclaimed block that the
    /// [`Quarantine`] remembers: freed memory.
    Reclaimed,
    /// Inside a free-pending block, or overlapping blocks without lying inside
    /// a live one; `true` if the range overlaps a live block.
    Bad { touches_live: bool },
    /// Overlapping no block, tracked or remembered: foreign memory (or a block
    /// reclaimed so long ago that the quarantine has let it go).
    Foreign,
}

/// Every block not yet reclaimed, the reclaimed ones still remembered, and
/// the memory counters.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// By start address. Addresses are compared, never turned into pointers.
    pub(crate) blocks: BTreeMap<usize, Block>,
    /// The last blocks reclaimed, their memory still allocated (disjoint from
    /// `blocks`).
    pub(crate) quarantine: Quarantine,
    /// The free-pending blocks, per freeing stream, as (free position, start
    /// address) in the order of the frees, hence of their positions: a stream
    /// reaches them front to back.
    pub(crate) free_pending: BTreeMap<StreamKey, VecDeque<(u64, usize)>>,
    /// Blocks released by the end of their graph while work of its launches
    /// still used them (start addresses): each is reclaimed once none of its
    /// uses is pending.
    pub(crate) after_uses: Vec<usize>,
    /// The blocks kept for graphs captured earlier ([`Holder::Kept`]), by
    /// start address.
    pub(crate) kept: Vec<usize>,
    /// Start addresses of graph allocations their graph freed (it was
    /// dropped before anyone else freed them): a later
    /// `keep_for_ended_captures` of one has nothing left to do. Forgotten
    /// when a new block is allocated over one.
    pub(crate) freed_by_graph: std::collections::BTreeSet<usize>,
    /// Bytes not yet reclaimed, per kind (free-pending included).
    pub(crate) live: [usize; 4],
    /// Bytes free-pending, per kind.
    pub(crate) pending_free: [usize; 4],
    /// The highest `live` has been, per kind.
    pub(crate) peak: [usize; 4],
    pub(crate) hazards: Vec<Hazard>,
}

impl Memory {
    pub(crate) fn live_bytes(&self, kind: MemoryKind) -> usize {
        self.live[kind.index()]
    }

    pub(crate) fn pending_free_bytes(&self, kind: MemoryKind) -> usize {
        self.pending_free[kind.index()]
    }

    pub(crate) fn peak_live_bytes(&self, kind: MemoryKind) -> usize {
        self.peak[kind.index()]
    }

    pub(crate) fn live_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is free-pending, so that
    /// [`State::reclaim`](crate::state::State::reclaim) has nothing to do.
    pub(crate) fn nothing_to_reclaim(&self) -> bool {
        self.free_pending.is_empty() && self.after_uses.is_empty()
    }

    /// Where `[addr, addr + len)` lies; `None` if it wraps around. An empty
    /// range is foreign. The one place that tells live memory from freed and
    /// foreign memory.
    pub(crate) fn place(&self, addr: usize, len: usize) -> Option<Place> {
        let end = addr.checked_add(len)?;
        if len == 0 {
            return Some(Place::Foreign);
        }
        // The block that starts at or before `addr` and reaches past it.
        let first = self
            .blocks
            .range(..=addr)
            .next_back()
            .filter(|(_, b)| b.end() > addr)
            .map(|(_, b)| b);
        if let Some(block) = first.filter(|b| end <= b.end() && !b.is_freed()) {
            return Some(Place::Inside(block.memory.addr()));
        }
        // Freed memory wherever the range reaches it: a use after free.
        if self.quarantine.overlaps(addr, end) {
            return Some(Place::Reclaimed);
        }
        // `addr < end`, so `addr + 1` does not overflow and the range is valid.
        let mut touching = first
            .into_iter()
            .chain(self.blocks.range(addr + 1..end).map(|(_, b)| b))
            .peekable();
        if touching.peek().is_none() {
            return Some(Place::Foreign);
        }
        let touches_live = touching.any(|b| !b.is_freed());
        Some(Place::Bad { touches_live })
    }

    /// The live block a free names, checked against what the free says. A
    /// block reclaimed and still remembered is freed already
    /// ([`MockError::DoubleFree`]).
    pub(crate) fn block_to_free(
        &mut self,
        given: BlockLayout,
        ptr: NonNull<u8>,
    ) -> Result<&mut Block, MockError> {
        let addr = ptr.as_ptr().addr();
        if self.quarantine.starts_at(addr) {
            return Err(MockError::DoubleFree(addr));
        }
        let block = self
            .blocks
            .get_mut(&addr)
            .ok_or(MockError::InvalidPointer(addr))?;
        // A block reserved for a graph was freed inside its capture (or kept
        // for graphs).
        if block.is_freed() || block.holder.is_reserved() {
            return Err(MockError::DoubleFree(addr));
        }
        let allocated = block.layout();
        if allocated != given {
            return Err(MockError::BlockMismatch {
                addr,
                allocated,
                given,
            });
        }
        Ok(block)
    }

    /// Removes a block and puts its memory in the quarantine, which returns
    /// it to `std::alloc` when it evicts it.
    pub(crate) fn reclaim(&mut self, addr: usize) {
        if let Some(block) = self.blocks.remove(&addr) {
            let kind = block.kind.index();
            self.live[kind] -= block.size();
            if block.is_freed() {
                self.pending_free[kind] -= block.size();
            }
            self.quarantine.admit(block.memory);
        }
    }
}

/// The hazard a use of a range that is not inside a live block is (`place`:
/// where the range lies): out of bounds if it reaches a live block, else a
/// use after free (a freed block, or no memory of this mock).
pub(crate) fn misplaced(place: Option<Place>) -> HazardKind {
    match place {
        Some(Place::Bad { touches_live: true }) => HazardKind::OutOfBounds,
        _ => HazardKind::UsedAfterFree,
    }
}

/// A hazard about `[addr, addr + len)`.
pub(crate) fn hazard(
    kind: HazardKind,
    addr: usize,
    len: usize,
    stream: Option<StreamKey>,
    conflict: Option<StreamKey>,
) -> Hazard {
    Hazard {
        kind,
        addr,
        len,
        stream: stream.map(StreamKey::handle),
        conflict: conflict.map(StreamKey::handle),
    }
}

//! The simulated memory: blocks of real host memory tagged with a kind and a
//! device, the ranges that queued simulated work uses, stream-ordered frees,
//! byte accounting, and the hazard detector.
//!
//! A block is *live* from its allocation to its free; a block freed in stream
//! order is *free-pending* until its stream reaches the free, and is then
//! *reclaimed*: its memory goes back to `std::alloc` (a synchronous free
//! reclaims at once). Each queued work item that touches a block (a
//! [`use_memory`](crate::MockBackend::use_memory) or a `copy_async`) leaves a
//! [`Use`] on the block: the range, whether it writes, and the item's [`Point`]
//! (reached when the item has completed). A use is *pending* until its point
//! is reached, and *ordered before* a later item or free on another stream when
//! that stream's [`Frontier`](crate::queue::Frontier) covers its point.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::collections::{BTreeMap, VecDeque};

use gpupool_core::{DeviceId, MemoryKind, StreamHandle};

use crate::error::BlockLayout;
use crate::heap::Allocation;
use crate::queue::{Frontier, Point, StreamKey, Streams};
use crate::state::State;
use crate::MockError;

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
    /// is freed or free-pending, or the range is no memory of this mock.
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
}

/// A stream-order hazard found by the mock: something a real GPU would turn
/// into a data race or a use of freed memory. Recorded, never returned as an
/// error: the operation goes ahead. See [`MockBackend::hazards`](crate::MockBackend::hazards).
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
struct Use {
    /// Reached once the item has completed.
    at: Point,
    addr: usize,
    len: usize,
    /// Whether the item may write the range (a copy's source is only read).
    write: bool,
}

impl Use {
    fn overlaps(&self, addr: usize, len: usize) -> bool {
        self.addr < addr + len && addr < self.addr + self.len
    }
}

/// One block of simulated memory.
#[derive(Debug)]
struct Block {
    memory: Allocation,
    kind: MemoryKind,
    device: DeviceId,
    /// `None` while live; the point of a stream-ordered free once freed.
    free_at: Option<Point>,
    /// Uses by queued work; may hold completed ones until [`Block::prune`].
    uses: Vec<Use>,
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

    fn size(&self) -> usize {
        self.memory.layout().size()
    }

    fn end(&self) -> usize {
        self.memory.addr() + self.size()
    }

    /// Forgets the uses whose work has completed.
    fn prune(&mut self, streams: &Streams) {
        self.uses.retain(|u| !streams.reached(u.at));
    }

    /// The first pending use on another stream than `frontier`'s that
    /// overlaps the range, conflicts with `write`, and is not ordered before
    /// the frontier. Call after [`prune`](Self::prune).
    fn unordered_use(
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

/// Where a range lies with respect to the blocks.
enum Place {
    /// Inside the live block starting at this address.
    Inside(usize),
    /// Inside a free-pending block, or overlapping blocks without lying inside
    /// a live one; `true` if the range overlaps a live block.
    Bad { touches_live: bool },
    /// Overlapping no block.
    Foreign,
}

/// Every block not yet reclaimed, and the memory counters.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// By start address. Addresses are compared, never turned into pointers.
    blocks: BTreeMap<usize, Block>,
    /// The free-pending blocks, per freeing stream, as (free position, start
    /// address) in the order of the frees, hence of their positions: a stream
    /// reaches them front to back.
    free_pending: BTreeMap<StreamKey, VecDeque<(u64, usize)>>,
    /// Bytes not yet reclaimed, per kind (free-pending included).
    live: [usize; 4],
    /// Bytes free-pending, per kind.
    pending_free: [usize; 4],
    /// The highest `live` has been, per kind.
    peak: [usize; 4],
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
        self.free_pending.is_empty()
    }

    /// Where `[addr, addr + len)` lies; `None` if it wraps around. An empty
    /// range is foreign.
    fn place(&self, addr: usize, len: usize) -> Option<Place> {
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
        if let Some(block) = first {
            if end <= block.end() {
                return Some(if block.free_at.is_none() {
                    Place::Inside(block.memory.addr())
                } else {
                    Place::Bad {
                        touches_live: false,
                    }
                });
            }
        }
        // `addr < end`, so `addr + 1` does not overflow and the range is valid.
        let mut touching = first
            .into_iter()
            .chain(self.blocks.range(addr + 1..end).map(|(_, b)| b))
            .peekable();
        if touching.peek().is_none() {
            return Some(Place::Foreign);
        }
        let touches_live = touching.any(|b| b.free_at.is_none());
        Some(Place::Bad { touches_live })
    }

    /// The live block a free names, checked against what the free says.
    fn block_to_free(
        &mut self,
        given: BlockLayout,
        ptr: NonNull<u8>,
    ) -> Result<&mut Block, MockError> {
        let addr = ptr.as_ptr().addr();
        let block = self
            .blocks
            .get_mut(&addr)
            .ok_or(MockError::InvalidPointer(addr))?;
        if block.free_at.is_some() {
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

    /// Removes a block and returns its memory to `std::alloc`.
    fn reclaim(&mut self, addr: usize) {
        if let Some(block) = self.blocks.remove(&addr) {
            let kind = block.kind.index();
            self.live[kind] -= block.size();
            if block.free_at.is_some() {
                self.pending_free[kind] -= block.size();
            }
        }
    }
}

/// A hazard about `[addr, addr + len)`.
fn hazard(
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

impl State {
    /// Reclaims the free-pending blocks whose free point is reached, after
    /// resolving the waits that are satisfied. Runs after every call that may
    /// move a stream forward.
    pub(crate) fn reclaim(&mut self) {
        if self.memory.nothing_to_reclaim() {
            return;
        }
        self.streams.settle(self.policy);
        let mut pending = core::mem::take(&mut self.memory.free_pending);
        pending.retain(|&stream, frees| {
            while let Some(&(pos, addr)) = frees.front() {
                if !self.streams.reached(Point { stream, pos }) {
                    break;
                }
                self.memory.reclaim(addr);
                frees.pop_front();
            }
            !frees.is_empty()
        });
        self.memory.free_pending = pending;
    }

    /// `allocate` and, with a stream, `allocate_async`.
    pub(crate) fn allocate(
        &mut self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
        stream: Option<StreamHandle>,
    ) -> Result<NonNull<u8>, MockError> {
        self.check_device(device)?;
        if let Some(stream) = stream {
            self.stream_key(stream, device)?;
        }
        let layout = Layout::from_size_align(size, align)
            .ok()
            .filter(|l| l.size() > 0)
            .ok_or(MockError::InvalidLayout { size, align })?;
        let memory = Allocation::new(layout).ok_or(MockError::OutOfMemory { size, align })?;
        let ptr = memory.ptr();
        let block = Block {
            memory,
            kind,
            device,
            free_at: None,
            uses: Vec::new(),
        };
        let mem = &mut self.memory;
        mem.blocks.insert(ptr.as_ptr().addr(), block);
        let k = kind.index();
        mem.live[k] += size;
        mem.peak[k] = mem.peak[k].max(mem.live[k]);
        Ok(ptr)
    }

    /// `deallocate`: frees at once, after recording a hazard if queued work
    /// still uses the block.
    pub(crate) fn deallocate(
        &mut self,
        given: BlockLayout,
        ptr: NonNull<u8>,
    ) -> Result<(), MockError> {
        self.check_device(given.device)?;
        self.streams.settle(self.policy);
        let block = self.memory.block_to_free(given, ptr)?;
        block.prune(&self.streams);
        let found = block.uses.first().map(|u| {
            let (addr, size) = (block.memory.addr(), block.size());
            hazard(
                HazardKind::FreedWhileInUse,
                addr,
                size,
                None,
                Some(u.at.stream),
            )
        });
        self.memory.hazards.extend(found);
        self.memory.reclaim(ptr.as_ptr().addr());
        Ok(())
    }

    /// `deallocate_async`: the block becomes free-pending at `stream`'s
    /// current position.
    pub(crate) fn deallocate_async(
        &mut self,
        given: BlockLayout,
        ptr: NonNull<u8>,
        stream: StreamHandle,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, given.device)?;
        self.streams.settle(self.policy);
        let at = self.streams.head(key);
        let frontier = self.streams.frontier(at);
        let block = self.memory.block_to_free(given, ptr)?;
        block.prune(&self.streams);
        let (addr, size, kind) = (block.memory.addr(), block.size(), block.kind);
        let conflict = block.unordered_use(&frontier, addr, size, true);
        block.free_at = Some(at);
        if conflict.is_some() {
            let h = hazard(HazardKind::FreedWhileInUse, addr, size, Some(key), conflict);
            self.memory.hazards.push(h);
        }
        self.memory.pending_free[kind.index()] += size;
        let frees = self.memory.free_pending.entry(key).or_default();
        frees.push_back((at.pos, addr));
        self.reclaim();
        Ok(())
    }

    /// Records hazards for a work item about to be queued on `key` that
    /// uses `[addr, addr + len)`, and returns the live block it lies in.
    fn check_work_use(
        &mut self,
        key: StreamKey,
        frontier: &Frontier,
        addr: usize,
        len: usize,
        write: bool,
    ) -> Option<usize> {
        let place = self.memory.place(addr, len);
        let (kind, start, conflict) = match place {
            Some(Place::Inside(start)) => {
                let streams = &self.streams;
                let block = self.memory.blocks.get_mut(&start)?;
                block.prune(streams);
                match block.unordered_use(frontier, addr, len, write) {
                    None => return Some(start),
                    Some(other) => (HazardKind::ConcurrentUse, Some(start), Some(other)),
                }
            }
            Some(Place::Bad { touches_live: true }) => (HazardKind::OutOfBounds, None, None),
            _ => (HazardKind::UsedAfterFree, None, None),
        };
        let h = hazard(kind, addr, len, Some(key), conflict);
        self.memory.hazards.push(h);
        start
    }

    /// Queues one work item on `key` that uses the given ranges (each with
    /// the start of its live block), after the hazard checks.
    fn push_use(&mut self, key: StreamKey, ranges: &[(Option<usize>, usize, usize, bool)]) {
        self.streams.push_work(key, self.policy);
        let at = self.streams.head(key);
        if self.streams.reached(at) {
            return;
        }
        for &(block, addr, len, write) in ranges {
            if let Some(block) = block.and_then(|b| self.memory.blocks.get_mut(&b)) {
                block.uses.push(Use {
                    at,
                    addr,
                    len,
                    write,
                });
            }
        }
    }

    /// [`MockBackend::use_memory`](crate::MockBackend::use_memory).
    pub(crate) fn use_memory(&mut self, key: StreamKey, addr: usize, len: usize) {
        self.streams.settle(self.policy);
        let mut block = None;
        if len > 0 {
            let frontier = self.streams.frontier(self.streams.head(key));
            block = self.check_work_use(key, &frontier, addr, len, true);
        }
        self.push_use(key, &[(block, addr, len, true)]);
    }

    /// `copy_async`'s checks and work item; the caller copies the bytes if
    /// this returns `Ok`.
    pub(crate) fn copy_async(
        &mut self,
        dst: usize,
        src: usize,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, device)?;
        self.streams.settle(self.policy);
        if size == 0 {
            self.push_use(key, &[]);
            return Ok(());
        }
        let bad = |addr| MockError::InvalidRange { addr, len: size };
        match self.memory.place(dst, size) {
            Some(Place::Inside(_)) => {}
            Some(Place::Foreign) => {
                return Err(MockError::UntrackedDestination {
                    addr: dst,
                    len: size,
                })
            }
            _ => return Err(bad(dst)),
        }
        match self.memory.place(src, size) {
            Some(Place::Inside(_) | Place::Foreign) => {}
            _ => return Err(bad(src)),
        }
        if dst < src + size && src < dst + size {
            return Err(MockError::OverlappingCopy {
                dst,
                src,
                len: size,
            });
        }
        let frontier = self.streams.frontier(self.streams.head(key));
        let dst_block = self.check_work_use(key, &frontier, dst, size, true);
        let src_block = match self.memory.place(src, size) {
            Some(Place::Inside(_)) => self.check_work_use(key, &frontier, src, size, false),
            _ => None,
        };
        self.push_use(
            key,
            &[(dst_block, dst, size, true), (src_block, src, size, false)],
        );
        Ok(())
    }

    /// `Ok` if `[addr, addr + len)` lies inside one live block of device
    /// memory of `device` (an empty range always does), for a simulated
    /// kernel on a stream of `device`.
    pub(crate) fn check_device_range(
        &self,
        addr: usize,
        len: usize,
        device: DeviceId,
    ) -> Result<(), MockError> {
        if len == 0 {
            return Ok(());
        }
        let block = match self.memory.place(addr, len) {
            Some(Place::Inside(start)) => self.memory.blocks.get(&start),
            _ => None,
        };
        match block {
            Some(b) if b.kind == MemoryKind::Device && b.device == device => Ok(()),
            Some(b) if b.kind == MemoryKind::Device => Err(MockError::CrossDevice {
                given: device,
                actual: b.device,
            }),
            _ => Err(MockError::NotDeviceMemory { addr, len }),
        }
    }

    /// A simulated kernel's work item on `key`: it reads `src` and writes
    /// `dst` (each `(addr, len)`, checked by `check_device_range`) until it
    /// completes. Records hazards as `copy_async` does.
    pub(crate) fn kernel_use(&mut self, key: StreamKey, src: (usize, usize), dst: (usize, usize)) {
        self.streams.settle(self.policy);
        let frontier = self.streams.frontier(self.streams.head(key));
        let mut ranges = [(None, dst.0, dst.1, true), (None, src.0, src.1, false)];
        for r in &mut ranges {
            if r.2 > 0 {
                r.0 = self.check_work_use(key, &frontier, r.1, r.2, r.3);
            }
        }
        self.push_use(key, &ranges);
    }

    /// [`MockBackend::host_access`](crate::MockBackend::host_access).
    pub(crate) fn host_access(&mut self, addr: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.streams.settle(self.policy);
        let found = match self.memory.place(addr, len) {
            Some(Place::Inside(start)) => {
                let streams = &self.streams;
                let Some(block) = self.memory.blocks.get_mut(&start) else {
                    return;
                };
                block.prune(streams);
                if block.kind == MemoryKind::Device {
                    Some((HazardKind::HostAccessToDevice, None))
                } else {
                    block
                        .uses
                        .iter()
                        .find(|u| u.overlaps(addr, len))
                        .map(|u| (HazardKind::HostAccessWhileInUse, Some(u.at.stream)))
                }
            }
            Some(Place::Bad { touches_live: true }) => Some((HazardKind::OutOfBounds, None)),
            _ => Some((HazardKind::UsedAfterFree, None)),
        };
        if let Some((kind, conflict)) = found {
            let h = hazard(kind, addr, len, None, conflict);
            self.memory.hazards.push(h);
        }
    }
}

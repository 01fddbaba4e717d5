//! The memory calls of the simulated machine: [`State`]'s allocations, frees,
//! copies, simulated kernels and host accesses, over the blocks and the
//! hazard detector of [`crate::memory`] and the streams of
//! [`crate::queue`]. Apart from `memory.rs` so that the memory model sits
//! below [`State`], which holds it, and these calls above both.

use core::alloc::Layout;
use core::ptr::NonNull;

use gpupool_core::{DeviceId, MemoryKind, StreamHandle};

use crate::error::{BlockLayout, MockError};
use crate::heap::Allocation;
use crate::memory::{hazard, Block, HazardKind, Place, Use};
use crate::queue::{Frontier, Point, StreamKey};
use crate::state::State;

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

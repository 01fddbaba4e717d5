//! The memory calls of the simulated machine: [`State`]'s allocations, frees,
//! copies, simulated kernels and host accesses, over the blocks and the
//! hazard detector of [`crate::memory`] and the streams of
//! [`crate::queue`]. Apart from `memory.rs` so that the memory model sits
//! below [`State`], which holds it, and these calls above both.

use core::alloc::Layout;
use core::ptr::NonNull;

use gpupool_core::{BackendOp as CallKind, DeviceId, MemoryKind, StreamHandle};

use crate::capture::{CaptureId, Node, NodeUse};
use crate::error::{BlockLayout, MockError};
use crate::heap::Allocation;
use crate::memory::{hazard, Block, HazardKind, Holder, Place, Use};
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
        if !self.memory.after_uses.is_empty() {
            let mut waiting = core::mem::take(&mut self.memory.after_uses);
            waiting.retain(|&addr| {
                let Some(block) = self.memory.blocks.get_mut(&addr) else {
                    return false;
                };
                block.prune(&self.streams);
                if block.uses.is_empty() {
                    self.memory.reclaim(addr);
                    false
                } else {
                    true
                }
            });
            self.memory.after_uses = waiting;
        }
    }

    /// `allocate` and, with a stream, `allocate_async`. Without a stream it
    /// may be refused by an open capture (`State::refuse_in_capture`); on a
    /// capturing stream the block is a graph allocation of the capture, and
    /// the allocation one of its items.
    pub(crate) fn allocate(
        &mut self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
        stream: Option<StreamHandle>,
    ) -> Result<NonNull<u8>, MockError> {
        self.check_device(device)?;
        let key = match stream {
            Some(stream) => Some(self.stream_key(stream, device)?),
            None => None,
        };
        let layout = Layout::from_size_align(size, align)
            .ok()
            .filter(|l| l.size() > 0)
            .ok_or(MockError::InvalidLayout { size, align })?;
        let capture = key.and_then(|k| Some((self.captures.of_stream(k)?, k)));
        if key.is_none() {
            self.refuse_in_capture(CallKind::Allocate, Some(kind), None, None)?;
        } else if capture.is_none() {
            // Stream-ordered, on a stream that is not capturing: the H200
            // refuses a device allocation there while a capture forbids
            // this thread potentially unsafe calls.
            self.refuse_in_capture(CallKind::AllocateAsync, Some(kind), None, None)?;
        }
        let memory = Allocation::new(layout).ok_or(MockError::OutOfMemory { size, align })?;
        let ptr = memory.ptr();
        let addr = ptr.as_ptr().addr();
        let holder = match capture {
            Some((id, _)) => Holder::Graph {
                graph: id,
                freed: false,
            },
            None => Holder::Nobody,
        };
        let block = Block {
            memory,
            kind,
            device,
            free_at: None,
            released: false,
            holder,
            uses: Vec::new(),
        };
        let mem = &mut self.memory;
        mem.blocks.insert(addr, block);
        let k = kind.index();
        mem.live[k] += size;
        mem.peak[k] = mem.peak[k].max(mem.live[k]);
        if let Some((id, key)) = capture {
            if let Some(c) = self.captures.get_mut(id) {
                c.blocks.push(addr);
            }
            self.capture_item(id, key, Vec::new());
        }
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
        self.memory.block_to_free(given, ptr)?;
        self.refuse_in_capture(CallKind::Deallocate, Some(given.kind), None, None)?;
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
    /// current position; on a capturing stream, a free item of the capture
    /// (`State::capture_free`).
    ///
    /// `for_graph`: the call is `keep_for_graph`. A pinned or managed block
    /// freed by `deallocate_async` on a capturing stream is refused
    /// ([`MockError::CaptureUnsupported`], the capture invalidated), as the
    /// CUDA backend's stream-ordered reuse of such blocks breaks the capture
    /// on the H200 (it asks the stream); `keep_for_graph` is the call for it.
    pub(crate) fn deallocate_async(
        &mut self,
        given: BlockLayout,
        ptr: NonNull<u8>,
        stream: StreamHandle,
        for_graph: bool,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, given.device)?;
        if let Some(id) = self.captures.of_stream(key) {
            self.memory.block_to_free(given, ptr)?;
            if !for_graph && matches!(given.kind, MemoryKind::Pinned | MemoryKind::Managed) {
                self.captures.invalidate(id);
                return Err(MockError::CaptureUnsupported);
            }
            return self.capture_free(id, key, ptr.as_ptr().addr());
        }
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
    /// `graph`: the graph the item replays, which may use the blocks
    /// reserved for it (no other work may).
    fn check_work_use(
        &mut self,
        key: StreamKey,
        frontier: &Frontier,
        addr: usize,
        len: usize,
        write: bool,
        graph: Option<CaptureId>,
    ) -> Option<usize> {
        let place = self.memory.place(addr, len);
        let (kind, start, conflict) = match place {
            Some(Place::Inside(start)) => {
                let streams = &self.streams;
                let block = self.memory.blocks.get_mut(&start)?;
                block.prune(streams);
                let reserved = block.holder.reserved_for();
                if reserved.is_some() && reserved != graph {
                    (HazardKind::HeldByGraph, Some(start), None)
                } else {
                    match block.unordered_use(frontier, addr, len, write) {
                        None => return Some(start),
                        Some(other) => (HazardKind::ConcurrentUse, Some(start), Some(other)),
                    }
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
        if let Some(id) = self.captures.of_stream(key) {
            let uses = vec![NodeUse {
                addr,
                len,
                write: true,
            }];
            self.capture_item(id, key, uses);
            return;
        }
        self.streams.settle(self.policy);
        let mut block = None;
        if len > 0 {
            let frontier = self.streams.frontier(self.streams.head(key));
            block = self.check_work_use(key, &frontier, addr, len, true, None);
        }
        self.push_use(key, &[(block, addr, len, true)]);
    }

    /// [`MockBackend::enqueue_work`](crate::MockBackend::enqueue_work): one
    /// work item on `key` (captured if `key` is capturing).
    pub(crate) fn enqueue_work(&mut self, key: StreamKey) {
        if let Some(id) = self.captures.of_stream(key) {
            self.capture_item(id, key, Vec::new());
            return;
        }
        self.streams.settle(self.policy);
        self.streams.push_work(key, self.policy);
    }

    /// Queues graph `graph`'s items (`nodes`) on `key`, one work item each,
    /// with the hazard checks of any work (the blocks reserved for the graph
    /// are the graph's to use).
    pub(crate) fn launch_nodes(&mut self, key: StreamKey, graph: CaptureId, nodes: &[Node]) {
        self.streams.settle(self.policy);
        for node in nodes {
            let frontier = self.streams.frontier(self.streams.head(key));
            let mut ranges = Vec::with_capacity(node.uses.len());
            for u in &node.uses {
                let block = if u.len > 0 {
                    self.check_work_use(key, &frontier, u.addr, u.len, u.write, Some(graph))
                } else {
                    None
                };
                ranges.push((block, u.addr, u.len, u.write));
            }
            self.push_use(key, &ranges);
        }
    }

    /// `copy_async`'s checks and work item; the caller copies the bytes if
    /// this returns `Ok(true)`. On a capturing stream the copy is an item of
    /// the capture, and nothing is copied (`Ok(false)`).
    pub(crate) fn copy_async(
        &mut self,
        dst: usize,
        src: usize,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<bool, MockError> {
        let key = self.stream_key(stream, device)?;
        let capture = self.captures.of_stream(key);
        if size == 0 {
            match capture {
                Some(id) => self.capture_item(id, key, Vec::new()),
                None => {
                    self.streams.settle(self.policy);
                    self.push_use(key, &[]);
                }
            }
            return Ok(capture.is_none());
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
        let src_tracked = matches!(self.memory.place(src, size), Some(Place::Inside(_)));
        if let Some(id) = capture {
            let mut uses = vec![NodeUse {
                addr: dst,
                len: size,
                write: true,
            }];
            if src_tracked {
                uses.push(NodeUse {
                    addr: src,
                    len: size,
                    write: false,
                });
            }
            self.capture_item(id, key, uses);
            return Ok(false);
        }
        self.streams.settle(self.policy);
        let frontier = self.streams.frontier(self.streams.head(key));
        let dst_block = self.check_work_use(key, &frontier, dst, size, true, None);
        let src_block = match src_tracked {
            true => self.check_work_use(key, &frontier, src, size, false, None),
            false => None,
        };
        self.push_use(
            key,
            &[(dst_block, dst, size, true), (src_block, src, size, false)],
        );
        Ok(true)
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
    /// completes. Records hazards as `copy_async` does. On a capturing
    /// stream, an item of the capture instead.
    pub(crate) fn kernel_use(&mut self, key: StreamKey, src: (usize, usize), dst: (usize, usize)) {
        if let Some(id) = self.captures.of_stream(key) {
            let uses = vec![
                NodeUse {
                    addr: dst.0,
                    len: dst.1,
                    write: true,
                },
                NodeUse {
                    addr: src.0,
                    len: src.1,
                    write: false,
                },
            ];
            self.capture_item(id, key, uses);
            return;
        }
        self.streams.settle(self.policy);
        let frontier = self.streams.frontier(self.streams.head(key));
        let mut ranges = [(None, dst.0, dst.1, true), (None, src.0, src.1, false)];
        for r in &mut ranges {
            if r.2 > 0 {
                r.0 = self.check_work_use(key, &frontier, r.1, r.2, r.3, None);
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
                } else if block.holder.reserved_for().is_some() {
                    Some((HazardKind::HeldByGraph, None))
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

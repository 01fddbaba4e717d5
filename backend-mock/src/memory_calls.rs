//! The memory calls of the simulated machine: [`State`]'s allocations, frees,
//! copies, simulated kernels and host accesses, over the blocks and the
//! hazard detector of [`crate::memory`] and the streams of
//! [`crate::queue`], and the one decision of which ranges a call may not
//! touch at all ([`State::touchable`], see [Refusals](crate#refusals)).
//! Apart from `memory.rs` so that the memory model sits below [`State`],
//! which holds it, and these calls above both.

use core::alloc::Layout;
use core::ptr::NonNull;

use gpupool_core::{BackendOp as CallKind, DeviceId, MemoryKind, StreamHandle};

use crate::capture::{CaptureId, Node, NodeUse};
use crate::error::{BlockLayout, MockError};
use crate::heap::Allocation;
use crate::memory::{hazard, misplaced, Block, Hazard, HazardKind, Holder, Place, Use};
use crate::queue::{Frontier, Point, StreamKey};
use crate::state::State;

/// Who touches memory, for [`State::touchable`].
#[derive(Copy, Clone, Debug)]
enum Toucher {
    /// The host ([`MockBackend::host_access`](crate::MockBackend::host_access)).
    Host,
    /// Work on `stream`: an item of capture `graph` (or a launch of its
    /// graph), if any.
    Work {
        stream: StreamKey,
        graph: Option<CaptureId>,
    },
}

impl Toucher {
    /// The stream a hazard names: `None` for the host.
    fn stream(self) -> Option<StreamKey> {
        match self {
            Toucher::Host => None,
            Toucher::Work { stream, .. } => Some(stream),
        }
    }
}

/// The hazard that records a refusal of [`State::touchable`] of
/// `[addr, addr + len)` to `who`.
fn refusal_hazard(refused: &MockError, who: Toucher, addr: usize, len: usize) -> Hazard {
    let kind = match refused {
        MockError::HeldByGraph { .. } => HazardKind::HeldByGraph,
        _ => HazardKind::UsedAfterFree,
    };
    hazard(kind, addr, len, who.stream(), None)
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
        // A graph allocation freed by its graph may have lived here.
        let stale: Vec<usize> = self
            .memory
            .freed_by_graph
            .range(addr..addr + size)
            .copied()
            .collect();
        for a in stale {
            self.memory.freed_by_graph.remove(&a);
        }
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
            return self.capture_free(id, key, ptr.as_ptr().addr(), for_graph);
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

    /// Where `[addr, addr + len)` lies (`None`: it wraps around), unless
    /// `who` may not touch it at all (see [Refusals](crate#refusals)): a
    /// range that reaches a reclaimed block the mock still remembers and
    /// lies in no live block ([`MockError::UseAfterFree`]), or one inside a
    /// block of a graph when `who` is not that graph's work
    /// ([`MockError::HeldByGraph`]: for work, a graph allocation or a block
    /// reserved for a graph; for the host, which may fill a host-visible
    /// block a capture allocated, a block reserved for a graph).
    ///
    /// The one place that decides it, over [`Memory::place`](crate::memory::Memory::place),
    /// which says where a range lies. It records nothing.
    fn touchable(&self, addr: usize, len: usize, who: Toucher) -> Result<Option<Place>, MockError> {
        let place = self.memory.place(addr, len);
        let holder = match place {
            Some(Place::Reclaimed) => return Err(MockError::UseAfterFree { addr, len }),
            Some(Place::Inside(start)) => self.memory.blocks.get(&start).map(|b| b.holder),
            _ => None,
        };
        let foreign_graph = match (holder, who) {
            (Some(holder), Toucher::Host) => holder.is_reserved(),
            (Some(Holder::Kept), Toucher::Work { graph, .. }) => graph.is_none(),
            (Some(holder), Toucher::Work { graph, .. }) => {
                holder.graph().is_some_and(|g| Some(g) != graph)
            }
            (None, _) => false,
        };
        if foreign_graph {
            return Err(MockError::HeldByGraph { addr, len });
        }
        Ok(place)
    }

    /// [`touchable`](Self::touchable) for a test-harness call, whose errors
    /// are not misuses: a refusal is recorded as a hazard of `who` too.
    fn touchable_recorded(
        &mut self,
        addr: usize,
        len: usize,
        who: Toucher,
    ) -> Result<Option<Place>, MockError> {
        self.touchable(addr, len, who).inspect_err(|refused| {
            let h = refusal_hazard(refused, who, addr, len);
            self.memory.hazards.push(h);
        })
    }

    /// Work on `key`, as a [`Toucher`]: of the capture `key` is in, if any.
    fn work_on(&self, key: StreamKey) -> Toucher {
        Toucher::Work {
            stream: key,
            graph: self.captures.of_stream(key),
        }
    }

    /// Records hazards for a work item about to be queued on `key` that
    /// uses `[addr, addr + len)`, and returns the live block it lies in.
    /// `graph`: the graph the item replays, which may use its own blocks (no
    /// other work may). A range [`touchable`](Self::touchable) refuses is
    /// recorded as a hazard here (only a graph launch reaches this with one:
    /// every other call refused it already).
    fn check_work_use(
        &mut self,
        key: StreamKey,
        frontier: &Frontier,
        addr: usize,
        len: usize,
        write: bool,
        graph: Option<CaptureId>,
    ) -> Option<usize> {
        let who = Toucher::Work { stream: key, graph };
        let place = match self.touchable(addr, len, who) {
            Ok(place) => place,
            Err(refused) => {
                let h = refusal_hazard(&refused, who, addr, len);
                self.memory.hazards.push(h);
                // The launch goes ahead: its use of another graph's live
                // block is tracked like any use (a reclaimed range has no
                // block to track it on).
                return match self.memory.place(addr, len) {
                    Some(Place::Inside(start)) => Some(start),
                    _ => None,
                };
            }
        };
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
            other => (misplaced(other), None, None),
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

    /// [`MockBackend::use_memory`](crate::MockBackend::use_memory): refused
    /// (and recorded) for a range the work may not touch, else captured or
    /// queued.
    pub(crate) fn use_memory(
        &mut self,
        key: StreamKey,
        addr: usize,
        len: usize,
    ) -> Result<(), MockError> {
        let who = self.work_on(key);
        self.touchable_recorded(addr, len, who)?;
        if let Some(id) = self.captures.of_stream(key) {
            let uses = vec![NodeUse {
                addr,
                len,
                write: true,
            }];
            self.capture_item(id, key, uses);
            return Ok(());
        }
        self.streams.settle(self.policy);
        let mut block = None;
        if len > 0 {
            let frontier = self.streams.frontier(self.streams.head(key));
            block = self.check_work_use(key, &frontier, addr, len, true, None);
        }
        self.push_use(key, &[(block, addr, len, true)]);
        Ok(())
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
}

mod transfers;

//! The capture model's calls: what the backend calls and the harness ask of
//! the open captures (refusals, captured work, waits, frees and blocks kept
//! for graphs, the end of a capture), as methods of the machine's state. The
//! bookkeeping they use is in `capture.rs`.

use gpupool_core::{BackendOp as CallKind, MemoryKind};

use crate::capture::{potentially_unsafe, CaptureId, Ended, NodeUse};
use crate::error::MockError;
use crate::memory::{hazard, misplaced, HazardKind, Place};
use crate::queue::StreamKey;
use crate::state::State;

impl State {
    /// Refuses a call that an open capture forbids, invalidating the
    /// captures it would break: a call naming the capturing stream `stream`
    /// or the captured event `event` ([`MockError::CaptureUnsupported`]), or
    /// a [`potentially_unsafe`] call of `call` (on memory of `kind`) that an
    /// open capture forbids the calling thread
    /// ([`MockError::CaptureProhibited`]). Call it once the handles are
    /// checked; `Ok` means the call goes ahead.
    pub(crate) fn refuse_in_capture(
        &mut self,
        call: CallKind,
        kind: Option<MemoryKind>,
        stream: Option<StreamKey>,
        event: Option<usize>,
    ) -> Result<(), MockError> {
        if self.captures.none_open() {
            return Ok(());
        }
        let named = stream
            .and_then(|k| self.captures.of_stream(k))
            .or_else(|| event.and_then(|e| self.captures.of_event(e)));
        let (mut broken, mode) = if potentially_unsafe(call, kind) {
            self.captures.prohibiting()
        } else {
            (Vec::new(), None)
        };
        broken.extend(named);
        if broken.is_empty() {
            return Ok(());
        }
        for id in broken {
            self.captures.invalidate(id);
        }
        Err(match (named, mode) {
            (None, Some(mode)) => MockError::CaptureProhibited(mode),
            _ => MockError::CaptureUnsupported,
        })
    }

    /// Records a hazard, found on member `key` of capture `id`, for a use of
    /// `[addr, addr + len)` about to be captured: the range is not inside a
    /// live block, or its block is held for a graph (freed in this capture
    /// already, or in another), or an earlier item of the capture uses it
    /// unordered. What the replays find is checked again at each launch.
    fn check_captured_use(&mut self, id: CaptureId, key: StreamKey, u: NodeUse) {
        let found = match self.memory.place(u.addr, u.len) {
            Some(Place::Inside(start)) => {
                let reserved = self
                    .memory
                    .blocks
                    .get(&start)
                    .and_then(|b| b.holder.reserved_for());
                match reserved {
                    Some(g) if g == id => Some((HazardKind::UsedAfterFree, None)),
                    Some(_) => Some((HazardKind::HeldByGraph, None)),
                    None => self
                        .captures
                        .unordered_use(id, key, u.addr, u.len, u.write)
                        .map(|other| (HazardKind::ConcurrentUse, Some(other))),
                }
            }
            other => Some((misplaced(other), None)),
        };
        if let Some((kind, conflict)) = found {
            let h = hazard(kind, u.addr, u.len, Some(key), conflict);
            self.memory.hazards.push(h);
        }
    }

    /// Captures one item on member `key` of capture `id` that uses `uses`
    /// (each checked first, see `check_captured_use`), instead of queueing
    /// it: nothing runs and `key`'s queue does not change.
    pub(crate) fn capture_item(&mut self, id: CaptureId, key: StreamKey, uses: Vec<NodeUse>) {
        for &u in &uses {
            if u.len > 0 {
                self.check_captured_use(id, key, u);
            }
        }
        self.captures.push_node(id, key, uses);
    }

    /// A stream-ordered free of the block at `addr` (already checked by
    /// `Memory::block_to_free`) captured on member `key` of capture `id`: a
    /// graph allocation of this capture is freed by the graph (reserved for
    /// it); another host-visible block is held for the graph; other device
    /// memory cannot be freed by a graph ([`MockError::NotGraphAllocation`],
    /// and the capture is invalidated). Records a hazard if an item of the
    /// capture uses the block unordered with the free.
    pub(crate) fn capture_free(
        &mut self,
        id: CaptureId,
        key: StreamKey,
        addr: usize,
        for_graph: bool,
    ) -> Result<(), MockError> {
        use crate::memory::Holder;
        let Some(block) = self.memory.blocks.get_mut(&addr) else {
            return Err(MockError::InvalidPointer(addr));
        };
        let (size, kind) = (block.size(), block.kind);
        match block.holder {
            // The capture's own allocation: a free node of the graph.
            Holder::Graph { graph, .. } if graph == id => {
                block.holder = Holder::Graph { graph, freed: true };
            }
            // A host-visible block, or any block kept for the graph
            // (`keep_for_graph`: a device block allocated before the
            // capture, which the graph's replays may use): held for the
            // graph. Nothing frees it in the graph, so it is no item of the
            // capture (CUDA adds no node either).
            Holder::Nobody if kind != MemoryKind::Device || for_graph => {
                block.holder = Holder::Held(id);
                if let Some(c) = self.captures.get_mut(id) {
                    c.blocks.push(addr);
                }
                return Ok(());
            }
            _ => {
                self.captures.invalidate(id);
                return Err(MockError::NotGraphAllocation(addr));
            }
        }
        if let Some(other) = self.captures.unordered_use(id, key, addr, size, true) {
            let h = hazard(
                HazardKind::FreedWhileInUse,
                addr,
                size,
                Some(key),
                Some(other),
            );
            self.memory.hazards.push(h);
        }
        self.captures.push_node(id, key, Vec::new());
        Ok(())
    }

    /// `MemoryBackend::keep_for_graph`: the block goes to capture `capture`
    /// (the capture's own allocation is freed by the graph, anything else
    /// held for it) if `stream` is still in that capture; otherwise it is
    /// kept as by `keep_for_ended_captures`.
    /// Errors as for a free.
    pub(crate) fn keep_for_graph(
        &mut self,
        given: crate::error::BlockLayout,
        ptr: core::ptr::NonNull<u8>,
        stream: gpupool_core::StreamHandle,
        capture: CaptureId,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, given.device)?;
        match self.captures.of_stream(key) {
            Some(id) if id == capture => {
                self.memory.block_to_free(given, ptr)?;
                self.capture_free(id, key, ptr.as_ptr().addr(), true)
            }
            _ => self.keep_for_ended_captures(given, ptr),
        }
    }

    /// Ends the capture `key` is the origin of: every member leaves it, its
    /// captured events become events never recorded. On failure (not an
    /// origin, invalidated, unjoined) what the capture owned is freed.
    pub(crate) fn end_capture(&mut self, key: StreamKey) -> Result<Ended, MockError> {
        let not_origin = MockError::NotCaptureOrigin(key.handle());
        let Some(id) = self.captures.of_stream(key) else {
            return Err(not_origin);
        };
        if self.captures.get(id).is_some_and(|c| c.origin != key) {
            // CUDA's `cuStreamEndCapture` on a joined stream breaks the capture.
            self.captures.invalidate(id);
            return Err(not_origin);
        }
        for event in self.captures.events_of(id) {
            if let Some(e) = self.events.get_mut(&event) {
                e.forget_target();
            }
        }
        match self.captures.end(id) {
            None => Err(not_origin),
            Some((ended, None)) => {
                // What its launches use, for the blocks kept for graphs.
                let uses = ended.nodes.iter().flat_map(|n| n.uses.iter().copied());
                self.graph_ranges.insert(ended.id, uses.collect());
                Ok(ended)
            }
            Some((ended, Some(error))) => {
                self.release_graph(ended.id, &ended.blocks);
                Err(error)
            }
        }
    }

    /// Frees what graph (or failed capture) `id` owns, of the blocks at
    /// `blocks`: each one still owned by it and not freed otherwise is
    /// released, and reclaimed once no work of the graph's launches uses it
    /// any more.
    pub(crate) fn release_graph(&mut self, id: CaptureId, blocks: &[usize]) {
        self.graph_ranges.remove(&id);
        for &addr in blocks {
            let Some(block) = self.memory.blocks.get(&addr) else {
                continue;
            };
            if !block.holder.owned_by(id) || block.is_freed() {
                continue;
            }
            if matches!(
                block.holder,
                crate::memory::Holder::Graph { freed: false, .. }
            ) {
                // Nobody freed this graph allocation: its owner may still
                // name it (`keep_for_ended_captures`).
                self.memory.freed_by_graph.insert(addr);
            }
            self.release_block(addr);
        }
        self.release_unused_kept();
    }

    /// Frees a block that no new use may reach any more (its graph's end, or
    /// kept blocks no graph uses now): reclaimed at once, or once the work
    /// that still uses it completes.
    fn release_block(&mut self, addr: usize) {
        let Some(block) = self.memory.blocks.get_mut(&addr) else {
            return;
        };
        block.released = true;
        block.prune(&self.streams);
        let idle = block.uses.is_empty();
        let (kind, size) = (block.kind.index(), block.size());
        self.memory.pending_free[kind] += size;
        if idle {
            self.memory.reclaim(addr);
        } else {
            self.memory.after_uses.push(addr);
        }
    }

    /// `MemoryBackend::keep_for_ended_captures`: keeps a block for the graphs
    /// captured earlier that may use it ([`Holder::Kept`]), freed once none
    /// does; at once if none does now. A graph allocation is its graph's to
    /// free (or was freed by it already): nothing to do. Errors as for a
    /// free (the block must be live, unfreed, of this layout).
    ///
    /// [`Holder::Kept`]: crate::memory::Holder::Kept
    pub(crate) fn keep_for_ended_captures(
        &mut self,
        given: crate::error::BlockLayout,
        ptr: core::ptr::NonNull<u8>,
    ) -> Result<(), MockError> {
        use crate::memory::Holder;
        let addr = ptr.as_ptr().addr();
        if self.memory.freed_by_graph.remove(&addr) {
            return Ok(());
        }
        if let Some(block) = self.memory.blocks.get(&addr) {
            if matches!(block.holder, Holder::Graph { freed: false, .. }) && !block.is_freed() {
                return Ok(());
            }
        }
        let block = self.memory.block_to_free(given, ptr)?;
        block.holder = Holder::Kept;
        self.memory.kept.push(addr);
        self.release_unused_kept();
        Ok(())
    }

    /// Frees the kept blocks that no graph (alive, or being captured) uses
    /// any more: a graph's nodes name the ranges its launches use.
    pub(crate) fn release_unused_kept(&mut self) {
        let kept = core::mem::take(&mut self.memory.kept);
        for addr in kept {
            let Some(len) = self.memory.blocks.get(&addr).map(|b| b.size()) else {
                continue;
            };
            let overlaps = |u: &NodeUse| u.addr < addr + len && addr < u.addr + u.len;
            let used = self.graph_ranges.values().flatten().any(overlaps)
                || self.captures.node_uses().any(overlaps);
            if used {
                self.memory.kept.push(addr);
            } else {
                self.release_block(addr);
            }
        }
    }
}

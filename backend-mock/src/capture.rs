//! The capture model's bookkeeping: which streams are in which graph
//! capture, what each capture has recorded (its nodes, its captured events,
//! the ordering between its streams), the calls refused while a capture is
//! open, and how a capture ends. The harness calls that begin and end a
//! capture and launch its graph are in `graph.rs`; the backend calls consult
//! this module where they would otherwise queue work (`state.rs`,
//! `memory_calls.rs`). See [Capture](crate#capture) for the model.
//!
//! Ordering inside a capture is tracked as the queues track it outside one,
//! with positions: each stream of a capture (a *member*) counts the items
//! captured on it, and knows, for every other member, how many of that
//! member's items are ordered before its own next item (through captured
//! waits, followed transitively: a captured event carries the ordering of
//! the stream it was recorded on). A member is *joined back* when the
//! origin is ordered after all of its items.

use std::collections::BTreeMap;

use gpupool_core::{BackendOp as CallKind, CaptureStatus, DeviceId, MemoryKind};

use crate::error::MockError;
use crate::memory::{hazard, misplaced, HazardKind, Place};
use crate::queue::StreamKey;
use crate::state::State;
use crate::sync::{current_thread, ThreadId};

/// How an open capture restricts the "potentially unsafe" calls of the
/// threads: the core's [`CaptureMode`](gpupool_core::CaptureMode), modelled
/// as [Capture](crate#capture) says.
pub use gpupool_core::CaptureMode;

/// A call of the capture harness, named by the [`Misuse`](crate::Misuse)
/// it caused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum HarnessCall {
    /// [`MockBackend::begin_capture`](crate::MockBackend::begin_capture).
    BeginCapture,
    /// [`MockBackend::end_capture`](crate::MockBackend::end_capture).
    EndCapture,
    /// [`MockBackend::launch_graph`](crate::MockBackend::launch_graph).
    LaunchGraph,
    /// [`MockBackend::destroy_graph`](crate::MockBackend::destroy_graph).
    DestroyGraph,
}

/// The calls that an open capture may refuse to a thread that is not
/// capturing anything (CUDA's "potentially unsafe API calls"): a call of
/// `call` on memory of `kind` (for the memory calls).
///
/// The one place that lists them, so that the set can follow what the H200
/// measures (`docs/graph-capture.md`, measured on an H200 on 2026-12-01):
/// the synchronous allocation and free of device-visible memory (device,
/// pinned, managed; `cuMemAlloc` and `cuMemHostAlloc` are refused), a
/// stream-ordered device allocation on a stream outside the capture
/// (`cuMemAllocAsync` is refused), and every query and synchronization of a
/// stream or an event, whatever stream or event it names (`cuStreamQuery`,
/// `cuEventQuery`, `cuStreamSynchronize` are refused). A record
/// (`cuEventRecord` is allowed), a wait, a copy, creating a stream or an
/// event (both allowed), destroying handles and asking a capture status are
/// never refused on this ground.
pub(crate) fn potentially_unsafe(call: CallKind, kind: Option<MemoryKind>) -> bool {
    match call {
        CallKind::Allocate | CallKind::Deallocate => kind != Some(MemoryKind::Host),
        CallKind::AllocateAsync => kind == Some(MemoryKind::Device),
        CallKind::QueryStream
        | CallKind::QueryEvent
        | CallKind::SynchronizeStream
        | CallKind::SynchronizeEvent => true,
        _ => false,
    }
}

/// A capture's id, shared by the graph it ends in; never reused.
pub(crate) type CaptureId = u64;

/// Where a captured item sits: its stream and its position there (the
/// stream's first captured item is at 1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) stream: StreamKey,
    pub(crate) pos: u64,
}

/// One stream of a capture.
#[derive(Clone, Debug, Default)]
struct Member {
    /// Items captured on the stream so far.
    pos: u64,
    /// For other members: how many of their items are ordered before this
    /// stream's next item.
    after: BTreeMap<StreamKey, u64>,
}

impl Member {
    /// Whether the item `at` is ordered before this member's (`me`) next item.
    fn covers(&self, me: StreamKey, at: At) -> bool {
        at.stream == me || self.after.get(&at.stream).is_some_and(|&p| p >= at.pos)
    }

    /// Orders this member's next items after what `mark` captured.
    fn absorb(&mut self, mark: &Mark) {
        let items = core::iter::once((mark.stream, mark.pos))
            .chain(mark.after.iter().map(|(&k, &p)| (k, p)));
        for (stream, pos) in items {
            let known = self.after.entry(stream).or_insert(0);
            *known = (*known).max(pos);
        }
    }
}

/// What a captured event captured: its stream's position and ordering when
/// it was recorded.
#[derive(Clone, Debug)]
struct Mark {
    stream: StreamKey,
    pos: u64,
    after: BTreeMap<StreamKey, u64>,
}

/// A range a captured item uses, replayed at each launch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeUse {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    /// Whether the item may write it.
    pub(crate) write: bool,
}

/// One captured item (simulated work, a copy, a kernel, a stream-ordered
/// allocation or free): a work item with these uses at each launch.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) at: At,
    pub(crate) uses: Vec<NodeUse>,
}

/// One open capture.
#[derive(Debug)]
pub(crate) struct Capture {
    pub(crate) origin: StreamKey,
    /// The origin's device: the graph's.
    pub(crate) device: DeviceId,
    mode: CaptureMode,
    /// The thread that began it.
    thread: ThreadId,
    /// Begun through gpupool (`CaptureBackend::begin_capture`): while such
    /// a capture in a restricting mode is open, the backend's calls run in
    /// relaxed interaction mode, as the CUDA backend's do, so no capture
    /// prohibits them (see `prohibiting`).
    through_gpupool: bool,
    invalidated: bool,
    /// Every stream in it, the origin included.
    members: BTreeMap<StreamKey, Member>,
    /// The events last recorded in it, by raw handle.
    events: BTreeMap<usize, Mark>,
    pub(crate) nodes: Vec<Node>,
    /// The start addresses of the blocks it owns (see
    /// [`Holder`](crate::memory::Holder)): its graph allocations and the
    /// blocks it holds; freed when the capture fails or its graph drops.
    pub(crate) blocks: Vec<usize>,
}

/// A capture that has ended, successfully or not: what its graph needs.
pub(crate) struct Ended {
    pub(crate) id: CaptureId,
    pub(crate) device: DeviceId,
    pub(crate) nodes: Vec<Node>,
    pub(crate) blocks: Vec<usize>,
}

/// Every open capture, and which stream and event is in which.
#[derive(Debug, Default)]
pub(crate) struct Captures {
    /// The next capture's id.
    next: CaptureId,
    open: BTreeMap<CaptureId, Capture>,
    /// Every stream of an open capture.
    by_stream: BTreeMap<StreamKey, CaptureId>,
    /// Every event last recorded in an open capture, by raw handle.
    by_event: BTreeMap<usize, CaptureId>,
}

impl Captures {
    /// Whether no capture is open.
    pub(crate) fn none_open(&self) -> bool {
        self.open.is_empty()
    }

    /// How many captures are open.
    pub(crate) fn open_count(&self) -> usize {
        self.open.len()
    }

    /// The open capture `key` is in.
    pub(crate) fn of_stream(&self, key: StreamKey) -> Option<CaptureId> {
        self.by_stream.get(&key).copied()
    }

    /// The open capture the event (raw handle) was last recorded in.
    pub(crate) fn of_event(&self, event: usize) -> Option<CaptureId> {
        self.by_event.get(&event).copied()
    }

    /// What `cuStreamIsCapturing` would say of `key`.
    pub(crate) fn status(&self, key: StreamKey) -> CaptureStatus {
        match self.of_stream(key).and_then(|c| self.open.get(&c)) {
            None => CaptureStatus::NotCapturing,
            Some(c) if c.invalidated => CaptureStatus::Invalidated,
            Some(_) => CaptureStatus::Active,
        }
    }

    /// Opens a capture with origin `key` (in no capture), begun by the
    /// calling thread.
    pub(crate) fn begin(
        &mut self,
        key: StreamKey,
        device: DeviceId,
        mode: CaptureMode,
        through_gpupool: bool,
    ) {
        let id = self.next;
        self.next += 1;
        let mut members = BTreeMap::new();
        members.insert(key, Member::default());
        self.open.insert(
            id,
            Capture {
                origin: key,
                device,
                mode,
                thread: current_thread(),
                through_gpupool,
                invalidated: false,
                members,
                events: BTreeMap::new(),
                nodes: Vec::new(),
                blocks: Vec::new(),
            },
        );
        self.by_stream.insert(key, id);
    }

    /// Marks the capture invalidated (it stays open until its origin ends it).
    pub(crate) fn invalidate(&mut self, id: CaptureId) {
        if let Some(c) = self.open.get_mut(&id) {
            c.invalidated = true;
        }
    }

    /// The open capture `id`.
    pub(crate) fn get(&self, id: CaptureId) -> Option<&Capture> {
        self.open.get(&id)
    }

    /// The open capture `id`, to change.
    pub(crate) fn get_mut(&mut self, id: CaptureId) -> Option<&mut Capture> {
        self.open.get_mut(&id)
    }

    /// Records `event` (raw) on member `key` of capture `id`: a captured
    /// event of that capture from now on (of no other).
    pub(crate) fn record_event(&mut self, id: CaptureId, key: StreamKey, event: usize) {
        self.forget_event(event);
        let Some(c) = self.open.get_mut(&id) else {
            return;
        };
        let member = c.members.entry(key).or_default();
        let mark = Mark {
            stream: key,
            pos: member.pos,
            after: member.after.clone(),
        };
        c.events.insert(event, mark);
        self.by_event.insert(event, id);
    }

    /// `event` (raw) is no captured event any more (recorded outside the
    /// capture, or destroyed).
    pub(crate) fn forget_event(&mut self, event: usize) {
        if let Some(id) = self.by_event.remove(&event) {
            if let Some(c) = self.open.get_mut(&id) {
                c.events.remove(&event);
            }
        }
    }

    /// Makes `key` wait on `event` (raw), an event captured in capture `id`:
    /// `key` joins the capture if it is in none, and its next items are
    /// ordered after what the event captured.
    pub(crate) fn wait(&mut self, id: CaptureId, key: StreamKey, event: usize) {
        let Some(c) = self.open.get_mut(&id) else {
            return;
        };
        let Some(mark) = c.events.get(&event) else {
            return;
        };
        c.members.entry(key).or_default().absorb(mark);
        self.by_stream.insert(key, id);
    }

    /// Adds one item on member `key` of capture `id`, using `uses`; returns
    /// where it sits.
    pub(crate) fn push_node(&mut self, id: CaptureId, key: StreamKey, uses: Vec<NodeUse>) -> At {
        let Some(c) = self.open.get_mut(&id) else {
            return At {
                stream: key,
                pos: 0,
            };
        };
        let member = c.members.entry(key).or_default();
        member.pos += 1;
        let at = At {
            stream: key,
            pos: member.pos,
        };
        c.nodes.push(Node { at, uses });
        at
    }

    /// The first item of capture `id` that uses `[addr, addr + len)`,
    /// conflicts with `write` and is not ordered before the next item of
    /// member `key`: its stream.
    pub(crate) fn unordered_use(
        &self,
        id: CaptureId,
        key: StreamKey,
        addr: usize,
        len: usize,
        write: bool,
    ) -> Option<StreamKey> {
        let c = self.open.get(&id)?;
        let empty = Member::default();
        let member = c.members.get(&key).unwrap_or(&empty);
        c.nodes
            .iter()
            .flat_map(|n| n.uses.iter().map(move |u| (n.at, u)))
            .find(|(at, u)| {
                (u.write || write)
                    && u.addr < addr + len
                    && addr < u.addr + u.len
                    && !member.covers(key, *at)
            })
            .map(|(at, _)| at.stream)
    }

    /// The open captures a potentially unsafe call from the calling thread
    /// would break, and the mode that forbids it (`Global` over
    /// `ThreadLocal`): every open `Global` capture, and the calling thread's
    /// own `ThreadLocal` ones.
    fn prohibiting(&self) -> (Vec<CaptureId>, Option<CaptureMode>) {
        // The backend relaxes its calls while gpupool has a restricting
        // capture open (the CUDA backend's `unrestricted`): none prohibits
        // them then.
        let relaxed = self
            .open
            .values()
            .any(|c| c.through_gpupool && c.mode != CaptureMode::Relaxed);
        if relaxed {
            return (Vec::new(), None);
        }
        let me = current_thread();
        let mut ids = Vec::new();
        let mut mode = None;
        for (&id, c) in &self.open {
            let hit = match c.mode {
                CaptureMode::Global => true,
                CaptureMode::ThreadLocal => c.thread == me,
                CaptureMode::Relaxed => false,
            };
            if hit {
                ids.push(id);
                if mode != Some(CaptureMode::Global) {
                    mode = Some(c.mode);
                }
            }
        }
        (ids, mode)
    }

    /// Closes capture `id`: every member leaves it and its events are
    /// captured no more (the caller forgets what they captured). With the
    /// error that fails it, if it was invalidated or a member is not joined
    /// back (then what it owned is the caller's to free).
    pub(crate) fn end(&mut self, id: CaptureId) -> Option<(Ended, Option<MockError>)> {
        let c = self.open.remove(&id)?;
        for key in c.members.keys() {
            self.by_stream.remove(key);
        }
        for event in c.events.keys() {
            self.by_event.remove(event);
        }
        let empty = Member::default();
        let origin = c.members.get(&c.origin).unwrap_or(&empty);
        let unjoined = c.members.iter().find(|&(&key, m)| {
            let last = At {
                stream: key,
                pos: m.pos,
            };
            key != c.origin && m.pos > 0 && !origin.covers(c.origin, last)
        });
        let error = if c.invalidated {
            Some(MockError::CaptureInvalidated)
        } else {
            unjoined.map(|(key, _)| MockError::CaptureUnjoined(key.handle()))
        };
        let ended = Ended {
            id,
            device: c.device,
            nodes: c.nodes,
            blocks: c.blocks,
        };
        Some((ended, error))
    }

    /// The memory uses of every open capture's items.
    pub(crate) fn node_uses(&self) -> impl Iterator<Item = &NodeUse> {
        self.open
            .values()
            .flat_map(|c| c.nodes.iter().flat_map(|n| n.uses.iter()))
    }

    /// The events captured in capture `id` (raw handles).
    pub(crate) fn events_of(&self, id: CaptureId) -> Vec<usize> {
        self.open
            .get(&id)
            .map(|c| c.events.keys().copied().collect())
            .unwrap_or_default()
    }
}

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

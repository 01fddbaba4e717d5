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

use std::cell::Cell;
use std::collections::BTreeMap;

use gpupool_core::{BackendOp as CallKind, CaptureStatus, DeviceId, MemoryKind};

use crate::error::MockError;

use crate::queue::StreamKey;
use crate::sync::{current_thread, ThreadId};

/// How an open capture restricts the "potentially unsafe" calls of the
/// threads: the core's [`CaptureMode`](gpupool_core::CaptureMode), modelled
/// as [Capture](crate#capture) says.
pub use gpupool_core::CaptureMode;

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
    /// own `ThreadLocal` ones; none while the thread's interaction mode is
    /// relaxed ([`relax_thread`]).
    pub(crate) fn prohibiting(&self) -> (Vec<CaptureId>, Option<CaptureMode>) {
        if RELAXED_THREAD.with(Cell::get) {
            return (Vec::new(), None);
        }
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

crate::sync::thread_flag! {
    /// The calling thread's capture interaction mode is relaxed (CUDA's
    /// `cuThreadExchangeStreamCaptureMode`): no capture refuses its calls.
    static RELAXED_THREAD;
}

/// Sets the calling thread's capture interaction mode to relaxed (`true`)
/// or back (`false`); returns the one it had.
pub(crate) fn relax_thread(relaxed: bool) -> bool {
    RELAXED_THREAD.with(|r| r.replace(relaxed))
}

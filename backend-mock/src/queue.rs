//! The simulated streams: in-order queues of work items and waits, and the
//! two ways the mock moves them forward.
//!
//! A stream has a `submitted` and a `completed` position and a queue of the
//! `submitted - completed` items not finished yet. An event recorded on a
//! stream remembers a [`Point`]: the stream and its `submitted` position at the
//! time; the point is *reached* once the stream's `completed` position passes it.
//! A wait item blocks its stream until the point it names is reached.
//!
//! - [`Streams::settle`] resolves, everywhere, the waits whose point is already
//!   reached (and, under [`CompletionPolicy::Immediate`], the work behind them):
//!   what a device makes true by itself. It runs before anything is observed,
//!   so waits resolve "as soon as their condition holds".
//! - [`Streams::drain`] forces a point to be reached, completing whatever the
//!   point depends on on other streams first: what a host blocked on it sees.
//!
//! Waits cannot form a cycle: a wait names a point that existed when the wait
//! was pushed, so each one depends only on items pushed before it. That is why
//! `drain`'s explicit stack always empties.

use std::collections::{BTreeMap, VecDeque};

use gpupool_core::{DeviceId, StreamHandle};

/// When simulated work completes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CompletionPolicy {
    /// Only when a test completes it (or a synchronize needs it). The default.
    Manual,
    /// As soon as nothing is queued before it: streams look idle unless blocked
    /// on a wait, and a wait resolves as soon as the work it waits for is done.
    /// Since that work completes at once too, every stream is idle after every
    /// call. Switching to it completes the work already queued.
    Immediate,
}

/// Which stream: a device's implicit stream (what the special handles 0, 1 and
/// 2 name), or a stream made by `create_stream`, by handle.
///
/// Implicit keys order before created ones, so created streams are a range.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StreamKey {
    /// The implicit (null and legacy) stream of a device, created in the map
    /// on first use.
    Implicit(u32),
    /// The per-thread default stream of a device (handle 2), created in the
    /// map on first use: a stream apart from the legacy one (CUDA's driver
    /// API makes handle 0 the legacy stream), one per device (the mock does
    /// not tell the threads apart).
    PerThread(u32),
    /// A created stream, by handle value.
    Created(usize),
}

impl StreamKey {
    /// The handle a report names the stream by: the created stream's own, or
    /// [`StreamHandle::NULL`] for an implicit stream.
    pub(crate) fn handle(self) -> StreamHandle {
        match self {
            StreamKey::Implicit(_) => StreamHandle::NULL,
            StreamKey::PerThread(_) => StreamHandle::PER_THREAD,
            // SAFETY: `h` is the id of a stream this mock created; the handle
            // only names the stream in a report (and the mock checks every
            // handle it is given anyway).
            StreamKey::Created(h) => unsafe { StreamHandle::from_raw(h) },
        }
    }
}

/// A position in a stream: reached when the stream's `completed` position is at
/// least `pos`, or when the stream no longer exists (destroyed streams finish
/// their work; an implicit stream never used has none).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Point {
    pub(crate) stream: StreamKey,
    pub(crate) pos: u64,
}

/// The points that are certainly reached before some item starts, per stream:
/// see [`Streams::frontier`].
#[derive(Debug)]
pub(crate) struct Frontier(BTreeMap<StreamKey, u64>);

impl Frontier {
    /// Whether `point` is reached before the item the frontier was computed for.
    pub(crate) fn covers(&self, point: Point) -> bool {
        self.0
            .get(&point.stream)
            .is_some_and(|&pos| pos >= point.pos)
    }
}

/// One queued item.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Item {
    /// Simulated work (a kernel, a copy).
    Work,
    /// Blocks the stream until the point is reached.
    Wait(Point),
}

/// One simulated stream.
///
/// Invariant: `completed + queue.len() == submitted`.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) device: DeviceId,
    pub(crate) priority: Option<i32>,
    submitted: u64,
    completed: u64,
    queue: VecDeque<Item>,
}

impl Stream {
    pub(crate) fn new(device: DeviceId, priority: Option<i32>) -> Self {
        Stream {
            device,
            priority,
            submitted: 0,
            completed: 0,
            queue: VecDeque::new(),
        }
    }

    /// How many work items (not waits) have not completed.
    pub(crate) fn pending_work(&self) -> usize {
        self.queue.iter().filter(|i| **i == Item::Work).count()
    }

    /// Whether everything submitted has completed.
    pub(crate) fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Every stream of the machine, and how many wait items are queued on them.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    map: BTreeMap<StreamKey, Stream>,
    /// Wait items queued on all streams. While it is zero, nothing can be
    /// settled (under `Immediate`, no work is queued without a wait before it),
    /// so `settle` costs nothing.
    waits: usize,
}

impl Streams {
    /// The stream, if it exists (implicit streams exist once used).
    pub(crate) fn get(&self, key: StreamKey) -> Option<&Stream> {
        self.map.get(&key)
    }

    /// The stream, creating an implicit stream on first use. `None` for a
    /// created stream that does not exist.
    fn get_or_implicit(&mut self, key: StreamKey) -> Option<&mut Stream> {
        match key {
            StreamKey::Implicit(d) | StreamKey::PerThread(d) => Some(
                self.map
                    .entry(key)
                    .or_insert_with(|| Stream::new(DeviceId(d), None)),
            ),
            StreamKey::Created(_) => self.map.get_mut(&key),
        }
    }

    /// Adds a created stream.
    pub(crate) fn insert(&mut self, handle: usize, stream: Stream) {
        self.map.insert(StreamKey::Created(handle), stream);
    }

    /// Removes a created stream; its queued work counts as finished from now on.
    pub(crate) fn remove(&mut self, handle: usize) -> Option<Stream> {
        let stream = self.map.remove(&StreamKey::Created(handle))?;
        let waits = stream
            .queue
            .iter()
            .filter(|i| matches!(i, Item::Wait(_)))
            .count();
        self.waits -= waits;
        Some(stream)
    }

    /// The created streams, in handle order.
    pub(crate) fn created(&self) -> impl Iterator<Item = &Stream> {
        self.map
            .range(StreamKey::Created(0)..)
            .map(|(_, stream)| stream)
    }

    /// The point an event recorded on `key` now would capture.
    pub(crate) fn head(&self, key: StreamKey) -> Point {
        let pos = self.map.get(&key).map_or(0, |s| s.submitted);
        Point { stream: key, pos }
    }

    /// Whether `point` is reached, without settling anything.
    pub(crate) fn reached(&self, point: Point) -> bool {
        self.map
            .get(&point.stream)
            .is_none_or(|s| s.completed >= point.pos)
    }

    /// Submits a work item. Under `Immediate` it completes at once unless
    /// something is queued before it (which, after a settle, is a wait).
    pub(crate) fn push_work(&mut self, key: StreamKey, policy: CompletionPolicy) {
        if let Some(stream) = self.get_or_implicit(key) {
            stream.submitted += 1;
            if policy == CompletionPolicy::Immediate && stream.queue.is_empty() {
                stream.completed += 1;
            } else {
                stream.queue.push_back(Item::Work);
            }
        }
    }

    /// Makes `key` wait for `point`, unless it is already reached.
    pub(crate) fn push_wait(&mut self, key: StreamKey, point: Point) {
        if self.reached(point) {
            return;
        }
        if let Some(stream) = self.get_or_implicit(key) {
            stream.submitted += 1;
            stream.queue.push_back(Item::Wait(point));
            self.waits += 1;
        }
    }

    /// Completes the front item of `key`, whatever it is.
    fn pop_front(&mut self, key: StreamKey) {
        if let Some(stream) = self.map.get_mut(&key) {
            if let Some(item) = stream.queue.pop_front() {
                stream.completed += 1;
                if matches!(item, Item::Wait(_)) {
                    self.waits -= 1;
                }
            }
        }
    }

    /// Completes the front work item of `key` if there is one (call after
    /// [`settle`](Self::settle), so that a satisfied wait is not in the way).
    pub(crate) fn complete_front_work(&mut self, key: StreamKey) -> bool {
        let front = self.map.get(&key).and_then(|s| s.queue.front().copied());
        if front == Some(Item::Work) {
            self.pop_front(key);
            true
        } else {
            false
        }
    }

    /// Whether no wait is queued anywhere, so that [`settle`](Self::settle)
    /// has nothing to do (under either policy).
    pub(crate) fn nothing_to_settle(&self) -> bool {
        self.waits == 0
    }

    /// Resolves every wait whose point is reached, repeatedly, until nothing
    /// moves; under `Immediate` also completes the work that they released.
    pub(crate) fn settle(&mut self, policy: CompletionPolicy) {
        if self.nothing_to_settle() {
            return;
        }
        self.settle_all(policy);
    }

    /// [`settle`](Self::settle) without the shortcut: also completes, under
    /// `Immediate`, work queued while the policy was `Manual`.
    pub(crate) fn settle_all(&mut self, policy: CompletionPolicy) {
        let keys: Vec<StreamKey> = self.map.keys().copied().collect();
        loop {
            let mut progress = false;
            for &key in &keys {
                while self.front_can_complete(key, policy) {
                    self.pop_front(key);
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
    }

    /// Whether the front item of `key` completes without outside help.
    fn front_can_complete(&self, key: StreamKey, policy: CompletionPolicy) -> bool {
        match self.map.get(&key).and_then(|s| s.queue.front()) {
            Some(Item::Wait(point)) => self.reached(*point),
            Some(Item::Work) => policy == CompletionPolicy::Immediate,
            None => false,
        }
    }

    /// Completes everything `goal` depends on, on every stream, until it is
    /// reached: what a host thread blocked on it would observe.
    pub(crate) fn drain(&mut self, goal: Point) {
        // Points still to reach; the last one is worked on. Each wait pushes a
        // point that existed before the wait did, so the stack empties.
        let mut todo = vec![goal];
        while let Some(&Point { stream: key, pos }) = todo.last() {
            let front = match self.map.get(&key) {
                Some(s) if s.completed < pos => s.queue.front().copied(),
                _ => None,
            };
            match front {
                None => {
                    todo.pop();
                }
                Some(Item::Work) => self.pop_front(key),
                Some(Item::Wait(point)) if self.reached(point) => self.pop_front(key),
                Some(Item::Wait(point)) => todo.push(point),
            }
        }
    }

    /// What is guaranteed to have completed, on every stream, before the item
    /// that follows `from` on `from.stream` starts: the stream's own items up
    /// to `from.pos`, and, through the pending waits among them (followed
    /// transitively), the points those waits name. Waits already resolved
    /// need no following: their points are reached, so everything before them
    /// is complete.
    pub(crate) fn frontier(&self, from: Point) -> Frontier {
        let mut reach = BTreeMap::new();
        reach.insert(from.stream, from.pos);
        if self.waits == 0 {
            return Frontier(reach);
        }
        let mut todo = vec![from];
        while let Some(point) = todo.pop() {
            let Some(stream) = self.map.get(&point.stream) else {
                continue;
            };
            let queued = stream.queue.iter().zip(stream.completed + 1..);
            for (item, _) in queued.take_while(|&(_, pos)| pos <= point.pos) {
                if let Item::Wait(awaited) = *item {
                    let known = reach.entry(awaited.stream).or_insert(0);
                    if awaited.pos > *known {
                        *known = awaited.pos;
                        todo.push(awaited);
                    }
                }
            }
        }
        Frontier(reach)
    }

    /// Drains everything submitted to `key` so far.
    pub(crate) fn drain_stream(&mut self, key: StreamKey) {
        let head = self.head(key);
        self.drain(head);
    }

    /// Drains every stream.
    pub(crate) fn drain_everything(&mut self) {
        let keys: Vec<StreamKey> = self.map.keys().copied().collect();
        for key in keys {
            self.drain_stream(key);
        }
    }
}

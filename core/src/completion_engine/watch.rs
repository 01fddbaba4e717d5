//! The engine's watch list ([`Watch`]): pending entries by stream and
//! submitting thread, in submission order ([`StreamKey`]), and the passes
//! that ask the backend about them.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::cell::Cell;
use core::task::Waker;

use super::{Entry, Shared};
#[cfg(doc)]
use crate::backend::StreamBackend;
use crate::backend::{Completion, DeviceId, EventBackend, StreamHandle};
use crate::sync::Arc;

/// The stream an entry's event was recorded on, for the engine's
/// per-stream order.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) struct StreamKey {
    device: u32,
    stream: usize,
    /// The stream's own id and the submitting thread's, when the backend
    /// names the stream ([`StreamBackend::stream_id`]): the entries of such
    /// a key were recorded on one stream by one thread, in their order in
    /// the queue, so a later one that passed proves the earlier ones passed
    /// (see [`Watch::pass`]). `None`: every entry is asked about itself.
    ordered: Option<(u64, u64)>,
    /// Nonzero for an entry watched on its own (the stream is unknown, or
    /// the per-thread default stream, which names another stream on every
    /// thread): a serial number.
    apart: u64,
}

impl StreamKey {
    /// The key of `stream` of `device`, `stream_id` its own id if the
    /// backend gave one; the per-thread stream is watched apart.
    /// Called on the thread that recorded the entry's event, right after
    /// the record: also returns the entry's place in the thread's records
    /// (its sequence number), which orders the entries of an ordered key
    /// whatever order they reach the engine in.
    pub(crate) fn of(
        stream: StreamHandle,
        device: DeviceId,
        per_thread: bool,
        stream_id: Option<u64>,
    ) -> (Self, u64) {
        if per_thread {
            return (Self::apart(), 0);
        }
        let (thread, seq) = recording_thread();
        let key = StreamKey {
            device: device.0,
            stream: stream.as_raw(),
            ordered: stream_id.map(|id| (id, thread)),
            apart: 0,
        };
        (key, seq)
    }

    /// A key no other entry has.
    pub(crate) fn apart() -> Self {
        // A plain counter (not loom's: a static); any distinct values do.
        static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        StreamKey {
            device: 0,
            stream: 0,
            ordered: None,
            apart: NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// The engine's pending entries, by stream, oldest first (a `BTreeMap`:
/// the same order of visits every time, which loom needs).
pub(super) struct Watch<E> {
    streams: BTreeMap<StreamKey, VecDeque<Arc<Entry<E>>>>,
}

impl<E> Watch<E> {
    pub(super) fn new() -> Self {
        Watch {
            streams: BTreeMap::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// Adds `entry`; in the queue of an ordered key, at its place by
    /// sequence number (a future may be polled first, and so reach the
    /// engine, before an older one of the same thread).
    pub(super) fn add(&mut self, key: StreamKey, entry: Arc<Entry<E>>) {
        let queue = self.streams.entry(key).or_default();
        if key.ordered.is_none() || queue.back().is_none_or(|b| b.seq < entry.seq) {
            queue.push_back(entry);
        } else {
            let at = queue.partition_point(|e| e.seq < entry.seq);
            queue.insert(at, entry);
        }
    }

    pub(super) fn into_entries(self) -> Vec<(StreamKey, Arc<Entry<E>>)> {
        self.streams
            .into_iter()
            .flat_map(|(k, q)| q.into_iter().map(move |e| (k, e)))
            .collect()
    }

    /// Asks about the oldest entry of each stream, resolving each that
    /// passed; whether any resolved. In a queue of an ordered key (one
    /// stream, one submitting thread: [`StreamKey::ordered`]) the events were
    /// recorded in queue order on one stream, so once the oldest has passed
    /// the newest is asked, and then a binary search finds the last that
    /// passed: everything up to it is resolved on that proof, with a
    /// logarithmic number of queries instead of one each.
    ///
    /// The wakers of futures to wake on this thread go to `woken`, for the
    /// caller to wake after the pass: the pass's queries run with the
    /// thread's capture mode relaxed, the wakers (the caller's code) not.
    pub(super) fn pass<B: EventBackend<Error = E>>(
        &mut self,
        shared: &Shared<B>,
        woken: &mut Vec<Waker>,
    ) -> bool {
        let mut moved = false;
        self.streams.retain(|key, queue| {
            if key.ordered.is_some() {
                moved |= pass_ordered(shared, queue, woken);
            } else {
                moved |= pass_each(shared, queue, woken);
            }
            !queue.is_empty()
        });
        moved
    }
}

/// Asks `entry`'s event whether it passed: `Ok(true)`, `Ok(false)` or the
/// error.
fn passed<B: EventBackend>(shared: &Shared<B>, entry: &Entry<B::Error>) -> Result<bool, B::Error> {
    // SAFETY: the entry's event is alive: the future's lease keeps it until
    // the entry resolves, or, once the future is dropped, the entry keeps it
    // (`abandon`) until this thread gives it back after resolving; this
    // thread resolves each entry once, after its last query.
    match unsafe { shared.backend.query_event(entry.event, entry.device) } {
        Ok(Completion::Complete) => Ok(true),
        Ok(Completion::Pending) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Resolves the oldest `n` entries of `queue` as passed.
fn resolve_front<B: EventBackend>(
    shared: &Shared<B>,
    queue: &mut VecDeque<Arc<Entry<B::Error>>>,
    n: usize,
    woken: &mut Vec<Waker>,
) {
    for entry in queue.drain(..n) {
        shared.resolved(entry.resolve(Ok(())), entry.shard, woken);
    }
}

/// Resolves the entry at `at` with the error of its query.
fn resolve_failed<B: EventBackend>(
    shared: &Shared<B>,
    queue: &mut VecDeque<Arc<Entry<B::Error>>>,
    at: usize,
    e: B::Error,
    woken: &mut Vec<Waker>,
) {
    if let Some(entry) = queue.remove(at) {
        shared.resolved(entry.resolve(Err(e)), entry.shard, woken);
    }
}

/// One queue, each entry asked about itself, oldest first, until one is
/// pending; whether any resolved.
fn pass_each<B: EventBackend>(
    shared: &Shared<B>,
    queue: &mut VecDeque<Arc<Entry<B::Error>>>,
    woken: &mut Vec<Waker>,
) -> bool {
    let mut moved = false;
    while let Some(entry) = queue.front() {
        match passed(shared, entry) {
            Ok(false) => break,
            Ok(true) => resolve_front(shared, queue, 1, woken),
            Err(e) => resolve_failed(shared, queue, 0, e, woken),
        }
        moved = true;
    }
    moved
}

/// One queue of an ordered key: the oldest entry, then (if it passed) the
/// newest, then a binary search between them; whether any resolved.
fn pass_ordered<B: EventBackend>(
    shared: &Shared<B>,
    queue: &mut VecDeque<Arc<Entry<B::Error>>>,
    woken: &mut Vec<Waker>,
) -> bool {
    let Some(oldest) = queue.front() else {
        return false;
    };
    match passed(shared, oldest) {
        Ok(false) => return false,
        Ok(true) => {}
        Err(e) => {
            resolve_failed(shared, queue, 0, e, woken);
            return true;
        }
    }
    // `lo` passed; find the last that did.
    let (mut lo, mut hi) = (0, queue.len());
    if hi > 1 {
        match passed(shared, &queue[hi - 1]) {
            Ok(true) => lo = hi - 1,
            Ok(false) => {
                hi -= 1; // pending: the last that passed is below it
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    match passed(shared, &queue[mid]) {
                        Ok(true) => lo = mid,
                        Ok(false) => hi = mid,
                        Err(e) => {
                            // Resolved with its error; the ones below it
                            // wait for the next pass.
                            resolve_failed(shared, queue, mid, e, woken);
                            break;
                        }
                    }
                }
            }
            Err(e) => resolve_failed(shared, queue, hi - 1, e, woken),
        }
    }
    resolve_front(shared, queue, lo + 1, woken);
    true
}

/// A number that names the calling thread for the whole process (a counter
/// read once per thread), and the next number of the thread's records.
fn recording_thread() -> (u64, u64) {
    crate::sync::const_thread_local! {
        static ID: Cell<(u64, u64)> = Cell::new((0, 0));
    }
    static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
    ID.try_with(|cell| {
        let (mut id, seq) = cell.get();
        if id == 0 {
            id = NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        }
        cell.set((id, seq + 1));
        (id, seq)
    })
    // A thread being torn down: a number no thread has (never ordered
    // with another entry).
    .unwrap_or_else(|_| (NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed), 0))
}

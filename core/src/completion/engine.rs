//! The completion engine: one thread per event pool that watches the pending
//! events of [`Completed`](super::Completed) futures.
//!
//! Submitting threads put entries into one of [`SHARDS`] inboxes (picked per
//! thread, so 16 submitting threads rarely share a lock or a cache line) and
//! wake the engine only if it is asleep. The engine moves inbox entries into
//! its watch list, grouped by stream in submission order, and asks the
//! backend about the oldest entry of each group only: a stream runs its work
//! in order, so while that one is pending the later ones are too (a wrong
//! guess — a stream handle reused after a destroy — only delays a wake-up;
//! an entry resolves only on its own event's answer).
//!
//! Pacing: after a pass that resolved nothing it spins for [`SPIN_PASSES`]
//! passes, then sleeps, [`FIRST_NAP`] doubling up to [`LONGEST_NAP`], until
//! something resolves or arrives; with nothing pending it parks until a
//! submission wakes it. Stopping: the pool's drop sets `stop`, unparks and
//! joins the thread, which hands back what it still watched.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::cell::Cell;
use core::time::Duration;

use super::Entry;
use crate::backend::{Completion, DeviceId, EventBackend, StreamHandle};
use crate::event_pool::OwnedEvent;
use crate::sync::thread::{self, JoinHandle, Thread};
use crate::sync::{fence, Arc, AtomicBool, AtomicPtr, Mutex, Ordering};

/// Inboxes per engine (one under loom: which one a thread gets comes from a
/// process-wide counter, which loom does not reset between executions).
const SHARDS: usize = if cfg!(loom) { 1 } else { 32 };
/// Passes that resolve nothing before the engine starts to sleep (none
/// under loom, whose timed sleep is a yield).
const SPIN_PASSES: u32 = if cfg!(loom) { 0 } else { 64 };
/// `spin_loop` hints between two spinning passes.
const SPIN_PAUSE: u32 = 32;
/// The first sleep after the spinning passes.
const FIRST_NAP: Duration = Duration::from_micros(10);
/// The longest sleep while something is pending (the bound on the extra
/// wake-up latency of work that runs long).
const LONGEST_NAP: Duration = Duration::from_micros(200);

/// The stream an entry's event was recorded on, for the engine's
/// per-stream order.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) struct StreamKey {
    device: u32,
    stream: usize,
    /// Nonzero for an entry watched on its own (the stream is unknown, or
    /// the per-thread default stream, which names another stream on every
    /// thread): a serial number.
    apart: u64,
}

impl StreamKey {
    /// The key of `stream` of `device`; the per-thread stream is watched
    /// apart.
    pub(crate) fn of(stream: StreamHandle, device: DeviceId, per_thread: bool) -> Self {
        if per_thread {
            return Self::apart();
        }
        StreamKey {
            device: device.0,
            stream: stream.as_raw(),
            apart: 0,
        }
    }

    /// A key no other entry has.
    pub(crate) fn apart() -> Self {
        // A plain counter (not loom's: a static); any distinct values do.
        static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        StreamKey {
            device: 0,
            stream: 0,
            apart: NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        }
    }
}

type Watched<E> = (StreamKey, Arc<Entry<E>>);

/// What the thread hands back when it stops.
type Left<E> = Vec<Watched<E>>;

/// One inbox, on its own cache lines.
#[repr(align(128))]
struct Inbox<E> {
    entries: Mutex<Vec<Watched<E>>>,
    /// Set (SeqCst) after a push, cleared by the engine when it empties the
    /// inbox: what the engine reads before it sleeps (see [`Shared::sleep`]).
    filled: AtomicBool,
}

/// What the engine's thread and the pool share.
struct Shared<B: EventBackend> {
    backend: B,
    inboxes: Box<[Inbox<B::Error>]>,
    /// The engine is parked, or about to be: a submission must unpark it.
    sleeping: AtomicBool,
    /// The pool is dropping: the thread ends.
    stop: AtomicBool,
    /// Events of dropped futures that have passed, for the pool to take.
    passed: Mutex<Vec<OwnedEvent>>,
    /// `passed` may be non-empty (a hint; read without its lock).
    has_passed: AtomicBool,
}

/// A pool's engine: the shared state and the thread.
pub(crate) struct Engine<B: EventBackend> {
    shared: Arc<Shared<B>>,
    thread: Thread,
    join: Mutex<Option<JoinHandle<Left<B::Error>>>>,
}

/// The pool's lazily started engine.
pub(crate) struct EngineSlot<B: EventBackend> {
    engine: AtomicPtr<Engine<B>>,
    /// Held while an engine is started, so only one is.
    starting: Mutex<()>,
}

impl<B: EventBackend> EngineSlot<B> {
    pub(crate) fn new() -> Self {
        EngineSlot {
            engine: AtomicPtr::new(core::ptr::null_mut()),
            starting: Mutex::new(()),
        }
    }

    /// The engine, started by the first call.
    pub(crate) fn get(&self, backend: &B) -> Result<&Engine<B>, std::io::Error>
    where
        B: Clone + 'static,
    {
        // Acquire: with the Release below, the engine is fully built.
        let p = self.engine.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published once, below, from a `Box` freed only by
            // `stop` (`&mut self`), so it lives as long as `&self`.
            return Ok(unsafe { &*p });
        }
        self.start(backend)
    }

    #[cold]
    fn start(&self, backend: &B) -> Result<&Engine<B>, std::io::Error>
    where
        B: Clone + 'static,
    {
        let _starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        let p = self.engine.load(Ordering::Acquire);
        if p.is_null() {
            let engine = Box::into_raw(Box::new(Engine::start(backend.clone())?));
            // Release: the engine is built before it is seen.
            self.engine.store(engine, Ordering::Release);
            // SAFETY: just published; freed only by `stop`.
            return Ok(unsafe { &*engine });
        }
        // SAFETY: as in `get`.
        Ok(unsafe { &*p })
    }

    /// Stops the engine, if one started, and hands every event it still
    /// held (futures dropped before their events passed) to `give`, passed
    /// or not.
    pub(crate) fn stop(&mut self, mut give: impl FnMut(OwnedEvent)) {
        let p = self.engine.swap(core::ptr::null_mut(), Ordering::Acquire);
        if p.is_null() {
            return;
        }
        // SAFETY: published by `start` from `Box::into_raw`, taken out of the
        // slot above, so freed once; `&mut self`: no borrow of it is left.
        let engine = unsafe { Box::from_raw(p) };
        // Release/Acquire: nothing rides on it but the stop itself; the unpark
        // makes a parked thread look again.
        engine.shared.stop.store(true, Ordering::Release);
        engine.thread.unpark();
        let join = engine.join.lock().unwrap_or_else(|p| p.into_inner()).take();
        let left = join.and_then(|j| j.join().ok()).unwrap_or_default();
        for (_, entry) in left {
            // Every future borrowed the pool, so each one is gone: the
            // entries left are abandoned (or of futures leaked by
            // `mem::forget`, whose leases keep their events).
            if let Some(event) = entry.resolve(Ok(())) {
                give(event);
            }
        }
        // What arrived after the thread's last look at its inboxes.
        for inbox in engine.shared.inboxes.iter() {
            let entries =
                core::mem::take(&mut *inbox.entries.lock().unwrap_or_else(|p| p.into_inner()));
            for (_, entry) in entries {
                if let Some(event) = entry.resolve(Ok(())) {
                    give(event);
                }
            }
        }
        engine.shared.take_passed(&mut give);
    }
}

impl<B: EventBackend> Engine<B> {
    fn start(backend: B) -> Result<Self, std::io::Error>
    where
        B: Clone + 'static,
    {
        let shared = Arc::new(Shared {
            backend,
            inboxes: (0..SHARDS)
                .map(|_| Inbox {
                    entries: Mutex::new(Vec::new()),
                    filled: AtomicBool::new(false),
                })
                .collect(),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            passed: Mutex::new(Vec::new()),
            has_passed: AtomicBool::new(false),
        });
        let theirs = Arc::clone(&shared);
        let join = thread::Builder::new()
            .name("gpupool-completion".into())
            .spawn(move || run(&theirs))?;
        Ok(Engine {
            shared,
            thread: join.thread().clone(),
            join: Mutex::new(Some(join)),
        })
    }

    /// Hands `entry` to the engine.
    pub(crate) fn submit(&self, key: StreamKey, entry: Arc<Entry<B::Error>>) {
        let inbox = &self.shared.inboxes[shard()];
        inbox
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((key, entry));
        // The store of `filled`, a SeqCst fence, then the load of
        // `sleeping`, against the engine's store of `sleeping`, a SeqCst
        // fence, then its loads of `filled` (`Shared::sleep`): of two
        // fenced store-then-load pairs, one load sees the other's store, so
        // either the engine finds the entry before it sleeps or it is
        // unparked. (Fences, not SeqCst accesses: loom models those.)
        if !inbox.filled.load(Ordering::Relaxed) {
            inbox.filled.store(true, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::Relaxed) {
            self.thread.unpark();
        }
    }

    /// Hands each event of a dropped future that has passed to `give`.
    pub(crate) fn return_passed(&self, give: impl FnMut(OwnedEvent)) {
        // Relaxed: a hint; a late one is taken by the next call.
        if self.shared.has_passed.load(Ordering::Relaxed) {
            self.shared.take_passed(give);
        }
    }
}

impl<B: EventBackend> Shared<B> {
    fn take_passed(&self, mut give: impl FnMut(OwnedEvent)) {
        let events = {
            let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
            self.has_passed.store(false, Ordering::Relaxed);
            core::mem::take(&mut *passed)
        };
        for e in events {
            give(e);
        }
    }

    /// Moves every inbox's entries into `watch`; whether there were any.
    fn take_inboxes(
        &self,
        watch: &mut Watch<B::Error>,
        spare: &mut Vec<Watched<B::Error>>,
    ) -> bool {
        let mut took = false;
        for inbox in self.inboxes.iter() {
            // Acquire: with the inbox lock, what follows sees the pushes
            // this flag announced (Relaxed would do: the lock orders them).
            if !inbox.filled.load(Ordering::Acquire) {
                continue;
            }
            {
                let mut entries = inbox.entries.lock().unwrap_or_else(|p| p.into_inner());
                inbox.filled.store(false, Ordering::Relaxed);
                core::mem::swap(&mut *entries, spare);
            }
            took |= !spare.is_empty();
            for (key, entry) in spare.drain(..) {
                watch.add(key, entry);
            }
        }
        took
    }

    /// Parks until a submission or the stop, unless one came meanwhile.
    fn sleep(&self) {
        // The store, the fence and the loads: see `Engine::submit`. The stop
        // is seen here or unparks the thread (a park after an unpark
        // returns at once).
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let filled = self
            .inboxes
            .iter()
            .any(|i| i.filled.load(Ordering::Relaxed));
        if !filled && !self.stop.load(Ordering::Relaxed) {
            thread::park();
        }
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Keeps an event of a dropped future that has passed for the pool.
    fn keep_passed(&self, event: OwnedEvent) {
        self.passed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
        self.has_passed.store(true, Ordering::Relaxed);
    }
}

/// The engine thread's loop; returns what it still watched when stopped.
fn run<B: EventBackend>(shared: &Shared<B>) -> Vec<Watched<B::Error>> {
    let mut watch = Watch::new();
    let mut spare = Vec::new();
    let mut idle = 0u32;
    loop {
        let took = shared.take_inboxes(&mut watch, &mut spare);
        if shared.stop.load(Ordering::Acquire) {
            return watch.into_entries();
        }
        if watch.is_empty() {
            idle = 0;
            if !took {
                shared.sleep();
            }
            continue;
        }
        if watch.pass(shared) || took {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle <= SPIN_PASSES {
            // A short pause between passes (about a microsecond): the
            // queries share the driver with the submitting threads' records.
            for _ in 0..SPIN_PAUSE {
                core::hint::spin_loop();
            }
            #[cfg(loom)]
            thread::yield_now();
        } else {
            let doublings = (idle - SPIN_PASSES - 1).min(16);
            let nap = FIRST_NAP.saturating_mul(1 << doublings).min(LONGEST_NAP);
            thread::park_timeout(nap);
        }
    }
}

/// The engine's pending entries, by stream, oldest first (a `BTreeMap`:
/// the same order of visits every time, which loom needs).
struct Watch<E> {
    streams: BTreeMap<StreamKey, VecDeque<Arc<Entry<E>>>>,
}

impl<E> Watch<E> {
    fn new() -> Self {
        Watch {
            streams: BTreeMap::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    fn add(&mut self, key: StreamKey, entry: Arc<Entry<E>>) {
        self.streams.entry(key).or_default().push_back(entry);
    }

    fn into_entries(self) -> Vec<(StreamKey, Arc<Entry<E>>)> {
        self.streams
            .into_iter()
            .flat_map(|(k, q)| q.into_iter().map(move |e| (k, e)))
            .collect()
    }

    /// Asks about the oldest entry of each stream, resolving each that
    /// passed (and then the next); whether any resolved.
    fn pass<B: EventBackend<Error = E>>(&mut self, shared: &Shared<B>) -> bool {
        let mut moved = false;
        self.streams.retain(|_, queue| {
            while let Some(entry) = queue.front() {
                // SAFETY: the entry's event is alive: the future's lease
                // keeps it until the entry resolves, or, once the future is
                // dropped, the entry keeps it (`abandon`) until this thread
                // gives it back after resolving; this thread resolves each
                // entry once, after its last query.
                let result = match unsafe { shared.backend.query_event(entry.event, entry.device) }
                {
                    Ok(Completion::Pending) => break,
                    Ok(Completion::Complete) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Some(event) = entry.resolve(result) {
                    shared.keep_passed(event);
                }
                queue.pop_front();
                moved = true;
            }
            !queue.is_empty()
        });
        moved
    }
}

/// The calling thread's inbox.
fn shard() -> usize {
    crate::sync::const_thread_local! {
        static SHARD: Cell<usize> = Cell::new(usize::MAX);
    }
    static NEXT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
    SHARD
        .try_with(|s| {
            if s.get() == usize::MAX {
                s.set(NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed) % SHARDS);
            }
            s.get()
        })
        .unwrap_or(0)
}

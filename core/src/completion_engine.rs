//! The completion engine: one thread per event pool that watches the pending
//! events of [`Completed`](crate::Completed) futures, and what it shares with
//! each future ([`Entry`]).
//!
//! Submitting threads put entries into one of [`SHARDS`] inboxes (picked per
//! thread, so 16 submitting threads rarely share a lock or a cache line) and
//! wake the engine only if it is asleep. The engine moves inbox entries into
//! its watch list, grouped by stream in submission order, and asks the
//! backend about the oldest entry of each group first: a stream runs its
//! work in order, so while that one is pending the later ones are too.
//! Where the backend names the stream itself ([`StreamBackend::stream_id`],
//! CUDA's `cuStreamGetId`: never a reused handle) and the entries come from
//! one thread, the group is in record order, and an event that passed
//! proves every earlier one passed: once the oldest has passed, the newest
//! is asked, then a binary search finds the last that passed, so a burst of
//! completions costs a few queries, not one each. Elsewhere an entry
//! resolves only on its own event's answer.
//!
//! Pacing: after a pass that resolved nothing it spins for [`SPIN_PASSES`]
//! passes, then sleeps, [`FIRST_NAP`] doubling up to [`LONGEST_NAP`], until
//! something resolves or arrives; with nothing pending it parks until a
//! submission wakes it.
//!
//! Waking: a resolved future's waker goes to its submitting thread's inbox
//! while that thread keeps submitting (it wakes the task at its next
//! submission, on its own thread), else the engine wakes it.
//!
//! Stopping: the pool's drop stops the engine from running wakers, sets
//! `stop`, unparks and joins the thread, which hands back what it still
//! watched; dropped by a waker on the engine's own thread, it leaves the
//! thread to end by itself and destroy the events it holds.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::Cell;
use core::task::Waker;
use core::time::Duration;

mod entry;
mod slot;
mod watch;

use entry::quietly;
pub(crate) use entry::Entry;
pub(crate) use slot::EngineSlot;
pub use slot::DEFAULT_COMPLETION_SPIN;

pub(crate) use watch::StreamKey;
use watch::Watch;

use crate::backend::EventBackend;
#[cfg(doc)]
use crate::backend::StreamBackend;
use crate::owned::OwnedEvent;
use crate::sync::thread::{self, JoinHandle, Thread};
use crate::sync::{fence, Arc, AtomicBool, Mutex, Ordering};

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

type Watched<E> = (StreamKey, Arc<Entry<E>>);

/// What the thread hands back when it stops.
type Left<E> = Vec<Watched<E>>;

/// One inbox, on its own cache lines.
#[repr(align(128))]
struct Inbox<E> {
    lists: Mutex<Lists<E>>,
    /// Set after a push, cleared by the engine when it empties the inbox:
    /// what the engine reads before it sleeps (see [`Shared::sleep`]).
    filled: AtomicBool,
    /// The inbox's threads submitted since the engine last looked: they
    /// are likely to submit again soon, and wake the tasks the engine left
    /// them (`Lists::ready`) then, each on its own thread (for a runtime,
    /// a wake from a worker thread is a push to its own queue; from the
    /// engine's thread, a push to a shared queue and maybe a thread to
    /// unpark). A hint, written without the lock.
    active: AtomicBool,
    /// `Lists::ready` may be non-empty (a hint, written under the lock).
    has_ready: AtomicBool,
}

/// An inbox's lists.
struct Lists<E> {
    /// Entries submitted, for the engine.
    entries: Vec<Watched<E>>,
    /// Wakers of futures the engine resolved, for the inbox's threads to
    /// wake at their next submission (or the engine, if none comes by its
    /// next pass, or before it sleeps).
    ready: Vec<Waker>,
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
    /// The pool was dropped on this thread (by a waker): the thread
    /// destroys what it holds when it ends instead of handing it back.
    detached: AtomicBool,
    /// Whether the pool is stopping: the thread then runs no more wakers
    /// (the pool's drop waits for one under way, never for the GPU).
    gate: Mutex<Gate>,
    /// `passed` may be non-empty (a hint; read without its lock).
    has_passed: AtomicBool,
}

/// [`Shared::gate`]'s state.
struct Gate {
    stopping: bool,
}

/// A pool's engine: the shared state and the thread.
pub(crate) struct Engine<B: EventBackend> {
    shared: Arc<Shared<B>>,
    thread: Thread,
    join: Mutex<Option<JoinHandle<Left<B::Error>>>>,
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
                    lists: Mutex::new(Lists {
                        entries: Vec::new(),
                        ready: Vec::new(),
                    }),
                    filled: AtomicBool::new(false),
                    active: AtomicBool::new(false),
                    has_ready: AtomicBool::new(false),
                })
                .collect(),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            passed: Mutex::new(Vec::new()),
            has_passed: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            gate: Mutex::new(Gate { stopping: false }),
        });
        let theirs = Arc::clone(&shared);
        let join = thread::Builder::new()
            .name("gpupool-completion".into())
            .spawn(move || {
                theirs.backend.prepare_query_thread();
                let left = run(&theirs);
                // Relaxed: set under the gate, which this thread took
                // after every waker it ran.
                let detached = {
                    let _gate = theirs.gate.lock().unwrap_or_else(|p| p.into_inner());
                    theirs.detached.load(Ordering::Relaxed)
                };
                if detached {
                    theirs.destroy_orphans(left);
                    return Vec::new();
                }
                left
            })?;
        Ok(Engine {
            shared,
            thread: join.thread().clone(),
            join: Mutex::new(Some(join)),
        })
    }

    /// Hands `entry` to the engine.
    pub(crate) fn submit(&self, key: StreamKey, entry: Arc<Entry<B::Error>>) {
        let inbox = &self.shared.inboxes[entry.shard];
        let ready = {
            let mut lists = inbox.lists.lock().unwrap_or_else(|p| p.into_inner());
            lists.entries.push((key, entry));
            // Relaxed: written under this lock.
            if inbox.has_ready.load(Ordering::Relaxed) {
                inbox.has_ready.store(false, Ordering::Relaxed);
                core::mem::take(&mut lists.ready)
            } else {
                Vec::new()
            }
        };
        // Relaxed (both): a hint (see `Inbox::active`); a stale one only moves a wake.
        if !inbox.active.load(Ordering::Relaxed) {
            inbox.active.store(true, Ordering::Relaxed);
        }
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
        // The tasks the engine left this thread (their futures resolved).
        for waker in ready {
            quietly(|| waker.wake());
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
            // Relaxed: a hint, written under the lock it describes.
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
                let mut lists = inbox.lists.lock().unwrap_or_else(|p| p.into_inner());
                // Relaxed: written under the inbox's lock, which orders it.
                inbox.filled.store(false, Ordering::Relaxed);
                core::mem::swap(&mut lists.entries, spare);
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

    /// Hands every event of a dropped future that the engine still holds to
    /// `give`: those of `left` (what the thread watched when it stopped),
    /// of the inboxes (what arrived after its last look) and the passed
    /// ones. Every future borrowed the pool, which is stopping, so each one
    /// is gone: the entries are abandoned (or of futures leaked by
    /// `mem::forget`, whose leases keep their events).
    fn held_events(&self, left: Left<B::Error>, mut give: impl FnMut(OwnedEvent)) {
        for (_, entry) in left {
            if let Some(event) = entry.forsake() {
                give(event);
            }
        }
        for inbox in self.inboxes.iter() {
            let (entries, ready) = inbox.take_all();
            drop_wakers(ready);
            for (_, entry) in entries {
                if let Some(event) = entry.forsake() {
                    give(event);
                }
            }
        }
        self.take_passed(give);
    }

    /// Destroys the events of dropped futures that the thread still holds
    /// ([`held_events`](Self::held_events)), its pool gone; a failure is
    /// reported as a lost error.
    fn destroy_orphans(&self, left: Left<B::Error>) {
        let mut events = Vec::new();
        self.held_events(left, |e| events.push(e));
        for e in events {
            // Pending or not: the driver frees a pending event once it
            // passes.
            // A failed destroy leaves the event to the driver (nothing
            // else has it); the error is counted.
            if let Err(r) = e.destroy(&self.backend) {
                crate::lost::report(&r.error);
            }
        }
    }

    /// What follows an entry's resolution: its future's waker left to its
    /// submitting threads, or put in `woken` for this thread to wake (see
    /// [`wake`](Self::wake)), or its dropped future's event kept for the
    /// pool.
    fn resolved(
        &self,
        outcome: Result<Option<Waker>, Option<OwnedEvent>>,
        shard: usize,
        woken: &mut Vec<Waker>,
    ) {
        match outcome {
            Ok(Some(waker)) => {
                let inbox = &self.inboxes[shard];
                // Relaxed: a hint; a stale one only moves who wakes the task.
                if inbox.active.load(Ordering::Relaxed) {
                    // Its threads are submitting: the next of them wakes it.
                    let mut lists = inbox.lists.lock().unwrap_or_else(|p| p.into_inner());
                    lists.ready.push(waker);
                    inbox.has_ready.store(true, Ordering::Relaxed);
                    return;
                }
                woken.push(waker);
            }
            Ok(None) | Err(None) => {}
            Err(Some(event)) => self.keep_passed(event),
        }
    }

    /// Wakes a task on the engine's thread, unless the pool is stopping
    /// (then no future is left to wake, and the thread runs no more of the
    /// caller's code).
    fn wake(&self, waker: Waker) {
        {
            let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner());
            if gate.stopping {
                drop(gate);
                // Only a future leaked by `mem::forget` can be left: its
                // waker is not run any more.
                core::mem::forget(waker);
                return;
            }
        }
        // A waker is the caller's code: one that panics must not take the
        // engine's thread (and every other future) down with it.
        quietly(|| waker.wake());
    }

    /// Wakes the tasks left to the inboxes' threads: those left before the
    /// previous look (`stale`: none of their threads submitted since), or
    /// all of them (`all`, before the engine sleeps). Clears each inbox's
    /// `active`: a thread must submit again to be left more.
    fn wake_left(&self, stale: &mut [bool], all: bool) {
        for (inbox, stale) in self.inboxes.iter().zip(stale.iter_mut()) {
            if inbox.active.load(Ordering::Relaxed) {
                // Relaxed (these): hints; `has_ready` is written under the inbox lock.
                inbox.active.store(false, Ordering::Relaxed);
            }
            if !inbox.has_ready.load(Ordering::Relaxed) {
                *stale = false;
                continue;
            }
            if !(all || *stale) {
                *stale = true;
                continue;
            }
            *stale = false;
            let ready = {
                let mut lists = inbox.lists.lock().unwrap_or_else(|p| p.into_inner());
                inbox.has_ready.store(false, Ordering::Relaxed);
                core::mem::take(&mut lists.ready)
            };
            for waker in ready {
                self.wake(waker);
            }
        }
    }

    /// Keeps an event of a dropped future that has passed for the pool.
    fn keep_passed(&self, event: OwnedEvent) {
        self.passed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
        // Relaxed: a hint, read without the lock by `return_passed`.
        self.has_passed.store(true, Ordering::Relaxed);
    }
}

/// The engine thread's loop; returns what it still watched when stopped.
// `SPIN_PASSES` is 0 under loom.
#[allow(clippy::absurd_extreme_comparisons)]
fn run<B: EventBackend>(shared: &Shared<B>) -> Vec<Watched<B::Error>> {
    let mut watch = Watch::new();
    let mut spare = Vec::new();
    let mut stale = alloc::vec![false; SHARDS];
    let mut woken = Vec::new();
    let mut idle = 0u32;
    loop {
        let took = shared.take_inboxes(&mut watch, &mut spare);
        // Acquire: pairs with the Release of `EngineSlot::stop`.
        if shared.stop.load(Ordering::Acquire) {
            return watch.into_entries();
        }
        if watch.is_empty() {
            idle = 0;
            // Nobody is left a task to wake while the engine sleeps.
            shared.wake_left(&mut stale, true);
            if !took {
                shared.sleep();
            }
            continue;
        }
        shared.wake_left(&mut stale, false);
        // The pass's queries with the thread's capture mode relaxed (no
        // capture open anywhere refuses them or is broken by them); the
        // wakers after, in the thread's own mode, like on any thread.
        let mut moved = false;
        shared
            .backend
            .relaxed_queries(&mut || moved = watch.pass(shared, &mut woken));
        for waker in woken.drain(..) {
            shared.wake(waker);
        }
        if moved || took {
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

impl<E> Inbox<E> {
    /// Everything in the inbox (the engine stopping).
    fn take_all(&self) -> (Vec<Watched<E>>, Vec<Waker>) {
        let mut lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
        (
            core::mem::take(&mut lists.entries),
            core::mem::take(&mut lists.ready),
        )
    }
}

/// Drops wakers of futures that are gone (the pool stopping), catching
/// their panics.
fn drop_wakers(wakers: Vec<Waker>) {
    for w in wakers {
        quietly(|| drop(w));
    }
}

/// The calling thread's inbox.
// `SHARDS` is 1 under loom.
#[allow(clippy::modulo_one)]
pub(crate) fn shard() -> usize {
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

//! [`Completed`]: a future that resolves once the GPU has passed a pooled
//! event, for async code (`std`).
//!
//! [`AccessOrder::completed`] records a pooled event after the work queued in
//! an order so far. The future's first poll asks about the event itself for
//! up to the pool's completion spin ([`EventPool::set_completion_spin`],
//! [`DEFAULT_COMPLETION_SPIN`] unless set): short work resolves there, on the
//! polling thread. A future still pending then goes to its pool's
//! *completion engine*: one thread per [`EventPool`], started by the first
//! future, asleep whenever nothing is pending, stopped when the pool drops.
//! The engine asks the backend about each stream's pending events oldest
//! first (a stream runs its work in order; see `completion_engine.rs` for how
//! one answer can settle several), has each future whose event passed woken,
//! and backs off (spinning, then short sleeps) while nothing moves.
//! `docs/async.md` has the design and its measurements.
//!
//! Why a spin, then event queries: a record is the cheap half of submission.
//! On the H200 a `cuEventRecord` costs 0.12 µs on one thread and 1.7 µs per
//! thread at 16 threads; the alternatives cost more on the submitting thread
//! (`cuStreamWriteValue32` for a host flag: 1.8 → 20 µs; `cuLaunchHostFunc`:
//! 1.9 → 47 µs). But the driver serialises queries with every thread's
//! launches and records, so one engine thread asking about many streams
//! falls behind under load; the first poll's spin spreads the asking over the
//! polling threads and settles short work in microseconds.
//!
//! Every query (the spin's and each engine pass's) runs with its thread's
//! capture interaction mode relaxed for that moment
//! ([`EventBackend::relaxed_queries`]): a graph capture open anywhere in the
//! process, begun by gpupool or not, neither refuses it nor is broken by it.
//! Wakers run outside, in the thread's own mode. With the spin on, a poll calls the backend, so like any other gpupool
//! call it is not made inside a CUDA host function (`cuLaunchHostFunc`).
//!
//! A future dropped before its event passed never blocks: it leaves the
//! event with the engine, which hands it back to the pool once the GPU has
//! passed it (the next [`completed`](AccessOrder::completed) call or the
//! pool's drop takes it in). A failed query resolves the future with the
//! backend's error. Futures are runtime-agnostic: they use only
//! [`core::task::Waker`].

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use core::time::Duration;

use crate::backend::{Completion, EventBackend, StreamBackend};
use crate::completion_engine::{shard, Engine, Entry, StreamKey};
use crate::error::{BackendOp, Error};
use crate::event_pool::{EventLease, EventPool};
use crate::order::AccessOrder;
use crate::sync::Arc;

/// `spin_loop` hints between two of a first poll's queries (about a
/// microsecond: each query takes the driver's lock, which the other threads'
/// records and launches need too).
#[cfg(not(loom))]
const POLL_PAUSE: u32 = 32;

/// A future that resolves once the GPU has passed the work it was made
/// after: `Ok(())`, or the backend's error if asking about it failed (for
/// CUDA: an error of the stream's work, such as a failed kernel).
///
/// Made by [`AccessOrder::completed`] or [`EventLease::completed`]; needs no
/// particular async runtime. Its first poll asks about the event for up to
/// the pool's completion spin ([`EventPool::set_completion_spin`]), so that
/// poll may keep the thread up to that long; later polls only look at what
/// the engine found. Dropping it early never blocks and loses nothing: its
/// pooled event goes back to the pool once the GPU has passed it.
///
/// ```
/// use gpupool_core::{EventPool, StreamPool};
/// use gpupool_mock::{CompletionPolicy, MockBackend};
/// # fn block_on<F: core::future::Future>(f: F) -> F::Output {
/// #     use std::task::{Context, Poll, Wake, Waker};
/// #     struct Unpark(std::thread::Thread);
/// #     impl Wake for Unpark { fn wake(self: std::sync::Arc<Self>) { self.0.unpark() } }
/// #     let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
/// #     let mut f = core::pin::pin!(f);
/// #     loop {
/// #         match f.as_mut().poll(&mut Context::from_waker(&waker)) {
/// #             Poll::Ready(v) => return v,
/// #             Poll::Pending => std::thread::park(),
/// #         }
/// #     }
/// # }
///
/// let gpu = MockBackend::new(1);
/// let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
/// let lease = streams.get(0)?;
/// gpu.enqueue_work(lease.handle()).unwrap();      // a kernel, say
/// let done = lease.order().completed(&events)?;  // resolves once it has run
/// gpu.set_policy(CompletionPolicy::Immediate);    // the mock's GPU runs it
/// block_on(done)?;                               // `done.await` in async code
/// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
/// ```
#[must_use = "a future does nothing unless polled; dropping it returns its event once the GPU passed it"]
pub struct Completed<'p, B: EventBackend> {
    state: State<'p, B>,
}

enum State<'p, B: EventBackend> {
    /// Resolved when made (nothing was queued), or its result taken.
    Ready(Option<Result<(), Error<B::Error>>>),
    /// Recorded, not yet polled: the first poll asks about the event itself
    /// (up to the pool's spin budget), then hands it to the engine; a drop
    /// hands it over at once.
    Recorded {
        lease: EventLease<'p, B>,
        engine: &'p Engine<B>,
        key: StreamKey,
        /// The entry's place in the recording thread's records.
        seq: u64,
    },
    /// Watched by the engine; the lease is given up when the entry resolves
    /// (or handed to the engine if the future is dropped first).
    Watched {
        lease: EventLease<'p, B>,
        entry: Arc<Entry<B::Error>>,
    },
}

impl<B: EventBackend> fmt::Debug for Completed<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready(Some(Ok(()))) => "passed",
            State::Ready(Some(Err(_))) => "failed",
            State::Ready(None) => "taken",
            State::Recorded { .. } => "pending",
            State::Watched { entry, .. } => entry.state_name(),
        };
        f.debug_struct("Completed").field("state", &state).finish()
    }
}

impl<'p, B> Completed<'p, B>
where
    B: EventBackend + Clone + 'static,
{
    /// A future of `lease` (recorded, not in a capture), to be watched by
    /// its pool's engine, started here if it was not. `key` and `seq` name
    /// the stream it was recorded on and its place among the recording
    /// thread's records, for the engine's per-stream order.
    fn recorded(
        lease: EventLease<'p, B>,
        key: StreamKey,
        seq: u64,
    ) -> Result<Self, Error<B::Error>> {
        let pool = lease.pool();
        let engine = pool.completion_engine()?;
        // Events the engine saw pass after their futures were dropped come
        // back here, on a path that only futures pay for.
        engine.return_passed(|e| give_back(pool, e));
        Ok(Completed {
            state: State::Recorded {
                lease,
                engine,
                key,
                seq,
            },
        })
    }

    /// A future that is resolved already.
    fn ready(result: Result<(), Error<B::Error>>) -> Self {
        Completed {
            state: State::Ready(Some(result)),
        }
    }
}

impl<B: EventBackend> Future for Completed<'_, B> {
    type Output = Result<(), Error<B::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let result = match &mut this.state {
            State::Ready(r) => return Poll::Ready(r.take().unwrap_or(Ok(()))),
            State::Watched { entry, .. } => match entry.poll(cx.waker()) {
                Some(r) => r,
                None => return Poll::Pending,
            },
            State::Recorded { lease, .. } => match spin(lease, lease.pool().completion_spin()) {
                Some(r) => r,
                None => {
                    this.watch(cx);
                    return Poll::Pending;
                }
            },
        };
        // The event passed (or asking failed): the lease ends here, and the
        // event goes back to the pool from the polling thread.
        this.state = State::Ready(None);
        Poll::Ready(result.map_err(Error::backend(BackendOp::QueryEvent)))
    }
}

impl<'p, B: EventBackend> Completed<'p, B> {
    /// The first poll found the event pending: the engine watches it from
    /// now on, for the task of `cx`.
    fn watch(&mut self, cx: &Context<'_>) {
        let State::Recorded {
            lease, engine, seq, ..
        } = &self.state
        else {
            return;
        };
        let entry = Arc::new(Entry::new(lease.handle(), lease.device(), shard(), *seq));
        // Pending and not yet shared: this only keeps the waker (a clone:
        // the caller's code, run before anything moves, so a panic there
        // leaves the future as it was).
        let _pending = entry.poll(cx.waker());
        let engine = *engine;
        let State::Recorded { lease, key, .. } =
            core::mem::replace(&mut self.state, State::Ready(None))
        else {
            return;
        };
        engine.submit(key, Arc::clone(&entry));
        self.state = State::Watched { lease, entry };
    }
}

/// The first poll's own look at `lease`'s event: asks the backend until it
/// passed (or asking failed), for up to `budget` (at least once, unless
/// `budget` is zero); `None` if it is still pending then. Under loom: once.
/// The queries run with the thread's capture interaction mode relaxed
/// ([`EventBackend::relaxed_queries`]): a capture open anywhere, begun by
/// gpupool or not, neither refuses them nor is broken by them (the event was
/// recorded outside any capture).
fn spin<B: EventBackend>(
    lease: &EventLease<'_, B>,
    budget: Duration,
) -> Option<Result<(), B::Error>> {
    if budget.is_zero() {
        return None;
    }
    let backend = lease.pool().backend();
    let mut outcome = None;
    backend.relaxed_queries(&mut || outcome = ask(lease, budget));
    outcome
}

/// [`spin`]'s queries.
// Under loom: one query (loom has no clock).
#[cfg_attr(loom, allow(clippy::never_loop))]
fn ask<B: EventBackend>(
    lease: &EventLease<'_, B>,
    budget: Duration,
) -> Option<Result<(), B::Error>> {
    let backend = lease.pool().backend();
    #[cfg(not(loom))]
    let start = std::time::Instant::now();
    loop {
        // SAFETY: the lease keeps its event alive (and leased: nothing
        // records it again) for this call.
        match unsafe { backend.query_event(lease.handle(), lease.device()) } {
            Ok(Completion::Complete) => return Some(Ok(())),
            Ok(Completion::Pending) => {}
            Err(e) => return Some(Err(e)),
        }
        #[cfg(loom)]
        return {
            let _ = budget;
            None
        };
        #[cfg(not(loom))]
        {
            if start.elapsed() >= budget {
                return None;
            }
            for _ in 0..POLL_PAUSE {
                core::hint::spin_loop();
            }
        }
    }
}

impl<B: EventBackend> Drop for Completed<'_, B> {
    fn drop(&mut self) {
        let (lease, entry) = match core::mem::replace(&mut self.state, State::Ready(None)) {
            State::Ready(_) => return,
            State::Watched { lease, entry } => (lease, entry),
            State::Recorded {
                lease,
                engine,
                key,
                seq,
            } => {
                // Never polled: the engine takes the event (unasked: a drop
                // makes no backend call) and returns it once it passed.
                let pool = lease.pool();
                let entry = Arc::new(Entry::new(lease.handle(), lease.device(), shard(), seq));
                match entry.abandon(lease.detach()) {
                    None => engine.submit(key, entry),
                    // (A new entry is watched: never.)
                    Some(event) => give_back(pool, event),
                }
                return;
            }
        };
        if entry.is_resolved() {
            return; // `lease` drops: the event passed
        }
        // Still pending: the engine keeps the event until it passes.
        let pool = lease.pool();
        if let Some(event) = entry.abandon(lease.detach()) {
            // It passed meanwhile: straight back.
            give_back(pool, event);
        }
    }
}

/// Puts an event that passed back into `pool`, which made it: only a lost
/// race with nothing (its own device, its own backend) could refuse it; the
/// error is parked then.
fn give_back<B: EventBackend>(pool: &EventPool<B>, event: crate::owned::OwnedEvent) {
    if let Err(r) = pool.put(event, None) {
        pool.park(r.error);
    }
}

impl<B: EventBackend> Unpin for Completed<'_, B> {}

impl<'s> AccessOrder<'s> {
    /// A future that resolves once every piece of work queued in this order
    /// so far has finished on the GPU: records a pooled event of `events` on
    /// the order's stream (one event record, a few tens of nanoseconds
    /// more). Its first poll asks about the event for up to the pool's
    /// completion spin; `events`' completion engine watches it from then on
    /// (see [`Completed`]). Host order has nothing queued: the future is
    /// ready at once.
    ///
    /// Errors, with nothing recorded: [`Error::ForeignHandle`] for an order
    /// of another backend; [`Error::CapturesUnseen`] for the per-thread
    /// default stream or an order of
    /// [`from_raw_capturable`](Self::from_raw_capturable) (a capture there
    /// could hide the record); [`Error::StreamCapturing`] for a stream that
    /// is capturing a graph (its work is recorded into the graph, not run:
    /// wait for a launch of the graph instead), also when a capture began on
    /// it, or was joined, while the event was recorded (the event is then
    /// destroyed, not pooled); [`Error::CompletionThread`]; a backend
    /// failure.
    ///
    /// In the mock's checking mode work completes only when the host waits,
    /// and the engine's queries are not waits: a thread must play the GPU
    /// (`examples/05-async-service.rs` has one).
    ///
    /// ```
    /// use gpupool_core::{EventPool, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    /// let lease = streams.get(0)?;
    /// gpu.enqueue_work(lease.handle()).unwrap();
    /// let done = lease.order().completed(&events)?; // `done.await` in async code
    /// drop(lease);                                   // the stream may go back first
    /// gpu.complete_everything();                     // the mock's GPU runs the work
    /// # drop(done);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn completed<'p, B>(
        &self,
        events: &'p EventPool<B>,
    ) -> Result<Completed<'p, B>, Error<B::Error>>
    where
        B: StreamBackend + EventBackend + Clone + 'static,
    {
        let backend = events.backend();
        self.check_backend(backend)?;
        let Some((stream, device)) = self.stream_and_device() else {
            return Ok(Completed::ready(Ok(())));
        };
        if self.captures_unseen() {
            return Err(Error::CapturesUnseen);
        }
        // SAFETY: the order borrows its stream, whose owner was checked.
        if unsafe { self.capturing(backend) }? {
            return Err(Error::StreamCapturing);
        }
        let lease = events.get(device)?;
        lease.record(self)?;
        if lease.may_be_captured() {
            // A capture began on the stream during the call: the lease's
            // drop destroys the event.
            return Err(Error::StreamCapturing);
        }
        // The stream's own id, for the engine's per-stream order (a stream
        // it cannot name is watched event by event).
        // SAFETY: as above.
        let stream_id = unsafe { backend.stream_id(stream, device) }.unwrap_or(None);
        let (key, seq) = StreamKey::of(stream, device, self.is_per_thread(), stream_id);
        Completed::recorded(lease, key, seq)
    }
}

impl<'p, B> EventLease<'p, B>
where
    B: EventBackend + Clone + 'static,
{
    /// A future that resolves once the GPU has passed this event's latest
    /// record (at once if it was never recorded); the lease ends with it,
    /// and the event goes back to the pool once it has passed (see
    /// [`Completed`]).
    ///
    /// Errors: [`Error::CapturedEvent`] when the event was recorded in a
    /// graph capture (the host cannot wait for it; the lease ends as usual,
    /// destroying it); [`Error::CompletionThread`].
    ///
    /// ```
    /// use gpupool_core::{EventPool, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    /// let lease = streams.get(0)?;
    /// let ready = events.get(0)?;
    /// ready.record(&lease.order())?;     // waited on by other streams, say
    /// let done = ready.completed()?;     // and by the host, asynchronously
    /// # drop(done);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn completed(self) -> Result<Completed<'p, B>, Error<B::Error>> {
        if self.may_be_captured() {
            return Err(Error::CapturedEvent);
        }
        // The stream it was recorded on is not known: watched on its own.
        let key = StreamKey::apart();
        Completed::recorded(self, key, 0)
    }
}

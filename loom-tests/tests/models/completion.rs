//! `Completed` futures and their pool's completion engine (core,
//! `completion`): the engine's thread, a future's polls and drop, and the
//! mock's GPU finishing the work, all at once.
//!
//! Three threads: the model's main thread (submits, polls, parks, drops), the
//! engine's (started by the first future, joined by the pool's drop) and the
//! GPU's (completes the stream's work). A lost wake-up leaves the main
//! thread parked with the engine asleep: loom reports the deadlock. An event
//! returned twice or never shows in the mock's ledger (every event
//! destroyed exactly once by the pool's drop, no misuse).

use std::task::{Context, Poll, Wake, Waker};

use gpupool_mock::{CallKind, MockBackend};
use loom::sync::atomic::{AtomicUsize, Ordering};

use super::{event_pool, spawn_scoped, stream_pool, Scoped};
use gpupool_core::{Completed, EventPool, StreamHandle, StreamLease, StreamPool, StreamPoolConfig};

/// Notifies the model thread that waits on it (loom's `Notify`: one permit,
/// as a thread's park token; loom's own `unpark` cannot reach a thread that
/// is blocked in a join or a lock), counting its wakes.
struct Unpark {
    notify: loom::sync::Notify,
    wakes: AtomicUsize,
}

impl Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.notify.notify();
    }
}

impl Unpark {
    fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Unpark {
            notify: loom::sync::Notify::new(),
            wakes: AtomicUsize::new(0),
        })
    }

    /// Waits for a wake (one that came already counts).
    fn wait(&self) {
        self.notify.wait();
    }
}

/// Every event the pool made was destroyed exactly once, by its drop.
fn each_event_destroyed_once(mock: &MockBackend) {
    assert_eq!(mock.live_events(), 0, "an event was never returned");
    assert_eq!(
        mock.calls(CallKind::DestroyEvent),
        mock.calls(CallKind::CreateEvent),
        "an event was returned twice"
    );
    assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());
}

/// A one-device mock and the models' stream and event pools over it.
fn mock_and_pools() -> (MockBackend, StreamPool<MockBackend>, EventPool<MockBackend>) {
    let mock = MockBackend::new(1);
    let streams = stream_pool(&mock, StreamPoolConfig::default());
    let events = event_pool(&mock);
    (mock, streams, events)
}

/// The GPU's thread: completes every piece of work queued on `stream`.
fn gpu_completes_all(mock: &MockBackend, stream: StreamHandle) -> Scoped<()> {
    let gpu = mock.clone();
    spawn_scoped(move || gpu.complete_all(stream).unwrap())
}

/// Leases a stream, queues a piece of work on it and makes the future of its
/// completion, then starts the GPU's thread, which completes the stream's
/// work ([`gpu_completes_all`]).
fn work_raced_by_the_gpu<'s, 'p>(
    mock: &MockBackend,
    streams: &'s StreamPool<MockBackend>,
    events: &'p EventPool<MockBackend>,
) -> (
    StreamLease<'s, MockBackend>,
    Completed<'p, MockBackend>,
    Scoped<()>,
) {
    let lease = streams.get(0).unwrap();
    mock.enqueue_work(lease.handle()).unwrap();
    let done = lease.order().completed(events).unwrap();
    let t = gpu_completes_all(mock, lease.handle());
    (lease, done, t)
}

/// Drops the event pool (which stops and joins the engine), checks that
/// every event was destroyed once, then drops the stream pool.
fn drop_pools(
    mock: &MockBackend,
    streams: StreamPool<MockBackend>,
    events: EventPool<MockBackend>,
) {
    drop(events);
    each_event_destroyed_once(mock);
    drop(streams);
}

/// The main thread awaits a future (poll, park until woken, poll again)
/// while the GPU finishes the work and the engine watches it: the future
/// resolves, its task is woken, its event goes back to the pool once.
#[test]
fn wake_races_the_gpu() {
    loom::model(|| {
        let (mock, streams, events) = mock_and_pools();
        let (lease, mut done, t) = work_raced_by_the_gpu(&mock, &streams, &events);
        let unpark = Unpark::new();
        let waker = Waker::from(std::sync::Arc::clone(&unpark));
        loop {
            match std::pin::Pin::new(&mut done).poll_wake(&waker) {
                Poll::Ready(r) => {
                    assert_eq!(r, Ok(()));
                    break;
                }
                Poll::Pending => unpark.wait(),
            }
        }
        t.join();
        drop(done);
        drop(lease);
        assert_eq!(events.live_leases(), 0);
        drop_pools(&mock, streams, events);
    });
}

/// The main thread drops a pending future while the GPU finishes the work:
/// the event goes back exactly once, whether the drop or the engine's
/// answer comes first (the drop then hands it to the engine, which gives it
/// back once it passed).
#[test]
fn drop_races_the_gpu() {
    loom::model(|| {
        let (mock, streams, events) = mock_and_pools();
        let (lease, done, t) = work_raced_by_the_gpu(&mock, &streams, &events);
        drop(done);
        t.join();
        drop(lease);
        drop_pools(&mock, streams, events);
    });
}

/// `Future::poll` with a waker, for a `Pin<&mut F>`.
trait PollWake: std::future::Future {
    fn poll_wake(self: std::pin::Pin<&mut Self>, waker: &Waker) -> Poll<Self::Output> {
        self.poll(&mut Context::from_waker(waker))
    }
}

impl<F: std::future::Future + ?Sized> PollWake for F {}

/// Two futures on one stream from one thread (an ordered group: the engine
/// may resolve the first on the proof of the second), the second polled (and
/// so handed to the engine) first, while the GPU runs the
/// two pieces of work one at a time: a future is never ready before its own
/// work ran, and both events go back once.
#[test]
fn ordered_pair_never_resolves_early() {
    loom::model(|| {
        let (mock, streams, events) = mock_and_pools();
        let lease = streams.get(0).unwrap();
        let stream = lease.handle();
        mock.enqueue_work(stream).unwrap();
        let mut first = lease.order().completed(&events).unwrap();
        mock.enqueue_work(stream).unwrap();
        let mut second = lease.order().completed(&events).unwrap();
        let gpu = mock.clone();
        let t = spawn_scoped(move || {
            gpu.complete_one(stream).unwrap();
            gpu.complete_one(stream).unwrap();
        });
        let unpark = Unpark::new();
        let waker = Waker::from(std::sync::Arc::clone(&unpark));
        let (mut one, mut two) = (false, false);
        // The second is polled first, so it reaches the engine first: the
        // engine must still order the pair by record.
        while !(one && two) {
            if !two && std::pin::Pin::new(&mut second).poll_wake(&waker).is_ready() {
                assert_eq!(
                    mock.pending_work(stream).unwrap(),
                    0,
                    "second resolved before its work ran"
                );
                two = true;
            }
            if !one && std::pin::Pin::new(&mut first).poll_wake(&waker).is_ready() {
                assert!(
                    mock.pending_work(stream).unwrap() <= 1,
                    "first resolved before its work ran"
                );
                one = true;
            }
            if !(one && two) {
                unpark.wait();
            }
        }
        t.join();
        drop((first, second, lease));
        drop_pools(&mock, streams, events);
    });
}

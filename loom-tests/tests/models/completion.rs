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

use super::{event_pool, spawn_scoped, stream_pool};
use gpupool_core::StreamPoolConfig;

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

/// The main thread awaits a future (poll, park until woken, poll again)
/// while the GPU finishes the work and the engine watches it: the future
/// resolves, its task is woken, its event goes back to the pool once.
#[test]
fn wake_races_the_gpu() {
    loom::model(|| {
        let mock = MockBackend::new(1);
        let streams = stream_pool(&mock, StreamPoolConfig::default());
        let events = event_pool(&mock);
        let lease = streams.get(0).unwrap();
        mock.enqueue_work(lease.handle()).unwrap();
        let mut done = lease.order().completed(&events).unwrap();
        let stream = lease.handle();
        let gpu = mock.clone();
        let t = spawn_scoped(move || gpu.complete_all(stream).unwrap());
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
        drop(events); // stops and joins the engine
        each_event_destroyed_once(&mock);
        drop(streams);
    });
}

/// The main thread drops a pending future while the GPU finishes the work:
/// the event goes back exactly once, whether the drop or the engine's
/// answer comes first (the drop then hands it to the engine, which gives it
/// back once it passed).
#[test]
fn drop_races_the_gpu() {
    loom::model(|| {
        let mock = MockBackend::new(1);
        let streams = stream_pool(&mock, StreamPoolConfig::default());
        let events = event_pool(&mock);
        let lease = streams.get(0).unwrap();
        mock.enqueue_work(lease.handle()).unwrap();
        let done = lease.order().completed(&events).unwrap();
        let stream = lease.handle();
        let gpu = mock.clone();
        let t = spawn_scoped(move || gpu.complete_all(stream).unwrap());
        drop(done);
        t.join();
        drop(lease);
        drop(events); // stops and joins the engine
        each_event_destroyed_once(&mock);
        drop(streams);
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
        let mock = MockBackend::new(1);
        let streams = stream_pool(&mock, StreamPoolConfig::default());
        let events = event_pool(&mock);
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
        drop(events);
        each_event_destroyed_once(&mock);
        drop(streams);
    });
}

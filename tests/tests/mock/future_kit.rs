//! What the adversarial reviews of `Completed` futures share: a waker that
//! counts its wakes, a mock machine, polling and waiting helpers (those of
//! `gpupool_tests::wake`, under the names the reviews use).
#![cfg(not(feature = "cuda"))]

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Wake, Waker};

use super::common::busy_lease;
use gpupool_core::{Completed, EventPool, StreamLease, StreamPool};
use gpupool_mock::{CallKind, CompletionPolicy, MockBackend};
pub(crate) use gpupool_tests::assert_clean;
use gpupool_tests::wake::WakeCounter;
pub(crate) use gpupool_tests::wake::{counting_waker as flag, poll, until, wait_for, LONG};

/// Nothing misused, every event made destroyed exactly once (after the
/// pool's drop).
#[track_caller]
pub(crate) fn all_back(gpu: &MockBackend) {
    assert_clean(gpu);
    let (made, destroyed) = (
        gpu.calls(CallKind::CreateEvent),
        gpu.calls(CallKind::DestroyEvent),
    );
    assert_eq!(made, destroyed, "created vs destroyed");
    assert_eq!(gpu.live_events(), 0, "events left alive");
}

/// A machine of `devices` devices, with a stream pool and an event pool.
pub(crate) fn machine(
    devices: u32,
) -> (MockBackend, StreamPool<MockBackend>, EventPool<MockBackend>) {
    let gpu = MockBackend::new(devices);
    (
        gpu.clone(),
        StreamPool::new(gpu.clone()),
        EventPool::new(gpu),
    )
}

/// A one-device machine whose completion policy is set to `policy` before
/// its pools are made, with a stream pool and an event pool.
pub(crate) fn machine_with_policy(
    policy: CompletionPolicy,
) -> (MockBackend, StreamPool<MockBackend>, EventPool<MockBackend>) {
    let gpu = MockBackend::new(1);
    gpu.set_policy(policy);
    let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    (gpu, streams, events)
}

/// Drops the event pool, then checks that every event came back ([`all_back`]).
#[track_caller]
pub(crate) fn drop_pool_then_all_back(events: EventPool<MockBackend>, gpu: &MockBackend) {
    drop(events);
    all_back(gpu);
}

/// Drops `first` (a tuple drops its fields first to last), then the event
/// pool, then checks that every event came back ([`all_back`]).
#[track_caller]
pub(crate) fn drop_then_all_back<T>(first: T, events: EventPool<MockBackend>, gpu: &MockBackend) {
    drop(first);
    drop_pool_then_all_back(events, gpu);
}

/// Completes all the work, waits until the events of abandoned futures are
/// back in the pool ([`until_every_event_pooled`]), then drops `lease` and the
/// pool ([`drop_then_all_back`]).
#[track_caller]
pub(crate) fn abandoned_events_back(
    gpu: &MockBackend,
    lease: StreamLease<'_, MockBackend>,
    events: EventPool<MockBackend>,
) {
    until_every_event_pooled(gpu, &lease, &events);
    drop_then_all_back(lease, events, gpu);
}

/// Completes all the work and waits until every event alive on the mock is
/// in `events`: none leased, none still kept by the engine for an abandoned
/// future. Each try takes in what the engine handed back (`completed` does)
/// and resolves its own future on `lease`, so that its event goes back to the
/// pool as well; a future dropped unpolled instead would leave its event with
/// the engine, one event always out.
#[track_caller]
pub(crate) fn until_every_event_pooled(
    gpu: &MockBackend,
    lease: &StreamLease<'_, MockBackend>,
    events: &EventPool<MockBackend>,
) {
    gpu.complete_everything();
    until("every abandoned event is back", || {
        let mut f = lease.order().completed(events).unwrap();
        gpu.complete_everything();
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
        drop(f);
        events.live_leases() == 0 && events.total_stats().pooled == gpu.live_events()
    });
}

/// A busy lease ([`busy_lease`]) and the future of its stream's work so far
/// (`completed`, not polled yet; it borrows the event pool, not the lease).
#[track_caller]
pub(crate) fn busy_lease_and_future<'s, 'e>(
    gpu: &MockBackend,
    streams: &'s StreamPool<MockBackend>,
    events: &'e EventPool<MockBackend>,
) -> (StreamLease<'s, MockBackend>, Completed<'e, MockBackend>) {
    let lease = busy_lease(gpu, streams);
    let f = lease.order().completed(events).unwrap();
    (lease, f)
}

/// [`busy_lease_and_future`], the future polled once with a waker of `wake`
/// (and asserted pending: the work has not run); the future keeps the waker.
#[track_caller]
pub(crate) fn busy_lease_and_polled_future<'s, 'e>(
    gpu: &MockBackend,
    streams: &'s StreamPool<MockBackend>,
    events: &'e EventPool<MockBackend>,
    wake: impl Wake + Send + Sync + 'static,
) -> (StreamLease<'s, MockBackend>, Completed<'e, MockBackend>) {
    let (lease, mut f) = busy_lease_and_future(gpu, streams, events);
    assert!(poll(&mut f, &Waker::from(Arc::new(wake))).is_pending());
    (lease, f)
}

/// Polls `f` once with a fresh counting waker ([`flag`]) and asserts that it
/// is pending; the counter and the waker come back.
#[track_caller]
pub(crate) fn pending_with_flag<F: Future + Unpin>(f: &mut F) -> (Arc<WakeCounter>, Waker) {
    let (c, w) = flag();
    assert!(poll(f, &w).is_pending());
    (c, w)
}

/// A point where a waker holds the thread that wakes it (the engine's, in
/// the tests) until the test opens it; as a waker itself, it only holds.
#[derive(Default)]
pub(crate) struct Gate {
    reached: AtomicBool,
    open: AtomicBool,
}

impl Gate {
    /// Marks the gate reached, then waits until it is opened.
    pub(crate) fn hold(&self) {
        // SeqCst on these flags: test code, the strongest order keeps the
        // argument trivial.
        self.reached.store(true, SeqCst);
        until("told to go on", || self.open.load(SeqCst));
    }

    /// Whether a thread has reached the gate.
    pub(crate) fn reached(&self) -> bool {
        self.reached.load(SeqCst)
    }

    /// Lets the held thread go on.
    pub(crate) fn open(&self) {
        self.open.store(true, SeqCst);
    }
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.hold();
    }
}

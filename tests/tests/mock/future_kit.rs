//! What the adversarial reviews of `Completed` futures share: a waker that
//! counts its wakes, a mock machine, polling and waiting helpers.
#![cfg(not(feature = "cuda"))]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use gpupool_core::{EventPool, StreamPool};
use gpupool_mock::{CallKind, MockBackend};

/// What "never" means (Miri runs the engine's thread far slower).
pub(crate) const LONG: Duration = Duration::from_secs(if cfg!(miri) { 300 } else { 5 });

/// No misuse and no hazard on the mock.
#[track_caller]
pub(crate) fn assert_clean(gpu: &MockBackend) {
    assert!(gpu.misuses().is_empty(), "misuses: {:?}", gpu.misuses());
    assert!(gpu.hazards().is_empty(), "hazards: {:?}", gpu.hazards());
}

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

/// Counts its wakes and unparks the thread that made it.
pub(crate) struct Flag(pub(crate) AtomicUsize, thread::Thread);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
        self.1.unpark();
    }
}

/// A [`Flag`] of the calling thread and its waker.
pub(crate) fn flag() -> (Arc<Flag>, Waker) {
    let f = Arc::new(Flag(AtomicUsize::new(0), thread::current()));
    (Arc::clone(&f), Waker::from(f))
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

/// One poll of `f` with `w`.
pub(crate) fn poll<F: Future + Unpin>(f: &mut F, w: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(w))
}

/// Polls `f` until it is ready, or `None` once `limit` has passed.
pub(crate) fn wait_for<F: Future + Unpin>(f: &mut F, limit: Duration) -> Option<F::Output> {
    let (_, w) = flag();
    let start = Instant::now();
    loop {
        if let Poll::Ready(v) = poll(f, &w) {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        thread::park_timeout(Duration::from_millis(2));
    }
}

/// Waits (at most [`LONG`]) until `cond` holds.
#[track_caller]
pub(crate) fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LONG, "never: {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

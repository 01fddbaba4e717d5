//! What the adversarial reviews of `Completed` futures share: a waker that
//! counts its wakes, a mock machine, polling and waiting helpers (those of
//! `gpupool_tests::wake`, under the names the reviews use).
#![cfg(not(feature = "cuda"))]

use gpupool_core::{EventPool, StreamPool};
use gpupool_mock::{CallKind, MockBackend};
pub(crate) use gpupool_tests::assert_clean;
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

/// Drops the event pool, then checks that every event came back ([`all_back`]).
#[track_caller]
pub(crate) fn drop_pool_then_all_back(events: EventPool<MockBackend>, gpu: &MockBackend) {
    drop(events);
    all_back(gpu);
}

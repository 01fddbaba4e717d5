//! Mock-only: event-pool behaviour that needs a machine a GPU run cannot be
//! (no device at all) or the flags exactly as the backend received them.
//! Everything else about `EventPool` is in the generic suite,
//! `suite_events.rs`, which runs on a GPU too.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{EventFlags, EventPool};
use gpupool_tests::mock;

#[test]
fn an_event_pool_over_a_machine_without_devices_is_built_without_a_call() {
    let gpu = mock(0); // DALI's constructor counts devices and throws here
    let pool = EventPool::new(gpu.clone());
    assert_eq!(gpu.total_calls(), 0);
    drop(pool);
    assert_eq!(gpu.total_calls(), 0);
}

#[test]
fn event_flags_reach_the_backend_unchanged() {
    let gpu = mock(1);
    let default = EventPool::new(gpu.clone());
    let e = default.get(0).unwrap();
    assert_eq!(
        gpu.event_flags(e.handle()),
        Some(EventFlags::DISABLE_TIMING)
    );
    let custom = EventPool::with_flags(
        gpu.clone(),
        EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING,
    );
    let c = custom.get(0).unwrap();
    assert_eq!(gpu.event_flags(c.handle()), Some(EventFlags(3)));
}

//! Mock-only: event-pool behaviour that needs a machine a GPU run cannot be
//! (no device at all) or the flags exactly as the backend received them.
//! Everything else about `EventPool` is in the generic suite,
//! `suite/events.rs`, which runs on a GPU too.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{EventFlags, EventPool};
use gpupool_tests::{mock, mock_event_pool};

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
    let (gpu, default) = mock_event_pool(1);
    let custom = EventPool::with_flags(
        gpu.clone(),
        EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING,
    );
    for (pool, flags) in [
        (default, EventFlags::DISABLE_TIMING),
        (custom, EventFlags(3)),
    ] {
        let e = pool.get(0).unwrap();
        assert_eq!(gpu.event_flags(e.handle()), Some(flags));
    }
}

#[test]
fn get_in_cycles_reuse_the_threads_cached_event() {
    let (gpu, pool) = mock_event_pool(1);
    let guard = pool.collector().register().pin();
    let first = pool.get_in(0, &guard).unwrap().handle();
    for _ in 0..10 {
        assert_eq!(pool.get_in(0, &guard).unwrap().handle(), first);
    }
    assert_eq!(gpu.live_events(), 1, "one event for every cycle");
    let stats = pool.stats(gpupool_core::DeviceId(0)).unwrap();
    assert_eq!((stats.created, stats.live_leases, stats.pooled), (1, 0, 1));
}

#[test]
fn pooled_counts_the_events_the_pool_holds_and_has_not_leased() {
    use gpupool_core::DeviceId;
    let (gpu, pool) = mock_event_pool(1);
    let pooled = |pool: &EventPool<_>| pool.stats(DeviceId(0)).unwrap().pooled;
    let leases: Vec<_> = (0..6).map(|_| pool.get(0).unwrap()).collect();
    assert_eq!(pooled(&pool), 0);
    let mut leases = leases.into_iter();
    let detached = leases.next().unwrap().detach();
    let shared = leases.next().unwrap().share();
    let clone = shared.clone();
    drop(leases); // four back: the thread's cell, then the ready list
    assert_eq!(pooled(&pool), 4);
    drop((shared, clone));
    assert_eq!(pooled(&pool), 5, "the last clone returns the shared event");
    pool.put(detached, None).unwrap();
    assert_eq!(pooled(&pool), 6);
    // An event leased in place from the cell, then destroyed: out of the pool.
    pool.get(0).unwrap().destroy().unwrap();
    assert_eq!(pooled(&pool), 5);
    assert_eq!(pool.purge().unwrap(), 5);
    assert_eq!(pooled(&pool), 0);
    assert_eq!(gpu.live_events(), 0);
}

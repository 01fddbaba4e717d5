//! EventPool, EventLease and SharedEvent (SPEC.md 1.3 and 0), on the mock machine.

use gpupool_core::{DeviceId, DeviceSelector, EventBackend, EventFlags, EventPool, OwnedEvent};
use gpupool_mock::CallKind;
use gpupool_tests::mock;

#[test]
fn constructing_an_event_pool_calls_nothing() {
    let gpu = mock(0); // even with no device at all (DALI's throws here)
    let pool = EventPool::new(gpu.clone());
    assert_eq!(gpu.total_calls(), 0);
    drop(pool);
    assert_eq!(gpu.total_calls(), 0);
}

#[test]
fn events_get_the_pools_flags_timing_disabled_by_default() {
    let gpu = mock(1);
    let default = EventPool::new(gpu.clone());
    let e = default.get(0).unwrap();
    assert_eq!(gpu.event_flags(e.get()), Some(EventFlags::DISABLE_TIMING));
    let custom = EventPool::with_flags(
        gpu.clone(),
        EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING,
    );
    let c = custom.get(0).unwrap();
    assert_eq!(gpu.event_flags(c.get()), Some(EventFlags(3)));
    assert_eq!(custom.flags(), EventFlags(3));
}

#[test]
fn reuse_is_lifo_and_return_and_reuse_make_no_backend_call() {
    let gpu = mock(1);
    let pool = EventPool::new(gpu.clone());
    let a = pool.get(0).unwrap();
    let b = pool.get(0).unwrap();
    let (ea, eb) = (a.get(), b.get());
    let calls = gpu.total_calls();
    drop(a);
    drop(b);
    let x = pool.get(0).unwrap();
    let y = pool.get(0).unwrap();
    assert_eq!((x.get(), y.get()), (eb, ea));
    assert_eq!(gpu.total_calls(), calls);
    let s = pool.stats(DeviceId(0)).unwrap();
    assert_eq!((s.created, s.reused, s.leases, s.live_leases), (2, 2, 4, 2));
}

#[test]
fn a_pending_event_may_be_returned_and_leased_again() {
    let gpu = mock(1);
    let pool = EventPool::new(gpu.clone());
    let streams = gpupool_core::StreamPool::new(gpu.clone());
    let s = streams.get(0).unwrap();
    gpu.enqueue_work(s.get()).unwrap();
    let e = pool.get(0).unwrap();
    gpu.record_event(e.get(), s.get(), DeviceId(0)).unwrap();
    let handle = e.get();
    drop(e);
    let again = pool.get(0).unwrap();
    assert_eq!(again.get(), handle);
    assert_eq!(
        gpu.query_event(handle, DeviceId(0)).unwrap(),
        gpupool_core::Completion::Pending
    );
}

#[test]
fn put_without_a_device_uses_the_events_own_device_not_the_current_one() {
    let gpu = mock(2);
    let pool = EventPool::new(gpu.clone());
    gpu.set_current_device(DeviceId(0));
    let e = pool.get(1).unwrap();
    let handle = e.get();
    pool.put(e.release(), None).unwrap();
    assert_eq!(
        pool.get(1).unwrap().get(),
        handle,
        "returned to device 1's list"
    );
    assert_eq!(pool.stats(DeviceId(0)).unwrap().created, 0);
}

#[test]
fn current_device_selects_the_list() {
    let gpu = mock(2);
    let pool = EventPool::new(gpu.clone());
    gpu.set_current_device(DeviceId(1));
    let e = pool.get(DeviceSelector::Current).unwrap();
    assert_eq!(e.device(), DeviceId(1));
}

#[test]
fn shared_event_returns_when_the_last_clone_drops() {
    let gpu = mock(1);
    let pool = EventPool::new(gpu.clone());
    let shared = pool.get_shared(0).unwrap();
    let handle = shared.get();
    let clones: Vec<_> = (0..3).map(|_| shared.clone()).collect();
    drop(shared);
    assert_eq!(pool.live_leases(), 1);
    let held = clones[2].get();
    drop(clones);
    assert_eq!(held, handle);
    assert_eq!(pool.live_leases(), 0);
    assert_eq!(pool.get(0).unwrap().get(), handle);
}

#[test]
fn release_put_and_destroy() {
    let gpu = mock(2);
    let pool = EventPool::new(gpu.clone());
    let e = pool.get(1).unwrap();
    let owned = e.release();
    assert_eq!(owned.device(), DeviceId(1));
    pool.put(owned, Some(DeviceId(1))).unwrap();
    let raw = gpu
        .create_event(DeviceId(0), EventFlags::DISABLE_TIMING)
        .unwrap();
    // SAFETY: `raw` was just created on device 0 and is handed over here.
    pool.put(
        unsafe { OwnedEvent::from_raw_parts(raw, DeviceId(0)) }.unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(pool.get(0).unwrap().get(), raw);
    let doomed = pool.get(1).unwrap().release();
    let h = doomed.handle();
    doomed.destroy(&gpu).unwrap();
    assert!(!gpu.is_live_event(h));
}

#[test]
fn discard_destroys_instead_of_returning() {
    let gpu = mock(1);
    let pool = EventPool::new(gpu.clone());
    let e = pool.get(0).unwrap();
    let h = e.get();
    e.discard().unwrap();
    assert!(!gpu.is_live_event(h));
    assert_eq!(pool.live_leases(), 0);
    assert_eq!(pool.stats(DeviceId(0)).unwrap().destroyed, 1);
}

#[test]
fn purge_with_leases_out_and_drop_destroy_everything_pooled() {
    let gpu = mock(2);
    let pool = EventPool::new(gpu.clone());
    let out = pool.get(0).unwrap();
    drop(pool.get(1).unwrap());
    drop(pool.get(0).unwrap());
    assert_eq!(gpu.live_events(), 3);
    assert_eq!(pool.purge().unwrap(), 2);
    assert_eq!(gpu.calls(CallKind::DestroyEvent), 2);
    drop(out);
    assert_eq!(gpu.live_events(), 1);
    drop(pool);
    assert_eq!(gpu.live_events(), 0);
    assert!(gpu.misuses().is_empty());
}

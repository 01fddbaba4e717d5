//! Generic suite: `EventPool`, `EventLease` and `SharedEvent` (DALI's
//! `CUDAEventPool`, and where gpupool differs) on the machine of this build —
//! the mock by default, a GPU with `--features cuda`. What both pools do
//! alike is in `both.rs`.

use gpupool_core::{
    Completion, DeviceId, DeviceSelector, EventBackend, EventFlags, EventPool, OwnedEvent,
};
use gpupool_tests::any_pool::assert_drop_destroys_the_rest;
use gpupool_tests::{
    assert_count, assert_no_misuse, assert_ordered, machine, with_event_pool, with_pools, TestGpu,
};

const D0: DeviceId = DeviceId(0);

#[test]
fn events_have_the_pools_flags_timing_disabled_by_default() {
    with_event_pool(1, |gpu, default| {
        assert_eq!(default.flags(), EventFlags::DISABLE_TIMING);
        let e = default.get(0).unwrap();
        assert_ne!(
            // SAFETY: the lease `e` holds this live event of device 0, and nothing
            // else uses it.
            unsafe { gpu.event_timing(e.handle(), D0) },
            Some(true),
            "timing disabled"
        );
        let timed = EventPool::with_flags(gpu.backend(), EventFlags::DEFAULT);
        let t = timed.get(0).unwrap();
        assert_ne!(
            // SAFETY: the lease `t` holds this live event of device 0, and nothing
            // else uses it.
            unsafe { gpu.event_timing(t.handle(), D0) },
            Some(false),
            "timing asked for"
        );
        let custom = EventPool::with_flags(
            gpu.backend(),
            EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING,
        );
        assert_eq!(custom.flags(), EventFlags(3));
        let c = custom.get(0).unwrap();
        assert_ne!(
            // SAFETY: the lease `c` holds this live event of device 0, and nothing
            // else uses it.
            unsafe { gpu.event_timing(c.handle(), D0) },
            Some(true),
            "timing disabled"
        );
    });
}

#[test]
fn a_pending_event_may_be_returned_and_leased_again() {
    with_pools(1, |gpu, streams, pool| {
        let backend = gpu.backend();
        let s = streams.get(0).unwrap();
        // SAFETY: the lease `s` holds this live stream of device 0.
        unsafe { gpu.make_busy(s.handle(), D0) };
        let e = pool.get(0).unwrap();
        // SAFETY: the leases hold this live event and stream, both on device 0.
        unsafe { backend.record_event(e.handle(), s.handle(), D0) }.unwrap();
        let handle = e.handle();
        drop(e);
        let again = pool.get(0).unwrap();
        assert_eq!(again.handle(), handle);
        // SAFETY: `again` holds this live event of device 0.
        let pending = unsafe { backend.query_event(handle, D0) }.unwrap();
        assert_eq!(pending, Completion::Pending);
        // SAFETY: the lease `s` still holds this live stream of device 0.
        unsafe { gpu.finish(s.handle(), D0) };
        // SAFETY: as above; `again` still holds it.
        let complete = unsafe { backend.query_event(handle, D0) }.unwrap();
        assert_eq!(complete, Completion::Complete);
    });
}

#[test]
fn put_without_a_device_uses_the_events_own_device_not_the_current_one() {
    with_event_pool(2, |gpu, pool| {
        let d1 = DeviceId(1);
        gpu.set_current_device(D0);
        let e = pool.get(d1).unwrap();
        let handle = e.handle();
        pool.put(e.detach(), None).unwrap();
        assert_eq!(
            pool.get(d1).unwrap().handle(),
            handle,
            "back on device 1's list"
        );
        assert_eq!(pool.stats(D0).unwrap().created, 0);
        assert_eq!(pool.stats(d1).unwrap().created, 1);
    });
}

#[test]
fn the_current_device_selects_the_list() {
    let Some(gpu) = machine(1, 2) else { return };
    let last = DeviceId(gpu.device_count() - 1);
    let pool = EventPool::new(gpu.backend());
    gpu.set_current_device(last);
    let e = pool.get(DeviceSelector::Current).unwrap();
    assert_eq!(e.device(), last);
    assert_eq!(pool.stats(last).unwrap().created, 1);
}

#[test]
fn a_shared_event_returns_when_the_last_clone_drops() {
    with_event_pool(1, |_gpu, pool| {
        let shared = pool.get_shared(0).unwrap();
        let handle = shared.handle();
        let clones: Vec<_> = (0..3).map(|_| shared.clone()).collect();
        drop(shared);
        assert_eq!(pool.live_leases(), 1);
        let held = clones[2].handle();
        drop(clones);
        assert_eq!(held, handle);
        assert_eq!(pool.live_leases(), 0);
        assert_eq!(pool.get(0).unwrap().handle(), handle);
    });
}

#[test]
fn a_shared_event_orders_like_any_other() {
    with_pools(1, |gpu, streams, pool| {
        let backend = gpu.backend();
        let (producer, consumer) = (streams.get(0).unwrap(), streams.get(0).unwrap());
        let shared = pool.get_shared(0).unwrap();
        let link = || {
            // SAFETY: the shared lease and the stream lease hold this live event
            // and stream, both on device 0.
            unsafe { backend.record_event(shared.handle(), producer.handle(), D0) }.unwrap();
            let other = shared.clone();
            consumer.order().wait_event(&other).unwrap();
            assert_eq!(pool.live_leases(), 1, "clones share one lease");
        };
        let (p, c) = ((producer.handle(), D0), (consumer.handle(), D0));
        // SAFETY: the leases `producer` and `consumer` hold these live streams of
        // device 0 until the end of the test; `link` does not touch them.
        unsafe { assert_ordered(&gpu, p, c, link, "a shared event") };
        drop(shared);
        assert_eq!(pool.live_leases(), 0);
    });
}

#[test]
fn release_put_and_destroy() {
    let Some(gpu) = machine(1, 2) else { return };
    let last = DeviceId(gpu.device_count() - 1);
    let backend = gpu.backend();
    let pool = EventPool::new(gpu.backend());
    let owned = pool.get(last).unwrap().detach();
    assert_eq!(owned.device(), last);
    assert_eq!(pool.live_leases(), 0);
    pool.put(owned, Some(last)).unwrap();
    let raw = backend
        .create_event(D0, EventFlags::DISABLE_TIMING)
        .unwrap();
    // SAFETY: `raw` was just created on device 0 by this backend and is
    // handed over here.
    let adopted = unsafe { OwnedEvent::from_raw_parts(&backend, raw, D0) }.unwrap();
    pool.put(adopted, None).unwrap();
    assert_eq!(pool.get(0).unwrap().handle(), raw);
    assert_count(gpu.live_events(), 2, "the pool's event and the adopted one");
    let doomed = pool.get(last).unwrap().detach();
    doomed.destroy(&backend).unwrap();
    assert_count(gpu.live_events(), 1, "destroyed");
}

#[test]
fn discard_destroys_instead_of_returning() {
    with_event_pool(1, |gpu, pool| {
        let e = pool.get(0).unwrap();
        let h = e.handle();
        assert_count(gpu.live_events(), 1, "leased");
        e.destroy().unwrap();
        assert_count(gpu.live_events(), 0, "discarded");
        assert_eq!(pool.live_leases(), 0);
        assert_eq!(pool.stats(D0).unwrap().destroyed, 1);
        assert_ne!(pool.get(0).unwrap().handle(), h, "not pooled");
    });
}

#[test]
fn purge_with_leases_out_and_drop_destroy_everything_pooled() {
    let Some(gpu) = machine(1, 2) else { return };
    let last = DeviceId(gpu.device_count() - 1);
    let pool = EventPool::new(gpu.backend());
    let out = pool.get(0).unwrap();
    let kept = out.handle();
    // Both held at once, so that they are two events even when `last` is 0.
    let (a, b) = (pool.get(last).unwrap(), pool.get(0).unwrap());
    drop((a, b));
    assert_count(gpu.live_events(), 3, "before the purge");
    assert_eq!(pool.purge().unwrap(), 2);
    assert_eq!(pool.total_stats().destroyed, 2);
    assert_count(gpu.live_events(), 1, "the leased event is left");
    drop(out);
    assert_eq!(
        pool.get(0).unwrap().handle(),
        kept,
        "it came back after the purge"
    );
    assert_drop_destroys_the_rest(&gpu, pool);
}

/// Leases taken on one thread (served in place from its cell once warm) end on
/// another, while a third thread purges and leases of its own come and go:
/// no event is ever held by two leases, every lease ends, and purge and drop
/// reach every event. (TSan and Miri run this too.)
#[test]
fn leases_ended_on_another_thread_while_a_third_purges_lose_and_share_nothing() {
    use std::collections::HashSet;
    use std::sync::{mpsc, Mutex};
    with_event_pool(1, |gpu, pool| {
        let rounds = if cfg!(miri) { 40 } else { 5_000 };
        let held = Mutex::new(HashSet::new());
        let claim =
            |e: gpupool_core::EventHandle| assert!(held.lock().unwrap().insert(e), "held twice");
        let free = |e: gpupool_core::EventHandle| assert!(held.lock().unwrap().remove(&e));
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::sync_channel(4);
            let (pool, claim, free) = (&pool, &claim, &free);
            s.spawn(move || {
                for i in 0..rounds {
                    let lease = pool.get(0).unwrap();
                    claim(lease.handle());
                    if i % 3 == 0 {
                        // Ended here: into this thread's cell, to be leased in
                        // place by the next gets, which the other thread ends.
                        free(lease.handle());
                        drop(lease);
                    } else {
                        tx.send(lease).unwrap();
                    }
                }
            });
            s.spawn(move || {
                for lease in rx {
                    free(lease.handle());
                    drop(lease);
                }
            });
            s.spawn(move || {
                for i in 0..rounds / 8 {
                    if i % 4 == 0 {
                        pool.purge().unwrap();
                    }
                    let lease = pool.get(0).unwrap();
                    claim(lease.handle());
                    free(lease.handle());
                }
            });
        });
        assert!(held.lock().unwrap().is_empty());
        assert_eq!(pool.live_leases(), 0);
        assert!(pool.take_error().is_none());
        pool.purge().unwrap();
        drop(pool);
        assert_count(gpu.live_events(), 0, "events left after purge and drop");
        assert_no_misuse(&gpu);
    });
}

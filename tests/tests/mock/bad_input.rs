//! Mock-only: bad input that only the mock can present (a current device out
//! of range, a made-up stream handle, no device at all, an absurd device
//! count, handles and orders of another machine) and backend failures
//! injected at each call. The bad input a GPU can be given too (devices out of
//! range, wrong devices, null and special handles, foreign guards, a
//! scratchpad's orders on another device) is in the generic suite,
//! `suite/bad_input.rs`.
//!
//! Another machine: every CUDA backend value of a process shares one
//! [`BackendId`](gpupool_core::BackendId) (one driver), so a foreign handle
//! can only be presented with two mock machines, each with its own id.
#![cfg(not(feature = "cuda"))]

use super::common::mock_rig;
use gpupool_core::{
    AccessOrder, Backend, BackendOp, DeviceId, DeviceSelector, Error, EventPool, OwnedStream,
    Scratchpad, ScratchpadConfig, StreamHandle, StreamPool,
};
use gpupool_mock::{CallKind, MockBackend};
use gpupool_tests::any_pool::AnyPool;
use gpupool_tests::{mock, mock_pools, mock_stream_pool};

const D0: DeviceId = DeviceId(0);

/// Purges `pool`, which must destroy `pooled` streams and leave none alive
/// on `gpu`.
#[track_caller]
fn purge_leaves_no_stream(gpu: &MockBackend, pool: &StreamPool<MockBackend>, pooled: usize) {
    assert_eq!(pool.purge().unwrap(), pooled);
    assert_eq!(gpu.live_streams(), 0);
}

#[test]
fn a_current_device_out_of_range_is_an_error_and_creates_nothing() {
    let (gpu, streams, events) = mock_pools(2);
    gpu.set_current_device(DeviceId(7));
    let out_of_range = Error::DeviceOutOfRange {
        device: DeviceId(7),
        count: 2,
    };
    assert_eq!(
        streams.get(DeviceSelector::Current).unwrap_err(),
        out_of_range
    );
    assert_eq!(
        events.get(DeviceSelector::Current).unwrap_err(),
        out_of_range
    );
    assert_eq!(
        gpu.calls(CallKind::CreateStream) + gpu.calls(CallKind::CreateEvent),
        0
    );
    drop(streams.get(1).unwrap());
    drop(events.get(1).unwrap());
}

#[test]
fn adopting_an_unknown_stream_is_a_backend_error() {
    let gpu = mock(1);
    // SAFETY: deliberately not a live stream, made up with `from_raw` (safe
    // code cannot forge one): the mock's trait methods are sound for any
    // handle, and it refuses this one when asked for its device, before
    // the pool could hold it.
    let err = unsafe { OwnedStream::adopt(&gpu, StreamHandle::from_raw(0xdead)) }.unwrap_err();
    assert_eq!(err.backend_op(), Some(BackendOp::StreamDevice));
}

#[test]
fn no_device_at_all_is_an_error_and_nothing_is_built() {
    let (gpu, streams, events) = mock_pools(0);
    assert_eq!(streams.get(0).unwrap_err(), Error::NoDevice);
    assert_eq!(events.get(0).unwrap_err(), Error::NoDevice);
    assert_eq!(
        streams.device_count(),
        None,
        "zero devices publish no table"
    );
    assert_eq!(streams.get(0).unwrap_err(), Error::NoDevice);
    assert_eq!(
        gpu.calls(CallKind::DeviceCount),
        3,
        "asked again on every call, like DALI"
    );
}

#[test]
fn a_failed_create_is_an_error_and_the_pool_still_works() {
    let (gpu, streams, events) = mock_pools(1);
    gpu.fail_nth(CallKind::CreateStream, 1);
    gpu.fail_nth(CallKind::CreateEvent, 1);
    assert_eq!(
        streams.get(0).unwrap_err().backend_op(),
        Some(BackendOp::CreateStream)
    );
    assert_eq!(
        events.get(0).unwrap_err().backend_op(),
        Some(BackendOp::CreateEvent)
    );
    assert_eq!(streams.live_leases() + events.live_leases(), 0);
    drop(streams.get(0).unwrap());
    drop(events.get(0).unwrap());
}

#[test]
fn a_failed_device_count_publishes_nothing_and_is_retried() {
    let (gpu, pool) = mock_stream_pool(1);
    gpu.fail_nth(CallKind::DeviceCount, 1);
    assert_eq!(
        pool.get(0).unwrap_err().backend_op(),
        Some(BackendOp::DeviceCount)
    );
    assert_eq!(pool.device_count(), None);
    drop(pool.get(0).unwrap());
    assert_eq!(pool.device_count(), Some(1));
}

#[test]
fn a_failed_query_on_return_is_parked_and_the_stream_is_not_lost() {
    let (gpu, pool) = mock_stream_pool(1);
    let lease = pool.get(0).unwrap();
    let s = lease.handle();
    gpu.fail_nth(CallKind::QueryStream, 1);
    drop(lease); // must not panic
    let parked = pool.take_error().expect("the error is parked");
    assert_eq!(parked.backend_op(), Some(BackendOp::QueryStream));
    assert!(pool.take_error().is_none());
    assert_eq!(pool.live_leases(), 0);
    // The stream is quarantined: not leased again, but not lost either.
    assert_eq!(pool.total_stats().quarantined, 1);
    assert_ne!(pool.get(0).unwrap().handle(), s);
    assert!(gpu.is_live_stream(s));
    purge_leaves_no_stream(&gpu, &pool, 2);
}

#[test]
fn a_stream_failing_its_query_in_a_scan_is_set_aside_and_get_still_serves() {
    let (gpu, pool) = mock_stream_pool(1);
    let leases: Vec<_> = (0..3).map(|_| pool.get(0).unwrap()).collect();
    let handles: Vec<_> = leases.iter().map(|l| l.handle()).collect();
    for &h in &handles {
        gpu.enqueue_work(h).unwrap();
    }
    drop(leases); // all busy
    gpu.complete_everything();
    // The scan's first query (the oldest stream) fails: that stream is
    // quarantined and the scan goes on to the next one.
    gpu.fail_nth(CallKind::QueryStream, 1);
    let got = pool.get(0).unwrap();
    assert_eq!(got.handle(), handles[1]);
    assert_eq!(
        pool.take_error().unwrap().backend_op(),
        Some(BackendOp::QueryStream)
    );
    let stats = pool.total_stats();
    assert_eq!(
        (stats.quarantined, stats.busy_hits, stats.promoted),
        (1, 1, 1)
    );
    // Every later scan skips it for good.
    drop(got);
    let [a, b, c] = super::common::leases(&pool);
    assert!(![a.handle(), b.handle(), c.handle()].contains(&handles[0]));
    drop((a, b, c));
    purge_leaves_no_stream(&gpu, &pool, 4);
}

#[test]
fn a_failed_query_on_return_to_pool_or_put_is_returned() {
    let (gpu, pool) = mock_stream_pool(1);
    let lease = pool.get(0).unwrap();
    gpu.fail_nth(CallKind::QueryStream, 1);
    assert_eq!(
        lease.return_to_pool().unwrap_err().backend_op(),
        Some(BackendOp::QueryStream)
    );
    let owned = pool.get(0).unwrap().detach();
    gpu.fail_nth(CallKind::QueryStream, 1);
    let r = pool.put(owned, None).unwrap_err();
    assert_eq!(r.error.backend_op(), Some(BackendOp::QueryStream));
    pool.put(r.value, None).unwrap();
    // The stream that failed on `return_to_pool` was quarantined; both are destroyed.
    purge_leaves_no_stream(&gpu, &pool, 2);
}

#[test]
fn a_failed_destroy_in_purge_keeps_the_stream_for_the_next_purge() {
    let (gpu, pool) = mock_stream_pool(1);
    let leases: Vec<_> = (0..3).map(|_| pool.get(0).unwrap()).collect();
    drop(leases);
    gpu.fail_nth(CallKind::DestroyStream, 2);
    let err = pool.purge().unwrap_err();
    assert_eq!(err.backend_op(), Some(BackendOp::DestroyStream));
    assert_eq!(gpu.live_streams(), 1);
    purge_leaves_no_stream(&gpu, &pool, 1);
}

#[test]
fn an_absurd_device_count_is_refused_without_allocating_a_table() {
    let (_gpu, pool) = mock_stream_pool(gpupool_core::MAX_DEVICES + 1);
    assert_eq!(
        pool.get(0).unwrap_err(),
        Error::TooManyDevices {
            count: gpupool_core::MAX_DEVICES + 1
        }
    );
    assert_eq!(pool.device_count(), None);
}

#[test]
fn a_failed_record_in_wait_destroys_the_event_and_reports() {
    mock_rig!(gpu, streams, events; [a, b] = leases);
    gpu.fail_nth(CallKind::RecordEvent, 1);
    let err = a.order().wait(&b.order(), &events).unwrap_err();
    assert_eq!(err.backend_op(), Some(BackendOp::RecordEvent));
    assert_eq!(
        gpu.live_events(),
        0,
        "the event was destroyed, not returned"
    );
    assert_eq!(events.live_leases(), 0);
    a.order().wait(&b.order(), &events).unwrap();
}

/// Ownership moves freely between pools of one machine (an owned handle is
/// not tied to a pool); a handle of *another* machine carries that machine's
/// id, so `put` refuses it before asking the backend anything, with or
/// without a device named, and the handle comes back; the pool is unchanged.
fn a_handle_of_another_machine_is_refused_by_put_and_comes_back<P: AnyPool<MockBackend>>() {
    let (here, there) = (mock(1), mock(1));
    let (pool_here, pool_there) = (P::over(here.clone()), P::over(there.clone()));
    pool_here.lease_handle(D0); // one handle of its own, ready
    let foreign = pool_there.detached(D0);
    let h = P::handle(&foreign);
    assert_eq!(P::owner(&foreign), there.id());
    let calls = here.total_calls();
    let r = pool_here.put(foreign, None).unwrap_err();
    assert_eq!(r.error, Error::ForeignHandle);
    assert_eq!(P::handle(&r.value), h, "the caller keeps the {}", P::WHAT);
    assert_eq!(here.total_calls(), calls, "nothing reached the backend");
    let stats = pool_here.total_stats();
    assert_eq!((stats.live_leases, stats.created), (0, 1));
    // The same with a device named: refused for its machine first.
    let r = pool_here.put(r.value, Some(D0)).unwrap_err();
    assert_eq!(r.error, Error::ForeignHandle);
    assert_eq!(here.total_calls(), calls, "nothing reached the backend");
    // Unchanged: the next lease is the pool's own handle, reused. (The two
    // machines number their handles alike, so the handles cannot tell.)
    pool_here.lease_handle(D0);
    let stats = pool_here.total_stats();
    assert_eq!((stats.live_leases, stats.created, stats.reused), (0, 1, 1));
    pool_there.put(r.value, None).unwrap();
    assert_eq!(pool_there.purge().unwrap(), 1);
    assert_eq!(pool_here.purge().unwrap(), 1);
    assert_eq!((P::live_on(&here), P::live_on(&there)), (Some(0), Some(0)));
    assert!(here.misuses().is_empty() && there.misuses().is_empty());
}

#[test]
fn a_stream_of_another_machine_is_refused_by_put_and_comes_back() {
    a_handle_of_another_machine_is_refused_by_put_and_comes_back::<StreamPool<_>>();
}

#[test]
fn an_event_of_another_machine_is_refused_by_put_and_comes_back() {
    a_handle_of_another_machine_is_refused_by_put_and_comes_back::<EventPool<_>>();
}

#[test]
fn destroying_an_owned_handle_with_another_machine_is_refused_and_it_comes_back() {
    let here = mock(1);
    let (there, streams, events) = mock_pools(1);
    let stream = streams.get(0).unwrap().detach();
    let event = events.get(0).unwrap().detach();
    let (hs, he) = (stream.handle(), event.handle());
    let calls = (here.total_calls(), there.total_calls());
    let r = stream.destroy(&here).unwrap_err();
    assert_eq!(r.error, Error::ForeignHandle);
    assert_eq!(r.value.handle(), hs, "the caller keeps the stream");
    let stream = r.value;
    let r = event.destroy(&here).unwrap_err();
    assert_eq!(r.error, Error::ForeignHandle);
    assert_eq!(r.value.handle(), he, "the caller keeps the event");
    let event = r.value;
    assert_eq!(
        (here.total_calls(), there.total_calls()),
        calls,
        "neither machine was called"
    );
    assert_eq!((there.live_streams(), there.live_events()), (1, 1));
    // Its own machine destroys it.
    stream.destroy(&there).unwrap();
    event.destroy(&there).unwrap();
    assert_eq!((there.live_streams(), there.live_events()), (0, 0));
    assert!(here.misuses().is_empty() && there.misuses().is_empty());
}

#[test]
fn an_order_of_another_machine_is_refused_by_scratchpads_and_waits() {
    let ((here, streams_here, events_here), (there, streams_there, events_there)) =
        (mock_pools(1), mock_pools(1));
    let mine = streams_here.get(0).unwrap();
    let foreign = streams_there.get(0).unwrap();
    let calls = (here.total_calls(), there.total_calls());

    // A scratchpad of this machine on a stream of the other one: refused,
    // as device order and as a release order.
    let e = Scratchpad::new(&here, foreign.order()).unwrap_err();
    assert_eq!(e, Error::ForeignHandle);
    let config = ScratchpadConfig {
        pinned_release: Some(foreign.order()),
        ..ScratchpadConfig::default()
    };
    let e = Scratchpad::with_config(&here, mine.order(), config).unwrap_err();
    assert_eq!(e, Error::ForeignHandle);

    // A wait with the event pool of another machine: whichever of the two
    // orders is foreign to the events, nothing is recorded or waited for.
    for (waiter, awaited, events, case) in [
        (
            mine.order(),
            mine.order(),
            &events_there,
            "even a wait on itself",
        ),
        (
            mine.order(),
            foreign.order(),
            &events_here,
            "on a foreign stream",
        ),
        (
            foreign.order(),
            mine.order(),
            &events_here,
            "a foreign stream waiting",
        ),
        (
            AccessOrder::host(),
            foreign.order(),
            &events_here,
            "the host synchronizing a foreign stream",
        ),
    ] {
        assert_eq!(
            waiter.wait(&awaited, events),
            Err(Error::ForeignHandle),
            "{case}"
        );
    }
    // Waiting for an event of another machine.
    let event = events_there.get(0).unwrap();
    assert_eq!(mine.order().wait_event(&event), Err(Error::ForeignHandle));
    drop(event);
    assert_eq!(
        (here.total_calls(), there.total_calls() - 2),
        calls,
        "nothing but the event lease (device count, create) reached a machine"
    );
    assert_eq!(events_here.device_count(), None, "no event was leased here");

    // Host order and CUDA's special streams belong to no machine: accepted.
    Scratchpad::new(&here, AccessOrder::host()).unwrap();
    Scratchpad::new(&here, AccessOrder::null_stream(DeviceId(0))).unwrap();
    mine.order()
        .wait(&AccessOrder::null_stream(DeviceId(0)), &events_here)
        .unwrap();
    // And the orders still work with their own machine.
    mine.order().wait(&mine.order(), &events_here).unwrap();
    drop(Scratchpad::new(&there, foreign.order()).unwrap());
    drop((mine, foreign));
    assert!(here.misuses().is_empty() && there.misuses().is_empty());
}

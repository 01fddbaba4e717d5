//! Mock-only: bad input that only the mock can present (a current device out
//! of range, a made-up stream handle, no device at all, an absurd device
//! count) and backend failures injected at each call. The bad input a GPU can
//! be given too (devices out of range, wrong devices, null and special
//! handles, foreign guards) is in the generic suite, `suite_bad_input.rs`.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{
    BackendOp, DeviceId, DeviceSelector, Error, EventPool, OwnedStream, StreamHandle, StreamPool,
};
use gpupool_mock::CallKind;
use gpupool_tests::mock;

#[test]
fn a_current_device_out_of_range_is_an_error_and_creates_nothing() {
    let gpu = mock(2);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
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
    // SAFETY: deliberately not a live stream: the backend refuses it when asked
    // for its device, before the pool could hold it.
    let err = unsafe { OwnedStream::adopt(&gpu, StreamHandle(0xdead)) }.unwrap_err();
    assert_eq!(err.backend_op(), Some(BackendOp::StreamDevice));
}

#[test]
fn no_device_at_all_is_an_error_and_nothing_is_built() {
    let gpu = mock(0);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
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
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
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
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
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
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let lease = pool.get(0).unwrap();
    let s = lease.get();
    gpu.fail_nth(CallKind::QueryStream, 1);
    drop(lease); // must not panic
    let parked = pool.take_error().expect("the error is parked");
    assert_eq!(parked.backend_op(), Some(BackendOp::QueryStream));
    assert!(pool.take_error().is_none());
    assert_eq!(pool.live_leases(), 0);
    // The stream is quarantined: not leased again, but not lost either.
    assert_eq!(pool.total_stats().quarantined, 1);
    assert_ne!(pool.get(0).unwrap().get(), s);
    assert!(gpu.is_live_stream(s));
    assert_eq!(pool.purge().unwrap(), 2);
    assert_eq!(gpu.live_streams(), 0);
}

#[test]
fn a_stream_failing_its_query_in_a_scan_is_set_aside_and_get_still_serves() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let leases: Vec<_> = (0..3).map(|_| pool.get(0).unwrap()).collect();
    let handles: Vec<_> = leases.iter().map(|l| l.get()).collect();
    for &h in &handles {
        gpu.enqueue_work(h).unwrap();
    }
    drop(leases); // all busy
    gpu.complete_everything();
    // The scan's first query (the oldest stream) fails: that stream is
    // quarantined and the scan goes on to the next one.
    gpu.fail_nth(CallKind::QueryStream, 1);
    let got = pool.get(0).unwrap();
    assert_eq!(got.get(), handles[1]);
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
    let a = pool.get(0).unwrap();
    let b = pool.get(0).unwrap();
    let c = pool.get(0).unwrap();
    assert!(![a.get(), b.get(), c.get()].contains(&handles[0]));
    drop((a, b, c));
    assert_eq!(pool.purge().unwrap(), 4);
    assert_eq!(gpu.live_streams(), 0);
}

#[test]
fn a_failed_query_on_reset_or_put_is_returned() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let lease = pool.get(0).unwrap();
    gpu.fail_nth(CallKind::QueryStream, 1);
    assert_eq!(
        lease.reset().unwrap_err().backend_op(),
        Some(BackendOp::QueryStream)
    );
    let owned = pool.get(0).unwrap().release();
    gpu.fail_nth(CallKind::QueryStream, 1);
    let r = pool.put(owned, None).unwrap_err();
    assert_eq!(r.error.backend_op(), Some(BackendOp::QueryStream));
    pool.put(r.value, None).unwrap();
    // The stream that failed on reset was quarantined; both are destroyed.
    assert_eq!(pool.purge().unwrap(), 2);
    assert_eq!(gpu.live_streams(), 0);
}

#[test]
fn a_failed_destroy_in_purge_keeps_the_stream_for_the_next_purge() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let leases: Vec<_> = (0..3).map(|_| pool.get(0).unwrap()).collect();
    drop(leases);
    gpu.fail_nth(CallKind::DestroyStream, 2);
    let err = pool.purge().unwrap_err();
    assert_eq!(err.backend_op(), Some(BackendOp::DestroyStream));
    assert_eq!(gpu.live_streams(), 1);
    assert_eq!(pool.purge().unwrap(), 1);
    assert_eq!(gpu.live_streams(), 0);
}

#[test]
fn an_absurd_device_count_is_refused_without_allocating_a_table() {
    let gpu = mock(gpupool_core::MAX_DEVICES + 1);
    let pool = StreamPool::new(gpu.clone());
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
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let a = streams.get(0).unwrap();
    let b = streams.get(0).unwrap();
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

#[test]
fn a_stream_of_another_machine_is_refused_by_put_and_comes_back() {
    // Ownership moves freely between pools of one machine (an `OwnedStream` is
    // not tied to a pool); a stream of *another* machine is unknown to this
    // pool's backend, so the query in `put` fails and the stream comes back.
    let here = mock(1);
    let there = mock(1);
    let pool_here = StreamPool::new(here.clone());
    let pool_there = StreamPool::new(there.clone());
    let foreign = pool_there.get(0).unwrap().release();
    let r = pool_here.put(foreign, None).unwrap_err();
    assert_eq!(r.error.backend_op(), Some(BackendOp::QueryStream));
    assert_eq!(pool_here.total_stats().live_leases, 0);
    pool_there.put(r.value, None).unwrap();
    assert_eq!(pool_there.purge().unwrap(), 1);
    assert_eq!((here.live_streams(), there.live_streams()), (0, 0));
}

//! Bad input gets a typed error and leaves the pool intact (SPEC.md 0).

use gpupool_core::epoch_crate::Collector;
use gpupool_core::{
    BackendOp, DeviceId, Error, EventHandle, EventPool, OwnedEvent, OwnedStream, StreamHandle,
    StreamPool, StreamPoolConfig,
};
use gpupool_mock::CallKind;
use gpupool_tests::mock;

#[test]
fn a_device_out_of_range_is_an_error_and_the_pools_still_work() {
    let gpu = mock(2);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    for d in [2, 3, u32::MAX] {
        assert_eq!(
            streams.get(d).unwrap_err(),
            Error::DeviceOutOfRange {
                device: DeviceId(d),
                count: 2
            }
        );
        assert_eq!(
            events.get(d).unwrap_err(),
            Error::DeviceOutOfRange {
                device: DeviceId(d),
                count: 2
            }
        );
    }
    gpu.set_current_device(DeviceId(7));
    assert!(matches!(
        streams.get(gpupool_core::DeviceSelector::Current),
        Err(Error::DeviceOutOfRange {
            device: DeviceId(7),
            ..
        })
    ));
    assert_eq!(
        gpu.calls(CallKind::CreateStream) + gpu.calls(CallKind::CreateEvent),
        0
    );
    drop(streams.get(1).unwrap());
    drop(events.get(1).unwrap());
}

#[test]
fn a_stream_put_under_another_device_comes_back_and_the_pool_is_unchanged() {
    let gpu = mock(2);
    let pool = StreamPool::new(gpu.clone());
    let owned = pool.get(0).unwrap().release();
    let h = owned.handle();
    let rejected = pool.put(owned, Some(DeviceId(1))).unwrap_err();
    assert_eq!(
        rejected.error,
        Error::WrongDevice {
            given: DeviceId(1),
            actual: DeviceId(0)
        }
    );
    assert_eq!(rejected.value.handle(), h, "the caller keeps the stream");
    assert_eq!(pool.total_stats().live_leases, 0);
    // Device 1's list is still empty: its next lease is a new stream.
    assert_ne!(pool.get(1).unwrap().get(), h);
    pool.put(rejected.value, Some(DeviceId(0))).unwrap();
    assert_eq!(pool.get(0).unwrap().get(), h);
}

#[test]
fn an_event_put_under_another_device_comes_back() {
    let gpu = mock(2);
    let pool = EventPool::new(gpu.clone());
    let owned = pool.get(1).unwrap().release();
    let rejected = pool.put(owned, Some(DeviceId(0))).unwrap_err();
    assert_eq!(
        rejected.error,
        Error::WrongDevice {
            given: DeviceId(0),
            actual: DeviceId(1)
        }
    );
    pool.put(rejected.value, None).unwrap();
}

#[test]
fn an_adopted_handle_with_an_out_of_range_device_is_refused_at_put() {
    let gpu = mock(1);
    let pool = EventPool::new(gpu.clone());
    // SAFETY: deliberately breaks the contract (no such device): the pool must
    // refuse the event by its device before any backend call uses the handle.
    let fake = unsafe { OwnedEvent::from_raw_parts(EventHandle(0x55), DeviceId(9)) }.unwrap();
    let r = pool.put(fake, None).unwrap_err();
    assert!(matches!(
        r.error,
        Error::DeviceOutOfRange {
            device: DeviceId(9),
            count: 1
        }
    ));
    let _ = r.value.into_raw();
}

#[test]
fn null_handles_are_refused() {
    let gpu = mock(1);
    // SAFETY: the handles are refused before anything uses them, which is
    // what is tested.
    unsafe {
        assert_eq!(
            OwnedStream::from_raw_parts(StreamHandle::NULL, DeviceId(0)),
            Err(Error::NullHandle)
        );
        assert_eq!(
            OwnedEvent::from_raw_parts(EventHandle::NULL, DeviceId(0)),
            Err(Error::NullHandle)
        );
        assert_eq!(
            OwnedStream::adopt(&gpu, StreamHandle::NULL).unwrap_err(),
            Error::NullHandle
        );
        for special in [StreamHandle::LEGACY, StreamHandle::PER_THREAD] {
            assert_eq!(
                OwnedStream::from_raw_parts(special, DeviceId(0)),
                Err(Error::SpecialHandle)
            );
            assert_eq!(
                OwnedStream::adopt(&gpu, special).unwrap_err(),
                Error::SpecialHandle
            );
        }
    }
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    assert_eq!(
        gpupool_core::AccessOrder::host().wait_event(EventHandle::NULL, DeviceId(0), &gpu),
        Err(Error::NullHandle)
    );
    drop((streams, events));
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
fn a_guard_of_another_collector_is_refused() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let other = Collector::new();
    let handle = other.register();
    let guard = handle.pin();
    assert_eq!(pool.get_in(0, &guard).unwrap_err(), Error::ForeignGuard);
    assert_eq!(pool.purge_in(&guard).unwrap_err(), Error::ForeignGuard);
    // The pool's own collector works, as a no_std runtime would use it.
    let own = StreamPool::with_collector(gpu.clone(), StreamPoolConfig::default(), other.clone());
    let lease = own.get_in(0, &guard).unwrap();
    drop(lease);
    assert_eq!(own.purge_in(&guard).unwrap(), 1);
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

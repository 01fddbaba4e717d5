//! Generic suite: bad input gets a typed error and leaves the pools intact
//! (SPEC.md 0), on the machine of this build — the mock by default, a GPU
//! with `--features cuda`. Every case here is refused before the backend
//! could see the bad value; backend failures themselves are injected on the
//! mock only (`faults.rs`, `bad_input.rs`).

use gpupool_core::epoch_crate::Collector;
use gpupool_core::{
    AccessOrder, DeviceId, Error, EventHandle, EventPool, OwnedEvent, OwnedStream, StreamHandle,
    StreamPool, StreamPoolConfig,
};
use gpupool_tests::{gpu, TestGpu};

#[test]
fn a_device_out_of_range_is_an_error_and_the_pools_still_work() {
    let Some(gpu) = gpu(1) else { return };
    let count = gpu.device_count();
    let streams = StreamPool::new(gpu.backend());
    let events = EventPool::new(gpu.backend());
    for d in [count, count + 1, u32::MAX] {
        let out_of_range = Error::DeviceOutOfRange {
            device: DeviceId(d),
            count,
        };
        assert_eq!(streams.get(d).unwrap_err(), out_of_range);
        assert_eq!(events.get(d).unwrap_err(), out_of_range);
        assert_eq!(streams.stats(DeviceId(d)), None);
    }
    assert_eq!(
        streams.total_stats().created + events.total_stats().created,
        0
    );
    drop(streams.get(count - 1).unwrap());
    drop(events.get(count - 1).unwrap());
    assert_eq!(streams.live_leases() + events.live_leases(), 0);
}

#[test]
fn a_stream_put_under_another_device_comes_back_and_the_pool_is_unchanged() {
    let Some(gpu) = gpu(2) else { return };
    let (d0, d1) = (DeviceId(0), DeviceId(1));
    let pool = StreamPool::new(gpu.backend());
    let owned = pool.get(d0).unwrap().release();
    let h = owned.handle();
    let rejected = pool.put(owned, Some(d1)).unwrap_err();
    let wrong = Error::WrongDevice {
        given: d1,
        actual: d0,
    };
    assert_eq!(rejected.error, wrong);
    assert_eq!(rejected.value.handle(), h, "the caller keeps the stream");
    assert_eq!(pool.live_leases(), 0);
    // Device 1's list is still empty: its next lease is a new stream.
    assert_ne!(pool.get(d1).unwrap().get(), h);
    pool.put(rejected.value, Some(d0)).unwrap();
    assert_eq!(pool.get(d0).unwrap().get(), h);
}

#[test]
fn an_event_put_under_another_device_comes_back() {
    let Some(gpu) = gpu(2) else { return };
    let (d0, d1) = (DeviceId(0), DeviceId(1));
    let pool = EventPool::new(gpu.backend());
    let owned = pool.get(d1).unwrap().release();
    let h = owned.handle();
    let rejected = pool.put(owned, Some(d0)).unwrap_err();
    let wrong = Error::WrongDevice {
        given: d0,
        actual: d1,
    };
    assert_eq!(rejected.error, wrong);
    pool.put(rejected.value, None).unwrap();
    assert_eq!(pool.get(d1).unwrap().get(), h);
    assert_eq!(pool.stats(d0).unwrap().created, 0);
}

#[test]
fn an_adopted_handle_of_a_device_out_of_range_is_refused_at_put() {
    let Some(gpu) = gpu(1) else { return };
    let count = gpu.device_count();
    let events = EventPool::new(gpu.backend());
    let streams = StreamPool::new(gpu.backend());
    let beyond = DeviceId(count + 8);
    let out_of_range = Error::DeviceOutOfRange {
        device: beyond,
        count,
    };
    // SAFETY: deliberately breaks the contract (no such device): the pools
    // must refuse the handles by their device before any backend call uses
    // them, which is what is tested.
    let (fake_event, fake_stream) = unsafe {
        (
            OwnedEvent::from_raw_parts(EventHandle(0x55), beyond).unwrap(),
            OwnedStream::from_raw_parts(StreamHandle(0x5500), beyond).unwrap(),
        )
    };
    let r = events.put(fake_event, None).unwrap_err();
    assert_eq!(r.error, out_of_range);
    let _ = r.value.into_raw();
    let r = streams.put(fake_stream, None).unwrap_err();
    assert_eq!(r.error, out_of_range);
    let _ = r.value.into_raw();
    assert_eq!(streams.live_leases() + events.live_leases(), 0);
}

#[test]
fn null_and_special_handles_are_refused() {
    let Some(gpu) = gpu(1) else { return };
    let backend = gpu.backend();
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
            OwnedStream::adopt(&backend, StreamHandle::NULL).unwrap_err(),
            Error::NullHandle
        );
        for special in [StreamHandle::LEGACY, StreamHandle::PER_THREAD] {
            assert_eq!(
                OwnedStream::from_raw_parts(special, DeviceId(0)),
                Err(Error::SpecialHandle)
            );
            assert_eq!(
                OwnedStream::adopt(&backend, special).unwrap_err(),
                Error::SpecialHandle
            );
        }
    }
    for order in [
        AccessOrder::host(),
        AccessOrder::stream(StreamHandle::NULL, DeviceId(0)),
    ] {
        assert_eq!(
            order.wait_event(EventHandle::NULL, DeviceId(0), &backend),
            Err(Error::NullHandle)
        );
    }
}

#[test]
fn a_guard_of_another_collector_is_refused() {
    let Some(gpu) = gpu(1) else { return };
    let pool = StreamPool::new(gpu.backend());
    let events = EventPool::new(gpu.backend());
    let other = Collector::new();
    let handle = other.register();
    let guard = handle.pin();
    assert_eq!(pool.get_in(0, &guard).unwrap_err(), Error::ForeignGuard);
    assert_eq!(pool.purge_in(&guard).unwrap_err(), Error::ForeignGuard);
    assert_eq!(events.get_in(0, &guard).unwrap_err(), Error::ForeignGuard);
    assert_eq!(events.purge_in(&guard).unwrap_err(), Error::ForeignGuard);
    assert_eq!(pool.device_count(), None, "nothing reached the backend");
    // The pool's own collector works, as a no_std runtime would use it.
    let own = StreamPool::with_collector(gpu.backend(), StreamPoolConfig::default(), other.clone());
    let lease = own.get_in(0, &guard).unwrap();
    drop(lease);
    assert_eq!(own.purge_in(&guard).unwrap(), 1);
}

//! Generic suite: bad input gets a typed error and leaves the pools intact
//! (where DALI has undefined behaviour), on the machine of this build — the
//! mock by default, a GPU with `--features cuda`. Every case here is refused
//! before the backend could see the bad value; backend failures themselves
//! are injected on the mock only (`mock/faults.rs`, `mock/bad_input.rs`).

use gpupool_core::epoch_crate::Collector;
use gpupool_core::{
    AccessOrder, Backend, DeviceId, Error, EventHandle, EventPool, OwnedEvent, OwnedStream,
    Scratchpad, ScratchpadConfig, StreamHandle, StreamPool, StreamPoolConfig,
};
use gpupool_tests::any_pool::AnyPool;
use gpupool_tests::{assert_calls, gpu, with_pools, with_stream_pool, GpuBackend, TestGpu};

const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);

#[test]
fn a_device_out_of_range_is_an_error_and_the_pools_still_work() {
    with_pools(1, |gpu, streams, events| {
        let count = gpu.device_count();
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
    });
}

/// A handle leased on `from` and put under `to` comes back in the error and
/// the pool is unchanged: `to`'s list is still empty (its next lease is a new
/// handle), and the handle is taken back by a `put` naming `home`.
fn a_handle_put_under_another_device_comes_back<P: AnyPool<GpuBackend>>(
    (from, to): (DeviceId, DeviceId),
    home: Option<DeviceId>,
) {
    let Some(gpu) = gpu(2) else { return };
    let pool = P::over(gpu.backend());
    let owned = pool.detached(from);
    let h = P::handle(&owned);
    let rejected = pool.put(owned, Some(to)).unwrap_err();
    assert_eq!(
        rejected.error,
        Error::WrongDevice {
            given: to,
            actual: from
        }
    );
    assert_eq!(
        P::handle(&rejected.value),
        h,
        "the caller keeps the {}",
        P::WHAT
    );
    assert_eq!(pool.total_stats().live_leases, 0);
    pool.put(rejected.value, home).unwrap();
    assert_eq!(pool.lease_handle(from), h);
    assert_eq!(pool.stats(to).unwrap().created, 0);
    assert_ne!(pool.lease_handle(to), h);
}

#[test]
fn a_stream_put_under_another_device_comes_back_and_the_pool_is_unchanged() {
    a_handle_put_under_another_device_comes_back::<StreamPool<_>>((D0, D1), Some(D0));
}

#[test]
fn an_event_put_under_another_device_comes_back() {
    a_handle_put_under_another_device_comes_back::<EventPool<_>>((D1, D0), None);
}

#[test]
fn an_adopted_handle_of_a_device_out_of_range_is_refused_at_put() {
    with_pools(1, |gpu, streams, events| {
        let count = gpu.device_count();
        let beyond = DeviceId(count + 8);
        let out_of_range = Error::DeviceOutOfRange {
            device: beyond,
            count,
        };
        let backend = gpu.backend();
        // SAFETY: deliberately breaks the contract (made-up handles, no such
        // device): the pools must refuse the handles by their device before any
        // backend call uses them, which is what is tested; the handles are never
        // passed to the backend (into_raw below).
        let (fake_event, fake_stream) = unsafe {
            (
                OwnedEvent::from_raw_parts(&backend, EventHandle::from_raw(0x55), beyond).unwrap(),
                OwnedStream::from_raw_parts(&backend, StreamHandle::from_raw(0x5500), beyond)
                    .unwrap(),
            )
        };
        let r = events.put(fake_event, None).unwrap_err();
        assert_eq!(r.error, out_of_range);
        let _ = r.value.into_raw();
        let r = streams.put(fake_stream, None).unwrap_err();
        assert_eq!(r.error, out_of_range);
        let _ = r.value.into_raw();
        assert_eq!(streams.live_leases() + events.live_leases(), 0);
    });
}

#[test]
fn null_and_special_handles_are_refused() {
    let Some(gpu) = gpu(1) else { return };
    let backend = gpu.backend();
    // SAFETY: the handles are refused before anything uses them, which is
    // what is tested.
    unsafe {
        assert_eq!(
            OwnedStream::from_raw_parts(&backend, StreamHandle::NULL, DeviceId(0)),
            Err(Error::NullHandle)
        );
        assert_eq!(
            OwnedEvent::from_raw_parts(&backend, EventHandle::NULL, DeviceId(0)),
            Err(Error::NullHandle)
        );
        assert_eq!(
            OwnedStream::adopt(&backend, StreamHandle::NULL).unwrap_err(),
            Error::NullHandle
        );
        for special in [StreamHandle::LEGACY, StreamHandle::PER_THREAD] {
            assert_eq!(
                OwnedStream::from_raw_parts(&backend, special, DeviceId(0)),
                Err(Error::SpecialHandle)
            );
            assert_eq!(
                OwnedStream::adopt(&backend, special).unwrap_err(),
                Error::SpecialHandle
            );
        }
    }
    // (`AccessOrder::wait_event` takes a leased event, so a null or made-up
    // event cannot reach it at all.)
}

#[test]
fn a_guard_of_another_collector_is_refused() {
    with_pools(1, |gpu, pool, events| {
        let other = Collector::new();
        let handle = other.register();
        let guard = handle.pin();
        assert_eq!(pool.get_in(0, &guard).unwrap_err(), Error::ForeignGuard);
        assert_eq!(pool.purge_in(&guard).unwrap_err(), Error::ForeignGuard);
        assert_eq!(events.get_in(0, &guard).unwrap_err(), Error::ForeignGuard);
        assert_eq!(events.purge_in(&guard).unwrap_err(), Error::ForeignGuard);
        assert_eq!(pool.device_count(), None, "nothing reached the backend");
        // The pool's own collector works, as a no_std runtime would use it.
        let own =
            StreamPool::with_collector(gpu.backend(), StreamPoolConfig::default(), other.clone());
        let lease = own.get_in(0, &guard).unwrap();
        drop(lease);
        assert_eq!(own.purge_in(&guard).unwrap(), 1);
    });
}

/// Asserts that `e` is `Error::WrongDevice` naming `given` and `actual`.
#[track_caller]
fn assert_wrong_device<E: PartialEq + std::fmt::Debug>(
    e: Error<E>,
    given: DeviceId,
    actual: DeviceId,
) {
    assert_eq!(e, Error::WrongDevice { given, actual });
}

#[test]
fn a_scratchpad_whose_orders_are_on_another_device_is_refused() {
    // A scratchpad allocates and frees every block under one device: an
    // order on another device than the configured one, or than the device
    // order, is refused before anything is allocated.
    with_stream_pool(2, |gpu, streams| {
        let backend = gpu.backend();
        let (d0, d1) = (DeviceId(0), DeviceId(1));
        let lease = streams.get(d0).unwrap();
        let calls = gpu.backend_calls();
        let on_device_1 = ScratchpadConfig {
            device: Some(d1),
            ..ScratchpadConfig::default()
        };
        let e = Scratchpad::with_config(&backend, lease.order(), on_device_1).unwrap_err();
        assert_wrong_device(e, d1, d0);
        assert_calls(&gpu, calls, 0, "refused before any backend call");
        // A release order on another device than the device order (a
        // special stream's device is checked to exist first: one call).
        let pinned_on_1 = ScratchpadConfig {
            pinned_release: Some(AccessOrder::null_stream(d1)),
            ..ScratchpadConfig::default()
        };
        let e = Scratchpad::with_config(&backend, lease.order(), pinned_on_1).unwrap_err();
        assert_wrong_device(e, d0, d1);
        // The same orders on one device are accepted.
        let on_device_0 = ScratchpadConfig {
            device: Some(d0),
            pinned_release: Some(AccessOrder::null_stream(d0)),
            ..ScratchpadConfig::default()
        };
        let scratch = Scratchpad::with_config(&backend, lease.order(), on_device_0).unwrap();
        assert_eq!(scratch.device_id().unwrap(), d0);
    });
}

#[test]
fn a_special_stream_of_a_device_that_does_not_exist_is_refused_everywhere() {
    // `null_stream`, `legacy_stream` and `per_thread_stream` name a device
    // the caller chose: every call that would hand the stream to the
    // backend first checks that the device exists (the backend's contracts
    // need one that does), and nothing else is called.
    with_pools(1, |gpu, streams, events| {
        let backend = gpu.backend();
        let count = Backend::device_count(&backend).unwrap();
        let missing = DeviceId(count);
        let lease = streams.get(0).unwrap();
        for order in [
            AccessOrder::null_stream(missing),
            AccessOrder::legacy_stream(missing),
            AccessOrder::per_thread_stream(missing),
        ] {
            let out_of_range = Error::DeviceOutOfRange {
                device: missing,
                count,
            };
            assert_eq!(
                Scratchpad::new(&backend, order).map(drop).unwrap_err(),
                out_of_range
            );
            assert_eq!(
                lease.order().wait(&order, &events),
                Err(out_of_range.clone())
            );
            assert_eq!(
                order.wait(&lease.order(), &events),
                Err(out_of_range.clone())
            );
            assert_eq!(
                AccessOrder::host().wait(&order, &events),
                Err(out_of_range.clone())
            );
            let event = events.get(0).unwrap();
            assert_eq!(order.wait_event(&event), Err(out_of_range.clone()));
            assert_eq!(event.record(&order), Err(out_of_range));
            drop(event);
        }
        // Everything still works.
        lease
            .order()
            .wait(&AccessOrder::null_stream(DeviceId(0)), &events)
            .unwrap();
        assert!(streams.take_error().is_none() && events.take_error().is_none());
    });
}

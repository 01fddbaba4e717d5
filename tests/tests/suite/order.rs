//! Generic suite: `AccessOrder` and `wait` (DALI's `AccessOrder`) on the machine of this
//! build — the mock by default, a GPU with `--features cuda`.
//!
//! Ordering is observed, not assumed: a producer stream gets held work, the
//! consumer is ordered after it and given free work, and the consumer must
//! stay pending until the producer's work is let go (on the mock, its work
//! cannot complete; on a GPU, a gate kernel holds the producer and the
//! consumer's kernel has not run after `cuda::PATIENCE`).

use std::time::Duration;

use gpupool_core::{AccessOrder, Backend, Completion, DeviceId, EventBackend, StreamBackend};
use gpupool_tests::{assert_calls, assert_ordered, assert_pools_clean, with_pools, TestGpu};

const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);

#[test]
fn waiting_on_itself_or_on_the_host_does_nothing() {
    with_pools(1, |gpu, streams, events| {
        let s = streams.get(0).unwrap();
        let calls = gpu.backend_calls();
        s.order().wait(&s.order(), &events).unwrap();
        s.order().wait(&AccessOrder::host(), &events).unwrap();
        AccessOrder::host()
            .wait(&AccessOrder::host(), &events)
            .unwrap();
        assert_calls(&gpu, calls, 0, "waits with nothing to wait for");
        assert_eq!(events.device_count(), None, "no event was needed");
    });
}

#[test]
fn the_host_waiting_on_a_stream_synchronizes_it() {
    with_pools(1, |gpu, streams, events| {
        let s = streams.get(0).unwrap();
        // SAFETY: the lease `s` holds this live stream of device 0.
        unsafe { gpu.submit(s.handle(), D0) };
        let calls = gpu.backend_calls();
        AccessOrder::host().wait(&s.order(), &events).unwrap();
        assert_calls(
            &gpu,
            calls,
            2,
            "whether it is capturing (it may be: the host cannot wait for a capture), then one synchronize",
        );
        // SAFETY: the lease holds this live stream of device 0.
        let done = unsafe { gpu.backend().query_stream(s.handle(), D0) }.unwrap();
        assert_eq!(done, Completion::Complete);
        assert_eq!(events.device_count(), None, "no event was needed");
    });
}

#[test]
fn the_host_waiting_on_a_stream_waits_for_what_the_stream_waits_for() {
    with_pools(1, |gpu, streams, events| {
        let backend = gpu.backend();
        let producer = streams.get(0).unwrap();
        let consumer = streams.get(0).unwrap();
        // SAFETY: the lease `producer` holds this live stream of device 0.
        unsafe { gpu.make_busy(producer.handle(), D0) };
        consumer.order().wait(&producer.order(), &events).unwrap();
        // SAFETY: the lease `consumer` holds this live stream of device 0.
        unsafe { gpu.submit(consumer.handle(), D0) };
        let (order, c) = (consumer.order(), consumer.handle());
        std::thread::scope(|scope| {
            // On a GPU the waiter blocks until the producer is let go below; the
            // mock's synchronize completes what the stream depends on at once.
            let waiter = scope.spawn(|| {
                AccessOrder::host().wait(&order, &events).unwrap();
                // SAFETY: `consumer` holds this live stream of device 0 until
                // after the scope.
                unsafe { backend.query_stream(c, D0) }.unwrap()
            });
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: the lease `producer` holds this live stream of device 0.
            unsafe { gpu.finish(producer.handle(), D0) };
            let seen = waiter.join().unwrap();
            assert_eq!(seen, Completion::Complete, "the host wait returned early");
        });
    });
}

#[test]
fn a_stream_waiting_on_another_is_ordered_after_it_through_a_pooled_event() {
    with_pools(1, |gpu, streams, events| {
        let producer = streams.get(0).unwrap();
        let consumer = streams.get(0).unwrap();
        let link = || {
            let calls = gpu.backend_calls();
            consumer.order().wait(&producer.order(), &events).unwrap();
            assert_calls(&gpu, calls, 4, "count devices, create, record, wait");
        };
        let (p, c) = ((producer.handle(), D0), (consumer.handle(), D0));
        // SAFETY: the leases `producer` and `consumer` hold these live streams of
        // device 0 until the end of the test; `link` only waits.
        unsafe { assert_ordered(&gpu, p, c, link, "wait") };
        // The event went back to its pool, and the next wait reuses it.
        assert_eq!(events.live_leases(), 0);
        assert_eq!(events.total_stats().created, 1);
        let calls = gpu.backend_calls();
        consumer.order().wait(&producer.order(), &events).unwrap();
        assert_calls(&gpu, calls, 2, "record, wait");
        assert_eq!(events.total_stats().reused, 1);
        assert!(events.take_error().is_none());
    });
}

#[test]
fn wait_is_transitive() {
    with_pools(1, |gpu, streams, events| {
        let [a, b, c] = [(); 3].map(|_| streams.get(0).unwrap());
        let link = || {
            b.order().wait(&a.order(), &events).unwrap();
            c.order().wait(&b.order(), &events).unwrap();
        };
        // SAFETY: the leases `a` and `c` hold these live streams of device 0
        // until the end of the test; `link` only waits.
        unsafe {
            assert_ordered(
                &gpu,
                (a.handle(), D0),
                (c.handle(), D0),
                link,
                "a -> b -> c",
            )
        };
        // SAFETY: the lease `b` holds this live stream of device 0.
        assert!(!unsafe { gpu.is_held(b.handle(), D0) });
    });
}

#[test]
fn waits_across_devices_record_an_event_of_the_awaited_device() {
    with_pools(2, |gpu, streams, events| {
        for (from, to) in [(D1, D0), (D0, D1)] {
            let producer = streams.get(from).unwrap();
            let consumer = streams.get(to).unwrap();
            let link = || consumer.order().wait(&producer.order(), &events).unwrap();
            let (p, c) = ((producer.handle(), from), (consumer.handle(), to));
            // SAFETY: the leases `producer` and `consumer` hold these live
            // streams of `from` and `to` until the end of the iteration; `link`
            // only waits.
            unsafe { assert_ordered(&gpu, p, c, link, &format!("{to} after {from}")) };
            assert_eq!(events.stats(from).unwrap().created, 1, "{from}'s event");
        }
        assert_pools_clean(&gpu, &streams, &events);
    });
}

#[test]
fn waits_through_the_default_streams_of_a_device_that_is_not_current() {
    with_pools(2, |gpu, streams, events| {
        let backend = gpu.backend();
        gpu.set_current_device(D0);
        for default1 in [
            AccessOrder::null_stream(D1),
            AccessOrder::legacy_stream(D1),
            AccessOrder::per_thread_stream(D1),
        ] {
            // Device 1's default stream, seen from a thread whose device is 0
            // (DALI #3957), in the middle of a chain: producer (device 1) ->
            // default stream of device 1 -> consumer (device 0).
            let special = default1.stream_handle().unwrap();
            let producer = streams.get(D1).unwrap();
            let consumer = streams.get(D0).unwrap();
            let link = || {
                default1.wait(&producer.order(), &events).unwrap();
                consumer.order().wait(&default1, &events).unwrap();
            };
            let (p, c) = ((producer.handle(), D1), (consumer.handle(), D0));
            // SAFETY: the leases `producer` and `consumer` hold these live
            // streams of devices 1 and 0 until the end of the iteration; `link`
            // only waits.
            unsafe { assert_ordered(&gpu, p, c, link, &format!("{special:?}")) };
            AccessOrder::host().wait(&default1, &events).unwrap();
            assert_eq!(backend.current_device().unwrap(), D0, "device changed");
        }
        assert_pools_clean(&gpu, &streams, &events);
    });
}

#[test]
fn wait_event_from_a_stream_and_from_the_host() {
    with_pools(1, |gpu, streams, events| {
        let backend = gpu.backend();
        let [s, t] = [(); 2].map(|_| streams.get(0).unwrap());
        let e = events.get(0).unwrap();
        let link = || {
            // SAFETY: the leases hold this live event and stream, both on
            // device 0.
            unsafe { backend.record_event(e.handle(), s.handle(), D0) }.unwrap();
            t.order().wait_event(&e).unwrap();
        };
        // SAFETY: the leases `s` and `t` hold these live streams of device 0
        // until the end of the test; `link` records and waits.
        unsafe { assert_ordered(&gpu, (s.handle(), D0), (t.handle(), D0), link, "wait_event") };
        AccessOrder::host().wait_event(&e).unwrap();
        // SAFETY: the lease holds this live event of device 0.
        let done = unsafe { backend.query_event(e.handle(), D0) }.unwrap();
        assert_eq!(done, Completion::Complete);
    });
}

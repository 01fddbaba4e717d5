//! Generic suite: `Completed` futures (`AccessOrder::completed`,
//! `EventLease::completed`) on the machine of this build — the mock by
//! default, a GPU with `--features cuda`: they stay pending while the work is
//! held, resolve and wake their task once it ran, and give every event back.

use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

use gpupool_core::{AccessOrder, Completed, DeviceId};
use gpupool_tests::wake::{block_on, counting_waker as counter, poll, LONG};
use gpupool_tests::{assert_no_misuse, with_pools, TestGpu};

const D0: DeviceId = DeviceId(0);

#[test]
fn a_future_waits_for_held_work_then_wakes_its_task() {
    with_pools(1, |gpu, streams, events| {
        let lease = streams.get(0).unwrap();
        // SAFETY: the lease holds this live stream of device 0.
        unsafe { gpu.make_busy(lease.handle(), D0) };
        let mut done = lease.order().completed(&events).unwrap();
        let (c, waker) = counter();
        assert!(poll(&mut done, &waker).is_pending());
        std::thread::sleep(Duration::from_millis(50));
        assert!(poll(&mut done, &waker).is_pending(), "resolved while held");
        assert_eq!(c.wakes(), 0);
        // SAFETY: as above.
        unsafe { gpu.finish(lease.handle(), D0) };
        let start = Instant::now();
        while c.wakes() == 0 {
            assert!(start.elapsed() < LONG, "never woken");
            std::thread::park_timeout(Duration::from_millis(10));
        }
        assert!(matches!(poll(&mut done, &waker), Poll::Ready(Ok(()))));
        assert_eq!(events.live_leases(), 0);
        assert_no_misuse(&gpu);
    });
}

#[test]
fn host_order_and_a_recorded_lease() {
    with_pools(1, |gpu, streams, events| {
        assert!(block_on(AccessOrder::host().completed(&events).unwrap()).is_ok());
        let lease = streams.get(0).unwrap();
        // SAFETY: the lease holds this live stream of device 0.
        unsafe { gpu.submit(lease.handle(), D0) };
        let e = events.get(0).unwrap();
        e.record(&lease.order()).unwrap();
        // The mock runs free work only when a test asks.
        // SAFETY: as above.
        unsafe { gpu.finish(lease.handle(), D0) };
        assert!(block_on(e.completed().unwrap()).is_ok());
        assert_eq!(events.live_leases(), 0);
        assert_no_misuse(&gpu);
    });
}

#[test]
fn four_threads_of_futures_some_dropped_early() {
    const EACH: usize = if cfg!(miri) { 10 } else { 250 };
    with_pools(1, |gpu, streams, events| {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            // The mock runs free work only when a test asks: a thread asks
            // now and then (on a GPU it synchronizes now and then).
            let (driver, stop) = (gpu.clone(), &stop);
            s.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    driver.quiesce();
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let (gpu, streams, events) = (gpu.clone(), &streams, &events);
                    s.spawn(move || {
                        let mut pending: Vec<Completed<'_, _>> = Vec::new();
                        for i in 0..EACH {
                            let lease = streams.get(0).unwrap();
                            // SAFETY: the lease holds this live stream of device 0.
                            unsafe { gpu.submit(lease.handle(), D0) };
                            let f = lease.order().completed(events).unwrap();
                            if i % 7 == 0 {
                                drop(f);
                            } else {
                                pending.push(f);
                            }
                        }
                        for f in pending {
                            assert!(block_on(f).is_ok());
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            stop.store(true, Ordering::SeqCst);
        });
        gpu.quiesce();
        assert_eq!(events.live_leases(), 0);
        let created = events.total_stats().created;
        assert!(created >= 1);
        drop(events);
        if let Some(live) = gpu.live_events() {
            assert_eq!(live, 0, "an event of a dropped future was lost");
        }
        assert_no_misuse(&gpu);
    });
}

#[test]
fn a_pool_dropped_with_held_work_under_a_dropped_future_does_not_wait() {
    with_pools(1, |gpu, streams, events| {
        let lease = streams.get(0).unwrap();
        // SAFETY: the lease holds this live stream of device 0.
        unsafe { gpu.make_busy(lease.handle(), D0) };
        drop(lease.order().completed(&events).unwrap());
        let t = Instant::now();
        drop(events); // the engine stops; the pending event is destroyed
        assert!(t.elapsed() < LONG);
        // SAFETY: as above.
        unsafe { gpu.finish(lease.handle(), D0) };
        assert_no_misuse(&gpu);
    });
}

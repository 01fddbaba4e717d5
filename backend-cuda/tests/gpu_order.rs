//! Ordering on real GPUs (needs a GPU: every test is ignored by default; run
//! with `--include-ignored` on the GPU machine): `AccessOrder::wait` between
//! pooled streams, with a kernel whose result is wrong if the order is not
//! kept; events with timing disabled; the default streams (0, 1, 2) of a
//! device that is not current (DALI #3957); several devices (skipped with
//! fewer than two).

mod common;

use std::time::Duration;

use common::{
    gpu_and_pools, gpu_and_streams, has_devices, make_current, pools, wait_gate, Kernels,
    GATE_TIMEOUT,
};
use gpupool_core::{
    AccessOrder, Backend, Completion, DeviceId, EventBackend, EventFlags, EventLease, EventPool,
    StreamBackend, StreamLease, StreamPool,
};
use gpupool_cuda::cudarc::driver::{result, sys, DriverError};
use gpupool_cuda::testing::{spin, Gate};
use gpupool_cuda::{cudarc_stream, CudaBackend};

const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);

/// Elements in the test vectors.
const N: usize = 1 << 20;

/// Sleeps 20 ms, then checks that the stream `lease` holds (of `device`)
/// still has work pending: `what` (the assertion's message) waits for work
/// held behind a gate.
fn pending_after_20_ms(
    gpu: &CudaBackend,
    lease: &StreamLease<'_, CudaBackend>,
    device: DeviceId,
    what: &str,
) {
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        // SAFETY: the lease holds this live stream of `device`.
        unsafe { gpu.query_stream(lease.handle(), device) }.unwrap(),
        Completion::Pending,
        "{what}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wait_orders_a_kernel_after_a_kernel_on_another_pooled_stream() {
    let (gpu, streams, events) = gpu_and_pools();
    let kernels = Kernels::load(D0);
    let producer = streams.get(0).unwrap();
    let consumer = streams.get(0).unwrap();
    let y_host = {
        // SAFETY: the cudarc streams and every slice made on them are dropped
        // at the end of this block, before the leases.
        let (p, c) = unsafe {
            (
                cudarc_stream(&producer).unwrap(),
                cudarc_stream(&consumer).unwrap(),
            )
        };
        let mut x = p.alloc_zeros::<u32>(N).unwrap();
        let mut y = c.alloc_zeros::<u32>(N).unwrap();
        p.synchronize().unwrap();
        c.synchronize().unwrap();

        // The producer is held behind a gate, then fills x = i + 1.
        let gate = Gate::hold(producer.order(), GATE_TIMEOUT).unwrap();
        kernels.fill(&p, &mut x);
        // The consumer computes y = 2x + 1 after the producer's work so far.
        // Unordered, it would read the zeros and write 1 everywhere.
        consumer.order().wait(&producer.order(), &events).unwrap();
        kernels.twice_plus_one(&c, &mut y, &x);
        pending_after_20_ms(
            &gpu,
            &consumer,
            D0,
            "the consumer waits for the gated producer",
        );
        gate.open();
        let y_host = c.clone_dtoh(&y).unwrap();
        c.synchronize().unwrap();
        wait_gate(&gate);
        p.synchronize().unwrap();
        y_host
    };
    let wrong = y_host
        .iter()
        .enumerate()
        .filter(|&(i, &y)| y != 2 * (i as u32 + 1) + 1)
        .count();
    assert_eq!(
        wrong, 0,
        "{wrong} of {N} elements computed before x was filled"
    );
    assert_eq!(events.live_leases(), 0, "the wait returned its event");
    assert!(streams.take_error().is_none() && events.take_error().is_none());
}

/// `cuEventElapsedTime` between two leased events (recorded and completed,
/// of one device).
fn elapsed(
    a: &EventLease<'_, CudaBackend>,
    b: &EventLease<'_, CudaBackend>,
) -> Result<f32, DriverError> {
    let (a, b) = (a.handle().as_raw(), b.handle().as_raw());
    // SAFETY: two live events (held by the leases) of one device; the driver
    // reports an event not recorded or not complete as an error.
    unsafe { result::event::elapsed(a as sys::CUevent, b as sys::CUevent) }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pooled_events_have_timing_disabled_unless_asked() {
    let (gpu, streams) = gpu_and_streams();
    let s = streams.get(0).unwrap();

    let events = EventPool::new(gpu);
    assert_eq!(events.flags(), EventFlags::DISABLE_TIMING);
    let (a, b) = (events.get(0).unwrap(), events.get(0).unwrap());
    let gate = Gate::hold(s.order(), GATE_TIMEOUT).unwrap();
    // SAFETY: (every backend call of this test) the leases `s`, `a` and `b`
    // hold these live streams and events, all of device 0.
    unsafe {
        gpu.record_event(a.handle(), s.handle(), D0).unwrap();
        gpu.record_event(b.handle(), s.handle(), D0).unwrap();
        assert_eq!(
            gpu.query_event(a.handle(), D0).unwrap(),
            Completion::Pending
        );
    }
    gate.open();
    // SAFETY: as above.
    unsafe {
        gpu.synchronize_event(b.handle(), D0).unwrap();
        assert_eq!(
            gpu.query_event(a.handle(), D0).unwrap(),
            Completion::Complete
        );
    }
    assert_eq!(
        elapsed(&a, &b).map_err(|e| e.0),
        Err(sys::CUresult::CUDA_ERROR_INVALID_HANDLE),
        "no timing data on a DISABLE_TIMING event"
    );

    let timed = EventPool::with_flags(gpu, EventFlags::DEFAULT);
    let (a, b) = (timed.get(0).unwrap(), timed.get(0).unwrap());
    // SAFETY: as above.
    unsafe { gpu.record_event(a.handle(), s.handle(), D0) }.unwrap();
    spin(s.order(), Duration::from_millis(5)).unwrap();
    // SAFETY: as above.
    unsafe {
        gpu.record_event(b.handle(), s.handle(), D0).unwrap();
        gpu.synchronize_event(b.handle(), D0).unwrap();
    }
    let ms = elapsed(&a, &b).unwrap();
    assert!(ms >= 4.0, "timed events measured {ms} ms over a 5 ms spin");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_default_streams_work_from_a_thread_without_a_context() {
    let (gpu, streams, events) = gpu_and_pools();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for default in [
                AccessOrder::null_stream(D0),
                AccessOrder::legacy_stream(D0),
                AccessOrder::per_thread_stream(D0),
            ] {
                let special = default.stream_handle().unwrap();
                let gate = Gate::hold(default, GATE_TIMEOUT).unwrap();
                let lease = streams.get(0).unwrap();
                lease.order().wait(&default, &events).unwrap();
                spin(lease.order(), Duration::ZERO).unwrap();
                // SAFETY: (every backend call of this loop) `special` is a
                // special stream, usable on every device; the lease holds its
                // live stream of device 0.
                unsafe {
                    assert_eq!(gpu.query_stream(special, D0).unwrap(), Completion::Pending);
                    assert_eq!(
                        gpu.query_stream(lease.handle(), D0).unwrap(),
                        Completion::Pending
                    );
                }
                gate.open();
                AccessOrder::host().wait(&default, &events).unwrap();
                // SAFETY: as above.
                unsafe {
                    gpu.synchronize_stream(lease.handle(), D0).unwrap();
                    assert_eq!(gpu.stream_device(special).unwrap(), D0);
                }
            }
        });
    });
    assert!(streams.take_error().is_none() && events.take_error().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn leases_of_device_1_hold_streams_of_device_1() {
    if !has_devices(2, "leases_of_device_1_hold_streams_of_device_1") {
        return;
    }
    let gpu = CudaBackend::new();
    make_current(D0);
    let streams = StreamPool::new(gpu);
    let one = streams.get(1).unwrap();
    assert_eq!(one.device(), D1);
    // SAFETY: the lease `one` holds this live stream.
    assert_eq!(unsafe { gpu.stream_device(one.handle()) }.unwrap(), D1);
    assert_eq!(
        gpu.current_device().unwrap(),
        D0,
        "creating on device 1 leaves the thread's device alone"
    );
    let zero = streams.get(0).unwrap();
    // SAFETY: the lease `zero` holds this live stream.
    assert_eq!(unsafe { gpu.stream_device(zero.handle()) }.unwrap(), D0);
    assert_ne!(zero.handle(), one.handle());

    // An event of device 1, recorded on device 1's stream, from device 0.
    let events = EventPool::new(gpu);
    let e = events.get(1).unwrap();
    // SAFETY: the leases `e` and `one` hold this live event and stream, both
    // of device 1.
    unsafe {
        gpu.record_event(e.handle(), one.handle(), D1).unwrap();
        gpu.synchronize_event(e.handle(), D1).unwrap();
    }
    assert_eq!(gpu.current_device().unwrap(), D0);
    drop((one, zero, e));
    assert_eq!(streams.stats(D1).unwrap().created, 1);
    assert_eq!(streams.stats(D0).unwrap().created, 1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wait_orders_streams_of_two_devices() {
    if !has_devices(2, "wait_orders_streams_of_two_devices") {
        return;
    }
    let (gpu, streams, events) = pools();
    for (from, to) in [(D0, D1), (D1, D0)] {
        let producer = streams.get(from).unwrap();
        let consumer = streams.get(to).unwrap();
        let gate = Gate::hold(producer.order(), GATE_TIMEOUT).unwrap();
        consumer.order().wait(&producer.order(), &events).unwrap();
        spin(consumer.order(), Duration::ZERO).unwrap();
        pending_after_20_ms(&gpu, &consumer, to, &format!("{to:?} waits for {from:?}"));
        gate.open();
        // SAFETY: as above.
        unsafe { gpu.synchronize_stream(consumer.handle(), to) }.unwrap();
        assert!(gate.is_done(), "the consumer finished after the producer");
    }
    assert_eq!(events.live_leases(), 0);
    assert!(streams.take_error().is_none() && events.take_error().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wait_on_the_default_stream_of_a_device_that_is_not_current() {
    if !has_devices(
        2,
        "wait_on_the_default_stream_of_a_device_that_is_not_current",
    ) {
        return;
    }
    let (gpu, streams, events) = pools();
    make_current(D0);
    for default1 in [AccessOrder::null_stream(D1), AccessOrder::legacy_stream(D1)] {
        // Device 1's default stream, seen from a thread whose device is 0.
        let special = default1.stream_handle().unwrap();
        let gate = Gate::hold(default1, GATE_TIMEOUT).unwrap();
        let lease = streams.get(0).unwrap();
        lease.order().wait(&default1, &events).unwrap();
        spin(lease.order(), Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: (every backend call of this loop) the lease holds its live
        // stream of device 0; `special` is a special stream, usable on every
        // device.
        unsafe {
            assert_eq!(
                gpu.query_stream(lease.handle(), D0).unwrap(),
                Completion::Pending
            );
            assert_eq!(gpu.query_stream(special, D1).unwrap(), Completion::Pending);
        }
        gate.open();
        // SAFETY: as above.
        unsafe { gpu.synchronize_stream(lease.handle(), D0) }.unwrap();
        wait_gate(&gate);

        // And the other way round: device 1's default stream waits for a
        // pooled stream of device 0, then the host waits for it.
        let gate = Gate::hold(lease.order(), GATE_TIMEOUT).unwrap();
        default1.wait(&lease.order(), &events).unwrap();
        spin(default1, Duration::ZERO).unwrap();
        // SAFETY: as above.
        let state = unsafe { gpu.query_stream(special, D1) }.unwrap();
        assert_eq!(state, Completion::Pending);
        gate.open();
        AccessOrder::host().wait(&default1, &events).unwrap();
        assert!(gate.is_done());
        assert_eq!(
            gpu.current_device().unwrap(),
            D0,
            "the thread's device is still 0"
        );
    }
    assert!(streams.take_error().is_none() && events.take_error().is_none());
}

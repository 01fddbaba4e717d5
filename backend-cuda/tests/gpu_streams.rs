//! The stream and event pools over real CUDA streams (needs a GPU: every test
//! is ignored by default; run with `--include-ignored` on the GPU machine).
//!
//! Leasing, returning and reusing on device 0; a busy stream waiting in the
//! busy list until its work is done; priorities; purge and drop; a thread with
//! no current context; 16 threads leasing at once.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{device_count, gpu_and_streams, wait_gate, wait_idle, GATE_TIMEOUT};
use gpupool_core::{
    AccessOrder, Backend, Completion, DeviceId, DeviceSelector, Error, EventBackend, EventPool,
    StreamBackend, StreamHandle, StreamLease, StreamOptions, StreamPool, StreamPoolConfig,
};
use gpupool_cuda::cudarc::driver::{result, sys};
use gpupool_cuda::testing::{spin, Gate};
use gpupool_cuda::{CudaBackend, CudaError};

const D0: DeviceId = DeviceId(0);

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_returned_stream_is_reused_on_device_0() {
    let (gpu, pool) = gpu_and_streams();
    let a = pool.get(0).unwrap();
    let s = a.handle();
    assert_eq!(a.device(), D0);
    // SAFETY: the lease `a` holds this live stream of device 0.
    assert_eq!(unsafe { gpu.stream_device(s) }.unwrap(), D0);
    // SAFETY: as above.
    let state = unsafe { gpu.query_stream(s, D0) }.unwrap();
    assert_eq!(state, Completion::Complete);
    drop(a);

    let b = pool.get(0).unwrap();
    assert_eq!(b.handle(), s, "an idle stream comes back first");
    let stats = pool.stats(D0).unwrap();
    assert_eq!((stats.created, stats.reused), (1, 1));

    // Detached, put back, leased again.
    let owned = b.detach();
    pool.put(owned, None).unwrap();
    assert_eq!(pool.get(0).unwrap().handle(), s);
    assert_eq!(pool.get(DeviceSelector::Current).unwrap().device(), D0);

    let count = device_count();
    assert!(matches!(
        pool.get(count),
        Err(Error::DeviceOutOfRange { count: c, .. }) if c == count
    ));
    assert_eq!(pool.live_leases(), 0);
    assert!(pool.take_error().is_none());
}

/// Leases a stream of device 0, queues `work` on its order, checks that the
/// stream has work pending and returns the lease (the stream goes to the
/// busy list); returns the stream's handle and what `work` returned.
fn return_busy<T>(
    gpu: &CudaBackend,
    pool: &StreamPool<CudaBackend>,
    work: impl FnOnce(AccessOrder<'_>) -> T,
) -> (StreamHandle, T) {
    let a = pool.get(0).unwrap();
    let s = a.handle();
    let out = work(a.order());
    // SAFETY: the lease `a` holds this live stream of device 0.
    let state = unsafe { gpu.query_stream(s, D0) }.unwrap();
    assert_eq!(state, Completion::Pending);
    drop(a);
    (s, out)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_busy_stream_is_reused_only_after_its_work_is_done() {
    let (gpu, pool) = gpu_and_streams();
    // Pending: to the busy list.
    let (busy, gate) = return_busy(&gpu, &pool, |a| Gate::hold(a, GATE_TIMEOUT).unwrap());

    let b = pool.get(0).unwrap();
    assert_ne!(b.handle(), busy, "a pending stream is not leased");
    let c = pool.get(0).unwrap();
    assert_ne!(c.handle(), busy, "still pending: a scan does not take it");
    assert_eq!(pool.stats(D0).unwrap().created, 3);

    gate.open();
    wait_gate(&gate);
    // SAFETY: the pool keeps the stream in its busy list (nothing purges it
    // in this test), so it is a live stream of device 0 of this backend for
    // as long as the order is used (the next line).
    wait_idle(unsafe { AccessOrder::from_raw(&gpu, busy, D0) });
    let d = pool.get(0).unwrap();
    assert_eq!(d.handle(), busy, "finished now: the scan takes it");
    let stats = pool.stats(D0).unwrap();
    assert_eq!((stats.created, stats.busy_hits), (3, 1));
    drop((b, c, d));
    assert!(pool.take_error().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_spin_kernel_keeps_its_stream_busy_for_about_its_duration() {
    let (gpu, pool) = gpu_and_streams();
    // To the busy list.
    let (s, ()) = return_busy(&gpu, &pool, |a| {
        spin(a, Duration::from_millis(50)).unwrap();
    });

    let b = pool.get(0).unwrap();
    assert_ne!(b.handle(), s);
    std::thread::sleep(Duration::from_millis(150));
    let c = pool.get(0).unwrap();
    assert_eq!(c.handle(), s, "done after 50 ms: reused from the busy list");
    drop((b, c));

    // Synchronizing waits for the whole spin.
    let a = pool.get(0).unwrap();
    spin(a.order(), Duration::from_millis(50)).unwrap();
    let t0 = Instant::now();
    // SAFETY: the lease `a` holds this live stream of device 0.
    unsafe { gpu.synchronize_stream(a.handle(), D0) }.unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(40),
        "waited only {waited:?}"
    );
}

/// `cuStreamGetPriority` of a leased stream.
fn priority_of(lease: &StreamLease<'_, CudaBackend>) -> i32 {
    let mut p = 0;
    // SAFETY: a live stream, held by the lease; `p` is a valid place.
    let r = unsafe { sys::cuStreamGetPriority(lease.handle().as_raw() as sys::CUstream, &mut p) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    p
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn priorities_are_clamped_to_the_device_range() {
    device_count();
    common::make_current(D0);
    let (least, greatest) = result::stream::get_priority_range().unwrap();
    for (asked, expected) in [(-1000, greatest), (1000, least), (least, least)] {
        let config = StreamPoolConfig {
            stream: StreamOptions {
                priority: Some(asked),
            },
            ..Default::default()
        };
        let pool = StreamPool::with_config(CudaBackend::new(), config);
        let lease = pool.get(0).unwrap();
        assert_eq!(priority_of(&lease), expected, "asked for {asked}");
    }
    let pool = StreamPool::new(CudaBackend::new());
    assert_eq!(priority_of(&pool.get(0).unwrap()), 0, "default priority");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn purge_and_drop_destroy_everything_in_the_pools() {
    device_count();
    let pool = StreamPool::new(CudaBackend::new());
    let leases: Vec<_> = (0..4).map(|_| pool.get(0).unwrap()).collect();
    let gates: Vec<_> = leases[..2]
        .iter()
        .map(|l| Gate::hold(l.order(), GATE_TIMEOUT).unwrap())
        .collect();
    let kept = pool.get(0).unwrap();
    drop(leases); // two busy, two ready
    assert_eq!(pool.purge().unwrap(), 4, "busy streams are destroyed too");
    assert_eq!(pool.stats(D0).unwrap().destroyed, 4);
    for g in &gates {
        g.open(); // the kernels of destroyed streams still run to the end
    }
    drop(kept); // a lease out during the purge comes back normally
    assert_eq!(pool.stats(D0).unwrap().live_leases, 0);
    assert_eq!(pool.purge().unwrap(), 1);
    assert!(pool.take_error().is_none());
    let more: Vec<_> = (0..3).map(|_| pool.get(0).unwrap()).collect();
    drop(more);
    drop(pool); // destroys three streams; errors would have nowhere to go
    drop(gates);

    let events = EventPool::new(CudaBackend::new());
    let leases: Vec<_> = (0..8).map(|_| events.get(0).unwrap()).collect();
    drop(leases);
    assert_eq!(events.purge().unwrap(), 8);
    assert!(events.take_error().is_none());
    let e = events.get(0).unwrap();
    assert_eq!(
        // SAFETY: the lease `e` holds this live event of device 0.
        unsafe { CudaBackend::new().query_event(e.handle(), D0) }.unwrap(),
        Completion::Complete,
        "an event never recorded is complete"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_thread_without_a_current_context_can_use_the_pools() {
    device_count();
    let pool = StreamPool::new(CudaBackend::new());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            assert_eq!(result::ctx::get_current().unwrap(), None, "a fresh thread");
            let gpu = CudaBackend::new();
            assert_eq!(gpu.current_device().unwrap(), D0, "no context: device 0");
            let lease = pool.get(DeviceSelector::Current).unwrap();
            assert_eq!(lease.device(), D0);
            spin(lease.order(), Duration::from_millis(1)).unwrap();
            drop(lease);
            // The thread had no context: it keeps device 0's primary one.
            assert!(result::ctx::get_current().unwrap().is_some());
            assert_eq!(gpu.current_device().unwrap(), D0);
        });
    });
    assert!(pool.take_error().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_process_wide_pools_serve_device_0() {
    device_count();
    let (streams, events) = (gpupool_cuda::streams(), gpupool_cuda::events());
    let s = streams.get(0).unwrap();
    let e = events.get(0).unwrap();
    let gpu = CudaBackend::new();
    // SAFETY: the leases hold this live event and stream, both of device 0.
    unsafe { gpu.record_event(e.handle(), s.handle(), D0) }.unwrap();
    // SAFETY: as above.
    unsafe { gpu.synchronize_event(e.handle(), D0) }.unwrap();
    drop((s, e));
    assert_eq!(streams.live_leases(), 0);
    assert_eq!(events.live_leases(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sixteen_threads_never_share_a_stream() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 10_000;
    device_count();
    let pool = StreamPool::new(CudaBackend::new());
    let held: Mutex<HashSet<usize>> = Mutex::new(HashSet::new());
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (pool, held, failures) = (&pool, &held, failures.clone());
            scope.spawn(move || {
                for i in 0..ROUNDS {
                    let lease = match pool.get(0) {
                        Ok(l) => l,
                        Err(e) => {
                            failures.lock().unwrap().push(format!("thread {t}: {e}"));
                            return;
                        }
                    };
                    let s = lease.handle().as_raw();
                    assert!(held.lock().unwrap().insert(s), "stream {s:#x} leased twice");
                    if i % 500 == 0 {
                        // Some returns find work pending: the busy list is used too.
                        spin(lease.order(), Duration::from_micros(20)).unwrap();
                    }
                    assert!(held.lock().unwrap().remove(&s));
                    drop(lease);
                }
            });
        }
    });
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let stats = pool.stats(D0).unwrap();
    eprintln!(
        "{THREADS} threads x {ROUNDS} leases in {:?}: {} streams created, {} busy hits, {} promoted",
        t0.elapsed(),
        stats.created,
        stats.busy_hits,
        stats.promoted
    );
    assert_eq!(stats.live_leases, 0);
    assert!(stats.created <= THREADS + THREADS * ROUNDS / 500);
    assert!(pool.take_error().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn backend_errors_are_typed() {
    device_count();
    let gpu = CudaBackend::new();
    let count = gpu.device_count().unwrap();
    assert_eq!(
        gpu.create_stream(DeviceId(count), StreamOptions::default()),
        Err(CudaError::DeviceOutOfRange {
            device: DeviceId(count),
            count
        })
    );
    // With the driver loaded, a driver error describes itself.
    let e = CudaError::Driver(gpupool_cuda::cudarc::driver::DriverError(
        sys::CUresult::CUDA_ERROR_NOT_READY,
    ));
    assert!(e
        .to_string()
        .starts_with("CUDA driver call failed: CUDA_ERROR_NOT_READY (600): "));
}

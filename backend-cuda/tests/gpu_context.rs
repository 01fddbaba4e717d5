//! The calling thread's current context around the calls that switch it
//! (`CudaBackend`'s "The thread's current context"; needs a GPU: every test is
//! ignored by default; run with `--include-ignored` on the GPU machine).
//!
//! A previous primary context is current again after a `with_cudarc_stream`
//! call and alive, kept so by gpupool's retain, even when the closure drops
//! the application's last `Arc<CudaContext>` of it, and when it panics. A
//! non-primary context, which safe cudarc code can destroy at any time, is
//! never made current again; one destroyed while current is neither handed to
//! the driver nor made current again, and `current_device` reports it.
//!
//! With one GPU the previous primary context is device 0's, the one the lease
//! lives on; the tests take device 1's as well where there are two GPUs.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use common::{device_count, gpu_and_streams};
use gpupool_core::{Backend, DeviceId, StreamLease, StreamPool};
use gpupool_cuda::cudarc::driver::{result, sys, CudaContext};
use gpupool_cuda::{with_cudarc_stream, CudaBackend};

/// The calling thread's current context.
fn current() -> Option<sys::CUcontext> {
    result::ctx::get_current().expect("cuCtxGetCurrent")
}

/// Whether `device`'s primary context is active (retained by someone).
fn primary_active(device: u32) -> bool {
    let cu_device = result::device::get(device as i32).expect("cuDeviceGet");
    let (mut flags, mut active) = (0, 0);
    // SAFETY: a device handle from `cuDeviceGet`; `flags` and `active` are
    // valid places for the driver to write to.
    let r = unsafe { sys::cuDevicePrimaryCtxGetState(cu_device, &mut flags, &mut active) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuDevicePrimaryCtxGetState");
    active != 0
}

/// Runs `f` on a new thread, which starts with no current context.
fn on_a_fresh_thread(f: impl FnOnce() + Send) {
    std::thread::scope(|s| {
        s.spawn(f);
    });
}

/// The devices whose primary context the tests make the previous one: 0,
/// and 1 where there are two GPUs.
fn previous_devices() -> Vec<u32> {
    (0..device_count().min(2)).collect()
}

/// For each of [`previous_devices`], on a fresh thread: `f` with the
/// backend, a lease of device 0 from a pool of the test's, the
/// application's own handle to device `d`'s primary context (made current by
/// cudarc) and `d`; then checks that the pool parked no error.
fn on_a_fresh_thread_per_previous_device(
    f: impl Fn(CudaBackend, &StreamLease<'_, CudaBackend>, Arc<CudaContext>, u32) + Sync,
) {
    let gpu = CudaBackend::new();
    let pool = StreamPool::new(gpu);
    for d in previous_devices() {
        on_a_fresh_thread(|| {
            let lease = pool.get(0).unwrap();
            let app = CudaContext::new(d as usize).unwrap();
            f(gpu, &lease, app, d);
        });
    }
    assert!(pool.take_error().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_closure_that_drops_the_last_arc_of_the_previous_primary_context_leaves_it_current_and_alive() {
    on_a_fresh_thread_per_previous_device(|gpu, lease, app, d| {
        let prev = app.cu_ctx();
        assert_eq!(current(), Some(prev));

        let synced = with_cudarc_stream(lease, move |s| {
            // The application's last `Arc`: cudarc releases its retain.
            drop(app);
            s.synchronize()
        });
        synced
            .expect("the previous context made current again")
            .expect("synchronize");

        assert_eq!(current(), Some(prev), "device {d}: the previous context");
        assert!(primary_active(d), "device {d}: alive, gpupool retains it");
        assert_eq!(
            gpu.context(DeviceId(d)).unwrap().cu_ctx(),
            prev,
            "device {d}: the table's context is that one"
        );
        assert_eq!(gpu.current_device().unwrap(), DeviceId(d));
        // The driver takes calls in it.
        result::ctx::synchronize().expect("cuCtxSynchronize in the previous context");
        assert_eq!(current(), Some(prev));
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_panic_in_the_closure_leaves_the_previous_context_current() {
    on_a_fresh_thread_per_previous_device(|gpu, lease, app, d| {
        let prev = app.cu_ctx();

        // A panic after cudarc made the stream's context current.
        let caught = catch_unwind(AssertUnwindSafe(|| {
            with_cudarc_stream(lease, |s| {
                s.synchronize().unwrap();
                panic!("inside the closure")
            })
        }));
        assert!(caught.is_err());
        assert_eq!(current(), Some(prev), "device {d}: the previous context");
        assert_eq!(gpu.current_device().unwrap(), DeviceId(d));

        // A panic after dropping the application's last `Arc` of it.
        let caught = catch_unwind(AssertUnwindSafe(|| {
            with_cudarc_stream(lease, move |_| {
                drop(app);
                panic!("after the last Arc")
            })
        }));
        assert!(caught.is_err());
        assert_eq!(current(), Some(prev), "device {d}: the previous context");
        assert!(primary_active(d), "device {d}: alive, gpupool retains it");
        assert_eq!(gpu.current_device().unwrap(), DeviceId(d));

        // The lease's stream still works.
        let synced = with_cudarc_stream(lease, |s| s.synchronize());
        assert_eq!(synced, Ok(Ok(())));
        assert_eq!(current(), Some(prev));
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_thread_without_a_context_keeps_the_primary_one_after_the_closure() {
    let (gpu, pool) = gpu_and_streams();
    let lease = pool.get(0).unwrap();
    on_a_fresh_thread(|| {
        assert_eq!(current(), None, "a fresh thread");
        let synced = with_cudarc_stream(&lease, |s| s.synchronize());
        assert_eq!(synced, Ok(Ok(())));
        let primary = gpu.context(DeviceId(0)).unwrap().cu_ctx();
        assert_eq!(
            current(),
            Some(primary),
            "rule 1: the primary context stays"
        );
    });
}

/// cudarc's safe `CudaContext::new_non_primary`, which these tests use, exists
/// only for the CUDA versions up to 13.1 (the cfg is set by build.rs, which
/// holds the list of version features).
#[cfg(cuda_non_primary_context)]
mod non_primary {
    use super::*;

    const D0: DeviceId = DeviceId(0);

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_non_primary_context_is_not_made_current_again() {
        let (gpu, pool, events) = common::gpu_and_pools();
        on_a_fresh_thread(|| {
            let lease = pool.get(0).unwrap();
            let primary = gpu.context(D0).unwrap().cu_ctx();

            // Alive and current before the call: not put back, the device's
            // primary context instead.
            let n = CudaContext::new_non_primary(0, 0).unwrap();
            assert_eq!(current(), Some(n.cu_ctx()));
            assert_eq!(
                gpu.current_device().unwrap(),
                D0,
                "asked with cuCtxGetDevice"
            );
            let synced = with_cudarc_stream(&lease, |s| s.synchronize());
            assert_eq!(synced, Ok(Ok(())));
            assert_eq!(current(), Some(primary));

            // The same for a call that switches inside gpupool (creating an
            // event).
            n.bind_to_thread().unwrap();
            drop(events.get(0).unwrap());
            assert_eq!(current(), Some(primary));

            // Destroyed inside the closure (the application's last `Arc`).
            n.bind_to_thread().unwrap();
            let synced = with_cudarc_stream(&lease, move |s| {
                drop(n);
                s.synchronize()
            });
            assert_eq!(synced, Ok(Ok(())));
            assert_eq!(current(), Some(primary));
            assert_eq!(gpu.current_device().unwrap(), D0);

            // A closure that leaves another context current and panics: the
            // previous context (the primary one) is current afterwards.
            let m = CudaContext::new_non_primary(0, 0).unwrap();
            gpu.context(D0).unwrap().bind_to_thread().unwrap();
            let caught = catch_unwind(AssertUnwindSafe(|| {
                with_cudarc_stream(&lease, |_| {
                    m.bind_to_thread().unwrap();
                    panic!("with another context current")
                })
            }));
            assert!(caught.is_err());
            assert_eq!(current(), Some(primary), "not the closure's context");
            drop(m);
        });
        assert!(pool.take_error().is_none() && events.take_error().is_none());
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_context_destroyed_on_another_thread_is_never_handed_to_the_driver() {
        let (gpu, pool, events) = common::gpu_and_pools();
        on_a_fresh_thread(|| {
            let primary = gpu.context(D0).unwrap().cu_ctx();
            let n = CudaContext::new_non_primary(0, 0).unwrap();
            let dead = n.cu_ctx();
            // Destroyed on another thread while current on this one.
            std::thread::scope(|s| {
                s.spawn(move || drop(n));
            });
            if current() == Some(dead) {
                // The driver leaves it current here: gpupool reads its device
                // without handing it over (`cuCtxGetDevice` reads the thread's
                // own current context). The driver of the H200 (580) answers
                // with the device it was made on; another may refuse.
                let asked = gpu.current_device();
                assert!(
                    matches!(asked, Ok(D0) | Err(_)),
                    "a destroyed context's device: {asked:?}"
                );
            }
            // A call that switches contexts does not put it back.
            drop(events.get(0).unwrap());
            assert_eq!(current(), Some(primary));
            assert_eq!(gpu.current_device().unwrap(), D0);
            let lease = pool.get(0).unwrap();
            let synced = with_cudarc_stream(&lease, |s| s.synchronize());
            assert_eq!(synced, Ok(Ok(())));
            assert_eq!(current(), Some(primary));
        });
        assert!(pool.take_error().is_none() && events.take_error().is_none());
    }
}

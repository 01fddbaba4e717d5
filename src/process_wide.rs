//! The process-wide backend and pools of the [`DefaultBackend`] (DALI's
//! `CUDAStreamPool::instance()` and `CUDAEventPool::instance()`).

use std::sync::OnceLock;

use crate::{DefaultBackend, EventPool, StreamPool};

/// The process-wide backend of the selected kind.
///
/// - With `cuda`: a `CudaBackend` (every `CudaBackend` speaks to the same
///   driver; constructing one calls nothing).
/// - With `mock` alone: one simulated machine for the whole process, made on
///   first use, whose work completes as soon as it is queued
///   ([`CompletionPolicy::Immediate`](gpupool_mock::CompletionPolicy::Immediate)):
///   it behaves like an infinitely fast GPU, so code written for a real GPU
///   runs on it unchanged — and, for the same reason, a missing wait is never
///   seen as a hazard there. It has one device, or as many as the environment
///   variable `GPUPOOL_MOCK_DEVICES` says (1 to 64, read once, on first use).
///   Tests that complete work by hand, inject faults or check hazards make a
///   machine of their own with `gpupool::mock::MockBackend::new`.
///
/// [`streams()`], [`events()`] and scratchpads made with this backend share it.
///
/// ```
/// let a = gpupool::backend();
/// assert!(std::ptr::eq(a, gpupool::backend()));
/// ```
pub fn backend() -> &'static DefaultBackend {
    static BACKEND: OnceLock<DefaultBackend> = OnceLock::new();
    BACKEND.get_or_init(make_backend)
}

#[cfg(feature = "cuda")]
fn make_backend() -> DefaultBackend {
    gpupool_cuda::CudaBackend::new()
}

#[cfg(all(feature = "mock", not(feature = "cuda")))]
fn make_backend() -> DefaultBackend {
    let devices = std::env::var("GPUPOOL_MOCK_DEVICES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| (1..=64).contains(n))
        .unwrap_or(1);
    let machine = gpupool_mock::MockBackend::new(devices);
    machine.set_policy(gpupool_mock::CompletionPolicy::Immediate);
    machine
}

/// The process-wide stream pool of [`backend()`]: non-blocking streams at the
/// default priority. Created on first use, never dropped (nothing is destroyed
/// while the driver shuts down at exit); [`purge`](StreamPool::purge) gives
/// its streams back earlier. Constructing it calls no backend function.
///
/// ```
/// let lease = gpupool::streams().get(0)?;
/// assert_eq!(lease.device(), gpupool::DeviceId(0));
/// # Ok::<(), gpupool::DefaultError>(())
/// ```
pub fn streams() -> &'static StreamPool<DefaultBackend> {
    pools::streams()
}

/// The process-wide event pool of [`backend()`]: events with timing disabled.
/// Lazy and never dropped, like [`streams()`].
///
/// ```
/// let event = gpupool::events().get(0)?;
/// assert_eq!(event.device(), gpupool::DeviceId(0));
/// # Ok::<(), gpupool::DefaultError>(())
/// ```
pub fn events() -> &'static EventPool<DefaultBackend> {
    pools::events()
}

// With `cuda`, the CUDA backend's own process-wide pools (so code that uses
// `gpupool_cuda` directly shares them).
#[cfg(feature = "cuda")]
use gpupool_cuda as pools;

/// With `mock` alone, pools of [`backend()`] made here on first use.
#[cfg(not(feature = "cuda"))]
mod pools {
    use super::*;

    pub(super) fn streams() -> &'static StreamPool<DefaultBackend> {
        static POOL: OnceLock<StreamPool<DefaultBackend>> = OnceLock::new();
        POOL.get_or_init(|| StreamPool::new(backend().clone()))
    }

    pub(super) fn events() -> &'static EventPool<DefaultBackend> {
        static POOL: OnceLock<EventPool<DefaultBackend>> = OnceLock::new();
        POOL.get_or_init(|| EventPool::new(backend().clone()))
    }
}

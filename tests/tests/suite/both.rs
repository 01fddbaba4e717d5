//! What the stream pool and the event pool do alike, written once over
//! [`AnyPool`] and run for each: the check `c` is the tests
//! `both::c::stream_pool` and `both::c::event_pool`.

use gpupool_core::DeviceId;
use gpupool_tests::any_pool::AnyPool;
use gpupool_tests::{assert_calls, gpu, GpuBackend, TestGpu};

const D0: DeviceId = DeviceId(0);

/// A pool is lazy: building and dropping one calls nothing; its first get
/// counts the devices and creates a handle, and the lease's return makes the
/// pool's return calls.
fn a_pool_is_lazy_until_its_first_get<P: AnyPool<GpuBackend>>() {
    let Some(gpu) = gpu(1) else { return };
    let calls = gpu.backend_calls();
    let pool = P::over(gpu.backend());
    assert_eq!(pool.device_count(), None);
    assert_eq!(pool.stats(D0), None);
    drop(pool);
    assert_calls(&gpu, calls, 0, "constructing and dropping an unused pool");
    let pool = P::over(gpu.backend());
    let lease = pool.lease(D0);
    assert_calls(&gpu, calls, 2, "the first get: count the devices, create");
    drop(lease);
    assert_calls(&gpu, calls, 2 + P::RETURN_CALLS, "and the return");
    assert_eq!(pool.device_count(), Some(gpu.device_count() as usize));
}

/// The ready list is LIFO: the handle returned last is leased first, and
/// that reuse makes no backend call (nor do the returns, beyond the pool's
/// return calls).
fn reuse_is_lifo_and_makes_no_backend_call<P: AnyPool<GpuBackend>>() {
    let Some(gpu) = gpu(1) else { return };
    let pool = P::over(gpu.backend());
    let [a, b] = [(); 2].map(|_| pool.lease(D0));
    let (ha, hb) = (P::handle_of(&a), P::handle_of(&b));
    assert_ne!(ha, hb);
    let calls = gpu.backend_calls();
    drop(a);
    drop(b); // returned last: handed out first
    assert_calls(&gpu, calls, 2 * P::RETURN_CALLS, "the returns");
    let calls = gpu.backend_calls();
    let [x, y] = [(); 2].map(|_| pool.lease(D0));
    assert_eq!((P::handle_of(&x), P::handle_of(&y)), (hb, ha));
    assert_calls(&gpu, calls, 0, "a ready handle is handed out");
    let s = pool.stats(D0).unwrap();
    assert_eq!((s.created, s.reused, s.leases, s.live_leases), (2, 2, 4, 2));
}

/// Runs each check named, generic over the pool, as two tests in a module of
/// its name: `stream_pool` and `event_pool`.
macro_rules! for_both_pools {
    ($($check:ident),* $(,)?) => {$(
        mod $check {
            use gpupool_core::{EventPool, StreamPool};

            #[test]
            fn stream_pool() {
                super::$check::<StreamPool<_>>();
            }

            #[test]
            fn event_pool() {
                super::$check::<EventPool<_>>();
            }
        }
    )*};
}

for_both_pools!(
    a_pool_is_lazy_until_its_first_get,
    reuse_is_lifo_and_makes_no_backend_call,
);

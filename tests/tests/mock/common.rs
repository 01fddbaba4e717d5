//! Set-up shared by the mock tests: leases taken in a row from one pool.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{StreamLease, StreamPool};
use gpupool_mock::MockBackend;

/// Takes `N` leases of device 0 from `streams`, one after another (first
/// element first), as `N` lines of `streams.get(0).unwrap()` would.
pub(crate) fn leases<const N: usize>(
    streams: &StreamPool<MockBackend>,
) -> [StreamLease<'_, MockBackend>; N] {
    std::array::from_fn(|_| streams.get(0).unwrap())
}

/// Completes every piece of work the mock holds, then asserts that nothing
/// was misused and no hazard was found (`assert_clean`).
#[track_caller]
pub(crate) fn complete_and_assert_clean(gpu: &MockBackend) {
    gpu.complete_everything();
    gpupool_tests::assert_clean(gpu);
}

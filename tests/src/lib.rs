//! gpupool's acceptance suite: the machine the tests run on, and helpers shared
//! by the test files in `tests/`.
//!
//! The suite is written against the backend traits and a small [`TestGpu`]
//! interface for what a test needs to steer beyond them (making a stream busy,
//! finishing its work, counting live handles). The default machine is the mock
//! backend; the CUDA backend will implement [`TestGpu`] behind the `cuda`
//! feature, so the same tests run on a real GPU.

use gpupool_core::{DeviceId, EventBackend, StreamBackend, StreamHandle};
use gpupool_mock::MockBackend;

#[cfg(feature = "cuda")]
pub mod cuda;

/// What the acceptance tests need from a machine besides the backend traits.
pub trait TestGpu: Clone + Send + Sync + 'static {
    /// The backend the pools are built over.
    type Backend: StreamBackend + EventBackend + Clone + Send + Sync + 'static;

    /// The backend (a cheap handle to the same machine).
    fn backend(&self) -> Self::Backend;

    /// Submits work to `stream` that stays pending until [`finish`](Self::finish).
    fn make_busy(&self, stream: StreamHandle, device: DeviceId);

    /// Waits for (or, on the mock, completes) all work submitted to `stream`.
    fn finish(&self, stream: StreamHandle, device: DeviceId);

    /// Streams alive on the machine, if the backend can count them.
    fn live_streams(&self) -> Option<usize>;

    /// Events alive on the machine, if the backend can count them.
    fn live_events(&self) -> Option<usize>;
}

impl TestGpu for MockBackend {
    type Backend = MockBackend;

    fn backend(&self) -> MockBackend {
        self.clone()
    }

    fn make_busy(&self, stream: StreamHandle, _device: DeviceId) {
        self.enqueue_work(stream)
            .expect("enqueue work on a live stream");
    }

    fn finish(&self, stream: StreamHandle, _device: DeviceId) {
        self.complete_all(stream).expect("complete a live stream");
    }

    fn live_streams(&self) -> Option<usize> {
        Some(MockBackend::live_streams(self))
    }

    fn live_events(&self) -> Option<usize> {
        Some(MockBackend::live_events(self))
    }
}

/// A fresh mock machine with `devices` devices (work stays pending until a test
/// completes it).
pub fn mock(devices: u32) -> MockBackend {
    MockBackend::new(devices)
}

/// A small deterministic random number generator (xorshift64*) for workloads;
/// tests need reproducible mixes, not statistical quality.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

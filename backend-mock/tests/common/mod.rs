//! Helpers shared by the mock's test binaries: device ids, handles made on a
//! device, and many threads on one machine. Each binary uses some of them.
#![allow(dead_code)]

use gpupool_core::{DeviceId, EventBackend, EventFlags, EventHandle, StreamBackend, StreamHandle};
use gpupool_mock::{HazardKind, MockBackend};

pub const D0: DeviceId = DeviceId(0);
pub const D1: DeviceId = DeviceId(1);

/// A new stream of `mock` on `d`, default options.
pub fn stream(mock: &MockBackend, d: DeviceId) -> StreamHandle {
    mock.create_stream(d, Default::default()).unwrap()
}

/// A new event of `mock` on `d`, default flags.
pub fn event(mock: &MockBackend, d: DeviceId) -> EventHandle {
    mock.create_event(d, EventFlags::default()).unwrap()
}

/// Runs `body(mock, t)` for `t` in `0..threads`, each on a thread of its own
/// with its own clone of `mock`, all at once; returns when all have.
pub fn on_threads(mock: &MockBackend, threads: usize, body: impl Fn(MockBackend, usize) + Sync) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (mock, body) = (mock.clone(), &body);
            scope.spawn(move || body(mock, t));
        }
    });
}

/// The kind of each hazard `mock` has logged, and the stream it conflicts
/// with, in order.
pub fn hazard_kinds(mock: &MockBackend) -> Vec<(HazardKind, Option<StreamHandle>)> {
    mock.hazards()
        .iter()
        .map(|h| (h.kind, h.conflict))
        .collect()
}

/// A new mock machine with `devices` devices and a stream of its device 0.
pub fn mock_with_stream(devices: u32) -> (MockBackend, StreamHandle) {
    let mock = MockBackend::new(devices);
    let s = stream(&mock, D0);
    (mock, s)
}

/// Begins a capture on a stream of the test's own through the mock's
/// harness.
#[allow(dead_code)] // not every test file captures
pub fn begin(
    mock: &gpupool_mock::MockBackend,
    stream: gpupool_core::StreamHandle,
    mode: gpupool_mock::CaptureMode,
) -> Result<(), gpupool_mock::MockError> {
    // SAFETY: the tests' streams are created by the tests themselves; no
    // gpupool lease or owned stream holds them (and the mock checks every
    // handle).
    unsafe { mock.begin_capture(stream, mode) }
}

// Finding 1: the backend calls that take a handle, and making a handle or an
// order from a number, are `unsafe`: a `#![forbid(unsafe_code)]` program
// cannot hand the driver a stale or made-up handle.
#![forbid(unsafe_code)]
use gpupool_core::{AccessOrder, DeviceId, EventBackend, StreamBackend, StreamHandle, StreamPool};
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let pool = StreamPool::new(gpu.clone());
    let stale = pool.get(0).unwrap().handle();
    pool.purge().unwrap();
    let _ = gpu.destroy_stream(stale, DeviceId(0));
    let _ = gpu.query_stream(stale, DeviceId(0));
    let event = gpu.create_event(DeviceId(0), Default::default()).unwrap();
    let _ = gpu.record_event(event, stale, DeviceId(0));
    let _forged = StreamHandle::from_raw(0xdead);
    let _order = AccessOrder::from_raw(&gpu, stale, DeviceId(0));
}

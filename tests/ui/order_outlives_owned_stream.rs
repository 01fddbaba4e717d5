// Finding 2: an owned stream cannot be put back (or destroyed) while an order
// of it is in use.
use gpupool_core::StreamPool;
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let owned = streams.get(0).unwrap().detach();
    let order = owned.order();
    streams.put(owned, None).unwrap();
    assert!(order.is_device());
}

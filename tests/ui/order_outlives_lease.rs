// Finding 2: an order borrows the lease it came from, so it cannot be used
// after the lease has returned its stream (which a purge may then destroy).
use gpupool_core::{EventPool, StreamPool};
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let live = streams.get(0).unwrap();
    let stale = {
        let lease = streams.get(0).unwrap();
        lease.order()
    };
    streams.purge().unwrap();
    live.order().wait(&stale, &events).unwrap();
}

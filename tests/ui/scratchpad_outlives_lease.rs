// Finding 2: a scratchpad built on a lease's order borrows the lease, so its
// blocks are never freed in the order of a stream that was returned (and
// perhaps destroyed).
use gpupool_core::{Scratchpad, StreamPool};
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let scratch = {
        let lease = streams.get(0).unwrap();
        Scratchpad::new(&gpu, lease.order()).unwrap()
    };
    streams.purge().unwrap();
    drop(scratch);
}
